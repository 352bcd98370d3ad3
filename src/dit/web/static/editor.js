// NNPM's scenario editor: the form and its errors, Validate, Save, the stored scenarios and files, a
// scenario's version history (Diff, notes, its runs), Apply map delays, the delays in force the map draws
// and the link panel's glue (a link's profile written into the form). It reads and writes the page's shared
// state: the form, the saved version (saved, which Run, Dry run and Benchmarking start from), the
// delays' origins, the version history with its ticked versions (history, selected), and the version
// whose runs the Runs view lists (runsOf).
import { api, el, short } from "./api.js";
import { LinkPanel, linkKey } from "./link.js";

const $ = (id) => document.getElementById(id);

export const STARTER = {
  name: "nnpm_scenario", description: "", model: "fake", devices: ["device1", "device2"], repetitions: 3, seed: 0,
  inference: { enabled: true, repetitions: 5 }, optimisation: { enabled: true, algorithm: "greedy", objective: "total_delay" },
};

// Wires the editor's controls. show(view) switches the page's view; showLastDryRunButton is the dry run
// dialog's (dialogs.js), shown once a version is saved.
export function scenarioEditor(state, { show, showLastDryRunButton }) {
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

  return { editScenario, loadScenarioLists, loadHistory, delaysInForce, linkPanel };
}
