# -*- test-case-name: tests.routes.test_files -*-
"""
Handlers of the ``file_ops`` group (SPEC §7.3).

Every path goes through :class:`~sandboxd.access.guard.PathGuard`.  Small reads
and writes run on the reactor thread (one page-cache syscall is cheaper than
a thread hop); walks, archives and big base64 payloads go to the thread
pool; raw bodies stream through a producer (reads) or a body sink (writes)
and never sit in memory whole.
"""

from __future__ import annotations

import binascii
import hashlib
import json
import threading
from collections.abc import Callable
from email.utils import formatdate
from typing import Any

import pybase64
from twisted.internet.defer import Deferred
from twisted.python.failure import Failure

from sandboxd.access.guard import OpenFile, PathGuard, refusal
from sandboxd.errors import (
    ApiError,
    Code,
    bad_request,
    file_exists,
    file_not_found,
    limit_setting,
    not_found,
    payload_too_large,
    range_not_satisfiable,
)
from sandboxd.eventlog import Event
from sandboxd.files import crossing, walk
from sandboxd.files.append import append_bytes
from sandboxd.files.atomic import AtomicWrite, Undo, etag_matches, parse_mode
from sandboxd.files.background import HashedWrite
from sandboxd.files.edit import Edit, edit_file
from sandboxd.files.ignore import search_filter
from sandboxd.files.lines import file_lines, read_slice
from sandboxd.files.stream import (
    FileProducer,
    b64_chunk,
    b64_length,
    parse_range,
    read_all,
)
from sandboxd.files.walk import Skip
from sandboxd.files.watch import (
    ATTRIBUTES,
    OVERFLOW,
    seed_changes,
    seen_as,
    watch_dirs,
)
from sandboxd.policy.defaults import (
    DEFAULT_UPLOAD_BYTES,
    ENDPOINT_LIMITS,
    GREP_CONTEXT_LINES,
    INLINE_READ_BYTES,
    MAX_EDITS,
    MAX_EXCLUDES,
    MAX_LIST_DEPTH,
    MAX_PATTERN_CHARS,
    MAX_WATCHES,
    MIB,
    RECURSIVE_LIST_DEPTH,
    WALK_DEPTH,
    WATCH_MIN_WINDOW_SECONDS,
    WATCH_WINDOW_SECONDS,
    identity_cap,
)
from sandboxd.policy.paths import check_extension as policy_extension_check
from sandboxd.policy.rules import smallest
from sandboxd.web.jsonbody import json_bytes
from sandboxd.web.messages import (
    ServerRequest,
    ServerResponse,
    SSEResponse,
    StreamResponse,
)
from sandboxd.web.params import (
    flag,
    integer,
    name_glob,
    number,
    required,
    string,
    strings,
)
from sandboxd.web.sse import (
    Follower,
    SSEChannel,
    default_format,
    frame,
    resume_point,
)

# -- small helpers ------------------------------------------------------------


def _default(endpoint: str, name: str) -> Any:
    """The built-in limit, for a rule whose merged value is unset."""
    return ENDPOINT_LIMITS[endpoint][name]


def in_thread(request: ServerRequest, fn: Any, *args: Any) -> Deferred[Any]:
    """Run blocking file work in the reactor's thread pool."""
    return request.context.in_thread(fn, *args)


def max_bytes(request: ServerRequest) -> int:
    """The endpoint's payload cap."""
    return request.rule.limits.max_bytes or DEFAULT_UPLOAD_BYTES


def too_large(request: ServerRequest) -> ApiError:
    """413: over the endpoint's ``max_bytes``, naming the policy key to raise."""
    return payload_too_large(
        max_bytes(request), setting=limit_setting(request.endpoint.id, "max_bytes")
    )


def file_too_large(request: ServerRequest, size: int) -> ApiError:
    """
    413: a file to send is over the endpoint's ``max_bytes`` (the file's
    size, not the request's, is what is too large).
    """
    return payload_too_large(
        max_bytes(request),
        f"the file ({size} bytes)",
        setting=limit_setting(request.endpoint.id, "max_bytes"),
        size=size,
    )


def check_extension(request: ServerRequest, path: str) -> None:
    """
    ``params.allow_extensions`` / ``deny_extensions`` on the file name
    (:func:`sandboxd.policy.paths.check_extension`, which
    ``/capabilities/check`` asks too); a handler asks it after the path
    decision, so that both answer one code for a path both refuse.
    """
    policy_extension_check(request.rule, path)


def overwrite_allowed(request: ServerRequest, wanted: bool) -> bool:
    """The client's ``overwrite`` unless the policy's ``params.overwrite`` forbids it."""
    return wanted and request.rule.params.overwrite is not False


def _policy_overwrite_refusal(request: ServerRequest, path: str) -> ApiError:
    """
    409 ``file_exists``: ``params.overwrite: false`` makes every write a
    create, and this one met a file.  The answer of any create without
    overwrite (and the seed's, which its SDK raises as a policy refusal),
    with the rule that made it one.
    """
    error = file_exists(f"File exists: {path} (the policy does not allow overwriting)")
    error.extra["rule"] = request.rule.source("params.overwrite")
    return error


def if_match_of(request: ServerRequest) -> str | None:
    """``If-Match`` header, or ``if_match`` in a JSON body."""
    value = request.headers.get("if-match")
    if value is None:
        raw = request.body.get("if_match") if request.body else None
        value = string(raw, "if_match", None)
    return value


def write_bytes(
    request: ServerRequest,
    guard: PathGuard,
    path: str,
    data: bytes | bytearray,
    overwrite: bool,
    if_match: str | None,
    mode: int | None = None,
    undo: Undo | None = None,
) -> dict[str, Any]:
    """
    Atomically write ``data`` to ``path`` (parents created).

    :param undo: one write of several that succeed or fail together: the
        directories made and the file replaced (kept beside it) or created
        are noted there, for the caller to take back or let go.
    """
    allowed = overwrite_allowed(request, overwrite)
    loc = guard.locate(path, "write", follow=True, make_parents=True)
    if undo is not None:
        undo.take_made(loc)
    try:
        writer = AtomicWrite(
            loc, overwrite=allowed, if_match=if_match, mode=mode, display=path
        )
    except ApiError as e:
        if e.status == 409 and overwrite and not allowed:
            raise _policy_overwrite_refusal(request, path) from None
        raise
    try:
        writer.write(data)
    except BaseException:
        writer.abort()
        raise
    etag = writer.commit() if undo is None else undo.commit(writer, writer.path)
    return {"path": writer.path, "bytes": len(data), "etag": etag}


def decode_payload(request: ServerRequest) -> bytes | bytearray:
    """``content_base64`` decoded, within ``max_bytes`` (413)."""
    if request.payload is not None:
        # Decoded by the pipeline as the body arrived (sandboxd.web.upload).
        if len(request.payload) > max_bytes(request):
            raise too_large(request)
        return request.payload
    raw = request.body.get("content_base64")
    if raw is None:
        raise bad_request("missing 'content_base64'")
    if not isinstance(raw, str):
        raise bad_request("'content_base64' must be a string")
    cap = max_bytes(request)
    if len(raw) // 4 * 3 - 2 > cap:
        raise too_large(request)
    try:
        data = pybase64.b64decode(raw, validate=True)
    except (binascii.Error, ValueError):
        raise bad_request("'content_base64' is not valid base64") from None
    if len(data) > cap:
        raise too_large(request)
    return data


# -- base64 transfer --------------------------------------------------------------


def _upload(
    request: ServerRequest, default_overwrite: bool, append: bool = False
) -> Any:
    path = required(request.body.get("path"), "path")
    guard = PathGuard.for_request(request)
    guard.decide(path)  # NUL and lexical refusals before decoding anything
    first = guard.decide(path, "write")
    if not first.allowed:
        raise refusal(first)
    check_extension(request, path)
    overwrite = flag(request.body.get("overwrite"), "overwrite", default_overwrite)
    mode = parse_mode(request.body.get("mode"))
    if_match = if_match_of(request)
    if append:
        if mode is not None:
            raise bad_request("'mode' sets a new file's permissions: not with append")
        if not overwrite_allowed(request, True):
            raise _policy_overwrite_refusal(request, path)

        def appended() -> dict[str, Any]:
            return append_bytes(guard, path, decode_payload(request), if_match)

        return in_thread(request, appended)
    raw = request.body.get("content_base64")
    if request.payload is not None:
        size = len(request.payload)
    else:
        # Not a string (a number, a list): decode_payload says 400.
        size = len(raw) if isinstance(raw, str) else 0
    if size <= INLINE_READ_BYTES:
        data = decode_payload(request)
        return write_bytes(request, guard, path, data, overwrite, if_match, mode)

    def job() -> dict[str, Any]:
        data = decode_payload(request)
        return write_bytes(request, guard, path, data, overwrite, if_match, mode)

    return in_thread(request, job)


def upload(request: ServerRequest) -> Any:
    """
    ``POST /upload``: write a file from base64 (parents created); with
    ``append``, add to the end of an existing one.
    """
    append = flag(request.body.get("append", False), "append", False, words=False)
    return _upload(request, True, append=append)


def files_upload_stream(request: ServerRequest) -> Any:
    """``POST /files/upload-stream``: the same, atomic, ``overwrite`` honoured."""
    return _upload(request, True)


def download(request: ServerRequest) -> Any:
    """
    ``GET /download``: a file as base64 (small files answered inline); with
    ``offset`` or ``limit``, only those lines of it.
    """
    path = required(request.query.get("path"), "path")
    offset = integer(request.arg("offset"), "offset", None)
    limit = integer(request.arg("limit"), "limit", None, low=1)
    if offset == 0:
        raise bad_request("'offset' counts lines from 1 (or from the end, below 0)")
    guard = PathGuard(request.rule)
    f = guard.open_file(path)
    size = f.stat.st_size
    cap = max_bytes(request)
    if offset is not None or limit is not None:
        # A log's last lines: the bound is on the lines sent, not the file.
        return in_thread(request, _lines_of, request, f, size, offset or 1, limit)
    if size > cap:
        f.close()
        raise file_too_large(request, size)
    if size <= INLINE_READ_BYTES:
        with f:
            data = read_all(f.fd, size)
        return {
            "path": f.path,
            "content_base64": b64_chunk(data).decode("ascii"),
            "etag": f.etag,
        }

    def job() -> dict[str, Any]:
        with f:
            data = read_all(f.fd, size)
        return {
            "path": f.path,
            "content_base64": pybase64.b64encode_as_string(data),
            "etag": f.etag,
        }

    return in_thread(request, job)


def _lines_of(
    request: ServerRequest, f: OpenFile, size: int, offset: int, limit: int | None
) -> dict[str, Any]:
    """
    ``download`` of some lines: those bytes, and where they lie in the file.
    The file is read a chunk at a time to find them, whatever its size; 413
    when the lines asked for are over ``max_bytes``.
    """
    with f:
        part = file_lines(f.fd, size, offset, limit)
        if part.end - part.start > max_bytes(request):
            raise payload_too_large(
                max_bytes(request),
                f"lines {part.first}..{part.first + part.count - 1} "
                f"({part.end - part.start} bytes; ask for fewer with limit)",
                setting=limit_setting(request.endpoint.id, "max_bytes"),
                size=part.end - part.start,
            )
        data = read_slice(f.fd, part)
    return {
        "path": f.path,
        "content_base64": pybase64.b64encode_as_string(data),
        "etag": f.etag,
        "offset": part.first,
        "lines": part.count,
        "total_lines": part.total,
        "more": part.more,
    }


def files_download_stream(request: ServerRequest) -> Any:
    """
    ``GET /files/download-stream``: the base64 JSON written as the file is
    read, so a big file never sits in memory whole (``bytes`` comes last).

    The file's size when opened fixes the body, so the response carries a
    ``Content-Length`` (clients read it without chunk framing, and can show
    progress); a file that grows meanwhile is sent up to that size, one that
    shrinks cuts the connection.  A small file is read whole and answered
    as one buffer instead (see :func:`_small_download`).
    """
    path = required(request.query.get("path"), "path")
    try:
        f = PathGuard.for_request(request).open_file(path)
    except ApiError as e:
        if e.type != "IsADirectoryError":
            raise
        # The seed answers a directory as it answers a missing file, and
        # its SDK raises FileNotFoundError_ for it.
        raise file_not_found(path) from None
    size = f.stat.st_size
    cap = max_bytes(request)
    if size > cap:
        f.close()
        raise file_too_large(request, size)
    head = (
        b'{"path":'
        + json_bytes(f.path)
        + b',"etag":'
        + json_bytes(f.etag)
        + b',"content_base64":"'
    )
    if size <= INLINE_READ_BYTES:
        with f:
            return _small_download(head, read_all(f.fd, size))
    tail = b'","bytes":' + str(size).encode() + b"}"
    producer = FileProducer(f.fd, 0, size, transform=b64_chunk, trailer=tail)
    f.fd = -1  # the producer owns it now

    def write_to(raw: Any) -> Deferred[Any]:
        raw.write(head)
        return producer.start(raw)

    length = len(head) + b64_length(size) + len(tail)
    return StreamResponse(
        write_to=write_to,
        headers={"content-type": "application/json", "content-length": str(length)},
    )


def _small_download(head: bytes, data: bytes) -> ServerResponse:
    """
    ``/files/download-stream``'s body for a file small enough to read at
    once (as ``/download`` reads one): the same JSON, built whole and sent
    with its head as one write, rather than a producer's head, chunk and
    trailer (two sends, and the socket watched for writing in between).

    A file that shrank before it was read is answered as what was read,
    ``bytes`` saying how much: nothing had been announced yet.
    """
    body = b"".join(
        (head, b64_chunk(data), b'","bytes":', str(len(data)).encode(), b"}")
    )
    return ServerResponse(headers={"content-type": "application/json"}, raw=body)


# -- raw transfer ---------------------------------------------------------------


def files_read_raw(request: ServerRequest) -> Any:
    """``GET /files/raw``: the bytes, streamed, with ETag, Last-Modified and Range."""
    path = required(request.query.get("path"), "path")
    f = PathGuard.for_request(request).open_file(path)
    st = f.stat
    cap = request.rule.limits.max_bytes
    if cap is not None and st.st_size > cap:
        f.close()
        raise file_too_large(request, st.st_size)
    headers = {
        "content-type": "application/octet-stream",
        "etag": f.etag,
        "last-modified": formatdate(st.st_mtime, usegmt=True),
        "accept-ranges": "bytes",
    }
    inm = request.headers.get("if-none-match")
    if inm is not None and etag_matches(inm, f.etag):
        f.close()
        return ServerResponse(status=304, headers=headers, raw=b"")
    size = st.st_size
    status, offset, length = 200, 0, size
    wanted = parse_range(request.headers.get("range"), size)
    if_range = request.headers.get("if-range")
    if wanted is not None and if_range is not None and if_range.strip() != f.etag:
        wanted = None
    if wanted == "unsatisfiable":
        f.close()
        raise range_not_satisfiable(size)
    if isinstance(wanted, tuple):
        offset, length = wanted
        status = 206
        headers["content-range"] = f"bytes {offset}-{offset + length - 1}/{size}"
    headers["content-length"] = str(length)
    producer = FileProducer(f.fd, offset, length)
    f.fd = -1
    return StreamResponse(write_to=producer.start, status=status, headers=headers)


def atomic_writer(
    request: ServerRequest,
    path: str,
    overwrite: bool,
    mode: int | None,
    if_match: str | None,
) -> AtomicWrite:
    """
    The guarded, policy-checked :class:`AtomicWrite` of a write route: every
    refusal (guard, extension, overwrite, If-Match, mode) before a byte is
    written; its temporary file is created beside the target.
    """
    guard = PathGuard.for_request(request)
    decision = guard.decide(path, "write")
    if not decision.allowed:
        raise refusal(decision)
    check_extension(request, path)
    allowed = overwrite_allowed(request, overwrite)
    loc = guard.locate(path, "write", follow=True, make_parents=True)
    try:
        return AtomicWrite(
            loc, overwrite=allowed, if_match=if_match, mode=mode, display=path
        )
    except ApiError as e:
        if e.status == 409 and overwrite and not allowed:
            raise _policy_overwrite_refusal(request, path) from None
        raise


def hashed_write(request: ServerRequest, writer: AtomicWrite, hash: Any) -> HashedWrite:
    """The raw body of ``request`` hashed and written off the reactor thread."""
    transport: Any = request.raw.channel.transport if request.raw else None
    return HashedWrite(request.context.reactor, transport, writer.write, hash)


class RawSink:
    """The body of ``POST /files/raw``, written to a temp file as it arrives."""

    def __init__(self, request: ServerRequest) -> None:
        path = required(request.query.get("path"), "path")
        overwrite = flag(request.query.get("overwrite"), "overwrite", True)
        mode = parse_mode(request.query.get("mode"))
        self.writer = atomic_writer(
            request, path, overwrite, mode, request.headers.get("if-match")
        )
        self.cap = max_bytes(request)
        self.endpoint_id = request.endpoint.id
        self.received = 0
        self.body = hashed_write(request, self.writer, hashlib.sha256())

    def write(self, data: bytes) -> None:
        """One chunk of the body, queued for the hashing and the writing thread."""
        self.received += len(data)
        if self.received > self.cap:
            self.abort()
            raise payload_too_large(
                self.cap, setting=limit_setting(self.endpoint_id, "max_bytes")
            )
        self.body.write(data)

    def finish(self) -> Deferred[dict[str, Any]]:
        """The whole body is in: once written, rename into place."""

        def commit(_: object) -> dict[str, Any]:
            etag = self.writer.commit()
            return {
                "path": self.writer.path,
                "bytes": self.writer.bytes,
                "sha256": self.body.hash.hexdigest(),
                "etag": etag,
            }

        def failed(failure: Any) -> Any:
            self.abort()
            return failure

        return self.body.flush().addCallbacks(commit, failed)

    def abort(self) -> None:
        """Failed or the client left: the old file stays (once no write is in flight)."""
        if not self.writer.done:
            self.body.when_idle(self.writer.abort)


def files_write_raw(request: ServerRequest) -> Any:
    """``POST /files/raw``: the sink has written and renamed the file already."""
    return request.sink_result


# -- tree operations ----------------------------------------------------------------


def files_list(request: ServerRequest) -> Any:
    """``GET /files/list``: entries, off the reactor thread."""
    guard = PathGuard.for_request(request)
    query = request.query
    path = query.get("path") or guard.default_dir
    # The seed's recursive=true lists as deep as its default depth; an
    # explicit depth says exactly how deep.
    recursive = flag(query.get("recursive"), "recursive", False)
    shallow = RECURSIVE_LIST_DEPTH if recursive else 1
    depth = integer(query.get("depth"), "depth", shallow, 1, MAX_LIST_DEPTH)
    # A policy's max_depth lowers what may be asked for, as on the seed.
    depth = min(depth, request.rule.limits.max_depth or depth)
    hidden = flag(query.get("hidden"), "hidden", True)
    cap = request.rule.limits.max_entries or _default("files_list", "max_entries")
    # "At most max_entries": more is asked for, the policy's cap is given.
    cap = min(cap, integer(query.get("max_entries"), "max_entries", cap, 1))
    try:
        guard.locate(path, "read", follow=True).close()  # refusals before the thread
    except ApiError as e:
        raise _no_directory(e) from None
    d = in_thread(request, walk.list_dir, guard, path, depth, hidden, cap)
    return d.addErrback(_listing_failed)


def _listing_failed(failure: Failure) -> None:
    """A listing's failure, :func:`_no_directory` applied."""
    error = failure.value
    if not isinstance(error, ApiError):
        failure.raiseException()
    raise _no_directory(error)


def _no_directory(error: ApiError) -> ApiError:
    """
    A listing of what is not a directory is 404, as a missing one is: the
    seed answers both with ``FileNotFoundError``, and its SDK raises
    ``FileNotFoundError_`` for them; the type still says which it was.
    """
    if error.status == 400 and error.type == "NotADirectoryError":
        return not_found(error.message, error.type)
    return error


def files_stat(request: ServerRequest) -> Any:
    """``GET /files/stat``: one entry; missing inside the boundary is 200 ``exists: false``."""
    path = required(request.query.get("path"), "path")
    return walk.stat_path(PathGuard.for_request(request), path)


def files_mkdir(request: ServerRequest) -> Any:
    """``POST /files/mkdir``: with parents, exist_ok."""
    path = required(request.body.get("path"), "path")
    return {
        "path": walk.make_dir(PathGuard.for_request(request), path),
        "created": True,
    }


def files_chmod(request: ServerRequest) -> Any:
    """``POST /files/chmod``: a file's or directory's permission bits."""
    path = required(request.body.get("path"), "path")
    mode = parse_mode(request.body.get("mode"))
    if mode is None:
        raise bad_request("'mode' is required, octal, e.g. 755")
    return walk.change_mode(PathGuard.for_request(request), path, mode)


def files_delete(request: ServerRequest) -> Any:
    """``DELETE /files?path=``: files, links, or whole trees (in a thread)."""
    in_body = request.body.get("path")
    if in_body is not None and not isinstance(in_body, str):
        raise bad_request("'path' must be a string")  # even beside ?path=
    in_query = request.query.get("path")
    if in_query is None:
        path = required(in_body, "path")
    else:
        # Given empty, ?path= is refused rather than passed over; given in
        # both places, the two must agree: a delete never guesses which.
        path = required(in_query, "path")
        if in_body is not None and in_body != in_query:
            raise bad_request(
                "'path' is given in the query and in the body with different "
                "values: give it once",
                Code.DUPLICATE_PARAMETER,
            )
    guard = PathGuard.for_request(request)

    def job() -> dict[str, Any]:
        return {"path": walk.delete(guard, path), "deleted": True}

    return in_thread(request, job)


def files_move(request: ServerRequest) -> Any:
    """``POST /files/move``: rename, into a directory when the destination is one."""
    return move(request)


def move(request: ServerRequest, into: bool = True) -> Any:
    """
    ``files_move``'s work; with ``into`` false a destination that is a
    directory is replaced as ``rename(2)`` replaces it (E2B's ``Move``).
    """
    body = request.body
    try:
        source = required(body.get("source"), "source")
    except ApiError as e:
        e.message = "source: " + e.message
        raise
    try:
        destination = required(body.get("destination"), "destination")
    except ApiError as e:
        e.message = "destination: " + e.message
        raise
    # A JSON boolean, as the schema says: a move onto itself answers 200
    # without touching anything, so a field it would not read must still
    # be refused.
    overwrite = flag(body.get("overwrite", False), "overwrite", words=False)
    allowed = overwrite_allowed(request, overwrite)
    guard = PathGuard.for_request(request)
    gone = threading.Event()
    across = _crossing_bounds(request, gone)

    def job() -> dict[str, str]:
        src, dst = walk.move(
            guard,
            source,
            destination,
            allowed,
            across,
            into,
            lambda path: check_extension(request, path),
        )
        return {"source": src, "destination": dst}

    def refused(failure: Failure) -> Failure:
        e = failure.value
        if isinstance(e, ApiError) and e.status == 409 and overwrite and not allowed:
            raise _policy_overwrite_refusal(request, destination)
        return failure

    # In a thread: a move to another file system copies the tree.
    return until_gone(in_thread(request, job).addErrback(refused), gone)


def given_up(request: ServerRequest, gone: threading.Event) -> Callable[[], bool]:
    """Whether no one waits for the answer any more: the daemon stops, or ``gone``."""
    return lambda: request.context.draining or gone.is_set()


def until_gone(work: Deferred[Any], gone: threading.Event) -> Deferred[Any]:
    """
    The answer of ``work`` (a thread's), whose cancelling (the caller left)
    sets ``gone``: the thread looks at it and gives up, rather than go on
    holding a pool thread for an answer nobody will read.
    """
    answer: Deferred[Any] = Deferred(lambda _: gone.set())

    def settle(outcome: Any) -> None:
        if not answer.called:
            answer.callback(outcome)

    work.addBoth(settle)
    return answer


def _crossing_bounds(request: ServerRequest, gone: threading.Event) -> crossing.Bounds:
    """
    What a move's copy to another file system may take, from the policy;
    it is given up once the daemon stops or ``gone`` is set (the caller left).
    """
    limits = request.rule.limits
    endpoint = request.endpoint.id
    return crossing.Bounds(
        max_entries=int(limits.max_entries or _default(endpoint, "max_entries")),
        timeout_seconds=float(
            limits.timeout_seconds or _default(endpoint, "timeout_seconds")
        ),
        entries_setting=limit_setting(endpoint, "max_entries"),
        timeout_setting=limit_setting(endpoint, "timeout_seconds"),
        stopping=given_up(request, gone),
    )


def _excludes(body: dict[str, Any]) -> tuple[str, ...]:
    """
    ``exclude``: gitignore globs of what a search leaves
    out, relative to the directory searched (``node_modules``, ``dist/**``,
    ``*.min.js``).
    """
    globs = strings(body.get("exclude"), "exclude", [])
    if len(globs) > MAX_EXCLUDES:
        raise bad_request(f"'exclude' holds more than {MAX_EXCLUDES} globs")
    for glob in globs:
        if not glob or len(glob) > MAX_PATTERN_CHARS:
            raise bad_request(
                f"'exclude' holds an empty glob or one over {MAX_PATTERN_CHARS} "
                "characters"
            )
    # Each names what is left out: a leading ! or # is the name's own
    # (there is nothing here to re-include, and no comment).
    return tuple("\\" + g if g[0] in "!#" else g for g in globs)


def _skip_flags(body: dict[str, Any], everything: bool) -> tuple[bool, bool]:
    """``no_ignore`` and ``hidden`` (``everything`` when not given, or null)."""
    return (
        flag(_given(body, "no_ignore", everything), "no_ignore", words=False),
        flag(_given(body, "hidden", everything), "hidden", words=False),
    )


def _given(body: dict[str, Any], name: str, default: Any) -> Any:
    value = body.get(name)
    return default if value is None else value


def _search_filter(
    body: dict[str, Any], guard: PathGuard, everything: bool
) -> Callable[[str], Skip | None]:
    """
    A name search's filter: ``no_ignore`` and ``hidden`` (both
    ``everything`` when not given) and ``exclude``.
    """
    no_ignore, hidden = _skip_flags(body, everything)
    exclude = _excludes(body)
    return lambda root: search_filter(
        guard, root, no_ignore=no_ignore, hidden=hidden, exclude=exclude
    )


def files_search(request: ServerRequest) -> Any:
    """``POST /files/search``: fnmatch on names, recursive, time-boxed, in a thread."""
    guard = PathGuard.for_request(request)
    body = request.body
    path = body.get("path")
    if path is not None and not isinstance(path, str):
        raise bad_request("'path' must be a string")
    path = path or guard.default_dir
    pattern = required(body.get("pattern"), "pattern")
    if len(pattern) > MAX_PATTERN_CHARS:
        raise bad_request(f"'pattern' is longer than {MAX_PATTERN_CHARS} characters")
    pattern = name_glob(pattern, "pattern")
    limits = request.rule.limits
    cap = smallest(limits.max_results, limits.max_entries) or _default(
        "files_search", "max_entries"
    )
    # "At most max_entries": more is asked for, that many are given.
    max_results = min(cap, integer(body.get("max_results"), "max_results", cap, 1))
    timeout = request.rule.limits.timeout_seconds or _default(
        "files_search", "timeout_seconds"
    )
    # The seed's max_depth: how many levels down names are matched.
    depth = min(WALK_DEPTH, integer(body.get("max_depth"), "max_depth", WALK_DEPTH, 1))
    depth = min(depth, request.rule.limits.max_depth or depth)
    # As the seed's search: every name by default, hidden and ignored ones.
    skipping = _search_filter(body, guard, everything=True)
    guard.locate(path, "read", follow=True).close()
    gone = threading.Event()
    work = in_thread(
        request,
        walk.search,
        guard,
        path,
        pattern,
        max_results,
        timeout,
        depth,
        given_up(request, gone),
        skipping,
    )
    return until_gone(work, gone)


def _edits(body: dict[str, Any]) -> list[Edit]:
    """
    The body's edits: ``edits``, a list of ``{old_text, new_text,
    replace_all?}``, or one edit given by those fields at the top level.
    """
    listed = body.get("edits")
    single = any(k in body for k in ("old_text", "new_text", "insert_line"))
    if listed is not None and single:
        raise bad_request(
            "give either 'edits' or one edit ('old_text' or 'insert_line', and "
            "'new_text'), not both"
        )
    if listed is None:
        return [_edit(body, "")]
    if not isinstance(listed, list) or not listed:
        raise bad_request("'edits' must be a non-empty list of objects")
    if len(listed) > MAX_EDITS:
        raise bad_request(f"'edits' holds more than {MAX_EDITS} edits")
    return [_edit(item, f"edits[{n}].") for n, item in enumerate(listed)]


def _edit(raw: Any, where: str) -> Edit:
    """
    One ``{old_text, new_text, replace_all?}`` or ``{insert_line,
    new_text}``; ``where`` prefixes its errors.
    """
    if not isinstance(raw, dict):
        raise bad_request(f"'{where.rstrip('.')}' must be an object")
    new = string(raw.get("new_text"), f"{where}new_text")
    if "insert_line" in raw:
        if "old_text" in raw or "replace_all" in raw:
            raise bad_request(
                f"'{where}insert_line' inserts: it takes no old_text or replace_all"
            )
        after = integer(raw.get("insert_line"), f"{where}insert_line", low=0)
        return Edit("", new, insert_line=after)
    if raw.get("old_text") == "":
        raise bad_request(
            f"'{where}old_text' is empty: give the text to replace, or "
            f"'{where}insert_line' to add new_text after a line"
        )
    old = required(raw.get("old_text"), f"{where}old_text")
    replace_all = flag(
        raw.get("replace_all", False), f"{where}replace_all", False, words=False
    )
    return Edit(old, new, replace_all)


def files_edit(request: ServerRequest) -> Any:
    """``POST /files/edit``: exact replacements in a text file, all or none."""
    body = request.body
    path = required(body.get("path"), "path")
    guard = PathGuard.for_request(request)
    for op in ("read", "write"):
        decision = guard.decide(path, op)
        if not decision.allowed:
            raise refusal(decision)
    check_extension(request, path)
    edits = _edits(body)
    dry_run = flag(body.get("dry_run", False), "dry_run", False, words=False)
    if_match = if_match_of(request)
    cap = request.rule.limits.max_bytes or _default("files_edit", "max_bytes")

    def too_large(size: int) -> ApiError:
        return payload_too_large(
            cap,
            f"the file ({size} bytes)",
            setting=limit_setting("files_edit", "max_bytes"),
            size=size,
        )

    def job() -> dict[str, Any]:
        return edit_file(
            guard,
            path,
            edits,
            if_match=if_match,
            max_bytes=cap,
            too_large=too_large,
            dry_run=dry_run,
        )

    return in_thread(request, job)


def files_grep(request: ServerRequest) -> Any:
    """``POST /files/grep``: lines matching a pattern in files, time-boxed, in a thread."""
    from sandboxd.files import grep  # RE2: on first use

    guard = PathGuard.for_request(request)
    body = request.body
    path = string(body.get("path"), "path", None) or guard.default_dir
    pattern = required(body.get("pattern"), "pattern")
    if len(pattern) > MAX_PATTERN_CHARS:
        raise bad_request(f"'pattern' is longer than {MAX_PATTERN_CHARS} characters")
    pattern = name_glob(pattern, "pattern")
    include = string(body.get("include"), "include", None)
    if include is not None and len(include) > MAX_PATTERN_CHARS:
        raise bad_request(f"'include' is longer than {MAX_PATTERN_CHARS} characters")
    if include:
        include = name_glob(include, "include")
    no_ignore, hidden = _skip_flags(body, everything=False)
    query = grep.Query(
        pattern,
        fixed_strings=flag(
            body.get("fixed_strings", False), "fixed_strings", words=False
        ),
        ignore_case=flag(body.get("ignore_case", False), "ignore_case", words=False),
        include=include or None,
        exclude=_excludes(body),
        no_ignore=no_ignore,
        hidden=hidden,
    )
    limits = request.rule.limits
    cap = smallest(limits.max_results, limits.max_entries) or _default(
        "files_grep", "max_entries"
    )
    depth = min(WALK_DEPTH, integer(body.get("max_depth"), "max_depth", WALK_DEPTH, 1))
    gone = threading.Event()
    bounds = grep.Bounds(
        max_results=min(cap, integer(body.get("max_results"), "max_results", cap, 1)),
        timeout=limits.timeout_seconds or _default("files_grep", "timeout_seconds"),
        depth=min(depth, limits.max_depth or depth),
        max_file_bytes=limits.max_bytes or _default("files_grep", "max_bytes"),
        context=integer(body.get("context"), "context", 0, 0, GREP_CONTEXT_LINES),
        stopping=given_up(request, gone),
    )
    guard.locate(path, "read", follow=True).close()
    return until_gone(in_thread(request, grep.grep, guard, path, query, bounds), gone)


def files_archive(request: ServerRequest) -> Any:
    """``POST /files/archive``: tar.gz or zip of guarded paths, in a thread."""
    from sandboxd.files import archive  # tarfile and zipfile: on first use

    body = request.body
    paths = body.get("paths")
    if (
        not isinstance(paths, list)
        or not paths
        or not all(isinstance(p, str) and p for p in paths)
    ):
        raise bad_request("'paths' must be a non-empty list of paths")
    fmt = _archive_format(body)
    guard = PathGuard.for_request(request)
    for p in paths:
        guard.locate(p, "read", follow=True).close()
    limits = request.rule.limits
    return in_thread(
        request,
        archive.create,
        guard,
        paths,
        fmt,
        smallest(limits.max_files, limits.max_entries)
        or _default("files_archive", "max_entries"),
        max_bytes(request),
    )


def _archive_format(body: dict[str, Any]) -> str:
    """The body's ``format`` (default tar.gz), or 400."""
    from sandboxd.files import archive

    fmt = body.get("format") or "tar.gz"
    if fmt not in archive.FORMATS:
        raise bad_request(f"unsupported format {fmt!r}; use tar.gz or zip")
    return str(fmt)


def files_extract(request: ServerRequest) -> Any:
    """``POST /files/extract``: every member checked before anything is written."""
    from sandboxd.files import archive

    body = request.body
    destination = required(body.get("destination"), "destination")
    fmt = _archive_format(body)
    overwrite = flag(body.get("overwrite"), "overwrite", False)
    allowed = overwrite_allowed(request, overwrite)
    guard = PathGuard.for_request(request)
    first = guard.decide(destination, "write")
    if not first.allowed:
        raise refusal(first)
    limits = request.rule.limits
    cap = max_bytes(request)

    def job() -> dict[str, Any]:
        data = decode_payload(request)
        return archive.extract(
            guard,
            data,
            fmt,
            destination,
            allowed,
            limits.max_entries or _default("files_extract", "max_entries"),
            cap,
            lambda path: check_extension(request, path),
        )

    return in_thread(request, job)


def watch_window(request: ServerRequest) -> float | None:
    """
    How long the watch lasts: None for the open-ended, resumable form
    (``follow=true``), else the seed's window in seconds.

    The seed's SDK calls ``files.watch(path)`` with nothing but ``path``
    and ``recursive`` and expects ``change`` events and an ``end`` when
    the seed's server closes the window (300 s unless ``timeout`` says
    otherwise), so a request that does not ask to follow gets that form.
    The window is cut to ``max_duration_seconds`` and is at least
    :data:`WATCH_MIN_WINDOW_SECONDS`, as on the seed; ``interval`` (the
    seed's polling period) is checked and otherwise not needed here.
    """
    raw_timeout = request.query.get("timeout")
    raw_interval = request.query.get("interval")
    if flag(request.query.get("follow"), "follow", False):
        if raw_timeout is not None or raw_interval is not None:
            raise bad_request(
                "follow=true watches until the client leaves; 'timeout' and "
                "'interval' belong to the windowed form (leave follow out)"
            )
        return None
    number(raw_interval, "interval", None)
    ceiling = request.rule.limits.max_duration_seconds or WATCH_WINDOW_SECONDS
    window = number(raw_timeout, "timeout", WATCH_WINDOW_SECONDS)
    return max(WATCH_MIN_WINDOW_SECONDS, min(window, ceiling))


def files_watch(request: ServerRequest) -> Any:
    """
    ``GET /files/watch?path=&recursive=``: SSE of changes.  With
    ``follow=true``, open-ended and resumable; otherwise in the seed's
    form: ``ready``, ``change`` events and an ``end`` when the window
    (``timeout``, else 300 s) closes.
    """
    guard = PathGuard.for_request(request)
    path = request.query.get("path") or guard.default_dir
    recursive = flag(request.query.get("recursive"), "recursive", False)
    after = resume_point(request.query, request.headers)
    # A watch is shared and outlives its clients so that a cursor can
    # resume it; a client without one asked for no replay, and the kept
    # events are changes made before it came (other clients', or its own
    # last window's): it starts at the log's end.
    resuming = "after" in request.query or "last-event-id" in request.headers
    window = watch_window(request)
    retention = request.rule.limits.max_output_bytes or MIB
    watches = request.context.watches
    assert watches is not None
    service = watches.get()

    def shown(event: Event) -> dict[str, Any] | None:
        """
        The event's data as this client may see it, or None.  Names that
        are not UTF-8 are shown as the listing and search show them
        (``\\xff``), not as lone surrogates: the guard decides on the real
        name, the client reads the shown one.
        """
        data = event.data
        if event.event == ATTRIBUTES:
            return None  # the E2B door's CHMOD; not one of this stream's events
        try:
            path = seen_as(guard, data["path"])
            if "dest" in data:
                seen_as(guard, data["dest"])
        except ApiError:
            return None
        shown_path = walk.display_name(path)
        if "dest" in data:
            return dict(data, path=shown_path, dest=walk.display_name(data["dest"]))
        return data if shown_path == data["path"] else dict(data, path=shown_path)

    def our_format(event: Event) -> bytes | list[bytes]:
        data = shown(event)
        if data is None:
            return b""
        return default_format(Event(event.seq, event.event, data, event.size))

    def seed_format(event: Event) -> bytes:
        data = shown(event)
        if data is None:
            return b""
        if event.event == OVERFLOW:
            # Not one of the seed's change types: an event of its own,
            # which the seed's clients pass over.
            return frame(OVERFLOW, data, event.seq)
        return b"".join(
            frame("change", change, event.seq) for change in seed_changes(data)
        )

    # A link's watches are its minter's share.
    owner = request.identity.root if request.identity is not None else ""
    mine = identity_cap(
        MAX_WATCHES,
        len(request.context.policy.tokens.ids()),
        request.rule.limits.max_per_identity,
    )

    def ready(found: tuple[str, list[str]]) -> SSEResponse:
        root, dirs = found
        watch = service.get(root, recursive, retention, dirs, owner, mine)

        def start(channel: SSEChannel) -> Any:
            watch.acquire()
            channel.done.addBoth(lambda _: watch.release())
            since = after if resuming else watch.now()
            if window is None:
                channel.comment("watching")

                def ending() -> bytes:
                    # Only a watch whose directory went away ends: one the
                    # daemon closes as it stops is cut, to be resumed.
                    if watch.deleted:
                        return frame("end", {"reason": "deleted"})
                    return b""

                return Follower(
                    watch.log, channel, since, our_format, ending=ending
                ).done
            channel.send("ready", {"path": root})
            follower = Follower(
                watch.log,
                channel,
                since,
                seed_format,
                ending=lambda: frame("end", {"reason": "closed"}),
            )

            def window_over() -> None:
                follower.stopProducing()
                channel.send("end", {"reason": "timeout"})
                channel.close()

            over = request.context.reactor.callLater(window, window_over)

            def stop_window(result: object) -> object:
                if over.active():
                    over.cancel()
                return result

            channel.done.addBoth(stop_window)
            return follower.done

        return SSEResponse(start=start)

    if recursive:
        d = request.context.in_thread(watch_dirs, guard, path)
        return d.addCallback(ready)
    with guard.open_dir(path) as (_fd, root):
        pass
    return ready((root, []))


HANDLERS: dict[str, Any] = {
    "upload": upload,
    "download": download,
    "files_list": files_list,
    "files_stat": files_stat,
    "files_mkdir": files_mkdir,
    "files_chmod": files_chmod,
    "files_delete": files_delete,
    "files_move": files_move,
    "files_search": files_search,
    "files_edit": files_edit,
    "files_grep": files_grep,
    "files_upload_stream": files_upload_stream,
    "files_download_stream": files_download_stream,
    "files_archive": files_archive,
    "files_extract": files_extract,
    "files_read_raw": files_read_raw,
    "files_write_raw": files_write_raw,
    "files_watch": files_watch,
}

SINKS: dict[str, Any] = {"files_write_raw": RawSink}


__all__ = ["HANDLERS", "SINKS", "json"]
