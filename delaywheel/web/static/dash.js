// delaywheel dashboard: live numbers and charts over /events (Server-Sent Events),
// and the charts' hover values. Pages work without this file; it only keeps
// them current. No inline code anywhere: the CSP allows scripts from this
// origin's files alone.
"use strict";
(function () {
  const base = document.body.dataset.base || "";
  const banner = document.getElementById("banner");
  // The SVG's geometry, as web/charts.py draws it (data-box: left right top bottom).
  const anySvg = document.querySelector("svg.chart[data-box]");
  const [LEFT, RIGHT, TOP, BOTTOM] = anySvg ? anySvg.dataset.box.split(" ").map(Number) : [0, 0, 0, 0];
  const WIDTH = anySvg ? anySvg.viewBox.baseVal.width : 1, HEIGHT = anySvg ? anySvg.viewBox.baseVal.height : 1;
  const PLOT_W = WIDTH - LEFT - RIGHT, PLOT_H = HEIGHT - TOP - BOTTOM;
  // Each chart goes on from the points the server drew (data-values: only
  // since the server's start, a gap where there was no value), one point per
  // data-step samples, so a chart never shows zeros from before the server ran.
  const charts = Array.from(document.querySelectorAll("figure[data-chart]")).map((fig) => ({
    fig: fig,
    svg: fig.querySelector("svg"),
    step: Number(fig.dataset.step) || 1,
    kind: fig.dataset.kind,
    unit: fig.dataset.unit,
    slots: Number(fig.dataset.slots) || 300,
    lines: Array.from(fig.querySelectorAll("path[data-series]")).map((path) => ({
      name: path.dataset.series, path: path, values: parseValues(path.dataset.values), pending: [],
    })),
    top: 1,
  }));
  const holder = document.querySelector(".charts");
  const drawnUntil = holder ? Number(holder.dataset.until || 0) : 0; // the last sample drawn
  let lastUptime = null;
  let source = null;

  function parseValues(text) {
    if (!text) return [];
    return text.split(",").map((item) => (item === "" ? null : Number(item)));
  }

  function pick(snapshot, path) {
    return path.split(".").reduce((v, key) => (v == null ? v : v[key]), snapshot);
  }

  function duration(s) {
    if (s === 0) return "0 s";
    if (s < 1) return +(s * 1000).toPrecision(4) + " ms";
    if (s < 60) return +s.toPrecision(3) + " s";
    if (s < 3600) return Math.floor(s / 60) + " min" + (Math.round(s % 60) ? " " + Math.round(s % 60) + " s" : "");
    if (s < 86400) return Math.floor(s / 3600) + " h" + (Math.round(s / 60) % 60 ? " " + (Math.round(s / 60) % 60) + " min" : "");
    return +(s / 86400).toPrecision(3) + " days";
  }

  function shown(value, unit) {
    if (value == null) return "none";
    if (typeof value === "boolean") return value ? "up" : "DOWN";
    if (unit === "s" && typeof value === "number") return duration(value);
    return String(value);
  }

  // A value as the chart's axis and table write it (charts.number).
  function number(v, unit) {
    if (v == null) return "none";
    if (unit === "s") return v === 0 ? "0 s" : v < 1 ? +(v * 1000).toPrecision(6) + " ms" : +v.toPrecision(6) + " s";
    let text = Math.abs(v) >= 10000 ? +(v / 1000).toPrecision(3) + "k" : Number.isInteger(v) ? String(v) : String(+v.toPrecision(3));
    return text + (unit === "/s" ? "/s" : "");
  }

  function niceTop(v) {
    if (!(v > 0)) return 1;
    const power = Math.pow(10, Math.floor(Math.log10(v)));
    for (const m of [1, 2, 5, 10]) if (m * power >= v * (1 - 1e-9)) return m * power;
    return 10 * power;
  }

  function xOf(index, count, slots) {
    return LEFT + PLOT_W * ((slots - count + index) / Math.max(slots - 1, 1));
  }

  function draw(chart) {
    const finite = chart.lines.flatMap((l) => l.values.filter((v) => typeof v === "number"));
    chart.top = niceTop(Math.max(0, ...finite));
    chart.lines.forEach((line) => {
      const parts = [];
      let down = false;
      line.values.forEach((v, i) => {
        if (typeof v !== "number") { down = false; return; }
        const y = TOP + PLOT_H - (v / chart.top) * PLOT_H;
        parts.push((down ? "L" : "M") + xOf(i, line.values.length, chart.slots).toFixed(1) + "," + y.toFixed(1));
        down = true;
      });
      line.path.setAttribute("d", parts.join(" "));
      const latest = chart.fig.querySelector('[data-latest="' + line.name + '"]');
      const last = line.values[line.values.length - 1];
      if (latest) latest.textContent = number(last == null ? null : last, chart.unit);
    });
    const ticks = chart.svg.querySelectorAll("text.tick-y");
    [0, 0.5, 1].forEach((f, i) => { if (ticks[i]) ticks[i].textContent = number(chart.top * f, chart.unit); });
  }

  function seriesValue(snapshot, name) {
    if (name === "p50" || name === "p99") return pick(snapshot, "lateness." + name);
    if (snapshot.states && name in snapshot.states) return snapshot.states[name];
    return snapshot.rates ? snapshot.rates[name] : null;
  }

  function bucket(values, kind) {
    const part = values.filter((v) => typeof v === "number");
    if (!part.length) return null;
    if (kind === "last") return part[part.length - 1];
    if (kind === "max") return Math.max(...part);
    return part.reduce((a, b) => a + b, 0) / part.length;
  }

  function update(snapshot) {
    // A server restarted under us: its history starts again, empty.
    if (lastUptime !== null && snapshot.uptime < lastUptime) {
      charts.forEach((c) => c.lines.forEach((l) => { l.values = []; l.pending = []; }));
    }
    lastUptime = snapshot.uptime;
    document.querySelectorAll("[data-live]").forEach((el) => {
      el.textContent = shown(pick(snapshot, el.dataset.live), el.dataset.unit);
    });
    if (snapshot.t <= drawnUntil) return; // already in the server's drawing
    charts.forEach((chart) => {
      let grew = false;
      chart.lines.forEach((line) => {
        const value = seriesValue(snapshot, line.name);
        line.pending.push(typeof value === "number" ? value : null);
        if (line.pending.length >= chart.step) {
          line.values.push(bucket(line.pending, chart.kind));
          line.pending = [];
          if (line.values.length > chart.slots) line.values.shift();
          grew = true;
        }
      });
      if (grew) draw(chart);
    });
  }

  // Hover (or touch) on a chart: a line at that time and each series' value.
  function hover(chart, event) {
    const box = chart.svg.getBoundingClientRect();
    const x = ((event.clientX - box.left) / box.width) * WIDTH;
    const place = Math.round(((x - LEFT) / PLOT_W) * (chart.slots - 1));
    const tip = chart.fig.querySelector(".tip");
    const cursor = chart.svg.querySelector("line.cursor");
    const count = Math.max(...chart.lines.map((l) => l.values.length));
    const index = place - (chart.slots - count);
    if (place < 0 || place >= chart.slots || index < 0) { leave(chart); return; }
    const ago = (chart.slots - 1 - place) * chart.step;
    const parts = chart.lines.map((l) => l.name + " " + number(l.values[index] == null ? null : l.values[index], chart.unit));
    tip.textContent = (ago === 0 ? "now" : duration(ago) + " ago") + ": " + parts.join(", ");
    tip.hidden = false;
    const at = xOf(index, count, chart.slots);
    cursor.setAttribute("x1", at);
    cursor.setAttribute("x2", at);
    cursor.removeAttribute("hidden");
  }

  function leave(chart) {
    chart.fig.querySelector(".tip").hidden = true;
    chart.svg.querySelector("line.cursor").setAttribute("hidden", "");
  }

  charts.forEach((chart) => {
    chart.svg.addEventListener("pointermove", (event) => hover(chart, event));
    chart.svg.addEventListener("pointerleave", () => leave(chart));
  });

  function connect() {
    if (source !== null || document.hidden) return;
    source = new EventSource(base + "/events");
    source.addEventListener("open", () => { banner.hidden = true; });
    source.addEventListener("snapshot", (event) => {
      banner.hidden = true;
      update(JSON.parse(event.data));
    });
    source.addEventListener("error", () => {
      banner.hidden = false;
      // EventSource retries by itself (retry: 3000) unless the server refused
      // the stream; then start a fresh one.
      if (source.readyState === EventSource.CLOSED) {
        source = null;
        signedOut();
        setTimeout(connect, 3000);
      }
    });
  }

  // A refused stream: the server may be back without our session (a restart
  // signs everyone out). A page that would send us to sign in says so.
  function signedOut() {
    fetch(base + "/", { redirect: "manual", credentials: "same-origin" })
      .then((reply) => {
        if (reply.type === "opaqueredirect") {
          banner.textContent = "Signed out (the server restarted, or the session ended): reload the page to sign in again.";
        }
      })
      .catch(() => {}); // still down: the banner says so already
  }

  function disconnect() {
    if (source !== null) { source.close(); source = null; }
  }

  // A hidden tab holds no stream (nothing to show, and a slot of 32 saved).
  document.addEventListener("visibilitychange", () => (document.hidden ? disconnect() : connect()));
  if (document.querySelector("[data-live]")) connect();
})();
