//! Canonical JSON: the one byte string an event hashes as, whatever map
//! order or whitespace produced it. The rules (docs/policy.md, "Audit"):
//!
//! - objects: keys sorted by their UTF-8 bytes, no duplicate keys (a
//!   `serde_json::Value` cannot hold any), `{"k":v,...}` with no spaces;
//! - arrays: `[a,b]`, order kept, no spaces;
//! - strings: UTF-8 as is; only `"` and `\` are escaped with a backslash,
//!   and control characters U+0000–U+001F as `\b \t \n \f \r` or, for the
//!   rest, `\u00xx` in lower-case hex; `/` and non-ASCII are not escaped;
//! - numbers: integers only (i64 or u64) in shortest decimal form;
//!   fractions and exponents are refused, so no float formatting can differ
//!   between writers;
//! - `true`, `false`, `null`.

use serde_json::Value;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CanonicalError {
    #[error("non-integer number {0} (canonical JSON takes integers only)")]
    Float(String),
}

pub fn canonical_json(v: &Value) -> Result<String, CanonicalError> {
    let mut out = String::with_capacity(128);
    write(v, &mut out)?;
    Ok(out)
}

fn write(v: &Value, out: &mut String) -> Result<(), CanonicalError> {
    match v {
        Value::Null => out.push_str("null"),
        Value::Bool(true) => out.push_str("true"),
        Value::Bool(false) => out.push_str("false"),
        Value::Number(n) => {
            if let Some(i) = n.as_i64() {
                out.push_str(&i.to_string());
            } else if let Some(u) = n.as_u64() {
                out.push_str(&u.to_string());
            } else {
                return Err(CanonicalError::Float(n.to_string()));
            }
        }
        Value::String(s) => write_str(s, out),
        Value::Array(a) => {
            out.push('[');
            for (i, x) in a.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                write(x, out)?;
            }
            out.push(']');
        }
        Value::Object(o) => {
            let mut keys: Vec<&String> = o.keys().collect();
            // Byte order of UTF-8 equals code point order; `str`'s Ord is
            // byte-wise.
            keys.sort_unstable();
            out.push('{');
            for (i, k) in keys.into_iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                write_str(k, out);
                out.push(':');
                write(&o[k], out)?;
            }
            out.push('}');
        }
    }
    Ok(())
}

fn write_str(s: &str, out: &mut String) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\u{08}' => out.push_str("\\b"),
            '\t' => out.push_str("\\t"),
            '\n' => out.push_str("\\n"),
            '\u{0c}' => out.push_str("\\f"),
            '\r' => out.push_str("\\r"),
            c if (c as u32) < 0x20 => out.push_str(&format!("\\u{:04x}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn sorted_compact_escaped() {
        let v: Value = serde_json::from_str(r#"{ "b": [1, -2, {"z": null, "a": true}], "a": "x\"\\/\n\u0001é", "é": 0, "B": false }"#).unwrap();
        assert_eq!(
            canonical_json(&v).unwrap(),
            "{\"B\":false,\"a\":\"x\\\"\\\\/\\n\\u0001é\",\"b\":[1,-2,{\"a\":true,\"z\":null}],\"é\":0}"
        );
        assert_eq!(
            canonical_json(&json!(u64::MAX)).unwrap(),
            "18446744073709551615"
        );
        assert_eq!(
            canonical_json(&json!(1.5)),
            Err(CanonicalError::Float("1.5".into()))
        );
    }

    #[test]
    fn same_value_same_bytes() {
        let a: Value = serde_json::from_str(r#"{"x":1,"y":{"b":2,"a":1}}"#).unwrap();
        let b: Value =
            serde_json::from_str("{\n  \"y\": {\"a\": 1, \"b\": 2},\n  \"x\": 1\n}").unwrap();
        assert_eq!(canonical_json(&a).unwrap(), canonical_json(&b).unwrap());
    }
}
