"""The async twin: the same API with `await`. Calls run on the event loop's
default thread pool over the same keep-alive connection pool, so many
calls (and streams) proceed concurrently without blocking the loop."""

from __future__ import annotations

import asyncio
import functools
import inspect
from typing import Any, AsyncIterator, Callable, Dict, List, Literal, Optional, Tuple, TypeVar, Union, overload

from . import client as sync
from .client import Client, default_client
from .models import (BuildEvent, CodeContext, ContextLike, ExecReason, ExecResult, Execution, ExecutionError,
                     FileEntry, NetworkEvent, NetworkPolicy, OutputChunk, OutputEncoding, PolicyLike, ProcessChunk,
                     PreviewUrl, ProcessInfo, Result, TemplateInfo, TerminalExit, TerminalToken)

T = TypeVar("T")


async def _run(fn: Callable[..., T], *args: Any, **kw: Any) -> T:
    return await asyncio.get_running_loop().run_in_executor(None, functools.partial(fn, *args, **kw))


_DONE = object()


async def _awaited(aw: Any) -> Any:
    return await aw


def _on_loop(cb: Optional[Callable[[Any], Any]], loop: asyncio.AbstractEventLoop) -> Optional[Callable[[Any], None]]:
    """A callback for the pool thread that runs the call: a plain function
    runs there; an async one runs on the caller's loop, and the stream waits
    for it (so callbacks still run one at a time, in order)."""
    if cb is None:
        return None

    def call(arg: Any) -> None:
        out = cb(arg)
        if inspect.isawaitable(out):
            asyncio.run_coroutine_threadsafe(_awaited(out), loop).result()

    return call


def _next(it: Any) -> Any:
    try:
        return next(it)
    except StopIteration:
        return _DONE


class AsyncExecStream:
    """`async for chunk in stream` yields OutputChunks; `await
    stream.wait()` returns the ExecResult. `aclose()` kills the command."""

    def __init__(self, s: sync.ExecStream):
        self._s = s

    @property
    def result(self) -> Optional[ExecResult]:
        return self._s.result

    def __aiter__(self) -> "AsyncExecStream":
        return self

    async def __anext__(self) -> OutputChunk:
        item = await _run(_next, self._s)
        if item is _DONE:
            raise StopAsyncIteration
        assert isinstance(item, OutputChunk)
        return item

    async def wait(self) -> ExecResult:
        return await _run(self._s.wait)

    async def aclose(self) -> None:
        self._s.close()

    async def __aenter__(self) -> "AsyncExecStream":
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.aclose()


class AsyncProcessOutput:
    """`async for chunk in out` yields ProcessChunks (the stream opens on the
    first one, where HTTP errors such as NotFound raise); afterwards `info`
    and `next_offset` are set as on ProcessOutput. `aclose()` stops reading
    (not the process)."""

    def __init__(self, p: sync.Process, offset: int, follow: bool, encoding: OutputEncoding):
        self._open = functools.partial(p.output, offset, follow=follow, encoding=encoding)
        self._offset = offset
        self._o: Optional[sync.ProcessOutput] = None
        self._closed = False

    @property
    def info(self) -> Optional[ProcessInfo]:
        return self._o.info if self._o is not None else None

    @property
    def next_offset(self) -> int:
        return self._o.next_offset if self._o is not None else self._offset

    @property
    def exited(self) -> bool:
        return self._o is not None and self._o.exited

    def __aiter__(self) -> "AsyncProcessOutput":
        return self

    async def __anext__(self) -> ProcessChunk:
        if self._closed:
            raise StopAsyncIteration
        if self._o is None:
            self._o = await _run(self._open)
        item = await _run(_next, self._o)
        if item is _DONE:
            raise StopAsyncIteration
        assert isinstance(item, ProcessChunk)
        return item

    async def aclose(self) -> None:
        self._closed = True
        if self._o is not None:
            self._o.close()

    async def __aenter__(self) -> "AsyncProcessOutput":
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.aclose()


class AsyncProcess:
    """The async face of Process: the same fields (from `info`) and
    methods, awaited; `async for chunk in proc` follows its output."""

    def __init__(self, p: sync.Process):
        self.sync = p

    def __repr__(self) -> str:
        return f"<AsyncProcess {self.id} pid {self.pid} {self.state}>"

    @property
    def info(self) -> ProcessInfo:
        return self.sync.info

    @property
    def id(self) -> str:
        return self.sync.id

    @property
    def pid(self) -> int:
        return self.sync.pid

    @property
    def argv(self) -> List[str]:
        return self.sync.argv

    @property
    def started_at(self) -> str:
        return self.sync.started_at

    @property
    def state(self) -> str:
        return self.sync.state

    @property
    def exit_code(self) -> Optional[int]:
        return self.sync.exit_code

    @property
    def reason(self) -> Optional[ExecReason]:
        return self.sync.reason

    @property
    def cpu_ms(self) -> int:
        return self.sync.cpu_ms

    @property
    def output_bytes(self) -> int:
        return self.sync.output_bytes

    @property
    def first_offset(self) -> int:
        return self.sync.first_offset

    @property
    def stdin_open(self) -> bool:
        return self.sync.stdin_open

    @property
    def running(self) -> bool:
        return self.sync.running

    async def refresh(self) -> "AsyncProcess":
        await _run(self.sync.refresh)
        return self

    async def wait(self, timeout: Optional[float] = None) -> ProcessInfo:
        return await _run(self.sync.wait, timeout)

    async def kill(self) -> ProcessInfo:
        return await _run(self.sync.kill)

    async def signal(self, signal: Union[str, int]) -> ProcessInfo:
        return await _run(self.sync.signal, signal)

    async def send_stdin(self, data: Union[str, bytes]) -> None:
        await _run(self.sync.send_stdin, data)

    async def close_stdin(self) -> None:
        await _run(self.sync.close_stdin)

    def output(self, offset: int = 0, *, follow: bool = True, encoding: OutputEncoding = "text") -> AsyncProcessOutput:
        """Same as Process.output; `async for` the result (no await)."""
        if encoding not in ("text", "base64"):
            raise ValueError(f"encoding must be 'text' or 'base64', not {encoding!r}")
        return AsyncProcessOutput(self.sync, offset, follow, encoding)

    async def __aiter__(self) -> AsyncIterator[ProcessChunk]:
        async with self.output() as out:
            async for chunk in out:
                yield chunk


class AsyncFilesystem:
    def __init__(self, fs: sync.Filesystem):
        self._fs = fs

    async def write(self, path: str, data: Union[str, bytes]) -> None:
        await _run(self._fs.write, path, data)

    async def read(self, path: str) -> bytes:
        return await _run(self._fs.read, path)

    async def read_text(self, path: str, encoding: str = "utf-8") -> str:
        return await _run(self._fs.read_text, path, encoding)

    async def list(self, path: str = "/") -> List[FileEntry]:
        return await _run(self._fs.list, path)

    async def remove(self, path: str) -> None:
        await _run(self._fs.remove, path)

    async def exists(self, path: str) -> bool:
        return await _run(self._fs.exists, path)


class AsyncNetwork:
    def __init__(self, n: sync.Network):
        self._n = n

    async def get(self) -> NetworkPolicy:
        return await _run(self._n.get)

    async def update(self, policy: PolicyLike) -> NetworkPolicy:
        return await _run(self._n.update, policy)

    async def events(self) -> List[NetworkEvent]:
        return await _run(self._n.events)

    async def denied_total(self) -> Optional[int]:
        return await _run(self._n.denied_total)


class _AsyncRecord:
    """Async face of a sync record: `.id`, `.info` and its fields."""

    sync: Any

    @property
    def id(self) -> str:
        return str(self.sync.id)

    @property
    def info(self) -> Any:
        return self.sync.info

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_") or name == "sync":
            raise AttributeError(name)
        return getattr(self.sync.info, name)


class AsyncSandbox(_AsyncRecord):
    """`async with await AsyncSandbox.create(...) as sbx:` kills it on exit."""

    def __init__(self, s: sync.Sandbox):
        self.sync = s
        self.filesystem = AsyncFilesystem(s.filesystem)
        self.files = self.filesystem
        self.network = AsyncNetwork(s.network)

    def __repr__(self) -> str:
        return f"<AsyncSandbox {self.id}>"

    async def __aenter__(self) -> "AsyncSandbox":
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.kill()

    @classmethod
    async def create(cls, template: Optional[str] = None, *, ttl_seconds: Optional[int] = None,
                     metadata: Optional[Dict[str, str]] = None, env: Optional[Dict[str, str]] = None,
                     network: Optional[PolicyLike] = None, client: Optional[Client] = None) -> "AsyncSandbox":
        return cls(await _run(sync.Sandbox.create, template, ttl_seconds=ttl_seconds, metadata=metadata, env=env,
                              network=network, client=client))

    @classmethod
    async def get(cls, sandbox_id: str, *, client: Optional[Client] = None) -> "AsyncSandbox":
        return cls(await _run(sync.Sandbox.get, sandbox_id, client=client))

    connect = get

    @classmethod
    async def list(cls, metadata: Optional[Dict[str, str]] = None, *,
                   client: Optional[Client] = None) -> List["AsyncSandbox"]:
        return [cls(s) for s in await _run(sync.Sandbox.list, metadata, client=client)]

    async def refresh(self) -> "AsyncSandbox":
        await _run(self.sync.refresh)
        return self

    async def is_running(self) -> bool:
        return await _run(self.sync.is_running)

    async def kill(self) -> None:
        await _run(self.sync.kill)

    async def set_ttl(self, ttl_seconds: int) -> "AsyncSandbox":
        await _run(self.sync.set_ttl, ttl_seconds)
        return self

    @overload
    async def exec(self, cmd: Optional[str] = None, *, background: Literal[False] = False,
                   **kw: Any) -> ExecResult: ...

    @overload
    async def exec(self, cmd: Optional[str] = None, *, background: Literal[True], **kw: Any) -> AsyncProcess: ...

    async def exec(self, cmd: Optional[str] = None, *, background: bool = False,
                   **kw: Any) -> Union[ExecResult, AsyncProcess]:
        """Same arguments as Sandbox.exec; ``background=True`` gives an
        AsyncProcess."""
        r = await _run(self.sync.exec, cmd, background=background, **kw)
        return AsyncProcess(r) if isinstance(r, sync.Process) else r

    async def processes(self) -> List[AsyncProcess]:
        return [AsyncProcess(p) for p in await _run(self.sync.processes)]

    async def process(self, process_id: Union[str, AsyncProcess, sync.Process]) -> AsyncProcess:
        pid = process_id if isinstance(process_id, str) else process_id.id
        return AsyncProcess(await _run(self.sync.process, pid))

    async def exec_stream(self, cmd: Optional[str] = None, **kw: Any) -> AsyncExecStream:
        """Same arguments as Sandbox.exec_stream (callbacks run on a pool
        thread)."""
        return AsyncExecStream(await _run(self.sync.exec_stream, cmd, **kw))

    async def snapshot(self, retention_seconds: Optional[int] = None, *,
                       metadata: Optional[Dict[str, str]] = None,
                       memory: Optional[bool] = None) -> "AsyncSnapshot":
        return AsyncSnapshot(await _run(self.sync.snapshot, retention_seconds, metadata=metadata, memory=memory))

    async def run_code(self, code: str, *, language: Optional[str] = "python", context: Optional[ContextLike] = None,
                       on_stdout: Optional[Callable[[str], Any]] = None,
                       on_stderr: Optional[Callable[[str], Any]] = None,
                       on_result: Optional[Callable[[Result], Any]] = None,
                       on_error: Optional[Callable[[ExecutionError], Any]] = None,
                       envs: Optional[Dict[str, str]] = None, timeout: Optional[float] = None,
                       cpu_limit_ms: Optional[int] = None, max_output_bytes: Optional[int] = None) -> Execution:
        """Same as Sandbox.run_code. Callbacks may be plain functions (run on
        a pool thread) or async ones (awaited on this loop, in order)."""
        loop = asyncio.get_running_loop()
        return await _run(self.sync.run_code, code, language=language, context=context,
                          on_stdout=_on_loop(on_stdout, loop), on_stderr=_on_loop(on_stderr, loop),
                          on_result=_on_loop(on_result, loop), on_error=_on_loop(on_error, loop), envs=envs,
                          timeout=timeout, cpu_limit_ms=cpu_limit_ms, max_output_bytes=max_output_bytes)

    async def create_code_context(self, cwd: Optional[str] = None, language: Optional[str] = None) -> CodeContext:
        return await _run(self.sync.create_code_context, cwd, language)

    async def list_code_contexts(self) -> List[CodeContext]:
        return await _run(self.sync.list_code_contexts)

    async def restart_code_context(self, context: ContextLike) -> CodeContext:
        return await _run(self.sync.restart_code_context, context)

    async def remove_code_context(self, context: ContextLike) -> None:
        await _run(self.sync.remove_code_context, context)

    def get_url(self, port: int, *, path: str = "/") -> str:
        return self.sync.get_url(port, path=path)

    async def port_request(self, port: int, method: str = "GET", path: str = "/",
                           body: Optional[Union[str, bytes]] = None, headers: Optional[Dict[str, str]] = None, *,
                           timeout: Optional[float] = None) -> Tuple[int, Dict[str, str], bytes]:
        return await _run(self.sync.port_request, port, method, path, body, headers, timeout=timeout)

    async def preview_url(self, port: int, ttl_seconds: Optional[int] = 3600) -> PreviewUrl:
        return await _run(self.sync.preview_url, port, ttl_seconds)

    async def pty_token(self) -> TerminalToken:
        return await _run(self.sync.pty_token)

    async def pty(self, cols: int = 80, rows: int = 24, cmd: Optional[str] = None, cwd: Optional[str] = None, *,
                  argv: Optional[List[str]] = None, env: Optional[Dict[str, str]] = None,
                  token: Optional[str] = None, timeout: float = 30.0) -> "AsyncTerminal":
        return AsyncTerminal(await _run(self.sync.pty, cols, rows, cmd, cwd, argv=argv, env=env, token=token,
                                        timeout=timeout))


class AsyncTerminal:
    """The async twin of `Terminal`: `async with await sbx.pty() as t:`."""

    def __init__(self, t: sync.Terminal):
        self.sync = t

    @property
    def exit(self) -> Optional[TerminalExit]:
        return self.sync.exit

    async def write(self, data: Union[str, bytes]) -> None:
        await _run(self.sync.write, data)

    async def resize(self, cols: int, rows: int, *, timeout: Optional[float] = None) -> None:
        await _run(self.sync.resize, cols, rows, timeout=timeout)

    @property
    def size(self) -> Optional[Tuple[int, int]]:
        return self.sync.size

    async def read(self, timeout: Optional[float] = None) -> bytes:
        return await _run(self.sync.read, timeout)

    async def read_until(self, needle: Union[str, bytes], timeout: float = 10.0) -> bytes:
        return await _run(self.sync.read_until, needle, timeout)

    async def wait(self, timeout: Optional[float] = None) -> TerminalExit:
        return await _run(self.sync.wait, timeout)

    async def close(self) -> None:
        await _run(self.sync.close)

    async def __aenter__(self) -> "AsyncTerminal":
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.close()


class AsyncSnapshot(_AsyncRecord):
    def __init__(self, s: sync.Snapshot):
        self.sync = s

    @classmethod
    async def get(cls, snapshot_id: str, *, client: Optional[Client] = None) -> "AsyncSnapshot":
        return cls(await _run(sync.Snapshot.get, snapshot_id, client=client))

    @classmethod
    async def list(cls, metadata: Optional[Dict[str, str]] = None, *,
                   client: Optional[Client] = None) -> List["AsyncSnapshot"]:
        return [cls(s) for s in await _run(sync.Snapshot.list, metadata, client=client)]

    async def delete(self) -> None:
        await _run(self.sync.delete)

    async def fork(self, **kw: Any) -> AsyncSandbox:
        return AsyncSandbox(await _run(self.sync.fork, **kw))

    async def fork_many(self, count: int, **kw: Any) -> List[AsyncSandbox]:
        return [AsyncSandbox(s) for s in await _run(self.sync.fork_many, count, **kw)]


class AsyncTemplate:
    @staticmethod
    async def list(*, client: Optional[Client] = None) -> List[TemplateInfo]:
        return await _run(sync.Template.list, client=client)

    @staticmethod
    async def get(name: str, *, client: Optional[Client] = None) -> TemplateInfo:
        return await _run(sync.Template.get, name, client=client)

    @staticmethod
    async def delete(name: str, *, client: Optional[Client] = None) -> None:
        await _run(sync.Template.delete, name, client=client)

    @staticmethod
    async def build(name: str, **kw: Any) -> TemplateInfo:
        """Same arguments as Template.build (callbacks run on a pool thread)."""
        return await _run(sync.Template.build, name, **kw)

    @staticmethod
    async def build_events(name: str, build_id: str, *, client: Optional[Client] = None) -> AsyncIterator[BuildEvent]:
        it = sync.Template.build_events(name, build_id, client=client)
        while True:
            ev = await _run(_next, it)
            if ev is _DONE:
                return
            yield ev


__all__ = ["AsyncSandbox", "AsyncSnapshot", "AsyncTemplate", "AsyncExecStream", "AsyncFilesystem", "AsyncNetwork",
           "AsyncProcess", "AsyncProcessOutput", "Client", "default_client"]
