// A minimal RFC 6455 WebSocket client over node:http's `upgrade` event (Node
// 20 has no global WebSocket): the client handshake with a checked
// Sec-WebSocket-Accept, masked client frames, text/binary/close/ping/pong
// and fragmented messages.
import { createHash, randomBytes } from "node:crypto";
import { request as httpRequest } from "node:http";
import { request as httpsRequest } from "node:https";
import type { Socket } from "node:net";
import { ConnectionFailed, HatcheryError, SandboxTimeout, errorFor } from "./errors.js";

const GUID = "258EAFA5-E914-47DA-95CA-C5AB0DC85B11";
const MAX_MESSAGE = 64 << 20;

export function acceptFor(key: string): string {
  return createHash("sha1").update(key + GUID).digest("base64");
}

export function mask(data: Uint8Array, key: Uint8Array): Buffer {
  const out = Buffer.allocUnsafe(data.length);
  for (let i = 0; i < data.length; i++) out[i] = data[i]! ^ key[i & 3]!;
  return out;
}

export function frame(opcode: number, payload: Uint8Array, fin = true): Buffer {
  const n = payload.length;
  const head: number[] = [(fin ? 0x80 : 0) | opcode];
  let ext = Buffer.alloc(0);
  if (n < 126) head.push(0x80 | n);
  else if (n < 65536) { head.push(0x80 | 126); ext = Buffer.alloc(2); ext.writeUInt16BE(n); }
  else { head.push(0x80 | 127); ext = Buffer.alloc(8); ext.writeBigUInt64BE(BigInt(n)); }
  const key = randomBytes(4);
  return Buffer.concat([Buffer.from(head), ext, key, mask(payload, key)]);
}

export interface WsHandlers {
  message(kind: "text" | "binary", data: Buffer): void;
  close(code: number, reason: string): void;
}

export class WebSocketClient {
  private buf = Buffer.alloc(0);
  private parts: Buffer[] = [];
  private kind = 0;
  private sentClose = false;
  closed = false;

  private constructor(private readonly socket: Socket, head: Buffer, private readonly h: WsHandlers) {
    socket.setNoDelay(true);
    socket.on("data", (d: Buffer) => this.feed(d));
    socket.on("close", () => this.finish(1006, "connection dropped"));
    socket.on("error", () => this.finish(1006, "connection error"));
    if (head.length) queueMicrotask(() => this.feed(head));
  }

  /** Connects (http(s):// or ws(s)://); a refused upgrade rejects with the typed error of its status. */
  static connect(url: string, headers: Record<string, string>, h: WsHandlers, timeoutMs = 30_000): Promise<WebSocketClient> {
    const u = new URL(url.replace(/^ws/, "http"));
    const key = randomBytes(16).toString("base64");
    const req = (u.protocol === "https:" ? httpsRequest : httpRequest)(u, {
      method: "GET",
      headers: { ...headers, Connection: "Upgrade", Upgrade: "websocket", "Sec-WebSocket-Key": key, "Sec-WebSocket-Version": "13" },
    });
    return new Promise((resolve, reject) => {
      const timer = setTimeout(() => { req.destroy(); reject(new SandboxTimeout(`websocket handshake timed out: ${u.pathname}`)); }, timeoutMs);
      req.on("upgrade", (res, socket, head) => {
        clearTimeout(timer);
        if (String(res.headers.upgrade ?? "").toLowerCase() !== "websocket" || res.headers["sec-websocket-accept"] !== acceptFor(key)) {
          socket.destroy();
          reject(new ConnectionFailed("websocket: bad handshake answer (Upgrade/Sec-WebSocket-Accept)"));
          return;
        }
        resolve(new WebSocketClient(socket, head, h));
      });
      req.on("response", (res) => {
        clearTimeout(timer);
        const chunks: Buffer[] = [];
        res.on("data", (c: Buffer) => chunks.push(c));
        res.on("end", () => {
          const text = Buffer.concat(chunks).toString("utf8");
          let code: string | undefined;
          let message = text.slice(0, 500) || `HTTP ${res.statusCode}`;
          try { const e = JSON.parse(text).error; code = e.code; message = e.message ?? message; } catch { /* not JSON */ }
          const ra = Number(res.headers["retry-after"]);
          const status = res.statusCode ?? 502;
          reject(status >= 400 ? errorFor(status, code, message, Number.isFinite(ra) ? ra : undefined)
            : new HatcheryError(`websocket upgrade answered ${status}`, { status }));
        });
      });
      req.on("error", (e) => { clearTimeout(timer); reject(new ConnectionFailed(`websocket ${u.host}: ${e.message}`)); });
      req.end();
    });
  }

  private write(opcode: number, payload: Uint8Array): void {
    if (this.closed) throw new ConnectionFailed("websocket is closed");
    this.socket.write(frame(opcode, payload));
  }

  sendBinary(data: Uint8Array): void {
    if (this.sentClose) throw new ConnectionFailed("websocket is closing");
    this.write(0x2, data);
  }

  sendText(text: string): void {
    if (this.sentClose) throw new ConnectionFailed("websocket is closing");
    this.write(0x1, Buffer.from(text, "utf8"));
  }

  ping(data: Uint8Array = new Uint8Array()): void {
    this.write(0x9, data);
  }

  /** Sends a close frame (once); the socket ends when the server answers (or after 5 s). */
  close(code = 1000, reason = ""): void {
    if (this.closed) return;
    if (!this.sentClose) {
      this.sentClose = true;
      const p = Buffer.alloc(2);
      p.writeUInt16BE(code);
      try { this.socket.write(frame(0x8, Buffer.concat([p, Buffer.from(reason, "utf8").subarray(0, 120)]))); } catch { /* gone */ }
    }
    setTimeout(() => this.socket.destroy(), 5000).unref();
  }

  private finish(code: number, reason: string): void {
    if (this.closed) return;
    this.closed = true;
    this.socket.destroy();
    this.h.close(code, reason);
  }

  private feed(d: Buffer): void {
    this.buf = this.buf.length ? Buffer.concat([this.buf, d]) : d;
    for (;;) {
      const b = this.buf;
      if (b.length < 2) return;
      const fin = (b[0]! & 0x80) !== 0;
      const op = b[0]! & 0x0f;
      let n = b[1]! & 0x7f;
      let off = 2;
      if (n === 126) { if (b.length < 4) return; n = b.readUInt16BE(2); off = 4; }
      else if (n === 127) { if (b.length < 10) return; n = Number(b.readBigUInt64BE(2)); off = 10; }
      if (n > MAX_MESSAGE) { this.close(1009, "message too big"); this.finish(1009, "message too big"); return; }
      const masked = (b[1]! & 0x80) !== 0;
      const keyAt = off;
      if (masked) off += 4;
      if (b.length < off + n) return;
      let payload = b.subarray(off, off + n);
      if (masked) payload = mask(payload, b.subarray(keyAt, keyAt + 4));
      this.buf = b.subarray(off + n);
      if (op === 0x9) { try { this.write(0xa, payload); } catch { /* closing */ } continue; }
      if (op === 0xa) continue;
      if (op === 0x8) {
        const code = payload.length >= 2 ? payload.readUInt16BE(0) : 1005;
        const reason = payload.subarray(2).toString("utf8");
        if (!this.sentClose) {
          this.sentClose = true;
          try { this.socket.write(frame(0x8, payload.subarray(0, 2))); } catch { /* gone */ }
        }
        this.socket.end();
        this.finish(code, reason);
        return;
      }
      if (op === 0x1 || op === 0x2) { this.kind = op; this.parts = [Buffer.from(payload)]; }
      else if (op === 0x0 && this.kind) this.parts.push(Buffer.from(payload));
      else { this.close(1002, "protocol error"); this.finish(1002, "protocol error"); return; }
      if (fin) {
        const msg = this.parts.length === 1 ? this.parts[0]! : Buffer.concat(this.parts);
        const kind = this.kind === 0x1 ? "text" : "binary";
        this.parts = [];
        this.kind = 0;
        this.h.message(kind, msg);
      }
    }
  }
}
