// HTTP over Node's built-in fetch (undici keeps connections alive and reuses
// them), with typed errors and retries only where a retry cannot do
// something twice.
import { readFileSync } from "node:fs";
import { ConnectionFailed, HatcheryError, type LostDetail, SandboxTimeout, StreamError, errorFor } from "./errors.js";

export const DEFAULT_URL = "http://127.0.0.1:7423";
export const DEFAULT_KEY_FILE = "/var/lib/hatchery/api_key";
const LOCAL_HOSTS = new Set(["127.0.0.1", "localhost", "[::1]", "::1"]);
const MAX_RETRY_SLEEP_MS = 10_000;
const USER_AGENT = "hatchery-typescript/0.1.0";

export interface ClientOptions {
  /** Default: HATCHERY_URL, else http://127.0.0.1:7423. */
  url?: string;
  /** Default: HATCHERY_API_KEY, else (for a daemon on this machine) the key file. */
  apiKey?: string;
  /** Default: HATCHERY_KEY_FILE, else /var/lib/hatchery/api_key. */
  keyFile?: string;
  /** Per-request timeout in milliseconds (exec calls add their own deadline). Default 60000. */
  timeoutMs?: number;
  /** Retries of 429/503 with Retry-After and of failed idempotent calls. Default 2. */
  maxRetries?: number;
}

export function resolveUrl(url?: string): string {
  return (url || process.env.HATCHERY_URL || DEFAULT_URL).replace(/\/+$/, "");
}

/** The key file is only read for a daemon on this machine: it is the one
 * hatcheryd writes into its data directory. */
export function resolveKey(apiKey: string | undefined, url: string, keyFile?: string): string | undefined {
  const key = apiKey || process.env.HATCHERY_API_KEY;
  if (key) return key;
  if (!LOCAL_HOSTS.has(new URL(url).hostname)) return undefined;
  try {
    return readFileSync(keyFile || process.env.HATCHERY_KEY_FILE || DEFAULT_KEY_FILE, "utf8").trim() || undefined;
  } catch {
    return undefined;
  }
}

export type Query = Array<[string, string]>;

export interface RequestOptions {
  query?: Query;
  json?: unknown;
  body?: Uint8Array;
  headers?: Record<string, string>;
  timeoutMs?: number;
  idempotent?: boolean;
}

function retryAfter(h: Headers): number | undefined {
  const v = h.get("retry-after");
  if (v === null) return undefined;
  const n = Number(v);
  return Number.isFinite(n) ? n : undefined;
}

async function errorFrom(r: Response): Promise<HatcheryError> {
  const text = await r.text().catch(() => "");
  let code: string | undefined;
  let message = text.slice(0, 500) || `HTTP ${r.status}`;
  let detail: LostDetail | undefined;
  try {
    const err = JSON.parse(text).error;
    if (err && typeof err === "object") {
      code = err.code;
      message = err.message ?? message;
      detail = err;
    }
  } catch { /* not JSON: keep the text */ }
  return errorFor(r.status, code, message, retryAfter(r.headers), detail);
}

const sleep = (ms: number) => new Promise((res) => setTimeout(res, ms));

function isTimeout(e: unknown): boolean {
  return e instanceof Error && (e.name === "TimeoutError" || e.name === "AbortError");
}

export class Transport {
  readonly url: string;
  readonly apiKey?: string;
  readonly timeoutMs: number;
  readonly maxRetries: number;

  constructor(opts: ClientOptions = {}) {
    this.url = resolveUrl(opts.url);
    this.apiKey = resolveKey(opts.apiKey, this.url, opts.keyFile);
    this.timeoutMs = opts.timeoutMs ?? 60_000;
    this.maxRetries = opts.maxRetries ?? 2;
  }

  private headers(extra?: Record<string, string>): Record<string, string> {
    const h: Record<string, string> = { "user-agent": USER_AGENT };
    if (this.apiKey) h.authorization = `Bearer ${this.apiKey}`;
    return { ...h, ...extra };
  }

  private target(path: string, query?: Query): string {
    const qs = query && query.length ? `?${new URLSearchParams(query).toString()}` : "";
    return `${this.url}${path}${qs}`;
  }

  /** One call; throws the typed error for any status >= 400. Retried: a
   * network failure of an idempotent call (GET, PUT, DELETE, PATCH of an
   * absolute TTL), and any call answered 429 or 503 with Retry-After (the
   * daemon did nothing), up to maxRetries times. */
  async request(method: string, path: string, opts: RequestOptions = {}): Promise<Response> {
    const headers = this.headers(opts.headers);
    let body: string | Uint8Array | undefined = opts.body;
    if (opts.json !== undefined) {
      body = JSON.stringify(opts.json);
      headers["content-type"] = "application/json";
    }
    const url = this.target(path, opts.query);
    const timeoutMs = opts.timeoutMs ?? this.timeoutMs;
    for (let attempt = 0; ; attempt++) {
      let r: Response;
      try {
        r = await fetch(url, { method, headers, body, signal: AbortSignal.timeout(timeoutMs) });
      } catch (e) {
        if (isTimeout(e)) throw new SandboxTimeout(`no answer within ${timeoutMs} ms: ${method} ${path}`);
        // Only an idempotent call may go again: a POST whose answer was lost
        // may have created something already.
        if (opts.idempotent && attempt < this.maxRetries) continue;
        throw new ConnectionFailed(`${method} ${path}: ${(e as Error).message} ${String((e as Error).cause ?? "")}`);
      }
      if (r.status < 400) return r;
      const ra = retryAfter(r.headers);
      if ((r.status === 429 || r.status === 503) && ra !== undefined && attempt < this.maxRetries) {
        await r.body?.cancel();
        await sleep(Math.min(Math.max(ra, 0) * 1000, MAX_RETRY_SLEEP_MS));
        continue;
      }
      throw await errorFrom(r);
    }
  }

  async json<T>(method: string, path: string, opts: RequestOptions = {}): Promise<T> {
    const r = await this.request(method, path, opts);
    const text = await this.readText(r, method, path);
    try {
      return JSON.parse(text) as T;
    } catch (e) {
      throw new HatcheryError(`answer is not valid JSON (${(e as Error).message}): ${text.slice(0, 200)}`, {
        status: r.status,
      });
    }
  }

  async readText(r: Response, method: string, path: string): Promise<string> {
    try {
      return await r.text();
    } catch (e) {
      if (isTimeout(e)) throw new SandboxTimeout(`answer stalled: ${method} ${path}`);
      throw new ConnectionFailed(`${method} ${path}: ${(e as Error).message}`);
    }
  }

  /** Opens a server-sent event stream. `signal` aborts it (closing the
   * connection, which for an exec kills the command). */
  async stream(method: string, path: string, json: unknown, signal: AbortSignal, query?: Query): Promise<SSE> {
    const headers = this.headers({ accept: "text/event-stream" });
    let body: string | undefined;
    if (json !== undefined) {
      body = JSON.stringify(json);
      headers["content-type"] = "application/json";
    }
    let r: Response;
    try {
      r = await fetch(this.target(path, query), { method, headers, body, signal });
    } catch (e) {
      throw new ConnectionFailed(`${method} ${path}: ${(e as Error).message}`);
    }
    if (r.status >= 400) throw await errorFrom(r);
    if (!r.body) throw new StreamError(`${method} ${path}: no body`);
    return new SSE(r.body);
  }
}

export interface SSEEvent {
  event: string;
  data: unknown;
}

/** Parses `event:` / `data:` blocks; comment lines (keep-alives) are skipped. */
export class SSE implements AsyncIterable<SSEEvent> {
  /** Called on every chunk read, keep-alive comments included. */
  onActivity?: () => void;

  constructor(private readonly body: ReadableStream<Uint8Array>) {}

  async *[Symbol.asyncIterator](): AsyncIterator<SSEEvent> {
    const reader = this.body.getReader();
    const decoder = new TextDecoder();
    let buf = "";
    let event: string | undefined;
    let data: string[] = [];
    try {
      for (;;) {
        let chunk: ReadableStreamReadResult<Uint8Array>;
        try {
          chunk = await reader.read();
        } catch (e) {
          if (isTimeout(e)) throw new SandboxTimeout("stream stalled past the client timeout");
          throw new StreamError(`stream broken: ${(e as Error).message}`);
        }
        if (chunk.done) return;
        this.onActivity?.();
        buf += decoder.decode(chunk.value, { stream: true });
        let nl: number;
        while ((nl = buf.indexOf("\n")) >= 0) {
          const line = buf.slice(0, nl).replace(/\r$/, "");
          buf = buf.slice(nl + 1);
          if (line.startsWith(":")) continue;
          if (line === "") {
            if (event !== undefined || data.length) {
              const raw = data.join("\n");
              yield { event: event ?? "message", data: raw ? JSON.parse(raw) : null };
            }
            event = undefined;
            data = [];
          } else if (line.startsWith("event:")) {
            event = line.slice(6).trim();
          } else if (line.startsWith("data:")) {
            const v = line.slice(5);
            data.push(v.startsWith(" ") ? v.slice(1) : v);
          }
        }
      }
    } finally {
      await reader.cancel().catch(() => undefined);
    }
  }
}
