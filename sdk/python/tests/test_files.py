import pytest

from hatchery import Conflict, FileEntry, NotFound, TooLarge

import support


def test_write_read_list_remove_exists(sbx):
    fs = sbx.filesystem
    fs.write("/workspace/a.txt", "héllo\n")
    blob = bytes(range(256)) * 4
    fs.write("/workspace/sub/dir/b.bin", blob)  # parents are created
    assert fs.read("/workspace/a.txt") == "héllo\n".encode()
    assert fs.read_text("/workspace/a.txt") == "héllo\n"
    assert fs.read("/workspace/sub/dir/b.bin") == blob
    assert isinstance(fs.read("/workspace/a.txt"), bytes)

    entries = {e.name: e for e in fs.list("/workspace")}
    assert {"a.txt", "sub"} <= set(entries)
    a = entries["a.txt"]
    assert isinstance(a, FileEntry) and a.type == "file" and a.size == 7 and a.mode == 0o644 and a.mtime > 0
    assert entries["sub"].type == "dir"

    assert fs.exists("/workspace/a.txt") and fs.exists("/workspace/sub") and fs.exists("/")
    assert not fs.exists("/workspace/missing") and not fs.exists("/nope/deeper")
    assert not fs.exists("/workspace/a.txt/under-a-file")

    fs.remove("/workspace/sub")
    assert not fs.exists("/workspace/sub")
    with pytest.raises(NotFound) as e:
        fs.remove("/workspace/sub")
    assert e.value.code == "file_not_found"
    # Visible to commands too.
    assert sbx.exec("cat /workspace/a.txt").stdout == "héllo\n"


def test_file_errors(sbx):
    fs = sbx.filesystem
    with pytest.raises(NotFound) as e:
        fs.read("/workspace/missing")
    assert e.value.code == "file_not_found" and e.value.status == 404
    with pytest.raises(Conflict) as e:
        fs.read("/workspace")
    assert e.value.code == "file_conflict"
    with pytest.raises(TooLarge) as e:
        fs.write("/workspace/big", b"x" * (support.MAX_FILE_BYTES + 1))
    assert e.value.status == 413 and e.value.code == "too_large"
    fs.write("/workspace/ok", b"x" * support.MAX_FILE_BYTES)
    assert len(fs.read("/workspace/ok")) == support.MAX_FILE_BYTES
    assert not fs.exists("/workspace/big")
