//! The worst case of a call's input before it runs: an upper bound on the
//! input tokens the upstream can charge for the request the gateway sends.
//!
//! Text (messages, system, tool definitions, tool results) is bounded by
//! its bytes: every token of a byte-level BPE covers at least one byte, and
//! the JSON around it (quotes, keys, roles) is longer than the few tokens a
//! chat format adds per message. What is not text costs tokens its bytes do
//! not bound: an image is priced by its pixels (a URL of 40 bytes can cost
//! thousands), a tool list adds the provider's own tool-use prompt. Those
//! get fixed allowances. What has no bound the gateway can know before the
//! call (documents and files, whose pages are priced as images and text;
//! server-side tools that bring search results or fetched pages into the
//! input; remote MCP servers) is refused (`unbounded_input`), so a
//! reservation is always an upper bound and a budget passes its limit by at
//! most what in-flight calls under-estimated, which is nothing.

use crate::usage::Flavor;
use serde_json::{Map, Value};

/// Input tokens one image may cost at most. The largest published figure:
/// OpenAI's `gpt-4o-mini` at `detail: high` (2,833 + 5,667 per 512 px
/// tile, at most 8 tiles after its resize to 768 × 2048: 48,169). Anthropic
/// resizes images to about 1.15 megapixels (~1,600 tokens).
pub const IMAGE_TOKENS: u64 = 48_169;

/// Input tokens a non-empty tool list adds beyond its JSON: the provider's
/// tool-use system prompt (Anthropic publishes at most 346 tokens for its
/// custom tools, and up to ~700 for its client tools such as `bash` or
/// `computer`, whose definitions are a name only).
pub const TOOLS_TOKENS: u64 = 2_048;

/// Parts whose type names one of these are images.
const IMAGE_TYPES: [&str; 3] = ["image", "image_url", "input_image"];

/// Parts whose cost their bytes do not bound (a PDF's pages are priced as
/// images plus their text; a file id or URL has no size at all).
const DOCUMENT_TYPES: [&str; 4] = ["document", "file", "input_file", "container_upload"];

/// Anthropic tool types (versioned: `web_search_20250305`) that run on the
/// provider's side and add what they find to the input.
const SERVER_TOOLS: [&str; 4] = ["web_search", "web_fetch", "code_execution", "mcp"];

/// Why a request's input has no bound the gateway can reserve.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum EstimateError {
    #[error("a {0:?} part is priced by its pages or size, which the gateway cannot bound before the call; send its text instead")]
    Document(String),
    #[error("the server-side tool {0:?} adds what it finds to the input, which the gateway cannot bound before the call")]
    ServerTool(String),
    #[error("`{0}` brings remote content into the input, which the gateway cannot bound before the call")]
    RemoteInput(&'static str),
}

/// An upper bound on the input tokens of `req` (the body as sent upstream,
/// `body_len` bytes of it), or why there is none.
pub fn input_tokens_upper_bound(
    flavor: Flavor,
    req: &Map<String, Value>,
    body_len: usize,
) -> Result<u64, EstimateError> {
    for key in ["mcp_servers", "web_search_options", "container"] {
        if req.get(key).is_some_and(|v| !v.is_null()) {
            return Err(EstimateError::RemoteInput(key));
        }
    }
    let mut bound = body_len as u64;
    if let Some(Value::Array(tools)) = req.get("tools").or(req.get("functions")) {
        if !tools.is_empty() {
            bound += TOOLS_TOKENS;
        }
        if flavor == Flavor::Anthropic {
            for t in tools {
                if let Some(ty) = t.get("type").and_then(Value::as_str) {
                    if SERVER_TOOLS.iter().any(|s| ty.starts_with(s)) {
                        return Err(EstimateError::ServerTool(ty.to_string()));
                    }
                }
            }
        }
    }
    for key in ["messages", "system"] {
        if let Some(v) = req.get(key) {
            bound += media(v)?;
        }
    }
    Ok(bound)
}

/// What the parts in `v` cost beyond their bytes, walking every nested
/// array and object (tool results hold images too).
fn media(v: &Value) -> Result<u64, EstimateError> {
    match v {
        Value::Array(a) => a.iter().map(media).sum(),
        Value::Object(o) => {
            let mut n = 0;
            if let Some(ty) = o.get("type").and_then(Value::as_str) {
                if IMAGE_TYPES.contains(&ty) {
                    n += IMAGE_TOKENS;
                }
                if DOCUMENT_TYPES.contains(&ty) {
                    return Err(EstimateError::Document(ty.to_string()));
                }
            }
            for x in o.values() {
                n += media(x)?;
            }
            Ok(n)
        }
        _ => Ok(0),
    }
}

/// Whether the request asks the provider to write a prompt cache: a cache
/// write is priced at up to twice the input price (Anthropic's one-hour
/// cache), so the estimate's cents count the input twice.
pub fn writes_cache(req: &Map<String, Value>) -> bool {
    fn any(v: &Value) -> bool {
        match v {
            Value::Array(a) => a.iter().any(any),
            Value::Object(o) => o.contains_key("cache_control") || o.values().any(any),
            _ => false,
        }
    }
    req.contains_key("cache_control") || req.values().any(any)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn bound(flavor: Flavor, v: Value) -> Result<u64, EstimateError> {
        let m = v.as_object().unwrap().clone();
        let len = serde_json::to_vec(&v).unwrap().len();
        input_tokens_upper_bound(flavor, &m, len)
    }

    #[test]
    fn text_is_bounded_by_its_bytes() {
        let v = json!({"model": "m", "system": "be brief",
            "messages": [{"role": "user", "content": "hello world"}]});
        let len = serde_json::to_vec(&v).unwrap().len() as u64;
        assert_eq!(bound(Flavor::Anthropic, v), Ok(len));
    }

    /// A tiny image URL costs far more than its bytes; so does a tool list
    /// (the provider's tool prompt). Images nested in a tool result count.
    #[test]
    fn images_and_tools_are_counted_beyond_their_bytes() {
        let img = json!({"model": "m", "messages": [{"role": "user", "content": [
            {"type": "image_url", "image_url": {"url": "https://x/a.png", "detail": "high"}}]}]});
        assert!(bound(Flavor::OpenAi, img).unwrap() >= IMAGE_TOKENS);
        let nested = json!({"model": "m", "messages": [{"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": "t", "content": [
                {"type": "image", "source": {"type": "url", "url": "https://x/a.png"}},
                {"type": "image", "source": {"type": "url", "url": "https://x/b.png"}}]}]}]});
        assert!(bound(Flavor::Anthropic, nested).unwrap() >= 2 * IMAGE_TOKENS);
        let tools = json!({"model": "m", "tools": [{"type": "bash_20250124", "name": "bash"}],
            "messages": []});
        assert!(bound(Flavor::Anthropic, tools).unwrap() >= TOOLS_TOKENS);
    }

    #[test]
    fn what_has_no_bound_is_refused() {
        let doc = json!({"model": "m", "messages": [{"role": "user", "content": [
            {"type": "document", "source": {"type": "url", "url": "https://x/a.pdf"}}]}]});
        assert_eq!(
            bound(Flavor::Anthropic, doc),
            Err(EstimateError::Document("document".into()))
        );
        let file = json!({"model": "m", "messages": [{"role": "user", "content": [
            {"type": "file", "file": {"file_id": "file-1"}}]}]});
        assert!(bound(Flavor::OpenAi, file).is_err());
        let search = json!({"model": "m", "messages": [],
            "tools": [{"type": "web_search_20250305", "name": "web_search"}]});
        assert!(matches!(
            bound(Flavor::Anthropic, search),
            Err(EstimateError::ServerTool(_))
        ));
        let opts = json!({"model": "m", "messages": [], "web_search_options": {}});
        assert_eq!(
            bound(Flavor::OpenAi, opts),
            Err(EstimateError::RemoteInput("web_search_options"))
        );
    }

    #[test]
    fn cache_writes_are_seen_anywhere() {
        let v = json!({"system": [{"type": "text", "text": "x",
            "cache_control": {"type": "ephemeral"}}]});
        assert!(writes_cache(v.as_object().unwrap()));
        assert!(!writes_cache(json!({"system": "x"}).as_object().unwrap()));
    }
}
