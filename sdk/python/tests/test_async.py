import asyncio
import time

import pytest

from hatchery import NotFound, OutputChunk, StreamError
from hatchery.aio import AsyncSandbox, AsyncSnapshot, AsyncTemplate

import support


def run(coro):
    return asyncio.run(coro)


def test_async_lifecycle_files_exec_snapshot(daemon, client):
    async def main():
        s = await AsyncSandbox.create(ttl_seconds=120, metadata={"suite": "async"}, client=client)
        daemon.created.add(s.id)
        assert s.id.startswith("sbx_") and s.state == "running"
        assert [x.id for x in await AsyncSandbox.list(metadata={"suite": "async"}, client=client)] == [s.id]
        assert (await AsyncSandbox.get(s.id, client=client)).id == s.id
        await s.set_ttl(600)
        await s.filesystem.write("/workspace/a.py", "print(6*7)")
        assert await s.filesystem.read("/workspace/a.py") == b"print(6*7)"
        assert await s.filesystem.read_text("/workspace/a.py") == "print(6*7)"
        assert [e.name for e in await s.filesystem.list("/workspace")] == ["a.py"]
        assert await s.filesystem.exists("/workspace/a.py")
        r = await s.exec("python3 a.py", cwd="/workspace", timeout_seconds=10)
        assert (r.stdout, r.exit_code) == ("42\n", 0)
        await s.filesystem.remove("/workspace/a.py")
        assert not await s.filesystem.exists("/workspace/a.py")

        chunks = []
        stream = await s.exec_stream("for i in 1 2; do echo $i; sleep 0.2; done; exit 4")
        async for c in stream:
            assert isinstance(c, OutputChunk)
            chunks.append(c.data)
        assert chunks == ["1\n", "2\n"] and stream.result.exit_code == 4
        r = await (await s.exec_stream("echo waited")).wait()
        assert r.stdout == "waited\n"

        snap = await s.snapshot(retention_seconds=600, metadata={"a": "1"})
        assert (await AsyncSnapshot.get(snap.id, client=client)).sandbox_id == s.id
        assert [x.id for x in await AsyncSnapshot.list(metadata={"a": "1"}, client=client)] == [snap.id]
        f = await snap.fork(ttl_seconds=60)
        daemon.created.add(f.id)
        fs = await snap.fork_many(1, ttl_seconds=60)
        daemon.created.add(fs[0].id)
        assert (await f.exec("echo forked")).stdout == "forked\n"
        for x in (f, fs[0], s):
            await x.kill()
        await snap.delete()
        assert not await s.is_running()
        with pytest.raises(NotFound):
            await AsyncSnapshot.get(snap.id, client=client)
        assert [t.name for t in await AsyncTemplate.list(client=client)] == ["code-interpreter"]
        assert (await AsyncTemplate.get("code-interpreter", client=client)).checkpoint_ready

    run(main())


def test_async_calls_run_concurrently(daemon, client):
    async def main():
        boxes = await asyncio.gather(*(AsyncSandbox.create(ttl_seconds=60, client=client) for _ in range(3)))
        for b in boxes:
            daemon.created.add(b.id)
        t = time.time()
        results = await asyncio.gather(*(b.exec("sleep 1; echo done") for b in boxes))
        elapsed = time.time() - t
        await asyncio.gather(*(b.kill() for b in boxes))
        return results, elapsed

    results, elapsed = run(main())
    assert [r.stdout for r in results] == ["done\n"] * 3
    assert elapsed < 2.5, elapsed  # three 1 s commands overlapped


def test_async_context_manager_kills_on_exception(daemon, client):
    async def main():
        with pytest.raises(KeyError):
            async with await AsyncSandbox.create(ttl_seconds=60, client=client) as s:
                daemon.created.add(s.id)
                await s.exec("true")
                raise KeyError("boom")
        with pytest.raises(NotFound):
            await AsyncSandbox.get(s.id, client=client)

    run(main())


def test_async_stream_without_exit_raises(proxy, sbx):
    async def main():
        from hatchery import Client, Sandbox
        s = AsyncSandbox(Sandbox(sbx.info, Client(f"{proxy.url}/cut/40", support.KEY)))
        stream = await s.exec_stream("echo one; sleep 0.3; echo two; sleep 0.3; echo three")
        with pytest.raises(StreamError):
            async for _ in stream:
                pass

    run(main())


def test_async_templates_and_network(daemon, templates_dir, client):
    name = "sdk-py-async"
    support.seed_rootfs(templates_dir, name)

    async def main():
        progress = []
        t = await AsyncTemplate.build(name, setup=["true"], on_progress=lambda p, s: progress.append(s), client=client)
        assert t.name == name and progress[0] == "rootfs" and progress[-1] == "done"
        with pytest.raises(NotFound):
            async for _ in AsyncTemplate.build_events(name, "bld_nope", client=client):
                pass
        await AsyncTemplate.delete(name, client=client)
        with pytest.raises(NotFound):
            await AsyncTemplate.get(name, client=client)

        from hatchery import NetworkPolicy, NetworkRule
        async with await AsyncSandbox.create(ttl_seconds=60, client=client) as s:
            daemon.created.add(s.id)
            assert (await s.network.get()) == NetworkPolicy(egress="deny")
            want = NetworkPolicy(allow=[NetworkRule(cidr="203.0.113.0/24")])
            assert await s.network.update(want) == want
            # A denied connection (dropped on the host, never sent on) must
            # show up as an event through the async client too.
            await s.exec("python3 -c \"import socket; s=socket.socket(); s.settimeout(2); "
                         "s.connect_ex(('198.51.100.9', 443))\"", timeout_seconds=10)
            # Denied attempts reach the event log asynchronously (the
            # host's packet log is read in the background): wait, bounded.
            deadline = time.monotonic() + 10
            while True:
                evs = await s.network.events()
                if any(e.destination == "198.51.100.9" and e.port == 443 and e.protocol == "tcp" for e in evs):
                    break
                assert time.monotonic() < deadline, evs
                await asyncio.sleep(0.2)

    run(main())
