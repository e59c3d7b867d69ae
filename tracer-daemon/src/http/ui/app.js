// tracer's web page: every number comes from tracerd's own API (relative
// URLs, so the page works the same behind a proxy of the Unix socket),
// with the bearer token of the form when one is given (kept for the tab's
// session only).
"use strict";

const state = { pid: null, groupBy: "lineno", timer: null };
const $ = (id) => document.getElementById(id);

function token() {
  return sessionStorage.getItem("tracer-token") || "";
}

function showStatus(text, error) {
  const status = $("status");
  status.textContent = text;
  status.className = error ? "error" : "";
}

// GET (or `method`) `path`; the answer's JSON, text or blob. A 429 (too
// many expensive requests at once) is asked again after its Retry-After, a
// few times; a 401 shows the token form; any other error shows tracerd's
// error and hint.
async function api(path, { method = "GET", as = "json" } = {}) {
  const headers = {};
  if (token()) headers["Authorization"] = "Bearer " + token();
  let response = await fetch(path, { method, headers });
  for (let retry = 0; response.status === 429 && retry < 10; retry++) {
    const wait = Number(response.headers.get("Retry-After")) || 1;
    await new Promise((resolve) => setTimeout(resolve, 1000 * wait));
    response = await fetch(path, { method, headers });
  }
  if (!response.ok) {
    let message = response.status + " " + response.statusText;
    try {
      const body = await response.json();
      message = response.status + " " + body.error + (body.hint ? " (" + body.hint + ")" : "");
    } catch (_) { /* not JSON */ }
    if (response.status === 401) $("token-form").hidden = false;
    showStatus(message, true);
    const error = new Error(message);
    error.status = response.status;
    throw error;
  }
  if (as === "text") return response.text();
  if (as === "blob") return response.blob();
  return response.json();
}

// Exact integers, grouped: the page shows what the API says, digit for digit.
function num(value) {
  return Number(value).toLocaleString("en-US");
}

function signed(value) {
  return (value > 0 ? "+" : "") + num(value);
}

function cell(row, text, className) {
  const td = row.insertCell();
  td.textContent = text;
  if (className) td.className = className;
  return td;
}

function where(statistic) {
  if (statistic.label) return statistic.label;
  const frames = statistic.traceback || [];
  if (state.groupBy === "filename") return frames.length ? frames[0].filename : "?";
  return frames.map((f) => f.filename + ":" + f.lineno + (f.function ? " (" + f.function + ")" : "")).join(" \u2190 ");
}

async function loadProcesses() {
  const answer = await api("/processes");
  const list = answer.processes.slice().sort((a, b) => b.current - a.current || a.pid - b.pid);
  const body = $("processes").tBodies[0];
  body.replaceChildren();
  for (const p of list) {
    const row = body.insertRow();
    row.dataset.pid = p.pid;
    if (p.pid === state.pid) row.className = "selected";
    cell(row, String(p.pid));
    cell(row, p.comm || "");
    cell(row, num(p.current), "num current");
    cell(row, num(p.peak), "num peak");
    cell(row, num(p.blocks), "num blocks");
    row.addEventListener("click", () => showProcess(p.pid, p.comm));
  }
  showStatus(list.length + " traced processes, " + new Date().toLocaleTimeString(), false);
  $("token-form").hidden = true;
}

function fillDiffRows(table, statistics) {
  const body = table.tBodies[0];
  body.replaceChildren();
  for (const s of statistics) {
    const row = body.insertRow();
    cell(row, where(s), "where");
    cell(row, num(s.size), "num size");
    cell(row, signed(s.size_diff), "num size-diff " + (s.size_diff > 0 ? "grow" : s.size_diff < 0 ? "shrink" : ""));
    cell(row, num(s.count), "num count");
    cell(row, signed(s.count_diff), "num count-diff");
  }
}

function drawTimeline(snapshots) {
  const svg = $("timeline");
  svg.replaceChildren();
  const points = snapshots.slice().sort((a, b) => a.taken_at_ms - b.taken_at_ms);
  if (points.length < 2) {
    $("timeline-note").textContent = points.length
      ? "one snapshot: " + num(points[0].current) + " bytes; automatic snapshots draw the curve"
      : "no snapshots yet: automatic snapshots (auto_snapshot_interval) or the button draw the curve";
    return;
  }
  const t0 = points[0].taken_at_ms, t1 = points[points.length - 1].taken_at_ms;
  const max = Math.max(...points.map((p) => p.current), 1);
  const line = document.createElementNS("http://www.w3.org/2000/svg", "polyline");
  line.setAttribute("points", points
    .map((p) => (600 * (p.taken_at_ms - t0) / Math.max(t1 - t0, 1)).toFixed(1) + "," + (155 - 150 * p.current / max).toFixed(1))
    .join(" "));
  svg.appendChild(line);
  $("timeline-note").textContent = points.length + " snapshots from " + new Date(t0).toLocaleString()
    + " to " + new Date(t1).toLocaleString() + "; highest " + num(max) + " bytes";
}

function fillSnapshotChoices(snapshots) {
  for (const id of ["diff-base", "diff-new"]) {
    const select = $(id);
    const chosen = select.value;
    select.replaceChildren();
    for (const s of snapshots) {
      const option = document.createElement("option");
      option.value = s.id;
      option.textContent = "#" + s.id + (s.label ? " " + s.label : "") + " (" + s.kind + ", "
        + new Date(s.taken_at_ms).toLocaleTimeString() + ", " + num(s.current) + " B)";
      select.appendChild(option);
    }
    if (chosen) select.value = chosen;
  }
  if (snapshots.length >= 2 && !$("diff-new").dataset.touched) {
    $("diff-base").value = snapshots[0].id;
    $("diff-new").value = snapshots[snapshots.length - 1].id;
  }
}

async function loadFlameGraph(pid) {
  const box = $("flamegraph");
  try {
    const svg = await api("/pid/" + pid + "/statistics?group_by=traceback&limit=0&format=svg", { as: "blob" });
    const img = document.createElement("img");
    img.alt = "flame graph of pid " + pid;
    img.src = URL.createObjectURL(svg);
    box.replaceChildren(img);
  } catch (error) {
    box.textContent = "no flame graph: " + error.message;
  }
}

async function loadProcess() {
  const pid = state.pid;
  const g = encodeURIComponent(state.groupBy);
  // One after another: expensive routes share tracerd's limit.
  const compare = await api("/pid/" + pid + "/compare?group_by=" + g + "&limit=20");
  const snapshots = await api("/pid/" + pid + "/snapshots");
  const text = await api("/pid/" + pid + "/statistics?group_by=" + g + "&limit=50&format=text", { as: "text" });
  if (pid !== state.pid) return;
  fillDiffRows($("lines"), compare.statistics);
  const base = compare.base || {};
  $("lines-base").textContent = base.kind === "snapshot"
    ? "since snapshot #" + base.id + (base.label ? " " + base.label : "") + " (the last one taken)"
    : "since tracing started (no snapshot taken yet)";
  $("lines").dataset.pid = pid;
  drawTimeline(snapshots.snapshots);
  fillSnapshotChoices(snapshots.snapshots);
  $("text").textContent = text;
  await loadFlameGraph(pid);
}

async function showProcess(pid, comm) {
  state.pid = pid;
  $("process").hidden = false;
  $("process-title").textContent = "pid " + pid + (comm ? " \u2014 " + comm : "");
  $("diff").tBodies[0].replaceChildren();
  delete $("diff-new").dataset.touched;
  for (const row of $("processes").tBodies[0].rows) {
    row.className = Number(row.dataset.pid) === pid ? "selected" : "";
  }
  await loadProcess().catch(() => {});
}

async function runDiff() {
  const base = $("diff-base").value, newer = $("diff-new").value;
  if (!base || !newer) return;
  const g = encodeURIComponent(state.groupBy);
  const answer = await api("/snapshots/" + newer + "/compare?base=" + base + "&group_by=" + g + "&limit=20");
  fillDiffRows($("diff"), answer.statistics);
}

async function refresh() {
  try {
    await loadProcesses();
  } catch (_) { /* shown in the status line */ }
}

$("token-form").addEventListener("submit", (event) => {
  event.preventDefault();
  sessionStorage.setItem("tracer-token", $("token").value.trim());
  refresh().then(() => state.pid && loadProcess().catch(() => {}));
});
$("group-by").addEventListener("change", () => {
  state.groupBy = $("group-by").value;
  if (state.pid) loadProcess().catch(() => {});
});
$("take-snapshot").addEventListener("click", async () => {
  if (!state.pid) return;
  try {
    const taken = await api("/pid/" + state.pid + "/snapshots", { method: "POST" });
    showStatus("snapshot #" + taken.id + " stored", false);
    await loadProcess();
  } catch (_) { /* shown */ }
});
for (const id of ["diff-base", "diff-new"]) {
  $(id).addEventListener("change", () => { $("diff-new").dataset.touched = "1"; });
}
$("diff-run").addEventListener("click", () => runDiff().catch(() => {}));
$("copy-text").addEventListener("click", () => navigator.clipboard && navigator.clipboard.writeText($("text").textContent));

const hashToken = new URLSearchParams(location.hash.slice(1)).get("token");
if (hashToken) {
  sessionStorage.setItem("tracer-token", hashToken);
  history.replaceState(null, "", location.pathname + location.search);
}
refresh();
state.timer = setInterval(refresh, 3000);
