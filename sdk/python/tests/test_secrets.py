"""Secrets through the SDK against the live daemon: stored, listed with
their length and never their value, a taken name and a bad value refused,
deleted, and a deleted one gone."""

import pytest

from hatchery import BadRequest, Conflict, NotFound, Secrets


def test_secrets_roundtrip(client):
    s = Secrets.create("sdk-py-token", "s3cr3t-value-py", client=client)
    assert (s.name, s.bytes) == ("sdk-py-token", len("s3cr3t-value-py"))
    try:
        listed = {x.name: x for x in Secrets.list(client=client)}
        assert listed["sdk-py-token"] == s
        assert "s3cr3t-value-py" not in repr(listed["sdk-py-token"].extra)
        with pytest.raises(Conflict):
            Secrets.create("sdk-py-token", "other", client=client)
        with pytest.raises(BadRequest):
            Secrets.create("sdk-py-bad", "two\nlines", client=client)
    finally:
        Secrets.delete("sdk-py-token", client=client)
    assert "sdk-py-token" not in {x.name for x in Secrets.list(client=client)}
    with pytest.raises(NotFound):
        Secrets.delete("sdk-py-token", client=client)
