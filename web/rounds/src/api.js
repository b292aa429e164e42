// The rounds API as the pages use it: a capability token from the URL
// fragment (never sent to a server by the browser) as the Bearer, never
// the API key.
export function grant() {
  const token = decodeURIComponent(location.hash.replace(/^#/, ""));
  const q = new URLSearchParams(location.search);
  return { token, round: q.get("round") || "", session: q.get("session") || "" };
}

export async function call(token, method, path, body) {
  const opts = { method, headers: { Authorization: `Bearer ${token}` } };
  if (body !== undefined) {
    opts.headers["Content-Type"] = "application/json";
    opts.body = JSON.stringify(body);
  }
  const r = await fetch(path, opts);
  const text = await r.text();
  let data = null;
  try {
    data = text ? JSON.parse(text) : null;
  } catch (_) {
    data = null;
  }
  if (!r.ok) {
    const e = new Error((data && data.error && data.error.message) || `${r.status}`);
    e.code = data && data.error && data.error.code;
    e.status = r.status;
    throw e;
  }
  return data;
}

// POST with an SSE answer, read with fetch (EventSource cannot send a
// header). Calls onEvent(name, data) for each event.
export async function stream(token, path, body, onEvent) {
  const r = await fetch(path, {
    method: "POST",
    headers: { Authorization: `Bearer ${token}`, "Content-Type": "application/json" },
    body: JSON.stringify(body),
  });
  if (!r.ok) {
    const data = await r.json().catch(() => null);
    const e = new Error((data && data.error && data.error.message) || `${r.status}`);
    e.code = data && data.error && data.error.code;
    throw e;
  }
  const reader = r.body.getReader();
  const dec = new TextDecoder();
  let buf = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) break;
    buf += dec.decode(value, { stream: true });
    let i;
    while ((i = buf.indexOf("\n\n")) >= 0) {
      const block = buf.slice(0, i);
      buf = buf.slice(i + 2);
      let ev = "message";
      const data = [];
      for (const line of block.split("\n")) {
        if (line.startsWith("event:")) ev = line.slice(6).trim();
        else if (line.startsWith("data:")) data.push(line.slice(5).replace(/^ /, ""));
      }
      if (data.length) onEvent(ev, JSON.parse(data.join("\n")));
    }
  }
}

export function el(tag, attrs, ...kids) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (k === "class") e.className = v;
    else if (k.startsWith("on")) e.addEventListener(k.slice(2), v);
    else e.setAttribute(k, v);
  }
  for (const k of kids) e.append(k);
  return e;
}
