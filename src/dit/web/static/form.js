// A form generated from the scenario JSON Schema: a new schema block appears with no new UI code.
//
// Walks `properties` (fieldsets), resolves `$ref`, turns `enum` into selects, booleans into checkboxes,
// numbers into number inputs with min/max, arrays of scalars into comma-separated inputs, objects keyed
// by device (`patternProperties`) into one block per device of the scenario, open maps
// (`additionalProperties` with a schema, e.g. per-destination profiles) into key + sub-form rows, and
// anything else (unions of shapes, nested lists) into a JSON input. Every control carries the path the
// validator reports (`load.device2.mode`, `inference.partition_points`), so server errors land at the field.
import { el } from "./api.js";

const PLAIN = /^[A-Za-z0-9_<>?-]+$/;

export function renderPath(parts) {
  let out = "";
  for (const part of parts) {
    if (typeof part === "number") out += `[${part}]`;
    else if (PLAIN.test(part)) out += out ? `.${part}` : part;
    else out += `[${JSON.stringify(part)}]`;
  }
  return out;
}

// The unit of a number field, shown beside its input: the schema's own `x-unit` if it has one, else the
// unit its key ends in (`delay_ms`, `interval_s`, `loss_pct`, `cpu_freq_mhz`, `rate_mbit`, `memory_limit_mb`),
// as its description states it (MiB where the description says so).
const SUFFIX_UNITS = [[/_ms$/, "ms"], [/_s$/, "s"], [/_pct$/, "%"], [/_mhz$/, "MHz"], [/_khz$/, "kHz"],
  [/_mbit$/, "Mbit/s"], [/_bytes$/, "B"], [/_w$/, "W"], [/_c$/, "°C"]];

export function unitOf(key, sub, raw) {
  const explicit = (raw && raw["x-unit"]) || (sub && sub["x-unit"]);
  if (explicit) return explicit;
  if (typeof key !== "string") return "";
  const desc = (raw && raw.description) || (sub && sub.description) || "";
  if (/_mb$/.test(key)) return /MiB/.test(desc) ? "MiB" : "MB";
  const hit = SUFFIX_UNITS.find(([re]) => re.test(key));
  return hit ? hit[1] : "";
}

const isEmpty = (v) =>
  v === undefined || (typeof v === "object" && v !== null && !Array.isArray(v) && Object.keys(v).length === 0);

export class SchemaForm {
  constructor(root, schema) {
    this.root = root;
    this.schema = schema;
    this.defs = schema.$defs || {};
    this.readers = null;
    this.onDevicesChange = [];
  }

  deref(node) {
    let n = node || {};
    for (let i = 0; n.$ref && i < 20; i++) n = this.defs[n.$ref.split("/").pop()] || {};
    return n;
  }

  render(value = {}) {
    this.root.replaceChildren();
    this.onDevicesChange = [];
    this.devices = Array.isArray(value.devices) ? value.devices.filter((d) => typeof d === "string") : [];
    const top = this.objectBody(this.schema, value, [], true);
    this.root.append(...top.nodes);
    this.readTop = top.read;
  }

  // The form's value and the errors of what cannot be read (e.g. letters in a number list). It only reads:
  // the errors shown stay until showErrors or clearErrors changes them, so a reader that is not a submission
  // (the map's 2-second redraw of the delays in force, the link panel) never wipes a submission's errors.
  read() {
    this.inputErrors = [];
    const value = this.readTop();
    return { value: value || {}, errors: this.inputErrors };
  }

  // -- builders: each returns {node(s), read() -> value | undefined} ------------------------------

  objectBody(schema, value, path, top = false) {
    const nodes = [];
    const readers = [];
    const props = schema.properties || {};
    const required = new Set(schema.required || []);
    const scalars = [];
    const blocks = [];
    for (const [key, raw] of Object.entries(props)) {
      const sub = this.deref(raw);
      const isBlock = this.isBlock(sub);
      (isBlock ? blocks : scalars).push([key, raw, sub]);
    }
    for (const [key, raw, sub] of [...scalars, ...blocks]) {
      const built = this.build(sub, raw, value ? value[key] : undefined, [...path, key], required.has(key), key);
      nodes.push(built.node);
      readers.push([key, built.read]);
    }
    const chosen = this.variantBlock(schema, value, path, nodes, readers);
    if (chosen) { nodes.push(chosen.node); readers.push([null, chosen.read]); }
    if (schema.patternProperties) {
      const [pattern, raw] = Object.entries(schema.patternProperties)[0];
      const built = this.perDevice(this.deref(raw), value, path, new RegExp(pattern));
      nodes.push(built.node);
      readers.push([null, built.read]);
    } else if (schema.additionalProperties && typeof schema.additionalProperties === "object") {
      const built = this.openMap(this.deref(schema.additionalProperties), value, path);
      nodes.push(built.node);
      readers.push([null, built.read]);
    }
    const read = () => {
      const out = {};
      for (const [key, r] of readers) {
        const v = r();
        if (key === null) Object.assign(out, v || {});
        // an empty block is kept only where the document had it (top level): `runtime: {}` is not added
        else if (v !== undefined && !(isEmpty(v) && !(top && value && key in value))) out[key] = v;
      }
      return out;
    };
    return { nodes, read };
  }

  // A block whose fields depend on its `name` (the runtime block: `allOf` of `if name = X then X's block`):
  // the chosen name's fields, rendered again from that branch's schema whenever the name changes.
  variantBlock(schema, value, path, nodes, readers) {
    const props = schema.properties || {};
    const branches = (schema.allOf || []).map((rule) => {
      const name = rule.if && rule.if.properties && rule.if.properties.name && rule.if.properties.name.const;
      return name !== undefined && rule.then ? [name, this.deref(rule.then)] : null;
    }).filter(Boolean);
    const at = readers.findIndex(([key]) => key === "name");
    if (!branches.length || !props.name || at < 0) return null;
    const readName = readers[at][1];
    const fallback = this.deref(props.name).default;
    const box = el("div", { class: "variant", dataset: { variantOf: renderPath(path) } });
    let body = { read: () => ({}) };
    const show = (name, v) => {
      const branch = branches.find(([n]) => n === name);
      box.dataset.variant = name || "";
      if (!branch) { box.replaceChildren(); body = { read: () => ({}) }; return; }
      const own = Object.fromEntries(Object.entries(branch[1].properties || {}).filter(([k]) => k !== "name"));
      body = this.objectBody({ ...branch[1], properties: own, allOf: undefined }, v || {}, path);
      box.replaceChildren(...(body.nodes.length ? body.nodes : [el("p", { class: "small" }, `${name} has no fields of its own`)]));
    };
    show((value && value.name) || fallback, value);
    const select = nodes[at].querySelector("select, input");
    if (select) select.addEventListener("change", () => show(readName() ?? fallback, {}));
    return { node: box, read: () => body.read() };
  }

  isBlock(sub) {
    return sub.type === "object" && (sub.properties || sub.patternProperties || typeof sub.additionalProperties === "object");
  }

  label(key, sub, raw) {
    const title = sub.title || raw.title || key;
    const desc = raw.description || sub.description;
    return el("label", { title: desc || "" }, title, key !== title ? el("span", { class: "desc" }, key) : null);
  }

  field(path, labelNode, control, extra) {
    const error = el("span", { class: "field-error" });
    const wrap = el("div", { class: "field", dataset: { path: renderPath(path) } }, labelNode, el("div", {}, control, extra, error));
    return wrap;
  }

  build(sub, raw, value, path, required, key) {
    const anyOf = sub.anyOf || sub.oneOf;
    if (anyOf) {
      const objectBranch = anyOf.map((b) => this.deref(b)).find((b) => b.type === "object" && b.properties);
      const stringBranch = anyOf.map((b) => this.deref(b)).find((b) => b.type === "string");
      if (objectBranch && stringBranch) {
        // a name or an object with a name (e.g. model): the object's form, written back as the name alone
        const obj = typeof value === "string" ? { name: value } : value || {};
        const built = this.fieldset(objectBranch, raw, obj, path, key);
        return {
          node: built.node,
          read: () => {
            const v = built.read();
            if (v && Object.keys(v).length === 1 && typeof v.name === "string") return v.name;
            return v;
          },
        };
      }
      return this.jsonField(sub, raw, value, path, key);
    }
    if (sub.enum) return this.enumField(sub, raw, value, path, required, key);
    switch (sub.type) {
      case "object":
        if (this.isBlock(sub)) return this.fieldset(sub, raw, value || {}, path, key);
        return this.jsonField(sub, raw, value, path, key);
      case "boolean":
        return this.boolField(sub, raw, value, path, key);
      case "integer":
      case "number":
        return this.numberField(sub, raw, value, path, key);
      case "string":
        return this.stringField(sub, raw, value, path, key);
      case "array": {
        const items = this.deref(sub.items || {});
        if (["string", "integer", "number"].includes(items.type) && !items.anyOf) return this.listField(sub, items, raw, value, path, key);
        return this.jsonField(sub, raw, value, path, key);
      }
      default:
        return this.jsonField(sub, raw, value, path, key);
    }
  }

  fieldset(sub, raw, value, path, key) {
    const body = this.objectBody(sub, value, path);
    const title = sub.title || raw.title || key;
    const node = el("fieldset", { dataset: { path: renderPath(path) } }, el("legend", { title: raw.description || sub.description || "" }, title),
      el("span", { class: "field-error" }), ...body.nodes);
    return { node, read: body.read };
  }

  enumField(sub, raw, value, path, required, key) {
    const def = sub.default ?? raw.default;
    const select = el("select", { name: renderPath(path) },
      el("option", { value: "" }, def !== undefined ? `(default: ${def})` : required ? "(choose)" : "(none)"),
      ...sub.enum.map((v) => el("option", { value: String(v), selected: value === v }, String(v))));
    return { node: this.field(path, this.label(key, sub, raw), select), read: () => (select.value === "" ? undefined : sub.enum.find((v) => String(v) === select.value)) };
  }

  boolField(sub, raw, value, path, key) {
    const def = sub.default ?? raw.default ?? false;
    const box = el("input", { type: "checkbox", name: renderPath(path), checked: value ?? def });
    // an untouched default stays unwritten: the saved document is what the user wrote, so its hash is
    // the CLI's for the same file (issue 36)
    return { node: this.field(path, this.label(key, sub, raw), box), read: () => (value === undefined && box.checked === def ? undefined : box.checked) };
  }

  numberField(sub, raw, value, path, key) {
    const def = sub.default ?? raw.default;
    const input = el("input", {
      type: "number", name: renderPath(path), value: value ?? "", step: sub.type === "integer" ? "1" : "any",
      min: sub.minimum ?? sub.exclusiveMinimum, max: sub.maximum ?? sub.exclusiveMaximum,
      placeholder: def !== undefined ? String(def) : "",
    });
    // A number input the browser cannot parse ("2e") reads as "": without this check the field would be
    // dropped and the default saved in its place, silently (issue 36). It is an error at the field.
    const read = () => {
      const text = input.value.trim();
      if (input.validity && input.validity.badInput) {
        this.inputErrors.push({ path: renderPath(path), message: `is not a number: write ${sub.type === "integer" ? "a whole number, e.g. 5" : "a number, e.g. 5, 2.5 or 2e3"}` });
        return undefined;
      }
      if (text === "") return undefined;
      const n = Number(text);
      if (!Number.isFinite(n)) {
        this.inputErrors.push({ path: renderPath(path), message: `${JSON.stringify(text)} is not a number` });
        return undefined;
      }
      if (sub.type === "integer" && !Number.isInteger(n)) {
        this.inputErrors.push({ path: renderPath(path), message: `${text} is not a whole number` });
        return undefined;
      }
      return n;
    };
    const unit = unitOf(key, sub, raw);
    const unitNode = unit ? el("span", { class: "unit", title: (raw.description || sub.description || "") }, unit) : null;
    return { node: this.field(path, this.label(key, sub, raw), input, unitNode), read };
  }

  stringField(sub, raw, value, path, key) {
    const def = sub.default ?? raw.default;
    const input = el("input", { type: "text", name: renderPath(path), value: value ?? "", placeholder: def ?? "", size: key === "description" ? 60 : 24 });
    return { node: this.field(path, this.label(key, sub, raw), input), read: () => (input.value === "" ? undefined : input.value) };
  }

  listField(sub, items, raw, value, path, key) {
    const input = el("input", { type: "text", name: renderPath(path), value: Array.isArray(value) ? value.join(", ") : "", size: 40, placeholder: "comma-separated" });
    const read = () => {
      const parts = input.value.split(",").map((s) => s.trim()).filter((s) => s !== "");
      if (!parts.length) return undefined;
      if (items.type === "string") return parts;
      const bad = parts.filter((p) => !Number.isFinite(Number(p)) || (items.type === "integer" && !Number.isInteger(Number(p))));
      if (bad.length) {
        this.inputErrors.push({ path: renderPath(path), message: `${bad.join(", ")}: not ${items.type === "integer" ? "whole numbers" : "numbers"} (write e.g. 1, 2, 3)` });
        return undefined;
      }
      return parts.map(Number);
    };
    if (path.length === 1 && key === "devices") {
      input.addEventListener("change", () => {
        this.devices = read() || [];
        for (const fn of this.onDevicesChange) fn(this.devices);
      });
    }
    return { node: this.field(path, this.label(key, sub, raw), input), read };
  }

  jsonField(sub, raw, value, path, key) {
    const text = value === undefined ? "" : JSON.stringify(value);
    const area = el("input", { type: "text", name: renderPath(path), value: text, size: 50, placeholder: "JSON" , class: "json" });
    const read = () => {
      const t = area.value.trim();
      if (!t) return undefined;
      try { return JSON.parse(t); } catch {
        this.inputErrors.push({ path: renderPath(path), message: "is not valid JSON" });
        return undefined;
      }
    };
    const hint = sub.anyOf ? el("span", { class: "desc" }, sub.anyOf.map((b) => this.deref(b).title || this.deref(b).type || "").filter(Boolean).join(" or ")) : null;
    return { node: this.field(path, this.label(key, sub, raw), area, hint), read };
  }

  // objects keyed by device name: one block per device of the scenario
  perDevice(sub, value, path, pattern) {
    const container = el("div", { class: "device-blocks" });
    let built = {};
    const current = { ...(value || {}) };
    const draw = (devices) => {
      for (const [dev, b] of Object.entries(built)) { const v = b.read(); if (v !== undefined) current[dev] = v; else delete current[dev]; }
      container.replaceChildren();
      built = {};
      const names = [...new Set([...devices, ...Object.keys(current)])].filter((d) => pattern.test(d));
      if (!names.length) container.append(el("p", { class: "small" }, "(list the devices above to set this per device)"));
      for (const dev of names) {
        const body = this.objectBody(sub, current[dev] || {}, [...path, dev]);
        const node = el("fieldset", { dataset: { path: renderPath([...path, dev]) } }, el("legend", {}, dev), el("span", { class: "field-error" }), ...body.nodes);
        container.append(node);
        built[dev] = { read: () => { const v = body.read(); return isEmpty(v) ? undefined : v; } };
      }
    };
    draw(this.devices);
    this.onDevicesChange.push(draw);
    return { node: container, read: () => {
      const out = {};
      for (const [dev, b] of Object.entries(built)) { const v = b.read(); if (v !== undefined) out[dev] = v; }
      return out;
    } };
  }

  // open maps (e.g. destinations: peer -> netem profile): key + sub-form rows
  openMap(sub, value, path) {
    const rows = el("div", {});
    const entries = [];
    const add = (key, v) => {
      const keyInput = el("input", { type: "text", value: key || "", placeholder: "key", size: 14, class: "map-key" });
      const holder = el("div", { class: "grow" });  // a class, not a style attribute: CSP allows no inline style
      let body = this.objectBody(sub, v || {}, [...path, key || "?"]);
      holder.append(...body.nodes);
      keyInput.addEventListener("change", () => {
        const cur = body.read();
        body = this.objectBody(sub, cur, [...path, keyInput.value || "?"]);
        holder.replaceChildren(...body.nodes);
        entry.body = body;
      });
      const entry = { keyInput, body };
      const row = el("div", { class: "kv-row" }, keyInput, holder, el("button", { type: "button", onclick: () => { row.remove(); entries.splice(entries.indexOf(entry), 1); } }, "×"));
      entries.push(entry);
      rows.append(row);
    };
    for (const [k, v] of Object.entries(value || {})) add(k, v);
    const node = el("div", { class: "map" }, rows, el("button", { type: "button", onclick: () => add("", {}) }, "+ add"));
    return { node, read: () => {
      const out = {};
      for (const e of entries) { const k = e.keyInput.value.trim(); if (k) out[k] = e.body.read(); }
      return out;
    } };
  }

  // -- errors -------------------------------------------------------------------------------------
  clearErrors() {
    for (const n of this.root.querySelectorAll(".invalid")) n.classList.remove("invalid");
    for (const n of this.root.querySelectorAll(".field-error")) n.textContent = "";
  }

  // Every error at its field (red, with its message); nothing scrolls. Returns each error with the element
  // it was placed at (null when no field holds its path), for a list of links to the fields.
  showErrors(errors) {
    this.clearErrors();
    const placed = [];
    for (const error of errors) {
      let path = error.path;
      let target = null;
      while (path) {
        target = this.root.querySelector(`[data-path="${CSS.escape(path)}"]`);
        if (target) break;
        const cut = Math.max(path.lastIndexOf("."), path.lastIndexOf("["));
        if (cut <= 0) break;
        path = path.slice(0, cut);
      }
      placed.push({ error, target });
      if (!target) continue;
      target.classList.add("invalid");
      const slot = target.querySelector(":scope > div > .field-error") || target.querySelector(":scope > .field-error");
      const where = error.path !== path ? `${error.path.slice(path.length).replace(/^\./, "")}: ` : "";
      if (slot) slot.textContent = (slot.textContent ? slot.textContent + "; " : "") + where + error.message;
    }
    return placed;
  }

  // Scroll to the field of `target` (a .field or fieldset) and focus its first control.
  reveal(target) {
    target.scrollIntoView({ block: "center" });
    const control = target.querySelector("input, select, textarea");
    if (control) control.focus({ preventScroll: true });
  }
}
