//! Cheap refusals: token buckets per client IP and per session cookie, the
//! global in-flight cap, and which address a request really comes from.

use crate::config::{canonical, Cidr};
use std::collections::HashMap;
use std::hash::Hash;
use std::net::IpAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

#[derive(Debug, thiserror::Error)]
pub enum LimitError {
    #[error("rate limited; retry in {0:?}")]
    RateLimited(Duration),
    #[error("too many runs in flight")]
    Busy,
}

/// Above this many tracked keys, full buckets (keys idle long enough to have
/// refilled) are forgotten; a full bucket holds no information.
const SWEEP_AT: usize = 10_000;
/// Hard ceiling on tracked keys, so a flood of spoofed keys cannot grow memory
/// without bound; past it the oldest-touched keys go first.
const MAX_KEYS: usize = 200_000;

#[derive(Debug, Clone, Copy)]
struct Bucket {
    tokens: f64,
    at: Instant,
}

/// Token buckets keyed by K: `burst` tokens, refilled at `per_minute`.
pub struct Buckets<K> {
    burst: f64,
    per_sec: f64,
    map: Mutex<HashMap<K, Bucket>>,
}

impl<K: Hash + Eq + Clone> Buckets<K> {
    pub fn new(per_minute: f64, burst: f64) -> Self {
        Buckets {
            burst: burst.max(1.0),
            per_sec: (per_minute / 60.0).max(1e-9),
            map: Mutex::new(HashMap::new()),
        }
    }

    fn refilled(&self, b: Bucket, now: Instant) -> f64 {
        (b.tokens + now.saturating_duration_since(b.at).as_secs_f64() * self.per_sec)
            .min(self.burst)
    }

    /// Time until `key` has a whole token, or None if it has one now.
    pub fn wait(&self, key: &K, now: Instant) -> Option<Duration> {
        let map = self.map.lock().unwrap_or_else(|e| e.into_inner());
        let tokens = map.get(key).map_or(self.burst, |b| self.refilled(*b, now));
        (tokens < 1.0).then(|| Duration::from_secs_f64((1.0 - tokens) / self.per_sec))
    }

    /// Takes one token; the caller checked `wait` first.
    pub fn take(&self, key: &K, now: Instant) {
        let mut map = self.map.lock().unwrap_or_else(|e| e.into_inner());
        let tokens = map.get(key).map_or(self.burst, |b| self.refilled(*b, now));
        map.insert(
            key.clone(),
            Bucket {
                tokens: (tokens - 1.0).max(0.0),
                at: now,
            },
        );
        if map.len() > SWEEP_AT {
            let full = |b: &Bucket| self.refilled(*b, now) >= self.burst;
            map.retain(|_, b| !full(b));
            if map.len() > MAX_KEYS {
                let mut ats: Vec<Instant> = map.values().map(|b| b.at).collect();
                ats.sort_unstable();
                let cut = ats[map.len() - MAX_KEYS / 2];
                map.retain(|_, b| b.at >= cut);
            }
        }
    }

    pub fn len(&self) -> usize {
        self.map.lock().unwrap_or_else(|e| e.into_inner()).len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Both buckets must have a token; a refusal takes none, so a client that
/// keeps retrying too early does not dig itself deeper.
pub struct RateLimiter {
    pub ip: Buckets<IpAddr>,
    pub session: Buckets<String>,
}

impl RateLimiter {
    pub fn check(&self, ip: IpAddr, session: Option<&str>) -> Result<(), LimitError> {
        let now = Instant::now();
        let ip = bucket_key(ip);
        let session = session.map(str::to_string);
        let ip_wait = self.ip.wait(&ip, now);
        let session_wait = session.as_ref().and_then(|s| self.session.wait(s, now));
        if let Some(w) = ip_wait.max(session_wait) {
            return Err(LimitError::RateLimited(w));
        }
        self.ip.take(&ip, now);
        if let Some(s) = &session {
            self.session.take(s, now);
        }
        Ok(())
    }
}

/// One IPv6 client usually holds a whole /64, so that is what a bucket
/// covers; an IPv4 address is its own bucket.
pub fn bucket_key(ip: IpAddr) -> IpAddr {
    match canonical(ip) {
        IpAddr::V6(v6) => IpAddr::V6((u128::from(v6) & !((1u128 << 64) - 1)).into()),
        v4 => v4,
    }
}

/// The global cap on runs being executed at once.
#[derive(Clone)]
pub struct InFlight {
    sem: Arc<Semaphore>,
    max: usize,
}

impl InFlight {
    pub fn new(max: usize) -> Self {
        InFlight {
            sem: Arc::new(Semaphore::new(max)),
            max,
        }
    }

    pub fn try_acquire(&self) -> Result<OwnedSemaphorePermit, LimitError> {
        self.sem
            .clone()
            .try_acquire_owned()
            .map_err(|_| LimitError::Busy)
    }

    pub fn current(&self) -> usize {
        self.max - self.sem.available_permits()
    }

    /// Waits, at most `within`, until no run is in flight (each releases
    /// its permit once its sandbox is deleted), then takes every permit so
    /// that none starts; false if runs were still going at the deadline.
    pub async fn drain(&self, within: Duration) -> bool {
        let all = u32::try_from(self.max).unwrap_or(u32::MAX);
        match tokio::time::timeout(within, self.sem.acquire_many(all)).await {
            Ok(Ok(p)) => {
                p.forget();
                true
            }
            _ => false,
        }
    }
}

/// The visitor's address: the peer, unless the peer is a trusted proxy, in
/// which case X-Forwarded-For is read from the right, skipping trusted hops;
/// the first untrusted address is the client. Anything unparsable stops the
/// walk at the last address known to be good.
pub fn client_ip(peer: IpAddr, xff: Option<&str>, trusted: &[Cidr]) -> IpAddr {
    let is_trusted = |ip: IpAddr| trusted.iter().any(|c| c.contains(ip));
    let mut ip = canonical(peer);
    if !is_trusted(ip) {
        return ip;
    }
    let Some(xff) = xff else { return ip };
    for hop in xff.rsplit(',') {
        match hop.trim().parse::<IpAddr>() {
            Ok(h) => {
                ip = canonical(h);
                if !is_trusted(ip) {
                    return ip;
                }
            }
            Err(_) => return ip,
        }
    }
    ip
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bucket_refills() {
        let b: Buckets<u8> = Buckets::new(60.0, 2.0);
        let t0 = Instant::now();
        assert!(b.wait(&1, t0).is_none());
        b.take(&1, t0);
        b.take(&1, t0);
        let w = b.wait(&1, t0).expect("empty");
        assert!(
            w > Duration::from_millis(900) && w <= Duration::from_secs(1),
            "{w:?}"
        );
        assert!(b.wait(&2, t0).is_none(), "other keys unaffected");
        assert!(b.wait(&1, t0 + Duration::from_millis(1001)).is_none());
    }

    #[test]
    fn limiter_needs_both() {
        let l = RateLimiter {
            ip: Buckets::new(60.0, 1.0),
            session: Buckets::new(60.0, 1.0),
        };
        let a: IpAddr = "1.1.1.1".parse().unwrap();
        let b: IpAddr = "2.2.2.2".parse().unwrap();
        l.check(a, Some("s")).unwrap();
        assert!(
            matches!(l.check(b, Some("s")), Err(LimitError::RateLimited(_))),
            "session empty"
        );
        assert!(
            matches!(l.check(a, Some("t")), Err(LimitError::RateLimited(_))),
            "ip empty"
        );
        l.check(b, None).unwrap();
    }

    #[test]
    fn sweep_bounds_memory() {
        let b: Buckets<u32> = Buckets::new(6000.0, 1.0);
        let t0 = Instant::now();
        for i in 0..(SWEEP_AT as u32 + 5) {
            b.take(&i, t0);
        }
        b.take(&0, t0 + Duration::from_secs(10));
        assert!(b.len() <= 1, "{}", b.len());
    }

    #[test]
    fn forwarded_for() {
        let t = vec![
            Cidr::parse("127.0.0.1").unwrap(),
            Cidr::parse("10.0.0.0/8").unwrap(),
        ];
        let lo: IpAddr = "127.0.0.1".parse().unwrap();
        let ext: IpAddr = "203.0.113.9".parse().unwrap();
        assert_eq!(client_ip(lo, Some("203.0.113.9"), &t), ext);
        assert_eq!(
            client_ip(lo, Some("6.6.6.6, 203.0.113.9, 10.1.1.1"), &t),
            ext,
            "rightmost untrusted"
        );
        assert_eq!(
            client_ip(ext, Some("6.6.6.6"), &t),
            ext,
            "untrusted peer's header ignored"
        );
        assert_eq!(client_ip(lo, None, &t), lo);
        assert_eq!(client_ip(lo, Some("junk"), &t), lo);
        assert_eq!(
            client_ip(lo, Some("203.0.113.9"), &[]),
            lo,
            "no trusted proxies"
        );
    }

    #[test]
    fn ipv6_buckets_per_64() {
        let l = RateLimiter {
            ip: Buckets::new(60.0, 1.0),
            session: Buckets::new(60.0, 1.0),
        };
        l.check("2001:db8:1:2::1".parse().unwrap(), None).unwrap();
        assert!(
            l.check("2001:db8:1:2:ffff::9".parse().unwrap(), None)
                .is_err(),
            "same /64"
        );
        l.check("2001:db8:1:3::1".parse().unwrap(), None).unwrap();
        assert_eq!(
            bucket_key("::ffff:1.2.3.4".parse().unwrap()),
            "1.2.3.4".parse::<IpAddr>().unwrap()
        );
    }

    #[test]
    fn in_flight_drains() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .unwrap();
        rt.block_on(async {
            let f = InFlight::new(2);
            let p = f.try_acquire().unwrap();
            assert!(
                !f.drain(Duration::from_millis(20)).await,
                "a run is in flight"
            );
            let f2 = f.clone();
            let release = tokio::spawn(async move {
                tokio::time::sleep(Duration::from_millis(20)).await;
                drop(p);
            });
            assert!(f2.drain(Duration::from_secs(5)).await);
            release.await.unwrap();
            assert!(f.try_acquire().is_err(), "no run starts once drained");
        });
    }

    #[test]
    fn in_flight() {
        let f = InFlight::new(1);
        let p = f.try_acquire().unwrap();
        assert_eq!(f.current(), 1);
        assert!(f.try_acquire().is_err());
        drop(p);
        assert!(f.try_acquire().is_ok());
    }
}
