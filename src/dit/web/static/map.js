// The map of nodes: markers coloured by the last probe (green only when all three answered), draggable;
// a click in "add" mode opens the node dialog; every pair of nodes is a link labelled with the delay in force
// for the scenario open in the editor (typed, measured, or the distance rule's: base + per-metre term, set
// by the researcher, or none; computed by the server), each labelled; a click on a link opens its own
// control (link.js: delay, jitter, loss and rate of device → destination).
//
// Two views (GET /api/config → tiles):
// - a floor plan (the default, no tiles configured): the uploaded image (or a blank sheet) in Leaflet's
//   simple CRS, in image pixels; its scale from two marked points and their distance in metres; node
//   positions are x/y pixels (x right, y down from the top-left corner), shown at latlng [height - y, x];
// - a world map with the configured tile layer: positions are lat/lon; a visible notice when tiles fail
//   to load; the tiles' credit only here.
import { api, el, fmtMs } from "./api.js";

const PLAN_FIELDS = { data: "the image", content_type: "the file type", a: "the first point", b: "the second point", distance_m: "the distance" };

// a board's facts in words and units ("Raspberry Pi 4 Model B · 4 cores · 4096 MB memory · 1500 MHz max"),
// not the inventory's keys; a key this page does not know is shown as it is
const BOARD_FACTS = { cores: (v) => `${v} cores`, memory_mb: (v) => `${v} MB memory`, max_mhz: (v) => `${v} MHz max` };
export function boardText(board) {
  const known = ["model", ...Object.keys(BOARD_FACTS)].filter((k) => board[k] !== undefined && board[k] !== null)
    .map((k) => (k === "model" ? String(board.model) : BOARD_FACTS[k](board[k])));
  const other = Object.entries(board).filter(([k]) => k !== "model" && !(k in BOARD_FACTS)).map(([k, v]) => `${k}: ${v}`);
  return [...known, ...other].join(" · ");
}

const L = window.L;

export class NodeMap {
  // inForce() -> (link, roles) -> [{ from, to, ms, source }]: the delays the open scenario puts on a link
  constructor(config, onChange, onLink, inForce = () => () => []) {
    this.config = config;
    this.inForce = inForce;
    this.onChange = onChange;
    this.onLink = onLink;
    this.mode = config.tiles ? "tiles" : "plan";
    this.markers = new Map();
    this.adding = false;
    this.dragging = false;
    this.scaling = null; // the points marked so far while setting the scale
    this.tileErrors = 0;
    document.getElementById("view-map").dataset.mapMode = this.mode;
    for (const node of document.querySelectorAll("[data-map-only]")) node.hidden = node.dataset.mapOnly !== this.mode;
    if (this.mode === "plan") {
      this.map = L.map("map", { crs: L.CRS.Simple, minZoom: -5, maxZoom: 4, zoomSnap: 0.25, attributionControl: false });
      this.planLayer = L.layerGroup().addTo(this.map);
      this.scaleLayer = L.layerGroup().addTo(this.map);
      this.planKey = null;
      this.setupPlanPanel();
    } else {
      this.map = L.map("map", { zoomControl: true, attributionControl: true }).setView(config.map_center, 12);
      L.control.scale({ metric: true, imperial: false }).addTo(this.map);
      const layer = L.tileLayer(config.tiles, { maxZoom: 19, attribution: config.tiles_attribution });
      layer.on("tileerror", () => this.tileFailed());
      layer.on("tileload", () => { this.tilesLoaded = true; });
      layer.addTo(this.map);
    }
    new ResizeObserver(() => this.map.invalidateSize()).observe(document.getElementById("map")); // the terminal grows
    this.linkLayer = L.layerGroup().addTo(this.map);
    this.map.on("click", (e) => this.clicked(e.latlng));
    this.toggle = document.getElementById("add-node-toggle");
    this.toggle.addEventListener("click", () => this.setAdding(!this.adding));
    this.dialog = document.getElementById("node-dialog");
    this.form = document.getElementById("node-form");
    this.form.addEventListener("submit", (e) => this.submit(e));
    document.getElementById("rule-form").addEventListener("submit", (e) => { e.preventDefault(); this.saveRule(); });
    this.fitted = false;
  }

  // -- the notice over the map: tiles that fail, a plan without scale ---------------------------------
  notice(text) {
    const box = document.getElementById("map-notice");
    box.hidden = !text;
    box.textContent = text || "";
  }

  tileFailed() {
    this.tileErrors += 1;
    document.getElementById("map").classList.add("no-tiles");
    let host = this.config.tiles;
    try { host = new URL(this.config.tiles.replaceAll(/[{}]/g, ""), location.href).host; } catch { /* a template URL() cannot read */ }
    this.notice(`Map tiles failed to load from ${host} (${this.tileErrors} tile errors): the map has no background. `
      + "Check --tiles (an online URL, a local tile directory or an .mbtiles file), or start dit web without --tiles to use a floor plan.");
  }

  // -- positions: plan pixels or lat/lon <-> Leaflet latlng -------------------------------------------
  latLngOf(node) {
    if (this.mode === "plan") return node.x === null || node.y === null ? null : L.latLng(this.plan.height_px - node.y, node.x);
    return node.lat === null || node.lon === null ? null : L.latLng(node.lat, node.lon);
  }

  positionOf(latlng) {
    if (this.mode !== "plan") return { lat: latlng.lat, lon: latlng.lng };
    const clamp = (v, hi) => Math.round(Math.min(hi, Math.max(0, v)) * 100) / 100;
    return { x: clamp(latlng.lng, this.plan.width_px), y: clamp(this.plan.height_px - latlng.lat, this.plan.height_px) };
  }

  // -- the floor plan ---------------------------------------------------------------------------------
  setupPlanPanel() {
    const file = document.getElementById("plan-file");
    file.addEventListener("change", () => file.files[0] && this.upload(file.files[0]));
    document.getElementById("plan-scale").addEventListener("click", () => this.startScale());
    document.getElementById("scale-form").addEventListener("submit", (e) => this.saveScale(e));
    document.getElementById("scale-cancel").addEventListener("click", () => this.endScale());
  }

  planError(err) {
    const box = document.getElementById("plan-error");
    box.hidden = !err;
    if (!err) { box.replaceChildren(); return; }
    const errors = err.errors && err.errors.length ? err.errors : [{ path: "", message: err.message }];
    // what the user touched, in words, not the API's field names ("data:", "b:")
    const said = (path) => PLAN_FIELDS[path] || path;
    box.replaceChildren(...errors.map((e) => el("li", { dataset: { field: e.path } }, e.path ? `${said(e.path)}: ${e.message}` : e.message)));
  }

  async upload(file) {
    this.planError(null);
    const data = await new Promise((resolve, reject) => {
      const reader = new FileReader();
      reader.onload = () => resolve(reader.result);
      reader.onerror = () => reject(reader.error);
      reader.readAsDataURL(file);
    });
    try {
      const res = await api("/api/floorplan/image", { method: "PUT", body: { content_type: file.type, name: file.name, data } });
      // what the new image did: the nodes kept their place on the plan; the scale kept or to mark again
      const hint = document.getElementById("plan-hint");
      hint.textContent = `${res.upload.moved} node(s) kept their place on the new plan; ${res.upload.message}`;
      hint.hidden = false;
      await this.refresh();
      this.onChange && this.onChange();
    } catch (err) { this.planError(err); }
    document.getElementById("plan-file").value = "";
  }

  startScale() {
    this.setAdding(false);
    this.scaling = [];
    this.scaleLayer.clearLayers();
    document.getElementById("scale-form").hidden = true;
    document.getElementById("plan-hint").textContent = "click the first of two points whose distance you know";
    document.getElementById("plan-hint").hidden = false;
    document.getElementById("map").classList.add("picking");
  }

  markScalePoint(latlng) {
    const pos = this.positionOf(latlng);
    this.scaling.push([pos.x, pos.y]);
    L.circleMarker(latlng, { radius: 5, color: "#d1352b", weight: 2, fillOpacity: 1 }).addTo(this.scaleLayer);
    const hint = document.getElementById("plan-hint");
    if (this.scaling.length === 1) { hint.textContent = "click the second point"; return; }
    const [a, b] = this.scaling;
    L.polyline([this.latLngOf({ x: a[0], y: a[1] }), latlng], { color: "#d1352b", weight: 2, dashArray: "6 4" }).addTo(this.scaleLayer);
    hint.hidden = true;
    document.getElementById("map").classList.remove("picking");
    document.getElementById("scale-px").textContent = `${Math.hypot(b[0] - a[0], b[1] - a[1]).toFixed(1)} px apart`;
    document.getElementById("scale-form").hidden = false;
    document.getElementById("scale-distance").focus();
  }

  async saveScale(event) {
    event.preventDefault();
    const [a, b] = this.scaling || [];
    const raw = document.getElementById("scale-distance").value.trim();
    try {
      await api("/api/floorplan/scale", { method: "PUT", body: { a, b, distance_m: raw === "" ? null : Number(raw) } });
      this.planError(null);
      this.endScale();
      await this.refresh();
      this.onChange && this.onChange();
    } catch (err) { this.planError(err); }
  }

  endScale() {
    this.scaling = null;
    this.scaleLayer.clearLayers();
    document.getElementById("scale-form").hidden = true;
    document.getElementById("plan-hint").hidden = true;
    document.getElementById("map").classList.remove("picking");
  }

  drawPlan(plan) {
    this.plan = plan;
    const key = `${plan.image_url}|${plan.width_px}x${plan.height_px}`;
    const bounds = L.latLngBounds([0, 0], [plan.height_px, plan.width_px]);
    if (key !== this.planKey) {
      this.planKey = key;
      this.planLayer.clearLayers();
      if (plan.image_url) L.imageOverlay(plan.image_url, bounds, { className: "plan-image" }).addTo(this.planLayer);
      else L.rectangle(bounds, { color: "#9aa3af", weight: 1, fillColor: "#ffffff", fillOpacity: 1, interactive: false, className: "plan-sheet" }).addTo(this.planLayer);
      this.map.setMaxBounds(bounds.pad(0.5));
      this.map.fitBounds(bounds);
      for (const marker of this.markers.values()) marker.remove();
      this.markers.clear(); // positions depend on the plan's height
    }
    const scale = plan.metres_per_px;
    const cm = scale ? scale * 100 : null;
    document.getElementById("plan-info").textContent = (plan.image ? `${plan.image}, ` : "blank sheet (no image yet), ")
      + `${plan.width_px}×${plan.height_px} px · `
      + (scale ? `scale 1 px = ${cm >= 100 ? `${(cm / 100).toPrecision(3)} m` : `${cm.toPrecision(3)} cm`} (${plan.scale.distance_m} m marked)` : "scale not set");
    document.getElementById("view-map").dataset.scaled = scale ? "1" : "0";
    this.notice(scale ? null : "No scale yet: distances and link delays need one. Set scale, click two points on the plan and enter their distance in metres.");
  }

  // -- adding nodes -------------------------------------------------------------------------------------
  setAdding(on) {
    this.adding = on;
    this.toggle.classList.toggle("toggled", on);
    document.getElementById("add-hint").hidden = !on;
    document.getElementById("map").classList.toggle("picking", on);
  }

  clicked(latlng) {
    if (this.scaling) this.markScalePoint(latlng);
    else if (this.adding) this.openDialog(latlng);
  }

  openDialog(latlng) {
    this.form.reset();
    for (const e of this.form.querySelectorAll(".err")) e.textContent = "";
    const pos = this.positionOf(latlng);
    for (const [k, v] of Object.entries(pos)) this.form.elements[k].value = this.mode === "plan" ? v.toFixed(2) : v.toFixed(6);
    this.dialog.showModal();
  }

  async submit(event) {
    if (event.submitter && event.submitter.value === "cancel") return;
    event.preventDefault();
    const f = this.form.elements;
    const board = {};
    for (const key of ["model", "memory_mb", "cores", "max_mhz"]) {
      const v = f[`board.${key}`].value.trim();
      if (v) board[key] = key === "model" ? v : Number(v);
    }
    const keys = this.mode === "plan" ? ["x", "y"] : ["lat", "lon"];
    const body = { name: f.name.value.trim(), address: f.address.value.trim(), role: f.role.value, board };
    for (const k of keys) body[k] = Number(f[k].value);
    for (const e of this.form.querySelectorAll(".err")) e.textContent = "";
    try {
      await api("/api/nodes", { method: "POST", body });
      this.dialog.close();
      this.setAdding(false);
      await this.refresh();
      this.onChange && this.onChange();
    } catch (err) {
      const errors = err.errors.length ? err.errors : [{ path: "name", message: err.message }];
      for (const e of errors) {
        const slot = this.form.querySelector(`.err[data-for="${CSS.escape(e.path)}"]`) || this.form.querySelector('.err[data-for="name"]');
        slot.textContent = e.message;
      }
    }
  }

  icon(node) {
    const state = !node.probe ? "" : node.probe.ok ? "ok" : "bad";
    // DOM nodes, never an HTML string of data: Leaflet appends an HTMLElement as it is (stored XSS, issue 16)
    const html = el("div", {}, el("div"), el("span", {}, node.name));
    return L.divIcon({ className: `node-icon ${state} ${node.role}`, html, iconSize: [20, 20], iconAnchor: [10, 10] });
  }

  popup(node) {
    // an element with text nodes: board facts and probe details are data, never markup
    const p = node.probe;
    const board = boardText(node.board || {});
    const probe = !p ? "not probed yet" : `${p.answered}/${p.sent} answered (${p.method})` + (p.ok ? ` · ${p.rtt_ms.map((r) => r.toFixed(2)).join(" / ")} ms` : ` · last: ${p.detail}`);
    return el("div", { class: "node-popup" },
      el("b", {}, node.name), " ", el("small", {}, node.role), el("br"),
      node.address, node.inference_address ? ` · inference ${node.inference_address}` : "",
      board ? [el("br"), el("small", {}, board)] : null,
      el("br"), el("span", { class: "probe-text" }, probe));
  }

  async refresh() {
    if (this.dragging) return;
    const data = await api("/api/nodes");
    this.data = data;
    if (this.mode === "plan") this.drawPlan(data.map.plan);
    const seen = new Set();
    for (const node of data.nodes) {
      const at = this.latLngOf(node);
      if (!at) continue;
      seen.add(node.name);
      let marker = this.markers.get(node.name);
      if (!marker) {
        marker = L.marker(at, { draggable: data.editable, icon: this.icon(node), title: node.name, riseOnHover: true });
        marker.on("dragstart", () => { this.dragging = true; });
        marker.on("dragend", async () => {
          try { await api(`/api/nodes/${encodeURIComponent(node.name)}/position`, { method: "PATCH", body: this.positionOf(marker.getLatLng()) }); }
          finally { this.dragging = false; }
          await this.refresh();
          this.onChange && this.onChange();
        });
        marker.bindPopup("");
        marker.addTo(this.map);
        this.markers.set(node.name, marker);
      } else {
        marker.setLatLng(at);
      }
      marker.setIcon(this.icon(node));
      marker.getElement().dataset.node = node.name;
      marker.getElement().dataset.probe = !node.probe ? "none" : node.probe.ok ? "ok" : "bad";
      marker.setPopupContent(this.popup(node));
    }
    for (const [name, marker] of this.markers) if (!seen.has(name)) { marker.remove(); this.markers.delete(name); }
    this.drawLinks(data);
    this.fillTables(data);
    if (!this.fitted && seen.size && this.mode !== "plan") {
      this.fitted = true;
      const group = L.featureGroup([...this.markers.values()]);
      this.map.fitBounds(group.getBounds().pad(0.4), { maxZoom: 13 });
    }
  }

  drawLinks(data) {
    this.linkLayer.clearLayers();
    const pos = Object.fromEntries(data.nodes.map((n) => [n.name, this.latLngOf(n)]).filter(([, p]) => p));
    const role = Object.fromEntries(data.nodes.map((n) => [n.name, n.role]));
    const inForce = this.inForce();
    for (const link of data.links) {
      const edgeLink = role[link.a] === "edge" || role[link.b] === "edge";
      if (!pos[link.a] || !pos[link.b]) continue;
      const line = L.polyline([pos[link.a], pos[link.b]], { color: edgeLink ? "#2458c6" : "#7d8db3", weight: edgeLink ? 3 : 1.5, dashArray: edgeLink ? null : "4 4", opacity: 0.8, interactive: false });
      line.bindTooltip(this.delayText(link, role, inForce), { permanent: true, direction: "center", className: "link-label" });
      line.addTo(this.linkLayer);
      line.getTooltip().getElement().dataset.link = `${link.a}-${link.b}`;
      // a wider, invisible line over it takes the click: a 3 px line is hard to hit
      const hit = L.polyline([pos[link.a], pos[link.b]], { weight: 16, opacity: 0, className: "link-hit" });
      hit.on("click", (e) => {
        L.DomEvent.stopPropagation(e);
        if (this.scaling || this.adding) this.clicked(e.latlng); // marking a point or adding a node: the map's click
        else if (this.onLink) this.onLink(link, data.nodes);
      });
      hit.bindTooltip(`${link.a} ↔ ${link.b}: click to set delay, jitter, loss, rate`, { sticky: true });
      hit.addTo(this.linkLayer);
      hit.getElement().dataset.link = `${link.a}-${link.b}`;
    }
  }

  // The delay in force on a link, with where it comes from: what the scenario open in the editor says on
  // each shaped direction (typed, or a measured RTT written into it), else the distance rule's value (issue
  // 49, item 5: the map said 5.01 ms while the scenario said 12 ms).
  delayText(link, role, inForce) {
    const set = inForce(link, role);
    const rule = link.delay_ms === null || link.delay_ms === undefined ? "no delay (no rule)" : `${fmtMs(link.delay_ms)} rule`;
    if (!set.length) return rule;
    const text = (d) => (d.ms === null ? `no delay (${d.source})` : `${fmtMs(d.ms)} ${d.source}`);
    if (new Set(set.map(text)).size === 1) return text(set[0]);
    return set.map((d) => `${d.from}→${d.to} ${text(d)}`).join(" · ");
  }

  fillRule(data) {
    const rule = data.delay_rule || {};
    const form = document.getElementById("rule-form");
    document.getElementById("rule-text").textContent = rule.text || "";
    const plan = this.mode === "plan";
    document.getElementById("rule-per-unit").textContent = plan ? "m" : "km";
    if (form.contains(document.activeElement)) return; // never overwrite what is being typed
    form.elements.none.checked = !!rule.none;
    form.elements.base_ms.value = rule.none ? "" : String(rule.base_ms);
    form.elements.per.value = rule.none ? "" : String(+(rule.ms_per_m * (plan ? 1 : 1000)).toPrecision(6));
  }

  async saveRule() {
    const form = document.getElementById("rule-form");
    const plan = this.mode === "plan";
    const number = (v) => (v.trim() === "" ? null : Number(v));
    const per = number(form.elements.per.value);
    const body = form.elements.none.checked ? { none: true }
      : { base_ms: number(form.elements.base_ms.value), ms_per_m: per === null ? null : plan ? per : per / 1000 };
    const error = document.getElementById("rule-error");
    try {
      await api("/api/delay-rule", { method: "PUT", body });
      error.textContent = "";
      document.activeElement.blur();
      await this.refresh();
    } catch (err) {
      error.textContent = (err.errors || []).map((e) => `${e.path === "ms_per_m" ? `ms per ${plan ? "m" : "km"}` : e.path}: ${e.message}`).join("; ") || err.message;
    }
  }

  fillTables(data) {
    this.fillRule(data);
    const plan = this.mode === "plan";
    document.getElementById("inventory-info").textContent = `${data.editable ? "inventory" : "read-only inventory"} · probe: ${data.probe_method}`;
    const tbody = document.querySelector("#node-table tbody");
    tbody.replaceChildren(...data.nodes.map((n) => el("tr", { class: "clickable", dataset: { node: n.name }, onclick: () => {
      const m = this.markers.get(n.name); if (m) { this.map.panTo(m.getLatLng()); m.openPopup(); }
    } },
      el("td", {}, el("span", { class: `dot ${!n.probe ? "" : n.probe.ok ? "ok" : "bad"}` })),
      el("td", {}, n.name), el("td", {}, n.role), el("td", {}, n.address),
      el("td", { class: "small" }, n.probe ? `${n.probe.answered}/${n.probe.sent}` : "–"))));
    document.getElementById("link-distance-unit").textContent = plan ? "m" : "km";
    const role = Object.fromEntries(data.nodes.map((n) => [n.name, n.role]));
    const inForce = this.inForce();
    const links = document.querySelector("#link-table tbody");
    links.replaceChildren(...data.links.map((l) => el("tr", { dataset: { link: `${l.a}-${l.b}` } },
      el("td", {}, `${l.a} ↔ ${l.b}`), el("td", { class: "distance" }, plan ? l.m.toFixed(2) : l.km.toFixed(2)), el("td", { class: "latency" }, this.delayText(l, role, inForce)))));
  }
}
