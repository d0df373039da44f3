# -*- test-case-name: tests.kep.test_rest -*-
"""
agent-sandbox's REST filesystem API (KEP-539.2, ``filesystem/v1``) on a
port of its own, each call governed as the sandboxd endpoint doing the job.

- ``GET /v1/files/{path}``: a file's bytes (``files_read_raw``: its Range,
  ETag and Last-Modified, and If-Modified-Since as the reference's file
  server reads it; ``HEAD`` answers the head alone) or a directory's
  ``DirectoryListing`` (``files_list``);
- ``PUT /v1/files/{path}``: an atomic write, raw or the ``file`` part of a
  multipart body, ``?mode=0644`` (``files_write_raw``, its ``max_bytes``),
  answered 204;
- ``DELETE /v1/files/{path}?recursive=``: 204, 409 for a directory that is
  not empty without ``recursive`` (``files_delete``);
- ``GET /v1/health`` (``health``, no credential) and ``GET /v1/metadata``
  (``env_get``: its redaction, then the protocol's ``SANDBOX_`` rule).

The path is one percent-encoded segment (the SDK sends ``a%2Fb%2Fc.txt``),
relative to the door's root; one that leaves the root is 403 before the
path guard is asked, which then applies every rule it applies elsewhere.
Errors are the protocol's ``{"code", "message"}`` (:mod:`sandboxd.kep.errors`).
"""

from __future__ import annotations

import errno
import json
import os
import posixpath
import re
import stat
import time
import urllib.parse
from datetime import UTC, datetime
from email.utils import formatdate, parsedate_to_datetime
from typing import Any, cast

from twisted.internet.defer import Deferred
from twisted.web.server import NOT_DONE_YET

from sandboxd.access import gate
from sandboxd.access.guard import NAME_MAX, PathGuard, name_too_long, os_error
from sandboxd.errors import (
    ApiError,
    Code,
    bad_request,
    directory_not_empty,
    file_not_found,
    forbidden,
    invalid_path,
    method_not_allowed,
    payload_too_large,
    quoted,
    unavailable,
    unmet_precondition,
)
from sandboxd.files import walk
from sandboxd.kep import access
from sandboxd.kep.errors import error_body, error_headers, kep_status
from sandboxd.policy.defaults import (
    ENDPOINT_LIMITS,
    KEP_MAX_REQUEST_BYTES,
    KEP_MAX_UPLOAD_PARTS,
    MIB,
)
from sandboxd.web import multipart
from sandboxd.web.connections import ConnectionLimits
from sandboxd.web.portdoor import (
    REST,
    Call,
    PortDoor,
    Procedure,
    conditional_headers,
    send_response,
)

FILES = "/v1/files"
_MODE = re.compile(r"^0[0-7]{3}$")
#: What Go's ``strconv.ParseBool`` takes, as the reference reads ``recursive``.
_TRUE = frozenset({"1", "t", "T", "TRUE", "true", "True"})
_FALSE = frozenset({"0", "f", "F", "FALSE", "false", "False"})
#: Name parts that keep a variable off ``/v1/metadata`` (the reference's list).
SENSITIVE_MARKERS = (
    "TOKEN",
    "SECRET",
    "PASSWORD",
    "PASSWD",
    "CRED",
    "KEY",
    "AUTH",
    "BEARER",
    "PRIVATE",
    "CERT",
)
METADATA_PREFIX = "SANDBOX_"
#: A name's byte that is not UTF-8, as a listing shows it, and a doubled
#: backslash (:func:`listed_name`): read back into the name by
#: :func:`named`.  Only bytes 80-ff: no UTF-8 name holds one alone, and
#: ``\\x2f`` never becomes a separator.
_ESCAPE = re.compile(r"\\\\|\\x([89a-fA-F][0-9a-fA-F])")
_SPELLS_ESCAPE = re.compile(r"x[89a-fA-F][0-9a-fA-F]")


def _undecodable(char: str) -> bool:
    return "\udc80" <= char <= "\udcff"


def listed_name(name: str) -> str:
    """
    A name as a listing shows it: as ``files_list`` shows it (each byte
    that is not UTF-8 as ``\\xNN``), and a backslash doubled where it would
    otherwise read as part of such an escape (before another backslash,
    an escaped byte, or ``x`` and two hex digits from 80), so that no two
    names are listed alike and each listed name, passed back as the SDK
    passes it, leads to its own file (:func:`named`).  A name without
    either is listed as it is.
    """
    if "\\" not in name and not any(_undecodable(c) for c in name):
        return name
    out: list[str] = []
    for i, char in enumerate(name):
        if _undecodable(char):
            out.append(f"\\x{ord(char) - 0xDC00:02x}")
        elif char == "\\":
            rest = name[i + 1 :]
            ambiguous = (
                rest[:1] == "\\"
                or _undecodable(rest[:1])
                or _SPELLS_ESCAPE.match(rest) is not None
            )
            out.append("\\\\" if ambiguous else "\\")
        else:
            out.append(char)
    return "".join(out)


def named(given: str) -> str:
    """
    The name a path given as a listing shows it stands for: ``\\xNN`` (80
    to ff) is that byte, ``\\\\`` one backslash, any other backslash itself.
    """
    if "\\" not in given:
        return given

    def one(match: re.Match[str]) -> str:
        byte = match.group(1)
        return "\\" if byte is None else chr(0xDC00 + int(byte, 16))

    return _ESCAPE.sub(one, given)


class KepRestDoor(PortDoor):
    """
    The REST listener's door.

    :param root: the directory paths are relative to (absolute).
    """

    name = "kep"
    via = gate.Door.KEP
    endpoint_id = access.ENDPOINT

    def __init__(
        self, context: Any, root: str, limits: ConnectionLimits | None = None
    ) -> None:
        super().__init__(context, PROCEDURES, limits)
        self.root = posixpath.normpath(root)
        self.started = time.monotonic()

    def body_cap(self, path: bytes) -> int:
        """A file's route takes ``files_write_raw``'s ``max_bytes``; the rest little."""
        if path == FILES.encode() or path.startswith(FILES.encode() + b"/"):
            limit = self.context.policy.rules["files_write_raw"].limits.max_bytes
            # Multipart framing adds a little to the file bytes.
            return int(limit or 100 * MIB) + MIB
        return KEP_MAX_REQUEST_BYTES

    def find(self, request: Any) -> Procedure | None:
        """A route by method and path (``HEAD`` is ``GET``'s, body left out)."""
        return self._route(request.method, request.path)

    def _route(self, method: bytes, path: bytes) -> Procedure | None:
        verb = method.decode("latin-1")
        if verb == "HEAD":
            verb = "GET"
        where = path.decode("latin-1")
        if where == FILES or where.startswith(FILES + "/"):
            where = FILES
        return self.procedures.get(f"{verb} {where}")

    def check_head(
        self, method: bytes, path: bytes, headers: dict[bytes, list[bytes]]
    ) -> ApiError | None:
        """
        The credential, and the scopes of the door and of the endpoint a
        route is governed as (when the route names one), from the head: a
        body is neither read nor spooled for a caller who would be refused.
        A route that needs no credential (health) is left to its call.
        """
        procedure = self._route(method, path)
        endpoints = [access.ENDPOINT]
        if procedure is not None and isinstance(procedure.endpoint, str):
            if not self.context.table.get(procedure.endpoint).auth_required:
                return None
            endpoints.append(procedure.endpoint)
        return access.check_head(self.context, endpoints, headers)

    def unknown(self, request: Any) -> Procedure:
        """404 for a path the protocol has not, 501 for a method it has not."""
        path = request.path.decode("latin-1", "replace")[:200]
        return Procedure(path, REST, access.ENDPOINT, _unknown)

    def refusal(
        self, error: ApiError, path: str, accept: bytes | None
    ) -> tuple[bytes, bytes, dict[str, str]]:
        """A request the HTTP front refused: the protocol's error."""
        body = _json(error_body(error))
        return b"application/json", body, {**error.headers, **error_headers(error)}

    def error_response(
        self, call: Call, error: ApiError
    ) -> tuple[int, bytes, bytes, dict[str, str]]:
        """The protocol's status and error, sandboxd's code and rule in headers."""
        status = kep_status(error).http
        body = error_body(error)
        body["message"] = self.as_given(body["message"])
        return (
            status,
            b"application/json",
            _json(body),
            {**error.headers, **error_headers(error)},
        )

    def as_given(self, message: str) -> str:
        """
        A message with the paths below the root as the caller gives them
        (relative to it): the handlers name the absolute path they were
        handed, which says where the root is and, with ``--kep-root``
        below the base directory, names paths the caller never used.
        """
        if self.root == "/":
            return message
        return message.replace(self.root + "/", "")

    def admit(self, call: Call, endpoint: Any, spend: bool = True) -> gate.Passed:
        """The gate, a call without credentials standing for ``unauthenticated_as``."""
        return access.admit(self.context, endpoint, call.headers, spend=spend)

    # -- paths ------------------------------------------------------------------

    def target(self, call: Call, follow: bool = True) -> tuple[str, str]:
        """
        The request's ``{path}``: as given (decoded), and as an absolute
        path below the root.

        :param follow: a link in the last component is followed (reads,
            writes); without it the link itself is the entry (deletes).
        :raises ApiError: 400 for a path that holds NUL;
            403 for one that leaves the root, with ``..`` or through a link.
        """
        raw = call.request.path[len(FILES) :].lstrip(b"/")
        # Bytes that are not UTF-8 name the file with those bytes, as the
        # reference daemon takes them; so does the form a listing shows
        # them in, which a client passes back as UTF-8.
        given = named(os.fsdecode(urllib.parse.unquote_to_bytes(raw)))
        if "\x00" in given:
            raise bad_request("the path holds a NUL byte", Code.INVALID_PATH)
        return given, below_root(self.root, given, follow=follow)


def below_root(root: str, given: str, *, follow: bool = True) -> str:
    """
    ``given`` as an absolute path below ``root``, as the protocol reads a
    path: relative to the root whether or not it starts with ``/``, except
    one already under the root, which is taken as it is.  An absolute path
    is cleaned first, so its ``..`` stops at ``/`` (the root), as the
    reference cleans one.

    The root is a boundary for links too: the path's links are resolved
    and what they lead to must stay under the root (a ``--kep-root`` below
    the base directory is not left through a link the path guard, whose
    boundary is the base directory, would follow).  The path returned is
    the lexical one: the guard resolves it again, with every rule.

    :param follow: resolve a link in the last component too (with it off,
        the link itself is what the path names: a delete).
    :raises ApiError: 400 for a name longer than any file system takes
        (before it is quoted anywhere: it is cut in the message); 403 for
        a path that leaves the root, with ``..`` or through a link.
    """
    if len(given) * 4 > NAME_MAX and name_too_long(given):
        raise invalid_path(f"File name too long: {quoted(given)}")
    if given.startswith("/"):
        # normpath keeps a leading "//"; one "/" is what the root is compared to.
        clean = "/" + posixpath.normpath(given).lstrip("/")
        given = clean
        if clean == root or clean.startswith(root.rstrip("/") + "/"):
            given = clean[len(root) :]
    joined = posixpath.normpath(posixpath.join(root, given.lstrip("/")))
    if not _under(joined, root):
        raise forbidden(
            "path traversal outside the sandbox root is forbidden",
            Code.PATH_NOT_ALLOWED,
            rule="kep:root",
        )
    if joined != root and not leads_under(joined, root, follow=follow):
        raise forbidden(
            "the path leads out of the sandbox root through a symbolic link",
            Code.PATH_NOT_ALLOWED,
            rule="kep:root",
        )
    return joined


def _under(path: str, root: str) -> bool:
    return root == "/" or path == root or path.startswith(root + "/")


def leads_under(path: str, root: str, *, follow: bool = True) -> bool:
    """
    Whether ``path`` (absolute, lexically under ``root``) is still under the
    root with its links resolved (a missing part taken as it is named).

    :param follow: resolve a link in the last component too.
    """
    real_root = os.path.realpath(root)
    if follow:
        real = os.path.realpath(path)
    else:
        parent, name = posixpath.split(path)
        real = posixpath.join(os.path.realpath(parent), name)
    return _under(real, real_root)


def _json(value: Any) -> bytes:
    return json.dumps(value).encode()


def _unknown(call: Call, _: Any) -> Any:
    """
    A path the protocol has: 405 with the methods it takes in ``Allow``,
    as the reference's router answers; any other path: 404.
    """
    path = call.request.path.decode("latin-1", "replace")
    if path.startswith(FILES + "/"):
        path = FILES
    allowed = [m for m in ("GET", "PUT", "DELETE") if f"{m} {path}" in PROCEDURES]
    if not allowed:
        raise file_not_found(path[:200])
    if "GET" in allowed:
        allowed.insert(1, "HEAD")
    method = call.request.method.decode("latin-1", "replace")[:20]
    raise method_not_allowed(method, allowed)


def _door(call: Call) -> KepRestDoor:
    return cast(KepRestDoor, call.door)


def _query(call: Call, name: str) -> str | None:
    values = call.request.args.get(name.encode())
    if not values:
        return None
    try:
        return str(values[-1].decode("utf-8"))
    except UnicodeDecodeError:
        raise bad_request(f"the query parameter {name!r} is not UTF-8") from None


# -- GET: a file or a directory -------------------------------------------------


def _read_endpoint(call: Call, _: Any) -> str:
    """
    A directory is listed (``files_list``), anything else read
    (``files_read_raw``): which one is a ``stat`` of the path, before the
    path guard is asked, so that the endpoint the policy governs the call
    as is the one that does the job.  Only the lexical root check has run:
    what this learns (directory or not) is told to nobody but the gate.
    """
    call.endpoint_id = "files_read_raw"
    _, path = _door(call).target(call)
    try:
        is_dir = stat.S_ISDIR(os.stat(path).st_mode)
    except (OSError, ValueError):
        is_dir = False
    return "files_list" if is_dir else "files_read_raw"


def read(call: Call, _: Any) -> Any:
    """``GET``/``HEAD /v1/files/{path}``."""
    given, path = _door(call).target(call)
    if call.passed is not None and call.passed.endpoint.id == "files_list":
        return listing(call, given, path)
    request = call.server_request(query={"path": path})
    raw = call.request
    if _not_modified(call, request, path):
        return NOT_DONE_YET
    if raw.method == b"HEAD":
        return _head(call, request, path)
    request.headers = conditional_headers(call)
    from sandboxd.routes import files as file_routes

    return send_response(call, file_routes.files_read_raw(request))


def _header_time(call: Call, name: str, overridden_by: str) -> float | None:
    """
    A date header as a timestamp; None when absent, unreadable, or when
    ``overridden_by`` (the ETag header that takes its place) is given.
    """
    value = call.header(name)
    if not value or call.header(overridden_by) is not None:
        return None
    try:
        return parsedate_to_datetime(value).timestamp()
    except (TypeError, ValueError):
        return None


def _not_modified(call: Call, request: Any, path: str) -> bool:
    """
    Answer 304 when ``If-Modified-Since`` (without ``If-None-Match``) is
    not older than the file's time in whole seconds, as the reference's
    Go file server does for GET and HEAD; False when it does not apply.

    :raises ApiError: 412 when ``If-Unmodified-Since`` (without
        ``If-Match``) is older than the file, as that server answers.
    """
    since = _header_time(call, "if-modified-since", "if-none-match")
    before = _header_time(call, "if-unmodified-since", "if-match")
    if since is None and before is None:
        return False
    f = PathGuard.for_request(request).open_file(path)
    try:
        mtime, etag = f.stat.st_mtime, f.etag
    finally:
        f.close()
    if before is not None and int(mtime) > before:
        # As Go's file server: the file is newer than the client's copy.
        raise unmet_precondition(f"the file changed after If-Unmodified-Since: {path}")
    if since is None or int(mtime) > since:
        return False
    raw = call.request
    raw.setResponseCode(304)
    call.status = 304
    raw.setHeader(b"last-modified", formatdate(mtime, usegmt=True).encode())
    raw.setHeader(b"etag", etag.encode())
    raw.finish()
    call.done()
    return True


def _head(call: Call, request: Any, path: str) -> Any:
    """A file's head: what ``GET`` would announce, through the same guard."""
    f = PathGuard.for_request(request).open_file(path)
    try:
        st = f.stat
        headers = {
            "content-type": "application/octet-stream",
            "content-length": str(st.st_size),
            "etag": f.etag,
            "last-modified": formatdate(st.st_mtime, usegmt=True),
            "accept-ranges": "bytes",
        }
    finally:
        f.close()
    raw = call.request
    raw.setResponseCode(200)
    for name, value in headers.items():
        raw.setHeader(name.encode(), value.encode())
    raw.finish()
    call.done()
    return NOT_DONE_YET


def rfc3339(ts: float) -> str:
    """Seconds since the epoch as Go's ``time.RFC3339`` in UTC (``...Z``)."""
    return datetime.fromtimestamp(ts, tz=UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def listing(call: Call, given: str, path: str) -> Deferred[Any]:
    """
    A ``DirectoryListing``: one level, sorted by name, a link shown as what
    it leads to (left out when it is broken or leads out of bounds), each
    entry through the guard as ``files_list`` shows it; at most the rule's
    ``max_entries`` (``X-Sandboxd-Truncated`` says when more were left out).
    """
    request = call.server_request(query={"path": path})
    guard = PathGuard.for_request(request)
    cap = (
        request.rule.limits.max_entries or ENDPOINT_LIMITS["files_list"]["max_entries"]
    )
    shown = given if given.startswith("/") else "/" + given
    door_root = _door(call).root
    guard.locate(path, "read", follow=True).close()  # refusals before the thread

    def job() -> tuple[dict[str, Any], bool]:
        entries: list[dict[str, Any]] = []
        truncated = False
        with guard.open_dir(path) as (fd, root):
            for parent, name, st in walk.walk(fd, root, 1):
                full = posixpath.join(parent, name)
                if not walk.visible(guard, full, st):
                    continue
                if stat.S_ISLNK(st.st_mode):
                    try:
                        st = os.stat(name, dir_fd=fd)
                    except OSError:
                        continue  # broken
                    if not leads_under(full, door_root):
                        continue  # out of the door's root
                if len(entries) >= cap:
                    truncated = True
                    break
                entries.append(
                    {
                        "name": listed_name(name),
                        "size": st.st_size,
                        "type": "directory" if stat.S_ISDIR(st.st_mode) else "file",
                        "modified_at": rfc3339(st.st_mtime),
                        "mode": f"{stat.S_IMODE(st.st_mode) & 0o777:04o}",
                    }
                )
        return {"path": listed_name(shown), "entries": entries}, truncated

    def answer(result: tuple[dict[str, Any], bool]) -> dict[str, Any]:
        if result[1]:
            call.request.setHeader(b"x-sandboxd-truncated", b"true")
        return result[0]

    listed: Deferred[Any] = call.context.in_thread(job)
    return listed.addCallback(answer)


# -- PUT ----------------------------------------------------------------------------


def _mode(call: Call) -> int:
    raw = _query(call, "mode")
    if raw is None or raw == "":
        return 0o644
    if not _MODE.match(raw):
        raise bad_request(f"mode {raw[:20]!r} must match ^0[0-7]{{3}}$")
    return int(raw, 8)


def write(call: Call, _: Any) -> Deferred[Any]:
    """
    ``PUT /v1/files/{path}``: the raw body, or the ``file`` part of a
    multipart one, written atomically (temporary file, then rename) with
    ``files_write_raw``'s rules, parents made; 204.  Every refusal comes
    before the first byte is written, and the body was received whole
    before the call ran at all.
    """
    from sandboxd.routes import files as file_routes

    mode = _mode(call)
    given, path = _door(call).target(call)
    content_type = call.header("content-type") or ""
    kind = content_type.split(";", 1)[0].strip().lower()
    boundary = (
        multipart.boundary_of(content_type) if kind == "multipart/form-data" else None
    )
    request = call.server_request(query={"path": path})
    guard = PathGuard.for_request(request)
    cap = file_routes.max_bytes(request)
    rule = call.rule.source("limits.max_bytes") or "default:limits.max_bytes"
    content = call.request.content
    guard.check(path, "write")
    file_routes.check_extension(request, path)

    def job() -> int:
        body, release = multipart.body_buffer(content)
        try:
            data: Any = memoryview(body)
            if boundary is not None:
                parts = multipart.split_multipart(boundary, body, KEP_MAX_UPLOAD_PARTS)
                found = [view for field, _, view in parts if field == "file"]
                if not found:
                    raise bad_request("the multipart body has no 'file' part")
                data = found[0]
            try:
                if len(data) > cap:
                    raise payload_too_large(cap, f"{given}: the file", rule=rule)
                st = _stat(path)
                if st is not None and stat.S_ISDIR(st.st_mode):
                    raise bad_request("the target path is a directory")
                file_routes.write_bytes(
                    request, guard, path, cast(bytes, data), True, None, mode=mode
                )
            finally:
                data.release()
        finally:
            release()
        return 204

    written: Deferred[Any] = call.context.in_thread(job)
    return written


def _stat(path: str) -> os.stat_result | None:
    try:
        return os.stat(path)
    except OSError:
        return None


# -- DELETE ---------------------------------------------------------------------------


def _recursive(call: Call) -> bool:
    raw = _query(call, "recursive")
    if raw is None or raw == "":
        return False
    if raw in _TRUE:
        return True
    if raw in _FALSE:
        return False
    raise bad_request(f"recursive {raw[:20]!r} must be a boolean")


def _not_empty(path: str) -> ApiError:
    return directory_not_empty(
        f"the directory is not empty: {path}; pass recursive=true to remove it"
    )


def remove(call: Call, _: Any) -> Deferred[Any]:
    """
    ``DELETE /v1/files/{path}``: a file, a link, an empty directory, or
    with ``recursive`` a whole tree (``files_delete``'s own checks: what the
    policy protects inside, mounts); the root itself is emptied, never
    removed.
    """
    try:
        recursive, malformed = _recursive(call), None
    except ApiError as e:
        recursive, malformed = False, e
    given, path = _door(call).target(call, follow=False)
    door = _door(call)
    request = call.server_request(query={"path": path})
    guard = PathGuard.for_request(request)

    def job() -> int:
        if malformed is not None:
            # As the reference: a path that is not there is 404 before
            # ``recursive`` is read (the guard's refusals come first).
            if path != door.root:
                with guard.locate(path, "delete") as loc:
                    if loc.lstat() is None:
                        raise file_not_found(given)
            raise malformed
        if path == door.root:
            if not recursive:
                raise directory_not_empty(
                    "cannot delete the sandbox root; pass recursive=true to clear "
                    "its contents"
                )
            with guard.open_dir(path) as (fd, root):
                names = [name for _, name, _ in walk.walk(fd, root, 1)]
            for name in names:
                walk.delete(guard, posixpath.join(path, name))
            return 204
        if not recursive:
            with guard.locate(path, "delete", follow=False, missing_ok=False) as loc:
                walk.refuse_root(loc, "delete", given)
                st = loc.lstat()
                if st is None:
                    raise file_not_found(given)
                if stat.S_ISDIR(st.st_mode):
                    try:
                        os.rmdir(loc.name, dir_fd=loc.dir_fd)
                    except OSError as e:
                        if e.errno in (errno.ENOTEMPTY, errno.EEXIST):
                            raise _not_empty(given) from None
                        raise os_error(e, given) from None
                    return 204
        walk.delete(guard, path)
        return 204

    removed: Deferred[Any] = call.context.in_thread(job)
    return removed


# -- health and metadata --------------------------------------------------------------


def health(call: Call, _: Any) -> dict[str, Any]:
    """``GET /v1/health``: ok and the uptime, 503 ``UNAVAILABLE`` while stopping."""
    if getattr(call.context, "draining", False):
        raise unavailable("sandboxd is shutting down")
    return {
        "status": "ok",
        "uptime_seconds": int(time.monotonic() - _door(call).started),
    }


def sensitive(name: str) -> bool:
    """Whether a variable's name looks like a credential's (the reference's rule)."""
    upper = name.upper()
    return any(marker in upper for marker in SENSITIVE_MARKERS)


def metadata(call: Call, _: Any) -> dict[str, Any]:
    """
    ``GET /v1/metadata``: the ``SANDBOX_`` variables of ``env_get``'s answer
    (its redaction first: secrets, ``env_deny``), without any whose name
    looks like a credential's.
    """
    from sandboxd.routes import system as system_routes

    answer = system_routes.env_get(call.server_request())
    variables: dict[str, str] = answer["variables"]
    env = {
        name: value
        for name, value in variables.items()
        if name.startswith(METADATA_PREFIX) and not sensitive(name)
    }
    return {"env": env}


PROCEDURES = {
    "GET /v1/files": Procedure("GET /v1/files", REST, _read_endpoint, read),
    "PUT /v1/files": Procedure("PUT /v1/files", REST, "files_write_raw", write),
    "DELETE /v1/files": Procedure("DELETE /v1/files", REST, "files_delete", remove),
    "GET /v1/health": Procedure("GET /v1/health", REST, "health", health),
    "GET /v1/metadata": Procedure("GET /v1/metadata", REST, "env_get", metadata),
}

__all__ = ["PROCEDURES", "KepRestDoor", "rfc3339", "sensitive"]
