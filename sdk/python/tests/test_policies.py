"""Policies through the SDK against the live daemon: create, version,
read back an old version unchanged, list, and errors as typed exceptions
whose message names the rule."""

import pytest

from hatchery import BadRequest, Conflict, NotFound, Policies

RULES = [{"id": "push-own", "effect": "allow",
          "match": {"tools": ["git_push"], "args": [{"field": "branch", "op": "eq", "value": {"ctx": "session_branch"}}]}}]


def test_policies_roundtrip(client):
    p = Policies.create("sdk-py", RULES, description="from the SDK", client=client)
    assert p.version == 1 and p.document["rules"] == RULES and not p.builtin
    p2 = Policies.add_version(p.id, "sdk-py", RULES + [{"id": "rest", "effect": "deny"}], client=client)
    assert p2.version == 2 and p2.sha256 != p.sha256
    assert Policies.get(p.id, client=client).version == 2
    assert Policies.get_version(p.id, 1, client=client).document == p.document
    ids = {s.id: s for s in Policies.list(client=client)}
    assert ids[p.id].latest_version == 2 and ids["pol_standard"].builtin

    with pytest.raises(BadRequest) as e:
        Policies.add_version(p.id, "x", [{"id": "ok", "effect": "allow"}, {"id": "Bad", "effect": "deny"}], client=client)
    assert e.value.code == "invalid_policy" and 'rule 1 (id "Bad")' in str(e.value)
    with pytest.raises(Conflict):
        Policies.add_version("pol_standard", "x", [], client=client)
    with pytest.raises(NotFound):
        Policies.get_version(p.id, 3, client=client)
