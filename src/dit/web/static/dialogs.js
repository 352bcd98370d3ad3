// NNPM's dialogs on a saved version: the dry run (its report, kept per mode, and the Last dry run button)
// and Benchmarking (the profiling-only pipeline with the options the scenario schema defines). It reads
// the page's shared state (saved: the version they start from) and writes its own: the benchmark
// options' schema and form (benchmark, benchForm).
import { api, el, short } from "./api.js";
import { SchemaForm } from "./form.js";

const $ = (id) => document.getElementById(id);

// Wires the dialogs' controls. started(res, kind) takes a run the server started or queued (runs.js);
// loadHistory(name) lists a scenario's versions again (editor.js).
export function versionDialogs(state, terminal, { started, loadHistory }) {
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
    state.benchForm.clearErrors();  // a submission: its errors replace the last one's
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

  return { showLastDryRunButton };
}
