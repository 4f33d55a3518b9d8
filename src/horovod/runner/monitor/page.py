"""The live page: one HTML document with inline CSS and JavaScript, no build step.

The script reads the token from the page's own URL, fetches ``/api/status`` every second and redraws the table,
the job's line and the reports; the button POSTs ``/api/stacks`` and shows what came back. Every value from the
job is put into the page as text (``textContent``), never as HTML. ``{nonce}`` is the Content-Security-Policy
nonce of the one inline script.
"""
from __future__ import annotations

PAGE = """<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="referrer" content="no-referrer">
<title>Horovod job</title>
<style>
  body { font-family: system-ui, sans-serif; margin: 1.2em; color: #222; }
  h1 { font-size: 1.3em; margin: 0 0 .3em 0; }
  #job, #updated { color: #555; margin: .2em 0; }
  table { border-collapse: collapse; margin: .8em 0; }
  th, td { border: 1px solid #ccc; padding: .25em .6em; text-align: left; font-size: .92em; }
  th { background: #f0f0f0; }
  td.num { text-align: right; font-variant-numeric: tabular-nums; }
  tr.state-running td.state, tr.state-in-collective td.state { background: #e6f4ea; }
  tr.state-waiting td.state, tr.state-negotiating td.state { background: #fff4ce; }
  tr.state-starting td.state { background: #eef; }
  tr.state-not-answering td.state, tr.state-stopped td.state, tr.state-exited td.state { background: #fde2e1; }
  pre { background: #f7f7f7; border: 1px solid #ddd; padding: .5em; overflow-x: auto; font-size: .85em; }
  .error { color: #a00; font-weight: bold; }
  button { font-size: 1em; padding: .3em .8em; }
</style>
</head>
<body>
<h1>Horovod job</h1>
<div id="job">loading...</div>
<div id="elastic"></div>
<div id="updated"></div>
<table id="ranks">
  <thead><tr>
    <th>rank</th><th>host</th><th>pid</th><th>state</th><th>collective</th><th>waiting for</th>
    <th>waited (s)</th><th>collectives/s</th><th>bytes/s</th><th>last done #</th><th>heartbeat age (s)</th>
  </tr></thead>
  <tbody></tbody>
</table>
<p><button id="stacks-button">Take every rank's Python stack</button> <span id="stacks-note"></span></p>
<div id="stacks"></div>
<h2>Reports</h2>
<div id="reports">none</div>
<script nonce="{nonce}">
"use strict";
const token = new URLSearchParams(window.location.search).get("token") || "";
const api = (path) => path + "?token=" + encodeURIComponent(token);

function text(tag, value, cls) {
  const node = document.createElement(tag);
  node.textContent = value === null || value === undefined ? "\\u2014" : String(value);
  if (cls) node.className = cls;
  return node;
}

function bytes(n) {
  if (n === null || n === undefined) return null;
  const units = ["B", "KB", "MB", "GB", "TB"];
  let i = 0;
  while (n >= 1000 && i < units.length - 1) { n /= 1000; i++; }
  return n.toFixed(i ? 1 : 0) + " " + units[i];
}

function drawRanks(ranks) {
  const body = document.querySelector("#ranks tbody");
  body.replaceChildren();
  for (const r of ranks) {
    const row = document.createElement("tr");
    row.dataset.rank = r.rank;
    row.dataset.state = r.state;
    row.className = "state-" + r.state.replace(/ /g, "-");
    row.append(text("td", r.rank, "num"), text("td", r.host), text("td", r.pid, "num"),
               text("td", r.state_text, "state"), text("td", r.last_collective),
               text("td", r.waiting_for === null ? null : "rank " + r.waiting_for),
               text("td", r.waited_s, "num"), text("td", r.collectives_per_s, "num"),
               text("td", bytes(r.bytes_per_s) === null ? null : bytes(r.bytes_per_s) + "/s", "num"),
               text("td", r.last_completed_seq, "num"), text("td", r.heartbeat_age_s, "num"));
    body.append(row);
  }
}

function drawJob(job) {
  const started = new Date(job.start_time * 1000).toLocaleString();
  document.getElementById("job").textContent = job.size + " rank(s), launcher on " + job.launcher_host +
    ", started " + started + " (" + job.uptime_s.toFixed(0) + " s ago)";
  const el = job.elastic;
  const box = document.getElementById("elastic");
  if (!el) { box.textContent = ""; return; }
  const members = el.members.map((m) => "rank " + m.rank + " = " + m.slot).join(", ");
  box.textContent = "Elastic: round " + el.round + (el.reforming ? " (re-forming)" : "") + ", " +
    el.resets + " reset(s), " + el.members.length + " worker(s) (min " + el.min_np + ", max " +
    (el.max_np === null ? "unbounded" : el.max_np) + "): " + members;
}

function drawReports(reports) {
  const box = document.getElementById("reports");
  box.replaceChildren();
  if (!reports.length) { box.textContent = "none"; return; }
  for (const r of reports) {
    box.append(text("div", "rank " + r.rank + ": " + r.kind + ", " + r.age_s.toFixed(0) + " s ago"),
               text("pre", r.text));
  }
}

async function refresh() {
  try {
    const reply = await fetch(api("/api/status"), {cache: "no-store"});
    if (!reply.ok) throw new Error("HTTP " + reply.status);
    const status = await reply.json();
    drawJob(status.job);
    drawRanks(status.ranks);
    drawReports(status.reports);
    const updated = document.getElementById("updated");
    updated.className = "";
    updated.textContent = "updated " + new Date(status.time * 1000).toLocaleTimeString();
  } catch (err) {
    const updated = document.getElementById("updated");
    updated.className = "error";
    updated.textContent = "The launcher does not answer (" + err.message + "): the job may have ended.";
  }
}

async function takeStacks() {
  const note = document.getElementById("stacks-note");
  note.textContent = "asking every rank...";
  try {
    const reply = await fetch(api("/api/stacks"), {method: "POST", cache: "no-store"});
    if (!reply.ok) throw new Error("HTTP " + reply.status);
    const answer = await reply.json();
    const box = document.getElementById("stacks");
    box.replaceChildren();
    for (const s of answer.stacks) {
      const block = text("pre", s.text);
      block.dataset.rank = s.rank;
      box.append(block);
    }
    note.textContent = "taken " + new Date(answer.time * 1000).toLocaleTimeString();
  } catch (err) {
    note.textContent = "failed: " + err.message;
  }
}

document.getElementById("stacks-button").addEventListener("click", takeStacks);
refresh();
setInterval(refresh, 1000);
</script>
</body>
</html>
"""


def render(nonce: str) -> bytes:
    """The page, with ``nonce`` as its script's CSP nonce."""
    return PAGE.replace("{nonce}", nonce).encode()
