"""`hatchery cp`: both directions, binary content, directories as targets,
stdin/stdout, and the mistakes people make."""

import hashlib
import os


def test_binary_round_trip_both_ways(hx, sbx, tmp_path):
    data = os.urandom(300_000) + bytes(range(256))
    src = tmp_path / "blob.bin"
    src.write_bytes(data)
    hx("cp", str(src), f"{sbx}:/workspace/in/blob.bin", check=0)
    # The bytes arrived intact: check inside the sandbox, too.
    digest = hx("exec", sbx, "--", "sha256sum /workspace/in/blob.bin", check=0).stdout.split()[0]
    assert digest == hashlib.sha256(data).hexdigest()
    back = tmp_path / "back.bin"
    hx("cp", f"{sbx}:/workspace/in/blob.bin", str(back), check=0)
    assert back.read_bytes() == data
    # Made in the sandbox, copied out.
    hx("exec", sbx, "--", "head -c 5000 /dev/urandom > /tmp/made && sha256sum /tmp/made > /tmp/made.sum", check=0)
    hx("cp", f"{sbx}:/tmp/made", str(tmp_path), check=0)
    want = hx("cp", f"{sbx}:/tmp/made.sum", "-", check=0).stdout.split()[0]
    assert hashlib.sha256((tmp_path / "made").read_bytes()).hexdigest() == want


def test_directories_as_targets_and_stdio(hx, sbx, tmp_path):
    src = tmp_path / "main.py"
    src.write_text("print(1)\n")
    hx("cp", str(src), f"{sbx}:/workspace/", check=0)
    hx("exec", sbx, "--", "mkdir /srv/app", check=0)
    hx("cp", str(src), f"{sbx}:/srv/app", check=0)
    out = hx("exec", sbx, "--", "cat /workspace/main.py /srv/app/main.py", check=0).stdout
    assert out == "print(1)\n" * 2
    hx("cp", "-", f"{sbx}:/tmp/from-stdin.txt", input="piped\n", check=0)
    assert hx("cp", f"{sbx}:/tmp/from-stdin.txt", "-", check=0).stdout == "piped\n"
    outdir = tmp_path / "out"
    outdir.mkdir()
    hx("cp", f"{sbx}:/tmp/from-stdin.txt", f"{outdir}/", check=0)
    assert (outdir / "from-stdin.txt").read_text() == "piped\n"


def test_mistakes(hx, sbx, tmp_path):
    f = tmp_path / "f"
    f.write_text("x")
    cases = [
        (["cp", f"{sbx}:/nope", str(tmp_path)], f"no file {sbx}:/nope"),
        (["cp", f"{sbx}:/tmp", str(tmp_path)], "is a directory"),
        (["cp", str(tmp_path), f"{sbx}:/tmp/"], "is a directory"),
        (["cp", str(f), str(tmp_path / "g")], "one side must be in a sandbox"),
        (["cp", f"{sbx}:/a", f"{sbx}:/b"], "both sides are in sandboxes"),
        (["cp", str(f), f"{sbx}:relative"], "absolute"),
        (["cp", "-", f"{sbx}:/tmp/"], "stdin has no name"),
        (["cp", str(tmp_path / "missing"), f"{sbx}:/tmp/x"], "reading"),
        (["cp", str(f), "sbx_0000000000000000:/tmp/x"], "no sandbox sbx_0000000000000000"),
        (["cp", "sbx_0000000000000000:/tmp/x", str(tmp_path)], "no sandbox sbx_0000000000000000"),
    ]
    for args, msg in cases:
        p = hx(*args, input="")
        assert p.returncode == 1 and msg in p.stderr, (args, p.stderr)
    assert not (tmp_path / "g").exists()


def test_file_over_the_daemons_limit(hx, sbx, tmp_path):
    big = tmp_path / "big"
    big.write_bytes(b"\0" * (5 << 20))  # the test daemon allows 4 MiB
    p = hx("cp", str(big), f"{sbx}:/tmp/big")
    assert p.returncode == 1 and "too_large" in p.stderr, p.stderr
