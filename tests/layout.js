// The layout checks of tests/test_web_browser.py, run in the page (page.evaluate):
// elements that stick out of their container (outside a box that scrolls), and
// text nodes whose lines break between two letters of a word.
() => {
  const out = {overflow: [], broken: []};
  const name = (el) => el.tagName.toLowerCase() + (el.id ? "#" + el.id : "")
    + (el.className && typeof el.className === "string" ? "." + el.className.split(" ").join(".") : "");
  const scrolls = (el) => ["auto", "scroll", "hidden"].includes(getComputedStyle(el).overflowX);
  for (const el of document.body.querySelectorAll("*")) {
    if (el.closest("svg") && el.tagName.toLowerCase() !== "svg") continue;
    const box = el.getBoundingClientRect();
    if (!box.width || !box.height) continue;
    let parent = el.parentElement, inScroller = false;
    for (let p = parent; p && p !== document.body; p = p.parentElement) if (scrolls(p)) inScroller = true;
    if (inScroller || !parent) continue;
    const outer = parent.getBoundingClientRect();
    if (box.right > Math.max(outer.right, window.innerWidth) + 1 || box.left < Math.min(outer.left, 0) - 1
        || box.right > window.innerWidth + 1)
      out.overflow.push(name(el) + " " + Math.round(box.left) + ".." + Math.round(box.right)
        + " in " + name(parent) + " " + Math.round(outer.left) + ".." + Math.round(outer.right));
  }
  const walker = document.createTreeWalker(document.body, NodeFilter.SHOW_TEXT);
  const word = /[\p{L}\p{N}]/u;
  for (let node = walker.nextNode(); node; node = walker.nextNode()) {
    const text = node.textContent;
    if (text.trim().length < 2 || !node.parentElement || node.parentElement.closest("svg, script, style")) continue;
    const range = document.createRange();
    let lastTop = null;
    for (let i = 0; i < text.length; i++) {
      range.setStart(node, i); range.setEnd(node, i + 1);
      const rects = range.getClientRects();
      if (!rects.length) continue;
      const top = Math.round(rects[0].top);
      if (lastTop !== null && top > lastTop + 2 && word.test(text[i]) && i > 0 && word.test(text[i - 1]))
        out.broken.push(JSON.stringify(text.slice(Math.max(0, i - 12), i) + "|" + text.slice(i, i + 12))
          + " in " + name(node.parentElement));
      lastTop = top;
    }
  }
  return out;
}
