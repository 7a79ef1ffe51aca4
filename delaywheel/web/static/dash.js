// delaywheel dashboard: live numbers and charts over /events (Server-Sent Events).
// Pages work without this file; it only keeps them current. No inline code
// anywhere: the CSP allows scripts from this origin's files alone.
"use strict";
(function () {
  const base = document.body.dataset.base || "";
  const banner = document.getElementById("banner");
  const charts = Array.from(document.querySelectorAll("svg.chart[data-series]"));
  const MAX_POINTS = 300;
  // Each chart goes on from the samples the server drew it with (data-values:
  // only those since the server's start, a gap where there was no value), so
  // a chart never shows zeros from before the server ran.
  const series = {};
  charts.forEach((svg) => { series[svg.dataset.series] = parseValues(svg.dataset.values); });
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

  function shown(value, unit) {
    if (value == null) return "—";
    if (typeof value === "boolean") return value ? "up" : "DOWN";
    if (unit === "s" && typeof value === "number") return value < 120 ? value.toFixed(3) + " s" : (value / 60).toFixed(1) + " min";
    return String(value);
  }

  function seriesValue(snapshot, name) {
    if (name === "p99") return pick(snapshot, "lateness.p99");
    if (snapshot.states && name in snapshot.states) return snapshot.states[name];
    return snapshot.rates ? snapshot.rates[name] : null;
  }

  function draw(svg, values) {
    const line = svg.querySelector("polyline");
    const finite = values.filter((v) => typeof v === "number");
    const top = Math.max(0, ...finite) || 1; // as the server scales it (live.chart_points)
    const step = 600 / Math.max(values.length - 1, 1);
    const points = [];
    values.forEach((v, i) => {
      if (typeof v === "number") points.push((i * step).toFixed(1) + "," + (80 - (v / top) * 80).toFixed(1));
    });
    line.setAttribute("points", points.join(" "));
  }

  function update(snapshot) {
    // A server restarted under us: its history starts again, empty.
    if (lastUptime !== null && snapshot.uptime < lastUptime) {
      Object.keys(series).forEach((name) => { series[name] = []; });
    }
    lastUptime = snapshot.uptime;
    document.querySelectorAll("[data-live]").forEach((el) => {
      el.textContent = shown(pick(snapshot, el.dataset.live), el.dataset.unit);
    });
    if (snapshot.t <= drawnUntil) return; // already in the server's drawing
    charts.forEach((svg) => {
      const name = svg.dataset.series;
      const values = series[name];
      const value = seriesValue(snapshot, name);
      values.push(typeof value === "number" ? value : null);
      if (values.length > MAX_POINTS) values.shift();
      draw(svg, values);
    });
  }

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
