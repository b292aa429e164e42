"""E2B's snapshot API (`create_snapshot`, `list_snapshots`, `delete_snapshot`,
`Sandbox.create(snapshot_id)`) through the official Python SDK, over
Hatchery's snapshots."""

import pytest
from e2b import Sandbox



def test_create_list_restore_and_delete_snapshots(sbx, daemon):
    sbx.files.write("/home/user/app/data.txt", "from the original")
    sbx.commands.run("echo 'counter = 41' > /home/user/app/state.py")
    snap = sbx.create_snapshot()
    named = Sandbox.create_snapshot(sbx.sandbox_id, name="snap-e2b-test")
    try:
        assert snap.snapshot_id.startswith("snap_") and snap.names == []
        assert named.names == ["snap-e2b-test"]
        assert sbx.is_running()  # Hatchery checkpoints without stopping it

        # Two sandboxes from one snapshot, independent of each other and of the source.
        a, b = Sandbox.create(snap.snapshot_id, timeout=120), Sandbox.create("snap-e2b-test", timeout=120)
        try:
            assert a.sandbox_id != b.sandbox_id != sbx.sandbox_id
            assert a.files.read("/home/user/app/data.txt") == "from the original"
            assert b.files.read("/home/user/app/data.txt") == "from the original"
            a.files.write("/home/user/app/data.txt", "changed in a")
            assert b.files.read("/home/user/app/data.txt") == "from the original"
            assert sbx.files.read("/home/user/app/data.txt") == "from the original"
            assert a.get_info().template_id == "base"
        finally:
            a.kill()
            b.kill()

        listed = Sandbox.list_snapshots().next_items()
        assert {snap.snapshot_id, named.snapshot_id} <= {x.snapshot_id for x in listed}
        mine = Sandbox.list_snapshots(sandbox_id=sbx.sandbox_id).next_items()
        assert sorted(x.snapshot_id for x in mine) == sorted([snap.snapshot_id, named.snapshot_id])
        assert [x.snapshot_id for x in Sandbox.list_snapshots(name="snap-e2b-test").next_items()] == [
            named.snapshot_id]
        assert Sandbox.list_snapshots(name="snap-e2b-test-none").next_items() == []
        # Pages: one at a time, newest first.
        p = Sandbox.list_snapshots(sandbox_id=sbx.sandbox_id, limit=1)
        first = p.next_items()
        assert p.has_next and [x.snapshot_id for x in first] == [named.snapshot_id]
        assert [x.snapshot_id for x in p.next_items()] == [snap.snapshot_id] and not p.has_next
    finally:
        assert Sandbox.delete_snapshot(snap.snapshot_id) is True
        assert Sandbox.delete_snapshot(named.snapshot_id) is True
    assert Sandbox.delete_snapshot(snap.snapshot_id) is False
    assert Sandbox.list_snapshots(sandbox_id=sbx.sandbox_id).next_items() == []
    with pytest.raises(Exception, match="not found"):
        Sandbox.create(snap.snapshot_id)


def test_pauses_are_not_snapshots_and_templates_are_not_deleted(daemon):
    s = Sandbox.create("base", timeout=120)
    try:
        assert s.pause() is True
        # The pause record is a Hatchery snapshot, but not an E2B one.
        assert s.sandbox_id not in {x.snapshot_id for x in Sandbox.list_snapshots().next_items()}
        assert Sandbox.list_snapshots(sandbox_id=s.sandbox_id).next_items() == []
        # delete_snapshot never deletes a template.
        assert Sandbox.delete_snapshot("base") is False
        r = daemon.request("GET", "/v1/templates/base")
        assert r.status == 200
        # A paused sandbox cannot be snapshotted until resumed.
        with pytest.raises(Exception, match="paused"):
            Sandbox.create_snapshot(s.sandbox_id)
    finally:
        Sandbox.kill(s.sandbox_id)
