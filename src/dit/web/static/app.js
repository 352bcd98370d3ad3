// NNPM page: the views (map, scenarios, runs; the run page is runpage.js, the Runtimes view runtimes.js), the
// terminal, and the active run with its Stop button.
import { api, el, short, sweepText } from "./api.js";
import { SchemaForm } from "./form.js";
import { LinkPanel, linkKey } from "./link.js";
import { NodeMap } from "./map.js";
import { runPage } from "./runpage.js";
import { runtimesView } from "./runtimes.js";
import { Terminal } from "./terminal.js";

const $ = (id) => document.getElementById(id);
// origins: the destination delays this editor filled from the map or a measurement (linkKey -> source);
// any other value in the scenario is typed, and Apply map delays keeps it (issue 36 item 1)
const state = { config: null, form: null, saved: null, run: null, history: [], selected: [], origins: new Map() };
const terminal = new Terminal();
const runtimes = runtimesView(terminal);
const runView = runPage(state);
window.nnpm = { state, terminal };

// -- views ---------------------------------------------------------------------------------------
function show(view) {
  for (const b of document.querySelectorAll("nav button")) b.classList.toggle("active", b.dataset.view === view);
  for (const s of document.querySelectorAll(".view")) s.classList.toggle("active", s.id === `view-${view}`);
  // the links show the delays of the scenario in the editor: redrawn at once, not at the next refresh
  if (view === "map" && state.map) setTimeout(() => { state.map.map.invalidateSize(); state.map.refresh().catch(() => {}); }, 0);
  if (view === "runs") loadRuns();
  if (view === "scenarios") loadScenarioLists();
  if (view === "runtimes") runtimes.load();
}
for (const b of document.querySelectorAll("nav button")) b.addEventListener("click", () => show(b.dataset.view));

// -- scenarios -----------------------------------------------------------------------------------
const STARTER = {
  name: "nnpm_scenario", description: "", model: "fake", devices: ["device1", "device2"], repetitions: 3, seed: 0,
  inference: { enabled: true, repetitions: 5 }, optimisation: { enabled: true, algorithm: "greedy", objective: "total_delay" },
};

// Run, Dry run and Benchmarking start from a saved version: off until there is one, and the hint says so
const RUN_BUTTONS = ["run-button", "bench-button", "dry-button"];
function setRunnable(on) {
  for (const id of RUN_BUTTONS) $(id).disabled = !on;
  $("run-button").title = on ? "" : $("run-hint").textContent;
  $("run-hint").hidden = on;
  if (on) showLastDryRunButton().catch(() => {});
  else $("dry-last").hidden = true;
}

function editScenario(document_, keepOrigins = false) {
  if (!keepOrigins) state.origins.clear();
  state.form.render(document_);
  state.saved = null;
  setRunnable(false);
  $("save-result").hidden = true;
  clearFormErrors();
}

// Problems are red, never in the green notice, always the current ones: every error at its field and all of
// them listed, with their count, at the top of the editor, each a link to its field (nothing jumps away).
function showFormErrors(errors, what = "the scenario is not saved") {
  const placed = state.form.showErrors(errors);
  const box = $("form-errors");
  if (!errors.length) { box.hidden = true; $("error-list").replaceChildren(); return; }
  $("save-result").hidden = true;
  $("error-count").textContent = `${errors.length} problem${errors.length === 1 ? "" : "s"}: ${what}`;
  $("error-list").replaceChildren(...placed.map(({ error, target }) => el("li", { dataset: { path: error.path || "" } },
    target ? el("a", { href: "#", onclick: (e) => { e.preventDefault(); state.form.reveal(target); } }, error.path || "(document)")
      : el("strong", {}, error.path || "(document)"),
    `: ${error.message}`)));
  box.hidden = false;
  $("scenario-editor").scrollTop = 0;
}

function clearFormErrors() {
  state.form.clearErrors();
  $("form-errors").hidden = true;
  $("error-list").replaceChildren();
}

function readForm() {
  const { value, errors } = state.form.read();
  if (errors.length) { showFormErrors(errors, "fix these before validating or saving"); return null; }
  return value;
}

async function loadScenarioLists() {
  const data = await api("/api/scenarios");
  $("stored-list").replaceChildren(...data.stored.map((s) => el("li", { onclick: () => openStored(s.name), dataset: { name: s.name } },
    el("span", {}, s.name), el("code", {}, `${s.versions} v · ${short(s.latest.hash)}`))));
  $("file-list").replaceChildren(...data.files.map((f) => el("li", { onclick: async () => {
    const doc = await api(`/api/scenarios/files/${encodeURIComponent(f.file)}`);
    if (doc.document) editScenario(doc.document);
  } }, f.file)));
}

async function openStored(name) {
  // the editor is about to show another version: Run, Dry run and Benchmarking wait for it, so a click
  // meanwhile cannot start the version shown before (CI's e2e run benchmarked the previous one)
  state.saved = null;
  setRunnable(false);
  const data = await loadHistory(name);
  // the newest version the researcher saved: a benchmark's derived copy (inference and optimisation off)
  // never opens here, where Run would run it (issue 49, item 2)
  if (data.opens) {
    const full = await api(`/api/versions/${data.opens}`);
    editScenario(full.document);
    markSaved(full, false);
  }
}

// the versions of one stored scenario, newest first (after a Save too: the new version is listed at once)
// A refresh of the same scenario keeps the ticked versions that are still listed, and an answer that
// arrives after a newer request's is dropped: a Save's refresh landing late must not untick what the user
// ticked since (CI's e2e run found Diff disabled that way).
let historySeq = 0;
async function loadHistory(name) {
  const seq = ++historySeq;
  const data = await api(`/api/scenarios/${encodeURIComponent(name)}/versions`);
  if (seq !== historySeq) return data;
  const same = $("history-name").textContent === name && !$("history").hidden;
  const listed = new Set(data.versions.map((v) => v.hash));
  state.history = data.versions;
  state.selected = same ? state.selected.filter((h) => listed.has(h)) : [];
  $("history").hidden = false;
  $("history-name").textContent = name;
  $("history-list").replaceChildren(...data.versions.map((v) => el("li", { dataset: { hash: v.hash, kind: v.kind } },
    el("input", { type: "checkbox", onchange: (e) => {
      state.selected = e.target.checked ? [...state.selected, v.hash].slice(-2) : state.selected.filter((h) => h !== v.hash);
      for (const box of $("history-list").querySelectorAll("input")) box.checked = state.selected.includes(box.dataset.hash);
      $("diff-button").disabled = state.selected.length !== 2;
    }, dataset: { hash: v.hash } }),
    v.derived
      ? el("code", { class: "derived", title: "made by dit for a benchmark (inference and optimisation off): not opened in the editor, where Run would run it" }, short(v.hash))
      : el("a", { href: "#", onclick: async (e) => { e.preventDefault(); const full = await api(`/api/versions/${v.hash}`); editScenario(full.document); markSaved(full, false); } },
        short(v.hash)),
    el("code", { class: v.derived ? "derived" : "" }, (v.derived ? `${v.kind}, derived from ${short(v.derived_from)}` : v.kind) +
      ` · ${new Date(v.created_ns / 1e6).toLocaleString()}`), " ",
    el("a", { href: "#", class: "small", dataset: { runsOf: v.hash }, title: "every run made from this version",
      onclick: (e) => { e.preventDefault(); state.runsOf = v.hash; show("runs"); } }, "runs"),
    v.note ? el("div", { class: "small note", title: v.note }, v.note.split("\n")[0].slice(0, 100)) : null)));
  for (const box of $("history-list").querySelectorAll("input")) box.checked = state.selected.includes(box.dataset.hash);
  $("diff-button").disabled = state.selected.length !== 2;
  return data;
}

// Always older → newer (whatever order the boxes were ticked in; the server orders them too), so an
// addition is a `+` line; shown in a dialog as wide as the page, lines never wrapped or cut.
$("diff-button").addEventListener("click", async () => {
  const when = (h) => (state.history.find((v) => v.hash === h) || {}).created_ns || 0;
  const [a, b] = [...state.selected].sort((x, y) => when(x) - when(y));
  const d = await api(`/api/diff?a=${a}&b=${b}`);
  const stamp = (v) => `${short(v.hash)} (${new Date(v.created_ns / 1e6).toLocaleString()})`;
  $("diff-title").textContent = `${d.a.name}: ${stamp(d.a)} → ${stamp(d.b)}`;
  $("diff-changes").replaceChildren(...d.changes.map((c) => el("tr", { dataset: { path: c.path } },
    el("td", {}, el("code", {}, c.path)), el("td", { class: "old" }, c.added ? "(not set)" : JSON.stringify(c.a)),
    el("td", {}, "→"), el("td", { class: "new" }, c.removed ? "(not set)" : JSON.stringify(c.b)))));
  const lineClass = (line) => (line.startsWith("+++") || line.startsWith("---") ? "file"
    : line.startsWith("+") ? "add" : line.startsWith("-") ? "del" : line.startsWith("@@") ? "hunk" : "");
  $("diff-output").replaceChildren(...d.unified.split("\n").filter((l, i, all) => l || i < all.length - 1)
    .map((line) => el("div", { class: `line ${lineClass(line)}` }, line || " ")));
  $("diff-dialog").showModal();
});

function markSaved(version, created) {
  state.saved = version;
  const box = $("save-result");
  box.hidden = false;
  box.replaceChildren(el("span", {}, created === false ? "Version " : "Saved version "),
    el("code", { "data-testid": "version-hash", id: "version-hash" }, version.hash),
    el("span", { class: "small" }, created === false ? " (already stored: versions are immutable)" : ""),
    el("div", { class: "toolbar" },
      el("input", { id: "version-note", type: "text", size: 50, maxlength: 10000, value: version.note || "",
        placeholder: "a note on this version (a lab notebook entry; the version itself stays as saved)" }),
      el("button", { id: "version-note-save", type: "button", onclick: () => saveVersionNote(version) }, "Save note"),
      el("span", { id: "version-note-state", class: "small" })));
  setRunnable(true);
}

async function saveVersionNote(version) {
  try {
    const res = await api(`/api/versions/${version.hash}/note`, { method: "PUT", body: { text: $("version-note").value } });
    $("version-note-state").textContent = res.note ? "saved" : "removed";
    $("version-note-state").className = "small";
    if (state.saved && state.saved.hash === version.hash) state.saved = { ...state.saved, note: res.note };
    loadHistory(version.name);
  } catch (err) {
    $("version-note-state").textContent = err.errors.map((e) => `${e.path}: ${e.message}`).join("; ") || err.message;
    $("version-note-state").className = "small err";
  }
}

$("new-scenario").addEventListener("click", () => editScenario(STARTER));

$("validate-button").addEventListener("click", async () => {
  const doc = readForm();
  if (!doc) return;
  const res = await api("/api/scenarios/validate", { method: "POST", body: { document: doc } });
  if (!res.valid) { showFormErrors(res.errors, "the scenario is not valid"); return; }
  clearFormErrors();
  const box = $("save-result");
  box.hidden = false;
  box.textContent = `valid · ${res.variants.length} run(s) · hash ${short(res.hash)}`;
});

// a failed save leaves no green box and no Run of an older version behind: only the current problems
function unsaved() {
  state.saved = null;
  setRunnable(false);
}

$("save-button").addEventListener("click", async () => {
  const doc = readForm();
  if (!doc) { unsaved(); return; }
  try {
    const res = await api("/api/scenarios", { method: "POST", body: { document: doc } });
    clearFormErrors();
    markSaved(res.version, res.created);
    loadScenarioLists();
    loadHistory(res.version.name);
  } catch (err) {
    unsaved();
    if (err.status === 422) showFormErrors(err.errors);
    else alert(err.message);
  }
});

$("topology-button").addEventListener("click", async () => {
  const doc = readForm();
  if (!doc) return;
  // the links whose delay the map wrote before may follow the map again; every other delay is typed and kept
  const fromMap = [...state.origins].filter(([, source]) => source === "map").map(([key]) => {
    const [device, peer] = key.split(">");
    return { device, peer };
  });
  const res = await api("/api/scenarios/topology", { method: "POST", body: { document: doc, device_links: $("device-links").checked, from_map: fromMap } });
  for (const l of res.links || []) if (l.source === "map") state.origins.set(linkKey(l.device, l.peer), "map");
  editScenario(res.document, true);
  const box = $("save-result");
  box.hidden = false;
  if (!res.edge) { box.textContent = "the map has no edge server"; return; }
  // every link says which delay applies and where it comes from: a typed delay is kept, never overridden silently
  const ms = (v) => `${Number(v).toPrecision(4)} ms`;
  const kept = (l) => (state.origins.get(linkKey(l.device, l.peer)) === "measured" ? "measured RTT as delay" : "typed");
  const line = (l) => l.source === "typed"
    ? `${l.device} → ${l.peer}: ${ms(l.delay_ms)} ${kept(l)}, kept (the map says ${ms(l.map_ms)})`
    : `${l.device} → ${l.peer}: ${ms(l.delay_ms)} from the map` + (l.previous_ms !== undefined ? ` (was ${ms(l.previous_ms)})` : "");
  box.replaceChildren(el("div", {}, `per-destination delays from the map (edge: ${res.edge})` + (res.not_on_map.length ? `; not on the map: ${res.not_on_map.join(", ")}` : "")),
    el("ul", { id: "map-links", class: "small" }, ...(res.links || []).map((l) => el("li", { dataset: { device: l.device, peer: l.peer, source: l.source } }, line(l)))));
});

// The delays the scenario open in the editor puts on a map link, one per direction it shapes (a device's egress
// towards the other end): its destination's delay_ms (typed, or a measured RTT written into it; a value the
// map wrote follows the rule), else the device's own delay_ms, else the distance rule's (issue 49, item 5).
function delaysInForce() {
  const doc = (state.form && state.form.read().value) || {};
  const devices = new Set((doc.devices || []).filter((d) => typeof d === "string"));
  const network = doc.network || {};
  return (link, role) => {
    const out = [];
    for (const [from, to] of [[link.a, link.b], [link.b, link.a]]) {
      if (!devices.has(from) || (role[to] !== "edge" && !devices.has(to))) continue;
      const block = network[from] || {};
      const dest = ((block.destinations || {})[to]) || {};
      const origin = state.origins.get(linkKey(from, to));
      const rule = link.delay_ms === null || link.delay_ms === undefined ? null : link.delay_ms;
      // a value Apply map delays wrote is the rule's (as it was then); one the link panel wrote from a run is measured
      const source = origin === "measured" ? "measured" : origin === "map" ? "rule" : "typed";
      if (typeof dest.delay_ms === "number") out.push({ from, to, ms: dest.delay_ms, source });
      else if (typeof block.delay_ms === "number" && !Object.keys(dest).length) out.push({ from, to, ms: block.delay_ms, source: "typed (device)" });
      else out.push({ from, to, ms: rule, source: rule === null ? "no rule" : "rule" });
    }
    return out;
  };
}

// -- one link of the map: its profile written into the form (link.js) -------------------------------
// Typing a destination's delay in the form makes it typed: the map no longer writes over it.
$("scenario-form").addEventListener("input", (e) => {
  const m = /^network\.([^.]+)\.destinations\.([^.]+)\.delay_ms$/.exec(e.target.name || "");
  if (m) state.origins.delete(linkKey(m[1], m[2]));
});

function linkWritten(doc, written) {
  editScenario(doc, true);
  show("scenarios");
  const where = `network.${written.device}.destinations.${written.peer}`;
  const parts = Object.entries(written.profile).map(([k, v]) => `${k} ${v}` + (k === "delay_ms" ? ` (${written.source === "measured" ? "measured RTT" : written.source})` : ""));
  const box = $("save-result");
  box.hidden = false;
  box.replaceChildren(el("span", { id: "link-written", dataset: { device: written.device, peer: written.peer, source: written.source } },
    parts.length ? `${written.device} → ${written.peer}: ${parts.join(", ")} written into ${where}; Save version to keep it.`
      : `${written.device} → ${written.peer}: its own profile removed (${where}); the device's profile applies on it again. Save version to keep it.`));
  const target = document.querySelector(`#scenario-form [data-path="network.${CSS.escape(written.device)}"]`);
  if (target) target.scrollIntoView({ block: "center" });
}

const linkPanel = new LinkPanel({ readDocument: () => state.form.read(), writeDocument: linkWritten, origins: state.origins });

// A run asked for while another is going, or several at once, waits its turn in the server's queue
// (listed under Runs, with its position and what it waits for) instead of being refused by the lease:
// the server decides (POST /api/runs queues it when something is going), so the header keeps the going
// run and its Stop.
function started(res, kind) {
  if (res.queued) {
    const box = $("save-result");
    box.hidden = false;
    box.replaceChildren(el("span", { id: "queued-note" }, `${res.queued.length} ${kind}(s) of ${res.version.name} queued at position ${res.queued.map((e) => e.position).join(", ")}` +
      (res.holder ? `, waiting for ${res.holder}` : ": the first starts now")));
    loadQueue();
    return;
  }
  state.run = { launch: res.launch, key: null, label: `${res.version.name} (${kind})` };
  showActive();
  followLaunch(res.launch);
}

async function startRun(kind) {
  if (!state.saved) return;
  try {
    const count = kind === "run" ? Number($("run-count").value || 1) : 1;
    const res = await api("/api/runs", { method: "POST", body: { version: state.saved.hash, kind, mode: $("run-mode").value, count } });
    started(res, kind);
  } catch (err) {
    alert(err.errors.map((e) => `${e.path}: ${e.message}`).join("\n") || err.message);
  }
}
$("run-button").addEventListener("click", () => startRun("run"));

// -- dry run: what preflight and apply would change, per node (every value shown as text) ----------
function renderDryRun(r) {
  const nodes = r.nodes.map((n) => {
    const shorten = (d) => (n.node_dir ? d.replaceAll(n.node_dir, "$RUN") : d);
    return el("details", { class: "dry-node", open: true, dataset: { host: n.host } },
      el("summary", {}, n.changes.length ? `${n.host}: ${n.changes.length} change(s) would be made` : `${n.host}: no change`),
      n.node_dir ? el("p", { class: "small" }, `$RUN = ${n.node_dir}`) : null,
      el("ul", {}, ...n.changes.map((c) => el("li", { dataset: { kind: c.kind } },
        el("strong", {}, `[${c.kind}] `), c.task,
        c.details.length ? el("pre", {}, c.details.map(shorten).join("\n")) : null))),
      ...n.notes.map((note) => el("p", { class: "small" }, `note: ${note}`)));
  });
  return el("section", { class: "dry-run" },
    el("h4", {}, `${r.label} (${r.mode} mode): ${r.ok ? "nothing was changed" : "the dry run failed"}`),
    r.error ? el("p", { class: "err" }, r.error) : null, ...nodes);
}

// The dry run goes on in the server: its progress streams to the terminal (seen below the dialog), and its
// report is kept as the version's last dry run in that mode, which "Last dry run" opens again (after the tab
// was closed, too). The dialog is modal: opened with show() it lay under the sticky toolbar, and a click
// beside it could start another run meanwhile (issue 49, item 6).
function showDryRunReport(res) {
  $("dry-run-title").textContent = `Dry run of ${res.version.name} · ${short(res.version.hash)} (${res.mode} mode, ${new Date(res.finished_ns / 1e6).toLocaleString()})`;
  const body = $("dry-run-body");
  body.replaceChildren(...res.dry_runs.map(renderDryRun));
  if (!res.ok && !res.dry_runs.some((r) => r.error)) body.append(el("pre", { class: "err" }, res.log_tail));
  if (res.not_kept) body.append(el("p", { class: "err" }, `not kept for later: ${res.not_kept}`));
  if (!$("dry-run-dialog").open) $("dry-run-dialog").showModal();
}

// asked which modes have a kept report first: a 404 for "none yet" was a console error on every version load
async function lastDryRun(hash, mode) {
  const kept = await api(`/api/versions/${hash}/dry-runs`);
  if (!kept[mode]) return null;
  try { return await api(`/api/versions/${hash}/dry-run?mode=${mode}`); } catch (err) { if (err.status === 404) return null; throw err; }
}

async function showLastDryRunButton() {
  const saved = state.saved;
  const last = saved ? await lastDryRun(saved.hash, $("run-mode").value) : null;
  if (state.saved !== saved) return;
  $("dry-last").hidden = !last;
  if (last) $("dry-last").title = `the last dry run of this version in ${last.mode} mode, ${new Date(last.finished_ns / 1e6).toLocaleString()}`;
}

async function dryRun() {
  if (!state.saved) return;
  const version = state.saved;
  const mode = $("run-mode").value;
  const body = $("dry-run-body");
  $("dry-run-title").textContent = `Dry run of ${version.name || version.hash.slice(0, 12)}`;
  body.replaceChildren(el("p", { class: "small", "data-testid": "dry-run-waiting" },
    "checking every node in Ansible check mode… its progress streams to the terminal below this dialog; closing this page does not stop it (Last dry run shows its report)"));
  if (!$("dry-run-dialog").open) $("dry-run-dialog").showModal();
  $("dry-button").disabled = true;
  try {
    const started = await api("/api/dry-runs", { method: "POST", body: { version: version.hash, mode, background: true } });
    const action = await terminal.watch(started.action, () => {});
    const res = await lastDryRun(version.hash, mode);
    if (res && res.finished_ns >= action.started_ns) showDryRunReport(res);
    else body.replaceChildren(el("p", { class: "err" }, action.error || "the dry run gave no report"));
    showLastDryRunButton();
  } catch (err) {
    body.replaceChildren(el("p", { class: "err" }, err.errors.map((e) => `${e.path}: ${e.message}`).join("\n") || err.message));
  } finally {
    $("dry-button").disabled = !state.saved;
  }
}
$("dry-button").addEventListener("click", dryRun);
$("dry-last").addEventListener("click", async () => {
  const res = state.saved && await lastDryRun(state.saved.hash, $("run-mode").value);
  if (res) showDryRunReport(res);
});
$("run-mode").addEventListener("change", showLastDryRunButton);

// -- benchmarking: the profiling-only pipeline, with the profiling options the scenario schema defines ---
async function openBenchmark() {
  if (!state.saved) return;
  if (!state.benchmark) state.benchmark = await api("/api/benchmark");
  const full = await api(`/api/versions/${state.saved.hash}`);
  state.benchForm = new SchemaForm($("bench-fields"), state.benchmark.schema);
  state.benchForm.render(full.document);
  $("bench-version").textContent = `${full.name} · ${short(full.hash)}`;
  $("bench-mode").value = $("run-mode").value;
  $("bench-errors").replaceChildren();
  $("bench-dialog").showModal();
}
$("bench-button").addEventListener("click", openBenchmark);

// every option the dialog offers, as a nested object; an emptied field is null (back to the default)
function benchProfiling() {
  const { value, errors } = state.benchForm.read();
  if (errors.length) throw { errors, message: "fix these fields first" };  // never send a dropped field as its default
  const out = {};
  for (const path of state.benchmark.fields) {
    const parts = path.split(".");
    let src = value;
    for (const p of parts) src = src && typeof src === "object" ? src[p] : undefined;
    let dst = out;
    for (const p of parts.slice(0, -1)) dst = dst[p] = dst[p] || {};
    dst[parts[parts.length - 1]] = src === undefined ? null : src;
  }
  return out;
}

$("bench-form").addEventListener("submit", async (event) => {
  if (event.submitter && event.submitter.value === "cancel") return;
  event.preventDefault();
  try {
    const body = { version: state.saved.hash, kind: "benchmark", mode: $("bench-mode").value, profiling: benchProfiling() };
    const res = await api("/api/runs", { method: "POST", body });
    $("bench-dialog").close();
    started(res, "benchmark");
    // its derived version is listed (marked) at once; the editor stays on the version it was made from
    if ($("history-name").textContent === res.version.name) loadHistory(res.version.name);
  } catch (err) {
    const errors = err.errors.map((e) => ({ ...e, path: (e.path || "").replace(/^profiling\.?/, "") }));
    state.benchForm.showErrors(errors);
    $("bench-errors").replaceChildren(...(errors.length ? errors : [{ path: "", message: err.message }])
      .map((e) => el("li", { dataset: { path: e.path } }, e.path ? `${e.path}: ${e.message}` : e.message)));
  }
});

// -- the active run --------------------------------------------------------------------------------
function showActive() {
  const run = state.run;
  $("active-run").hidden = !run;
  if (!run) return;
  $("active-label").textContent = run.label;
  const st = run.state || "starting";
  $("active-state").textContent = run.stage && st === "running" ? `${st} · ${run.stage}` : st;
  $("active-state").className = `state ${st}`;
  $("stop-button").hidden = !(run.key && ["running", "starting"].includes(st));
}

async function followLaunch(launchId) {
  for (let i = 0; i < 600 && state.run && state.run.launch === launchId && !state.run.key; i++) {
    const data = await api(`/api/launches/${launchId}`);
    if (data.runs.length) {
      const run = data.runs[data.runs.length - 1];
      Object.assign(state.run, { key: run.key, state: run.state, label: run.label });
      terminal.attach(`/api/runs/${run.key}/terminal`, run.label);
      break;
    }
    if (!data.alive) { state.run.state = "failed"; showActive(); alert(`dit run exited:\n${data.log_tail}`); return; }
    await new Promise((r) => setTimeout(r, 500));
  }
  showActive();
  pollActive();
}

// the header badge names the run being viewed: opening a run's page makes it the badge's run
function watchRun(detail) {
  if (state.run && state.run.key === detail.key) return;
  state.run = { key: detail.key, label: detail.label, state: detail.state, stage: detail.stage };
  showActive();
  pollActive();
}

async function pollActive() {
  const run = state.run;
  if (!run || !run.key) return;
  const detail = await api(`/api/runs/${run.key}`);
  if (state.run !== run) return; // another run took the badge meanwhile: its own poll goes on
  Object.assign(run, { state: detail.state, stage: detail.stage });
  showActive();
  if (!$("run-page").hidden && state.page === run.key) runView.render(detail);
  if (["running", "starting"].includes(detail.state)) setTimeout(pollActive, 1000);
  else loadRuns();
}

// Stop asks first: it ends the measurement (what was collected so far is kept, the nodes are restored)
async function stopRun(key) {
  const label = (state.run && state.run.key === key && state.run.label) || key;
  if (!confirm(`Stop ${label}? Its processes end and every node is restored; what it measured so far is kept.`)) return;
  await api(`/api/runs/${key}/stop`, { method: "POST", body: {} });
  if (state.run && state.run.key === key) { state.run.state = "stopping"; showActive(); }
}
$("stop-button").addEventListener("click", () => state.run && state.run.key && stopRun(state.run.key));
$("run-stop").addEventListener("click", () => state.page && stopRun(state.page));

// -- runs ------------------------------------------------------------------------------------------
// ticked runs (kept across a refresh) -> Compare: their side-by-side report, a download as Report is
state.compare = new Set();
function compareLink() {
  const keys = [...state.compare];
  const ok = keys.length >= 2;
  $("compare-runs").textContent = ok ? `Compare ${keys.length}` : "Compare";
  // read in a tab of its own as wide as the window (one column per run), or downloaded as a file (issue 49)
  const query = keys.map((k) => `runs=${encodeURIComponent(k)}`).join("&");
  for (const [id, href] of [["compare-runs", `/api/compare/report?${query}&view=true`], ["compare-download", `/api/compare/report?${query}`]]) {
    $(id).setAttribute("aria-disabled", String(!ok));
    if (ok) $(id).href = href;
    else $(id).removeAttribute("href");
  }
}

async function loadRuns() {
  const data = await api("/api/runs");
  const listed = new Set(data.runs.map((r) => r.key));
  for (const key of [...state.compare]) if (!listed.has(key)) state.compare.delete(key);
  // "runs" of a version in its history: only the runs made from it, until "show all"
  const runs = state.runsOf ? data.runs.filter((r) => r.version === state.runsOf) : data.runs;
  $("runs-filter").hidden = !state.runsOf;
  if (state.runsOf) $("runs-filter-text").textContent = `${runs.length} run(s) made from version ${short(state.runsOf)}`;
  const tick = (r) => el("input", { type: "checkbox", checked: state.compare.has(r.key), dataset: { compare: r.key },
    onclick: (e) => e.stopPropagation(),
    onchange: (e) => { if (e.target.checked) state.compare.add(r.key); else state.compare.delete(r.key); compareLink(); } });
  $("runs-table").tBodies[0].replaceChildren(...runs.map((r) => el("tr", { class: "clickable", dataset: { key: r.key }, onclick: () => openRun(r.key) },
    el("td", {}, tick(r)),
    // four columns that fit beside an open run page (1280 px and up): the run directory's name, not its
    // whole key (the key is the tooltip); the stage under the state; duration and mode under the version
    el("td", { title: r.key }, r.label, el("div", { class: "small" }, r.key.split("/").pop()),
      r.note ? el("div", { class: "small note", title: r.note }, r.note.split("\n")[0].slice(0, 100)) : null),
    el("td", {}, el("span", { class: `state ${r.state}` }, r.state), r.stage ? el("div", { class: "small" }, r.stage) : null,
      sweepText(r) ? el("div", { class: "small" }, sweepText(r)) : null),
    el("td", {}, versionCell(r), el("div", { class: "small" },
      [r.duration_s !== null ? `${r.duration_s.toFixed(1)} s` : "", r.mode + (r.kind ? ` · ${r.kind}` : "")].filter(Boolean).join(" · "))))));
  compareLink();
  loadQueue().catch(() => {});
}
$("refresh-runs").addEventListener("click", loadRuns);

async function loadQueue() {
  const q = await api("/api/queue");
  $("queue-box").hidden = !q.entries.length;
  $("queue-holder").textContent = q.holder ? `waiting for ${q.holder}` : "starting the next";
  $("queue-list").replaceChildren(...q.entries.map((e) => el("li", { dataset: { queued: e.id } },
    `${e.name} · ${short(e.version)} (${e.kind}, ${e.mode} mode) `,
    el("button", { type: "button", onclick: async () => { await api(`/api/queue/${e.id}`, { method: "DELETE" }); loadQueue(); } }, "Cancel"))));
}
$("run-note-save").addEventListener("click", async () => {
  const key = state.noteKey;
  try {
    const res = await api(`/api/runs/${key}/note`, { method: "PUT", body: { text: $("run-note").value } });
    $("run-note-state").textContent = res.note ? "saved" : "removed";
    $("run-note-state").className = "small";
    loadRuns();
  } catch (err) {
    $("run-note-state").textContent = err.errors.map((e) => `${e.path}: ${e.message}`).join("; ") || err.message;
    $("run-note-state").className = "small err";
  }
});
$("runs-filter-clear").addEventListener("click", () => { state.runsOf = null; loadRuns(); });
for (const id of ["compare-runs", "compare-download"]) $(id).addEventListener("click", (e) => { if (state.compare.size < 2) e.preventDefault(); });

// a run's stored version; a run started from the CLI of a scenario never saved here: its scenario hash
function versionCell(r) {
  if (r.version) return el("code", { title: r.version, dataset: { version: r.version } }, short(r.version));
  if (r.variant_hash) return el("code", { class: "small", title: `scenario hash ${r.variant_hash} (no stored version)`, dataset: { scenarioHash: r.variant_hash } }, `scenario ${short(r.variant_hash)}`);
  return "–";
}

async function openRun(key) {
  state.page = key;
  const detail = await api(`/api/runs/${key}`);
  runView.render(detail);
  watchRun(detail);
  terminal.attach(`/api/runs/${key}/terminal`, detail.label);
  const opt = await api(`/api/runs/${key}/optimise`);
  runView.renderOptimise(opt, detail);
}

// -- start -----------------------------------------------------------------------------------------
async function main() {
  state.config = await api("/api/config");
  const schema = await api("/api/schema");
  state.form = new SchemaForm($("scenario-form"), schema);
  editScenario(STARTER);
  state.map = new NodeMap(state.config, () => {}, (link, nodes) => linkPanel.open(link, nodes).catch((err) => alert(err.message)), delaysInForce);
  await state.map.refresh();
  setInterval(() => state.map.refresh().catch(() => {}), 2000);
  // a run that is going on when the page opens becomes the active run
  const runs = await api("/api/runs");
  const live = runs.runs.find((r) => r.state === "running");
  if (live) {
    state.run = { key: live.key, label: live.label, state: live.state };
    terminal.attach(`/api/runs/${live.key}/terminal`, live.label);
    showActive();
    pollActive();
  }
  document.body.dataset.ready = "1";
}
main();
