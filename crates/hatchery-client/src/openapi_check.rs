//! The client's wire types against the committed OpenAPI snapshot
//! (docs/openapi.json, generated from hatchery-api's code): a field renamed
//! or added on the server fails here until the client follows.

use crate::models::*;
use serde::de::DeserializeOwned;
use serde::Serialize;
use serde_json::{json, Map, Value};
use std::collections::BTreeMap;

const SPEC: &str = include_str!("../../../docs/openapi.json");

fn spec() -> Value {
    serde_json::from_str(SPEC).unwrap()
}

/// The object schema behind refs, `allOf` (merged) and `oneOf` with null.
fn resolve(s: &Value, spec: &Value) -> Value {
    if let Some(r) = s["$ref"].as_str() {
        let name = r.rsplit('/').next().unwrap();
        return resolve(&spec["components"]["schemas"][name], spec);
    }
    if let Some(all) = s["allOf"].as_array() {
        let (mut props, mut req) = (Map::new(), Vec::new());
        for part in all {
            let p = resolve(part, spec);
            if let Some(o) = p["properties"].as_object() {
                props.extend(o.clone());
            }
            if let Some(r) = p["required"].as_array() {
                req.extend(r.clone());
            }
        }
        return json!({"type": "object", "properties": props, "required": req});
    }
    if let Some(one) = s["oneOf"].as_array() {
        if let Some(x) = one.iter().find(|x| x["type"] != "null") {
            return resolve(x, spec);
        }
    }
    s.clone()
}

fn types(s: &Value) -> Vec<String> {
    match &s["type"] {
        Value::String(t) => vec![t.clone()],
        Value::Array(a) => a
            .iter()
            .filter_map(|t| t.as_str().map(String::from))
            .collect(),
        _ => vec![],
    }
}

/// A value the schema accepts, with every property filled in.
fn sample(s: &Value, spec: &Value) -> Value {
    let s = resolve(s, spec);
    if let Some(e) = s["enum"].as_array() {
        return e[0].clone();
    }
    let t = types(&s);
    let has = |x: &str| t.iter().any(|y| y == x);
    if has("object") || s["properties"].is_object() {
        let mut o = Map::new();
        if let Some(props) = s["properties"].as_object() {
            for (k, p) in props {
                o.insert(k.clone(), sample(p, spec));
            }
        } else if s["additionalProperties"].is_object() {
            o.insert("k".into(), sample(&s["additionalProperties"], spec));
        }
        return Value::Object(o);
    }
    if has("array") {
        return json!([sample(&s["items"], spec)]);
    }
    if has("string") {
        return json!("s");
    }
    if has("integer") {
        return json!(1);
    }
    if has("number") {
        return json!(1.5);
    }
    if has("boolean") {
        return json!(true);
    }
    Value::Null
}

/// Every key of `v` is a property of `s`; with `all_required`, every
/// required property is a key of `v`. Recursive.
fn conforms(v: &Value, s: &Value, spec: &Value, at: &str, all_required: bool) {
    let s = resolve(s, spec);
    match v {
        Value::Object(o) => {
            let Some(props) = s["properties"].as_object() else {
                // A free-form map (metadata, env, a MIME bundle).
                return;
            };
            for (k, val) in o {
                let p = props
                    .get(k)
                    .unwrap_or_else(|| panic!("{at}.{k}: not in the OpenAPI schema"));
                conforms(val, p, spec, &format!("{at}.{k}"), all_required);
            }
            if all_required {
                for r in s["required"].as_array().into_iter().flatten() {
                    let r = r.as_str().unwrap();
                    assert!(
                        o.contains_key(r),
                        "{at}.{r}: required by the schema, missing in the client"
                    );
                }
            }
        }
        Value::Array(a) => {
            for x in a {
                conforms(x, &s["items"], spec, &format!("{at}[]"), all_required);
            }
        }
        _ => {}
    }
}

/// An answer shaped as the schema says parses into `T`, and `T` carries
/// every field back.
fn response<T: DeserializeOwned + Serialize>(schema: &str) {
    let spec = spec();
    let s = json!({"$ref": format!("#/components/schemas/{schema}")});
    let v = sample(&s, &spec);
    let t: T = serde_json::from_value(v.clone())
        .unwrap_or_else(|e| panic!("{schema}: a schema-shaped answer does not parse: {e}\n{v:#}"));
    let back = serde_json::to_value(&t).unwrap();
    conforms(&back, &s, &spec, schema, true);
    // And nothing the daemon sends is dropped: every property, optional
    // ones too, comes back.
    for k in resolve(&s, &spec)["properties"].as_object().unwrap().keys() {
        assert!(
            back.get(k).is_some(),
            "{schema}.{k}: sent by the API, dropped by the client"
        );
    }
}

/// A request's every field is a property of the schema, and every schema
/// property is one of the request's (the client can send all of it).
fn request<T: Serialize>(schema: &str, full: T) {
    let spec = spec();
    let s = json!({"$ref": format!("#/components/schemas/{schema}")});
    let v = serde_json::to_value(&full).unwrap();
    conforms(&v, &s, &spec, schema, false);
    let props = resolve(&s, &spec)["properties"]
        .as_object()
        .unwrap()
        .clone();
    for k in props.keys() {
        assert!(
            v.get(k).is_some(),
            "{schema}.{k}: in the API, not in the client's request"
        );
    }
}

fn map() -> BTreeMap<String, String> {
    BTreeMap::from([("k".to_string(), "v".to_string())])
}

fn rule() -> NetworkRule {
    NetworkRule {
        cidr: Some("10.0.0.0/8".into()),
        host: Some("example.internal".into()),
        ports: vec![443],
    }
}

fn policy() -> NetworkPolicy {
    NetworkPolicy {
        egress: EgressMode::Deny,
        allow: vec![rule()],
        deny: vec![rule()],
    }
}

#[test]
fn responses_match_the_spec() {
    response::<Sandbox>("Sandbox");
    response::<SandboxList>("SandboxList");
    response::<Snapshot>("Snapshot");
    response::<SnapshotList>("SnapshotList");
    response::<SnapshotPool>("SnapshotPool");
    response::<TemplateInfo>("TemplateInfo");
    response::<TemplateList>("TemplateList");
    response::<BuildAccepted>("BuildAccepted");
    response::<ExecResponse>("ExecResponse");
    response::<OutputChunk>("OutputChunk");
    response::<ProcessInfo>("ProcessInfo");
    response::<ProcessList>("ProcessList");
    response::<ProcessChunk>("ProcessChunk");
    response::<FileEntry>("FileEntry");
    response::<FileList>("FileList");
    response::<NetworkPolicy>("NetworkPolicy");
    response::<EgressEvent>("EgressEventBody");
    response::<EgressEventList>("EgressEventList");
    response::<CodeResponse>("CodeResponse");
    response::<CodeSummary>("CodeSummary");
    response::<CodeResultItem>("CodeResultItem");
    response::<CodeError>("CodeError");
    response::<CodeContext>("CodeContext");
    response::<CodeContextList>("CodeContextList");
    response::<PreviewUrl>("PreviewUrl");
    response::<TerminalToken>("TerminalToken");
    response::<ErrorBody>("ErrorBody");
    response::<SecretInfo>("SecretInfo");
    response::<SecretList>("SecretList");
}

#[test]
fn requests_match_the_spec() {
    request(
        "CreateSandbox",
        CreateSandbox {
            template: Some("t".into()),
            ttl_seconds: Some(60),
            metadata: map(),
            env: map(),
            network: Some(policy()),
        },
    );
    request(
        "ExecBody",
        ExecRequest {
            cmd: Some("true".into()),
            argv: Some(vec!["true".into()]),
            cwd: Some("/".into()),
            env: map(),
            stdin: Some("x".into()),
            timeout_seconds: Some(1),
            max_output_bytes: Some(1),
            cpu_limit_ms: Some(1),
            cpu_limit_basis: Some(crate::models::CpuLimitBasis::Host),
            background: true,
            output: Some(OutputEncoding::Base64),
        },
    );
    request(
        "CodeBody",
        CodeRequest {
            code: "1".into(),
            language: Some("python".into()),
            context_id: Some("c".into()),
            timeout_seconds: Some(1),
            max_output_bytes: Some(1),
            cpu_limit_ms: Some(1),
            env: map(),
        },
    );
    request(
        "CreateSnapshot",
        CreateSnapshot {
            retention_seconds: Some(1),
            metadata: map(),
            memory: Some(false),
        },
    );
    request(
        "ForkBody",
        ForkRequest {
            count: Some(2),
            ttl_seconds: Some(1),
            metadata: map(),
            network: Some(policy()),
        },
    );
    request("SnapshotPoolBody", SnapshotPoolRequest { size: 2 });
    request(
        "CreateContext",
        CreateContext {
            language: Some("python".into()),
            cwd: Some("/".into()),
        },
    );
    request(
        "CreatePreviewUrl",
        CreatePreviewUrl {
            ttl_seconds: Some(1),
        },
    );
    request("PatchSandbox", PatchSandbox { ttl_seconds: 1 });
    request(
        "SignalBody",
        SignalBody {
            signal: "TERM".into(),
        },
    );
    request("NetworkPolicy", policy());
    request(
        "CreateSecret",
        CreateSecret {
            name: "n".into(),
            value: "v".into(),
        },
    );
    request(
        "CreateTemplate",
        CreateTemplate {
            name: "t".into(),
            base: Some("debian".into()),
            packages: vec!["p".into()],
            pip: vec!["q==1".into()],
            files: map(),
            setup: vec!["true".into()],
            cpus: Some(1.0),
            memory_mb: Some(1),
            pids_max: Some(1),
            disk_mb: Some(1),
            network: Some(json!({"egress": "deny"})),
        },
    );
}

#[test]
fn every_path_the_client_calls_is_in_the_spec() {
    let spec = spec();
    let paths = spec["paths"].as_object().unwrap();
    for (p, method) in [
        ("/healthz", "get"),
        ("/v1/secrets", "get"),
        ("/v1/secrets", "post"),
        ("/v1/secrets/{name}", "delete"),
        ("/v1/templates", "get"),
        ("/v1/templates", "post"),
        ("/v1/templates/{name}", "get"),
        ("/v1/templates/{name}", "delete"),
        ("/v1/templates/{name}/builds/{id}/events", "get"),
        ("/v1/sandboxes", "post"),
        ("/v1/sandboxes", "get"),
        ("/v1/sandboxes/{id}", "get"),
        ("/v1/sandboxes/{id}", "delete"),
        ("/v1/sandboxes/{id}", "patch"),
        ("/v1/sandboxes/{id}/exec", "post"),
        ("/v1/sandboxes/{id}/exec/stream", "post"),
        ("/v1/sandboxes/{id}/processes", "get"),
        ("/v1/sandboxes/{id}/processes/{pid}", "get"),
        ("/v1/sandboxes/{id}/processes/{pid}", "delete"),
        ("/v1/sandboxes/{id}/processes/{pid}/output", "get"),
        ("/v1/sandboxes/{id}/processes/{pid}/stdin", "post"),
        ("/v1/sandboxes/{id}/processes/{pid}/stdin/close", "post"),
        ("/v1/sandboxes/{id}/processes/{pid}/signal", "post"),
        ("/v1/sandboxes/{id}/processes/{pid}/wait", "post"),
        ("/v1/sandboxes/{id}/files", "put"),
        ("/v1/sandboxes/{id}/files", "get"),
        ("/v1/sandboxes/{id}/files", "delete"),
        ("/v1/sandboxes/{id}/files/list", "get"),
        ("/v1/sandboxes/{id}/snapshots", "post"),
        ("/v1/snapshots", "get"),
        ("/v1/snapshots/{id}", "get"),
        ("/v1/snapshots/{id}", "delete"),
        ("/v1/snapshots/{id}/fork", "post"),
        ("/v1/sandboxes/{id}/network", "get"),
        ("/v1/sandboxes/{id}/network", "put"),
        ("/v1/sandboxes/{id}/network/events", "get"),
        ("/v1/sandboxes/{id}/code", "post"),
        ("/v1/sandboxes/{id}/code/stream", "post"),
        ("/v1/sandboxes/{id}/code/contexts", "post"),
        ("/v1/sandboxes/{id}/code/contexts", "get"),
        (
            "/v1/sandboxes/{id}/code/contexts/{context_id}/restart",
            "post",
        ),
        ("/v1/sandboxes/{id}/code/contexts/{context_id}", "delete"),
        ("/v1/sandboxes/{id}/ports/{port}/preview-url", "post"),
        ("/v1/sandboxes/{id}/pty/token", "post"),
    ] {
        assert!(
            paths.get(p).and_then(|x| x.get(method)).is_some(),
            "{method} {p} is not in docs/openapi.json"
        );
    }
}

#[test]
fn the_checker_catches_a_rename() {
    // A field the spec does not have must fail `conforms`.
    let spec = spec();
    let s = json!({"$ref": "#/components/schemas/PatchSandbox"});
    let r =
        std::panic::catch_unwind(|| conforms(&json!({"ttl": 1}), &s, &spec, "PatchSandbox", false));
    assert!(r.is_err());
}
