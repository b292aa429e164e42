"""Port previews (get_url, port_request, preview_url) and terminals (pty),
against the live daemon."""

import asyncio
import time

import pytest

from hatchery import (AuthError, BadRequest, PreviewUrl, SandboxTimeout, ServerError, Terminal, TerminalExit,
                      TerminalToken)
from hatchery.aio import AsyncSandbox
from hatchery import _ws


def start_server(sbx, port=8000):
    sbx.files.write("/tmp/www/hello.txt", "hello from the sandbox\n")
    proc = sbx.exec(f"cd /tmp/www && exec python3 -m http.server {port} --bind 127.0.0.1", background=True)
    deadline = time.time() + 20
    while True:
        try:
            status, _, _ = sbx.port_request(port, "GET", "/")
            if status == 200:
                return proc
        except ServerError as e:
            if e.code != "port_closed" or time.time() > deadline:
                raise
        time.sleep(0.2)


def test_accept_key():
    # RFC 6455 section 1.3's example.
    assert _ws.accept_for("dGhlIHNhbXBsZSBub25jZQ==") == "s3pPLMBiTxaQ9kYGzzhZRbK+xOo="
    key = b"\x01\x02\x03\x04"
    assert _ws._mask(_ws._mask(b"hello world", key), key) == b"hello world"


def test_get_url_port_request_and_preview(sbx, client):
    with pytest.raises(ServerError) as e:
        sbx.port_request(8000, "GET", "/")
    assert e.value.status == 502 and e.value.code == "port_closed"
    with pytest.raises(BadRequest):
        sbx.preview_url(0)

    start_server(sbx)
    url = sbx.get_url(8000, path="/hello.txt")
    assert url == f"{client.url}/v1/sandboxes/{sbx.id}/ports/8000/hello.txt"
    status, headers, body = sbx.port_request(8000, "GET", "/hello.txt")
    assert status == 200 and body == b"hello from the sandbox\n"
    status, _, _ = sbx.port_request(8000, "GET", "/missing.txt")
    assert status == 404, "the guest server's own status comes back"

    # The API-key URL works with the key and only with it.
    import urllib.request
    req = urllib.request.Request(url, headers={"Authorization": f"Bearer {client.transport._key}"})
    with urllib.request.urlopen(req) as r:
        assert r.read() == b"hello from the sandbox\n"

    p = sbx.preview_url(8000, ttl_seconds=600)
    assert isinstance(p, PreviewUrl) and p.port == 8000 and p.sandbox_id == sbx.id
    assert p.path.startswith("/preview/") and p.path.endswith("/") and p.url.endswith(p.path) and p.expires_at
    # No key: a browser's view.
    with urllib.request.urlopen(p.url + "hello.txt") as r:
        assert r.read() == b"hello from the sandbox\n"
    status, _, body = client.preview_request(p, "GET", "/hello.txt")
    assert status == 200 and body == b"hello from the sandbox\n"
    token = p.path.split("/")[2]
    bad = token[:-2] + ("A" if token[-2] != "A" else "B") + token[-1]
    status, _, body = client.preview_request(f"/preview/{bad}/", "GET", "/hello.txt")
    assert status == 403 and b"preview_denied" in body
    # On the preview origin, not the API's.
    assert not p.url.startswith(client.url + "/"), (p.url, client.url)
    status, _, body = client.preview_request(p.url.replace(token, bad), "GET", "/hello.txt")
    assert status == 403 and b"preview_denied" in body


def test_pty_echo_resize_exit(sbx):
    with sbx.pty(cols=100, rows=30) as t:
        assert isinstance(t, Terminal)
        t.write("stty size\n")
        t.read_until("30 100", timeout=15)
        t.write(b"echo h''i\n")
        t.read_until("hi\r\n", timeout=15)
        # The guest answers each resize with the size the terminal reports
        # afterwards; once it said 120x40, every program there sees it.
        t.resize(120, 40, timeout=15)
        assert t.size == (120, 40)
        t.write("stty size\n")
        t.read_until("40 120", timeout=15)
        with pytest.raises(BadRequest) as e:
            t.resize(0, 40, timeout=15)
        assert e.value.code == "invalid_resize"
        assert t.size == (120, 40)
        t.write("exit\n")
        ex = t.wait(timeout=15)
        assert isinstance(ex, TerminalExit) and ex.exit_code == 0 and ex.reason == "exited"
        assert t.read(timeout=1) is not None


def test_pty_cmd_token_and_refusals(sbx):
    tok = sbx.pty_token()
    assert isinstance(tok, TerminalToken) and tok.token and tok.expires_at
    with sbx.pty(cmd="echo from-cmd; exit 3", cwd="/tmp", token=tok.token) as t:
        t.read_until("from-cmd", timeout=15)
        assert t.wait(timeout=15).exit_code == 3
    with pytest.raises(AuthError):
        sbx.pty(token=tok.token).close()  # used up
    with pytest.raises(BadRequest):
        sbx.pty(cols=0)


def test_async_ports_and_pty(sbx):
    async def main():
        a = AsyncSandbox(sbx)
        start_server(sbx, 8001)
        status, _, body = await a.port_request(8001, "GET", "/hello.txt")
        assert status == 200 and body == b"hello from the sandbox\n"
        assert (await a.preview_url(8001)).port == 8001
        async with await a.pty(argv=["/bin/sh"]) as t:
            await t.write("echo async''ok\n")
            await t.read_until("asyncok", timeout=15)
            await t.write("exit\n")
            assert (await t.wait(timeout=15)).exit_code == 0
    asyncio.run(main())
