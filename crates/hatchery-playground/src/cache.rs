//! Result cache: the events of a finished run, keyed by a hash of the
//! template, its version and the snippet, so an exact re-run is replayed
//! without a sandbox. Bounded in entries and bytes; least recently used goes.

use crate::events::{Exit, Output};
use sha2::{Digest, Sha256};
use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};

#[derive(Debug, thiserror::Error)]
pub enum CacheError {
    #[error("entry of {0} bytes is over the cache's byte bound")]
    TooBig(usize),
}

#[derive(Debug, Clone)]
pub struct Entry {
    pub output: Vec<Output>,
    pub exit: Exit,
}

impl Entry {
    fn bytes(&self) -> usize {
        let exception = self.exit.exception.as_ref();
        self.output.iter().map(|o| o.data.len() + 16).sum::<usize>()
            + exception.map_or(0, |e| e.name.len() + e.value.len())
            + 64
    }
}

pub fn key(template: &str, version: &str, code: &str) -> String {
    let mut h = Sha256::new();
    for part in [template, version, code] {
        h.update((part.len() as u64).to_le_bytes());
        h.update(part.as_bytes());
    }
    h.finalize().iter().map(|b| format!("{b:02x}")).collect()
}

struct Inner {
    map: HashMap<String, (Arc<Entry>, u64)>,
    lru: BTreeMap<u64, String>,
    tick: u64,
    bytes: usize,
}

pub struct Cache {
    max_entries: usize,
    max_bytes: usize,
    inner: Mutex<Inner>,
}

impl Cache {
    pub fn new(max_entries: usize, max_bytes: usize) -> Self {
        Cache {
            max_entries,
            max_bytes,
            inner: Mutex::new(Inner {
                map: HashMap::new(),
                lru: BTreeMap::new(),
                tick: 0,
                bytes: 0,
            }),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub fn get(&self, key: &str) -> Option<Arc<Entry>> {
        let mut g = self.lock();
        g.tick += 1;
        let tick = g.tick;
        let (entry, old) = {
            let slot = g.map.get_mut(key)?;
            let old = std::mem::replace(&mut slot.1, tick);
            (slot.0.clone(), old)
        };
        g.lru.remove(&old);
        g.lru.insert(tick, key.to_string());
        Some(entry)
    }

    pub fn put(&self, key: String, entry: Entry) -> Result<(), CacheError> {
        let size = entry.bytes();
        if self.max_entries == 0 || size > self.max_bytes {
            return Err(CacheError::TooBig(size));
        }
        let mut g = self.lock();
        g.tick += 1;
        let tick = g.tick;
        if let Some((old, t)) = g.map.remove(&key) {
            g.lru.remove(&t);
            g.bytes -= old.bytes();
        }
        while g.map.len() >= self.max_entries || g.bytes + size > self.max_bytes {
            let Some((_, k)) = g.lru.pop_first() else {
                break;
            };
            if let Some((old, _)) = g.map.remove(&k) {
                g.bytes -= old.bytes();
            }
        }
        g.bytes += size;
        g.lru.insert(tick, key.clone());
        g.map.insert(key, (Arc::new(entry), tick));
        Ok(())
    }

    pub fn len(&self) -> usize {
        self.lock().map.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn bytes(&self) -> usize {
        self.lock().bytes
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::events::Stream;

    fn entry(n: usize) -> Entry {
        Entry {
            output: vec![Output {
                stream: Stream::Stdout,
                data: "x".repeat(n),
            }],
            exit: Exit::default(),
        }
    }

    #[test]
    fn keys_differ_by_every_part() {
        let k = key("t", "v1", "print(1)");
        assert_ne!(k, key("t", "v2", "print(1)"));
        assert_ne!(k, key("u", "v1", "print(1)"));
        assert_ne!(k, key("t", "v1", "print(2)"));
        assert_ne!(
            key("ab", "c", ""),
            key("a", "bc", ""),
            "no ambiguity at part boundaries"
        );
        assert_eq!(k.len(), 64);
    }

    #[test]
    fn bounded_by_entries_lru() {
        let c = Cache::new(2, 1 << 20);
        c.put("a".into(), entry(1)).unwrap();
        c.put("b".into(), entry(1)).unwrap();
        assert!(c.get("a").is_some());
        c.put("c".into(), entry(1)).unwrap();
        assert!(c.get("b").is_none(), "least recently used evicted");
        assert!(c.get("a").is_some() && c.get("c").is_some());
        assert_eq!(c.len(), 2);
    }

    #[test]
    fn bounded_by_bytes() {
        let c = Cache::new(100, 1000);
        for i in 0..10 {
            c.put(format!("k{i}"), entry(300)).unwrap();
            assert!(c.bytes() <= 1000);
        }
        assert!(c.get("k9").is_some() && c.get("k0").is_none());
        assert!(c.put("big".into(), entry(5000)).is_err());
        c.put("k9".into(), entry(10)).unwrap();
        assert!(c.bytes() <= 1000);
    }
}
