"""Anchoring to an S3-compatible object store (moto's server, run here):
a daemon puts each round's chain heads to the bucket as a new object,
`hatchery audit verify --anchors-s3-url` checks the session's chain
against them, and a rewritten tail is caught at the anchored seq; a
store that refuses or cannot be reached is counted in
hatchery_audit_anchor_failures_total while the anchor file goes on. Over
https, the store's certificate is verified: one from a CA the test makes
fails the anchoring (a certificate error, logged and counted) until the
daemon is given that CA (`--audit-anchor-s3-ca-file`), and so does the
CLI's verify (`--anchors-s3-ca-file`)."""

import json
import os
import shutil
import sqlite3
import subprocess
import tempfile
import time

import pytest

from broker_support import BrokerDaemon, add_repo
from harness import arg, free_port
from s3server import S3Server, MadeCA

BUCKET = "hx-anchors"
PREFIX = "hosts/test"


@pytest.fixture(scope="module")
def s3():
    s = S3Server().start()
    s.create_bucket(BUCKET)
    yield s
    s.stop()


@pytest.fixture
def creds():
    d = tempfile.mkdtemp(prefix="hxs3c-")
    p = os.path.join(d, "credentials")
    with open(p, "w") as f:
        f.write("[default]\naws_access_key_id = hxtestkey\naws_secret_access_key = hxtestsecret\n")
    os.chmod(p, 0o600)
    yield p
    shutil.rmtree(d)


@pytest.fixture(scope="module")
def tls_s3():
    """moto over https, its certificate signed by a CA made here."""
    d = tempfile.mkdtemp(prefix="hxs3tls-")
    ca = MadeCA(d)
    s = S3Server(tls=ca).start()
    s.create_bucket(BUCKET)
    yield s
    s.stop()
    shutil.rmtree(d)


def s3_daemon(model, git_server, push_server, forge, url, creds, extra=()):
    # BrokerDaemon anchors every second (--audit-anchor-interval 1).
    return BrokerDaemon(model.port, git_server, push_server, forge,
                        extra=["--audit-anchor-s3-url", url,
                               "--audit-anchor-s3-credentials-file", creds, *extra]).start()


def finished_session(d, name):
    """A session that ran to its end: its chain stops moving."""
    repo, _ = add_repo(d.git_server, name)
    sid = d.new_session(repo, "[script:quick] anything")
    d.wait_state(sid, "completed")
    d.track_sandboxes(sid)
    return sid, len(d.all_events(sid))


def wait_for(pred, what, timeout=30):
    deadline = time.time() + timeout
    while time.time() < deadline:
        v = pred()
        if v:
            return v
        time.sleep(0.25)
    raise AssertionError(f"no {what} within {timeout} s")


def metric(d, name, sink):
    for line in d.request("GET", "/metrics").body.decode().splitlines():
        if line.startswith(f'{name}{{sink="{sink}"}}'):
            return float(line.split()[-1])
    return 0.0


def verify(*args):
    cli = os.path.join(os.environ["HATCHERY_BIN_DIR"], "hatchery")
    return subprocess.run([cli, "audit", "verify", *args], capture_output=True, text=True, timeout=120)


def test_s3_anchors_verify_the_chain_and_catch_a_dropped_tail(model, git_server, push_server, forge, s3, creds):
    url = f"{s3.base}/{BUCKET}/{PREFIX}"
    d = s3_daemon(model, git_server, push_server, forge, url, creds)
    try:
        sid, n = finished_session(d, "s3anchor")
        head = f'"chain":"{sid}","seq":{n},'
        # The head reaches the bucket, in an object of its own round under
        # PREFIX/all/, never overwritten.
        key = wait_for(lambda: next((k for k in s3.keys(BUCKET, PREFIX + "/all/")
                                     if head in s3.get(BUCKET, k)), None), "S3 anchor of the session's head")
        assert key.startswith(PREFIX + "/all/") and key.endswith(".jsonl"), key
        # The store refuses to overwrite an object (If-None-Match: *), as the daemon's puts ask.
        assert s3.put(BUCKET, key, b"forged\n", {"If-None-Match": "*"}) == 412
        # The file got the same head.
        anchors = os.path.join(d.data_dir, "session-anchors.jsonl")
        assert any(head in line for line in open(anchors))
        db = arg(d.extra_args, "--db") or os.path.join(d.data_dir, "hatchery.db")
        s3args = ["--anchors-s3-url", url, "--anchors-s3-credentials-file", creds]
        r = verify("--db", db, sid, *s3args, "--json")
        assert r.returncode == 0, (r.stdout, r.stderr)
        assert json.loads(r.stdout)["verified"] == n
        if db.startswith("postgres"):
            return  # the tamper half edits a SQLite file
        # Drop the chain's last event, in a consistent copy of the live
        # database: a shorter chain, which passes on its own; the bucket's
        # anchor of seq n does not.
        tampered = os.path.join(os.path.dirname(creds), "tampered.db")
        src, c = sqlite3.connect(db), sqlite3.connect(tampered)
        src.backup(c)
        src.close()
        c.execute("DELETE FROM session_events WHERE session_id = ? AND seq = ?", (sid, n))
        c.commit()
        c.close()
        db = tampered
        r = verify("--db", db, sid)
        assert r.returncode == 0, (r.stdout, r.stderr)
        r = verify("--db", db, sid, *s3args)
        assert r.returncode == 3, (r.stdout, r.stderr)
        assert f"{sid}: BAD at seq {n}: anchor_mismatch" in r.stdout, r.stdout
        # Wrong credentials file: a typed error, exit 1.
        r = verify("--db", db, sid, "--anchors-s3-url", url, "--anchors-s3-credentials-file", creds + ".missing")
        assert r.returncode == 1 and "credentials file" in r.stderr, r.stderr
    finally:
        d.cleanup_sessions()


@pytest.mark.parametrize("store", ["refusing", "unreachable"])
def test_a_failing_store_is_counted_while_the_file_anchors(model, git_server, push_server, forge, s3, creds, store):
    # A bucket that does not exist (the store answers 404 NoSuchBucket),
    # or a loopback port nothing listens on.
    url = (f"{s3.base}/no-such-bucket/p" if store == "refusing"
           else f"http://127.0.0.1:{free_port()}/{BUCKET}/p")
    d = s3_daemon(model, git_server, push_server, forge, url, creds)
    try:
        sid, n = finished_session(d, f"s3fail-{store}")
        anchors = os.path.join(d.data_dir, "session-anchors.jsonl")
        head = f'"chain":"{sid}","seq":{n},'
        wait_for(lambda: os.path.exists(anchors) and any(head in line for line in open(anchors)),
                 "file anchor of the session's head")
        wait_for(lambda: metric(d, "hatchery_audit_anchor_failures_total", "s3") >= 2,
                 "counted S3 failures (one per round)")
        assert metric(d, "hatchery_audit_anchors_total", "file") >= 1
        assert metric(d, "hatchery_audit_anchors_total", "s3") == 0
        failed = [line for line in d.log().splitlines() if "audit anchoring failed" in line]
        # Logged once, not once a round (rate-limited), naming the sink and why.
        assert len(failed) == 1, failed
        assert "s3" in failed[0], failed
        assert ("NoSuchBucket" if store == "refusing" else "cannot connect") in failed[0], failed
    finally:
        d.cleanup_sessions()


def test_an_https_store_is_verified_against_the_ca_file(model, git_server, push_server, forge, tls_s3, creds):
    url = f"{tls_s3.base}/{BUCKET}/tls"
    assert url.startswith("https://127.0.0.1:")
    # Without the CA: the system's bundle does not know the test's CA, so
    # every round fails on the certificate (counted, logged once) while
    # the file anchors; nothing reaches the bucket.
    d = s3_daemon(model, git_server, push_server, forge, url, creds)
    try:
        sid, n = finished_session(d, "s3tls-noca")
        wait_for(lambda: metric(d, "hatchery_audit_anchor_failures_total", "s3") >= 2,
                 "counted S3 certificate failures")
        assert metric(d, "hatchery_audit_anchors_total", "s3") == 0
        assert metric(d, "hatchery_audit_anchors_total", "file") >= 1
        failed = [line for line in d.log().splitlines() if "audit anchoring failed" in line]
        assert len(failed) == 1 and "certificate" in failed[0], failed
        assert tls_s3.keys(BUCKET, "tls/all/") == []
    finally:
        d.cleanup_sessions()
    # With it: the session's head is put over https and verifies.
    d = s3_daemon(model, git_server, push_server, forge, url, creds,
                  extra=["--audit-anchor-s3-ca-file", tls_s3.tls.ca])
    try:
        sid, n = finished_session(d, "s3tls-ca")
        head = f'"chain":"{sid}","seq":{n},'
        wait_for(lambda: any(head in tls_s3.get(BUCKET, k) for k in tls_s3.keys(BUCKET, "tls/all/")),
                 "S3 anchor over https")
        assert metric(d, "hatchery_audit_anchor_failures_total", "s3") == 0
        db = arg(d.extra_args, "--db") or os.path.join(d.data_dir, "hatchery.db")
        s3args = ["--anchors-s3-url", url, "--anchors-s3-credentials-file", creds]
        r = verify("--db", db, sid, *s3args, "--anchors-s3-ca-file", tls_s3.tls.ca, "--json")
        assert r.returncode == 0, (r.stdout, r.stderr)
        assert json.loads(r.stdout)["verified"] == n
        # The CLI without the CA: the certificate is refused, exit 1.
        r = verify("--db", db, sid, *s3args)
        assert r.returncode == 1 and "certificate" in r.stderr, r.stderr
    finally:
        d.cleanup_sessions()
