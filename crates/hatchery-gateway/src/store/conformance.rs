//! The contract of the budget store, run on both databases: SQLite (a
//! scratch database and a file) and a private PostgreSQL
//! (`conformance_on_postgres`). Scope names are unique per run, so a
//! database may be reused.

use crate::budget::{Amount, BudgetError, BudgetStore, Caller, KeyStore};
use crate::store::Settlement;
use std::sync::Arc;

fn amt(tokens: u64) -> Amount {
    Amount {
        tokens,
        usd_cents: 0,
    }
}

fn cents(c: u64) -> Amount {
    Amount {
        tokens: 0,
        usd_cents: c,
    }
}

pub async fn run_all<S: BudgetStore + KeyStore + 'static>(s: &S) {
    let run = format!("{:x}", rand::random::<u32>());
    reservations_count_until_settled(s, &run).await;
    refused_reservations_hold_nothing(s, &run).await;
    janitor_charges_expired_only(s, &run).await;
    a_scope_s_open_reservations_are_charged_whole(s, &run).await;
    spend_of_unlimited_scopes_is_recorded(s, &run).await;
    an_overage_blocks_every_session_of_its_tenant(s, &run).await;
    keys_and_bindings(s, &run).await;
}

async fn reservations_count_until_settled<S: BudgetStore>(s: &S, run: &str) {
    let scope = format!("session:a{run}");
    s.set_limits(&scope, Some(100), None).await.unwrap();
    let scopes = vec![scope.clone()];
    let (r1, r2) = (format!("r1{run}"), format!("r2{run}"));
    s.reserve(&r1, &scopes, amt(60), 0, 1000).await.unwrap();
    let e = s.reserve(&r2, &scopes, amt(60), 0, 1000).await;
    let exhausted = matches!(e, Err(BudgetError::Exhausted { reserved: 60, .. }));
    assert!(exhausted, "{e:?}");
    // Settling at the actual (smaller) usage frees the rest; once only.
    assert!(s.settle(&r1, &scopes, amt(10)).await.unwrap());
    let again = s.settle(&r1, &scopes, amt(10)).await;
    assert!(!again.unwrap(), "idempotent");
    s.reserve(&r2, &scopes, amt(60), 0, 1000).await.unwrap();
    let b = s.get(&scope).await.unwrap();
    assert_eq!((b.used_tokens, b.reserved_tokens), (10, 60));
}

async fn refused_reservations_hold_nothing<S: BudgetStore>(s: &S, run: &str) {
    let (t, a) = (format!("tenant:t{run}"), format!("session:b{run}"));
    s.set_limits(&t, Some(1000), None).await.unwrap();
    s.set_limits(&a, Some(50), None).await.unwrap();
    let scopes = vec![t.clone(), a.clone()];
    let refused = s
        .reserve(&format!("r{run}"), &scopes, amt(80), 0, 1000)
        .await;
    assert!(refused.is_err());
    assert_eq!(s.get(&t).await.unwrap().reserved_tokens, 0);
}

async fn janitor_charges_expired_only<S: BudgetStore>(s: &S, run: &str) {
    // The store's clock (the database's, when shared) is the wall clock
    // give or take skew; a minute's slack.
    let now = s.now_ms().await.unwrap();
    assert!(now.abs_diff(crate::now_ms()) < 60_000, "store clock {now}");
    let scope = format!("session:c{run}");
    s.set_limits(&scope, None, Some(10)).await.unwrap();
    let scopes = vec![scope.clone()];
    let (old, new) = (format!("old{run}"), format!("new{run}"));
    for (id, ttl) in [(&old, 100), (&new, 10_000_000_000_000)] {
        s.reserve(id, &scopes, cents(5), 0, ttl).await.unwrap();
    }
    let expired = s.expire(5_000).await.unwrap();
    let mine: Vec<_> = expired.iter().filter(|e| e.id == old).collect();
    assert_eq!(mine.len(), 1, "{expired:?}");
    assert_eq!(
        (mine[0].scopes.clone(), mine[0].charged),
        (scopes.clone(), cents(5))
    );
    assert_eq!(mine[0].caller().unwrap().session, format!("c{run}"));
    // The expired one is charged whole; the live one stays reserved.
    let b = s.get(&scope).await.unwrap();
    assert_eq!((b.used_usd_cents, b.reserved_usd_cents), (5, 5));
    // A late settle of the expired one records nothing more; expiring
    // again charges nothing again.
    assert!(!s.settle(&old, &scopes, cents(3)).await.unwrap());
    assert!(s.expire(5_000).await.unwrap().iter().all(|e| e.id != old));
    assert_eq!(s.get(&scope).await.unwrap().used_usd_cents, 5);
    s.settle(&new, &scopes, cents(0)).await.unwrap();
}

async fn a_scope_s_open_reservations_are_charged_whole<S: BudgetStore>(s: &S, run: &str) {
    let (ses, other, ten) = (
        format!("session:e{run}"),
        format!("session:f{run}"),
        format!("tenant:e{run}"),
    );
    let (mine, theirs) = (
        vec![ses.clone(), ten.clone()],
        vec![other.clone(), ten.clone()],
    );
    s.reserve(&format!("e1{run}"), &mine, amt(30), 0, 10_000_000_000_000)
        .await
        .unwrap();
    s.reserve(&format!("f1{run}"), &theirs, amt(7), 0, 10_000_000_000_000)
        .await
        .unwrap();
    let charged = s.charge_open(&ses).await.unwrap();
    assert_eq!(charged.len(), 1, "{charged:?}");
    assert_eq!(
        (charged[0].scopes.clone(), charged[0].charged),
        (mine.clone(), amt(30))
    );
    // Both of its scopes charged; the other session's call untouched.
    assert_eq!(s.get(&ses).await.unwrap().used_tokens, 30);
    let t = s.get(&ten).await.unwrap();
    assert_eq!((t.used_tokens, t.reserved_tokens), (30, 7));
    assert_eq!(s.open_reservations(&ses).await.unwrap(), 0);
    assert_eq!(s.open_reservations(&other).await.unwrap(), 1);
    // Once: again charges nothing; a late settle records nothing more.
    assert!(s.charge_open(&ses).await.unwrap().is_empty());
    assert!(!s.settle(&format!("e1{run}"), &mine, amt(3)).await.unwrap());
    assert_eq!(s.get(&ses).await.unwrap().used_tokens, 30);
    s.settle(&format!("f1{run}"), &theirs, amt(0))
        .await
        .unwrap();
}

async fn spend_of_unlimited_scopes_is_recorded<S: BudgetStore>(s: &S, run: &str) {
    let (scope, id) = (format!("tenant:u{run}"), format!("u{run}"));
    let unknown = s.get(&scope).await;
    assert!(matches!(unknown, Err(BudgetError::UnknownScope(_))));
    let scopes = vec![scope.clone()];
    s.reserve(&id, &scopes, amt(5), 0, 1000).await.unwrap();
    s.settle(&id, &scopes, amt(4)).await.unwrap();
    let b = s.get(&scope).await.unwrap();
    assert_eq!((b.limit_tokens, b.used_tokens), (None, 4));
}

/// An upstream reported 900 tokens above a call's reservation of 100
/// (charged 100) under a tenant limit of 1,000: the tenant's real spend
/// has reached its limit, so its other session's next call is refused,
/// though only 100 is recorded; a call already in flight still settles
/// (recorded spend stays within limit + one reservation). The overage is
/// recorded once per reservation, on every scope, limited or not.
async fn an_overage_blocks_every_session_of_its_tenant<S: BudgetStore>(s: &S, run: &str) {
    let (ten, liar, other) = (
        format!("tenant:o{run}"),
        format!("session:o1{run}"),
        format!("session:o2{run}"),
    );
    s.set_limits(&ten, Some(1000), None).await.unwrap();
    let (mine, theirs) = (
        vec![liar.clone(), ten.clone()],
        vec![other.clone(), ten.clone()],
    );
    let far = 10_000_000_000_000;
    let (lie, flight) = (format!("o1{run}"), format!("o2{run}"));
    s.reserve(&lie, &mine, amt(100), 0, far).await.unwrap();
    s.reserve(&flight, &theirs, amt(200), 0, far).await.unwrap();
    let settled = Settlement {
        id: lie.clone(),
        scopes: mine.clone(),
        actual: amt(100),
        overage: amt(900),
        fresh: false,
    };
    assert!(s.settle_call(&settled).await.unwrap());
    assert!(!s.settle_call(&settled).await.unwrap(), "once");
    let t = s.get(&ten).await.unwrap();
    assert_eq!(
        (t.used_tokens, t.overage_tokens, t.reserved_tokens),
        (100, 900, 200)
    );
    let l = s.get(&liar).await.unwrap();
    assert_eq!(
        (l.limit_tokens, l.used_tokens, l.overage_tokens),
        (None, 100, 900)
    );
    // 100 used + 900 over: no room for 1 token more, on either session.
    for (id, scopes) in [(format!("o3{run}"), &theirs), (format!("o4{run}"), &mine)] {
        let e = s.reserve(&id, scopes, amt(1), 0, far).await;
        let refused = matches!(e, Err(BudgetError::Exhausted { overage: 900, .. }));
        assert!(refused, "{e:?}");
    }
    // The call in flight when the overage landed settles as usual.
    assert!(s.settle(&flight, &theirs, amt(200)).await.unwrap());
    let t = s.get(&ten).await.unwrap();
    assert_eq!((t.used_tokens, t.reserved_tokens), (300, 0));
    assert!(t.used_tokens <= 1000 + 200);
    assert_eq!(s.open_reservations(&other).await.unwrap(), 0);
}

async fn keys_and_bindings<S: KeyStore>(s: &S, run: &str) {
    let c = |x: &str| Caller {
        session: format!("{x}{run}"),
        tenant: None,
    };
    let h = format!("hash{run}");
    s.add_key(&h, &c("k"), 1000).await.unwrap();
    assert_eq!(s.caller(&h, 999).await.unwrap(), Some(c("k")));
    assert_eq!(s.caller(&h, 1000).await.unwrap(), None, "expired");
    let sbx = format!("sbx_{run}");
    assert_eq!(s.caller_of_sandbox(&sbx).await.unwrap(), None);
    s.bind_sandbox(&sbx, &c("a")).await.unwrap();
    s.bind_sandbox(&sbx, &c("b")).await.unwrap();
    assert_eq!(s.caller_of_sandbox(&sbx).await.unwrap(), Some(c("b")));
    assert!(s.unbind_sandbox(&sbx).await.unwrap());
    assert!(!s.unbind_sandbox(&sbx).await.unwrap());
}

/// 50 reservations at once against a limit that fits exactly 10 of them:
/// exactly 10 are admitted, whatever the interleaving.
pub async fn concurrent_reservations<S: BudgetStore + 'static>(s: Arc<S>) {
    let run = format!("{:x}", rand::random::<u32>());
    let scope = format!("session:race{run}");
    s.set_limits(&scope, Some(1000), None).await.unwrap();
    let admitted = hatchery_db::race(50, |n| {
        let (s, scope, id) = (s.clone(), scope.clone(), format!("race{run}-{n}"));
        async move { s.reserve(&id, &[scope], amt(100), 0, 60_000).await.is_ok() }
    });
    assert_eq!(admitted.await.iter().filter(|ok| **ok).count(), 10);
    assert_eq!(s.get(&scope).await.unwrap().reserved_tokens, 1000);
}

#[cfg(test)]
#[path = "../../../hatchery-store/tests/support/pg_server.rs"]
mod pg_server;

#[cfg(test)]
mod tests {
    use super::pg_server;
    use super::*;
    use crate::store::GatewayStore;
    use hatchery_db::Db;

    /// Every check on `s`; then a second store on the same database (its
    /// migrations a no-op) reads what the first wrote, and passes them
    /// again.
    async fn twice(s: GatewayStore, again: impl std::future::Future<Output = GatewayStore>) {
        let s = Arc::new(s);
        run_all(&*s).await;
        concurrent_reservations(s.clone()).await;
        let x = format!("session:x{:x}", rand::random::<u32>());
        s.set_limits(&x, Some(1), None).await.unwrap();
        let again = again.await;
        assert_eq!(again.get(&x).await.unwrap().limit_tokens, Some(1));
        run_all(&again).await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn conformance_on_sqlite() {
        let s = Arc::new(GatewayStore::open_in_memory().await.unwrap());
        run_all(&*s).await;
        concurrent_reservations(s).await;
        // A file, opened twice.
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("hatchery.db");
        let open = || async { GatewayStore::open(Db::sqlite(&p).await.unwrap()).await };
        twice(open().await.unwrap(), async { open().await.unwrap() }).await;
    }

    /// On a private PostgreSQL (`make pg-conformance`; `make unit` skips
    /// it by its name). Nothing here is skipped.
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn conformance_on_postgres() {
        let pg = pg_server::TestPg::start();
        let open = |pool| GatewayStore::open(Db::postgres(&pg.dsn, pool).unwrap());
        twice(open(16).await.unwrap(), async { open(2).await.unwrap() }).await;
        let down = Db::postgres("postgres://postgres@127.0.0.1:1/hatchery", 1).unwrap();
        let Err(e) = GatewayStore::open(down).await else {
            panic!("connected to port 1")
        };
        assert!(e.unavailable(), "{e:?}");
    }
}
