// The terminal: the merged, tagged output of every node, live over a WebSocket.
// Bounded (MAX_LINES kept, oldest dropped); a node filter; on a dropped connection it reconnects with
// the byte offset of the last line it received, so no line is lost or shown twice.
import { api, el, wsUrl } from "./api.js";

const MAX_LINES = 5000;

export class Terminal {
  constructor() {
    this.box = document.getElementById("term-lines");
    this.filter = document.getElementById("term-filter");
    this.status = document.getElementById("term-status");
    this.source = document.getElementById("term-source");
    this.follow = document.getElementById("term-follow");
    this.nodes = new Set();
    this.ws = null;
    this.footer = document.getElementById("terminal");
    this.filter.addEventListener("change", () => this.applyFilter());
    document.getElementById("term-clear").addEventListener("click", () => { this.box.replaceChildren(); this.sized(); });
    // Hide folds the terminal to its toolbar while it has output (the page gets the height back); Show unfolds
    const fold = document.getElementById("term-collapse");
    fold.addEventListener("click", () => {
      const folded = this.footer.classList.toggle("collapsed");
      fold.textContent = folded ? "Show" : "Hide";
      fold.setAttribute("aria-expanded", String(!folded));
      if (!folded && this.follow.checked) this.box.scrollTop = this.box.scrollHeight;
    });
    this.sized();
  }

  // an empty terminal collapses to its toolbar; it takes its share of the height once a line arrives
  sized() { this.footer.classList.toggle("empty", this.box.childElementCount === 0); }

  attach(path, label) {
    if (this.path === path && this.ws && this.ws.readyState <= 1) return;
    this.detach();
    this.path = path;
    this.offset = 0;
    this.ended = false;
    this.retry = 0;
    this.box.replaceChildren();
    this.sized();
    this.nodes.clear();
    for (const opt of [...this.filter.options].slice(1)) opt.remove();
    this.source.textContent = label || path;
    this.connect();
  }

  detach() {
    this.path = null;
    if (this.ws) { this.ws.onclose = null; this.ws.close(); this.ws = null; }
    clearTimeout(this.timer);
  }

  connect() {
    const path = this.path;
    const ws = new WebSocket(wsUrl(path, { offset: this.offset }));
    this.ws = ws;
    this.status.textContent = "connecting…";
    ws.onopen = () => { this.retry = 0; this.status.textContent = "live"; };
    ws.onmessage = (event) => {
      const msg = JSON.parse(event.data);
      if (msg.type === "hello" && msg.skipped_bytes) this.append({ n: "nnpm", s: "info", t: "", x: `… ${msg.skipped_bytes} bytes of earlier output skipped` });
      if (msg.type === "lines") {
        for (const line of msg.lines) this.append(line);
        this.offset = msg.offset;
      }
      if (msg.type === "end") { this.offset = msg.offset; this.ended = true; this.status.textContent = "finished"; }
    };
    ws.onclose = (event) => {
      if (this.ws !== ws || this.path !== path) return;
      this.ws = null;
      if (this.ended) return;
      // 4401 no token, 4403 foreign origin, 4404 no such run: retrying cannot help
      if (event.code >= 4400 && event.code < 4500) {
        this.status.textContent = `refused (${event.code}${event.reason ? `: ${event.reason}` : ""})`;
        return;
      }
      this.retry += 1;
      this.status.textContent = `reconnecting (${this.retry})…`;
      this.timer = setTimeout(() => this.path === path && this.connect(), Math.min(5000, 300 * this.retry));
    };
  }

  // for tests and for the reconnect button of a flaky network: drop the socket, resume from the offset
  dropConnection() { if (this.ws) this.ws.close(); }

  append(line) {
    if (line.n && !this.nodes.has(line.n)) {
      this.nodes.add(line.n);
      this.filter.append(el("option", { value: line.n }, line.n));
    }
    const shown = !this.filter.value || this.filter.value === line.n;
    const time = line.t ? line.t.slice(11, 23) : "";
    const row = el("div", { class: `l s-${line.s}${shown ? "" : " hidden"}`, dataset: { node: line.n, stream: line.s } },
      el("span", { class: "t" }, time), " ", el("span", { class: "n" }, line.n), " ", el("span", { class: "s" }, line.s), " ",
      el("span", { class: "x" }, line.x));
    this.box.append(row);
    while (this.box.childElementCount > MAX_LINES) this.box.firstElementChild.remove();
    if (this.footer.classList.contains("empty")) this.sized();
    if (this.follow.checked) this.box.scrollTop = this.box.scrollHeight;
  }

  applyFilter() {
    const node = this.filter.value;
    for (const row of this.box.children) row.classList.toggle("hidden", !!node && row.dataset.node !== node);
    if (this.follow.checked) this.box.scrollTop = this.box.scrollHeight;
  }

  // An action (a dry run, a runtime's check, install or maintenance action): its output followed here, its
  // state polled until it ends; render() is given each state seen, and the last is returned.
  async watch(action, render) {
    this.attach(`/api/actions/${action.id}/terminal`, action.title);
    for (;;) {
      const a = await api(`/api/actions/${action.id}`);
      render(a);
      if (a.state !== "running") return a;
      await new Promise((r) => setTimeout(r, 700));
    }
  }
}
