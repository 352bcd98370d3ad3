// NNPM's run page: a run's state, metadata, stages, summary, phases and plots, a stopped run's kept
// files, and its optimiser results with the dialog that optimises it again. It reads and writes the page's
// shared state: the run on the page (page), its detail, the run whose note is in the box (noteKey), config.
import { api, el, fmtQuantity, short, sweepText } from "./api.js";

const $ = (id) => document.getElementById(id);

export function runPage(state) {
  // the model as plain text: its name, what it stands in for, its parameters (never JSON-quoted)
  function modelText(m) {
    if (!m || !m.name) return "";
    const params = m.params ? Object.entries(m.params).map(([k, v]) => `${k}=${typeof v === "string" ? v : JSON.stringify(v)}`).join(", ") : "";
    return m.name + (m.stand_in_for ? ` (stand-in for ${m.stand_in_for})` : "") + (params ? ` · ${params}` : "");
  }

  // the phases table: every duration in its unit (the server writes them with dit.units), the
  // raw value as the cell's tooltip, what each phase measures as its header's tooltip; the first column
  // stays put when the table scrolls sideways
  function renderPhases(d) {
    const phases = d.phases;
    $("run-phases-box").hidden = !d.inference_ran;
    // a stopped run says so in its own box at the top, with what it kept (renderStopped)
    $("run-no-inference").hidden = d.inference_ran || !d.finished || d.state === "stopped";
    // a stopped or refused run says so (and where), never "a benchmark profiles only"
    $("run-no-inference").textContent = d.outcome_note || "No inference ran in this run (a benchmark profiles only): no phases, nothing to optimise.";
    if (!d.inference_ran) { $("run-phases").replaceChildren(); return; }
    $("run-phases").replaceChildren(
      el("thead", {}, el("tr", {}, ...phases.columns.map((c) => el("th", { title: c.description, dataset: { column: c.key }, class: c.unit ? "num" : "" },
        c.label, c.unit === "ns" ? el("div", { class: "small" }, c.stat || "mean") : null)))),
      el("tbody", {}, ...phases.rows.map((r) => el("tr", {}, ...r.map((v, i) => el("td", {
        class: phases.columns[i] && phases.columns[i].unit ? "num" : "",
        title: v.value !== null && phases.columns[i] && phases.columns[i].unit ? `${v.value} ${phases.columns[i].unit}` : null,
      }, v.text))))));
  }

  function kvRows(rows) { return rows.filter(([, v]) => v !== undefined && v !== null && v !== "").map(([k, v]) => el("tr", {}, el("td", {}, k), el("td", {}, v))); }

  function renderRun(d) {
    $("run-page").hidden = false;
    $("run-title").textContent = d.label;
    if (state.noteKey !== d.key) {  // a poll of the same run never overwrites what is being typed
      state.noteKey = d.key;
      $("run-note").value = d.note || "";
      $("run-note-state").textContent = "";
    }
    $("run-state").textContent = [d.stage && d.state === "running" ? `${d.state} · ${d.stage}` : d.state, sweepText(d)]
      .filter(Boolean).join(" · ");
    $("run-state").className = `state ${d.state}`;
    $("run-stop").hidden = !["running", "starting"].includes(d.state);
    $("open-optimise").hidden = !(d.finished && d.aggregated && d.inference_ran);  // nothing measured: nothing to optimise
    state.detail = d;
    $("run-report").hidden = !d.finished;
    $("run-report").href = `/api/runs/${d.key}/report`;
    $("run-archive").hidden = !d.finished;
    $("run-archive").href = `/api/runs/${d.key}/archive`;
    const started = d.started_wall_ns ? new Date(d.started_wall_ns / 1e6).toISOString() : "";
    $("run-meta").replaceChildren(...kvRows([
      ["scenario version", el("code", { "data-testid": "run-version" }, d.version || (d.variant_hash ? `not stored (scenario ${short(d.variant_hash)})` : "unknown"))], ["variant hash", el("code", {}, short(d.variant_hash))],
      ["run id", d.run_id], ["mode", d.mode], ["kind", d.kind], ["started", started], ["duration", d.duration_text],
      ["model", d.model && d.model.name ? el("span", { "data-testid": "run-model" }, modelText(d.model)) : ""],
      ["git", d.metadata.dit && d.metadata.dit.git ? short(d.metadata.dit.git.commit) + (d.metadata.dit.git.dirty ? " (dirty)" : "") : ""],
      // said once: a stop in its own box, a refusal in the outcome sentence below (which quotes the error)
      ["error", d.state === "stopped" || (!d.inference_ran && d.error && (d.outcome_note || "").includes(d.error)) ? "" : d.error], ...(d.degraded || []).map((p) => [`${p.node} ${p.process}`, el("pre", { class: "small" }, (p.stderr_tail || []).join("\n") || p.error || "")]), ["teardown", d.teardown ? (d.teardown.ok ? "complete, nothing left" : d.teardown.errors.join("; ")) : ""],
      ["edge channel", d.edge_channel],
    ]));
    $("run-stages").replaceChildren(el("tr", {}, el("th", {}, "stage"), el("th", { class: "num" }, "wall time")),
      ...d.stages.map((s) => el("tr", { dataset: { stage: s.stage }, class: s.skipped !== undefined ? "skipped" : null }, el("td", {}, s.stage),
        el("td", { class: s.skipped !== undefined ? "small" : "num", title: s.ns !== null ? `${s.ns} ns` : s.skipped }, s.text))));
    renderStopped(d);
    renderSummary(d.summary, d.token_spread || []);
    renderPhases(d);
    // a fake sensor's power is a model of the node's activity: said above the plots that show it
    const powerNote = (d.power && d.power.fake_note) || "";
    $("run-power-note").textContent = powerNote;
    $("run-power-note").hidden = !powerNote;
    const plots = $("run-plots");
    const want = [["layers", "Per-layer latency", "latency (ms) per stage and cumulative up to each partition point"],
      ["monitors", "Monitors", "each metric in its unit against the time from the run's common origin (s)"]].filter(([k]) => d.plots[k]);
    // each plot's address carries its inputs' stamp: the same run reopened is served from the caches, a run
    // whose files changed (a stopped run aggregated, a new optimisation) asks again (issue 49, item 6)
    const src = (k) => `/api/runs/${d.key}/plots/${k}.png?v=${encodeURIComponent((d.plot_stamps || {})[k] || "")}`;
    const current = [...plots.querySelectorAll("img")].map((i) => i.getAttribute("src")).join();
    if (current !== want.map(([k]) => src(k)).join()) {
      plots.replaceChildren(...want.flatMap(([k, title, axes]) => [el("h3", {}, title),
        el("img", { src: src(k), alt: `${title}: ${axes}`, dataset: { plot: k } })]));
    }
  }

  // A stopped run is the user's choice, not an error: who stopped it at which stage, and what it kept (the
  // files fetched from each node, what of them is aggregated and shown below) (issue 49, item 4)
  function renderStopped(d) {
    $("run-stopped").hidden = d.state !== "stopped";
    if (d.state !== "stopped") return;
    $("run-stopped-text").textContent = d.outcome_note || "Stopped.";
    $("run-kept-text").textContent = d.kept_note || "";
    const files = Object.entries(d.kept_files || {});
    $("run-kept").hidden = !files.length;
    $("run-kept-files").replaceChildren(...files.map(([node, names]) => el("li", { dataset: { node } }, el("strong", {}, `${node}: `), names.join(", "))));
  }

  // the runtime's summary values (aggregate/summary.json): name, value with its unit scaled to read, meaning;
  // a value a fake sensor gave (energy, EDP) says "modelled" beside it, with the note why (issue 49, item 3)
  // then each host's token latency: mean ± 95 % CI of the mean, p50 / p95 / p99 (dit.results)
  function renderSummary(summary, tokens) {
    $("run-summary-box").hidden = !summary || !summary.values.length;
    if (!summary) { $("run-summary").replaceChildren(); return; }
    $("run-summary-runtime").textContent = summary.runtime;
    const note = summary.modelled_note || "";
    $("run-summary").replaceChildren(el("tr", {}, el("th", {}, "name"), el("th", {}, "value"), el("th", {}, "meaning")),
      ...summary.values.map((v) => el("tr", { dataset: { name: v.name, modelled: v.modelled ? "1" : "" } }, el("td", {}, v.name),
        el("td", { class: "num", title: `${v.value} ${v.unit}`.trim() }, v.text ?? fmtQuantity(v.value, v.unit),
          v.modelled ? el("span", { class: "badge fake-sensor", title: note }, v.modelled) : null),
        el("td", { class: "small" }, v.description || ""))),
      ...tokens.map((t) => el("tr", { class: "token-spread", dataset: { host: t.host } }, el("td", {}, `decode token latency · ${t.host}`),
        el("td", { class: "num" }, t.mean_text),
        el("td", { class: "small" }, `mean ± 95 % CI over ${t.n} decode tokens (all repetitions, prefill left out); p50 / p95 / p99 ${t.percentiles_text}`))),
      ...(note ? [el("tr", {}, el("td", { colspan: 3, class: "small energy-note" }, note))] : []));
  }

  // Optimiser results: the objective and every term in a readable unit (dit.units, as the CLI), the
  // delay model's terms named and explained, and a result under a policy the run did not measure marked as
  // a prediction.
  function renderOptimise(opt, detail) {
    const box = $("optimise-results");
    box.replaceChildren();
    const results = opt.results;
    if (!results.length) {  // a skipped optimise stage says why (status.json), never an empty box
      const skipped = (detail.skipped || []).find((s) => s.stage === "optimise");
      if (skipped) box.append(el("p", { class: "small", id: "optimise-skipped" }, skipped.text));
      return;
    }
    const terms = opt.terms;
    box.append(el("h3", {}, "Optimiser results"));
    for (const r of results) {
      const energy = r.per_device.some((p) => p.E_text !== undefined);
      const keys = ["L", "T", "R", "D", ...(energy ? ["E"] : [])];
      box.append(el("table", { class: `grid optimise-table${r.measured ? "" : " prediction"}`, dataset: { file: r.file, measured: r.measured ? "1" : "0" } },
        el("caption", {},
          el("strong", {}, `${r.algorithm} · ${r.objective} · ${r.policy}`), ` → vector [${r.vector.join(", ")}] · `,
          el("span", { class: "objective", title: `${r.objective_value} ${r.objective_unit}` }, `${r.objective} ${r.objective_text}`),
          el("span", { class: "small" }, ` · ${r.vectors_evaluated} vectors in ${r.search_text}`),
          r.measured ? el("span", { class: "badge measured", title: `the edge server ran ${r.policy} during the run` }, "measured policy")
            : el("span", { class: "badge prediction", title: r.prediction_reason }, "prediction"),
          r.measured ? null : el("div", { class: "small prediction-reason" }, r.prediction_reason),
          r.energy_note ? el("span", { class: "badge fake-sensor", title: r.energy_note }, r.energy_badge) : null,
          r.energy_note ? el("div", { class: "small energy-note" }, r.energy_note) : null),
        el("tr", {}, el("th", {}, "device"), el("th", { title: "partition point: stages 1..p on the device" }, "p"),
          el("th", { title: "the largest feasible partition point of the device" }, "max p"),
          ...keys.map((k) => el("th", { class: "num", title: `${terms[k][0]} ${k}: ${terms[k][1]}`, dataset: { term: k } }, `${terms[k][0]} ${k}`))),
        ...r.per_device.map((p) => el("tr", { dataset: { device: p.device } }, el("td", {}, p.device), el("td", {}, p.partition_point), el("td", {}, p.max_partition_point),
          ...keys.map((k) => el("td", { class: "num", title: k === "E" ? `${p.E_j} J` : `${p[`${k}_ns`]} ns` }, p[`${k}_text`]))))));
    }
    box.append(el("dl", { class: "legend small", id: "optimise-legend" },
      ...Object.entries(terms).filter(([k]) => k !== "E" || results.some((r) => r.per_device.some((p) => p.E_text !== undefined)))
        .flatMap(([k, [name, meaning]]) => [el("dt", {}, `${k} · ${name}`), el("dd", {}, meaning)])));
    if (detail.plots.validation) box.append(el("h3", {}, "Predicted vs measured"), el("img", { src: `/api/runs/${detail.key}/plots/validation.png`, alt: "predicted vs measured", id: "validation-png" }));
  }

  // the dialog opens on the run's own algorithm, objective and policy; the policy the edge server ran is
  // marked measured, any other one predicted
  const optDialog = $("optimise-dialog");
  $("open-optimise").addEventListener("click", () => {
    const f = $("optimise-form").elements;
    const own = (state.detail && state.detail.settings) || {};
    const fill = (select, values, chosen, label = (v) => v) => {
      const all = chosen && !values.includes(chosen) ? [...values, chosen] : values;
      select.replaceChildren(...all.map((v) => el("option", { value: v, selected: v === chosen }, label(v))));
      if (chosen) select.value = chosen;
    };
    const measured = own.measured_policy;
    fill(f.algorithm, state.config.algorithms, own.algorithm);
    fill(f.objective, state.config.objectives, own.objective);
    fill(f.policy, state.config.policies, own.policy, (p) => (measured ? `${p} (${p === measured ? "measured" : "prediction"})` : p));
    $("optimise-note").textContent = measured
      ? `The edge server ran ${measured} during this run: results under another policy are predictions the run does not confirm.`
      : "This run measured no inference: every result is a prediction.";
    $("optimise-form").querySelector(".err").textContent = "";
    optDialog.showModal();
  });
  $("optimise-form").addEventListener("submit", async (event) => {
    if (event.submitter && event.submitter.value === "cancel") return;
    event.preventDefault();
    const f = $("optimise-form").elements;
    try {
      await api(`/api/runs/${state.page}/optimise`, { method: "POST", body: { algorithm: f.algorithm.value, objective: f.objective.value, policy: f.policy.value } });
      optDialog.close();
      const detail = await api(`/api/runs/${state.page}`);
      const opt = await api(`/api/runs/${state.page}/optimise`);
      renderOptimise(opt, detail);
      // the result just computed, brought into view and marked (it lands below the fold otherwise)
      const file = `${f.algorithm.value}-${f.objective.value}-${f.policy.value}.json`;
      const table = [...$("optimise-results").querySelectorAll("table.optimise-table")].find((t) => t.dataset.file === file);
      if (table) {
        table.classList.add("just-computed");
        // once the plots above it have their size (a plot loading later would push it out of view again)
        const above = [...document.querySelectorAll("#run-plots img")].filter((img) => !img.complete);
        await Promise.all(above.map((img) => img.decode().catch(() => {})));
        table.scrollIntoView({ block: "center" });
      }
    } catch (err) {
      $("optimise-form").querySelector(".err").textContent = err.errors.map((e) => e.message).join("; ") || err.message;
    }
  });

  return { render: renderRun, renderOptimise };
}
