// Small helpers shared by the page's modules: JSON requests with the NNPM token, WebSocket URLs.
const params = new URLSearchParams(location.search);
if (params.get("token")) sessionStorage.setItem("nnpm-token", params.get("token"));
const token = () => sessionStorage.getItem("nnpm-token");

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
  if (token()) headers["X-NNPM-Token"] = token();
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
  if (token()) url.searchParams.set("token", token());
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
