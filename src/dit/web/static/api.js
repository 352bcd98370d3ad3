// Small helpers shared by the page's modules: JSON requests, WebSocket URLs.
// The page is opened as /?token=…; that answer set the token as an HttpOnly cookie, which every request
// and WebSocket of the page then carries. No script reads the token: it leaves the address bar (and the
// history, and any Referer) here.
const params = new URLSearchParams(location.search);
if (params.has("token")) {
  params.delete("token");
  const rest = params.toString();
  history.replaceState(history.state, "", location.pathname + (rest ? `?${rest}` : "") + location.hash);
}

export class ApiError extends Error {
  constructor(status, body) {
    super((body && body.detail) || `HTTP ${status}`);
    this.status = status;
    this.body = body || {};
    this.errors = (body && body.errors) || [];
  }
}

export async function api(path, { method = "GET", body } = {}) {
  const headers = {};
  if (body !== undefined) headers["Content-Type"] = "application/json";
  const response = await fetch(path, { method, headers, body: body === undefined ? undefined : JSON.stringify(body) });
  const text = await response.text();
  let data = null;
  try { data = text ? JSON.parse(text) : null; } catch { data = { detail: text }; }
  if (!response.ok) throw new ApiError(response.status, data);
  return data;
}

export function wsUrl(path, query = {}) {
  const url = new URL(path, location.href);
  url.protocol = location.protocol === "https:" ? "wss:" : "ws:";
  for (const [k, v] of Object.entries(query)) if (v !== undefined && v !== null) url.searchParams.set(k, v);
  return url.toString();
}

export function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (v === undefined || v === null || v === false) continue;
    if (k === "class") node.className = v;
    else if (k === "text") node.textContent = v;
    else if (k.startsWith("on")) node.addEventListener(k.slice(2), v);
    else if (k === "dataset") Object.assign(node.dataset, v);
    else node.setAttribute(k, v === true ? "" : v);
  }
  for (const child of children.flat()) {
    if (child === undefined || child === null || child === false) continue;
    node.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return node;
}

export const fmtMs = (ms) => (ms === null || ms === undefined ? "" : `${Number(ms).toFixed(ms < 10 ? 2 : 1)} ms`);
export const short = (hash) => (hash ? hash.slice(0, 12) : "");

// A number with its unit, readable: durations (ns, µs, ms, s), energy (J, mJ, µJ) and sizes (B, kB, MB, GB)
// are scaled to the largest unit in which they are at least 1 (1234567 ns -> "1.23 ms"); other units
// are kept. Integers without a unit stay as they are.
const FAMILIES = [
  { ns: 1, us: 1e3, "µs": 1e3, ms: 1e6, s: 1e9, order: ["s", "ms", "µs", "ns"] },
  { J: 1, mJ: 1e-3, uJ: 1e-6, "µJ": 1e-6, order: ["J", "mJ", "µJ"] },
  { B: 1, kB: 1e3, MB: 1e6, GB: 1e9, order: ["GB", "MB", "kB", "B"] },
];

export function fmtNumber(x) {
  if (Number.isInteger(x) && Math.abs(x) < 1e15) return String(x);
  const a = Math.abs(x);
  if (a >= 1e6 || (a > 0 && a < 1e-3)) return x.toExponential(2);
  return x.toFixed(a >= 100 ? 1 : a >= 10 ? 2 : 3).replace(/(\.\d*?)0+$/, "$1").replace(/\.$/, "");
}

export function fmtQuantity(value, unit = "") {
  if (value === null || value === undefined) return "–";
  if (typeof value !== "number" || !Number.isFinite(value)) return unit ? `${value} ${unit}` : String(value);
  const family = FAMILIES.find((f) => unit in f && unit !== "order");
  if (family) {
    const base = value * family[unit];
    const target = family.order.find((u) => Math.abs(base) >= family[u]) || family.order[family.order.length - 1];
    const scaled = base / family[target];
    return `${fmtNumber(Number.isInteger(scaled) ? scaled : Number(scaled.toPrecision(4)))} ${target}`;
  }
  if (unit === "%") return `${fmtNumber(value)} %`;
  return unit ? `${fmtNumber(value)} ${unit}` : fmtNumber(value);
}

// A variant of a sweep run as one unit (docs/sweeps.md): its place in the sweep and, while it goes, the ETA.
export function sweepText(r) {
  const sw = r.sweep;
  if (!sw || !sw.variant || !sw.total) return "";
  const eta = sw.state === "running" && sw.eta_s !== null && sw.eta_s !== undefined
    ? ` · ETA ${sw.eta_s >= 90 ? `${Math.round(sw.eta_s / 60)} min` : `${Math.round(sw.eta_s)} s`}` : "";
  return `variant ${sw.variant} of ${sw.total}${eta}`;
}
