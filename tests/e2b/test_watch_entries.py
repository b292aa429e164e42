"""Directory watches with the official `e2b` SDK: each event's entry info
(`include_entry`, envd 0.6.3) and `allow_network_mounts` (0.6.4)."""

import time

from e2b import FileType, FilesystemEventType


def collect(handle, until, timeout=20):
    events = []
    deadline = time.time() + timeout
    while time.time() < deadline and not until(events):
        events += handle.get_new_events()
        time.sleep(0.2)
    return events


def test_events_carry_the_entry_when_asked(sbx):
    sbx.files.make_dir("we")
    sbx.files.write("we/old.txt", "x")
    h = sbx.files.watch_dir("we", include_entry=True)
    sbx.files.write("we/f.txt", "hello", metadata={"k": "v"})
    sbx.commands.run("rm /home/user/we/old.txt")
    events = collect(h, lambda ev: any(e.type == FilesystemEventType.REMOVE for e in ev))
    h.stop()
    by = {(e.name, e.type): e for e in events}
    w = by[("f.txt", FilesystemEventType.WRITE)]
    assert w.entry is not None
    assert w.entry.name == "f.txt" and w.entry.path == "/home/user/we/f.txt"
    assert w.entry.type == FileType.FILE and w.entry.owner == "user"
    assert w.entry.metadata == {"k": "v"}
    assert by[("f.txt", FilesystemEventType.CREATE)].entry.path == "/home/user/we/f.txt"
    # A removed entry is gone: no entry, as envd.
    assert by[("old.txt", FilesystemEventType.REMOVE)].entry is None


def test_events_carry_no_entry_unless_asked(sbx):
    sbx.files.make_dir("wn")
    h = sbx.files.watch_dir("wn", recursive=True)
    sbx.files.write("wn/f.txt", "hello")
    events = collect(h, lambda ev: any(e.type == FilesystemEventType.WRITE for e in ev))
    h.stop()
    assert events and all(e.entry is None for e in events)


def test_a_watch_allowing_network_mounts_works_on_a_local_directory(sbx):
    sbx.files.make_dir("wm")
    sbx.files.write("wm/f.txt", "a")
    h = sbx.files.watch_dir("wm", allow_network_mounts=True)
    sbx.files.write("wm/f.txt", "b")
    events = collect(h, lambda ev: any(e.type == FilesystemEventType.WRITE for e in ev))
    h.stop()
    assert ("f.txt", FilesystemEventType.WRITE) in [(e.name, e.type) for e in events]


def test_a_streamed_watch_carries_entries(sbx):
    # The async SDK watches with the WatchDir stream (the sync one polls).
    import asyncio
    from e2b import AsyncSandbox

    async def main():
        a = await AsyncSandbox.connect(sbx.sandbox_id)
        await a.files.make_dir("ws")
        writes = asyncio.Queue()

        def on_event(e):
            if e.type == FilesystemEventType.WRITE:
                writes.put_nowait(e)

        h = await a.files.watch_dir("ws", on_event, include_entry=True, allow_network_mounts=True)
        await a.files.write("ws/s.txt", "x", metadata={"via": "stream"})
        e = await asyncio.wait_for(writes.get(), 20)
        await h.stop()
        return e

    e = asyncio.run(main())
    assert e.name == "s.txt"
    assert e.entry.path == "/home/user/ws/s.txt" and e.entry.metadata == {"via": "stream"}
