"""
:class:`AsyncSandbox`, the asyncio client (httpx's ``AsyncClient`` for
HTTP and SSE, websockets' asyncio client for terminals).  Every method is
the coroutine twin of :class:`~sandboxd.client.Sandbox`'s.
"""

from __future__ import annotations

import asyncio
import base64
import builtins
import inspect
import os
import time
from collections.abc import (
    AsyncGenerator,
    AsyncIterator,
    Awaitable,
    Callable,
    Mapping,
    Sequence,
)
from contextlib import aclosing
from typing import Any, cast

import httpx
from websockets.asyncio.client import ClientConnection
from websockets.asyncio.client import connect as ws_connect
from websockets.exceptions import ConnectionClosed, InvalidStatus, WebSocketException

from sandboxd.client import _calls as calls
from sandboxd.client._core import (
    CHUNK_BYTES,
    DEFAULT_RETRIES,
    DEFAULT_TIMEOUT,
    RESUMABLE_UPLOAD_BYTES,
    RETRYABLE,
    STREAM_READ_TIMEOUT,
    Req,
    Settings,
    SSEParser,
    backoff,
    decode,
    error_from,
    output_end,
    pty_event,
    pty_ws_url,
    retry_after,
    seg,
    settings_from,
    stream_timeout,
    timeout_of,
    transport_error,
    ws_headers,
)
from sandboxd.client._shared import (
    ByteRun,
    PartialFile,
    RangeState,
    ResumableUpload,
    command_result,
    handshake_error,
    session_info,
    shell_timeout,
    stream_error,
)
from sandboxd.client.errors import (
    ConnectionFailed,
    NotFound,
    NotFoundError,
    PayloadTooLarge,
    ProtocolError,
    RequestTimeout,
    SandboxError,
)
from sandboxd.client.models import (
    CodeResult,
    CommandResult,
    Decision,
    Entry,
    Extracted,
    GitDiff,
    GitStatus,
    Listing,
    OutputPage,
    ProcessInfo,
    Progress,
    PtyCreated,
    PtyEvent,
    PtySessionInfo,
    SearchResult,
    SSEEvent,
    Stat,
    Written,
)

#: A line callback: a plain function or a coroutine function.
Line = Callable[[str], "Awaitable[None] | None"]
#: Takes a chunk of a command's output, as bytes.
Chunk = Callable[[bytes], "Awaitable[None] | None"]


async def _tell(callback: Line | None, text: str) -> None:
    if callback is not None:
        result = callback(text)
        if inspect.isawaitable(result):
            await result


async def _tell_bytes(callback: Chunk | None, data: bytes) -> None:
    """Pass a chunk on, awaiting the callback when it is a coroutine."""
    if callback is None:
        return
    outcome = callback(data)
    if inspect.isawaitable(outcome):
        await outcome


class _Http:
    """One ``httpx.AsyncClient`` plus the retry, rate-limit and resume rules."""

    def __init__(self, settings: Settings, client: httpx.AsyncClient | None) -> None:
        self.settings = settings
        self.client = client or httpx.AsyncClient(
            base_url=settings.url,
            headers=settings.headers(),
            timeout=settings.timeout,
            trust_env=False,
        )

    async def send(
        self, req: Req, content: Callable[[], Any] | None = None
    ) -> httpx.Response:
        """As the sync client's: one request, its whole answer."""
        s = self.settings
        what = f"{req.method} {req.path}"
        attempt = waits = 0
        while True:
            try:
                response = await self.client.request(
                    req.method,
                    req.path,
                    params=req.params,
                    json=req.json,
                    content=content() if content is not None else None,
                    headers=req.headers,
                    timeout=timeout_of(req.timeout, s.timeout),
                )
            except httpx.TimeoutException as e:
                raise transport_error(e, what) from None
            except RETRYABLE as e:
                fresh = isinstance(e, httpx.ConnectError)
                if (fresh or req.retry_safe) and attempt < s.retries:
                    attempt += 1
                    await asyncio.sleep(backoff(attempt))
                    continue
                raise transport_error(e, what) from None
            except httpx.HTTPError as e:
                raise transport_error(e, what) from None
            if response.status_code == 429 and s.wait_on_rate_limit and waits < 10:
                error = error_from(response)
                wait = retry_after(response, error)
                if wait is not None and wait <= s.max_rate_wait:
                    waits += 1
                    await asyncio.sleep(max(wait, 0.05))
                    continue
                raise error
            if response.status_code >= 400:
                raise error_from(response)
            return response

    async def call(self, req: Req) -> Any:
        """Send one JSON call; its decoded answer."""
        return decode(await self.send(req))

    async def _stream(
        self,
        method: str,
        path: str,
        params: Mapping[str, Any] | None = None,
        json: Any = None,
        after: int | None = None,
        resumable: bool = True,
        read_timeout: float | None = STREAM_READ_TIMEOUT,
        announce: bool = False,
    ) -> AsyncGenerator[SSEEvent | None, None]:
        """As the sync client's: SSE events, resumed with ``Last-Event-ID``."""
        s = self.settings
        last = after
        failures = 0
        what = f"{method} {path}"
        while True:
            headers = {"Accept": "text/event-stream"}
            query = dict(params or {})
            if resumable and last is not None:
                headers["Last-Event-ID"] = str(last)
                query["after"] = last
            try:
                async with self.client.stream(
                    method,
                    path,
                    params=query,
                    json=json,
                    headers=headers,
                    timeout=stream_timeout(s.timeout, read_timeout),
                ) as response:
                    if response.status_code >= 400:
                        await response.aread()
                        raise error_from(response)
                    if announce:
                        announce = False
                        yield None  # connected: the caller may go on
                    parser = SSEParser()
                    async for line in response.aiter_lines():
                        event = parser.feed(line)
                        if event is None:
                            continue
                        failures = 0
                        if event.id is not None:
                            last = event.id
                        yield event
                return
            except (*RETRYABLE, httpx.ReadTimeout) as e:
                if not resumable or failures >= s.retries:
                    raise transport_error(e, what) from None
                failures += 1
                await asyncio.sleep(backoff(failures))
            except httpx.TimeoutException as e:
                raise transport_error(e, what) from None
            except httpx.HTTPError as e:
                raise transport_error(e, what) from None

    async def events(
        self,
        method: str,
        path: str,
        params: Mapping[str, Any] | None = None,
        json: Any = None,
        after: int | None = None,
        resumable: bool = True,
    ) -> AsyncGenerator[SSEEvent, None]:
        """An SSE stream's events (see the sync client's ``events``)."""
        source = self._stream(method, path, params, json, after, resumable)
        async with aclosing(source):
            async for event in source:
                if event is not None:
                    yield event

    async def open(
        self, path: str, params: Mapping[str, Any], after: int | None
    ) -> EventStream:
        """A GET stream, connected (its refusal raised here)."""
        stream = EventStream(
            self._stream("GET", path, params, after=after, announce=True)
        )
        await stream._connected()
        return stream

    async def fetch_raw(
        self,
        path: str,
        sink: Callable[[bytes], None],
        state: RangeState,
        progress: Progress | None,
    ) -> None:
        """``GET /files/raw`` into ``sink``, resuming by ``Range`` after a cut."""
        s = self.settings
        failures = 0
        while True:
            try:
                async with self.client.stream(
                    "GET",
                    "/files/raw",
                    params={"path": path},
                    headers=state.request_headers(),
                    timeout=timeout_of(None, s.timeout),
                ) as response:
                    if response.status_code >= 400 and response.status_code != 416:
                        await response.aread()
                        raise error_from(response)
                    if not state.accept(response.status_code, response.headers):
                        return
                    if progress is not None:
                        progress(state.offset, state.total)
                    async for chunk in response.aiter_raw():
                        sink(chunk)
                        state.offset += len(chunk)
                        failures = 0
                        if progress is not None:
                            progress(state.offset, state.total)
                state.check_complete()
                return
            except (*RETRYABLE, httpx.ReadTimeout, ConnectionFailed) as e:
                if failures >= s.retries:
                    raise state.failed(e) from None
                failures += 1
                await asyncio.sleep(backoff(failures))
            except httpx.HTTPError as e:
                raise state.failed(e) from None

    async def close(self) -> None:
        await self.client.aclose()


class EventStream:
    """
    An open SSE stream (``files.watch``, ``agents.events``): ``async for``
    its events; it resumes after a cut; ``aclose()`` ends it.
    """

    def __init__(self, source: AsyncGenerator[SSEEvent | None, None]) -> None:
        self._source = source

    async def _connected(self) -> None:
        await self._source.__anext__()

    def __aiter__(self) -> EventStream:
        return self

    async def __anext__(self) -> SSEEvent:
        while True:
            event = await self._source.__anext__()
            if event is not None:
                return event

    async def aclose(self) -> None:
        """Stop reading (the connection is closed)."""
        await self._source.aclose()

    async def __aenter__(self) -> EventStream:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()


class _Namespace:
    def __init__(self, sandbox: AsyncSandbox) -> None:
        self._sandbox = sandbox
        self._http = sandbox._http


class Files(_Namespace):
    """``sandbox.files``: the ``file_ops`` group (SPEC §7.3)."""

    async def read_bytes(self, path: str) -> bytes:
        """A file's bytes (``GET /files/raw``; resumed by Range after a cut)."""
        chunks: list[bytes] = []
        state = RangeState(restart=chunks.clear)
        await self._http.fetch_raw(path, chunks.append, state, None)
        return b"".join(chunks)

    async def read_text(self, path: str, encoding: str = "utf-8") -> str:
        """A file's text."""
        return (await self.read_bytes(path)).decode(encoding)

    async def write_bytes(
        self,
        path: str,
        data: bytes,
        *,
        overwrite: bool = True,
        mode: str | int | None = None,
        if_match: str | None = None,
    ) -> Written:
        """
        Write ``data`` atomically (``POST /files/raw``; parents created).

        :param mode: permission bits (``0o644`` or ``"644"``).
        :param if_match: an ``etag``: refuse (412) if the file changed since.
        """
        req = calls.files_write_raw(path, overwrite, mode, if_match)
        req.idempotent = overwrite and if_match is None
        return cast(Written, decode(await self._http.send(req, content=lambda: data)))

    async def write_text(self, path: str, text: str, **options: Any) -> Written:
        """Write ``text`` as UTF-8 (options as :meth:`write_bytes`)."""
        return await self.write_bytes(path, text.encode("utf-8"), **options)

    async def upload(
        self,
        local: str | os.PathLike[str],
        remote: str,
        *,
        progress: Progress | None = None,
        overwrite: bool = True,
        mode: str | int | None = None,
        resume: bool = True,
        upload_id: str | None = None,
        on_upload_id: Callable[[str], None] | None = None,
    ) -> Written:
        """
        Send a local file to ``remote``, streamed from disk with
        ``progress(sent, total)``; as :meth:`Sandbox.files.upload
        <sandboxd.client.Sandbox>`: a file of ``RESUMABLE_UPLOAD_BYTES``
        (8 MiB) or more, with ``resume=True``, goes as a resumable upload
        that carries on from the daemon's offset after a cut connection;
        ``upload_id=`` carries on one begun earlier (``on_upload_id(id)``
        is told each new id; an id of another path or size raises
        :class:`UploadMismatch`, nothing sent).  The target holds the old content (or
        nothing) until the last byte is in.
        """
        size = os.path.getsize(local)
        if resume and (upload_id is not None or size >= RESUMABLE_UPLOAD_BYTES):
            steps = ResumableUpload(
                os.fspath(local),
                remote,
                size,
                overwrite,
                mode,
                upload_id,
                self._http.settings.retries,
                on_upload_id,
            )
            written = await self._resumable(steps, progress)
            if written is not None:
                return written

        async def content() -> AsyncIterator[bytes]:
            sent = 0
            with open(local, "rb") as f:
                if progress is not None:
                    progress(0, size)
                # Disk reads in a thread: a slow disk never stalls the loop.
                while chunk := await asyncio.to_thread(f.read, CHUNK_BYTES):
                    sent += len(chunk)
                    yield chunk
                    if progress is not None:
                        progress(sent, size)

        req = calls.files_write_raw(remote, overwrite, mode, None)
        req.headers["Content-Length"] = str(size)
        req.idempotent = overwrite
        req.timeout = max(self._http.settings.timeout, 60.0)
        return cast(Written, decode(await self._http.send(req, content=content)))

    async def _resumable(
        self, steps: ResumableUpload, progress: Progress | None
    ) -> Written | None:
        """The steps of :class:`ResumableUpload`, on the loop (None: not served)."""
        http = self._http
        record: Any = None
        if steps.upload_id is not None:
            try:
                record = decode(await http.send(steps.start()))
            except NotFound:
                record = None
            else:
                record = steps.resumed(record)
        if record is None or not steps.on_record(record):
            try:
                created = decode(await http.send(steps.create()))
            except NotFoundError:
                # A daemon without resumable uploads (older, or the policy
                # switched them off): one raw write.
                return None
            except PayloadTooLarge:
                # The resumable path has a max_bytes of its own
                # (files_uploads_create); a policy that raised only
                # files_write_raw's still takes the file as one raw write.
                return None
            if not steps.on_record(created):
                raise ProtocolError("the daemon created an upload of another size")

        async def chunks(f: Any) -> AsyncIterator[bytes]:
            read = steps.read_from(f)
            done = steps.offset
            if progress is not None:
                progress(done, steps.size)
            # Disk reads in a thread: a slow disk never stalls the loop.
            while chunk := await asyncio.to_thread(read):
                done += len(chunk)
                yield chunk
                if progress is not None:
                    progress(done, steps.size)

        with open(steps.local, "rb") as f:
            while True:
                req = steps.append()
                req.timeout = max(http.settings.timeout, 60.0)
                try:
                    answer = decode(await http.send(req, content=lambda: chunks(f)))
                except (ConnectionFailed, RequestTimeout) as e:
                    await asyncio.sleep(steps.on_cut(e))
                except SandboxError as e:
                    wait = steps.on_refusal(e)
                    if wait is None:
                        raise
                    await asyncio.sleep(wait)
                else:
                    written = steps.on_answer(answer)
                    if written is not None:
                        return written
                    continue
                try:
                    record = decode(await http.send(steps.status()))
                except (ConnectionFailed, RequestTimeout) as e:
                    raise steps.failed(e) from None
                steps.on_record(record)

    async def delete_upload(self, upload_id: str) -> None:
        """Drop a resumable upload and its staging file (``DELETE /files/uploads/{id}``)."""
        await self._http.send(calls.files_uploads_delete(upload_id))

    async def download(
        self,
        remote: str,
        local: str | os.PathLike[str],
        *,
        progress: Progress | None = None,
        resume: bool = True,
    ) -> int:
        """
        Fetch ``remote`` into the local file ``local`` over the raw route.

        The bytes go to ``LOCAL.part`` first and are renamed into place
        when complete.  A cut connection is resumed with ``Range`` (and
        ``If-Range`` on the file's ETag, so a file that changed meanwhile is
        fetched again from the start); when retries run out the partial
        file is kept, and a later call with ``resume=True`` carries on.

        :returns: the file's size.
        """
        part = PartialFile(os.fspath(local), resume)
        try:
            await self._http.fetch_raw(remote, part.write, part.state, progress)
        except BaseException:
            part.keep()
            raise
        return part.commit()

    async def list(
        self,
        path: str | None = None,
        *,
        depth: int | None = None,
        hidden: bool | None = None,
    ) -> builtins.list[Entry]:
        """A directory's entries (``depth`` 1..10)."""
        return (await self.listing(path, depth=depth, hidden=hidden))["entries"]

    async def listing(
        self,
        path: str | None = None,
        *,
        depth: int | None = None,
        hidden: bool | None = None,
    ) -> Listing:
        """The whole ``files_list`` answer (``entries`` and ``truncated``)."""
        return cast(
            Listing, await self._http.call(calls.files_list(path, depth, hidden))
        )

    async def stat(self, path: str) -> Stat:
        """One path (``exists: false`` when missing inside the boundary)."""
        return cast(Stat, await self._http.call(calls.files_stat(path)))

    async def exists(self, path: str) -> bool:
        """Whether ``path`` exists."""
        return bool((await self.stat(path))["exists"])

    async def mkdir(self, path: str) -> dict[str, Any]:
        """Create a directory and its parents."""
        return cast(dict[str, Any], await self._http.call(calls.files_mkdir(path)))

    async def delete(self, path: str) -> dict[str, Any]:
        """Delete a file or a directory tree."""
        return cast(dict[str, Any], await self._http.call(calls.files_delete(path)))

    async def move(
        self, source: str, destination: str, *, overwrite: bool = False
    ) -> dict[str, Any]:
        """Move or rename."""
        return cast(
            dict[str, Any],
            await self._http.call(calls.files_move(source, destination, overwrite)),
        )

    async def search(
        self, pattern: str, path: str | None = None, *, max_results: int | None = None
    ) -> SearchResult:
        """Names matching an fnmatch ``pattern``, recursively."""
        return cast(
            SearchResult,
            await self._http.call(calls.files_search(pattern, path, max_results)),
        )

    async def archive(
        self, paths: str | Sequence[str], *, format: str = "tar.gz"
    ) -> bytes:
        """A ``tar.gz`` or ``zip`` of guarded paths, as bytes."""
        if isinstance(paths, str):
            paths = [paths]
        answer = await self._http.call(calls.files_archive(paths, format))
        return base64.b64decode(answer["content_base64"])

    async def extract(
        self,
        data: bytes,
        destination: str,
        *,
        format: str = "tar.gz",
        overwrite: bool = False,
    ) -> Extracted:
        """Unpack an archive (every member checked before anything is written)."""
        return cast(
            Extracted,
            await self._http.call(
                calls.files_extract(data, destination, format, overwrite)
            ),
        )

    async def watch(
        self,
        path: str | None = None,
        *,
        recursive: bool = False,
        after: int | None = None,
    ) -> EventStream:
        """
        Changes under a directory as they happen (``event``: created,
        modified, deleted, moved; ``data``: ``path``, ``type``, ``dest``),
        resumed after a cut.  The watch is live when this returns;
        ``aclose()`` the stream (or ``async with`` it) to stop.
        """
        params: dict[str, Any] = {
            "recursive": "true" if recursive else "false",
            "follow": "true",
        }
        if path is not None:
            params["path"] = path
        return await self._http.open("/files/watch", params, after)


class Process:
    """
    A background process (``commands.start``): its output log is read
    from ``cursor`` on, so a reader that reconnects carries on where it
    stopped.

    :ivar pid: the process id.
    :ivar cursor: the ``seq`` of the last output event read.
    """

    def __init__(self, http: _Http, info: Mapping[str, Any]) -> None:
        self._http = http
        self.pid = int(info["pid"])
        self.command = str(info.get("command", ""))
        self.tag: str | None = info.get("tag")
        self.cursor = 0
        self.exit_code: int | None = None

    def __repr__(self) -> str:
        return f"<Process pid={self.pid} command={self.command!r}>"

    async def info(self) -> ProcessInfo:
        """State, exit code, start time."""
        return cast(ProcessInfo, await self._http.call(calls.process_detail(self.pid)))

    async def output(self, after: int | None = None) -> OutputPage:
        """The kept output after ``after`` (default: the cursor), without waiting; moves the cursor."""
        page = cast(
            OutputPage,
            await self._http.call(
                calls.process_output(self.pid, self.cursor if after is None else after)
            ),
        )
        self.cursor = max(self.cursor, page["next"])
        return page

    async def stream(self, after: int | None = None) -> AsyncGenerator[SSEEvent, None]:
        """
        Output events from ``after`` (default: the cursor) as they come
        (``stdout``/``stderr`` with ``data["data"]``, ``gap``, ``error``,
        then ``exit``), resumed across reconnects.
        """
        start = self.cursor if after is None else after
        events = self._http.events(
            "GET", f"/process/{self.pid}/output", {"follow": "true"}, after=start
        )
        async with aclosing(events):
            async for event in events:
                if event.id is not None:
                    self.cursor = max(self.cursor, event.id)
                if event.event == "exit" and isinstance(event.data, dict):
                    self.exit_code = event.data.get("exit_code")
                yield event

    async def wait(
        self,
        timeout: float | None = None,
        *,
        on_stdout: Line | None = None,
        on_stderr: Line | None = None,
    ) -> int | None:
        """
        Wait for the exit, passing output chunks on; its exit code.

        :raises RequestTimeout: still running after ``timeout`` seconds.
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        events = self.stream()
        try:
            async for event in events:
                data = event.data if isinstance(event.data, dict) else {}
                if event.event == "stdout":
                    await _tell(on_stdout, str(data.get("data", "")))
                elif event.event == "stderr":
                    await _tell(on_stderr, str(data.get("data", "")))
                elif event.event == "exit":
                    return self.exit_code
                if deadline is not None and time.monotonic() > deadline:
                    break
        finally:
            await events.aclose()
        if deadline is not None and time.monotonic() > deadline:
            raise RequestTimeout(f"process {self.pid} still runs after {timeout} s")
        return (await self.info())["exit_code"]

    async def send_stdin(self, data: str, *, eof: bool = False) -> int:
        """Write to its stdin (started with ``stdin=True``); bytes written."""
        return int(
            (await self._http.call(calls.process_stdin(self.pid, data, eof)))["bytes"]
        )

    async def close_stdin(self) -> None:
        """Close its stdin (end of input)."""
        await self._http.call(calls.process_stdin(self.pid, "", True))

    async def signal(self, signal: int | str) -> None:
        """Signal its process group (``15``, ``"SIGINT"`` ...; ``allowed_signals``)."""
        await self._http.call(calls.process_signal(self.pid, signal))

    async def kill(self) -> None:
        """End its whole tree (signal 9)."""
        await self.signal(9)


class Commands(_Namespace):
    """``sandbox.commands``: processes (SPEC §7.4) and template commands (§7.2)."""

    async def run(
        self,
        command: str | Sequence[str],
        *,
        cwd: str | None = None,
        env: Mapping[str, str] | None = None,
        timeout: float | None = None,
        user: str | int | None = None,
        shell: str | None = None,
        idle_timeout: float | None = None,
        on_stdout: Line | None = None,
        on_stderr: Line | None = None,
    ) -> CommandResult:
        """
        Run a command to completion.

        With ``on_stdout``/``on_stderr`` it runs over ``/shell/stream``
        and each line (without its newline) is passed on as it completes;
        otherwise over ``/shell``.  A string is split like a shell would
        (no shell runs unless ``shell="bash"``); a list is taken as argv.

        :raises Timeout: past ``timeout`` (``IdleTimeout`` past
            ``idle_timeout``); the group was killed, the output so far is
            in the error's ``body``.
        """
        launch = calls.shell(command, cwd, env, user, shell, timeout, idle_timeout)
        if on_stdout is None and on_stderr is None:
            req = Req(
                "POST",
                "/shell",
                json=launch,
                timeout=shell_timeout(timeout, self._http.settings.timeout),
            )
            return command_result(await self._http.call(req))
        out: builtins.list[str] = []
        err: builtins.list[str] = []
        error: dict[str, Any] | None = None
        code: int | None = None
        events = self._http.events(
            "POST", "/shell/stream", json=launch, resumable=False
        )
        async with aclosing(events):
            async for event in events:
                data = event.data if isinstance(event.data, dict) else {}
                if event.event == "stdout":
                    line = str(data.get("data", ""))
                    out.append(line)
                    await _tell(on_stdout, line)
                elif event.event == "stderr":
                    line = str(data.get("data", ""))
                    err.append(line)
                    await _tell(on_stderr, line)
                elif event.event == "error":
                    error = data
                elif event.event == "exit":
                    code = data.get("exit_code")
        result = CommandResult(
            "".join(x + "\n" for x in out), "".join(x + "\n" for x in err), code
        )
        if error is not None:
            raise stream_error(error, result)
        return result

    async def run_bytes(
        self,
        command: str | Sequence[str],
        *,
        stdin: bytes | None = None,
        cwd: str | None = None,
        env: Mapping[str, str] | None = None,
        timeout: float | None = None,
        user: str | int | None = None,
        shell: str | None = None,
        idle_timeout: float | None = None,
        on_stdout: Chunk | None = None,
        on_stderr: Chunk | None = None,
    ) -> CommandResult:
        """
        Run a command to completion, its output byte for byte.

        Each read of the child's stdout and stderr is passed on as bytes,
        undecoded and unsplit, as it arrives (``sandboxd exec`` writes them
        to its own stdout and stderr); ``stdin`` is what the command reads
        on its stdin, then end of file.  The result's ``stdout`` and
        ``stderr`` are empty (the bytes went to the callbacks);
        ``truncated`` says the output went over ``max_output_bytes``.

        :raises Timeout: past ``timeout`` (``IdleTimeout`` past ``idle_timeout``).
        """
        launch = calls.shell(command, cwd, env, user, shell, timeout, idle_timeout)
        body = calls.shell_bytes(launch, stdin)
        run = ByteRun()
        events = self._http.events("POST", "/shell/stream", json=body, resumable=False)
        async with aclosing(events):
            async for event in events:
                chunk = run.take(event.event, event.data)
                if chunk is not None:
                    await _tell_bytes(
                        on_stdout if chunk[0] == "stdout" else on_stderr, chunk[1]
                    )
        return run.result()

    async def start(
        self,
        command: str | Sequence[str],
        *,
        cwd: str | None = None,
        env: Mapping[str, str] | None = None,
        user: str | int | None = None,
        shell: str | None = None,
        stdin: bool = False,
        tag: str | None = None,
        timeout: float | None = None,
        idle_timeout: float | None = None,
    ) -> Process:
        """Start a background process; a handle with ``wait``, ``stdin``, ``signal``, ``kill``, ``stream``."""
        launch = calls.shell(command, cwd, env, user, shell, timeout, idle_timeout)
        info = await self._http.call(calls.process_start(launch, stdin, tag))
        return Process(self._http, info)

    async def connect(self, pid: int) -> Process:
        """A handle on a process already managed by the daemon."""
        return Process(self._http, await self.get(pid))

    async def get(self, pid: int) -> ProcessInfo:
        """One managed process."""
        return cast(ProcessInfo, await self._http.call(calls.process_detail(pid)))

    async def list(self, tag: str | None = None) -> builtins.list[ProcessInfo]:
        """Running and recently exited processes."""
        return cast(
            builtins.list[ProcessInfo],
            (await self._http.call(calls.process_list(tag)))["processes"],
        )

    async def custom(self) -> builtins.list[dict[str, Any]]:
        """The template's registered commands (``GET /commands``)."""
        return cast(
            builtins.list[dict[str, Any]],
            (await self._http.call(calls.list_commands()))["commands"],
        )

    async def call(self, name: str, /, **kwargs: Any) -> Any:
        """Run a registered command with keyword arguments; its ``result``."""
        return (await self._http.call(calls.run_command(name, kwargs)))["result"]


class Terminal:
    """
    One attachment to a terminal session (the coroutine twin of the sync
    :class:`~sandboxd.client.Terminal`); made by ``pty.attach``/``pty.open``.

    :ivar offset: bytes of output received so far (the resume point).
    :ivar exit_code: the shell's exit code once it ended.
    """

    def __init__(
        self,
        settings: Settings,
        session_id: str,
        base: str,
        offset: int | None,
        pty: Pty | None = None,
    ) -> None:
        self._settings = settings
        #: Set by :meth:`Pty.open`: leaving the ``async with`` block ends the session.
        self._pty = pty
        self.owned = pty is not None
        self.session_id = session_id
        self._base = base
        self.offset: int | None = offset
        self.exit_code: int | None = None
        self.ended = False
        self.pid: int | None = None
        self._ws: ClientConnection | None = None

    async def _open(self, offset: int | None) -> None:
        url = pty_ws_url(self._base, self.session_id, offset)
        try:
            ws = await ws_connect(
                url,
                additional_headers=ws_headers(self._settings),
                open_timeout=self._settings.timeout,
                compression=None,
                proxy=None,
                max_size=None,
                user_agent_header="sandboxd-client",
            )
        except InvalidStatus as e:
            raise handshake_error(
                e.response.status_code, bytes(e.response.body or b"")
            ) from None
        except (OSError, WebSocketException, TimeoutError) as e:
            raise transport_error(e, f"connect {url}") from None
        try:
            first = await asyncio.wait_for(ws.recv(), self._settings.timeout)
        except ConnectionClosed as e:
            await ws.close()
            raise NotFound(
                e.rcvd.reason if e.rcvd else "the terminal closed", code="not_found"
            ) from None
        except TimeoutError:
            await ws.close()
            raise RequestTimeout("the terminal did not start in time") from None
        event = pty_event(first)
        if event is not None and event.kind == "started":
            self.pid = event.raw.get("pid")
        self._ws = ws

    @property
    def _socket(self) -> ClientConnection:
        if self._ws is None:
            raise ConnectionFailed("the terminal is not attached")
        return self._ws

    async def __aenter__(self) -> Terminal:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()
        if self.owned:
            await self.end()

    async def end(self) -> None:
        """End the session and its shell (gone already is fine)."""
        if self._pty is None:
            raise RuntimeError("end() needs a terminal made by pty.open()")
        try:
            await self._pty.close(self.session_id)
        except NotFound:
            pass

    async def send(self, data: str) -> None:
        """Type ``data``."""
        await self._socket.send(_frame({"type": "input", "data": data}))

    async def resize(self, cols: int, rows: int) -> None:
        """Change the window size."""
        await self._socket.send(_frame({"type": "resize", "cols": cols, "rows": rows}))

    async def signal(self, name: str) -> None:
        """Send a signal to the foreground group (SIGINT ...)."""
        await self._socket.send(_frame({"type": "signal", "signal": name}))

    async def recv(self, timeout: float | None = None) -> PtyEvent | None:
        """
        The next output (or ``exited``) event; None when the connection closed.

        :raises RequestTimeout: nothing within ``timeout`` seconds.
        """
        while True:
            try:
                message = await asyncio.wait_for(self._socket.recv(), timeout)
            except TimeoutError:
                raise RequestTimeout(f"no terminal output within {timeout} s") from None
            except ConnectionClosed:
                return None
            event = pty_event(message)
            if event is None or event.kind == "started":
                continue
            if event.kind == "exited":
                self.exit_code = event.exit_code
                self.ended = True
            self.offset = output_end(event, self.offset)
            return event

    async def __aiter__(self) -> AsyncIterator[PtyEvent]:
        while (event := await self.recv()) is not None:
            yield event

    async def expect(self, text: str, timeout: float = 10.0) -> str:
        """Read output until it contains ``text``; everything read."""
        deadline = time.monotonic() + timeout
        seen = ""
        while text not in seen:
            left = deadline - time.monotonic()
            if left <= 0:
                raise RequestTimeout(
                    f"{text!r} not seen within {timeout} s; got {seen[-200:]!r}"
                )
            event = await self.recv(timeout=left)
            if event is None:
                raise ConnectionFailed(
                    f"the terminal closed before {text!r}; got {seen[-200:]!r}"
                )
            seen += event.data
        return seen

    async def reconnect(self) -> None:
        """Attach again, replaying only the output after :attr:`offset`."""
        await self.close()
        await self._open(self.offset)

    async def close(self) -> None:
        """Detach (the session lives on)."""
        if self._ws is not None:
            await self._ws.close()
            self._ws = None


def _frame(message: dict[str, Any]) -> str:
    import json

    return json.dumps(message)


class Pty(_Namespace):
    """``sandbox.pty``: terminal sessions (SPEC §7.5, §8)."""

    async def create(
        self,
        *,
        cols: int = 80,
        rows: int = 24,
        shell: str | None = None,
        cwd: str | None = None,
        env: Mapping[str, str] | None = None,
        user: str | int | None = None,
    ) -> PtyCreated:
        """Start a shell on a new terminal: ``session_id``, ``ws_url``, ``pid``."""
        created = cast(
            PtyCreated,
            await self._http.call(
                calls.pty_create_session(cols, rows, shell, cwd, env, user)
            ),
        )
        self._sandbox._ws_base = created["ws_url"]
        return created

    async def open(self, *, keep: bool = False, **options: Any) -> Terminal:
        """
        :meth:`create`, then :meth:`attach` to it; leaving the ``async
        with`` block ends the session unless ``keep=True``.
        """
        created = await self.create(**options)
        terminal = Terminal(
            self._http.settings,
            created["session_id"],
            created["ws_url"],
            None,
            None if keep else self,
        )
        await terminal._open(None)
        return terminal

    async def attach(self, session_id: str, *, offset: int | None = None) -> Terminal:
        """
        Attach to a session: ``started``, then its scrollback (or only what
        followed ``offset``), then live output.

        The WebSocket is ``pty_url`` when it is set, else the session's own
        ``ws_url`` (from :meth:`get`), so a session another client created
        is reached where the daemon says, through a proxy or port mapping
        too.  An unknown session raises :class:`NotFound`.
        """
        base = self._sandbox.settings.pty_url
        if not base:
            found: dict[str, Any] = dict(await self.get(session_id))
            base = str(found.get("ws_url") or self._sandbox.pty_base())
        terminal = Terminal(self._http.settings, session_id, base, offset)
        await terminal._open(offset)
        return terminal

    async def list(self) -> builtins.list[PtySessionInfo]:
        """Sessions of this identity."""
        sessions = (await self._http.call(calls.pty_list_sessions()))["sessions"]
        return cast(builtins.list[PtySessionInfo], [session_info(s) for s in sessions])

    async def get(self, session_id: str) -> PtySessionInfo:
        """One session."""
        return cast(
            PtySessionInfo,
            session_info(await self._http.call(calls.pty_detail(session_id))),
        )

    async def resize(self, session_id: str, cols: int, rows: int) -> PtySessionInfo:
        """Resize over REST (attached clients can also :meth:`Terminal.resize`)."""
        return cast(
            PtySessionInfo,
            await self._http.call(calls.pty_resize(session_id, cols, rows)),
        )

    async def close(self, session_id: str) -> None:
        """End the session and its shell."""
        await self._http.call(calls.pty_delete_session(session_id))


class System(_Namespace):
    """``sandbox.system``: facts about the sandbox (SPEC §7.6)."""

    async def info(self) -> dict[str, Any]:
        """OS, CPU, memory, disk."""
        return cast(dict[str, Any], await self._http.call(calls.system_info()))

    async def metrics(self) -> dict[str, Any]:
        """Load, memory and disk usage."""
        return cast(dict[str, Any], await self._http.call(calls.system_metrics()))

    async def ports(self) -> builtins.list[dict[str, Any]]:
        """Listening TCP sockets."""
        return cast(
            builtins.list[dict[str, Any]],
            (await self._http.call(calls.ports()))["listening"],
        )

    async def packages(self, manager: str = "pip") -> builtins.list[dict[str, str]]:
        """Installed ``pip`` or ``npm`` packages."""
        return cast(
            builtins.list[dict[str, str]],
            (await self._http.call(calls.packages(manager)))["packages"],
        )


class Env(_Namespace):
    """``sandbox.env``: the environment later children inherit."""

    async def get(self, *names: str) -> dict[str, str]:
        """Variables (all, or ``names``); secrets are never returned."""
        return cast(
            dict[str, str], (await self._http.call(calls.env_get(names)))["variables"]
        )

    async def set(
        self, variables: Mapping[str, str] | None = None, /, **more: str
    ) -> builtins.list[str]:
        """Set variables; the names updated."""
        merged = {**(variables or {}), **more}
        return cast(
            builtins.list[str],
            (await self._http.call(calls.env_set(merged)))["updated"],
        )


class Git(_Namespace):
    """``sandbox.git``: ``status`` and ``diff`` (opt-in ``dev_tools``); the rest needs the opt-in ``git`` group."""

    async def status(self, path: str = ".") -> GitStatus:
        """Branch, ahead/behind, changed files."""
        return cast(GitStatus, await self._http.call(calls.git_status(path)))

    async def diff(
        self, path: str = ".", *, staged: bool = False, file: str | None = None
    ) -> GitDiff:
        """The diff and its stats (truncated at 1 MB)."""
        return cast(GitDiff, await self._http.call(calls.git_diff(path, staged, file)))

    # -- the git group (opt-in ``git``, SPEC §24) ---------------------------------

    async def init(
        self, path: str, *, initial_branch: str = "main", bare: bool = False
    ) -> dict[str, Any]:
        """Create a repository at ``path``."""
        return cast(
            dict[str, Any],
            await self._http.call(
                calls.git(
                    "POST", "/init", path=path, initial_branch=initial_branch, bare=bare
                )
            ),
        )

    async def add(
        self, path: str = ".", files: Sequence[str] | None = None, *, all: bool = False
    ) -> list[str]:
        """Stage ``files`` (or every change with ``all``); the staged paths."""
        fields: dict[str, Any] = {"path": path}
        if all:
            fields["all"] = True
        else:
            fields["files"] = list(files or [])
        reply = await self._http.call(calls.git("POST", "/add", **fields))
        return cast(list[str], reply["staged"])

    async def commit(
        self,
        path: str,
        message: str,
        *,
        author: Mapping[str, str] | None = None,
        allow_empty: bool = False,
        files: Sequence[str] | None = None,
    ) -> dict[str, Any]:
        """Commit the index: ``{commit, branch, summary}``."""
        return cast(
            dict[str, Any],
            await self._http.call(
                calls.git(
                    "POST",
                    "/commit",
                    path=path,
                    message=message,
                    author=dict(author) if author is not None else None,
                    allow_empty=allow_empty or None,
                    files=list(files) if files is not None else None,
                )
            ),
        )

    async def log(
        self, path: str = ".", *, ref: str = "HEAD", max: int = 50
    ) -> list[dict[str, Any]]:
        """The commits reachable from ``ref``, newest first."""
        reply = await self._http.call(
            calls.git("GET", "/log", {"path": path, "ref": ref, "max": max})
        )
        return cast(list[dict[str, Any]], reply["commits"])

    async def branches(self, path: str = ".") -> dict[str, Any]:
        """``{current, detached, branches}``."""
        return cast(
            dict[str, Any],
            await self._http.call(calls.git("GET", "/branches", {"path": path})),
        )

    async def create_branch(
        self,
        path: str,
        name: str,
        *,
        start_point: str | None = None,
        checkout: bool = False,
    ) -> dict[str, Any]:
        """A new branch (switched to with ``checkout``)."""
        return cast(
            dict[str, Any],
            await self._http.call(
                calls.git(
                    "POST",
                    "/branches",
                    path=path,
                    name=name,
                    start_point=start_point,
                    checkout=checkout or None,
                )
            ),
        )

    async def checkout(
        self, path: str, ref: str, *, create: bool = False, force: bool = False
    ) -> dict[str, Any]:
        """Switch to ``ref``: ``{branch, commit, detached}``."""
        return cast(
            dict[str, Any],
            await self._http.call(
                calls.git(
                    "POST",
                    "/checkout",
                    path=path,
                    ref=ref,
                    create=create or None,
                    force=force or None,
                )
            ),
        )

    async def clone(
        self,
        url: str,
        path: str,
        *,
        auth: Mapping[str, str] | None = None,
        branch: str | None = None,
        depth: int | None = None,
        wait: float = 600.0,
        user: str | int | None = None,
    ) -> dict[str, Any]:
        """
        Clone ``url`` into ``path``. ``auth`` is ``{"credential": NAME}`` (a
        secret the policy holds) or ``{"username", "password"}``. Waits up to
        ``wait`` seconds: the result (``state: done``), or the running job
        (``state: running``, follow it with :meth:`job`).
        """
        return cast(
            dict[str, Any],
            await self._http.call(
                calls.git(
                    "POST",
                    "/clone",
                    wait=wait,
                    url=url,
                    path=path,
                    auth=dict(auth) if auth is not None else None,
                    branch=branch,
                    depth=depth,
                    user=user,
                )
            ),
        )

    async def fetch(
        self,
        path: str = ".",
        *,
        remote: str = "origin",
        auth: Mapping[str, str] | None = None,
        wait: float = 600.0,
    ) -> dict[str, Any]:
        """Fetch from ``remote`` (a job; see :meth:`clone` for ``auth`` and ``wait``)."""
        return cast(
            dict[str, Any],
            await self._http.call(
                calls.git(
                    "POST",
                    "/fetch",
                    wait=wait,
                    path=path,
                    remote=remote,
                    auth=dict(auth) if auth is not None else None,
                )
            ),
        )

    async def pull(
        self,
        path: str = ".",
        *,
        remote: str = "origin",
        branch: str | None = None,
        auth: Mapping[str, str] | None = None,
        wait: float = 600.0,
    ) -> dict[str, Any]:
        """Pull (fast-forward only) from ``remote``."""
        return cast(
            dict[str, Any],
            await self._http.call(
                calls.git(
                    "POST",
                    "/pull",
                    wait=wait,
                    path=path,
                    remote=remote,
                    branch=branch,
                    auth=dict(auth) if auth is not None else None,
                )
            ),
        )

    async def push(
        self,
        path: str = ".",
        *,
        remote: str = "origin",
        branch: str | None = None,
        set_upstream: bool = False,
        auth: Mapping[str, str] | None = None,
        wait: float = 600.0,
    ) -> dict[str, Any]:
        """Push a branch: ``{updated: [...], remote_verified}``."""
        return cast(
            dict[str, Any],
            await self._http.call(
                calls.git(
                    "POST",
                    "/push",
                    wait=wait,
                    path=path,
                    remote=remote,
                    branch=branch,
                    set_upstream=set_upstream or None,
                    auth=dict(auth) if auth is not None else None,
                )
            ),
        )

    async def job(self, job_id: str) -> dict[str, Any]:
        """One remote job: ``state``, ``progress``, ``result`` or ``error``."""
        return cast(
            dict[str, Any],
            await self._http.call(calls.git("GET", f"/jobs/{seg(job_id)}")),
        )

    async def cancel(self, job_id: str) -> dict[str, Any]:
        """Cancel a job; answers once git's whole tree is gone."""
        return cast(
            dict[str, Any],
            await self._http.call(calls.git("DELETE", f"/jobs/{seg(job_id)}")),
        )


class Code(_Namespace):
    """
    ``sandbox.code``: snippets of python, node or bash (``run``, opt-in
    ``dev_tools``), and code contexts: stateful kernels (opt-in ``code``).
    """

    async def run(
        self,
        code: str,
        language: str = "python",
        *,
        timeout: float | None = None,
        cwd: str | None = None,
        env: Mapping[str, str] | None = None,
        user: str | int | None = None,
    ) -> CodeResult:
        """Run a snippet: ``stdout``, ``stderr``, ``exit_code``, ``execution_time_ms``."""
        return cast(
            CodeResult,
            await self._http.call(
                calls.code_run(code, language, timeout, cwd, env, user)
            ),
        )

    # -- code contexts (stateful kernels, the opt-in ``code`` group) ----------

    async def kernels(self) -> builtins.list[dict[str, Any]]:
        """Kernels a context may run (``name``, ``language``, ``allowed`` ...)."""
        return cast(
            builtins.list[dict[str, Any]],
            (await self._http.call(Req("GET", "/code/kernels")))["kernels"],
        )

    async def create_context(self, **fields: Any) -> dict[str, Any]:
        """A new context (``kernel``, ``language``, ``cwd``, ``env``, ``user``, ``name``)."""
        return cast(
            dict[str, Any], await self._http.call(calls.code_contexts("POST", **fields))
        )

    async def contexts(self) -> builtins.list[dict[str, Any]]:
        """Your contexts."""
        return cast(
            builtins.list[dict[str, Any]],
            (await self._http.call(calls.code_contexts("GET")))["contexts"],
        )

    async def context(self, context_id: str) -> dict[str, Any]:
        """One context, with what runs and what waits."""
        return cast(
            dict[str, Any],
            await self._http.call(
                calls.code_contexts("GET", calls.code_context_path(context_id))
            ),
        )

    async def delete_context(self, context_id: str) -> dict[str, Any]:
        """Close a context (its kernel's process tree is killed)."""
        return cast(
            dict[str, Any],
            await self._http.call(
                calls.code_contexts("DELETE", calls.code_context_path(context_id))
            ),
        )

    async def restart(self, context_id: str) -> dict[str, Any]:
        """A fresh kernel: the context's state is lost."""
        return cast(
            dict[str, Any],
            await self._http.call(
                calls.code_contexts(
                    "POST", calls.code_context_path(context_id, "/restart")
                )
            ),
        )

    async def interrupt(self, context_id: str) -> dict[str, Any]:
        """Interrupt what the context runs."""
        return cast(
            dict[str, Any],
            await self._http.call(
                calls.code_contexts(
                    "POST", calls.code_context_path(context_id, "/interrupt")
                )
            ),
        )

    async def execute(
        self,
        context_id: str,
        code: str,
        *,
        timeout: float | None = None,
        wait: float | None = None,
        **fields: Any,
    ) -> dict[str, Any]:
        """
        Run code in a context: the result document (``state``, ``stdout``,
        ``results`` with MIME bundles, ``error``) when it ends within
        ``wait`` (default: its timeout), else ``{execution_id, state}``.
        """
        limit = wait if wait is not None else (timeout or 300.0) + 10.0
        req = calls.code_contexts(
            "POST",
            calls.code_context_path(context_id, "/execute"),
            read_timeout=limit + 30.0,
            code=code,
            timeout=timeout,
            wait=wait,
            **fields,
        )
        return cast(dict[str, Any], await self._http.call(req))

    async def execution(
        self, context_id: str, execution_id: str, *, wait: float | None = None
    ) -> dict[str, Any]:
        """One execution's result (``wait`` long-polls while it runs)."""
        return cast(
            dict[str, Any],
            await self._http.call(
                calls.code_contexts(
                    "GET",
                    calls.code_context_path(
                        context_id, f"/executions/{seg(execution_id)}"
                    ),
                    {"wait": wait},
                    read_timeout=(wait or 0) + 60.0,
                )
            ),
        )

    async def events(
        self, context_id: str, execution_id: str, *, after: int | None = None
    ) -> EventStream:
        """An execution's events, live and resumed across reconnects."""
        path = calls.code_context_path(
            context_id, f"/executions/{seg(execution_id)}/events"
        )
        return await self._http.open("/code/contexts" + path, {"follow": "true"}, after)

    async def send_input(
        self, context_id: str, execution_id: str, value: str
    ) -> dict[str, Any]:
        """Answer an execution's ``input()``."""
        return cast(
            dict[str, Any],
            await self._http.call(
                calls.code_contexts(
                    "POST",
                    calls.code_context_path(
                        context_id, f"/executions/{seg(execution_id)}/input"
                    ),
                    value=value,
                )
            ),
        )


class Browser(_Namespace):
    """``sandbox.browser``: the shared headless page (opt-in, SPEC §7.8)."""

    async def navigate(
        self, url: str, *, wait_until: str | None = None, timeout: int | None = None
    ) -> dict[str, Any]:
        """Open ``url``: ``url``, ``title``, ``status``."""
        return cast(
            dict[str, Any],
            await self._http.call(
                calls.browser(
                    "POST", "navigate", url=url, wait_until=wait_until, timeout=timeout
                )
            ),
        )

    async def screenshot(
        self,
        *,
        full_page: bool | None = None,
        selector: str | None = None,
        type: str | None = None,
    ) -> bytes:
        """A PNG (or JPEG) of the page or one element."""
        answer = await self._http.call(
            calls.browser(
                "POST", "screenshot", full_page=full_page, selector=selector, type=type
            )
        )
        return base64.b64decode(answer["image_base64"])

    async def content(self, type: str = "html") -> dict[str, Any]:
        """The page's ``content`` (html or text), ``url``, ``title``."""
        return cast(
            dict[str, Any],
            await self._http.call(calls.browser("GET", "content", type=type)),
        )

    async def click(
        self, selector: str, *, timeout: int | None = None
    ) -> dict[str, Any]:
        """Click an element."""
        return cast(
            dict[str, Any],
            await self._http.call(
                calls.browser("POST", "click", selector=selector, timeout=timeout)
            ),
        )

    async def type(
        self,
        selector: str,
        text: str,
        *,
        delay: float | None = None,
        timeout: int | None = None,
    ) -> dict[str, Any]:
        """Type into an element."""
        return cast(
            dict[str, Any],
            await self._http.call(
                calls.browser(
                    "POST",
                    "type",
                    selector=selector,
                    text=text,
                    delay=delay,
                    timeout=timeout,
                )
            ),
        )

    async def evaluate(self, script: str, *, timeout: int | None = None) -> Any:
        """Evaluate JavaScript in the page; its ``result``."""
        return (
            await self._http.call(
                calls.browser("POST", "evaluate", script=script, timeout=timeout)
            )
        )["result"]

    async def pdf(
        self, *, format: str | None = None, landscape: bool | None = None
    ) -> bytes:
        """The page printed to PDF."""
        answer = await self._http.call(
            calls.browser("POST", "pdf", format=format, landscape=landscape)
        )
        return base64.b64decode(answer["pdf_base64"])

    async def console(self) -> builtins.list[dict[str, Any]]:
        """Console messages since the last read."""
        return cast(
            builtins.list[dict[str, Any]],
            (await self._http.call(calls.browser("GET", "console")))["logs"],
        )


class Agents(_Namespace):
    """
    ``sandbox.agents``: coding-agent sessions (opt-in, SPEC §15).  Field
    names are the routes' own; extra keyword arguments go into the body.
    """

    async def catalog(self) -> builtins.list[dict[str, Any]]:
        """Agents this sandbox knows."""
        return cast(
            builtins.list[dict[str, Any]],
            (await self._http.call(calls.agents("GET", "/catalog")))["agents"],
        )

    async def describe(self, agent: str, *, probe: bool = False) -> dict[str, Any]:
        """One catalogue entry (``probe=True`` starts it once to ask)."""
        return cast(
            dict[str, Any],
            await self._http.call(
                calls.agents("GET", f"/catalog/{seg(agent)}", {"probe": probe})
            ),
        )

    async def install(
        self, agent: str, *, version: str | None = None
    ) -> dict[str, Any]:
        """Install an agent (a managed process: follow it with ``commands.connect(pid)``)."""
        return cast(
            dict[str, Any],
            await self._http.call(
                calls.agents("POST", f"/catalog/{seg(agent)}/install", version=version)
            ),
        )

    async def create(self, agent: str, **fields: Any) -> dict[str, Any]:
        """Start a session (``cwd``, ``mode``, ``model``, ``prompt`` ...): ``session_id`` ..."""
        return cast(
            dict[str, Any],
            await self._http.call(
                calls.agents("POST", "/sessions", agent=agent, **fields)
            ),
        )

    async def sessions(
        self, *, agent: str | None = None, state: str | None = None
    ) -> builtins.list[dict[str, Any]]:
        """Sessions, optionally filtered."""
        return cast(
            builtins.list[dict[str, Any]],
            (
                await self._http.call(
                    calls.agents("GET", "/sessions", {"agent": agent, "state": state})
                )
            )["sessions"],
        )

    async def get(self, session_id: str) -> dict[str, Any]:
        """One session."""
        return cast(
            dict[str, Any],
            await self._http.call(calls.agents("GET", calls.session_path(session_id))),
        )

    async def prompt(
        self,
        session_id: str,
        prompt: str | builtins.list[dict[str, Any]],
        *,
        files: Sequence[str] | None = None,
        wait: float | None = None,
    ) -> dict[str, Any]:
        """One turn: the finished turn (200) or ``{turn_id, state: running}`` (202)."""
        req = calls.agents(
            "POST",
            calls.session_path(session_id, "/prompt"),
            prompt=prompt,
            files=list(files) if files else None,
            wait=wait,
        )
        req.timeout = max(req.timeout or 0, (wait or 30.0) + 30)
        return cast(dict[str, Any], await self._http.call(req))

    async def cancel(
        self, session_id: str, *, wait: float | None = None
    ) -> dict[str, Any]:
        """Cancel the running turn."""
        return cast(
            dict[str, Any],
            await self._http.call(
                calls.agents(
                    "POST", calls.session_path(session_id, "/cancel"), wait=wait
                )
            ),
        )

    async def configure(self, session_id: str, **fields: Any) -> dict[str, Any]:
        """Change ``mode``, ``model``, ``config`` or ``title``."""
        return cast(
            dict[str, Any],
            await self._http.call(
                calls.agents(
                    "POST", calls.session_path(session_id, "/config"), **fields
                )
            ),
        )

    async def close(self, session_id: str, *, forget: bool = False) -> dict[str, Any]:
        """Close a session (its agent is ended)."""
        return cast(
            dict[str, Any],
            await self._http.call(
                calls.agents(
                    "DELETE", calls.session_path(session_id), {"forget": forget}
                )
            ),
        )

    async def events(
        self,
        session_id: str,
        *,
        after: int | None = None,
        types: Sequence[str] | None = None,
        include_raw: bool = False,
    ) -> EventStream:
        """The session's event log, followed live and resumed across reconnects."""
        params: dict[str, Any] = {
            "follow": "true",
            "include_raw": "true" if include_raw else "false",
        }
        if types:
            params["types"] = ",".join(types)
        return await self._http.open(
            "/agents" + calls.session_path(session_id, "/events"), params, after
        )

    async def requests(
        self,
        *,
        session_id: str | None = None,
        state: str | None = None,
        kind: str | None = None,
    ) -> builtins.list[dict[str, Any]]:
        """Permission requests and questions (pending by default)."""
        return cast(
            builtins.list[dict[str, Any]],
            (
                await self._http.call(
                    calls.agents(
                        "GET",
                        "/requests",
                        {"session_id": session_id, "state": state, "kind": kind},
                    )
                )
            )["requests"],
        )

    async def reply(self, request_id: str, **answer: Any) -> dict[str, Any]:
        """Answer one (``option_id=``, ``decision=``, ``cancel=True``, or ``action=``)."""
        return cast(
            dict[str, Any],
            await self._http.call(
                calls.agents("POST", f"/requests/{seg(request_id)}", **answer)
            ),
        )

    async def read(self, session_id: str, what: str, **params: Any) -> dict[str, Any]:
        """
        Any other read of a session: ``turns``, ``messages``, ``plan``,
        ``tool-calls``, ``files``, ``terminals``, ``commands``, ``logs``.
        """
        return cast(
            dict[str, Any],
            await self._http.call(
                calls.agents(
                    "GET", calls.session_path(session_id, "/" + what.strip("/")), params
                )
            ),
        )


class AsyncSandbox:
    """
    An asyncio client of one sandboxd daemon (every call is a coroutine).

    ::

        async with AsyncSandbox("http://127.0.0.1:9000", token="...") as sb:
            await sb.files.write_text("hello.txt", "hi")
            print((await sb.commands.run("cat hello.txt")).stdout)

    :param url: the HTTP base URL (default ``SANDBOXD_URL``, else
        ``http://127.0.0.1:9000``).
    :param token: the access token (default ``SANDBOXD_TOKEN``).
    :param timeout: seconds for each call (connect, and each read).
    :param retries: retries of idempotent calls and resumable streams
        after a lost connection.
    :param wait_on_rate_limit: on a 429, wait ``retry_after`` and retry.
    :param pty_url: the PTY WebSocket base (``ws://host:9001``).
    :param http_client: an ``httpx.AsyncClient`` to use instead of a new one.
    """

    def __init__(
        self,
        url: str | None = None,
        token: str | None = None,
        *,
        timeout: float = DEFAULT_TIMEOUT,
        retries: int = DEFAULT_RETRIES,
        wait_on_rate_limit: bool = False,
        pty_url: str | None = None,
        http_client: httpx.AsyncClient | None = None,
    ) -> None:
        self.settings = settings_from(
            url, token, timeout, retries, wait_on_rate_limit, pty_url
        )
        self._http = _Http(self.settings, http_client)
        self._ws_base: str | None = None
        self.files = Files(self)
        self.commands = Commands(self)
        self.pty = Pty(self)
        self.system = System(self)
        self.env = Env(self)
        self.git = Git(self)
        self.code = Code(self)
        self.browser = Browser(self)
        self.agents = Agents(self)

    @property
    def url(self) -> str:
        """The daemon's HTTP base URL."""
        return self.settings.url

    def pty_base(self) -> str:
        """Where terminals are attached: ``pty_url``, a created session's ``ws_url``, or port + 1."""
        if self.settings.pty_url:
            return self.settings.pty_url
        return self._ws_base or self.settings.base_pty_url()

    async def __aenter__(self) -> AsyncSandbox:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        """Close the connection pool."""
        await self._http.close()

    async def health(self) -> bool:
        """Whether ``/health`` answers ok (no token needed)."""
        try:
            return bool((await self._http.call(calls.health())).get("status") == "ok")
        except SandboxError:
            return False

    async def capabilities(self) -> dict[str, Any]:
        """What this caller may do, endpoint by endpoint (SPEC §5.6)."""
        return cast(dict[str, Any], await self._http.call(calls.capabilities()))

    async def check(
        self,
        endpoint: str,
        path: str | None = None,
        *,
        op: str | None = None,
        paths: Sequence[str] | None = None,
    ) -> Decision:
        """The policy's decision for a call, without making it (``allowed``, ``code``, ``rule``)."""
        return cast(
            Decision, await self._http.call(calls.check(endpoint, path, op, paths))
        )

    async def openapi(self) -> dict[str, Any]:
        """The daemon's OpenAPI 3.1 document."""
        return cast(dict[str, Any], await self._http.call(calls.openapi()))

    async def request(
        self,
        method: str,
        path: str,
        *,
        params: Mapping[str, Any] | None = None,
        json: Any = None,
    ) -> Any:
        """Any JSON route (a custom one, say), with the same errors and retries."""
        return await self._http.call(
            Req(method.upper(), path, dict(params) if params else None, json)
        )


__all__ = [
    "Agents",
    "AsyncSandbox",
    "Browser",
    "Code",
    "Commands",
    "Env",
    "Files",
    "Git",
    "Process",
    "Pty",
    "System",
    "Terminal",
]
