// Calls to the gateway: the API key, error messages as the server sent them, and SSE parsing.
// Every URL is relative, so the page works from whatever host and path the gateway is reached at.

const KEY = "sluice.apiKey";

export function apiKey() {
  return sessionStorage.getItem(KEY) || "";
}

export function setApiKey(key) {
  if (key) sessionStorage.setItem(KEY, key);
  else sessionStorage.removeItem(KEY);
}

// Raised for a non-2xx answer or an in-stream error event; `message` is the server's own.
export class ApiError extends Error {
  constructor(message, status, body) {
    super(message);
    this.status = status;
    this.body = body;
  }
}

const listeners = new Set();
// Called with the ApiError of every 401, so the page can ask for a key.
export function onUnauthorized(fn) {
  listeners.add(fn);
}

export function headers(extra = {}) {
  const h = { "content-type": "application/json", ...extra };
  const key = apiKey();
  if (key) h.authorization = "Bearer " + key;
  return h;
}

// The message of an error body: OpenAI's {"error": {"message"}} or KServe's {"error": "..."}.
export function errorMessage(body, fallback) {
  if (body && typeof body === "object") {
    const e = body.error;
    if (typeof e === "string" && e) return e;
    if (e && typeof e === "object" && typeof e.message === "string" && e.message) return e.message;
    if (typeof body.detail === "string" && body.detail) return body.detail;
  }
  return fallback;
}

async function failure(resp) {
  const text = await resp.text();
  let body = null;
  try {
    body = JSON.parse(text);
  } catch {
    // not JSON: the text itself is the message
  }
  const err = new ApiError(errorMessage(body, text || `${resp.status} ${resp.statusText}`), resp.status, body);
  if (resp.status === 401) for (const fn of listeners) fn(err);
  return err;
}

// fetch(path) with the key; resolves to the Response when it is 2xx, else throws ApiError.
export async function call(path, init = {}) {
  const resp = await fetch(path, { ...init, headers: headers(init.headers) });
  if (!resp.ok) throw await failure(resp);
  return resp;
}

export async function getJSON(path) {
  return (await call(path)).json();
}

export async function postJSON(path, body, init = {}) {
  return (await call(path, { ...init, method: "POST", body: JSON.stringify(body) })).json();
}

// Server-sent events of a fetch Response, as one array of `data` payloads per network read,
// so a caller can render once per read. Comment lines (": ping") are skipped.
export async function* sseBatches(resp) {
  const reader = resp.body.pipeThrough(new TextDecoderStream()).getReader();
  let pending = "";
  let data = [];
  let finished = false;
  try {
    for (;;) {
      const { value, done } = await reader.read();
      if (done) {
        finished = true;
        break;
      }
      pending += value;
      const lines = pending.split(/\r\n|\r|\n/);
      pending = lines.pop();
      const batch = [];
      for (const line of lines) {
        if (line === "") {
          if (data.length) batch.push(data.join("\n"));
          data = [];
        } else if (line.startsWith("data:")) {
          data.push(line.slice(line.startsWith("data: ") ? 6 : 5));
        }
      }
      if (batch.length) yield batch;
    }
    if (data.length) yield [data.join("\n")];
  } finally {
    // A consumer that stops early (or an abort) must not leave the response open.
    if (!finished) reader.cancel().catch(() => {});
  }
}
