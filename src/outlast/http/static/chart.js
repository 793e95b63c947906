// The job list's "Last hour" card: throughput (jobs finished per minute, by outcome) and
// waiting time (median and 95th percentile from creation to start) from GET stats/timeline,
// which reads the store, so it counts every pool on every host. Drawn with uPlot
// (static/vendor/uplot, MIT, see its VERSION), loaded after the list so the first paint does
// not wait for it. Uses app.js's api() and $(); refreshed every 15 s while the list shows,
// and soon after a job finishes (app.js calls chartSoon()).
"use strict";

const CHART = { plots: null, loading: null, timer: null, data: null };
const REFRESH_MS = 15000;
const STEP = 60; // seconds: a minute a point

function loadUplot() {
  if (window.uPlot) return Promise.resolve();
  if (CHART.loading) return CHART.loading;
  CHART.loading = new Promise((resolve, reject) => {
    const css = document.createElement("link");
    css.rel = "stylesheet";
    css.href = "static/vendor/uplot/uPlot.min.css";
    document.head.append(css);
    const script = document.createElement("script");
    script.src = "static/vendor/uplot/uPlot.iife.min.js";
    script.onload = () => resolve();
    script.onerror = () => {
      CHART.loading = null;
      reject(new Error("could not load the chart library"));
    };
    document.head.append(script);
  });
  return CHART.loading;
}

function cssColor(name) {
  return getComputedStyle(document.documentElement).getPropertyValue(name).trim() || "#888";
}

function fmtWait(seconds) {
  if (seconds === null || seconds === undefined) return "—";
  if (seconds === 0) return "0";
  if (seconds < 0.01) return `${+(seconds * 1000).toFixed(seconds < 0.001 ? 2 : 1)} ms`;
  if (seconds < 1) return `${Math.round(seconds * 1000)} ms`;
  if (seconds < 60) return `${seconds.toFixed(seconds < 10 ? 1 : 0)} s`;
  return `${Math.round(seconds / 60)} min`;
}

function axes(values) {
  const grid = { stroke: cssColor("--line"), width: 1 };
  return [
    { stroke: cssColor("--muted"), grid, ticks: grid },
    { stroke: cssColor("--muted"), grid, ticks: grid, size: 62, values },
  ];
}

function chartWidth(el) {
  return Math.max(200, Math.floor(el.getBoundingClientRect().width));
}

function chartHeight() {
  return window.innerWidth <= 480 ? 100 : 150; // a phone: the list stays near the top
}

function makePlots() {
  const throughputEl = $("chart-throughput");
  const waitEl = $("chart-wait");
  // waits: a minute with jobs between two without is a lone point, so each is a dot
  const series = (label, color, fill, dots) => ({
    label,
    stroke: color,
    width: 1.6,
    fill: fill ? `${color}22` : undefined,
    points: dots ? { show: true, size: 5, fill: color } : { show: false },
  });
  // the x axis runs to the end of the last step (the one filling), so its point is inside
  const x = { time: true, range: (u, min, max) => [min, max + STEP] };
  const throughput = new uPlot(
    {
      width: chartWidth(throughputEl),
      height: chartHeight(),
      scales: { x, y: { range: (u, min, max) => [0, Math.max(1, max)] } },
      series: [
        {},
        series("succeeded", cssColor("--succeeded"), true),
        series("failed", cssColor("--failed"), true),
        series("canceled", cssColor("--canceled"), false),
      ],
      axes: axes((u, ticks) => ticks.map((v) => (Number.isInteger(v) ? String(v) : ""))),
    },
    [[], [], [], []],
    throughputEl,
  );
  const wait = new uPlot(
    {
      width: chartWidth(waitEl),
      height: chartHeight(),
      scales: { x, y: { range: (u, min, max) => [0, max > 0 ? max * 1.1 : 1] } },
      series: [
        {},
        { ...series("p50", cssColor("--running"), true, true), value: (u, v) => fmtWait(v) },
        { ...series("p95", cssColor("--paused"), false, true), value: (u, v) => fmtWait(v), dash: [5, 4] },
      ],
      axes: axes((u, ticks) => ticks.map(fmtWait)),
    },
    [[], [], []],
    waitEl,
  );
  CHART.plots = { throughput, wait };
  window.addEventListener("resize", () => {
    if (!CHART.plots) return;
    CHART.plots.throughput.setSize({ width: chartWidth(throughputEl), height: chartHeight() });
    CHART.plots.wait.setSize({ width: chartWidth(waitEl), height: chartHeight() });
  });
}

function draw(timeline) {
  const times = timeline.times;
  const f = timeline.finished;
  const w = timeline.wait_seconds;
  if (!CHART.plots) makePlots();
  CHART.plots.throughput.setData([times, f.succeeded, f.failed, f.canceled]);
  CHART.plots.wait.setData([times, w.p50, w.p95]);
  CHART.data = timeline;
  // what the charts show, in words (and for tests): totals and the last minute's figures
  const sum = (xs) => xs.reduce((a, b) => a + b, 0);
  const done = sum(f.succeeded) + sum(f.failed) + sum(f.canceled);
  const waited = w.p50.filter((v) => v !== null);
  const last = [...w.p50].reverse().find((v) => v !== null);
  const card = $("activity");
  card.dataset.finished = String(done);
  card.dataset.waitSteps = String(waited.length);
  $("activity-note").textContent = done
    ? `· ${done} finished (${sum(f.failed)} failed) · latest wait p50 ${fmtWait(last)}`
    : "· nothing finished";
  $("chart-throughput").setAttribute("aria-label", `Jobs finished per minute over the last hour: ${done} in all, ${sum(f.failed)} failed.`);
  $("chart-wait").setAttribute("aria-label", `Wait before starting over the last hour; the latest median is ${fmtWait(last)}.`);
}

async function refreshChart() {
  if ($("list-view").hidden || document.hidden) return;
  let timeline;
  try {
    timeline = await api(`stats/timeline?window=1h&step=${STEP}`);
    await loadUplot();
  } catch (e) {
    $("activity-note").textContent = `· ${e.message}`;
    return;
  }
  $("activity").hidden = false; // shown before drawing: uPlot sizes to its box
  draw(timeline);
}

// A job just finished: draw it within a couple of seconds (at most one read in that time).
let soonTimer = null;
function chartSoon() {
  if (soonTimer || !CHART.plots) return;
  soonTimer = setTimeout(() => {
    soonTimer = null;
    refreshChart();
  }, 2000);
}

function startChart() {
  clearInterval(CHART.timer);
  refreshChart();
  CHART.timer = setInterval(refreshChart, REFRESH_MS);
}

window.addEventListener("hashchange", () => setTimeout(refreshChart, 0));
document.addEventListener("visibilitychange", () => {
  if (!document.hidden) refreshChart();
});
// after the list's first read (app.js sets S.listed), so the first paint is the list's
(function waitForList() {
  if (S.listed) startChart();
  else setTimeout(waitForList, 100);
})();
