//! What one JSON-RPC message from an MCP server means to a client waiting
//! for the answer to its request `id`, whichever transport carried it
//! (stdio lines, HTTP bodies or SSE events).

use serde_json::{json, Value};

pub enum Incoming {
    /// A request from the server; the client sends this answer back
    /// (`ping` is answered; the broker offers no other client feature).
    ServerRequest(Value),
    /// `notifications/tools/list_changed`.
    ToolsChanged,
    /// Another notification, or an answer to a request given up on.
    Ignored,
    /// The answer: a result, or the server's JSON-RPC error.
    Answer(Result<Value, (i64, String)>),
}

pub fn classify(msg: &Value, id: u64) -> Incoming {
    let method = msg.get("method").and_then(Value::as_str);
    match (msg.get("id"), method) {
        (Some(rid), Some(m)) => Incoming::ServerRequest(if m == "ping" {
            json!({"jsonrpc": "2.0", "id": rid, "result": {}})
        } else {
            json!({"jsonrpc": "2.0", "id": rid,
                   "error": {"code": -32601, "message": "the broker offers no client features"}})
        }),
        (None, Some("notifications/tools/list_changed")) => Incoming::ToolsChanged,
        (None, Some(_)) => Incoming::Ignored,
        (Some(rid), None) if rid.as_u64() == Some(id) => Incoming::Answer(match msg.get("error") {
            Some(e) => {
                let code = e.get("code").and_then(Value::as_i64).unwrap_or(0);
                let text = e
                    .get("message")
                    .and_then(Value::as_str)
                    .unwrap_or("")
                    .chars()
                    .take(1000)
                    .collect();
                Err((code, text))
            }
            None => Ok(msg.get("result").cloned().unwrap_or(Value::Null)),
        }),
        _ => Incoming::Ignored,
    }
}

/// A request message.
pub fn request(id: u64, method: &str, params: Value) -> Value {
    json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params})
}

/// A notification message.
pub fn notification(method: &str, params: Option<Value>) -> Value {
    let mut m = json!({"jsonrpc": "2.0", "method": method});
    if let Some(p) = params {
        m["params"] = p;
    }
    m
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_are_told_apart() {
        assert!(matches!(
            classify(&json!({"jsonrpc": "2.0", "id": 3, "result": {"x": 1}}), 3),
            Incoming::Answer(Ok(v)) if v == json!({"x": 1})
        ));
        assert!(matches!(
            classify(&json!({"id": 3, "error": {"code": -32602, "message": "bad"}}), 3),
            Incoming::Answer(Err((-32602, m))) if m == "bad"
        ));
        assert!(matches!(
            classify(&json!({"id": 2, "result": {}}), 3),
            Incoming::Ignored
        ));
        assert!(matches!(
            classify(&json!({"method": "notifications/tools/list_changed"}), 3),
            Incoming::ToolsChanged
        ));
        match classify(&json!({"id": "s1", "method": "ping"}), 3) {
            Incoming::ServerRequest(a) => assert_eq!(a["result"], json!({})),
            _ => panic!("ping is a request"),
        }
        match classify(&json!({"id": 9, "method": "sampling/createMessage"}), 3) {
            Incoming::ServerRequest(a) => assert_eq!(a["error"]["code"], -32601),
            _ => panic!("a request"),
        }
    }
}
