# -*- test-case-name: tests.e2b.test_sdk -*-
"""
envd's REST routes (``envd.yaml``): ``GET /health`` (204), ``GET /files``
(the file's bytes), ``POST /files`` (one or several files, multipart or
octet-stream) and ``GET /envs``.

Downloads are ``files_read_raw``'s own response (the same producer and
``sendfile`` path); uploads are checked whole (every path through the
guard, every extension rule) before the first byte is written, then each
file is written atomically by ``files_write_raw``'s rules, and a file that
fails on the way (a full disk) takes back those written before it, so a
refused upload writes nothing.  Errors are envd's ``{"code", "message"}`` with the
HTTP status, the message carrying sandboxd's §6 code and rule.
"""

from __future__ import annotations

import posixpath
import stat
from typing import Any, cast

from twisted.internet.defer import Deferred

from sandboxd.access.guard import PathGuard
from sandboxd.e2b.door import REST, Call, Procedure
from sandboxd.errors import (
    ApiError,
    Code,
    bad_request,
    payload_too_large,
    unsupported,
)
from sandboxd.files.atomic import Undo
from sandboxd.policy.defaults import E2B_MAX_UPLOAD_FILES
from sandboxd.routes import files as file_routes
from sandboxd.routes import system as system_routes
from sandboxd.web import multipart
from sandboxd.web.portdoor import conditional_headers, send_response


def _query(call: Call, name: str) -> str | None:
    values = call.request.args.get(name.encode())
    if not values:
        return None
    if len(values) > 1:
        raise bad_request(
            f"the query parameter {name!r} is given more than once",
            Code.DUPLICATE_PARAMETER,
        )
    try:
        return str(values[0].decode("utf-8"))
    except UnicodeDecodeError:
        raise bad_request(f"the query parameter {name!r} is not UTF-8") from None


def health(call: Call, _: Any) -> int:
    """``GET /health``: 204, as envd answers."""
    return 204


def envs(call: Call, _: Any) -> dict[str, str]:
    """``GET /envs``: the environment children inherit, secrets redacted."""
    answer = system_routes.env_get(call.server_request())
    variables: dict[str, str] = answer["variables"]
    return variables


def download(call: Call, _: Any) -> Any:
    """``GET /files?path=``: the bytes, by ``files_read_raw``'s response."""
    path = _query(call, "path")
    if not path:
        raise bad_request("'path' is required")
    path = call.expand(path, _query(call, "username") or call.user())
    request = call.server_request(query={"path": path})
    request.headers = conditional_headers(call)
    response = file_routes.files_read_raw(request)
    return send_response(call, response, {b"content-disposition": b"attachment"})


# -- uploads ----------------------------------------------------------------------


def _boundary(content_type: str) -> bytes:
    return multipart.boundary_of(content_type)


def split_multipart(boundary: bytes, body: Any) -> list[tuple[str | None, memoryview]]:
    """
    The ``(file name, bytes)`` of each part of a multipart body
    (:func:`sandboxd.web.multipart.split_multipart`), at most
    :data:`E2B_MAX_UPLOAD_FILES` parts (413 past them).
    """
    parts = multipart.split_multipart(boundary, body, E2B_MAX_UPLOAD_FILES)
    return [(name, data) for _, name, data in parts]


_body_buffer = multipart.body_buffer


def _refuse_special(guard: PathGuard, target: str) -> None:
    """
    Refuse to write over a named pipe or a socket, as ``files.read``
    refuses to read one: the write replaces the file whole, and a program
    reading the pipe would be left with nothing.

    :raises ApiError: 400 ``invalid_param``.
    """
    try:
        with guard.locate(target, "write", follow=True) as loc:
            st = loc.lstat()
    except ApiError:
        return  # the write itself answers what is wrong with the path
    if st is not None and (stat.S_ISFIFO(st.st_mode) or stat.S_ISSOCK(st.st_mode)):
        raise bad_request(f"Not a regular file: {target}")


def upload(call: Call, _: Any) -> Deferred[Any]:
    """
    ``POST /files?path=``: write one file (octet-stream, or multipart with
    ``path``) or several (multipart, each part's file name its path).

    The body is parsed and every path checked, on a worker thread, before
    the first file is written.
    """
    content_type = call.header("content-type") or ""
    kind = content_type.split(";", 1)[0].strip().lower()
    encoding = call.header("content-encoding")
    if encoding and encoding.lower() != "identity":
        raise unsupported(f"Content-Encoding {encoding!r} is not accepted")
    metadata = sorted(
        name.decode("latin-1")
        for name in call.headers
        if name.lower().startswith(b"x-metadata-")
    )
    if metadata:
        # Refused as gzip is, not written without it: code that sets
        # metadata means to read it back.
        raise unsupported(
            f"file metadata ({metadata[0][:100]}) is not kept on this port: "
            "write the file without metadata="
        )
    path = _query(call, "path")
    if kind == "application/octet-stream":
        if not path:
            raise bad_request("'path' is required with application/octet-stream")
        boundary = None
    elif kind == "multipart/form-data":
        boundary = _boundary(content_type)
    else:
        raise bad_request(
            "the body must be multipart/form-data or application/octet-stream"
        )
    # On a root daemon the files belong to the call's user (envd's
    # ``username``, else its Basic user, else ``params.default_user``).
    user = _query(call, "username") or call.user()
    request = call.server_request(body={"user": user})
    guard = PathGuard.for_request(request)
    cap = file_routes.max_bytes(request)
    rule = call.rule.source("limits.max_bytes") or "default:limits.max_bytes"
    content = call.request.content

    def job() -> list[dict[str, Any]]:
        body, release = _body_buffer(content)
        try:
            files = _files(body)
            try:
                return _write(files)
            finally:
                for _, data in files:
                    data.release()
        finally:
            release()

    def _files(body: Any) -> list[tuple[str, memoryview]]:
        files: list[tuple[str, memoryview]] = []
        if boundary is None:
            assert path is not None
            files.append((call.expand(path, user), memoryview(body)))
            return files
        parts = split_multipart(boundary, body)
        if path is not None and len(parts) == 1:
            files.append((call.expand(path, user), parts[0][1]))
        else:
            for name, data in parts:
                if not name:
                    raise bad_request("every file part needs a file name (its path)")
                files.append((call.expand(name, user), data))
        if not files:
            raise bad_request("no file in the upload")
        return files

    def _write(files: list[tuple[str, memoryview]]) -> list[dict[str, Any]]:
        for target, data in files:
            # Every refusal before the first write: a refused upload writes nothing.
            guard.check(target, "write")
            _refuse_special(guard, target)
            file_routes.check_extension(request, target)
            if len(data) > cap:
                raise payload_too_large(cap, f"{target}: the file", rule=rule)
        written = []
        # All or nothing: a file that fails (a full disk) takes back the
        # ones written before it, old contents and all.
        undo = Undo(guard) if len(files) > 1 else None
        try:
            for target, data in files:
                result = file_routes.write_bytes(
                    request, guard, target, cast(bytes, data), True, None, undo=undo
                )
                written.append(
                    {
                        "name": posixpath.basename(result["path"]),
                        "type": "file",
                        "path": result["path"],
                    }
                )
        except BaseException:
            if undo is not None:
                undo.run()
            raise
        if undo is not None:
            undo.forget()
        return written

    written: Deferred[Any] = call.context.in_thread(job)
    return written


PROCEDURES = {
    "GET /health": Procedure("GET /health", REST, "health", health),
    "GET /envs": Procedure("GET /envs", REST, "env_get", envs),
    "GET /files": Procedure("GET /files", REST, "files_read_raw", download),
    "POST /files": Procedure("POST /files", REST, "files_write_raw", upload),
}
