// NNPM's Runtimes view: every installed runtime x every node, readiness only from the real check, the
// install of an external runtime and a runtime's maintenance actions, each followed in the terminal.
import { api, el } from "./api.js";
import { SchemaForm } from "./form.js";

const $ = (id) => document.getElementById(id);

// Wires the view's controls; its load() fills it (when the Runtimes tab opens).
export function runtimesView(terminal) {
  const view = { runtimes: null, nodes: null, actionForm: null };
  const VERDICT = { ok: "ready", failed: "failed", unreachable: "unreachable" };

  async function loadRuntimes() {
    const [rt, nodes] = await Promise.all([api("/api/runtimes"), api("/api/nodes")]);
    view.runtimes = rt;
    view.nodes = nodes.nodes;
    const checked = new Set(chosenHosts());
    $("runtime-hosts").replaceChildren(...nodes.nodes.map((n) => el("label", { class: "inline" },
      el("input", { type: "checkbox", value: n.name, checked: checked.size ? checked.has(n.name) : n.role === "device" }), n.name)));
    const which = $("runtime-which").value;
    $("runtime-which").replaceChildren(el("option", { value: "" }, "all installed"), ...rt.runtimes.map((r) => el("option", { value: r.name }, r.name)));
    $("runtime-which").value = which;
    const current = $("maintenance-action").value;
    $("maintenance-action").replaceChildren(...rt.runtimes.flatMap((r) => r.actions.map((a) =>
      el("option", { value: `${r.name}/${a.name}`, title: a.description }, `${r.name}: ${a.title}`))));
    if (current) $("maintenance-action").value = current;
    const installing = $("install-runtime").value;
    const installable = rt.runtimes.filter((r) => r.installable);
    $("install-runtime").replaceChildren(...installable.map((r) => el("option", { value: r.name }, `${r.name} v${r.version}`)));
    if (installing) $("install-runtime").value = installing;
    $("install-run").disabled = !installable.length;
    $("install-run").title = installable.length ? "" : "no external runtime is declared in the mirror's sources file";
    // a refresh keeps the form of the action still chosen, and what the user typed into it
    if (!current || $("maintenance-action").value !== current || !view.actionForm) showActionInputs();
    $("runtime-problems").replaceChildren(...Object.entries(rt.problems).map(([name, why]) => el("li", {}, `${name} did not load: ${why}`)));
    $("runtime-problems").hidden = !Object.keys(rt.problems).length;
    renderReadiness(rt.readiness, {});
  }

  function chosenHosts() { return [...$("runtime-hosts").querySelectorAll("input:checked")].map((i) => i.value); }

  // one cell per runtime and node: the latest verdict (green only for "ok"), the check running, or none yet
  function readinessCell(runtime, host, verdict, running) {
    const attrs = { dataset: { runtime, host, state: verdict ? verdict.state : running ? "running" : "none" } };
    if (!verdict) return el("td", { ...attrs, class: "small" }, running ? "checking…" : "not checked");
    const checks = verdict.checks.map((c) => `${c.ok ? "✓" : "✗"} ${c.name}: ${c.detail}`).join("\n");
    return el("td", { ...attrs, title: checks || verdict.reason },
      el("span", { class: `dot ${verdict.state === "ok" ? "ok" : "bad"}` }), " ",
      el("strong", { class: verdict.state === "ok" ? "" : "bad-text" }, VERDICT[verdict.state] || verdict.state),
      verdict.reason ? el("div", { class: "small reason" }, verdict.reason) : null,
      verdict.checks.length ? el("div", { class: "small" }, verdict.checks.map((c) => `${c.ok ? "✓" : "✗"} ${c.name}`).join(" · ")) : null);
  }

  function renderReadiness(latest, running) {
    const runtimes = view.runtimes ? view.runtimes.runtimes : [];
    const hosts = (view.nodes || []).map((n) => n.name);
    $("runtime-results").replaceChildren(
      el("tr", {}, el("th", {}, "node"), ...runtimes.map((r) => el("th", { title: r.title }, r.name, el("div", { class: "small" }, `v${r.version} · ${r.checks.join(", ") || "no checks"}`)))),
      ...hosts.map((h) => el("tr", { dataset: { host: h } }, el("td", {}, h),
        ...runtimes.map((r) => readinessCell(r.name, h, (latest[r.name] || {})[h], (running[r.name] || []).includes(h))))));
  }

  $("runtime-check").addEventListener("click", async () => {
    const hosts = chosenHosts();
    const runtimes = $("runtime-which").value ? [$("runtime-which").value] : view.runtimes.runtimes.map((r) => r.name);
    $("runtime-check").disabled = true;
    try {
      for (const name of runtimes) {
        const a = await api("/api/runtimes/check", { method: "POST", body: { runtime: name, hosts, model: $("runtime-model").value } });
        await terminal.watch(a, (x) => { if (x.state === "running") renderReadiness(view.runtimes.readiness, { [name]: hosts }); });
        view.runtimes = await api("/api/runtimes");
        renderReadiness(view.runtimes.readiness, {});
      }
    } catch (err) { alert(err.errors.map((e) => e.message).join("\n") || err.message); }
    finally { $("runtime-check").disabled = false; }
  });

  $("install-run").addEventListener("click", async () => {
    const runtime = $("install-runtime").value;
    const hosts = chosenHosts();
    const show = (text, cls) => { $("install-state").textContent = text; $("install-state").className = `state ${cls}`; };
    $("install-run").disabled = true;
    try {
      const a = await api("/api/runtimes/install", { method: "POST", body: { runtime, hosts } });
      // the box turns completed only with the nodes' readiness: said done before it, it read as finished while
      // the readiness was still being fetched (the e2e test read "done" without "ready 1 of 1")
      const done = await terminal.watch(a, (x) => {
        if (x.state !== "running") return;
        show(`${x.title}: ${x.state}`, x.state);
        renderReadiness(view.runtimes.readiness, { [runtime]: hosts });
      });
      view.runtimes = await api("/api/runtimes");
      renderReadiness(view.runtimes.readiness, {});
      const ready = done.nodes.filter((n) => n.state === "ok").length;
      show(`${done.title}: ${done.state}${done.error ? ` (${done.error})` : ""}; ready ${ready} of ${done.nodes.length}`, done.state === "done" ? "completed" : "failed");
    } catch (err) {
      show((err.errors || []).map((e) => `${e.path}: ${e.message}`).join("; ") || err.message, "failed");
    } finally { $("install-run").disabled = false; }
  });

  function chosenAction() {
    const [runtime, name] = ($("maintenance-action").value || "/").split("/");
    const r = (view.runtimes ? view.runtimes.runtimes : []).find((x) => x.name === runtime);
    return { runtime, name, spec: r && r.actions.find((a) => a.name === name) };
  }

  function showActionInputs() {
    const { spec } = chosenAction();
    const hasInputs = spec && Object.keys(spec.inputs.properties || {}).length;
    $("maintenance-inputs").hidden = !hasInputs;
    view.actionForm = hasInputs ? new SchemaForm($("maintenance-inputs"), spec.inputs) : null;
    if (view.actionForm) view.actionForm.render({});
    else $("maintenance-inputs").replaceChildren();
  }
  $("maintenance-action").addEventListener("change", showActionInputs);

  $("maintenance-run").addEventListener("click", async () => {
    const { runtime, name } = chosenAction();
    let inputs = {};
    if (view.actionForm) {
      view.actionForm.clearErrors();  // a submission: its errors replace the last one's
      const read = view.actionForm.read();
      if (read.errors.length) { view.actionForm.showErrors(read.errors); return; }
      inputs = read.value;
    }
    try {
      const a = await api("/api/runtimes/actions", { method: "POST", body: { runtime, action: name, inputs, hosts: chosenHosts() } });
      await terminal.watch(a, (x) => {
        $("maintenance-state").textContent = `${x.title}: ${x.state}${x.error ? ` (${x.error})` : ""}`;
        $("maintenance-state").className = `state ${x.state === "done" ? "completed" : x.state}`;
      });
    } catch (err) {
      if (err.status === 422 && view.actionForm) view.actionForm.showErrors(err.errors.map((e) => ({ ...e, path: e.path.replace(/^inputs\.?/, "") })));
      $("maintenance-state").textContent = err.errors.map((e) => `${e.path}: ${e.message}`).join("; ") || err.message;
      $("maintenance-state").className = "state failed";
    }
  });

  return { load: loadRuntimes };
}
