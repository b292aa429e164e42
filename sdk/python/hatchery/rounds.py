"""Interview rounds (`/v1/rounds`, docs/interviews.md; wire shapes in
docs/openapi-rounds.json).

The hiring team's server holds the API key:

    from hatchery import Round
    rnd = Round.create(name="warmup", starter_files={"solution.py": "..."},
                       tests={"files": {"test_hidden.py": "..."}}, cpu_time_limit_ms=2000)
    session = rnd.invite("ada@example.com")      # session.url goes to the candidate

A candidate's side (or a test) acts with the session's token only:

    s = InterviewSession.connect(url, session.round_id, session.id, session.token)
    s.run({"solution.py": code})["verdict"]      # "ok", "time_limit", ...
    s.submit({"solution.py": code}); s.wait_graded()["passed"]

Answers are the API's JSON objects (dicts), as documented there.
"""

from __future__ import annotations

import time
from typing import Any, Dict, Iterator, List, Optional, Tuple
from urllib.parse import quote

from . import errors
from ._config import resolve_url
from ._http import Transport
from .client import Client, default_client


def _q(s: str) -> str:
    return quote(s, safe="")


def _transport(client: Optional[Client]) -> Transport:
    return (client or default_client()).transport


class Round:
    """A round, seen with the API key (or a reviewer token: `Round.get`)."""

    def __init__(self, data: Dict[str, Any], transport: Transport):
        self.data = data
        self._t = transport

    @property
    def id(self) -> str:
        return str(self.data["id"])

    @property
    def state(self) -> str:
        return str(self.data["state"])

    @property
    def template_version(self) -> str:
        return str(self.data["template_version"])

    @property
    def tenant(self) -> Optional[str]:
        """The tenant whose key made the round (None: the operator's)."""
        return self.data.get("tenant")

    def __repr__(self) -> str:
        return f"Round({self.id!r}, {self.data.get('name')!r}, {self.state})"

    @classmethod
    def create(cls, *, name: str, tests: Dict[str, Any], cpu_time_limit_ms: int,
               starter_files: Optional[Dict[str, str]] = None, template: Optional[str] = None,
               template_version: Optional[str] = None, run: Optional[List[str]] = None,
               wall_time_limit_ms: Optional[int] = None, memory_limit_mb: Optional[int] = None,
               output_limit_bytes: Optional[int] = None, run_mode: Optional[str] = None,
               setup: Optional[Dict[str, Any]] = None, retention_seconds: Optional[int] = None,
               session_seconds: Optional[int] = None,
               reference_solution: Optional[Dict[str, str]] = None, client: Optional[Client] = None,
               timeout: float = 900.0) -> "Round":
        """POST /v1/rounds: prepares the round (setup included) before it answers."""
        body: Dict[str, Any] = {"name": name, "tests": tests, "cpu_time_limit_ms": cpu_time_limit_ms}
        for k, v in (("starter_files", starter_files), ("template", template), ("template_version", template_version),
                     ("run", run), ("wall_time_limit_ms", wall_time_limit_ms), ("memory_limit_mb", memory_limit_mb),
                     ("output_limit_bytes", output_limit_bytes), ("run_mode", run_mode), ("setup", setup),
                     ("retention_seconds", retention_seconds), ("session_seconds", session_seconds),
                     ("reference_solution", reference_solution)):
            if v is not None:
                body[k] = v
        t = _transport(client)
        return cls(t.request("POST", "/v1/rounds", json=body, timeout=timeout).json(), t)

    @classmethod
    def get(cls, round_id: str, *, client: Optional[Client] = None, token: Optional[str] = None,
            url: Optional[str] = None) -> "Round":
        """With the API key (`client`), or a reviewer `token`."""
        t = Transport(resolve_url(url), token) if token else _transport(client)
        return cls(t.request("GET", f"/v1/rounds/{_q(round_id)}", idempotent=True).json(), t)

    @classmethod
    def list(cls, *, client: Optional[Client] = None) -> List["Round"]:
        t = _transport(client)
        return [cls(r, t) for r in t.request("GET", "/v1/rounds", idempotent=True).json()["rounds"]]

    def archive(self) -> "Round":
        self.data = self._t.request("POST", f"/v1/rounds/{_q(self.id)}/archive").json()
        return self

    def invite(self, candidate: str) -> "InterviewSession":
        """A candidate session: its sandbox, its token (`.token`) and link (`.url`)."""
        d = self._t.request("POST", f"/v1/rounds/{_q(self.id)}/sessions", json={"candidate": candidate},
                            timeout=180.0).json()
        return InterviewSession(d, self._t, token=d["token"], url=d["url"])

    def sessions(self) -> List["InterviewSession"]:
        d = self._t.request("GET", f"/v1/rounds/{_q(self.id)}/sessions", idempotent=True).json()
        return [InterviewSession(s, self._t) for s in d["sessions"]]

    def session(self, session_id: str) -> "InterviewSession":
        return InterviewSession({"id": session_id, "round_id": self.id}, self._t).refresh()

    def reviewer_token(self, ttl_seconds: Optional[int] = None) -> Dict[str, Any]:
        """{"token", "expires_at", "url"}: reads this round's sessions, reports and replays."""
        body = {"ttl_seconds": ttl_seconds} if ttl_seconds is not None else {}
        r: Dict[str, Any] = self._t.request("POST", f"/v1/rounds/{_q(self.id)}/reviewer-tokens", json=body).json()
        return r

    def interviewer_token(self, ttl_seconds: Optional[int] = None) -> Dict[str, Any]:
        """{"token", "expires_at", "url"}: opens this round's live rooms
        (read-only until pairing), the pairing switch and notes; no reports."""
        body = {"ttl_seconds": ttl_seconds} if ttl_seconds is not None else {}
        r: Dict[str, Any] = self._t.request("POST", f"/v1/rounds/{_q(self.id)}/interviewer-tokens", json=body).json()
        return r

    def fork_replay(self, replay_id: str) -> "ReplayFork":
        """The caller's own fork of a replay (deny-all egress)."""
        d = self._t.request("POST", f"/v1/rounds/{_q(self.id)}/replays/{_q(replay_id)}/forks", timeout=180.0).json()
        return ReplayFork(d, self.id, self._t)


class InterviewSession:
    """One candidate's session. Candidate calls (files, run, submit, end)
    need the candidate token or the API key; reviewer calls (report, runs,
    replays) the API key or a reviewer token."""

    def __init__(self, data: Dict[str, Any], transport: Transport, *, token: Optional[str] = None,
                 url: Optional[str] = None):
        self.data = data
        self._t = transport
        self.token = token
        self.url = url

    @classmethod
    def connect(cls, url: str, round_id: str, session_id: str, token: str) -> "InterviewSession":
        """As the candidate: only this session's token, never the API key."""
        s = cls({"id": session_id, "round_id": round_id}, Transport(url, token), token=token)
        return s.refresh()

    @property
    def id(self) -> str:
        return str(self.data["id"])

    @property
    def round_id(self) -> str:
        return str(self.data["round_id"])

    @property
    def state(self) -> str:
        return str(self.data.get("state"))

    @property
    def result(self) -> Optional[Dict[str, Any]]:
        """{"submission_id", "passed", "total", "failed_cases", "status"} once graded."""
        return self.data.get("result")

    def __repr__(self) -> str:
        return f"InterviewSession({self.id!r}, {self.data.get('candidate')!r}, {self.state})"

    @property
    def _base(self) -> str:
        return f"/v1/rounds/{_q(self.round_id)}/sessions/{_q(self.id)}"

    def refresh(self) -> "InterviewSession":
        self.data = self._t.request("GET", self._base, idempotent=True).json()
        return self

    def files(self) -> Dict[str, str]:
        d: Dict[str, str] = self._t.request("GET", f"{self._base}/files", idempotent=True).json()["files"]
        return d

    def run(self, files: Optional[Dict[str, str]] = None, timeout: float = 3700.0) -> Dict[str, Any]:
        """{"stdout", "stderr", "exit_code", "cpu_ms", "wall_ms", "memory_peak_bytes", "verdict", ...}"""
        r: Dict[str, Any] = self._t.request("POST", f"{self._base}/run", json={"files": files or {}},
                                            timeout=timeout).json()
        return r

    def run_stream(self, files: Optional[Dict[str, str]] = None) -> Iterator[Tuple[str, Any]]:
        """(event, data): `stdout`/`stderr` {"data"} as it runs, then `result`.
        An `error` event raises StreamError."""
        sse = self._t.stream("POST", f"{self._base}/run/stream", json={"files": files or {}})
        for ev, data in sse:
            if ev == "error":
                err = (data or {}).get("error", {})
                raise errors.StreamError(f"{err.get('code')}: {err.get('message')}")
            yield ev, data

    def submit(self, files: Optional[Dict[str, str]] = None) -> Dict[str, Any]:
        """{"submission_id", "sha256", "state"}; grading goes on in the background."""
        body = {"files": files} if files is not None else {}
        r: Dict[str, Any] = self._t.request("POST", f"{self._base}/submit", json=body, timeout=180.0).json()
        return r

    def wait_graded(self, submission_id: Optional[str] = None, timeout: float = 600.0,
                    interval: float = 0.5) -> Dict[str, Any]:
        """Polls until the (given, else latest) submission is graded; its result."""
        deadline = time.monotonic() + timeout
        while True:
            self.refresh()
            res = self.result
            if res and (submission_id is None or res["submission_id"] == submission_id) \
                    and self.state != "submitted":
                return res
            if time.monotonic() > deadline:
                raise errors.SandboxTimeout(f"session {self.id} not graded within {timeout}s")
            time.sleep(interval)

    def terminal(self) -> Dict[str, Any]:
        """{"sandbox_id", "token", "expires_at"} for one terminal (60 s)."""
        r: Dict[str, Any] = self._t.request("POST", f"{self._base}/terminal").json()
        return r

    def end(self) -> "InterviewSession":
        """A final replay, then the sandbox goes."""
        self.data = self._t.request("POST", f"{self._base}/end", timeout=180.0).json()
        return self

    # Reviewer side ---------------------------------------------------------

    def report(self) -> Dict[str, Any]:
        r: Dict[str, Any] = self._t.request("GET", f"{self._base}/report", idempotent=True).json()
        return r

    def runs(self) -> List[Dict[str, Any]]:
        r: List[Dict[str, Any]] = self._t.request("GET", f"{self._base}/runs", idempotent=True).json()["runs"]
        return r

    def submission(self, submission_id: str) -> Dict[str, Any]:
        r: Dict[str, Any] = self._t.request("GET", f"{self._base}/submissions/{_q(submission_id)}",
                                            idempotent=True).json()
        return r

    def regrade(self, submission_id: str) -> Dict[str, Any]:
        r: Dict[str, Any] = self._t.request("POST", f"{self._base}/submissions/{_q(submission_id)}/regrade",
                                            timeout=3700.0).json()
        return r

    def replay_now(self) -> Dict[str, Any]:
        r: Dict[str, Any] = self._t.request("POST", f"{self._base}/replays", timeout=180.0).json()
        return r

    def replays(self) -> List[Dict[str, Any]]:
        r: List[Dict[str, Any]] = self._t.request("GET", f"{self._base}/replays", idempotent=True).json()["replays"]
        return r


class ReplayFork:
    """A reviewer's fork of a replay: read its files, run a command, delete it."""

    def __init__(self, data: Dict[str, Any], round_id: str, transport: Transport):
        self.data = data
        self.round_id = round_id
        self._t = transport

    @property
    def id(self) -> str:
        return str(self.data["id"])

    @property
    def _base(self) -> str:
        return f"/v1/rounds/{_q(self.round_id)}/forks/{_q(self.id)}"

    def files(self) -> List[str]:
        r: List[str] = self._t.request("GET", f"{self._base}/files", idempotent=True).json()["files"]
        return r

    def read(self, path: str) -> str:
        r: str = self._t.request("GET", f"{self._base}/file", query={"path": path}, idempotent=True).json()["content"]
        return r

    def exec(self, argv: List[str], timeout_seconds: int = 30) -> Dict[str, Any]:
        r: Dict[str, Any] = self._t.request("POST", f"{self._base}/exec",
                                            json={"argv": argv, "timeout_seconds": timeout_seconds},
                                            timeout=timeout_seconds + 30.0).json()
        return r

    def delete(self) -> None:
        self._t.request("DELETE", self._base, idempotent=True)


__all__ = ["Round", "InterviewSession", "ReplayFork"]
