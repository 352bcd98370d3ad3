// The map of nodes: markers at their inventory coordinates, coloured by the last probe (green only when
// all three answered), draggable; a click in "add" mode opens the node dialog; every pair of nodes is
// a link labelled with its synthetic latency (5 ms + 1 ms per km, computed by the server).
import { api, el, fmtMs } from "./api.js";

const L = window.L;

export class NodeMap {
  constructor(config, onChange) {
    this.config = config;
    this.onChange = onChange;
    this.markers = new Map();
    this.lines = [];
    this.adding = false;
    this.dragging = false;
    this.map = L.map("map", { zoomControl: true, attributionControl: true }).setView(config.map_center, 12);
    L.control.scale({ metric: true, imperial: false }).addTo(this.map);
    if (config.tiles) {
      const layer = L.tileLayer(config.tiles, { maxZoom: 19, attribution: config.tiles_attribution });
      // no tiles reachable: the map keeps working on its plain background (with the scale bar)
      layer.on("tileerror", () => document.getElementById("map").classList.add("no-tiles"));
      layer.addTo(this.map);
    }
    this.linkLayer = L.layerGroup().addTo(this.map);
    this.map.on("click", (e) => this.adding && this.openDialog(e.latlng));
    this.toggle = document.getElementById("add-node-toggle");
    this.toggle.addEventListener("click", () => this.setAdding(!this.adding));
    this.dialog = document.getElementById("node-dialog");
    this.form = document.getElementById("node-form");
    this.form.addEventListener("submit", (e) => this.submit(e));
    this.fitted = false;
  }

  setAdding(on) {
    this.adding = on;
    this.toggle.classList.toggle("toggled", on);
    document.getElementById("add-hint").hidden = !on;
    document.getElementById("map").style.cursor = on ? "crosshair" : "";
  }

  openDialog(latlng) {
    this.form.reset();
    for (const e of this.form.querySelectorAll(".err")) e.textContent = "";
    this.form.elements.lat.value = latlng.lat.toFixed(6);
    this.form.elements.lon.value = latlng.lng.toFixed(6);
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
    const body = { name: f.name.value.trim(), address: f.address.value.trim(), role: f.role.value, lat: Number(f.lat.value), lon: Number(f.lon.value), board };
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
    const board = Object.entries(node.board || {}).map(([k, v]) => `${k}: ${v}`).join(", ");
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
    const seen = new Set();
    for (const node of data.nodes) {
      if (node.lat === null || node.lon === null) continue;
      seen.add(node.name);
      let marker = this.markers.get(node.name);
      if (!marker) {
        marker = L.marker([node.lat, node.lon], { draggable: data.editable, icon: this.icon(node), title: node.name, riseOnHover: true });
        marker.on("dragstart", () => { this.dragging = true; });
        marker.on("dragend", async () => {
          const pos = marker.getLatLng();
          try { await api(`/api/nodes/${encodeURIComponent(node.name)}/position`, { method: "PATCH", body: { lat: pos.lat, lng: pos.lng, lon: pos.lng } }); }
          finally { this.dragging = false; }
          await this.refresh();
          this.onChange && this.onChange();
        });
        marker.bindPopup("");
        marker.addTo(this.map);
        marker.getElement().dataset.node = node.name;
        this.markers.set(node.name, marker);
      } else {
        marker.setLatLng([node.lat, node.lon]);
      }
      marker.setIcon(this.icon(node));
      marker.getElement().dataset.node = node.name;
      marker.getElement().dataset.probe = !node.probe ? "none" : node.probe.ok ? "ok" : "bad";
      marker.setPopupContent(this.popup(node));
    }
    for (const [name, marker] of this.markers) if (!seen.has(name)) { marker.remove(); this.markers.delete(name); }
    this.drawLinks(data);
    this.fillTables(data);
    if (!this.fitted && seen.size) {
      this.fitted = true;
      const group = L.featureGroup([...this.markers.values()]);
      this.map.fitBounds(group.getBounds().pad(0.4), { maxZoom: 13 });
    }
  }

  drawLinks(data) {
    this.linkLayer.clearLayers();
    const pos = Object.fromEntries(data.nodes.filter((n) => n.lat !== null).map((n) => [n.name, [n.lat, n.lon]]));
    const role = Object.fromEntries(data.nodes.map((n) => [n.name, n.role]));
    for (const link of data.links) {
      const edgeLink = role[link.a] === "edge" || role[link.b] === "edge";
      const line = L.polyline([pos[link.a], pos[link.b]], { color: edgeLink ? "#2458c6" : "#7d8db3", weight: edgeLink ? 3 : 1.5, dashArray: edgeLink ? null : "4 4", opacity: 0.8 });
      line.bindTooltip(`${fmtMs(link.delay_ms)}`, { permanent: true, direction: "center", className: "link-label" });
      line.addTo(this.linkLayer);
    }
  }

  fillTables(data) {
    document.getElementById("inventory-info").textContent = `${data.editable ? "inventory" : "read-only inventory"} · probe: ${data.probe_method}`;
    const tbody = document.querySelector("#node-table tbody");
    tbody.replaceChildren(...data.nodes.map((n) => el("tr", { class: "clickable", dataset: { node: n.name }, onclick: () => {
      const m = this.markers.get(n.name); if (m) { this.map.panTo(m.getLatLng()); m.openPopup(); }
    } },
      el("td", {}, el("span", { class: `dot ${!n.probe ? "" : n.probe.ok ? "ok" : "bad"}` })),
      el("td", {}, n.name), el("td", {}, n.role), el("td", {}, n.address),
      el("td", { class: "small" }, n.probe ? `${n.probe.answered}/${n.probe.sent}` : "–"))));
    const links = document.querySelector("#link-table tbody");
    links.replaceChildren(...data.links.map((l) => el("tr", { dataset: { link: `${l.a}-${l.b}` } },
      el("td", {}, `${l.a} ↔ ${l.b}`), el("td", {}, l.km.toFixed(2)), el("td", { class: "latency" }, fmtMs(l.delay_ms)))));
  }
}
