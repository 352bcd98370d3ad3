// NNPM page: assembles its modules (the scenario editor editor.js, the dry run and benchmark dialogs
// dialogs.js, the Runs view and active run runs.js, a run's page runpage.js, the Runtimes view runtimes.js,
// the map map.js, the terminal terminal.js) around the page's shared state, switches the views, and starts.
import { api } from "./api.js";
import { versionDialogs } from "./dialogs.js";
import { STARTER, scenarioEditor } from "./editor.js";
import { SchemaForm } from "./form.js";
import { NodeMap } from "./map.js";
import { runPage } from "./runpage.js";
import { runsView } from "./runs.js";
import { runtimesView } from "./runtimes.js";
import { Terminal } from "./terminal.js";

const $ = (id) => document.getElementById(id);
// origins: the destination delays this editor filled from the map or a measurement (linkKey -> source);
// any other value in the scenario is typed, and Apply map delays keeps it (issue 36 item 1)
const state = { config: null, form: null, saved: null, run: null, history: [], selected: [], origins: new Map() };
const terminal = new Terminal();
const runtimes = runtimesView(terminal);
const runView = runPage(state);
// the modules call each other through what they return; the editor asks for the dialogs' Last dry run
// button only once a version is saved, when all three exist
const editor = scenarioEditor(state, { show, showLastDryRunButton: () => dialogs.showLastDryRunButton() });
const runs = runsView(state, terminal, runView);
const dialogs = versionDialogs(state, terminal, { started: runs.started, loadHistory: editor.loadHistory });
window.nnpm = { state, terminal };

// -- views ---------------------------------------------------------------------------------------
function show(view) {
  for (const b of document.querySelectorAll("nav button")) b.classList.toggle("active", b.dataset.view === view);
  for (const s of document.querySelectorAll(".view")) s.classList.toggle("active", s.id === `view-${view}`);
  // the links show the delays of the scenario in the editor: redrawn at once, not at the next refresh
  if (view === "map" && state.map) setTimeout(() => { state.map.map.invalidateSize(); state.map.refresh().catch(() => {}); }, 0);
  if (view === "runs") runs.loadRuns();
  if (view === "scenarios") editor.loadScenarioLists();
  if (view === "runtimes") runtimes.load();
}
for (const b of document.querySelectorAll("nav button")) b.addEventListener("click", () => show(b.dataset.view));

// -- start -----------------------------------------------------------------------------------------
async function main() {
  state.config = await api("/api/config");
  const schema = await api("/api/schema");
  state.form = new SchemaForm($("scenario-form"), schema);
  editor.editScenario(STARTER);
  state.map = new NodeMap(state.config, () => {}, (link, nodes) => editor.linkPanel.open(link, nodes).catch((err) => alert(err.message)), editor.delaysInForce);
  await state.map.refresh();
  setInterval(() => state.map.refresh().catch(() => {}), 2000);
  // a run that is going on when the page opens becomes the active run
  const listed = await api("/api/runs");
  const live = listed.runs.find((r) => r.state === "running");
  if (live) {
    state.run = { key: live.key, label: live.label, state: live.state };
    terminal.attach(`/api/runs/${live.key}/terminal`, live.label);
    runs.showActive();
    runs.pollActive();
  }
  document.body.dataset.ready = "1";
}
main();
