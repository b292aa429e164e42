// Client: connection settings, the route table and the calls that are not
// about one sandbox. Every HTTP route the SDK uses is in ROUTES, which is
// typed to contain every route of the OpenAPI document.
import type { DOCUMENTED_ROUTES } from "./wire.js";
import { type ClientOptions, type Query, type RequestOptions, SSE, Transport } from "./http.js";

type Documented = (typeof DOCUMENTED_ROUTES)[number];

/** `METHOD /path` -> what in this SDK calls it. */
export const ROUTES = {
  "GET /healthz": "Client.health",
  "GET /metrics": "Client.metrics",
  "GET /openapi.json": "Client.openapi",
  "POST /v1/sandboxes": "Sandbox.create",
  "GET /v1/sandboxes": "Sandbox.list",
  "GET /v1/sandboxes/{id}": "Sandbox.get",
  "PATCH /v1/sandboxes/{id}": "Sandbox.setTtl",
  "DELETE /v1/sandboxes/{id}": "Sandbox.kill",
  "POST /v1/sandboxes/{id}/exec": "Sandbox.exec",
  "POST /v1/sandboxes/{id}/exec/stream": "Sandbox.execStream",
  "POST /v1/sandboxes/{id}/code": "Sandbox.runCode",
  "POST /v1/sandboxes/{id}/code/stream": "Sandbox.runCode",
  "POST /v1/sandboxes/{id}/code/contexts": "Sandbox.createCodeContext",
  "GET /v1/sandboxes/{id}/code/contexts": "Sandbox.listCodeContexts",
  "POST /v1/sandboxes/{id}/code/contexts/{context_id}/restart": "Sandbox.restartCodeContext",
  "DELETE /v1/sandboxes/{id}/code/contexts/{context_id}": "Sandbox.removeCodeContext",
  "GET /v1/sandboxes/{id}/processes": "Sandbox.processes",
  "GET /v1/sandboxes/{id}/processes/{pid}": "Sandbox.process",
  "DELETE /v1/sandboxes/{id}/processes/{pid}": "Process.kill",
  "GET /v1/sandboxes/{id}/processes/{pid}/output": "Process.output",
  "POST /v1/sandboxes/{id}/processes/{pid}/stdin": "Process.sendStdin",
  "POST /v1/sandboxes/{id}/processes/{pid}/stdin/close": "Process.closeStdin",
  "POST /v1/sandboxes/{id}/processes/{pid}/signal": "Process.signal",
  "POST /v1/sandboxes/{id}/processes/{pid}/wait": "Process.wait",
  "PUT /v1/sandboxes/{id}/files": "Filesystem.write",
  "GET /v1/sandboxes/{id}/files": "Filesystem.read",
  "DELETE /v1/sandboxes/{id}/files": "Filesystem.remove",
  "GET /v1/sandboxes/{id}/files/list": "Filesystem.list",
  "GET /v1/sandboxes/{id}/network": "Network.get",
  "PUT /v1/sandboxes/{id}/network": "Network.update",
  "GET /v1/sandboxes/{id}/network/events": "Network.events",
  "GET /v1/sandboxes/{id}/ports/{port}/{path}": "Sandbox.portRequest",
  "PUT /v1/sandboxes/{id}/ports/{port}/{path}": "Sandbox.portRequest",
  "POST /v1/sandboxes/{id}/ports/{port}/{path}": "Sandbox.portRequest",
  "DELETE /v1/sandboxes/{id}/ports/{port}/{path}": "Sandbox.portRequest",
  "PATCH /v1/sandboxes/{id}/ports/{port}/{path}": "Sandbox.portRequest",
  "HEAD /v1/sandboxes/{id}/ports/{port}/{path}": "Sandbox.portRequest",
  "OPTIONS /v1/sandboxes/{id}/ports/{port}/{path}": "Sandbox.portRequest",
  "POST /v1/sandboxes/{id}/ports/{port}/preview-url": "Sandbox.previewUrl",
  "GET /preview/{token}/{path}": "PreviewUrl.url (no key: fetch it as is)",
  "PUT /preview/{token}/{path}": "PreviewUrl.url (no key: fetch it as is)",
  "POST /preview/{token}/{path}": "PreviewUrl.url (no key: fetch it as is)",
  "DELETE /preview/{token}/{path}": "PreviewUrl.url (no key: fetch it as is)",
  "PATCH /preview/{token}/{path}": "PreviewUrl.url (no key: fetch it as is)",
  "HEAD /preview/{token}/{path}": "PreviewUrl.url (no key: fetch it as is)",
  "OPTIONS /preview/{token}/{path}": "PreviewUrl.url (no key: fetch it as is)",
  "GET /v1/sandboxes/{id}/pty": "Sandbox.pty",
  "POST /v1/sandboxes/{id}/pty/token": "Sandbox.ptyToken",
  "POST /v1/sandboxes/{id}/snapshots": "Sandbox.snapshot",
  "GET /v1/snapshots": "Snapshot.list",
  "GET /v1/snapshots/{id}": "Snapshot.get",
  "DELETE /v1/snapshots/{id}": "Snapshot.delete",
  "POST /v1/snapshots/{id}/fork": "Snapshot.fork",
  "GET /v1/snapshots/{id}/pool": "Snapshot.pool",
  "PUT /v1/snapshots/{id}/pool": "Snapshot.setPool",
  "GET /v1/templates": "Template.list",
  "POST /v1/templates": "Template.build",
  "GET /v1/templates/{name}": "Template.get",
  "DELETE /v1/templates/{name}": "Template.delete",
  "GET /v1/templates/{name}/builds/{id}/events": "Template.buildEvents",
  "POST /v1/policies": "Policies.create",
  "GET /v1/policies": "Policies.list",
  "GET /v1/policies/{id}": "Policies.get",
  "POST /v1/policies/{id}/versions": "Policies.addVersion",
  "GET /v1/policies/{id}/versions/{version}": "Policies.getVersion",
  "POST /v1/secrets": "Secrets.create",
  "GET /v1/secrets": "Secrets.list",
  "DELETE /v1/secrets/{name}": "Secrets.delete",
  "POST /v1/tenants": "Tenants.create",
  "GET /v1/tenants": "Tenants.list",
  "GET /v1/tenants/{id}": "Tenants.get",
  "PATCH /v1/tenants/{id}": "Tenants.update",
  "DELETE /v1/tenants/{id}": "Tenants.delete",
  "POST /v1/tenants/{id}/keys": "Tenants.createKey",
  "GET /v1/tenants/{id}/keys": "Tenants.listKeys",
  "DELETE /v1/tenants/{id}/keys/{key_id}": "Tenants.revokeKey",
} as const satisfies Record<Documented, string> & Record<string, string>;

export type Route = keyof typeof ROUTES;

export type { ClientOptions };

export function metadataQuery(metadata?: Record<string, string>): Query {
  return Object.entries(metadata ?? {}).map(([k, v]) => [`metadata.${k}`, v]);
}

export class Client {
  readonly transport: Transport;

  constructor(opts: ClientOptions = {}) {
    this.transport = new Transport(opts);
  }

  get url(): string {
    return this.transport.url;
  }

  private split(route: Route, params: Record<string, string>): [string, string] {
    const [method, template] = route.split(" ") as [string, string];
    const path = template.replace(/\{(\w+)\}/g, (_, k: string) => encodeURIComponent(params[k] ?? ""));
    return [method, path];
  }

  call(route: Route, params: Record<string, string> = {}, opts: RequestOptions = {}): Promise<Response> {
    const [method, path] = this.split(route, params);
    const idempotent = opts.idempotent ?? ["GET", "PUT", "DELETE", "PATCH"].includes(method);
    return this.transport.request(method, path, { ...opts, idempotent });
  }

  json<T>(route: Route, params: Record<string, string> = {}, opts: RequestOptions = {}): Promise<T> {
    const [method, path] = this.split(route, params);
    const idempotent = opts.idempotent ?? ["GET", "PUT", "DELETE", "PATCH"].includes(method);
    return this.transport.json<T>(method, path, { ...opts, idempotent });
  }

  stream(route: Route, params: Record<string, string>, json: unknown, signal: AbortSignal, query?: Query): Promise<SSE> {
    const [method, path] = this.split(route, params);
    return this.transport.stream(method, path, json, signal, query);
  }

  async health(): Promise<{ status: string; runtime: string; live: number }> {
    return this.json("GET /healthz");
  }

  async metrics(): Promise<string> {
    const r = await this.call("GET /metrics");
    return r.text();
  }

  async openapi(): Promise<Record<string, any>> {
    return this.json("GET /openapi.json");
  }
}

let defaultClient: Client | undefined;

/** Built from the environment on first use; `configure` replaces it. */
export function getDefaultClient(): Client {
  return (defaultClient ??= new Client());
}

export function configure(opts: ClientOptions = {}): Client {
  defaultClient = new Client(opts);
  return defaultClient;
}
