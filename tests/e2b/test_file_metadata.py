"""File metadata (envd 0.6.2) with the official `e2b` SDK: an upload's
metadata becomes the file's `user.e2b.*` extended attributes in the
sandbox, and every entry info reports them (docs/e2b.md, envd)."""

import gzip
import os
import urllib.request
import urllib.error

import pytest
from e2b import Sandbox
from e2b.sandbox.filesystem.filesystem import WriteEntry


def test_the_envd_version_reported_turns_metadata_on(sbx):
    # The SDKs refuse to send metadata below 0.6.2 (TemplateException).
    assert str(sbx._envd_version) == "0.6.4"


def test_upload_metadata_is_stored_and_reported_everywhere(sbx):
    meta = {"author": "mish", "purpose": "upload"}
    info = sbx.files.write("m/a.txt", "one", metadata=meta)
    assert info.metadata == meta
    assert sbx.files.get_info("m/a.txt").metadata == meta
    # octet-stream and gzip uploads carry it too.
    assert sbx.files.write("m/b.txt", "two", metadata={"k": "b"}, use_octet_stream=True).metadata == {"k": "b"}
    assert sbx.files.write("m/c.txt", "three", metadata={"k": "c"}, gzip=True).metadata == {"k": "c"}
    assert sbx.files.read("m/c.txt") == "three"
    # One map for every file of a multi-file upload.
    infos = sbx.files.write_files([WriteEntry(path="m/d1.txt", data="1"), WriteEntry(path="m/d2.txt", data="2")],
                                  metadata={"batch": "d"})
    assert [i.metadata for i in infos] == [{"batch": "d"}] * 2
    listed = {e.name: e.metadata for e in sbx.files.list("m")}
    assert listed == {"a.txt": meta, "b.txt": {"k": "b"}, "c.txt": {"k": "c"},
                      "d1.txt": {"batch": "d"}, "d2.txt": {"batch": "d"}}
    # A rename keeps the attributes (same inode), and reports them.
    assert sbx.files.rename("m/a.txt", "m/moved.txt").metadata == meta
    # They are real xattrs in the user.e2b. namespace, readable in the guest.
    out = sbx.commands.run("python3 -c \"import os; print(os.getxattr('/home/user/m/moved.txt', 'user.e2b.author').decode())\"")
    assert out.stdout.strip() == "mish"
    # Keys are lowercased by the sandbox, as envd's.
    assert sbx.files.write("m/e.txt", "x", metadata={"Author": "A"}).metadata == {"author": "A"}


def test_an_upload_replaces_the_metadata_and_none_clears_it(sbx):
    sbx.files.write("r.txt", "1", metadata={"a": "1", "b": "2"})
    assert sbx.files.write("r.txt", "2", metadata={"b": "3"}).metadata == {"b": "3"}
    assert sbx.files.get_info("r.txt").metadata == {"b": "3"}
    info = sbx.files.write("r.txt", "3")
    assert info.metadata is None
    assert sbx.files.get_info("r.txt").metadata is None
    # Other user.* attributes are not metadata, and an upload leaves them.
    sbx.commands.run("python3 -c \"import os; os.setxattr('/home/user/r.txt', 'user.other', b'keep')\"")
    sbx.files.write("r.txt", "4", metadata={"c": "4"})
    assert sbx.files.get_info("r.txt").metadata == {"c": "4"}
    out = sbx.commands.run("python3 -c \"import os; print(os.getxattr('/home/user/r.txt', 'user.other').decode())\"")
    assert out.stdout.strip() == "keep"


def test_attributes_set_in_the_guest_are_metadata(sbx):
    sbx.files.write("x.txt", "content")
    sbx.commands.run(
        "python3 -c \"import os; p='/home/user/x.txt'; os.setxattr(p, 'user.e2b.author', b'mish');"
        " os.setxattr(p, 'user.e2b.bad', b'\\xff\\xfe'); os.setxattr(p, 'user.tool', b'no')\"")
    # Not UTF-8 is skipped (it cannot be a proto string), as envd does.
    assert sbx.files.get_info("x.txt").metadata == {"author": "mish"}
    # Directories and files written by root carry metadata too.
    sbx.commands.run("mkdir -p /home/user/dd && python3 -c \"import os; os.setxattr('/home/user/dd', 'user.e2b.k', b'v')\"")
    assert sbx.files.get_info("dd").metadata == {"k": "v"}
    assert sbx.files.write("/root/r.txt", "x", user="root", metadata={"who": "root"}).metadata == {"who": "root"}
    assert sbx.files.get_info("/root/r.txt", user="root").metadata == {"who": "root"}
    # /tmp is the sandbox's writable layer too.
    assert sbx.files.write("/tmp/t.txt", "x", metadata={"k": "tmp"}).metadata == {"k": "tmp"}


def upload(sbx, path, headers, body=b"x"):
    url = f"{os.environ['E2B_SANDBOX_URL']}/files?path={path}"
    req = urllib.request.Request(url, data=body, method="POST", headers={
        "Content-Type": "application/octet-stream", "E2b-Sandbox-Id": sbx.sandbox_id,
        "E2b-Sandbox-Port": "49983", "X-Access-Token": sbx._envd_access_token, **headers})
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def test_bad_metadata_is_400_and_writes_nothing(sbx):
    # The SDK checks keys and values before sending; the daemon checks
    # again (envd's rules), for other clients.
    cases = [
        {"X-Metadata-k": "caf\u00e9".encode().decode("latin-1")},  # not ASCII
        {"X-Metadata-k": "v" * 4096},  # over 4096 bytes in all
        {"X-Metadata-" + "k" * 247: "v"},  # key over 246 bytes
    ]
    for i, h in enumerate(cases):
        status, body = upload(sbx, f"/home/user/bad{i}.txt", h)
        assert status == 400, (h, body)
        assert b"invalid metadata" in body
        assert not sbx.files.exists(f"/home/user/bad{i}.txt")
    # At the caps exactly: accepted.
    status, body = upload(sbx, "/home/user/ok.txt", {"X-Metadata-" + "k" * 246: "v" * (4096 - 9 - 246)})
    assert status == 200, body
    assert sbx.files.get_info("ok.txt").metadata == {"k" * 246: "v" * (4096 - 9 - 246)}
    # A gzip body is checked the same way, before it is inflated.
    status, _ = upload(sbx, "/home/user/bad.gz", {"Content-Encoding": "gzip", "X-Metadata-k": "a\tb"},
                       gzip.compress(b"x"))
    assert status == 400 and not sbx.files.exists("/home/user/bad.gz")


def test_metadata_survives_pause_and_resume(daemon):
    # E2B keeps the attributes with the file system across a pause; here
    # they live in the sandbox's overlay (memory-backed upper layer), which
    # the snapshot carries.
    s = Sandbox.create("base", timeout=300)
    try:
        s.files.write("/home/user/kept.txt", "k", metadata={"stage": "before-pause"})
        s.files.write("/tmp/kept.txt", "k", metadata={"stage": "tmp"})
        assert s.pause() is True
        back = Sandbox.connect(s.sandbox_id)
        assert back.files.get_info("/home/user/kept.txt").metadata == {"stage": "before-pause"}
        assert back.files.get_info("/tmp/kept.txt").metadata == {"stage": "tmp"}
    finally:
        Sandbox.kill(s.sandbox_id)
