//! Printing: JSON for programs, aligned tables for people, and the small
//! parsers shared by several subcommands.

use anyhow::bail;
use serde_json::{Map, Value};
use time::format_description::well_known::Rfc3339;
use time::OffsetDateTime;

pub fn json(v: &Value) {
    println!(
        "{}",
        serde_json::to_string_pretty(v).unwrap_or_else(|_| v.to_string())
    );
}

/// Columns padded to their widest cell; the last column is not padded.
/// `--json` prints `v` as it came from the API; otherwise `human` prints
/// it for people. Every command's output goes through here.
pub fn show(json_out: bool, v: &Value, human: impl FnOnce(&Value)) {
    if json_out {
        json(v)
    } else {
        human(v)
    }
}

pub fn table(head: &[&str], rows: &[Vec<String>]) {
    let mut width: Vec<usize> = head.iter().map(|h| h.len()).collect();
    for r in rows {
        for (w, c) in width.iter_mut().zip(r) {
            *w = (*w).max(c.chars().count());
        }
    }
    let line = |cells: Vec<&str>| {
        let n = cells.len();
        let mut s = String::new();
        for (i, c) in cells.into_iter().enumerate() {
            if i + 1 == n {
                s.push_str(c);
            } else {
                s.push_str(&format!("{c:<w$}  ", w = width[i]));
            }
        }
        println!("{}", s.trim_end());
    };
    line(head.to_vec());
    for r in rows {
        line(r.iter().map(String::as_str).collect());
    }
}

pub fn s(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        Value::Null => String::new(),
        other => other.to_string(),
    }
}

/// "k=v,k2=v2" for a metadata object.
pub fn pairs(v: &Value) -> String {
    v.as_object()
        .map(|m| {
            m.iter()
                .map(|(k, v)| format!("{k}={}", s(v)))
                .collect::<Vec<_>>()
                .join(",")
        })
        .unwrap_or_default()
}

/// How long from now until an RFC 3339 time, like "4m12s" (or "expired").
pub fn until(t: &Value) -> String {
    let Some(at) = t
        .as_str()
        .and_then(|t| OffsetDateTime::parse(t, &Rfc3339).ok())
    else {
        return s(t);
    };
    let secs = (at - OffsetDateTime::now_utc()).whole_seconds();
    if secs <= 0 {
        return "expired".into();
    }
    let (d, h, m, sec) = (
        secs / 86400,
        secs % 86400 / 3600,
        secs % 3600 / 60,
        secs % 60,
    );
    match (d, h, m) {
        (0, 0, 0) => format!("{sec}s"),
        (0, 0, _) => format!("{m}m{sec:02}s"),
        (0, _, _) => format!("{h}h{m:02}m"),
        _ => format!("{d}d{h:02}h"),
    }
}

/// An RFC 3339 time without its fraction: "2025-01-07 10:15:02".
pub fn when(t: &Value) -> String {
    let t = s(t);
    let t = t.split('.').next().unwrap_or(&t).trim_end_matches('Z');
    t.replacen('T', " ", 1)
}

pub fn bytes(n: &Value) -> String {
    let n = n.as_f64().unwrap_or(0.0);
    match n {
        n if n >= 1e9 => format!("{:.1} GB", n / 1e9),
        n if n >= 1e6 => format!("{:.1} MB", n / 1e6),
        n if n >= 1e3 => format!("{:.1} kB", n / 1e3),
        n => format!("{n} B"),
    }
}

/// `KEY=VALUE` arguments (--metadata, --env) into a JSON object.
pub fn kv_map(items: &[String], what: &str) -> anyhow::Result<Map<String, Value>> {
    let mut m = Map::new();
    for it in items {
        let Some((k, v)) = it.split_once('=') else {
            bail!("{what} must be KEY=VALUE, got {it:?}");
        };
        if k.is_empty() {
            bail!("{what} must be KEY=VALUE with a non-empty KEY, got {it:?}");
        }
        m.insert(k.to_string(), Value::String(v.to_string()));
    }
    Ok(m)
}

/// `?metadata.k=v&...` for list filters.
pub fn metadata_query(items: &[String]) -> anyhow::Result<String> {
    let m = kv_map(items, "--metadata")?;
    let q: Vec<String> = m
        .iter()
        .map(|(k, v)| format!("metadata.{}={}", enc(k), enc(&s(v))))
        .collect();
    Ok(if q.is_empty() {
        String::new()
    } else {
        format!("?{}", q.join("&"))
    })
}

fn enc(x: &str) -> String {
    x.bytes()
        .map(|b| {
            if b.is_ascii_alphanumeric() || b"-_.~".contains(&b) {
                (b as char).to_string()
            } else {
                format!("%{b:02X}")
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kv_and_query() {
        let m = kv_map(&["a=b=c".into(), "e=".into()], "--env").unwrap();
        assert_eq!(m["a"], "b=c");
        assert_eq!(m["e"], "");
        assert!(kv_map(&["nokey".into()], "--env").is_err());
        assert!(kv_map(&["=v".into()], "--env").is_err());
        assert_eq!(
            metadata_query(&["owner=al ice".into()]).unwrap(),
            "?metadata.owner=al%20ice"
        );
        assert_eq!(metadata_query(&[]).unwrap(), "");
    }

    #[test]
    fn durations() {
        let soon = OffsetDateTime::now_utc() + time::Duration::seconds(125);
        let v = Value::String(soon.format(&Rfc3339).unwrap());
        assert!(until(&v).starts_with("2m0"), "{}", until(&v));
        assert_eq!(
            until(&Value::String("2000-01-01T00:00:00Z".into())),
            "expired"
        );
        assert_eq!(
            when(&Value::String("2025-01-07T10:15:02.118Z".into())),
            "2025-01-07 10:15:02"
        );
    }
}
