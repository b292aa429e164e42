// A terminal in a sandbox: a pseudo-terminal relayed over a WebSocket
// (GET /v1/sandboxes/{id}/pty). Binary messages are terminal bytes both
// ways; text messages are JSON control messages.
import { BadRequest, GuestError, SandboxTimeout } from "./errors.js";
import type { TerminalExit } from "./models.js";
import { WebSocketClient } from "./ws.js";

export class Terminal implements AsyncIterable<Uint8Array> {
  private ws!: WebSocketClient;
  private listeners: Array<(data: Uint8Array) => void> = [];
  private queue: Uint8Array[] = [];
  private waiters: Array<() => void> = [];
  private closedMsg?: { reason?: string; message?: string };
  private exitInfo?: TerminalExit;
  /** Processes of the sandbox killed for memory since this terminal opened
   * (the server's `oom` message; 0 until one comes). A killed child of a
   * shell says nothing in the terminal itself. */
  oomKills = 0;
  private readonly done: Promise<TerminalExit>;
  private resolveDone!: (e: TerminalExit) => void;
  /** Client messages the server refused (`{type: "error", code, message}`). */
  readonly errors: Array<{ code: string; message: string }> = [];
  /** The window the terminal reported in its last resize answer. */
  size?: { cols: number; rows: number };
  // Every resize gets exactly one answer, in order: `resized`, or an error
  // (`resize_failed`, `invalid_resize`).
  private resizesSent = 0;
  private resizeAnswers: any[] = [];

  private constructor() {
    this.done = new Promise((r) => { this.resolveDone = r; });
  }

  /** @internal */
  static async open(url: string, headers: Record<string, string>, timeoutMs?: number): Promise<Terminal> {
    const t = new Terminal();
    t.ws = await WebSocketClient.connect(url, headers, {
      message: (kind, data) => t.onMessage(kind, data),
      close: (code, reason) => t.onClose(code, reason),
    }, timeoutMs);
    return t;
  }

  private onMessage(kind: "text" | "binary", data: Buffer): void {
    if (kind === "binary") {
      const bytes = new Uint8Array(data.buffer, data.byteOffset, data.length);
      if (this.listeners.length) for (const l of this.listeners) l(bytes);
      else this.queue.push(bytes);
      this.wake();
      return;
    }
    let msg: any;
    try { msg = JSON.parse(data.toString("utf8")); } catch { return; }
    if (msg?.type === "exit") this.exitInfo = {
      exitCode: msg.exit_code, reason: msg.reason ?? "exited", signal: msg.signal ?? null, oomKilled: msg.oom_killed ?? false,
    };
    else if (msg?.type === "oom") this.oomKills = msg.kills;
    else if (msg?.type === "closed") this.closedMsg = msg;
    else if (msg?.type === "error") {
      this.errors.push({ code: msg.code, message: msg.message });
      if (msg.code === "resize_failed" || msg.code === "invalid_resize") this.answer(msg);
    } else if (msg?.type === "resized") {
      this.size = { cols: msg.cols, rows: msg.rows };
      this.answer(msg);
    }
  }

  private answer(msg: any): void {
    this.resizeAnswers.push(msg);
    this.wake();
  }

  private onClose(code: number, reason: string): void {
    const exit = this.exitInfo
      ? { ...this.exitInfo, closeCode: code }
      : { exitCode: null, reason: this.closedMsg?.reason ?? (reason || "closed"), closeCode: code, message: this.closedMsg?.message };
    this.exitInfo = exit;
    this.resolveDone(exit);
    this.wake();
  }

  private wake(): void {
    const w = this.waiters;
    this.waiters = [];
    for (const f of w) f();
  }

  /** Set once the terminal has ended. */
  get exit(): TerminalExit | undefined {
    return this.ws.closed ? this.exitInfo : undefined;
  }

  /** Keystrokes or a paste (a string is sent as UTF-8). */
  write(data: string | Uint8Array): void {
    this.ws.sendBinary(typeof data === "string" ? Buffer.from(data, "utf8") : data);
  }

  /** A new window size; does not wait (see `resizeAndWait`). */
  resize(cols: number, rows: number): void {
    this.resizesSent++;
    this.ws.sendText(JSON.stringify({ type: "resize", cols, rows }));
  }

  /** A new window size, resolved once the guest answers that the terminal
   * reports it (then `size` is it). Rejects with GuestError if it did not
   * take, BadRequest if it was refused, SandboxTimeout if no answer came. */
  async resizeAndWait(cols: number, rows: number, timeoutMs = 10_000): Promise<void> {
    this.resize(cols, rows);
    const n = this.resizesSent;
    const deadline = Date.now() + timeoutMs;
    while (this.resizeAnswers.length < n) {
      const left = deadline - Date.now();
      if (left <= 0 || this.ws.closed) {
        throw new SandboxTimeout(`no answer to the resize to ${cols}x${rows} within ${timeoutMs} ms (errors so far: ${JSON.stringify(this.errors)})`);
      }
      await new Promise<void>((res) => {
        this.waiters.push(res);
        setTimeout(res, left).unref();
      });
    }
    const a = this.resizeAnswers[n - 1];
    if (a.type === "resized") return;
    if (a.code === "invalid_resize") throw new BadRequest(a.message ?? "invalid resize", { code: a.code });
    throw new GuestError(a.message ?? "the resize did not take", { code: a.code });
  }

  /** Calls `cb` with each piece of output (output that came before is
   * delivered first). Returns a function that removes the listener. */
  onData(cb: (data: Uint8Array) => void): () => void {
    this.listeners.push(cb);
    const q = this.queue;
    this.queue = [];
    for (const d of q) cb(d);
    return () => { this.listeners = this.listeners.filter((l) => l !== cb); };
  }

  /** The output that has come, waiting up to `timeoutMs` for some; an empty
   * array on timeout or once the terminal ended and everything was read. */
  async read(timeoutMs?: number): Promise<Uint8Array> {
    if (!this.queue.length && !this.ws.closed) {
      await new Promise<void>((res) => {
        this.waiters.push(res);
        if (timeoutMs !== undefined) setTimeout(res, timeoutMs).unref();
      });
    }
    const q = this.queue;
    this.queue = [];
    return q.length === 1 ? q[0]! : new Uint8Array(Buffer.concat(q));
  }

  private pending = "";

  /** Reads until `needle` appears in the output (decoded as UTF-8); returns
   * the text up to and including it. Rejects with SandboxTimeout otherwise. */
  async readUntil(needle: string, timeoutMs = 10_000): Promise<string> {
    const deadline = Date.now() + timeoutMs;
    const dec = new TextDecoder();
    let text = this.pending;
    while (!text.includes(needle)) {
      const left = deadline - Date.now();
      if (left <= 0 || (this.ws.closed && !this.queue.length)) {
        this.pending = text;
        throw new SandboxTimeout(`${JSON.stringify(needle)} did not appear in the terminal: ${JSON.stringify(text.slice(-500))}`);
      }
      text += dec.decode(await this.read(left), { stream: true });
    }
    const i = text.indexOf(needle) + needle.length;
    this.pending = text.slice(i);
    return text.slice(0, i);
  }

  /** The output as it comes, until the terminal ends. */
  async *[Symbol.asyncIterator](): AsyncIterator<Uint8Array> {
    for (;;) {
      const d = await this.read();
      if (d.length) yield d;
      else if (this.ws.closed && !this.queue.length) return;
    }
  }

  /** Resolves when the terminal ends (its program exits or the server closes it). */
  async wait(opts: { timeoutMs?: number } = {}): Promise<TerminalExit> {
    if (opts.timeoutMs === undefined) return this.done;
    let timer: NodeJS.Timeout | undefined;
    const t = new Promise<never>((_, rej) => {
      timer = setTimeout(() => rej(new SandboxTimeout(`the terminal did not end within ${opts.timeoutMs} ms`)), opts.timeoutMs);
    });
    try { return await Promise.race([this.done, t]); } finally { clearTimeout(timer); }
  }

  /** Ends the terminal and everything started in it. */
  async close(): Promise<void> {
    this.ws.close();
    await Promise.race([this.done, new Promise((r) => setTimeout(r, 5000).unref())]);
  }

  async [Symbol.asyncDispose](): Promise<void> {
    await this.close();
  }
}
