"""
Every call of the client, written once: the namespaces (``files``,
``commands``, ``pty`` ...), the process and terminal handles, and the
client's own calls.  Each is a coroutine over the ops of
:mod:`sandboxd.client._plan`; :class:`~sandboxd.client.Sandbox` runs them
blocking, :class:`~sandboxd.client.AsyncSandbox` as coroutines, so both
faces have the same methods with the same signatures by construction.
"""

from __future__ import annotations

import base64
import builtins
import contextlib
import json
import os
import time
from collections.abc import (
    AsyncGenerator,
    Awaitable,
    Callable,
    Generator,
    Mapping,
    Sequence,
)
from contextlib import aclosing
from typing import Any, Generic, TypeVar, cast

from websockets.exceptions import ConnectionClosed, InvalidStatus, WebSocketException

from sandboxd.client import _calls as calls
from sandboxd.client._core import (
    CHUNK_BYTES,
    DEFAULT_RETRIES,
    DEFAULT_TIMEOUT,
    RESUMABLE_UPLOAD_BYTES,
    Req,
    Settings,
    decode,
    output_end,
    pty_event,
    pty_ws_url,
    seg,
    settings_from,
    transport_error,
    ws_headers,
)
from sandboxd.client._execution import EventSplitter, ExecutionEvents
from sandboxd.client._http import EventStream, Http, StreamControl
from sandboxd.client._plan import (
    AsyncFace,
    BlockingFace,
    Chunks,
    F,
    Part,
    api,
    api_stream,
    on_face,
    sleep,
    tell,
    ws_close,
    ws_open,
    ws_recv,
    ws_send,
)
from sandboxd.client._shared import (
    ByteRun,
    PartialFile,
    RangeState,
    ResumableUpload,
    command_result,
    handshake_error,
    progress_chunks,
    session_info,
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
    Timeout,
    TooManySessions,
    error_for,
)
from sandboxd.client.models import (
    CodeResult,
    CommandResult,
    Completions,
    Decision,
    Diagnostics,
    Edited,
    Entry,
    Extracted,
    GitDiff,
    GitStatus,
    GrepResult,
    Hover,
    Lines,
    Listing,
    Locations,
    LspServer,
    LspSession,
    OutputPage,
    ProcessInfo,
    Progress,
    PtyCreated,
    PtyEvent,
    PtySessionInfo,
    Renamed,
    SearchResult,
    SSEEvent,
    Stat,
    Symbols,
    Written,
)

#: The httpx client a face drives.
H = TypeVar("H")
#: Takes a line of a command's output (on the asyncio client it may be a
#: coroutine function).
Line = Callable[[str], "Awaitable[None] | None"]
#: Takes a chunk of a command's output, as bytes.
Chunk = Callable[[bytes], "Awaitable[None] | None"]


class _Namespace(Part[F]):
    """One group of calls of a client (``sb.files``, ``sb.git`` ...)."""

    def __init__(self, client: Client[F, Any]) -> None:
        self._client = client
        self._face = client._face
        self._http = client._http

    async def _open(
        self,
        path: str,
        params: Mapping[str, Any],
        after: int | None,
        final: str | None = None,
    ) -> EventStream[F]:
        """
        A GET stream, connected (its refusal raised here); ``final`` as
        :meth:`~sandboxd.client._http.Http.stream` takes it.
        """
        control = StreamControl()
        source = self._http.stream(
            "GET",
            path,
            params,
            after=after,
            announce=True,
            final=final,
            control=control,
        )
        stream = EventStream(self._face, source, control)
        await stream._connect()
        return stream


class Files(_Namespace[F]):
    """``sandbox.files``: the ``file_ops`` group."""

    @api
    async def read_bytes(self, path: str) -> bytes:
        """A file's bytes (``GET /files/raw``; resumed by Range after a cut)."""
        chunks: list[bytes] = []
        state = RangeState(restart=chunks.clear)
        await self._http.fetch_raw(path, chunks.append, state, None)
        return b"".join(chunks)

    @api
    async def read_text(self, path: str, encoding: str = "utf-8") -> str:
        """A file's text."""
        return (await Files.read_bytes.fn(self, path)).decode(encoding)

    @api
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

    @api
    async def write_text(self, /, path: str, text: str, **options: Any) -> Written:
        """Write ``text`` as UTF-8 (options as :meth:`write_bytes`)."""
        return await Files.write_bytes.fn(self, path, text.encode("utf-8"), **options)

    @api
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
        ``progress(sent, total)``.  The daemon writes it atomically: the
        target holds the old content (or nothing) until the last byte is in.

        A file of ``RESUMABLE_UPLOAD_BYTES`` (8 MiB) or more, with
        ``resume=True``, goes as a resumable upload (``/files/uploads``):
        after a cut connection the client asks the daemon how many bytes it
        has and sends only the rest (up to ``retries`` times).  Smaller
        files, ``resume=False``, a daemon that does not serve
        ``/files/uploads`` (older, or switched off by its policy) or one
        whose upload slots are all taken (``too_many_sessions``) get one
        ``POST /files/raw``, sent again whole after a cut.

        To carry on in a later process, keep the id ``on_upload_id(id)`` is
        told (or the ``upload_id`` in the ``body`` of the
        :class:`ConnectionFailed` raised when retries run out) and pass it
        back as ``upload_id=``; an upload the daemon no longer has (done,
        expired after an idle hour, deleted) starts over.  An id whose
        upload is for another remote path or size raises
        :class:`UploadMismatch` before a byte is sent (that upload is left
        as it is).

        :returns: ``path``, ``bytes``, ``sha256``, ``etag`` (and
            ``complete: true`` from a resumable upload).
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

        req = calls.files_write_raw(remote, overwrite, mode, None)
        req.headers["Content-Length"] = str(size)
        req.idempotent = overwrite
        req.timeout = max(self._http.settings.timeout, 60.0)
        with open(local, "rb") as f:

            def content() -> Chunks:
                f.seek(0)  # a retry sends it whole again
                return progress_chunks(lambda: f.read(CHUNK_BYTES), 0, size, progress)

            return cast(Written, decode(await self._http.send(req, content=content)))

    async def _resumable(
        self, steps: ResumableUpload, progress: Progress | None
    ) -> Written | None:
        """The steps of :class:`ResumableUpload` (None: not served)."""
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
            except TooManySessions:
                # Every upload slot is held (by uploads of clients that
                # died, most often): one raw write needs none, and is as
                # atomic; it only cannot resume after a cut.
                return None
            if not steps.on_record(created):
                raise ProtocolError("the daemon created an upload of another size")

        def chunks(f: Any) -> Chunks:
            read = steps.read_from(f)
            return progress_chunks(read, steps.offset, steps.size, progress)

        with open(steps.local, "rb") as f:
            while True:
                req = steps.append()
                req.timeout = max(http.settings.timeout, 60.0)
                try:
                    answer = decode(await http.send(req, content=lambda: chunks(f)))
                except (ConnectionFailed, RequestTimeout) as e:
                    await sleep(steps.on_cut(e))
                except SandboxError as e:
                    wait = steps.on_refusal(e)
                    if wait is None:
                        raise
                    await sleep(wait)
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

    @api
    async def delete_upload(self, upload_id: str) -> None:
        """Drop a resumable upload and its staging file (``DELETE /files/uploads/{id}``)."""
        await self._http.send(calls.files_uploads_delete(upload_id))

    @api
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

    @api
    async def list(
        self,
        path: str | None = None,
        *,
        depth: int | None = None,
        hidden: bool | None = None,
    ) -> builtins.list[Entry]:
        """A directory's entries (``depth`` 1..10)."""
        return (await Files.listing.fn(self, path, depth=depth, hidden=hidden))[
            "entries"
        ]

    @api
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

    @api
    async def stat(self, path: str) -> Stat:
        """One path (``exists: false`` when missing inside the boundary)."""
        return cast(Stat, await self._http.call(calls.files_stat(path)))

    @api
    async def exists(self, path: str) -> bool:
        """Whether ``path`` exists."""
        return bool((await Files.stat.fn(self, path))["exists"])

    @api
    async def mkdir(self, path: str) -> dict[str, Any]:
        """Create a directory and its parents."""
        return await self._http.object(calls.files_mkdir(path))

    @api
    async def delete(self, path: str) -> dict[str, Any]:
        """Delete a file or a directory tree."""
        return await self._http.object(calls.files_delete(path))

    @api
    async def move(
        self, source: str, destination: str, *, overwrite: bool = False
    ) -> dict[str, Any]:
        """Move or rename."""
        return await self._http.object(calls.files_move(source, destination, overwrite))

    @api
    async def search(
        self, pattern: str, path: str | None = None, *, max_results: int | None = None
    ) -> SearchResult:
        """Names matching an fnmatch ``pattern``, recursively."""
        return cast(
            SearchResult,
            await self._http.call(calls.files_search(pattern, path, max_results)),
        )

    @api
    async def chmod(self, path: str, mode: str | int) -> dict[str, Any]:
        """
        Set the permission bits of a file or directory: ``0o755`` or
        ``"755"`` (000..777; no set-user-ID, set-group-ID or sticky bit).
        """
        return await self._http.object(calls.files_chmod(path, mode))

    @api
    async def edit(
        self,
        path: str,
        old_text: str | None = None,
        new_text: str | None = None,
        *,
        replace_all: bool = False,
        edits: Sequence[Mapping[str, Any]] | None = None,
        dry_run: bool = False,
        if_match: str | None = None,
    ) -> Edited:
        """
        Replace ``old_text`` (exactly as in the file, there once unless
        ``replace_all``; LF line ends also match a file that is all CRLF)
        with ``new_text``, atomically; or apply ``edits``
        (``{"old_text", "new_text", "replace_all"?}`` each, or
        ``{"insert_line", "new_text"}`` to add lines after that line) in
        order, all or none.

        :param dry_run: check and count, write nothing.
        :param if_match: an ``etag``: refuse (412) if the file changed since.
        :raises InvalidParam: an edit's text is missing or ambiguous (its
            ``body["kind"]``: ``not_found``, ``not_unique``), or the file is
            not UTF-8 (``not_text``).
        """
        if (edits is None) == (old_text is None or new_text is None):
            raise TypeError("give old_text and new_text, or edits")
        listed: list[dict[str, Any]] | dict[str, Any] = (
            [dict(e) for e in edits]
            if edits is not None
            else {
                "old_text": old_text,
                "new_text": new_text,
                "replace_all": replace_all,
            }
        )
        return cast(
            Edited,
            await self._http.call(calls.files_edit(path, listed, dry_run, if_match)),
        )

    @api
    async def grep(
        self,
        pattern: str,
        path: str | None = None,
        *,
        fixed_strings: bool = False,
        ignore_case: bool = False,
        include: str | None = None,
        max_results: int | None = None,
        max_depth: int | None = None,
        context: int = 0,
    ) -> GrepResult:
        """
        Lines of files matching ``pattern`` (a regular expression, or the
        text itself with ``fixed_strings``), below ``path`` or in the file
        ``path``; ``include`` is a glob on file names (``*.py``, ``*.{js,ts}``).
        """
        return cast(
            GrepResult,
            await self._http.call(
                calls.files_grep(
                    pattern,
                    path,
                    fixed_strings,
                    ignore_case,
                    include,
                    max_results,
                    max_depth,
                    context,
                )
            ),
        )

    @api
    async def read_lines(
        self, path: str, offset: int = 1, limit: int | None = None
    ) -> Lines:
        """
        Lines ``offset`` .. ``offset + limit - 1`` of a text file (from 1; a
        negative ``offset`` counts from the end, ``-1`` being the last line),
        with where they lie (``total_lines``, ``more``): a log's tail, or the
        lines around a match, of a file of any size.
        """
        answer = await self._http.call(calls.download_lines(path, offset, limit))
        data = base64.b64decode(answer.pop("content_base64"))
        return cast(Lines, {**answer, "text": data.decode("utf-8", "replace")})

    @api
    async def archive(
        self, paths: str | Sequence[str], *, format: str = "tar.gz"
    ) -> bytes:
        """A ``tar.gz`` or ``zip`` of guarded paths, as bytes."""
        if isinstance(paths, str):
            paths = [paths]
        answer = await self._http.call(calls.files_archive(paths, format))
        return base64.b64decode(answer["content_base64"])

    @api
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

    @api
    async def watch(
        self,
        path: str | None = None,
        *,
        recursive: bool = False,
        after: int | None = None,
    ) -> EventStream[F]:
        """
        Changes under a directory as they happen (``event``: created,
        modified, deleted, moved; ``data``: ``path``, ``type``, ``dest``),
        resumed after a cut, a daemon's restart included (``gap`` then
        says what was missed; ``overflow``, that the kernel dropped changes:
        list the directory again).  The watch is live when this returns; it
        ends with an ``end`` event when the directory goes away;
        ``close()`` the stream (or use it in a ``with``) to stop.
        """
        params: dict[str, Any] = {
            "recursive": "true" if recursive else "false",
            "follow": "true",
        }
        if path is not None:
            params["path"] = path
        return await self._open("/files/watch", params, after, final="end")


class Process(Part[F]):
    """
    A background process (``commands.start``): its output log is read
    from ``cursor`` on, so a reader that reconnects carries on where it
    stopped.

    :ivar pid: the process id.
    :ivar cursor: the ``seq`` of the last output event read.
    """

    def __init__(self, face: F, http: Http, info: Mapping[str, Any]) -> None:
        self._face = face
        self._http = http
        self.pid = int(info["pid"])
        self.command = str(info.get("command", ""))
        self.tag: str | None = info.get("tag")
        self.cursor = 0
        self.exit_code: int | None = None

    def __repr__(self) -> str:
        return f"<Process pid={self.pid} command={self.command!r}>"

    @api
    async def info(self) -> ProcessInfo:
        """State, exit code, start time."""
        return cast(ProcessInfo, await self._http.call(calls.process_detail(self.pid)))

    @api
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

    @api_stream
    async def stream(self, after: int | None = None) -> AsyncGenerator[SSEEvent, None]:
        """
        Output events from ``after`` (default: the cursor) as they come
        (``stdout``/``stderr`` with ``data["data"]``, ``gap``, ``error``,
        then ``exit``), resumed across reconnects.
        """
        async with aclosing(self._follow(after, None)) as events:
            async for event in events:
                yield event

    async def _follow(
        self, after: int | None, deadline: float | None
    ) -> AsyncGenerator[SSEEvent, None]:
        """:meth:`stream`, given up at ``deadline`` (``Http.stream``'s)."""
        start = self.cursor if after is None else after
        events = self._http.events(
            "GET",
            f"/process/{self.pid}/output",
            {"follow": "true"},
            after=start,
            deadline=deadline,
            # A stream that ends without it was cut (the daemon stopped):
            # resumed, or ConnectionFailed, never taken for the end.
            final="exit",
        )
        async with aclosing(events):
            async for event in events:
                if event.id is not None:
                    self.cursor = max(self.cursor, event.id)
                if event.event == "exit" and isinstance(event.data, dict):
                    self.exit_code = event.data.get("exit_code")
                yield event

    @api
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
        :raises Timeout: the daemon ended it on its own ``timeout``
            (``IdleTimeout``: its ``idle_timeout``), as ``commands.run``
            raises for a command.
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        # The deadline bounds each read too: a process that prints nothing
        # sends no event to compare the time after.
        events = self._follow(None, deadline)
        error: dict[str, Any] | None = None
        try:
            async for event in events:
                data = event.data if isinstance(event.data, dict) else {}
                if event.event == "stdout":
                    await tell(on_stdout, str(data.get("data", "")))
                elif event.event == "stderr":
                    await tell(on_stderr, str(data.get("data", "")))
                elif event.event == "error":
                    error = data
                elif event.event == "exit":
                    if error is not None:
                        raise error_for(None, error)
                    return self.exit_code
                if deadline is not None and time.monotonic() > deadline:
                    break
        except RequestTimeout:
            if deadline is None or time.monotonic() < deadline:
                raise
        finally:
            await events.aclose()
        if deadline is not None and time.monotonic() > deadline:
            raise RequestTimeout(f"process {self.pid} still runs after {timeout} s")
        info = await Process.info.fn(self)
        if info.get("timed_out"):
            raise Timeout(f"process {self.pid} was ended on its timeout")
        return info["exit_code"]

    @api
    async def send_stdin(self, data: str, *, eof: bool = False) -> int:
        """Write to its stdin (started with ``stdin=True``); bytes written."""
        return int(
            (await self._http.call(calls.process_stdin(self.pid, data, eof)))["bytes"]
        )

    @api
    async def close_stdin(self) -> None:
        """Close its stdin (end of input)."""
        await self._http.call(calls.process_stdin(self.pid, "", True))

    @api
    async def signal(self, signal: int | str) -> None:
        """Signal its process group (``15``, ``"SIGINT"`` ...; ``allowed_signals``)."""
        await self._http.call(calls.process_signal(self.pid, signal))

    @api
    async def kill(self) -> None:
        """End its whole tree (signal 9)."""
        await Process.signal.fn(self, 9)


class Commands(_Namespace[F]):
    """``sandbox.commands``: processes and template commands."""

    @api
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
        the result's ``stdout`` and ``stderr`` are then those lines, each
        ended by ``\\n`` (a last line printed without one gains it, a
        CRLF becomes LF, and a line longer than the stream's 64 KiB line
        bound arrives in pieces, each a line); otherwise over ``/shell``,
        and they are the text as printed.  A string is split like a shell
        would (no shell runs unless ``shell="bash"``); a list is taken as
        argv.

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
                timeouts=await self._http.run_timeouts("shell", timeout),
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
                    await tell(on_stdout, line)
                elif event.event == "stderr":
                    line = str(data.get("data", ""))
                    err.append(line)
                    await tell(on_stderr, line)
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

    @api
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
                    await tell(
                        on_stdout if chunk[0] == "stdout" else on_stderr, chunk[1]
                    )
        return run.result()

    @api
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
    ) -> Process[F]:
        """Start a background process; a handle with ``wait``, ``stdin``, ``signal``, ``kill``, ``stream``."""
        launch = calls.shell(command, cwd, env, user, shell, timeout, idle_timeout)
        info = await self._http.call(calls.process_start(launch, stdin, tag))
        return Process(self._face, self._http, info)

    @api
    async def connect(self, pid: int) -> Process[F]:
        """A handle on a process already managed by the daemon."""
        return Process(self._face, self._http, await Commands.get.fn(self, pid))

    @api
    async def get(self, pid: int) -> ProcessInfo:
        """One managed process."""
        return cast(ProcessInfo, await self._http.call(calls.process_detail(pid)))

    @api
    async def list(self, tag: str | None = None) -> builtins.list[ProcessInfo]:
        """Running and recently exited processes."""
        return cast(
            builtins.list[ProcessInfo],
            (await self._http.call(calls.process_list(tag)))["processes"],
        )

    @api
    async def custom(self) -> builtins.list[dict[str, Any]]:
        """The template's registered commands (``GET /commands``)."""
        return cast(
            builtins.list[dict[str, Any]],
            (await self._http.call(calls.list_commands()))["commands"],
        )

    @api
    async def call(
        self,
        name: str,
        /,
        args: Mapping[str, Any] | None = None,
        *,
        timeout: float | None = None,
        **kwargs: Any,
    ) -> Any:
        """
        Run a registered command with its arguments (``args``, keyword
        arguments, or both); its ``result``.  The call waits ``timeout``
        seconds for the answer, by default the daemon's limit for commands
        (``run_command``'s ``timeout_seconds``, from ``capabilities``) plus
        a margin, so the daemon's own timeout answer comes first.  Pass a
        command's arguments called ``args`` or ``timeout`` in ``args``.
        """
        req = calls.run_command(name, {**(args or {}), **kwargs})
        if timeout is not None:
            req.timeouts = self._http.wait_timeouts(timeout)
        else:
            req.timeouts = await self._http.run_timeouts("run_command", None)
        return (await self._http.call(req))["result"]


class Terminal(Part[F]):
    """
    One attachment to a terminal session over the PTY WebSocket (made by
    ``pty.open``/``pty.attach``; ``with`` it, or ``async with`` on the
    asyncio client, to detach at the end).

    :ivar offset: bytes of output received so far (the resume point of
        :meth:`reconnect`).
    :ivar exit_code: the shell's exit code once it ended.
    """

    def __init__(
        self,
        pty: Pty[F],
        session_id: str,
        base: str,
        offset: int | None,
        owned: bool = False,
    ) -> None:
        self._face = pty._face
        self._settings = pty._http.settings
        self._pty = pty
        #: Made by :meth:`Pty.open`: leaving the ``with`` block ends the session.
        self.owned = owned
        self.session_id = session_id
        self._base = base
        self.offset: int | None = offset
        self.exit_code: int | None = None
        self.ended = False
        self.pid: int | None = None
        self._ws: Any = None
        #: Output :meth:`expect` read past its match, or before it gave
        #: up: the next ``expect`` (or ``recv``) starts with it.
        self._pending = ""

    async def _open(self, offset: int | None) -> None:
        url = pty_ws_url(self._base, self.session_id, offset)
        try:
            ws = await ws_open(url, ws_headers(self._settings), self._settings.timeout)
        except InvalidStatus as e:
            raise handshake_error(
                e.response.status_code, bytes(e.response.body or b"")
            ) from None
        except (OSError, WebSocketException, TimeoutError) as e:
            error = transport_error(e, f"connect {url}")
            error.body["ws_url"] = url  # the PTY port, not the HTTP one
            raise error from None
        try:
            first = await ws_recv(ws, self._settings.timeout)
        except ConnectionClosed as e:
            await ws_close(ws)
            raise NotFound(
                e.rcvd.reason if e.rcvd else "the terminal closed", code="not_found"
            ) from None
        except TimeoutError:
            await ws_close(ws)
            raise RequestTimeout("the terminal did not start in time") from None
        event = pty_event(first)
        if event is not None and event.kind == "started":
            self.pid = event.raw.get("pid")
        self._ws = ws

    async def _send(self, message: dict[str, Any]) -> None:
        if self._ws is None:
            raise ConnectionFailed("the terminal is not attached")
        try:
            await ws_send(self._ws, json.dumps(message))
        except ConnectionClosed as e:
            # The shell ended (the daemon closes with "Session ended"), or
            # the connection went: a SandboxError, as recv reports it.
            reason = (e.rcvd.reason if e.rcvd else "") or "closed"
            raise ConnectionFailed(
                f"the terminal's connection is closed ({reason})",
                body={"session_id": self.session_id},
            ) from None

    async def _leave(self) -> None:
        """The end of a ``with`` block: detach; end the session if owned."""
        await Terminal.close.fn(self)
        if self.owned:
            await Terminal.end.fn(self)

    def __enter__(self: Terminal[BlockingFace]) -> Terminal[BlockingFace]:
        on_face(self._face, BlockingFace)
        return self

    def __exit__(self: Terminal[BlockingFace], *exc: object) -> None:
        self._face.run(self._leave())

    async def __aenter__(self: Terminal[AsyncFace]) -> Terminal[AsyncFace]:
        on_face(self._face, AsyncFace)
        return self

    async def __aexit__(self: Terminal[AsyncFace], *exc: object) -> None:
        await self._face.run(self._leave())

    @api
    async def end(self) -> None:
        """End the session and its shell (gone already is fine)."""
        try:
            await Pty.close.fn(self._pty, self.session_id)
        except NotFound:
            pass

    @api
    async def send(self, data: str) -> None:
        """Type ``data`` (``"ls\\n"``, ``"\\x03"`` for Ctrl-C)."""
        await self._send({"type": "input", "data": data})

    @api
    async def resize(self, cols: int, rows: int) -> None:
        """Change the window size (the shell gets SIGWINCH)."""
        await self._send({"type": "resize", "cols": cols, "rows": rows})

    @api
    async def signal(self, name: str) -> None:
        """Send SIGINT, SIGTERM, SIGKILL, SIGHUP or SIGQUIT to the foreground group."""
        await self._send({"type": "signal", "signal": name})

    @api
    async def recv(self, timeout: float | None = None) -> PtyEvent | None:
        """
        The next output (or ``exited``) event; None when the connection
        closed.

        :raises RequestTimeout: nothing within ``timeout`` seconds.
        """
        if self._pending:
            pending, self._pending = self._pending, ""
            return PtyEvent("output", data=pending)
        if self._ws is None:
            raise ConnectionFailed("the terminal is not attached")
        while True:
            try:
                message = await ws_recv(self._ws, timeout)
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

    async def _events(self) -> AsyncGenerator[PtyEvent, None]:
        while (event := await Terminal.recv.fn(self)) is not None:
            yield event

    def __iter__(self: Terminal[BlockingFace]) -> Generator[PtyEvent, None, None]:
        on_face(self._face, BlockingFace)
        return self._face.iterate(self._events())

    def __aiter__(self: Terminal[AsyncFace]) -> AsyncGenerator[PtyEvent, None]:
        on_face(self._face, AsyncFace)
        return self._face.iterate(self._events())

    @api
    async def expect(self, text: str, timeout: float = 10.0) -> str:
        """
        Read output until it contains ``text``; what was read up to the
        end of ``text``.  What followed it, and all that was read when it
        is not seen, is kept for the next ``expect`` (as pexpect does).

        :raises RequestTimeout: not seen within ``timeout`` seconds (the
            message shows the end of what was read).
        """
        deadline = time.monotonic() + timeout
        seen, self._pending = self._pending, ""
        while text not in seen:
            left = deadline - time.monotonic()
            if left <= 0:
                self._pending = seen
                raise RequestTimeout(
                    f"{text!r} not seen within {timeout} s; got {seen[-200:]!r}"
                )
            try:
                event = await Terminal.recv.fn(self, timeout=left)
            except RequestTimeout:
                continue  # said above, with what was read
            if event is None:
                self._pending = seen
                raise ConnectionFailed(
                    f"the terminal closed before {text!r}; got {seen[-200:]!r}"
                )
            seen += event.data
        end = seen.index(text) + len(text)
        self._pending = seen[end:]
        return seen[:end]

    @api
    async def reconnect(self) -> None:
        """Attach again, replaying only the output after :attr:`offset`."""
        await Terminal.close.fn(self)
        await self._open(self.offset)

    @api
    async def close(self) -> None:
        """Detach (the session lives on)."""
        if self._ws is not None:
            await ws_close(self._ws)


class Pty(_Namespace[F]):
    """``sandbox.pty``: terminal sessions."""

    @api
    async def create(
        self,
        /,
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
        self._client._ws_base = created["ws_url"]
        return created

    @api
    async def open(self, /, *, keep: bool = False, **options: Any) -> Terminal[F]:
        """
        :meth:`create`, then :meth:`attach` to it.  Used as a context
        manager, the session ends with the block (a loop of ``with
        sb.pty.open()`` does not pile up sessions to the daemon's cap);
        ``keep=True`` only detaches, for a later :meth:`attach`.  A session
        whose terminal cannot be attached (the PTY port unreachable or
        refusing) is ended before the error is raised.

        The WebSocket is ``pty_url`` when it is set (as for :meth:`attach`),
        else the ``ws_url`` the daemon answered: that names the daemon's own
        PTY port, which a port-forward or proxy with other local ports does
        not reach.
        """
        created = await Pty.create.fn(self, **options)
        base = self._client.settings.pty_url or created["ws_url"]
        terminal = Terminal(self, created["session_id"], base, None, owned=not keep)
        try:
            await terminal._open(None)
        except BaseException:
            # Nobody else knows the session: left, its shell would run on
            # and count against the identity's session cap until the idle
            # timeout (a wrong pty_url, tried a few times, locks it out).
            with contextlib.suppress(SandboxError):
                await Terminal.end.fn(terminal)
            raise
        return terminal

    @api
    async def attach(
        self, session_id: str, *, offset: int | None = None
    ) -> Terminal[F]:
        """
        Attach to a session: ``started``, then its scrollback (or only what
        followed ``offset``), then live output.

        The WebSocket is ``pty_url`` when it is set, else the session's own
        ``ws_url`` (from :meth:`get`), so a session another client created
        is reached where the daemon says, through a proxy or port mapping
        too.  An unknown session raises :class:`NotFound`.
        """
        base = self._client.settings.pty_url
        if not base:
            found: dict[str, Any] = dict(await Pty.get.fn(self, session_id))
            base = str(found.get("ws_url") or self._client.pty_base())
        terminal = Terminal(self, session_id, base, offset)
        await terminal._open(offset)
        return terminal

    @api
    async def list(self) -> builtins.list[PtySessionInfo]:
        """Sessions of this identity."""
        sessions = (await self._http.call(calls.pty_list_sessions()))["sessions"]
        return cast(builtins.list[PtySessionInfo], [session_info(s) for s in sessions])

    @api
    async def get(self, session_id: str) -> PtySessionInfo:
        """One session."""
        return cast(
            PtySessionInfo,
            session_info(await self._http.call(calls.pty_detail(session_id))),
        )

    @api
    async def resize(self, session_id: str, cols: int, rows: int) -> PtySessionInfo:
        """Resize over REST (attached clients can also :meth:`Terminal.resize`)."""
        return cast(
            PtySessionInfo,
            await self._http.call(calls.pty_resize(session_id, cols, rows)),
        )

    @api
    async def close(self, session_id: str) -> None:
        """End the session and its shell."""
        await self._http.call(calls.pty_delete_session(session_id))


class System(_Namespace[F]):
    """``sandbox.system``: facts about the sandbox."""

    @api
    async def info(self) -> dict[str, Any]:
        """OS, CPU, memory, disk."""
        return await self._http.object(calls.system_info())

    @api
    async def metrics(self) -> dict[str, Any]:
        """Load, memory and disk usage."""
        return await self._http.object(calls.system_metrics())

    @api
    async def ports(self) -> builtins.list[dict[str, Any]]:
        """Listening TCP sockets."""
        return cast(
            builtins.list[dict[str, Any]],
            (await self._http.call(calls.ports()))["listening"],
        )

    @api
    async def wait_for_port(self, port: int, timeout: float = 60.0) -> bool:
        """
        Whether something listens on ``port`` within ``timeout`` seconds
        (the daemon waits, at most 120 s): an app's server, started in the
        background, ready for requests.
        """
        answer = await self._http.object(calls.port_wait(port, timeout))
        return bool(answer["ready"])

    @api
    async def packages(self, manager: str = "pip") -> builtins.list[dict[str, str]]:
        """Installed ``pip`` or ``npm`` packages."""
        return cast(
            builtins.list[dict[str, str]],
            (await self._http.call(calls.packages(manager)))["packages"],
        )


class Env(_Namespace[F]):
    """``sandbox.env``: the environment later children inherit."""

    @api
    async def get(self, *names: str) -> dict[str, str]:
        """Variables (all, or ``names``); secrets are never returned."""
        return cast(
            dict[str, str], (await self._http.call(calls.env_get(names)))["variables"]
        )

    @api
    async def set(
        self, variables: Mapping[str, str | None] | None = None, /, **more: str | None
    ) -> builtins.list[str]:
        """Set variables (None unsets one); the names updated."""
        merged = {**(variables or {}), **more}
        return cast(
            builtins.list[str],
            (await self._http.call(calls.env_set(merged)))["updated"],
        )


class Git(_Namespace[F]):
    """``sandbox.git``: ``status`` and ``diff`` (opt-in ``dev_tools``); the rest needs the opt-in ``git`` group."""

    @api
    async def status(self, path: str = ".") -> GitStatus:
        """Branch, ahead/behind, changed files."""
        return cast(GitStatus, await self._http.call(calls.git_status(path)))

    @api
    async def diff(
        self, path: str = ".", *, staged: bool = False, file: str | None = None
    ) -> GitDiff:
        """The diff and its stats (truncated at 1 MB)."""
        return cast(GitDiff, await self._http.call(calls.git_diff(path, staged, file)))

    # -- the git group (opt-in ``git``, SPEC §24) ---------------------------------

    @api
    async def init(
        self, path: str, *, initial_branch: str = "main", bare: bool = False
    ) -> dict[str, Any]:
        """Create a repository at ``path``."""
        return await self._http.object(
            calls.git(
                "POST", "/init", path=path, initial_branch=initial_branch, bare=bare
            )
        )

    @api
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

    @api
    async def commit(
        self,
        path: str,
        message: str,
        *,
        author: Mapping[str, str] | None = None,
        allow_empty: bool = False,
        files: Sequence[str] | None = None,
        amend: bool = False,
        signoff: bool = False,
    ) -> dict[str, Any]:
        """
        Commit the index (only ``files``, as they are, when given; replace
        the last commit with ``amend``): ``{commit, branch, summary}``.
        """
        return await self._http.object(
            calls.git(
                "POST",
                "/commit",
                path=path,
                message=message,
                author=dict(author) if author is not None else None,
                allow_empty=allow_empty or None,
                files=list(files) if files is not None else None,
                amend=amend or None,
                signoff=signoff or None,
            )
        )

    @api
    async def log(
        self,
        path: str = ".",
        *,
        ref: str = "HEAD",
        max: int = 50,
        file: str | None = None,
    ) -> list[dict[str, Any]]:
        """The commits reachable from ``ref`` (touching ``file``), newest first."""
        query = {"path": path, "ref": ref, "max": max, "file": file}
        reply = await self._http.call(calls.git("GET", "/log", query))
        return cast(list[dict[str, Any]], reply["commits"])

    @api
    async def show(self, path: str = ".", rev: str = "HEAD") -> dict[str, Any]:
        """
        One commit and its diff (``diff``, cut at 1 MB with ``truncated``;
        changes of files the policy denies left out and named in ``withheld``).
        """
        return await self._http.object(
            calls.git("GET", "/show", {"path": path, "rev": rev})
        )

    @api
    async def branches(self, path: str = ".") -> dict[str, Any]:
        """``{current, detached, branches}``."""
        return await self._http.object(calls.git("GET", "/branches", {"path": path}))

    @api
    async def create_branch(
        self,
        path: str,
        name: str,
        *,
        start_point: str | None = None,
        checkout: bool = False,
    ) -> dict[str, Any]:
        """A new branch (switched to with ``checkout``)."""
        return await self._http.object(
            calls.git(
                "POST",
                "/branches",
                path=path,
                name=name,
                start_point=start_point,
                checkout=checkout or None,
            )
        )

    @api
    async def delete_branch(
        self, path: str, name: str, *, force: bool = False
    ) -> dict[str, Any]:
        """Delete a branch (one not merged only with ``force``): ``{name, deleted}``."""
        query = {"path": path, "name": name, "force": force or None}
        return await self._http.object(calls.git("DELETE", "/branches", query))

    @api
    async def reset(
        self,
        path: str = ".",
        *,
        mode: str = "mixed",
        target: str = "HEAD",
        files: Sequence[str] | None = None,
    ) -> dict[str, Any]:
        """
        Reset to ``target`` (``soft``, ``mixed``, ``hard``, ``merge`` or
        ``keep``; ``merge`` abandons a merge left to resolve), or unstage
        ``files``: ``{mode, branch, commit}``.
        """
        return await self._http.object(
            calls.git(
                "POST",
                "/reset",
                path=path,
                mode=mode,
                target=target,
                files=list(files) if files is not None else None,
            )
        )

    @api
    async def restore(
        self,
        path: str,
        files: Sequence[str],
        *,
        staged: bool = False,
        worktree: bool | None = None,
        source: str | None = None,
    ) -> dict[str, Any]:
        """
        Put ``files`` back as the index (or ``source``) has them; with
        ``staged``, unstage them (their files too with ``worktree``).
        """
        return await self._http.object(
            calls.git(
                "POST",
                "/restore",
                path=path,
                files=list(files),
                staged=staged or None,
                worktree=worktree,
                source=source,
            )
        )

    @api
    async def stash(
        self,
        path: str = ".",
        action: str = "push",
        *,
        message: str | None = None,
        index: int | None = None,
    ) -> dict[str, Any]:
        """``push`` (untracked files too), ``pop``, ``drop`` or ``list``: ``{action, stashes}``."""
        return await self._http.object(
            calls.git(
                "POST",
                "/stash",
                path=path,
                action=action,
                message=message,
                index=index,
            )
        )

    @api
    async def remotes(self, path: str = ".") -> list[dict[str, Any]]:
        """The remotes: ``[{name, fetch_url, push_url}]``."""
        reply = await self._http.call(calls.git("GET", "/remotes", {"path": path}))
        return cast(list[dict[str, Any]], reply["remotes"])

    @api
    async def add_remote(self, path: str, name: str, url: str) -> dict[str, Any]:
        """Add a remote (its URL must pass the policy): ``{name, fetch_url}``."""
        return await self._http.object(
            calls.git("POST", "/remotes", path=path, name=name, url=url)
        )

    @api
    async def config(
        self, path: str = ".", key: str | None = None
    ) -> dict[str, str | None]:
        """The repository's value of ``key`` (or of every key the policy allows)."""
        reply = await self._http.call(
            calls.git("GET", "/config", {"path": path, "key": key})
        )
        return cast("dict[str, str | None]", reply["values"])

    @api
    async def set_config(self, path: str, key: str, value: str) -> dict[str, Any]:
        """Set a key the policy allows (``params.git_config_keys``) in the repository."""
        return await self._http.object(
            calls.git("POST", "/config", path=path, key=key, value=value)
        )

    @api
    async def checkout(
        self, path: str, ref: str, *, create: bool = False, force: bool = False
    ) -> dict[str, Any]:
        """Switch to ``ref``: ``{branch, commit, detached}``."""
        return await self._http.object(
            calls.git(
                "POST",
                "/checkout",
                path=path,
                ref=ref,
                create=create or None,
                force=force or None,
            )
        )

    @api
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
        commit: str | None = None,
        single_branch: bool = False,
        filter: str | None = None,
        timeout: float | None = None,
    ) -> dict[str, Any]:
        """
        Clone ``url`` into ``path``. ``auth`` is ``{"credential": NAME}`` (a
        secret the policy holds) or ``{"username", "password"}``. Waits up to
        ``wait`` seconds: the result (``state: done``), or the running job
        (``state: running``, follow it with :meth:`job`). ``commit`` is
        checked out (detached) after; ``filter`` is ``blob:none`` or
        ``tree:0``; ``timeout`` cuts git's run (seconds).
        """
        return await self._remote(
            "/clone",
            wait,
            auth,
            url=url,
            path=path,
            branch=branch,
            depth=depth,
            user=user,
            commit=commit,
            single_branch=single_branch or None,
            filter=filter,
            timeout=timeout,
        )

    @api
    async def fetch(
        self,
        path: str = ".",
        *,
        remote: str = "origin",
        auth: Mapping[str, str] | None = None,
        wait: float = 600.0,
        refspec: str | None = None,
        prune: bool = False,
        timeout: float | None = None,
    ) -> dict[str, Any]:
        """Fetch from ``remote`` (a job; see :meth:`clone` for ``auth`` and ``wait``)."""
        return await self._remote(
            "/fetch",
            wait,
            auth,
            path=path,
            remote=remote,
            refspec=refspec,
            prune=prune or None,
            timeout=timeout,
        )

    @api
    async def pull(
        self,
        path: str = ".",
        *,
        remote: str = "origin",
        branch: str | None = None,
        auth: Mapping[str, str] | None = None,
        wait: float = 600.0,
        ff_only: bool = True,
        rebase: bool = False,
        timeout: float | None = None,
    ) -> dict[str, Any]:
        """
        Pull from ``remote``: fast-forward only unless ``ff_only=False``
        (a merge, whose conflict is left to resolve: ``GitConflict``
        kind ``merge_conflict``) or ``rebase`` (aborted on a conflict).
        """
        return await self._remote(
            "/pull",
            wait,
            auth,
            path=path,
            remote=remote,
            branch=branch,
            ff_only=None if ff_only else False,
            rebase=rebase or None,
            timeout=timeout,
        )

    @api
    async def push(
        self,
        path: str = ".",
        *,
        remote: str = "origin",
        branch: str | None = None,
        set_upstream: bool = False,
        auth: Mapping[str, str] | None = None,
        wait: float = 600.0,
        force: bool = False,
        tags: bool = False,
        timeout: float | None = None,
    ) -> dict[str, Any]:
        """
        Push a branch: ``{updated: [...], remote_verified}``. ``force``
        pushes with a lease (when the policy allows it); ``tags`` pushes
        the annotated tags on it too.
        """
        return await self._remote(
            "/push",
            wait,
            auth,
            path=path,
            remote=remote,
            branch=branch,
            set_upstream=set_upstream or None,
            force=force or None,
            tags=tags or None,
            timeout=timeout,
        )

    async def _remote(
        self, route: str, wait: float, auth: Mapping[str, str] | None, **fields: Any
    ) -> dict[str, Any]:
        """A call that reaches a remote: a job, waited for up to ``wait`` seconds."""
        credentials = dict(auth) if auth is not None else None
        req = calls.git("POST", route, wait=wait, auth=credentials, **fields)
        return await self._http.object(req)

    @api
    async def jobs(self) -> list[dict[str, Any]]:
        """The caller's running and recently finished remote jobs."""
        reply = await self._http.call(calls.git("GET", "/jobs"))
        return cast(list[dict[str, Any]], reply["jobs"])

    @api
    async def job(self, job_id: str) -> dict[str, Any]:
        """One remote job: ``state``, ``progress``, ``result`` or ``error``."""
        return await self._http.object(calls.git("GET", f"/jobs/{seg(job_id)}"))

    @api
    async def cancel(self, job_id: str) -> dict[str, Any]:
        """Cancel a job; answers once git's whole tree is gone."""
        return await self._http.object(calls.git("DELETE", f"/jobs/{seg(job_id)}"))


class Code(_Namespace[F]):
    """
    ``sandbox.code``: snippets of python, node or bash (``run``, opt-in
    ``dev_tools``), and code contexts: stateful kernels (opt-in ``code``).
    """

    @api
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
        """
        Run a snippet: ``stdout``, ``stderr``, ``exit_code``,
        ``execution_time_ms``.  The call waits for the snippet's ``timeout``
        (else the daemon's limit for it, from ``capabilities``) plus a
        margin, so a run past its limit raises the daemon's ``Timeout``.
        """
        req = calls.code_run(code, language, timeout, cwd, env, user)
        req.timeouts = await self._http.run_timeouts("code_run", timeout)
        return cast(CodeResult, await self._http.call(req))

    # -- code contexts (stateful kernels, the opt-in ``code`` group) ----------

    @api
    async def kernels(self) -> builtins.list[dict[str, Any]]:
        """Kernels a context may run (``name``, ``language``, ``allowed`` ...)."""
        return cast(
            builtins.list[dict[str, Any]],
            (await self._http.call(Req("GET", "/code/kernels")))["kernels"],
        )

    @api
    async def create_context(self, /, **fields: Any) -> dict[str, Any]:
        """A new context (``kernel``, ``language``, ``cwd``, ``env``, ``user``, ``name``)."""
        return await self._http.object(calls.code_contexts("POST", **fields))

    @api
    async def contexts(self) -> builtins.list[dict[str, Any]]:
        """Your contexts."""
        return cast(
            builtins.list[dict[str, Any]],
            (await self._http.call(calls.code_contexts("GET")))["contexts"],
        )

    @api
    async def context(self, context_id: str) -> dict[str, Any]:
        """One context, with what runs and what waits."""
        return await self._http.object(
            calls.code_contexts("GET", calls.code_context_path(context_id))
        )

    @api
    async def delete_context(self, context_id: str) -> dict[str, Any]:
        """Close a context (its kernel's process tree is killed)."""
        return await self._http.object(
            calls.code_contexts("DELETE", calls.code_context_path(context_id))
        )

    @api
    async def restart(self, context_id: str) -> dict[str, Any]:
        """A fresh kernel: the context's state is lost."""
        return await self._http.object(
            calls.code_contexts("POST", calls.code_context_path(context_id, "/restart"))
        )

    @api
    async def interrupt(self, context_id: str) -> dict[str, Any]:
        """Interrupt what the context runs."""
        return await self._http.object(
            calls.code_contexts(
                "POST", calls.code_context_path(context_id, "/interrupt")
            )
        )

    @api
    async def execute(
        self,
        /,
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

        Without ``wait``, the execution's events are read as they come and
        the document assembled from them (the same document, its output
        decoded while the kernel still prints); when only the daemon's
        document can say it all (output cut to head and tail, a timeout),
        that document is fetched once the execution has ended.
        """
        limit = wait if wait is not None else (timeout or 300.0) + 10.0
        if wait is None and "stream" not in fields:
            return await self._execute_streamed(context_id, code, timeout, fields)
        req = calls.code_contexts(
            "POST",
            calls.code_context_path(context_id, "/execute"),
            read_timeout=limit + 30.0,
            code=code,
            timeout=timeout,
            wait=wait,
            **fields,
        )
        return await self._http.result(req)

    async def _execute_streamed(
        self,
        context_id: str,
        code: str,
        timeout: float | None,
        fields: Mapping[str, Any],
    ) -> dict[str, Any]:
        """
        :meth:`execute` from the execution's event stream; the result
        document from the daemon where the events cannot give it, or the
        stream was cut once the execution was under way.
        """
        req = calls.code_contexts(
            "POST",
            calls.code_context_path(context_id, "/execute"),
            code=code,
            timeout=timeout,
            stream=True,
            **fields,
        )
        seen = ExecutionEvents(context_id)
        splitter = EventSplitter()
        chunks = self._http.chunks(req.method, req.path, req.json)
        try:
            async with aclosing(chunks):
                async for chunk in chunks:
                    for name, data in splitter.feed(chunk):
                        seen.feed(name, data)
        except (ConnectionFailed, RequestTimeout):
            # Under way: it runs on (a stream cut does not interrupt it).
            if seen.execution_id is None:
                raise
        result = seen.result()
        if result is not None:
            return result
        if seen.execution_id is None:
            raise ConnectionFailed("the execution's stream ended before it began")
        limit = (timeout or 300.0) + 10.0
        return await self._http.result(
            calls.code_contexts(
                "GET",
                calls.code_context_path(
                    context_id, f"/executions/{seg(seen.execution_id)}"
                ),
                {"wait": limit},
                read_timeout=limit + 30.0,
            )
        )

    @api
    async def execution(
        self, context_id: str, execution_id: str, *, wait: float | None = None
    ) -> dict[str, Any]:
        """One execution's result (``wait`` long-polls while it runs)."""
        return await self._http.result(
            calls.code_contexts(
                "GET",
                calls.code_context_path(context_id, f"/executions/{seg(execution_id)}"),
                {"wait": wait},
                read_timeout=(wait or 0) + 60.0,
            )
        )

    @api
    async def events(
        self, context_id: str, execution_id: str, *, after: int | None = None
    ) -> EventStream[F]:
        """An execution's events, live and resumed across reconnects."""
        path = calls.code_context_path(
            context_id, f"/executions/{seg(execution_id)}/events"
        )
        return await self._open("/code/contexts" + path, {"follow": "true"}, after)

    @api
    async def send_input(
        self, context_id: str, execution_id: str, value: str
    ) -> dict[str, Any]:
        """Answer an execution's ``input()``."""
        return await self._http.object(
            calls.code_contexts(
                "POST",
                calls.code_context_path(
                    context_id, f"/executions/{seg(execution_id)}/input"
                ),
                value=value,
            )
        )


class Browser(_Namespace[F]):
    """``sandbox.browser``: the shared headless page (opt-in)."""

    @api
    async def navigate(
        self, url: str, *, wait_until: str | None = None, timeout: int | None = None
    ) -> dict[str, Any]:
        """Open ``url``: ``url``, ``title``, ``status``."""
        return await self._http.object(
            calls.browser(
                "POST", "navigate", url=url, wait_until=wait_until, timeout=timeout
            )
        )

    @api
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

    @api
    async def content(
        self,
        type: str = "html",
        *,
        offset: int | None = None,
        max_bytes: int | None = None,
    ) -> dict[str, Any]:
        """
        The page's ``content`` (html or text), ``url``, ``title``: at most
        ``max_bytes`` (the policy's limit) from byte ``offset``; with
        ``truncated``, read on from ``next_offset``.
        """
        return await self._http.object(
            calls.browser(
                "GET", "content", type=type, offset=offset, max_bytes=max_bytes
            )
        )

    @api
    async def click(
        self, selector: str, *, timeout: int | None = None
    ) -> dict[str, Any]:
        """Click an element."""
        return await self._http.object(
            calls.browser("POST", "click", selector=selector, timeout=timeout)
        )

    @api
    async def type(
        self,
        selector: str,
        text: str,
        *,
        delay: float | None = None,
        timeout: int | None = None,
    ) -> dict[str, Any]:
        """Type into an element."""
        return await self._http.object(
            calls.browser(
                "POST",
                "type",
                selector=selector,
                text=text,
                delay=delay,
                timeout=timeout,
            )
        )

    @api
    async def evaluate(self, script: str, *, timeout: int | None = None) -> Any:
        """Evaluate JavaScript in the page; its ``result``."""
        return (
            await self._http.call(
                calls.browser("POST", "evaluate", script=script, timeout=timeout)
            )
        )["result"]

    @api
    async def pdf(
        self, *, format: str | None = None, landscape: bool | None = None
    ) -> bytes:
        """The page printed to PDF."""
        answer = await self._http.call(
            calls.browser("POST", "pdf", format=format, landscape=landscape)
        )
        return base64.b64decode(answer["pdf_base64"])

    @api
    async def console(self) -> builtins.list[dict[str, Any]]:
        """Console messages since the last read."""
        return cast(
            builtins.list[dict[str, Any]],
            (await self._http.call(calls.browser("GET", "console")))["logs"],
        )


class Agents(_Namespace[F]):
    """
    ``sandbox.agents``: coding-agent sessions (opt-in).  Field
    names are the routes' own; extra keyword arguments go into the body.
    """

    @api
    async def catalog(self) -> builtins.list[dict[str, Any]]:
        """Agents this sandbox knows."""
        return cast(
            builtins.list[dict[str, Any]],
            (await self._http.call(calls.agents("GET", "/catalog")))["agents"],
        )

    @api
    async def describe(self, agent: str, *, probe: bool = False) -> dict[str, Any]:
        """One catalogue entry (``probe=True`` starts it once to ask)."""
        return await self._http.object(
            calls.agents("GET", f"/catalog/{seg(agent)}", {"probe": probe})
        )

    @api
    async def install(
        self, agent: str, *, version: str | None = None
    ) -> dict[str, Any]:
        """Install an agent (a managed process: follow it with ``commands.connect(pid)``)."""
        return await self._http.object(
            calls.agents("POST", f"/catalog/{seg(agent)}/install", version=version)
        )

    @api
    async def create(self, /, agent: str, **fields: Any) -> dict[str, Any]:
        """Start a session (``cwd``, ``mode``, ``model``, ``prompt`` ...): ``session_id`` ..."""
        return await self._http.object(
            calls.agents("POST", "/sessions", agent=agent, **fields)
        )

    @api
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

    @api
    async def get(self, session_id: str) -> dict[str, Any]:
        """One session."""
        return await self._http.object(
            calls.agents("GET", calls.session_path(session_id))
        )

    @api
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
        return await self._http.object(req)

    @api
    async def cancel(
        self, session_id: str, *, wait: float | None = None
    ) -> dict[str, Any]:
        """Cancel the running turn."""
        return await self._http.object(
            calls.agents("POST", calls.session_path(session_id, "/cancel"), wait=wait)
        )

    @api
    async def configure(self, /, session_id: str, **fields: Any) -> dict[str, Any]:
        """Change ``mode``, ``model``, ``config`` or ``title``."""
        return await self._http.object(
            calls.agents("POST", calls.session_path(session_id, "/config"), **fields)
        )

    @api
    async def close(self, session_id: str, *, forget: bool = False) -> dict[str, Any]:
        """Close a session (its agent is ended)."""
        return await self._http.object(
            calls.agents("DELETE", calls.session_path(session_id), {"forget": forget})
        )

    @api
    async def events(
        self,
        session_id: str,
        *,
        after: int | None = None,
        types: Sequence[str] | None = None,
        include_raw: bool = False,
    ) -> EventStream[F]:
        """The session's event log, followed live and resumed across reconnects."""
        params: dict[str, Any] = {
            "follow": "true",
            "include_raw": "true" if include_raw else "false",
        }
        if types:
            params["types"] = ",".join(types)
        return await self._open(
            "/agents" + calls.session_path(session_id, "/events"), params, after
        )

    @api
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

    @api
    async def reply(self, /, request_id: str, **answer: Any) -> dict[str, Any]:
        """Answer one (``option_id=``, ``decision=``, ``cancel=True``, or ``action=``)."""
        return await self._http.object(
            calls.agents("POST", f"/requests/{seg(request_id)}", **answer)
        )

    @api
    async def read(
        self, /, session_id: str, what: str, **params: Any
    ) -> dict[str, Any]:
        """
        Any other read of a session: ``turns``, ``messages``, ``plan``,
        ``tool-calls``, ``files``, ``terminals``, ``commands``, ``logs``.
        """
        return await self._http.object(
            calls.agents(
                "GET", calls.session_path(session_id, "/" + what.strip("/")), params
            )
        )


class Links(_Namespace[F]):
    """
    ``sandbox.links``: short-lived capability links.  A link's token
    (``sbxl_...``) stands for its minter, narrowed to one audience and at
    most the minter's scopes, until it expires, is used up or revoked.
    """

    @api
    async def mint(
        self,
        audience: str,
        *,
        scopes: Sequence[str] | None = None,
        ttl_seconds: float | None = None,
        uses: int | None = None,
    ) -> dict[str, Any]:
        """
        A new link for ``audience`` (``"console"``, or ``"preview:PORT"``
        for one preview): ``link_id``, ``token`` (shown only now),
        ``scopes``, ``expires_at``, ``uses``, and a preview link's ``url``.

        :param ttl_seconds: its life (the daemon's default 900 s, cut to
            its ``max_link_ttl_seconds``).
        :param uses: how many times it may be presented (default: any).
        """
        return await self._http.object(
            calls.links_mint(audience, scopes, ttl_seconds, uses)
        )

    @api
    async def list(self) -> builtins.list[dict[str, Any]]:
        """This caller's live links: ``link_id``, ``audience``, ``uses``, ``used`` ..."""
        answer = await self._http.object(calls.links_list())
        return cast(builtins.list[dict[str, Any]], answer["links"])

    @api
    async def revoke(self, link_id: str) -> dict[str, Any]:
        """Revoke a link now (``revoked: true``); an unknown id raises :class:`NotFound`."""
        return await self._http.object(calls.links_revoke(link_id))


class Preview(_Namespace[F]):
    """
    ``sandbox.preview``: the sandbox's web apps in a browser, through the
    daemon's preview door (opt-in ``preview`` group; the door listens with
    ``--preview-port``).
    """

    @api
    async def expose(
        self,
        port: int,
        *,
        label: str | None = None,
        public: bool | None = None,
        ttl_seconds: float | None = None,
        host_header: str | None = None,
    ) -> dict[str, Any]:
        """
        Expose ``port`` on the preview door (again: replace its exposure):
        ``url``, ``listening``, ``public``, ``expires_at`` ...

        :param label: a name in the URL (``PORT-LABEL.DOMAIN``, or
            ``/p/PORT-LABEL/`` in path mode).
        :param public: anyone who reaches the door may use it (the policy
            must allow it); otherwise a token or a :meth:`link` is needed.
        :param host_header: the ``Host`` the app sees: ``upstream`` or ``preserve``.
        """
        fields = {"label": label, "public": public, "ttl_seconds": ttl_seconds}
        req = calls.preview_expose(port, host_header=host_header, **fields)
        return await self._http.object(req)

    @api
    async def list(self) -> builtins.list[dict[str, Any]]:
        """Every exposure, and every other listening port (``exposed: false``)."""
        answer = await self._http.object(calls.preview_list())
        return cast(builtins.list[dict[str, Any]], answer["ports"])

    @api
    async def get(self, port: int) -> dict[str, Any]:
        """One exposure, with its traffic counters; :class:`PortNotExposed` if none."""
        return await self._http.object(calls.preview_get(port))

    @api
    async def url(self, port: int) -> str:
        """Where a browser opens an exposed port (a private one also wants a :meth:`link`)."""
        return str((await Preview.get.fn(self, port))["url"])

    @api
    async def link(
        self, port: int, *, ttl_seconds: float | None = None, uses: int | None = None
    ) -> dict[str, Any]:
        """
        A capability link that opens a private preview in a browser:
        ``url`` (the door sets a cookie and drops the token from the
        address), ``link_id``, ``token``, ``expires_at``.
        """
        return await self._http.object(calls.preview_link(port, ttl_seconds, uses))

    @api
    async def unexpose(self, port: int) -> dict[str, Any]:
        """Stop exposing ``port``; requests and WebSockets in flight to it close."""
        return await self._http.object(calls.preview_unexpose(port))


class Lsp(_Namespace[F]):
    """
    ``sandbox.lsp``: language servers for an agent (opt-in ``lsp``): a
    file's diagnostics, where a name is defined and used, its type and
    documentation, symbols and completions.  Lines and columns count from
    1, columns in characters, as ``files.grep`` gives them.

    The first question about a project starts its server, so it may take
    a while; later ones reuse it.  Each question takes these keyword
    options besides its own:

    :param session_id: a session to ask (from :meth:`start`).
    :param server: a server id (``pylsp``, ``pyright`` ...; see :meth:`servers`).
    :param language: an LSP language id (default: from the file's extension).
    :param root: the project directory (default: the nearest one above the
        file holding a project file).
    :param user: who the server runs as.
    :param max_results: at most this many locations, symbols or completions.
    """

    @api
    async def servers(self) -> builtins.list[LspServer]:
        """The language servers sandboxd knows, whether installed and allowed."""
        answer = await self._http.call(calls.lsp("GET", "/servers"))
        return cast(builtins.list[LspServer], answer["servers"])

    @api
    async def sessions(self) -> builtins.list[LspSession]:
        """Your running language servers."""
        answer = await self._http.call(calls.lsp("GET", "/sessions"))
        return cast(builtins.list[LspSession], answer["sessions"])

    @api
    async def start(
        self,
        language: str | None = None,
        *,
        server: str | None = None,
        root: str | None = None,
        user: str | int | None = None,
    ) -> LspSession:
        """
        Start a server ahead of the questions (a big project's index takes
        time), or find the one running for the same server, root and user.
        Name a ``language`` (its first installed, allowed server) or a
        ``server``.

        :raises Unavailable: no server for the language is installed (the
            message says how to install one).
        """
        req = calls.lsp(
            "POST", "/sessions", language=language, server=server, root=root, user=user
        )
        return cast(LspSession, await self._http.call(req))

    @api
    async def session(self, session_id: str) -> LspSession:
        """One session, with the server's last log ``messages`` and ``stderr``."""
        req = calls.lsp("GET", calls.lsp_session_path(session_id))
        return cast(LspSession, await self._http.call(req))

    @api
    async def stop(self, session_id: str) -> dict[str, Any]:
        """Stop a server (asked to shut down, then its process tree is ended)."""
        req = calls.lsp("DELETE", calls.lsp_session_path(session_id))
        return await self._http.object(req)

    @api
    async def diagnostics(
        self, /, path: str, *, timeout: float | None = None, **options: Any
    ) -> Diagnostics:
        """
        The errors and warnings the server reports for ``path`` as it is on
        disk now, once it has stopped changing its mind (``settled``).

        :param timeout: seconds to wait for the server's report on the
            file's current text (at most the policy's ``timeout_seconds``).
        """
        req = calls.lsp(
            "POST", "/diagnostics", wait=timeout, path=path, timeout=timeout, **options
        )
        return cast(Diagnostics, await self._http.call(req))

    @api
    async def definition(
        self, /, path: str, line: int, column: int = 1, **options: Any
    ) -> Locations:
        """
        Where the name at ``line`` and ``column`` of ``path`` is defined;
        ``outside`` counts the places left out because the caller may not
        read their files.
        """
        req = calls.lsp(
            "POST", "/definition", path=path, line=line, column=column, **options
        )
        return cast(Locations, await self._http.call(req))

    @api
    async def references(
        self,
        /,
        path: str,
        line: int,
        column: int = 1,
        *,
        include_declaration: bool = True,
        **options: Any,
    ) -> Locations:
        """Where the name at ``line`` and ``column`` is used (and defined)."""
        req = calls.lsp(
            "POST",
            "/references",
            path=path,
            line=line,
            column=column,
            include_declaration=include_declaration,
            **options,
        )
        return cast(Locations, await self._http.call(req))

    @api
    async def hover(
        self, /, path: str, line: int, column: int = 1, **options: Any
    ) -> Hover:
        """The type and documentation of the name there (``found: false``: none)."""
        req = calls.lsp(
            "POST", "/hover", path=path, line=line, column=column, **options
        )
        return cast(Hover, await self._http.call(req))

    @api
    async def symbols(
        self, /, path: str, *, query: str | None = None, **options: Any
    ) -> Symbols:
        """
        The symbols ``path`` defines, in file order; with ``query``, the
        project's symbols whose names match it.
        """
        req = calls.lsp("POST", "/symbols", path=path, query=query, **options)
        return cast(Symbols, await self._http.call(req))

    @api
    async def completions(
        self, /, path: str, line: int, column: int = 1, **options: Any
    ) -> Completions:
        """What could be typed at ``line`` and ``column``, in the server's order."""
        req = calls.lsp(
            "POST", "/completions", path=path, line=line, column=column, **options
        )
        return cast(Completions, await self._http.call(req))

    @api
    async def rename(
        self,
        /,
        path: str,
        line: int,
        new_name: str,
        column: int = 1,
        *,
        dry_run: bool = False,
        **options: Any,
    ) -> Renamed:
        """
        Rename the name at ``line`` and ``column`` to ``new_name`` in every
        file that uses it, all or none (needs ``files:write`` too); with
        ``dry_run`` only the diffs, nothing written.  Not sent again after
        a lost answer: the files may have changed.
        """
        req = calls.lsp(
            "POST",
            "/rename",
            idempotent=False,
            path=path,
            line=line,
            column=column,
            new_name=new_name,
            dry_run=dry_run,
            **options,
        )
        return cast(Renamed, await self._http.call(req))


class Client(Part[F], Generic[F, H]):
    """
    What both clients are: the settings, the namespaces and the client's
    own calls.  :class:`~sandboxd.client.Sandbox` and
    :class:`~sandboxd.client.AsyncSandbox` add a face (from the httpx
    client ``H`` they drive), how they are closed, and their ``with`` blocks.
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
        http_client: H | None = None,
    ) -> None:
        self.settings = settings_from(
            url, token, timeout, retries, wait_on_rate_limit, pty_url
        )
        self._face = self._connect(self.settings, http_client)
        self._http = Http(self.settings)
        self._ws_base: str | None = None
        self.files: Files[F] = Files(self)
        self.commands: Commands[F] = Commands(self)
        self.pty: Pty[F] = Pty(self)
        self.system: System[F] = System(self)
        self.env: Env[F] = Env(self)
        self.git: Git[F] = Git(self)
        self.code: Code[F] = Code(self)
        self.browser: Browser[F] = Browser(self)
        self.agents: Agents[F] = Agents(self)
        self.links: Links[F] = Links(self)
        self.preview: Preview[F] = Preview(self)
        self.lsp: Lsp[F] = Lsp(self)

    def _connect(self, settings: Settings, http_client: H | None) -> F:
        """The face that runs this client's calls."""
        raise NotImplementedError

    @property
    def url(self) -> str:
        """The daemon's HTTP base URL."""
        return self.settings.url

    def pty_base(self) -> str:
        """Where terminals are attached: ``pty_url``, a created session's ``ws_url``, or port + 1."""
        if self.settings.pty_url:
            return self.settings.pty_url
        return self._ws_base or self.settings.base_pty_url()

    @api
    async def health(self) -> bool:
        """Whether ``/health`` answers ok (no token needed)."""
        try:
            return bool((await self._http.call(calls.health())).get("status") == "ok")
        except SandboxError:
            return False

    @api
    async def capabilities(self) -> dict[str, Any]:
        """What this caller may do, endpoint by endpoint."""
        return await self._http.object(calls.capabilities())

    @api
    async def check(
        self,
        endpoint: str,
        path: str | None = None,
        *,
        op: str | None = None,
        paths: Sequence[str] | None = None,
        command: str | None = None,
    ) -> Decision:
        """
        The policy's decision for a call, without making it (``allowed``,
        ``code``, ``rule``); ``command`` names the template command a
        ``run_command`` call would run.
        """
        return cast(
            Decision,
            await self._http.call(calls.check(endpoint, path, op, paths, command)),
        )

    @api
    async def openapi(self) -> dict[str, Any]:
        """The daemon's OpenAPI 3.1 document."""
        return await self._http.object(calls.openapi())

    @api
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
