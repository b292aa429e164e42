"""Agent sessions: a coding agent working on a repository in a sandbox.

    from hatchery import Session
    s = Session.create(repo="https://git.example.com/acme/api.git", task="Fix the flaky test")
    for ev in s.events():            # reconnects with `after` on its own
        print(ev["seq"], ev["type"])
    print(s.refresh().state, s.info["reason"])

The routes are /v1/sessions (docs/openapi-sessions.json)."""

from __future__ import annotations

import time
from typing import Any, Dict, Iterator, List, Optional

from . import errors
from ._http import path
from .client import Client, default_client

FINAL_STATES = ("completed", "failed", "cancelled")


def _is_end(ev: Dict[str, Any]) -> bool:
    return ev.get("type") == "state_changed" and ev.get("to") in FINAL_STATES


class Session:
    """One session. `info` is the last state read from the daemon."""

    def __init__(self, info: Dict[str, Any], client: Optional[Client] = None):
        self.client = client or default_client()
        self.info = info

    def __repr__(self) -> str:
        return f"<Session {self.id} {self.state}>"

    @property
    def id(self) -> str:
        return str(self.info["session_id"])

    @property
    def state(self) -> str:
        return str(self.info["state"])

    @property
    def pending_approval(self) -> Optional[Dict[str, Any]]:
        return self.info.get("pending_approval")

    @property
    def tenant(self) -> Optional[str]:
        """The tenant whose key created the session (None: the operator's)."""
        return self.info.get("tenant")

    # Calls ---------------------------------------------------------------

    @classmethod
    def create(cls, repo: Optional[str] = None, task: str = "", *, ref: Optional[str] = None,
               policy_id: Optional[str] = None,
               budget: Optional[Dict[str, int]] = None, idempotency_key: Optional[str] = None,
               template: Optional[str] = None, agent: Optional[Dict[str, Any]] = None,
               env: Optional[Dict[str, str]] = None, metadata: Optional[Dict[str, str]] = None,
               environment_id: Optional[str] = None, client: Optional[Client] = None) -> "Session":
        """`metadata`: labels kept with the session and copied to its
        sandboxes; on many hosts, `tenant` spreads one tenant's sessions.
        `environment_id`: start from that environment's current version
        (its set-up done, then the commits `ref` is ahead); `repo` may then
        be left out."""
        c = client or default_client()
        body = {k: v for k, v in dict(repo=repo, ref=ref, task=task, policy_id=policy_id, budget=budget,
                                      idempotency_key=idempotency_key, template=template, agent=agent,
                                      env=env, metadata=metadata,
                                      environment_id=environment_id).items() if v is not None}
        # With an idempotency key a retry cannot make a second session.
        r = c.transport.request("POST", "/v1/sessions", json=body, idempotent=idempotency_key is not None)
        return cls.get(r.json()["session_id"], client=c)

    @classmethod
    def get(cls, session_id: str, client: Optional[Client] = None) -> "Session":
        c = client or default_client()
        r = c.transport.request("GET", path("/v1/sessions/{id}", id=session_id), idempotent=True)
        return cls(r.json(), c)

    @classmethod
    def list(cls, state: Optional[str] = None, repo: Optional[str] = None,
             client: Optional[Client] = None) -> List["Session"]:
        """Every session (all pages), oldest first."""
        c = client or default_client()
        out: List[Session] = []
        after: Optional[str] = None
        while True:
            q = {k: v for k, v in dict(state=state, repo=repo, after=after, limit="1000").items() if v is not None}
            page = c.transport.request("GET", "/v1/sessions", query=q, idempotent=True).json()
            out += [cls(s, c) for s in page["sessions"]]
            after = page.get("next_after")
            if not after:
                return out

    def refresh(self) -> "Session":
        self.info = Session.get(self.id, self.client).info
        return self

    def message(self, text: str) -> int:
        """Steers the agent; returns the message's event seq."""
        r = self.client.transport.request("POST", path("/v1/sessions/{id}/messages", id=self.id), json={"text": text})
        return int(r.json()["seq"])

    def approve(self, approval_id: str, note: str = "", remember: Optional[str] = None) -> int:
        """`remember="session"` (egress approvals only): the session's later
        connections to the same host and port are not held again."""
        return self._decide(approval_id, "approve", note, remember)

    def deny(self, approval_id: str, note: str = "", remember: Optional[str] = None) -> int:
        return self._decide(approval_id, "deny", note, remember)

    def _decide(self, approval_id: str, decision: str, note: str, remember: Optional[str]) -> int:
        body: Dict[str, Any] = {"decision": decision, "note": note}
        if remember is not None:
            body["remember"] = remember
        r = self.client.transport.request(
            "POST", path("/v1/sessions/{id}/approvals/{aid}", id=self.id, aid=approval_id), json=body)
        return int(r.json()["seq"])

    def move_policy(self, version: Optional[int] = None) -> "Session":
        """Moves the running session to another version of its policy
        (default: the latest); its next egress connections use it."""
        body: Dict[str, Any] = {} if version is None else {"version": version}
        r = self.client.transport.request("POST", path("/v1/sessions/{id}/policy", id=self.id), json=body)
        self.info = r.json()
        return self

    def cancel(self) -> "Session":
        """Stops the agent (a snapshot is kept for review). Idempotent."""
        r = self.client.transport.request("POST", path("/v1/sessions/{id}", id=self.id) + ":cancel",
                                          timeout=max(self.client.transport.timeout, 120), idempotent=True)
        self.info = r.json()
        return self

    def events_page(self, after: int = 0, limit: int = 100) -> Dict[str, Any]:
        r = self.client.transport.request("GET", path("/v1/sessions/{id}/events", id=self.id),
                                          query={"after": str(after), "limit": str(limit), "format": "json"},
                                          idempotent=True)
        page: Dict[str, Any] = r.json()
        return page

    def events(self, after: int = 0, follow: bool = True, max_reconnects: int = 100) -> Iterator[Dict[str, Any]]:
        """Every event after `after`, in order, each once. Following, it
        ends after the session's final state change; a dropped stream is
        reopened with `after` = the last seq seen."""
        if not follow:
            while True:
                page = self.events_page(after, 1000)
                for ev in page["events"]:
                    after = ev["seq"]
                    yield ev
                if not page["has_more"]:
                    return
        failures = 0
        while True:
            try:
                sse = self.client.transport.stream(
                    "GET", path("/v1/sessions/{id}/events", id=self.id), query={"after": str(after)},
                    timeout=max(self.client.transport.timeout, 60))
                for _kind, ev in sse:
                    if ev["seq"] <= after:
                        continue
                    after = ev["seq"]
                    failures = 0
                    yield ev
                    if _is_end(ev):
                        sse.close()
                        return
            except (errors.StreamError, errors.ConnectionFailed, errors.SandboxTimeout, errors.ServiceUnavailable):
                failures += 1
                if failures > max_reconnects:
                    raise
                time.sleep(min(0.2 * failures, 2.0))
                continue
            # The server ended the stream without the final event (it
            # restarted): reconnect unless the session is over.
            if self.refresh().state in FINAL_STATES and after >= int(self.info["last_seq"]):
                return
            failures += 1
            if failures > max_reconnects:
                raise errors.StreamError("event stream keeps ending early")
            time.sleep(min(0.2 * failures, 2.0))

    def wait(self, states: Any = FINAL_STATES, timeout: float = 600.0, poll: float = 0.25) -> "Session":
        want = {states} if isinstance(states, str) else set(states)
        deadline = time.monotonic() + timeout
        while True:
            if self.refresh().state in want:
                return self
            if self.state in FINAL_STATES:
                raise errors.HatcheryError(f"session {self.id} ended {self.state}: {self.info.get('reason')}")
            if time.monotonic() > deadline:
                raise errors.SandboxTimeout(f"session {self.id} still {self.state} after {timeout}s")
            time.sleep(poll)


class Environment:
    """A repository's set-up done once (/v1/environments): `build()` runs
    the set-up script in a sandbox with the set-up's own egress, closes it
    and snapshots the result as a new version; sessions created with
    `environment_id` start from the current version.

        e = Environment.create(name="api", repo=URL, setup="pip install -r requirements.txt",
                               setup_allow=[{"cidr": "10.0.0.5", "ports": [443]}])
        e.build(on_event=lambda kind, data: print(kind, data))
        s = Session.create(environment_id=e.id, task="Fix the flaky test")
    """

    def __init__(self, info: Dict[str, Any], client: Optional[Client] = None):
        self.client = client or default_client()
        self.info = info

    def __repr__(self) -> str:
        return f"<Environment {self.id} v{self.version}>"

    @property
    def id(self) -> str:
        return str(self.info["environment_id"])

    @property
    def version(self) -> Optional[int]:
        cur = self.info.get("current")
        return None if cur is None else int(cur["version"])

    @classmethod
    def create(cls, name: str, repo: str, *, ref: Optional[str] = None, template: Optional[str] = None,
               setup: str = "", setup_allow: Optional[List[Dict[str, Any]]] = None,
               setup_timeout_s: Optional[int] = None, pool_size: Optional[int] = None,
               client: Optional[Client] = None) -> "Environment":
        """`pool_size` (0..8, default 2): sandboxes of the current version the
        host keeps restored while the environment is hot, so that a session
        claims one instead of restoring."""
        c = client or default_client()
        body = {k: v for k, v in dict(name=name, repo=repo, ref=ref, template=template, setup=setup,
                                      setup_allow=setup_allow, setup_timeout_s=setup_timeout_s,
                                      pool_size=pool_size).items()
                if v is not None}
        return cls(c.transport.request("POST", "/v1/environments", json=body).json(), c)

    @classmethod
    def get(cls, environment_id: str, client: Optional[Client] = None) -> "Environment":
        c = client or default_client()
        r = c.transport.request("GET", path("/v1/environments/{id}", id=environment_id), idempotent=True)
        return cls(r.json(), c)

    @classmethod
    def list(cls, client: Optional[Client] = None) -> List["Environment"]:
        c = client or default_client()
        r = c.transport.request("GET", "/v1/environments", idempotent=True)
        return [cls(e, c) for e in r.json()["environments"]]

    def refresh(self) -> "Environment":
        self.info = Environment.get(self.id, self.client).info
        return self

    def build(self, on_event: Any = None, timeout: float = 3900.0) -> int:
        """Builds a new version, following its progress (`on_event(kind,
        data)` for each `step` and `log`); returns the version. A failed
        set-up raises with the daemon's reason, and makes no version."""
        sse = self.client.transport.stream("POST", path("/v1/environments/{id}", id=self.id) + ":build",
                                           timeout=timeout)
        try:
            for kind, data in sse:
                if kind == "done":
                    self.refresh()
                    return int(data["version"])
                if kind == "error":
                    err = data.get("error", {})
                    raise errors.HatcheryError(str(err.get("message", "build failed")), code=err.get("code"))
                if on_event is not None:
                    on_event(kind, data)
        finally:
            sse.close()
        raise errors.StreamError("the build's event stream ended before the build did")

    def delete(self) -> None:
        """Deletes it and its snapshots; refused (409) while sessions use it."""
        self.client.transport.request("DELETE", path("/v1/environments/{id}", id=self.id))
