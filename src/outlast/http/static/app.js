// outlast dashboard: plain JS, no build step. The job list is live over /events; a job's page
// follows /jobs/{id}/events. Every URL is relative, so the app works mounted under a prefix.
"use strict";

const STATUSES = ["pending", "running", "paused", "succeeded", "failed", "canceled"];
const TERMINAL = new Set(["succeeded", "failed", "canceled"]);
const PAGE = 50;

const $ = (id) => document.getElementById(id);
const S = {
  jobs: new Map(), // id -> job document, for the rows in view
  status: null,
  query: { name: null, id_prefix: null, labels: [] }, // the search box, parsed
  guessed: null, // a word no name holds, searched as an id prefix instead
  page: 0, // the page shown, 0 the newest
  target: 0, // the page last asked for (the page shown once it is read)
  cursors: [null], // cursors[i]: the `before` of page i (null: none older)
  listStream: null,
  current: null, // the job page's job id
  job: null, // and its document
  jobStream: null,
  events: [],
  lastSeq: 0,
  logTimer: null,
  tokenWaiters: [],
  selected: new Set(), // ids of the rows ticked for a bulk action, on the page in view
  view: null, // the workers, queues or schedules page shown (null: the list or a job)
};

// ------------------------------------------------------------------ helpers
function h(tag, attrs, ...children) {
  const el = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs || {})) {
    if (value === null || value === undefined || value === false) continue;
    if (key === "class") el.className = value;
    else if (key === "text") el.textContent = value;
    else if (key.startsWith("on")) el.addEventListener(key.slice(2), value);
    else el.setAttribute(key, value === true ? "" : value);
  }
  for (const child of children.flat()) {
    if (child === null || child === undefined || child === false) continue;
    el.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return el;
}

function ago(iso) {
  if (!iso) return "—";
  const s = Math.max(0, (Date.now() - Date.parse(iso)) / 1000);
  if (s < 5) return "just now";
  if (s < 60) return `${Math.floor(s)}s ago`;
  if (s < 3600) return `${Math.floor(s / 60)}m ago`;
  if (s < 86400) return `${Math.floor(s / 3600)}h ago`;
  return `${Math.floor(s / 86400)}d ago`;
}

function span(seconds) {
  if (seconds < 1) return `${Math.round(seconds * 1000)}ms`;
  if (seconds < 60) return `${seconds.toFixed(seconds < 10 ? 1 : 0)}s`;
  const m = Math.floor(seconds / 60);
  if (m < 60) return `${m}m ${Math.floor(seconds % 60)}s`;
  return `${Math.floor(m / 60)}h ${m % 60}m`;
}

function duration(job) {
  if (!job.started_at) return "—";
  const end = job.finished_at ? Date.parse(job.finished_at) : TERMINAL.has(job.status) ? Date.parse(job.updated_at) : Date.now();
  return span(Math.max(0, (end - Date.parse(job.started_at)) / 1000));
}

function clock(iso) {
  const d = new Date(iso);
  return d.toLocaleTimeString([], { hour12: false }) + "." + String(d.getMilliseconds()).padStart(3, "0");
}

// "in 5m" until a time (or "due now").
function fromNow(iso) {
  const s = (Date.parse(iso) - Date.now()) / 1000;
  if (s < 1) return "due now";
  if (s < 60) return `in ${Math.ceil(s)}s`;
  if (s < 3600) return `in ${Math.floor(s / 60)}m ${Math.floor(s % 60)}s`;
  if (s < 86400) return `in ${Math.floor(s / 3600)}h ${Math.floor((s % 3600) / 60)}m`;
  return `in ${Math.floor(s / 86400)}d ${Math.floor((s % 86400) / 3600)}h`;
}

function every(seconds) {
  if (seconds % 86400 === 0) return `every ${seconds / 86400}d`;
  if (seconds % 3600 === 0) return `every ${seconds / 3600}h`;
  if (seconds % 60 === 0) return `every ${seconds / 60}m`;
  return `every ${seconds}s`;
}

// A pending job waiting for its time (a delay, or a retry's backoff).
function waiting(job) {
  return job.status === "pending" && job.run_after && Date.parse(job.run_after) > Date.now();
}

function when(iso) {
  return iso ? `${new Date(iso).toLocaleString()} (${ago(iso)})` : "—";
}

function text(value) {
  if (value === null || value === undefined) return "";
  return typeof value === "string" ? value : JSON.stringify(value);
}

function toast(message, bad) {
  const el = $("toast");
  el.textContent = message;
  el.className = "toast" + (bad ? " bad" : "");
  el.hidden = false;
  clearTimeout(toast.timer);
  toast.timer = setTimeout(() => (el.hidden = true), 3500);
}

function setLive(state, label) {
  $("live").dataset.state = state;
  $("live-text").textContent = label;
}

// ------------------------------------------------------------------ API and token
function askToken() {
  return new Promise((resolve) => {
    S.tokenWaiters.push(resolve);
    const dialog = $("token-dialog");
    if (!dialog.open) {
      $("token-input").value = "";
      dialog.showModal();
      $("token-input").focus();
    }
  });
}

// The token is traded once for a session cookie (HttpOnly, SameSite=Strict): the page never
// keeps it, and no URL (not even an event stream's) carries it.
async function signIn(token) {
  const response = await fetch("session", {
    method: "POST",
    headers: { "Content-Type": "application/json" },
    body: JSON.stringify({ token }),
  });
  return response.ok;
}

$("token-form").addEventListener("submit", async (e) => {
  e.preventDefault();
  const value = $("token-input").value.trim();
  if (!value) return;
  $("token-error").hidden = true;
  if (!(await signIn(value))) {
    $("token-error").textContent = "Wrong token: try again.";
    $("token-error").hidden = false;
    $("token-input").select();
    return;
  }
  $("token-dialog").close();
  const waiters = S.tokenWaiters.splice(0);
  waiters.forEach((resolve) => resolve());
  restartStreams();
});

async function api(path, options = {}) {
  for (;;) {
    const headers = { ...(options.headers || {}) };
    if (options.body !== undefined) headers["Content-Type"] = "application/json";
    const response = await fetch(path, {
      method: options.method || "GET",
      headers,
      body: options.body === undefined ? undefined : JSON.stringify(options.body),
    });
    if (response.status === 401) {
      await askToken();
      continue;
    }
    if (!response.ok) {
      let detail = response.statusText;
      try {
        const body = await response.json();
        detail = typeof body.detail === "string" ? body.detail : JSON.stringify(body.detail);
      } catch (_) { /* not JSON */ }
      const error = new Error(detail);
      error.status = response.status;
      throw error;
    }
    if (response.status === 204) return null;
    const type = response.headers.get("content-type") || "";
    return type.includes("json") ? response.json() : response.text();
  }
}

function streamUrl(path) {
  return path; // the session cookie goes with it
}

// ------------------------------------------------------------------ the job list
// A progress element for the job; updating an existing one keeps its width transition.
function setBar(el, job, big) {
  const known = job.progress !== null && job.progress !== undefined;
  const running = job.status === "running";
  const pct = job.status === "succeeded" ? 100 : known ? job.progress : 0;
  const cls = ["progress", big ? "big" : "", job.status, running && !known ? "indeterminate" : ""];
  el.className = cls.filter(Boolean).join(" ");
  el.firstChild.style.width = `${Math.max(0, Math.min(100, pct))}%`;
  el.setAttribute("role", "progressbar");
  el.setAttribute("aria-valuenow", String(Math.round(pct)));
  return el;
}

function progressBar(job, big) {
  return setBar(h("div", {}, h("div", { class: "bar" })), job, big);
}

function pctText(job) {
  if (job.progress === null || job.progress === undefined) return job.status === "succeeded" ? "100%" : "—";
  return `${Math.round(job.progress)}%`;
}

function row(job) {
  const labels = Object.entries(job.labels || {}).map(([k, v]) => h("span", { class: "label" }, `${k}=${v}`));
  const box = h("input", {
    type: "checkbox",
    class: "select",
    "aria-label": `select ${job.name} (${job.id.slice(-10)})`,
    checked: S.selected.has(job.id),
  });
  box.addEventListener("change", () => select(job.id, box.checked));
  const pick = h("td", { class: "c-select" }, box);
  pick.addEventListener("click", (e) => {
    // the box (or its cell) selects the row; it does not open the job
    e.stopPropagation();
    if (e.target !== box) box.click();
  });
  const tr = h(
    "tr",
    { "data-id": job.id, "data-status": job.status, class: job.status, tabindex: "0", role: "link", "aria-label": `${job.name}, ${job.status}`, "data-selected": S.selected.has(job.id) ? "true" : null },
    pick,
    h("td", { class: "c-status" }, h("span", { class: `pill ${job.status}` }, job.status)),
    h(
      "td",
      { class: "c-job" },
      h("div", { class: "job-name" }, job.name, job.priority ? h("span", { class: "prio", title: "priority" }, ` p${job.priority > 0 ? "+" : ""}${job.priority}`) : null),
      h("div", { class: "sub" }, job.kind === "command" && job.command ? job.command.join(" ") : job.kind),
      labels.length ? h("div", { class: "labels" }, labels) : null,
    ),
    h("td", { class: "c-progress" }, h("div", { class: "progress-cell" }, progressBar(job, false), h("span", { class: "pct" }, pctText(job)))),
    h("td", { class: "c-step step" }, job.step ? `${job.step}` : h("span", { class: "muted" }, "—"),
      job.phase && job.step ? h("div", { class: "sub" }, job.phase) : null,
      waiting(job) ? h("div", { class: "due", "data-runs-at": job.run_after }, `runs ${fromNow(job.run_after)}`) : null,
      job.status === "failed" && job.error ? h("div", { class: "err", title: job.error.message }, job.error.message) : null),
    h("td", { class: "c-time time", "data-ago": job.created_at }, ago(job.created_at)),
    h("td", { class: "c-time time", "data-duration": "1" }, duration(job)),
    h("td", { class: "c-id id", title: job.id }, job.id.slice(-10)),
  );
  const open = () => (location.hash = `#/jobs/${encodeURIComponent(job.id)}`);
  tr.addEventListener("click", open);
  tr.addEventListener("keydown", (e) => {
    // On a row: Enter opens the job, Space selects it; the arrow keys move between rows (from
    // a row's box to the next row's box). On the box, Space is the box's own.
    const onBox = e.target === box;
    if (e.key === "Enter" && !onBox) open();
    else if (e.key === " " && !onBox) box.click();
    else if (e.key === "ArrowDown" || e.key === "ArrowUp") {
      const next = e.key === "ArrowDown" ? tr.nextElementSibling : tr.previousElementSibling;
      if (!next) return;
      (onBox ? next.querySelector("input.select") : next).focus();
    } else return;
    e.preventDefault();
  });
  return tr;
}

// ------------------------------------------------------------------ selected rows
function select(id, on) {
  if (on) S.selected.add(id);
  else S.selected.delete(id);
  renderSelection();
}

// The bar of actions on the selected rows, the boxes and the page's select-all box.
function renderSelection() {
  for (const id of [...S.selected]) if (!S.jobs.has(id)) S.selected.delete(id); // gone from view
  const n = S.selected.size;
  $("selection").hidden = n === 0;
  $("selection-count").textContent = `${n} selected`;
  const rows = [...$("jobs").children];
  for (const tr of rows) {
    const on = S.selected.has(tr.dataset.id);
    const box = tr.querySelector("input.select");
    if (box && box.checked !== on) box.checked = on;
    if (on) tr.dataset.selected = "true";
    else delete tr.dataset.selected;
  }
  const all = $("select-page");
  const picked = rows.filter((tr) => S.selected.has(tr.dataset.id)).length;
  all.checked = rows.length > 0 && picked === rows.length;
  all.indeterminate = picked > 0 && picked < rows.length;
  all.disabled = rows.length === 0;
}

function clearSelection() {
  S.selected.clear();
  renderSelection();
}

$("select-page").addEventListener("change", (e) => {
  for (const tr of $("jobs").children) {
    if (e.target.checked) S.selected.add(tr.dataset.id);
    else S.selected.delete(tr.dataset.id);
  }
  renderSelection();
});
$("selection-clear").addEventListener("click", clearSelection);

// Which selected jobs an action applies to: cancel the live ones, retry or delete the
// finished ones (the others are left as they are, and the question says so).
const SELECTED = {
  cancel: { fits: (job) => !TERMINAL.has(job.status), done: "Canceled", left: "finished already" },
  retry: { fits: (job) => TERMINAL.has(job.status), done: "Retried", left: "not finished" },
  delete: { fits: (job) => TERMINAL.has(job.status), done: "Deleted", left: "not finished" },
};

async function bulkSelected(action) {
  const rule = SELECTED[action];
  const chosen = [...S.selected].map((id) => S.jobs.get(id)).filter(Boolean);
  const ids = chosen.filter(rule.fits).map((job) => job.id);
  const verb = `${action[0].toUpperCase()}${action.slice(1)}`;
  const jobs = (n) => `${n} job${n === 1 ? "" : "s"}`;
  if (ids.length === 0) {
    toast(`Nothing to ${action}: the selected ${chosen.length === 1 ? "job is" : "jobs are"} ${rule.left}`, true);
    return;
  }
  const others = chosen.length - ids.length;
  const skipped = others ? ` (${jobs(others)} of the selection ${others === 1 ? "is" : "are"} ${rule.left}: left as ${others === 1 ? "it is" : "they are"})` : "";
  const extra = action === "delete" ? " with their events and logs" : "";
  if (!window.confirm(`${verb} ${ids.length} selected job${ids.length === 1 ? "" : "s"}${extra}?${skipped}`)) return;
  try {
    const done = await api(`jobs/bulk/${action}`, { method: "POST", body: { ids } });
    toast(`${rule.done} ${jobs(done.count)}`);
    clearSelection();
  } catch (e) {
    toast(e.message, true);
  }
  loadList(0);
}

document.querySelectorAll("#selection [data-act]").forEach((button) =>
  button.addEventListener("click", () => bulkSelected(button.dataset.act)),
);

// The search box: a word (or words) is a name search, `id:PREFIX` an id prefix, `key=value`
// a label; every term must hold. Quotes are not needed: the words of a name are kept together.
function parseSearch(text) {
  const query = { name: null, id_prefix: null, labels: [] };
  const words = [];
  for (const term of text.trim().split(/\s+/).filter(Boolean)) {
    if (/^id:/i.test(term)) query.id_prefix = term.slice(3) || null;
    else if (/^name:/i.test(term)) words.push(term.slice(5));
    else if (term.includes("=")) query.labels.push(term);
    else words.push(term);
  }
  const name = words.filter(Boolean).join(" ");
  query.name = name || null;
  return query;
}

// A word no job name holds but that looks like (the start of) an id: a pasted id.
const ID_SHAPED = /^(?=.*\d)[A-Za-z0-9][A-Za-z0-9_.-]{5,127}$/;

// The search the list shows: the box's, or the id prefix it was taken for.
function activeQuery() {
  return S.guessed ? { ...S.query, name: null, id_prefix: S.guessed } : S.query;
}

function searchParams(params) {
  const q = activeQuery();
  if (q.name) params.set("name", q.name);
  if (q.id_prefix) params.set("id_prefix", q.id_prefix);
  q.labels.forEach((label) => params.append("label", label));
  return q;
}

function matches(job) {
  if (S.status && job.status !== S.status) return false;
  const q = activeQuery();
  if (q.name && !job.name.toLowerCase().includes(q.name.toLowerCase())) return false;
  if (q.id_prefix && !job.id.startsWith(q.id_prefix)) return false;
  for (const label of q.labels) {
    const [k, ...rest] = label.split("=");
    if ((job.labels || {})[k] !== rest.join("=")) return false;
  }
  return true;
}

function filtered() {
  return Boolean(S.status || S.query.name || S.query.id_prefix || S.query.labels.length);
}

function renderSummary() {
  const counts = {};
  for (const job of S.jobs.values()) counts[job.status] = (counts[job.status] || 0) + 1;
  const parts = STATUSES.filter((s) => counts[s]).map((s) => `${counts[s]} ${s}`);
  const guess = S.guessed ? `no job name holds “${S.query.name}”: jobs whose id starts with it · ` : "";
  $("summary").textContent = S.jobs.size ? `${guess}${S.jobs.size} shown · ${parts.join(" · ")}` : "";
  const none = S.listed && S.jobs.size === 0; // not before a list was read
  $("empty").hidden = !none || filtered() || S.page > 0;
  $("no-match").hidden = !none || (!filtered() && S.page === 0);
}

// Live updates: a job that now matches joins the newest page; on older pages only the rows
// shown change (a page of older jobs gains no new ones).
// The list's order, the store's: created_at (ISO 8601 in UTC to the microsecond, so the
// strings sort as the times do), then id.
function newer(a, b) {
  return a.created_at === b.created_at ? a.id > b.id : a.created_at > b.created_at;
}

// A row redrawn keeps the keyboard's focus (on the row, or on its box).
function focusIn(tr) {
  const active = document.activeElement;
  if (!tr || !active || !tr.contains(active)) return null;
  return active === tr ? "row" : "box";
}

function refocus(tr, focus) {
  if (!tr || !focus) return;
  (focus === "row" ? tr : tr.querySelector("input.select")).focus();
}

// Make ``old`` what ``fresh`` is, keeping every element of ``old`` whose tag is the same at
// the same place (so its listeners, its focus and a press on it stay); only the attributes,
// texts and the elements that differ change. ``fresh`` is built by the same function, so a
// kept element's listeners do what the fresh one's would (they use the job's id, which is
// the same). A bar's new width is a style change on the kept bar: it slides (CSS transition).
function morph(old, fresh) {
  for (const a of [...old.attributes]) if (a.name !== "style" && !fresh.hasAttribute(a.name)) old.removeAttribute(a.name);
  for (const a of [...fresh.attributes]) {
    if (a.name !== "style" && old.getAttribute(a.name) !== a.value) old.setAttribute(a.name, a.value);
  }
  // a style through the CSSOM, property by property: the page's CSP (style-src 'self') refuses
  // a style attribute written as text
  for (const name of [...old.style]) if (!fresh.style.getPropertyValue(name)) old.style.removeProperty(name);
  for (const name of [...fresh.style]) {
    const value = fresh.style.getPropertyValue(name);
    if (old.style.getPropertyValue(name) !== value) old.style.setProperty(name, value);
  }
  const was = [...old.childNodes];
  const now = [...fresh.childNodes];
  now.forEach((node, i) => {
    const prior = was[i];
    if (!prior) old.append(node);
    else if (prior.nodeType === Node.TEXT_NODE && node.nodeType === Node.TEXT_NODE) {
      if (prior.data !== node.data) prior.data = node.data;
    } else if (prior.nodeType === Node.ELEMENT_NODE && prior.nodeName === node.nodeName) morph(prior, node);
    else prior.replaceWith(node);
  });
  for (const extra of was.slice(now.length)) extra.remove();
}

// ``el``'s children made ``children``, in place (see morph).
function morphChildren(el, ...children) {
  const fresh = el.cloneNode(false);
  fresh.append(...children);
  morph(el, fresh);
}

function upsert(job, flash, last) {
  const body = $("jobs");
  const old = body.querySelector(`tr[data-id="${CSS.escape(job.id)}"]`);
  if (!matches(job)) {
    if (old) old.remove();
    S.jobs.delete(job.id);
    renderSummary();
    if (S.selected.has(job.id)) renderSelection();
    return;
  }
  if (!old && !last && S.page > 0) return;
  S.jobs.set(job.id, job);
  const flashes = flash && (!old || old.dataset.status !== job.status);
  if (old) {
    // The row stays the element it was, brought up to date: a click pressed on it before an
    // event and released after lands on it (had a new row taken its place, the browser would
    // drop the click, a press on an element gone from the page), and the focus stays on it.
    morph(old, row(job));
    if (flashes) {
      old.classList.remove("flash");
      void old.offsetWidth; // the animation starts again
      old.classList.add("flash");
    }
    const box = old.querySelector("input.select");
    if (box) box.checked = S.selected.has(job.id);
    renderSummary();
    if (S.selected.size) renderSelection();
    return;
  }
  const fresh = row(job);
  if (flashes) fresh.classList.add("flash");
  if (last) body.append(fresh); // a page, read in order
  else {
    const after = [...body.children].find((tr) => {
      const shown = S.jobs.get(tr.dataset.id);
      return shown && newer(job, shown);
    });
    body.insertBefore(fresh, after || null);
  }
  renderSummary();
  if (S.selected.size) renderSelection(); // the select-all box counts the new row
}

// Pages are cursors, not numbers: a page is "the PAGE jobs older than the last one of the
// page before" (GET /jobs?before=), one indexed read however deep, and it stays put while new
// jobs arrive. Numbered pages would need a count of every matching job and an OFFSET that
// reads (and skips) every job before the page, and their contents slide under the reader as
// jobs are created. Newer goes back through the cursors this page came by.
let listSeq = 0;
async function loadList(move) {
  // 0 reads again the page shown, or the one asked for and not yet read (a click on Older
  // just before the stream's first "ready" must not be undone by its reload)
  const page = move === null ? 0 : move === 0 ? S.target : Math.max(0, S.page + move);
  if (page > 0 && !S.cursors[page]) return; // nothing older
  const seq = ++listSeq;
  S.target = page;
  const params = new URLSearchParams({ limit: PAGE });
  if (S.status) params.set("status", S.status);
  const q = searchParams(params);
  if (page > 0) params.set("before", S.cursors[page]);
  let result;
  try {
    result = await api(`jobs?${params}`);
  } catch (e) {
    if (seq !== listSeq) return;
    S.target = S.page;
    if (e.status === 400 || e.status === 422) showSearchError(e.message);
    else toast(`Could not list jobs: ${e.message}`, true);
    return;
  }
  if (seq !== listSeq) return; // a later search or page was asked for meanwhile
  showSearchError(null);
  if (page === 0 && result.jobs.length === 0 && !S.guessed && q.name && !q.id_prefix && ID_SHAPED.test(q.name)) {
    S.guessed = q.name; // perhaps an id, pasted
    loadList(null);
    return;
  }
  if (page === 0 && result.jobs.length === 0) S.guessed = null; // not an id either
  S.listed = true;
  if (page !== S.page || move === null) S.selected.clear(); // another page, filter or search
  S.page = page;
  S.cursors.length = page + 1;
  S.cursors.push(result.next);
  showPage(result.jobs.filter(matches));
  renderPager();
  renderSummary();
  renderSelection();
}

// A page read again: a row whose job did not change stays as it is (the keyboard's focus, a
// key half pressed on it, its box), the others are brought up to date in place, in the
// page's order (a row moved loses the focus: it is given back).
function showPage(jobs) {
  const body = $("jobs");
  const before = new Map([...body.children].map((tr) => [tr.dataset.id, tr]));
  const known = new Map(S.jobs);
  const active = document.activeElement;
  const focusedRow = active && active.closest ? active.closest("#jobs tr") : null;
  const focus = focusedRow ? [focusedRow.dataset.id, focusIn(focusedRow)] : null;
  S.jobs.clear();
  jobs.forEach((job, i) => {
    const old = before.get(job.id);
    const same = old && known.has(job.id) && JSON.stringify(known.get(job.id)) === JSON.stringify(job);
    const tr = old || row(job);
    if (old && !same) morph(old, row(job)); // (as upsert does: the row stays the element it was)
    before.delete(job.id);
    S.jobs.set(job.id, job);
    if (body.children[i] !== tr) body.insertBefore(tr, body.children[i] || null);
  });
  before.forEach((tr) => tr.remove());
  if (focus && !(focusedRow.isConnected && document.activeElement !== document.body)) {
    refocus(body.querySelector(`tr[data-id="${CSS.escape(focus[0])}"]`), focus[1]);
  }
}

function renderPager() {
  const older = Boolean(S.cursors[S.page + 1]);
  $("pager").hidden = S.page === 0 && !older;
  $("page-older").disabled = !older;
  $("page-newer").disabled = S.page === 0;
  $("page-first").disabled = S.page === 0;
  $("page-label").textContent = `Page ${S.page + 1}`;
}

function showSearchError(message) {
  const el = $("search-error");
  el.hidden = !message;
  el.textContent = message || "";
  $("search").setAttribute("aria-invalid", message ? "true" : "false");
}

// The search lives in the address (#/?q=…), so a search can be shared and survives a reload.
function setSearch(text, fromHash) {
  S.text = text;
  S.query = parseSearch(text);
  S.guessed = null;
  const hash = text.trim() ? `#/?q=${encodeURIComponent(text.trim())}` : "#/";
  S.listHash = hash; // where "All jobs" goes back to
  if (!fromHash && location.hash !== hash && !(hash === "#/" && location.hash === "")) {
    history.replaceState(null, "", hash);
  }
  renderBulk();
  loadList(null);
}

function hashSearch() {
  const m = location.hash.match(/^#\/\?(.*)$/);
  return m ? new URLSearchParams(m[1]).get("q") || "" : "";
}

function renderFilters() {
  const chips = [null, ...STATUSES].map((status) =>
    h(
      "button",
      {
        class: "chip",
        "aria-pressed": String(S.status === status),
        onclick: () => {
          S.status = status;
          renderFilters();
          renderBulk();
          loadList(null);
        },
      },
      status ? h("span", { class: `swatch ${status}` }) : null,
      status || "all",
    ),
  );
  $("filters").replaceChildren(...chips);
}

// Bulk actions on every job of the status filter (and label): counted first, confirmed.
const BULK = {
  failed: ["retry", "delete"],
  canceled: ["retry", "delete"],
  succeeded: ["retry", "delete"],
  pending: ["cancel"],
  running: ["cancel"],
  paused: ["cancel"],
};

// (A bulk action takes a status and one label: a name or id search hides them, so that no
// button acts on more jobs than the list shows.)
function renderBulk() {
  const q = S.query;
  const narrowed = q.name || q.id_prefix || q.labels.length > 1;
  const actions = S.status && !narrowed ? BULK[S.status] || [] : [];
  const bar = $("bulk");
  bar.hidden = actions.length === 0;
  bar.replaceChildren(
    ...actions.map((action) =>
      h("button", { class: `btn ${action === "retry" ? "primary" : "danger"}`, "data-bulk": action, onclick: () => bulk(action) },
        `${action[0].toUpperCase()}${action.slice(1)} all ${S.status}`),
    ),
  );
}

async function bulk(action) {
  const body = { status: S.status };
  if (S.query.labels.length) body.label = S.query.labels[0];
  try {
    const counted = await api(`jobs/bulk/${action}`, { method: "POST", body: { ...body, dry_run: true } });
    if (counted.count === 0) {
      toast(`No ${S.status} jobs to ${action}`);
      return;
    }
    const what = `${counted.count} ${S.status} job${counted.count === 1 ? "" : "s"}`;
    if (!window.confirm(`${action[0].toUpperCase()}${action.slice(1)} ${what}?`)) return;
    const done = await api(`jobs/bulk/${action}`, { method: "POST", body });
    toast(`${action === "delete" ? "Deleted" : action === "cancel" ? "Canceled" : "Retried"} ${done.count} job${done.count === 1 ? "" : "s"}`);
    loadList(0);
  } catch (e) {
    toast(e.message, true);
  }
}

function startListStream() {
  if (S.listStream) S.listStream.close();
  const es = new EventSource(streamUrl("events"));
  S.listStream = es;
  es.addEventListener("ready", () => {
    setLive("live", "live");
    loadList(0); // this page again: what changed while the stream was down
  });
  es.addEventListener("job", (e) => {
    const job = JSON.parse(e.data);
    upsert(job, true);
    if (job.id === S.current) renderJob(job);
    if (TERMINAL.has(job.status) && typeof chartSoon === "function") chartSoon(); // chart.js
  });
  es.onerror = () => setLive("down", "reconnecting");
}

// ------------------------------------------------------------------ one job
function renderJob(job) {
  S.job = job;
  $("job-name").textContent = job.name;
  const pill = $("job-status");
  pill.className = `pill ${job.status}`;
  pill.textContent = job.status;
  $("job-sub").replaceChildren(
    h("span", { class: "mono" }, job.id),
    ` · ${job.kind} · queue ${job.queue} · created ${ago(job.created_at)}`,
  );
  $("job-progress").hidden = false;
  setBar($("job-progress"), job, true);
  morphChildren($("job-progress-text"),
    h("span", {}, job.step ? `${job.step} · ${job.phase || ""}` : waiting(job) ? `runs at ${new Date(job.run_after).toLocaleString()} (${fromNow(job.run_after)})` : job.status === "pending" ? "waiting for a worker" : ""),
    h("span", { class: "pct-big" }, pctText(job)),
  );
  $("cancel").hidden = TERMINAL.has(job.status);
  $("delete").hidden = !TERMINAL.has(job.status);
  $("retry").hidden = !TERMINAL.has(job.status);

  const meta = [
    ["status", job.status],
    ["priority", String(job.priority || 0)],
    ["attempts", `${job.attempts} of ${job.max_attempts}`],
    ["step", job.step ? `${job.step} (${job.phase})` : "—"],
    ["created", when(job.created_at)],
    ["started", when(job.started_at)],
    ["finished", when(job.finished_at)],
    ["duration", duration(job)],
  ];
  if (waiting(job)) {
    const label = job.attempts > 0 ? "retry at" : "runs at";
    meta.push([label, `${new Date(job.run_after).toLocaleString()} (${fromNow(job.run_after)})`]);
  }
  if (job.timeout !== null && job.timeout !== undefined) meta.push(["timeout", `${job.timeout}s`]);
  if (job.fired) {
    const why = { catch_up: " · catch-up", manual: " · run by hand" }[job.fired.reason] || "";
    meta.push(["schedule", h("span", {}, h("a", { href: "#/schedules" }, job.fired.schedule), ` · for ${when(job.fired.fire_at)}${why}`)]);
  }
  if (job.keep !== null && job.keep !== undefined) meta.push(["kept", `${job.keep}s after it finishes`]);
  if (job.unique_key !== null && job.unique_key !== undefined) meta.push(["unique key", h("code", {}, job.unique_key)]);
  if (job.limit_key) meta.push(["limit key", h("code", {}, job.limit_key + (job.limit ? ` (${job.limit} at once)` : ""))]);
  if (job.retry_of) meta.push(["retry of", h("a", { class: "mono", href: `#/jobs/${encodeURIComponent(job.retry_of)}` }, job.retry_of)]);
  if (S.retries && S.retries.id === job.id && S.retries.jobs.length) {
    meta.push(["retried as", h("span", {}, ...S.retries.jobs.flatMap((id, i) => [i ? " " : "", h("a", { class: "mono", href: `#/jobs/${encodeURIComponent(id)}` }, id)]))]);
  }
  if (job.worker) meta.push(["worker", job.worker]);
  if (job.pid) meta.push(["pid", String(job.pid)]);
  if (job.command) meta.push(["command", h("code", {}, job.command.join(" "))]);
  if (job.payload && (job.payload.args || job.payload.kwargs)) {
    meta.push(["arguments", h("code", {}, text({ args: job.payload.args, kwargs: job.payload.kwargs }))]);
  }
  const labels = Object.entries(job.labels || {});
  if (labels.length) meta.push(["labels", h("div", { class: "labels" }, labels.map(([k, v]) => h("span", { class: "label" }, `${k}=${v}`)))]);
  // in place, as a row of the list: a link pressed (retry of, schedule) or a text being
  // selected (the worker, the pid) is not taken from under the pointer by the job's events
  morphChildren($("job-meta"), ...meta.flatMap(([k, v]) => [h("dt", {}, k), h("dd", {}, v)]));

  const paused = job.status === "paused";
  $("question-card").hidden = !paused;
  if (paused) $("question").textContent = JSON.stringify(job.question, null, 2);

  const card = $("outcome-card");
  if (job.status === "succeeded") {
    card.hidden = false;
    $("outcome-title").textContent = "Result";
    $("outcome").replaceChildren(h("pre", { class: "json" }, JSON.stringify(job.result, null, 2)));
  } else if (job.error) {
    card.hidden = false;
    $("outcome-title").textContent = job.status === "canceled" ? "Canceled" : TERMINAL.has(job.status) ? "Error" : "Last error";
    // a traceback is shown folded; a reader who unfolded it keeps it open across refreshes
    const wasOpen = !!document.querySelector("#outcome details.traceback[open]");
    const traceback = job.error.traceback
      ? h("details", { class: "traceback", open: wasOpen || undefined }, h("summary", {}, "Traceback"), h("pre", {}, job.error.traceback))
      : null;
    $("outcome").replaceChildren(
      h(
        "div",
        { class: `error-box ${job.status}` },
        h("div", { class: "error-code" }, [job.error.code, job.error.type].filter(Boolean).join(" · ")),
        h("div", { class: "error-msg" }, job.error.message),
        job.error.hint ? h("div", { class: "muted" }, job.error.hint) : null,
        traceback,
      ),
    );
  } else {
    card.hidden = true;
  }
}

function eventItem(ev) {
  return h(
    "li",
    { class: `ev-${ev.status}`, "data-seq": String(ev.seq) },
    h("span", { class: "tdot" }),
    h("span", { class: "ev-time seq" }, clock(ev.at)),
    h("span", { class: "seq" }, `#${ev.seq}`),
    h("span", { class: "ev-step", title: `${ev.step} · ${ev.status}` }, `${ev.step} · ${ev.status}`),
    h("span", { class: "ev-msg" }, text(ev.message)),
  );
}

// One read of the open job, 150 ms after its events settle. The read in flight is kept, so
// a delete waits for it: no read of a job can reach the server after its delete (a 404).
let refreshTimer = null;
let refreshRead = null;
function refreshJobSoon() {
  if (refreshTimer) return;
  const id = S.current;
  refreshTimer = setTimeout(() => {
    refreshTimer = null;
    if (!id || S.current !== id) return;
    refreshRead = (async () => {
      try {
        const job = await api(`jobs/${encodeURIComponent(id)}`);
        if (S.current === id) renderJob(job);
      } catch (_) { /* the next event retries */ }
    })();
  }, 150);
}

// Stop every read of the open job (its stream, its log, a refresh due) and wait for the one
// in flight: the job is about to be deleted.
async function quietJob() {
  stopJobStream();
  clearInterval(S.logTimer);
  clearTimeout(refreshTimer);
  refreshTimer = null;
  await refreshRead;
}

function startJobStream(id) {
  stopJobStream();
  const es = new EventSource(streamUrl(`jobs/${encodeURIComponent(id)}/events`));
  S.jobStream = es;
  es.onmessage = null;
  const onEvent = (e) => {
    const ev = JSON.parse(e.data);
    if (ev.seq <= S.lastSeq) return; // a replay after reconnect: already shown
    S.lastSeq = ev.seq;
    const list = $("events");
    const stick = list.scrollTop + list.clientHeight >= list.scrollHeight - 8;
    list.append(eventItem(ev));
    if (stick) list.scrollTop = list.scrollHeight;
    $("event-count").textContent = `· ${S.lastSeq}`;
    refreshJobSoon();
  };
  ["started", "progress", "completed", "skipped", "paused", "failed"].forEach((name) => es.addEventListener(name, onEvent));
  // The server ends the stream after the job's terminal event, and EventSource would
  // reconnect (with Last-Event-ID, so nothing repeats): stop once the job is finished.
  es.onerror = () => {
    if (S.job && S.job.id === id && TERMINAL.has(S.job.status)) stopJobStream();
    else refreshJobSoon();
  };
}

function stopJobStream() {
  if (S.jobStream) S.jobStream.close();
  S.jobStream = null;
}

async function loadLog() {
  const id = S.current;
  if (!id) return;
  try {
    const text = await api(`jobs/${encodeURIComponent(id)}/log?tail=300`);
    if (id !== S.current) return;
    const pre = $("log");
    const stick = pre.scrollTop + pre.clientHeight >= pre.scrollHeight - 8;
    pre.textContent = text || "(empty)";
    if (stick) pre.scrollTop = pre.scrollHeight;
    $("log-note").textContent = "· last 300 lines";
  } catch (e) {
    if (id !== S.current) return;
    $("log").textContent = e.status === 404 ? "No log for this job." : `Could not read the log: ${e.message}`;
    $("log-note").textContent = "";
  }
}

async function openJob(id) {
  S.current = id;
  document.querySelector("#job-view .back").setAttribute("href", S.listHash || "#/");
  S.lastSeq = 0;
  $("events").replaceChildren();
  $("event-count").textContent = "";
  $("log").textContent = "";
  $("list-view").hidden = true;
  $("job-view").hidden = false;
  let job;
  try {
    job = await api(`jobs/${encodeURIComponent(id)}`);
  } catch (e) {
    if (S.current !== id) return;
    clearJobView();
    $("job-name").textContent = e.status === 404 ? "No such job" : "Could not load the job";
    $("job-sub").textContent = e.message;
    return;
  }
  if (S.current !== id) return;
  S.retries = null;
  renderJob(job);
  loadRetries(job);
  startJobStream(id);
  loadLog();
  clearInterval(S.logTimer);
  S.logTimer = setInterval(() => {
    if (S.job && S.job.id === S.current && !TERMINAL.has(S.job.status)) loadLog();
    else loadLogOnceMore();
  }, 2000);
}

// Nothing of another job stays on the page (a missing id, a failed load): no status, no
// details, no actions, no stream or log polling.
function clearJobView() {
  S.job = null;
  stopJobStream();
  clearInterval(S.logTimer);
  const pill = $("job-status");
  pill.className = "pill";
  pill.textContent = "";
  ["cancel", "delete", "retry"].forEach((b) => ($(b).hidden = true));
  $("job-meta").replaceChildren();
  $("job-progress").hidden = true;
  $("job-progress-text").textContent = "";
  $("question-card").hidden = true;
  $("outcome-card").hidden = true;
  $("log").textContent = "";
  $("log-note").textContent = "";
}

// After the job finished: one last read of its log, then stop polling.
function loadLogOnceMore() {
  clearInterval(S.logTimer);
  loadLog();
}

function closeJob() {
  S.current = null;
  S.job = null;
  stopJobStream();
  clearInterval(S.logTimer);
  $("job-view").hidden = true;
  $("list-view").hidden = false;
}

async function act(label, fn) {
  try {
    const job = await fn();
    if (job) {
      renderJob(job);
      upsert(job, true);
    }
    toast(label);
  } catch (e) {
    toast(e.message, true);
  }
}

$("cancel").addEventListener("click", () => {
  const id = S.current;
  if (!window.confirm(`Cancel job ${S.job ? S.job.name : id}? Its work is stopped.`)) return;
  act("Job canceled", () => api(`jobs/${encodeURIComponent(id)}/cancel`, { method: "POST" }));
});

$("retry").addEventListener("click", async () => {
  const id = S.current;
  try {
    const job = await api(`jobs/${encodeURIComponent(id)}/retry`, { method: "POST" });
    toast("Retried: a new job");
    location.hash = `#/jobs/${encodeURIComponent(job.id)}`;
  } catch (e) {
    toast(e.message, true);
  }
});

async function loadRetries(job) {
  if (!TERMINAL.has(job.status)) return;
  try {
    const found = await api(`jobs/${encodeURIComponent(job.id)}/retries`);
    if (S.current !== job.id) return;
    S.retries = { id: job.id, jobs: found.jobs };
    if (found.jobs.length && S.job) renderJob(S.job);
  } catch (_) { /* not essential */ }
}

$("delete").addEventListener("click", async () => {
  const id = S.current;
  if (!window.confirm(`Delete job ${S.job ? S.job.name : id} with its events and log?`)) return;
  await quietJob();
  try {
    await api(`jobs/${encodeURIComponent(id)}`, { method: "DELETE" });
  } catch (e) {
    toast(e.message, true);
    if (S.current === id) openJob(id); // still there: its stream and log again
    return;
  }
  S.jobs.delete(id);
  $("jobs").querySelector(`tr[data-id="${CSS.escape(id)}"]`)?.remove();
  toast("Job deleted");
  if (S.current === id) closeJob();
  location.hash = S.listHash || "#/";
});

$("resume-form").addEventListener("submit", (e) => {
  e.preventDefault();
  const raw = $("answer").value.trim();
  let answer;
  try {
    answer = raw === "" ? null : JSON.parse(raw);
  } catch (_) {
    // as the CLI does: the answer is JSON, a string is quoted
    toast(`Not JSON: to answer with a string, quote it: ${JSON.stringify(raw)}`, true);
    $("answer").focus();
    return;
  }
  const id = S.current;
  act("Job resumed", () => api(`jobs/${encodeURIComponent(id)}/resume`, { method: "POST", body: { answer } }));
});

// ------------------------------------------------------------------ schedules
function scheduleRow(s) {
  const whenText = s.cron ? `cron ${s.cron}${s.tz && s.tz !== "UTC" ? ` (${s.tz})` : ""}` : every(s.every);
  const next = s.paused
    ? h("span", { class: "pill paused" }, "paused")
    : s.next_at
      ? h("span", {}, new Date(s.next_at).toLocaleString(), h("div", { class: "due", "data-runs-at": s.next_at }, fromNow(s.next_at)))
      : "—";
  const last = s.last_job
    ? h("span", {},
      h("a", { class: "job-link mono", href: `#/jobs/${encodeURIComponent(s.last_job)}` }, s.last_job.slice(-24)), " ",
      h("span", { class: `pill ${s.last_status || ""}` }, s.last_status || "deleted"),
      h("div", { class: "sub" }, `${s.fires} run${s.fires === 1 ? "" : "s"}${s.skipped ? ` · ${s.skipped} skipped` : ""}`))
    : h("span", { class: "muted" }, "not yet");
  const job = s.job.command ? s.job.command.join(" ") : s.job.name;
  const name = encodeURIComponent(s.id);
  const toggle = s.paused
    ? h("button", { class: "btn", "data-action": "resume", onclick: () => scheduleAct(`schedules/${name}/resume`, `${s.id} resumed`) }, "Resume")
    : h("button", { class: "btn", "data-action": "pause", onclick: () => scheduleAct(`schedules/${name}/pause`, `${s.id} paused`) }, "Pause");
  const runNow = h("button", { class: "btn primary", "data-action": "run", onclick: () => scheduleAct(`schedules/${name}/run`, `${s.id}: a job started`) }, "Run now");
  return h("tr", { "data-id": s.id },
    h("td", {}, h("div", { class: "job-name" }, s.id), h("div", { class: "sub" }, job)),
    h("td", { "data-label": "When" }, whenText, h("div", { class: "sub" }, `misfire ${s.misfire}${s.overlap ? "" : " · no overlap"}`)),
    h("td", { class: "time", "data-label": "Next run" }, next),
    h("td", { "data-label": "Last run" }, last),
    h("td", { class: "c-actions" }, toggle, runNow));
}

async function loadGroups() {
  const page = await api("groups");
  $("groups-card").hidden = page.groups.length === 0;
  $("groups").replaceChildren(
    ...page.groups.map((g) =>
      h("tr", { "data-id": g.name },
        h("td", {}, h("code", {}, g.name)),
        h("td", {}, g.slots === null ? h("span", { class: "muted", title: "each job's own limit, else 1" }, "—") : String(g.slots)),
        h("td", {}, String(g.running)),
        h("td", {}, String(g.waiting)))),
  );
}

// The Queues page: each queue's jobs by status and its oldest wait; the groups below.
async function loadQueues() {
  const page = await api("queues");
  if (S.view !== "queues") return;
  $("queues-empty").hidden = page.queues.length > 0;
  $("queues").replaceChildren(
    ...page.queues.map((q) =>
      h("tr", { "data-id": q.name },
        h("td", { class: "q-name" }, h("code", {}, q.name)),
        h("td", { class: "q-pending" }, String(q.pending)),
        h("td", { class: "q-running" }, String(q.running)),
        h("td", { class: "q-paused" }, String(q.paused)),
        h("td", { class: "time" }, q.oldest_due_seconds ? fmtSeconds(q.oldest_due_seconds) : "—"),
        h("td", { class: "q-finished" }, String(q.succeeded + q.failed + q.canceled), q.failed ? h("span", { class: "sub err-count" }, ` · ${q.failed} failed`) : null))),
  );
  const sum = (key) => page.queues.reduce((n, q) => n + q[key], 0);
  $("queues-summary").textContent = page.queues.length
    ? `${page.queues.length} queue${page.queues.length === 1 ? "" : "s"} · ${sum("pending")} pending · ${sum("running")} running`
    : "";
  await loadGroups();
}

function fmtSeconds(seconds) {
  if (seconds < 60) return `${seconds.toFixed(1)} s`;
  if (seconds < 3600) return `${Math.floor(seconds / 60)} min`;
  return `${(seconds / 3600).toFixed(1)} h`;
}

// The Workers page: the registry's live workers (liveness is each one's lock).
async function loadWorkers() {
  const page = await api("workers");
  if (S.view !== "workers") return;
  $("workers-empty").hidden = page.workers.length > 0;
  $("workers").replaceChildren(
    ...page.workers.map((w) =>
      h("tr", { "data-id": w.name, "data-kind": w.kind },
        h("td", { class: "w-kind" }, w.kind),
        h("td", { class: "w-host" }, h("code", {}, w.host)),
        h("td", { class: "w-pid" }, w.pid === null || w.pid === undefined ? "—" : String(w.pid)),
        h("td", { class: "w-queues" }, w.job ? h("a", { class: "mono", href: `#/jobs/${encodeURIComponent(w.job)}` }, w.job) : (w.queues || []).join(", ") || "—"),
        h("td", { class: "w-concurrency" }, w.concurrency === null || w.concurrency === undefined ? "—" : String(w.concurrency)),
        h("td", { class: "w-jobs" }, String(w.jobs)),
        h("td", { class: "w-version muted" }, w.version || "—"),
        h("td", { class: "time", title: w.since ? new Date(w.since).toLocaleString() : "" }, ago(w.since)))),
  );
  const busy = page.workers.reduce((n, w) => n + w.jobs, 0);
  $("workers-summary").textContent = page.workers.length
    ? `${page.workers.length} live · ${busy} running job${busy === 1 ? "" : "s"}`
    : "";
}

async function loadSchedules() {
  const page = await api("schedules");
  if (S.view !== "schedules") return;
  const rows = page.schedules.map(scheduleRow);
  $("schedules").replaceChildren(...rows);
  $("schedules-empty").hidden = rows.length > 0;
  const paused = page.schedules.filter((s) => s.paused).length;
  $("schedules-summary").textContent = rows.length ? `${rows.length} schedule${rows.length === 1 ? "" : "s"}${paused ? ` · ${paused} paused` : ""}` : "";
}

async function scheduleAct(path, label) {
  try {
    await api(path, { method: "POST" });
    toast(label);
  } catch (e) {
    toast(e.message, true);
  }
  refreshView();
}

// The pages beside the list, each with its address (#/workers, #/queues, #/schedules), read
// again every 5 s while shown.
const VIEWS = {
  workers: { load: loadWorkers, title: "Workers" },
  queues: { load: loadQueues, title: "Queues" },
  schedules: { load: loadSchedules, title: "Schedules" },
};

async function refreshView() {
  const view = VIEWS[S.view];
  if (!view) return;
  try {
    await view.load();
  } catch (e) {
    toast(e.message, true);
  }
}

function showView(name) {
  S.view = VIEWS[name] ? name : null;
  for (const key of Object.keys(VIEWS)) $(`${key}-view`).hidden = key !== S.view;
  for (const key of ["jobs", ...Object.keys(VIEWS)]) {
    const on = key === (S.view || "jobs");
    $(`nav-${key}`).classList.toggle("active", on);
    if (on) $(`nav-${key}`).setAttribute("aria-current", "page");
    else $(`nav-${key}`).removeAttribute("aria-current");
  }
  document.title = S.view ? `${VIEWS[S.view].title} · outlast` : "outlast";
  clearInterval(S.viewTimer);
  if (S.view) {
    refreshView();
    S.viewTimer = setInterval(refreshView, 5000);
  }
}

// ------------------------------------------------------------------ routing and start
function route() {
  const m = location.hash.match(/^#\/jobs\/(.+)$/);
  const page = location.hash.match(/^#\/(workers|queues|schedules)\/?$/);
  if (m) {
    showView(null);
    openJob(decodeURIComponent(m[1]));
  } else if (page) {
    closeJob();
    $("list-view").hidden = true;
    showView(page[1]);
  } else {
    showView(null);
    closeJob();
    const text = hashSearch();
    S.listHash = location.hash || "#/";
    if (text !== (S.text || "")) {
      $("search").value = text;
      if (S.started) setSearch(text, true);
      else {
        S.text = text;
        S.query = parseSearch(text);
      }
    }
    renderSummary();
  }
  S.started = true;
}

function restartStreams() {
  startListStream();
  if (S.current) startJobStream(S.current);
}

let searchTimer = null;
$("search").addEventListener("input", (e) => {
  clearTimeout(searchTimer);
  searchTimer = setTimeout(() => setSearch(e.target.value, false), 250);
});
$("search").addEventListener("keydown", (e) => {
  if (e.key === "Enter") {
    clearTimeout(searchTimer);
    setSearch(e.target.value, false);
  }
});
$("page-older").addEventListener("click", () => loadList(1));
$("page-newer").addEventListener("click", () => loadList(-1));
$("page-first").addEventListener("click", () => loadList(null));

// Ticking times: ages in the list, durations of running jobs.
setInterval(() => {
  document.querySelectorAll("#jobs tr").forEach((tr) => {
    const job = S.jobs.get(tr.dataset.id);
    if (!job) return;
    tr.querySelector("[data-ago]").textContent = ago(job.created_at);
    if (job.status === "running") tr.querySelector("[data-duration]").textContent = duration(job);
  });
  document.querySelectorAll("[data-runs-at]").forEach((el) => {
    const prefix = el.closest("#jobs") ? "runs " : "";
    el.textContent = prefix + fromNow(el.dataset.runsAt);
  });
  if (S.job && S.job.status === "running") {
    const dd = [...document.querySelectorAll("#job-meta dt")].find((dt) => dt.textContent === "duration");
    if (dd) dd.nextSibling.textContent = duration(S.job);
  }
}, 1000);

(async function start() {
  const params = new URLSearchParams(location.search);
  if (params.has("token")) {
    // a link with ?token= signs in once; the token leaves the address bar at once
    const token = params.get("token");
    params.delete("token");
    const query = params.toString();
    history.replaceState(null, "", location.pathname + (query ? `?${query}` : "") + location.hash);
    await signIn(token);
  }
  renderFilters();
  window.addEventListener("hashchange", route);
  route(); // reads a search in the address (#/?q=…) before the first list
  renderBulk();
  loadList(null).then(() => startListStream());
})();
