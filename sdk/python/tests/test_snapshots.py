import pytest

from hatchery import NotFound, Sandbox, Snapshot, SnapshotInfo


def test_snapshot_fork_list_delete(daemon, client, sbx):
    sbx.filesystem.write("/workspace/state.txt", "before")
    snap = sbx.snapshot(retention_seconds=3600, metadata={"candidate": "c-42"})
    assert isinstance(snap, Snapshot) and snap.id.startswith("snap_") and isinstance(snap.info, SnapshotInfo)
    assert snap.sandbox_id == sbx.id and snap.size_bytes > 0 and snap.metadata == {"candidate": "c-42"}
    other = sbx.snapshot()
    assert Snapshot.get(snap.id, client=client).created_at == snap.created_at
    # Only this test's: the suite's daemon also holds other suites' snapshots
    # (an interview round keeps its prepared one).
    mine = {snap.id, other.id}
    assert [s.id for s in Snapshot.list(client=client) if s.id in mine] == [snap.id, other.id]
    assert [s.id for s in Snapshot.list(metadata={"candidate": "c-42"}, client=client)] == [snap.id]

    sbx.filesystem.write("/workspace/state.txt", "after")
    fork = snap.fork(ttl_seconds=120, metadata={"role": "reviewer"})
    daemon.created.add(fork.id)
    assert isinstance(fork, Sandbox) and fork.boot_mode == "fork" and fork.metadata == {"role": "reviewer"}
    assert fork.filesystem.read_text("/workspace/state.txt") == "before"
    assert sbx.filesystem.read_text("/workspace/state.txt") == "after"

    many = snap.fork_many(2, ttl_seconds=60)
    for f in many:
        daemon.created.add(f.id)
    assert len({f.id for f in many}) == 2 and all(f.exec("cat /workspace/state.txt").stdout == "before" for f in many)
    for f in [fork, *many]:
        f.kill()

    snap.delete()
    snap.delete()  # idempotent
    other.delete()
    with pytest.raises(NotFound) as e:
        Snapshot.get(snap.id, client=client)
    assert e.value.code == "snapshot_not_found"
    with pytest.raises(NotFound):
        snap.fork()
    assert [s for s in Snapshot.list(client=client) if s.id in mine] == []


def test_a_snapshot_pool_serves_forks(daemon, client, sbx):
    import time

    from hatchery import SnapshotPool

    sbx.filesystem.write("/workspace/state.txt", "pooled")
    snap = sbx.snapshot(retention_seconds=600)
    try:
        assert snap.pool() == SnapshotPool(snapshot_id=snap.id, size=0, ready=0, sandbox_ids=[])
        p = snap.set_pool(1)
        assert p.snapshot_id == snap.id and p.size == 1
        deadline = time.time() + 120
        while snap.pool().ready < 1:
            assert time.time() < deadline, "the pool never filled"
            time.sleep(0.3)
        pooled = snap.pool().sandbox_ids
        fork = snap.fork(ttl_seconds=60)
        daemon.created.add(fork.id)
        assert fork.id in pooled and fork.boot_mode == "pool", (fork.id, pooled, fork.boot_mode)
        assert fork.filesystem.read_text("/workspace/state.txt") == "pooled"
        fork.kill()
        assert snap.set_pool(0).size == 0
    finally:
        snap.delete()
