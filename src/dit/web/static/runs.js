// NNPM's runs: the Runs view (its list with Compare, the queue, a version's runs, a run's note), the
// header's active run badge with its Stop button, starting a run (Run, or one queued behind the going
// one) and opening a run's page (drawn by runpage.js). It reads and writes the page's shared state: the
// badge's run (run), the run on the page (page), the ticked runs (compare), the version whose runs are
// listed (runsOf); it reads the saved version (saved) and the run whose note is in the box (noteKey).
import { api, el, short, sweepText } from "./api.js";

const $ = (id) => document.getElementById(id);

// Wires the Runs view, the badge and Run. runView is the run page (runpage.js).
export function runsView(state, terminal, runView) {
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

  return { loadRuns, started, showActive, pollActive };
}
