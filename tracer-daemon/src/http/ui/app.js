// tracer's web page: every number comes from tracerd's own API (relative
// URLs, so the page works the same behind a proxy of the Unix socket),
// with the bearer token of the form when one is given (kept for the tab's
// session only). The process list puts live processes first; ended images
// only with "show ended", greyed; sizes as tracemalloc writes them with the
// exact bytes in the cell's title; an "incomplete" mark with the drops; a
// filter applied as one types, on the list last fetched.
"use strict";

const state = { pid: null, groupBy: "lineno", timer: null, processes: [] };
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

// `x` with `digits` decimals, a tie rounded to even, as Python's format()
// and Rust's {:.N} do (toFixed rounds a tie up).
function fixed(x, digits) {
  const scale = 10 ** digits;
  const scaled = x * scale;
  const floor = Math.floor(scaled);
  if (scaled - floor === 0.5) {
    return ((floor % 2 === 0 ? floor : floor + 1) / scale).toFixed(digits);
  }
  return x.toFixed(digits);
}

// A size as tracemalloc's _format_size prints it, and `tracer ps`:
// "4242 B", "62.5 KiB", "5164 KiB"; with `sign`, "+300 B".
const UNITS = ["B", "KiB", "MiB", "GiB", "TiB"];
function formatSize(bytes, sign) {
  let size = Number(bytes);
  const plus = (x) => (sign && x >= 0 ? "+" : "");
  for (let i = 0; i < UNITS.length; i++) {
    const unit = UNITS[i];
    if (Math.abs(size) < 100 && unit !== "B") return plus(size) + fixed(size, 1) + " " + unit;
    if (Math.abs(size) < 10 * 1024 || i === UNITS.length - 1) return plus(size) + fixed(size, 0) + " " + unit;
    size /= 1024;
  }
  return String(bytes);
}

function cell(row, text, className) {
  const td = row.insertCell();
  td.textContent = text;
  if (className) td.className = className;
  return td;
}

// A size cell: human units, the exact bytes on hover.
function sizeCell(row, bytes, className, sign) {
  const td = cell(row, formatSize(bytes, sign), className);
  td.title = (sign ? signed(bytes) : num(bytes)) + " bytes";
  td.dataset.bytes = String(bytes);
  return td;
}

function where(statistic) {
  if (statistic.label) return statistic.label;
  const frames = statistic.traceback || [];
  if (state.groupBy === "filename") return frames.length ? frames[0].filename : "?";
  return frames.map((f) => f.filename + ":" + f.lineno + (f.function ? " (" + f.function + ")" : "")).join(" \u2190 ");
}

// Why a process's figures undercount (`complete: false`), or "".
function incompleteReason(p) {
  if (p.complete !== false) return "";
  return "incomplete: " + num(p.drops) + " allocator events lost (kernel maps full); these figures undercount";
}

function time(ms) {
  return ms ? new Date(ms).toLocaleTimeString() : "?";
}

// The processes as listed: live ones first, largest current first; then,
// with "show ended", the images that ended, latest first. A pid with
// several images (before and after an exec) has each told apart by its
// state and when it ran (the title: its generation).
function sortProcesses(list) {
  const alive = (p) => p.state === "alive";
  return list.slice().sort((a, b) =>
    (alive(b) - alive(a))
    || (alive(a) ? b.current - a.current || a.pid - b.pid
      : (b.ended_ms || 0) - (a.ended_ms || 0) || a.pid - b.pid));
}

function matches(p, filter) {
  if (!filter) return true;
  return String(p.pid).includes(filter)
    || (p.comm || "").toLowerCase().includes(filter)
    || (p.exe || "").toLowerCase().includes(filter);
}

function drawProcesses() {
  const list = state.processes || [];
  const filter = $("filter").value.trim().toLowerCase();
  const showEnded = $("show-ended").checked;
  const images = {};
  for (const p of list) (images[p.pid] = images[p.pid] || []).push(p);
  for (const pid in images) images[pid].sort((a, b) => a.first_seen_ms - b.first_seen_ms || a.generation - b.generation);
  const shown = sortProcesses(list).filter((p) => (showEnded || p.state === "alive") && matches(p, filter));
  const body = $("processes").tBodies[0];
  body.replaceChildren();
  for (const p of shown) {
    const row = body.insertRow();
    const ended = p.state !== "alive";
    row.dataset.pid = p.pid;
    row.dataset.generation = p.generation;
    row.dataset.state = p.state;
    row.className = (ended ? "ended" : "") + (p.pid === state.pid && !ended ? " selected" : "");
    cell(row, String(p.pid), "pid");
    const command = cell(row, p.comm || "", "comm");
    const reason = incompleteReason(p);
    if (reason) {
      const mark = document.createElement("span");
      mark.className = "incomplete";
      mark.textContent = "\u26a0 incomplete";
      mark.title = reason;
      command.appendChild(mark);
    }
    const exe = cell(row, p.exe || "", "exe");
    exe.title = p.exe || "";
    const own = images[p.pid];
    const which = own.length > 1 ? " (image " + (own.indexOf(p) + 1) + " of " + own.length + ")" : "";
    const word = p.state === "exec" ? "exec'd" : p.state;
    const stateCell = cell(row, word + which, "state");
    stateCell.title = "generation " + p.generation + ", traced from " + time(p.first_seen_ms)
      + (ended ? ", ended " + time(p.ended_ms) + (p.state === "exec" ? " by an exec" : "") : "");
    sizeCell(row, p.current, "num current");
    sizeCell(row, p.peak, "num peak");
    cell(row, num(p.blocks), "num blocks");
    row.addEventListener("click", () => showProcess(p.pid, p.comm));
  }
  const hidden = list.filter((p) => p.state !== "alive").length;
  $("processes-count").textContent = shown.length + " shown of " + list.length
    + (showEnded || !hidden ? "" : " (" + hidden + " ended hidden)");
}

// The watched processes, the fastest growing first; a click traces one
// exactly (its first query starts it) and shows it.
function drawWatched(watched) {
  const body = $("watched").tBodies[0];
  body.replaceChildren();
  const sorted = (watched || []).slice().sort((a, b) => b.watch.anon_growth - a.watch.anon_growth || a.pid - b.pid);
  for (const p of sorted) {
    const row = body.insertRow();
    row.dataset.pid = p.pid;
    cell(row, String(p.pid), "pid");
    cell(row, p.comm || "", "comm");
    sizeCell(row, p.watch.rss, "num rss");
    sizeCell(row, p.watch.anon, "num anon");
    const growth = sizeCell(row, p.watch.anon_growth, "num growth", true);
    growth.title += " over " + Math.round(p.watch.growth_over_ms / 1000) + " s";
    cell(row, p.exact ? p.exact.reason + " since " + time(p.exact.since_ms) : "-", "exact");
    row.addEventListener("click", () => showProcess(p.pid, p.comm));
  }
}

async function loadProcesses() {
  const answer = await api("/processes");
  state.processes = answer.processes;
  drawProcesses();
  drawWatched(answer.watched);
  const live = answer.processes.filter((p) => p.state === "alive").length;
  showStatus(live + " traced processes, " + new Date().toLocaleTimeString(), false);
  $("token-form").hidden = true;
  const mine = answer.processes.filter((p) => p.pid === state.pid);
  const current = mine.find((p) => p.state === "alive") || mine[mine.length - 1];
  const reason = current ? incompleteReason(current) : "";
  $("process-incomplete").textContent = reason;
  $("process-incomplete").hidden = !reason;
}

function fillDiffRows(table, statistics) {
  const body = table.tBodies[0];
  body.replaceChildren();
  for (const s of statistics) {
    const row = body.insertRow();
    cell(row, where(s), "where");
    sizeCell(row, s.size, "num size");
    sizeCell(row, s.size_diff, "num size-diff " + (s.size_diff > 0 ? "grow" : s.size_diff < 0 ? "shrink" : ""), true);
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
      ? "one snapshot: " + formatSize(points[0].current) + "; automatic snapshots draw the curve"
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
    + " to " + new Date(t1).toLocaleString() + "; highest " + formatSize(max);
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
        + new Date(s.taken_at_ms).toLocaleTimeString() + ", " + formatSize(s.current) + ")";
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
  drawProcesses();
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
$("filter").addEventListener("input", drawProcesses);
$("show-ended").addEventListener("change", drawProcesses);
$("copy-text").addEventListener("click", () => navigator.clipboard && navigator.clipboard.writeText($("text").textContent));

const hashToken = new URLSearchParams(location.hash.slice(1)).get("token");
if (hashToken) {
  sessionStorage.setItem("tracer-token", hashToken);
  history.replaceState(null, "", location.pathname + location.search);
}
refresh();
state.timer = setInterval(refresh, 3000);
