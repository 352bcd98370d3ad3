// One link of the map, device → destination: its delay, jitter, loss (and its correlation) and rate cap, written into the
// scenario form's per-destination profile (network.<device>.destinations.<destination>), issue 36 item 1.
//
// Each field shows the value that applies and where it comes from: typed (in the scenario), the map
// (5 ms + 1 ms/km, delay only) or the latest run's measured RTT (delay only; RTT once per round trip to
// the edge, RTT / 2 at each end between devices). A typed value wins: the map only fills a delay nobody
// typed, and the panel says which value wins. A destination profile replaces the device's own on that
// link (tc: its own class), so the device's values are carried into it rather than silently dropped.
import { api, el } from "./api.js";

export const LINK_FIELDS = [
  { key: "delay_ms", title: "Delay", unit: "ms", min: 0, max: 600000 },
  { key: "jitter_ms", title: "Jitter", unit: "ms", min: 0, max: 600000 },
  { key: "loss_pct", title: "Loss", unit: "%", min: 0, max: 100 },
  { key: "loss_correlation_pct", title: "Loss correlation", unit: "%", min: 0, max: 100 },
  { key: "rate_mbit", title: "Rate cap", unit: "Mbit/s", min: 0.001, max: 10000 },
];
const SOURCE_TEXT = { typed: "typed", map: "map", measured: "measured RTT", device: "the device's profile", none: "not set" };
const show = (v, unit) => `${Number(Number(v).toPrecision(6))} ${unit}`; // 5.013 ms, 20 ms, 0.0441 ms
export const linkKey = (device, peer) => `${device}>${peer}`;

export class LinkPanel {
  // readDocument() -> {value, errors}: the scenario form; writeDocument(doc, summary): render it again;
  // origins: Map linkKey -> "map" | "measured", the destination delays this editor filled from those
  constructor({ readDocument, writeDocument, origins }) {
    this.readDocument = readDocument;
    this.writeDocument = writeDocument;
    this.origins = origins;
    this.dialog = document.getElementById("link-dialog");
    this.form = document.getElementById("link-form");
    this.form.addEventListener("submit", (e) => this.submit(e));
    document.getElementById("link-direction").addEventListener("change", (e) => this.render(Number(e.target.value)));
  }

  // link: {a, b, delay_ms} from /api/nodes; nodes: the inventory's nodes (their roles)
  async open(link, nodes) {
    const role = Object.fromEntries(nodes.map((n) => [n.name, n.role]));
    const dirs = [];
    if (role[link.a] === "device") dirs.push([link.a, link.b]);
    if (role[link.b] === "device") dirs.push([link.b, link.a]);
    if (!dirs.length) return; // no device on this link: nothing shapes it
    const read = this.readDocument();
    this.doc = read.value || {};
    this.link = link;
    this.role = role;
    this.dirs = dirs;
    this.measured = null;
    const name = typeof this.doc.name === "string" ? this.doc.name : "";
    if (name) {
      try { this.measured = await api(`/api/scenarios/${encodeURIComponent(name)}/measured-links`); } catch { this.measured = null; }
    }
    const select = document.getElementById("link-direction");
    select.replaceChildren(...dirs.map(([d, p], i) => el("option", { value: String(i) }, `${d} → ${p}`)));
    document.getElementById("link-direction-box").hidden = dirs.length < 2;
    const errors = document.getElementById("link-errors");
    errors.replaceChildren(...(read.errors || []).map((e) => el("li", {}, `${e.path}: ${e.message} (the scenario form; fix it there first)`)));
    this.render(0);
    if (!this.dialog.open) this.dialog.showModal();
  }

  measuredFor(device, peer) {
    const links = (this.measured && this.measured.links) || [];
    const edge = this.role[peer] === "edge";
    return links.find((l) => l.device === device && (l.target === peer || (edge && l.target === "edge"))) || null;
  }

  render(index) {
    const [device, peer] = this.dirs[index];
    this.device = device;
    this.peer = peer;
    const block = ((this.doc.network || {})[device]) || {};
    const dest = (block.destinations || {})[peer];
    this.hadDest = !!dest;
    const mapMs = this.link.delay_ms;
    const measured = this.measuredFor(device, peer);
    this.mapMs = mapMs;
    this.measuredLink = measured;
    const origin = this.origins.get(linkKey(device, peer));
    document.getElementById("link-title").textContent = `${device} → ${peer}`;
    const inScenario = (f) => (dest ? dest[f] : block[f]);
    const where = (f) => (dest ? `network.${device}.destinations.${peer}.${f}` : `network.${device}.${f}`);
    const devices = Array.isArray(this.doc.devices) ? this.doc.devices : [];
    document.getElementById("link-intro").textContent = (devices.includes(device) ? "" : `${device} is not among the scenario's devices: list it there for this to apply. `)
      + `Written into network.${device}.destinations.${peer}, a profile of its own for this link`
      + (dest ? "." : `; the device's own values (network.${device}.*) are carried into it, since a link's profile replaces the device's on that link.`)
      + ((block.variation || {}).kind && block.variation.kind !== "constant" && !dest ? ` The device's ${block.variation.kind} delay variation does not apply on a link with its own profile.` : "");
    const rows = LINK_FIELDS.map((f) => {
      const now = inScenario(f.key);
      const input = el("input", { type: "number", step: "any", min: f.min, max: f.max, name: f.key, value: now ?? "", size: 8 });
      const nowText = now === undefined || now === null ? "not set" : `${show(now, f.unit)} · ${dest ? "this link's profile" : "the device's profile"}`;
      let sourceCell;
      if (f.key === "delay_ms") {
        const typed = now !== undefined && now !== null;
        const chosen = typed ? (origin === "map" || origin === "measured" ? origin : "typed") : mapMs !== undefined ? "map" : "typed";
        const select = el("select", { name: "delay_source" },
          el("option", { value: "typed" }, "typed"),
          mapMs !== undefined ? el("option", { value: "map" }, `map: ${show(mapMs, "ms")}`) : null,
          el("option", { value: "measured", disabled: !measured }, measured ? `measured RTT as delay: ${show(measured.delay_ms, "ms")}` : "measured RTT: no measurement"));
        select.value = chosen;
        this.typedDelay = typed && chosen === "typed" ? String(now) : "";
        select.addEventListener("change", () => this.sourceChanged());
        input.addEventListener("input", () => {
          select.value = "typed";
          input.classList.remove("derived");
          this.typedDelay = input.value;
          this.refresh();
        });
        sourceCell = select;
      } else {
        input.addEventListener("input", () => this.refresh());
        sourceCell = el("span", { class: "small" }, "typed");
      }
      return el("tr", { dataset: { field: f.key } },
        el("td", {}, f.title, el("div", { class: "small" }, f.key)),
        el("td", {}, input, " ", el("span", { class: "unit" }, f.unit)),
        el("td", {}, sourceCell),
        el("td", { class: "applies" }, ""),
        el("td", { class: "small now", title: now === undefined || now === null ? "" : where(f.key) }, nowText));
    });
    document.querySelector("#link-fields tbody").replaceChildren(...rows);
    const m = measured;
    const run = this.measured && this.measured.run;
    document.getElementById("link-measured").textContent = m
      ? `Measured in ${run} (${this.measured.state || "?"}): RTT ${show(m.rtt_ms_mean, "ms")} mean` + (m.rtt_ms_min !== null ? `, ${show(m.rtt_ms_min, "ms")} min` : "")
        + (m.baseline_rtt_ms !== null ? `; unshaped baseline ${show(m.baseline_rtt_ms, "ms")}` : "") + `. As a delay: ${m.delay_rule}.`
      : `Measured RTT: no measurement (${run ? `run ${run} has no ping of this link` : `no run of ${this.doc.name || "this scenario"} with aggregate/links.csv`}).`;
    this.sourceChanged();
  }

  field(key) { return this.form.querySelector(`#link-fields tr[data-field=${key}]`); }

  sourceChanged() {
    const select = this.form.elements.delay_source;
    const input = this.form.elements.delay_ms;
    if (select.value === "map") input.value = String(this.mapMs);
    else if (select.value === "measured" && this.measuredLink) input.value = String(this.measuredLink.delay_ms);
    else input.value = this.typedDelay;
    input.classList.toggle("derived", select.value !== "typed"); // typing over it makes it typed
    this.refresh();
  }

  // what applies once written, per field, and which value wins
  refresh() {
    const source = this.form.elements.delay_source.value;
    for (const f of LINK_FIELDS) {
      const row = this.field(f.key);
      const v = this.form.elements[f.key].value.trim();
      const from = v === "" ? "none" : f.key === "delay_ms" ? source : "typed";
      row.dataset.source = from;
      row.querySelector(".applies").textContent = v === "" ? (f.key === "delay_ms" ? "0 ms: not set" : "not set") : `${show(v, f.unit)} · ${SOURCE_TEXT[from]}`;
    }
    const mapText = this.mapMs !== undefined ? show(this.mapMs, "ms") : null;
    const delay = this.form.elements.delay_ms.value.trim();
    const wins = document.getElementById("link-wins");
    wins.dataset.wins = source;
    wins.textContent = source === "typed"
      ? (delay === "" ? "No delay on this link." : `The typed ${show(delay, "ms")} wins` + (mapText ? ` over the map's ${mapText}: Apply map delays keeps it.` : "."))
      : source === "map"
        ? `The map's ${mapText} applies: nothing typed on this link (Apply map delays keeps it up to date).`
        : `The measured RTT gives ${show(delay, "ms")}: it wins` + (mapText ? ` over the map's ${mapText}; Apply map delays keeps it.` : ".");
  }

  submit(event) {
    if (event.submitter && event.submitter.value === "cancel") return;
    event.preventDefault();
    const path = (k) => `network.${this.device}.destinations.${this.peer}.${k}`;
    const problems = [];
    const profile = {};
    for (const f of LINK_FIELDS) {
      const input = this.form.elements[f.key];
      const text = input.value.trim();
      if (input.validity.badInput) { problems.push(`${path(f.key)}: is not a number`); continue; }
      if (text === "") continue;
      const n = Number(text);
      if (!Number.isFinite(n) || n < f.min || n > f.max) { problems.push(`${path(f.key)}: ${text} is not a number from ${f.min} to ${f.max} ${f.unit}`); continue; }
      profile[f.key] = n;
    }
    const errors = document.getElementById("link-errors");
    errors.replaceChildren(...problems.map((p) => el("li", {}, p)));
    if (problems.length) return;
    const read = this.readDocument();
    if (read.errors && read.errors.length) {
      errors.replaceChildren(...read.errors.map((e) => el("li", {}, `${e.path}: ${e.message} (the scenario form; fix it there first)`)));
      return;
    }
    const doc = read.value;
    const network = { ...(doc.network || {}) };
    const block = { ...(network[this.device] || {}) };
    const dests = { ...(block.destinations || {}) };
    if (Object.keys(profile).length) dests[this.peer] = profile;
    else delete dests[this.peer]; // nothing set: the device's own profile applies on the link again
    if (Object.keys(dests).length) block.destinations = dests; else delete block.destinations;
    if (Object.keys(block).length) network[this.device] = block; else delete network[this.device];
    if (Object.keys(network).length) doc.network = network; else delete doc.network;
    const source = this.form.elements.delay_source.value;
    const key = linkKey(this.device, this.peer);
    if ("delay_ms" in profile && source !== "typed") this.origins.set(key, source); else this.origins.delete(key);
    this.dialog.close();
    this.writeDocument(doc, { device: this.device, peer: this.peer, profile, source: "delay_ms" in profile ? source : "none" });
  }
}
