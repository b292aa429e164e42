// Tenants and their API keys (docs/api.md, "Tenants"): operator key only.
// A tenant's key sees and acts on its own sandboxes and snapshots.
import { getDefaultClient } from "./client.js";
import {
  type CreatedKey, type Limits, type Tenant, type TenantKey, createdKey, limitsToWire, tenant, tenantKey,
} from "./models.js";
import type { WithClient } from "./sandbox.js";
import type * as wire from "./wire.js";

export interface TenantOptions extends WithClient {
  limits?: Limits;
}

export class Tenants {
  static async create(name: string, opts: TenantOptions = {}): Promise<Tenant> {
    const client = opts.client ?? getDefaultClient();
    const body: wire.NewTenant = { name, ...(opts.limits ? { limits: limitsToWire(opts.limits) } : {}) };
    return tenant(await client.json<wire.Tenant>("POST /v1/tenants", {}, { json: body }));
  }

  static async list(opts: WithClient = {}): Promise<Tenant[]> {
    const client = opts.client ?? getDefaultClient();
    return (await client.json<wire.TenantList>("GET /v1/tenants")).tenants.map(tenant);
  }

  static async get(id: string, opts: WithClient = {}): Promise<Tenant> {
    const client = opts.client ?? getDefaultClient();
    return tenant(await client.json<wire.Tenant>("GET /v1/tenants/{id}", { id }));
  }

  /** `limits`, when given, replaces all five (an absent one becomes unlimited). */
  static async update(id: string, change: { name?: string; limits?: Limits }, opts: WithClient = {}): Promise<Tenant> {
    const client = opts.client ?? getDefaultClient();
    const body: wire.TenantPatch = {
      ...(change.name !== undefined ? { name: change.name } : {}),
      ...(change.limits ? { limits: limitsToWire(change.limits) } : {}),
    };
    return tenant(await client.json<wire.Tenant>("PATCH /v1/tenants/{id}", { id }, { json: body }));
  }

  /** Refused (Conflict, `tenant_in_use`) while it has live sandboxes. */
  static async delete(id: string, opts: WithClient = {}): Promise<void> {
    const client = opts.client ?? getDefaultClient();
    const r = await client.call("DELETE /v1/tenants/{id}", { id });
    await r.body?.cancel();
  }

  /** A new key; `key` is shown this once (only its hash is kept). */
  static async createKey(id: string, opts: WithClient = {}): Promise<CreatedKey> {
    const client = opts.client ?? getDefaultClient();
    return createdKey(await client.json<wire.CreatedKey>("POST /v1/tenants/{id}/keys", { id }));
  }

  static async listKeys(id: string, opts: WithClient = {}): Promise<TenantKey[]> {
    const client = opts.client ?? getDefaultClient();
    return (await client.json<wire.KeyList>("GET /v1/tenants/{id}/keys", { id })).keys.map(tenantKey);
  }

  /** Refused from the next request on. */
  static async revokeKey(id: string, keyId: string, opts: WithClient = {}): Promise<TenantKey> {
    const client = opts.client ?? getDefaultClient();
    return tenantKey(await client.json<wire.TenantKey>("DELETE /v1/tenants/{id}/keys/{key_id}", { id, key_id: keyId }));
  }
}
