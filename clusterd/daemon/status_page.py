"""The status page the admin port serves at `/`: one self-contained HTML document (no build
step, nothing fetched from elsewhere) whose script polls this node's `/cluster` every two
seconds and draws what it reads.

`/cluster` (clusterd/daemon/admin.py) is every node's /status as this node fetched it just now,
so one open page shows the whole cluster, and a node that does not answer shows as down. The
plots are computed in the browser from successive polls (differences of counters), over the
last ten minutes the page has been open: throughput (transactions committed, client requests),
the mean client request latency, and per bookie the adds per second.
"""

PAGE = """<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<title>Quire cluster status</title>
<style>
 body { font: 14px system-ui, sans-serif; margin: 1.5em; color: #222; }
 h1 { font-size: 1.4em; margin: 0 0 .2em; } h2 { font-size: 1.1em; margin: 1.4em 0 .4em; }
 table { border-collapse: collapse; } td, th { padding: .25em .8em; border-bottom: 1px solid #ddd; text-align: right; }
 th { background: #f4f4f4; } td:first-child, th:first-child { text-align: left; }
 .up { color: #176f2c; } .down { color: #b00020; font-weight: bold; } .warn { color: #a15c00; }
 .plots { display: flex; flex-wrap: wrap; gap: 1.2em; }
 figure { margin: 0; } figcaption { font-size: .9em; color: #555; }
 svg { background: #fafafa; border: 1px solid #ddd; }
 #updated { color: #666; font-size: .9em; }
</style>
</head>
<body>
<h1>Quire cluster <span id="cluster"></span></h1>
<div id="updated">waiting for the first answer...</div>
<h2>Nodes</h2>
<table id="nodes"><thead><tr><th>node</th><th>health</th><th>role</th><th>epoch</th><th>last committed zxid</th>
<th>behind the leader (txns)</th><th>connections</th><th>sessions</th><th>znodes</th></tr></thead><tbody></tbody></table>
<h2>Throughput and latency (last 10 minutes this page was open)</h2>
<div class="plots">
 <figure><svg id="plot-commits" width="420" height="140"></svg><figcaption>transactions committed per second (leader)</figcaption></figure>
 <figure><svg id="plot-requests" width="420" height="140"></svg><figcaption>client requests per second (all nodes)</figcaption></figure>
 <figure><svg id="plot-latency" width="420" height="140"></svg><figcaption>mean client request latency, ms (all nodes)</figcaption></figure>
 <figure><svg id="plot-adds" width="420" height="140"></svg><figcaption>bookie adds per second (all bookies)</figcaption></figure>
</div>
<h2>Bookies</h2>
<table id="bookies"><thead><tr><th>bookie</th><th>state</th><th>disk used</th><th>entry-log bytes</th><th>ledgers</th>
<th>journal queue</th></tr></thead><tbody></tbody></table>
<h2>AutoRecovery</h2>
<table id="recovery"><thead><tr><th>node</th><th>auditor</th><th>lost bookies</th><th>under-replicated ledgers waiting</th>
<th>ledgers repaired</th><th>bytes copied</th></tr></thead><tbody></tbody></table>
<script>
"use strict";
const HISTORY_S = 600, POLL_MS = 2000;
const history = [];  // {t, commits, requests, latencySum, latencyCount, adds}
function cell(text, cls) { const td = document.createElement("td"); td.textContent = text; if (cls) td.className = cls; return td; }
function row(cells, attrs) {
  const tr = document.createElement("tr");
  for (const [k, v] of Object.entries(attrs || {})) tr.setAttribute(k, v);
  cells.forEach(c => tr.appendChild(c)); return tr;
}
function counter(zxid) { return zxid % 4294967296; }
function epochOf(zxid) { return Math.floor(zxid / 4294967296); }
function fmtZxid(z) { return z === undefined ? "-" : "0x" + z.toString(16); }
function fmtBytes(n) {
  if (n === undefined) return "-";
  const units = ["B", "KiB", "MiB", "GiB", "TiB"]; let i = 0;
  while (n >= 1024 && i < units.length - 1) { n /= 1024; i++; }
  return n.toFixed(i ? 1 : 0) + " " + units[i];
}
function sum(nodes, f) { return nodes.reduce((a, n) => a + (n.status ? (f(n.status) || 0) : 0), 0); }

function render(data) {
  document.getElementById("cluster").textContent = data.cluster || "";
  const nodes = data.nodes;
  const leader = nodes.find(n => n.status && n.status.role === "leader");
  const lastZxid = leader ? leader.status.last_committed_zxid : undefined;
  const body = document.querySelector("#nodes tbody"); body.replaceChildren();
  for (const n of nodes) {
    const s = n.status;
    if (!s) { body.appendChild(row([cell("node " + n.id), cell("down", "down"), cell("-"), cell("-"), cell("-"), cell("-"),
                                     cell("-"), cell("-"), cell("-")], {"data-node": n.id, "data-health": "down"})); continue; }
    let behind = "-";
    if (lastZxid !== undefined && s.last_committed_zxid !== undefined) {
      behind = epochOf(s.last_committed_zxid) === epochOf(lastZxid)
        ? String(Math.max(0, counter(lastZxid) - counter(s.last_committed_zxid))) : "older epoch";
    }
    const c = s.clients || {};
    body.appendChild(row([cell("node " + n.id), cell("up", "up"), cell(s.role || "-"), cell(s.epoch ?? "-"),
                          cell(fmtZxid(s.last_committed_zxid)), cell(behind), cell(c.connections_open ?? "-"),
                          cell(c.sessions ?? "-"), cell(c.znodes ?? "-")],
                         {"data-node": n.id, "data-health": "up", "data-role": s.role || ""}));
  }
  const bookies = document.querySelector("#bookies tbody"); bookies.replaceChildren();
  const recovery = document.querySelector("#recovery tbody"); recovery.replaceChildren();
  for (const n of nodes) {
    const b = n.status && n.status.bookie;
    if (!n.status && n.roles && n.roles.includes("bookie")) {
      bookies.appendChild(row([cell("bookie " + n.id), cell("down", "down"), cell("-"), cell("-"), cell("-"), cell("-")],
                              {"data-bookie": n.id, "data-state": "down"}));
      continue;
    }
    if (!b) continue;
    const st = (b.service || {}).storage || {};
    const state = b.read_only ? "read-only" : (b.registered ? "writable" : "unregistered");
    bookies.appendChild(row([cell("bookie " + n.id), cell(state, b.read_only ? "warn" : "up"),
                             cell(st.disk_usage === undefined ? "-" : (100 * st.disk_usage).toFixed(1) + " %"),
                             cell(fmtBytes(st.entry_log_bytes)), cell(st.ledgers ?? "-"), cell(st.pending_records ?? "-")],
                            {"data-bookie": n.id, "data-state": state}));
    const ar = b.autorecovery || {}, au = ar.auditor || {}, wk = ar.worker || {};
    recovery.appendChild(row([cell("node " + n.id), cell(au.leading ? "auditor" : "-"),
                              cell((au.lost_bookies || []).join(", ") || "none"), cell(wk.ledgers_waiting ?? "-"),
                              cell(wk.ledgers_repaired ?? 0), cell(fmtBytes(wk.bytes_copied || 0))],
                             {"data-node": n.id}));
  }
  history.push({t: Date.now() / 1000,
                commits: leader ? counter(leader.status.last_committed_zxid) : undefined,
                commitEpoch: leader ? epochOf(leader.status.last_committed_zxid) : undefined,
                requests: sum(nodes, s => (s.clients || {}).packets_received),
                latencySum: sum(nodes, s => (s.clients || {}).latency_total_s),
                latencyCount: sum(nodes, s => (s.clients || {}).latency_count),
                adds: sum(nodes, s => ((s.bookie || {}).service || {}).adds)});
  while (history.length && history[0].t < history[history.length - 1].t - HISTORY_S) history.shift();
  plot("plot-commits", rates(h => h.commits, (a, b) => a.commitEpoch === b.commitEpoch));
  plot("plot-requests", rates(h => h.requests));
  plot("plot-latency", ratios());
  plot("plot-adds", rates(h => h.adds));
  document.getElementById("updated").textContent = "updated " + new Date().toLocaleTimeString() +
    " from node " + data.from + "; " + nodes.filter(n => n.status).length + " of " + nodes.length + " nodes answering";
}
// Per second between successive polls; a counter that went back (a restart, a new epoch) gives no point.
function rates(f, same) {
  const out = [];
  for (let i = 1; i < history.length; i++) {
    const a = history[i - 1], b = history[i], va = f(a), vb = f(b);
    if (va === undefined || vb === undefined || vb < va || (same && !same(a, b))) continue;
    out.push([b.t, (vb - va) / (b.t - a.t)]);
  }
  return out;
}
function ratios() {
  const out = [];
  for (let i = 1; i < history.length; i++) {
    const a = history[i - 1], b = history[i], n = b.latencyCount - a.latencyCount;
    if (n > 0 && b.latencySum >= a.latencySum) out.push([b.t, 1000 * (b.latencySum - a.latencySum) / n]);
  }
  return out;
}
function plot(id, points) {
  const svg = document.getElementById(id), w = svg.width.baseVal.value, h = svg.height.baseVal.value, pad = 28;
  svg.replaceChildren();
  svg.setAttribute("data-points", points.length);
  const ns = "http://www.w3.org/2000/svg";
  const now = Date.now() / 1000, max = Math.max(1e-9, ...points.map(p => p[1]));
  const label = document.createElementNS(ns, "text");
  label.setAttribute("x", 4); label.setAttribute("y", 12); label.setAttribute("font-size", "11");
  label.textContent = points.length ? "max " + max.toPrecision(3) + ", last " + points[points.length - 1][1].toPrecision(3) : "no data yet";
  svg.appendChild(label);
  if (points.length < 1) return;
  const xy = points.map(([t, v]) => [pad + (w - pad - 4) * (1 - (now - t) / HISTORY_S), h - 4 - (h - pad) * v / max]);
  const line = document.createElementNS(ns, "polyline");
  line.setAttribute("fill", "none"); line.setAttribute("stroke", "#1f5fbf"); line.setAttribute("stroke-width", "1.5");
  line.setAttribute("points", xy.map(p => p[0].toFixed(1) + "," + p[1].toFixed(1)).join(" "));
  svg.appendChild(line);
}
async function poll() {
  try {
    const answer = await fetch("/cluster", {cache: "no-store"});
    if (!answer.ok) throw new Error("HTTP " + answer.status);
    render(await answer.json());
  } catch (e) {
    document.getElementById("updated").textContent = "this node does not answer: " + e;
  }
}
poll(); setInterval(poll, POLL_MS);
</script>
</body>
</html>
"""
