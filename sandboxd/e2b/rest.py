# -*- test-case-name: tests.e2b.test_sdk -*-
"""
envd's REST routes (``envd.yaml``): ``GET /health`` (204), ``GET /files``
(the file's bytes), ``POST /files`` (one or several files, multipart or
octet-stream) and ``GET /envs``.

Downloads are ``files_read_raw``'s own response (the same producer and
``sendfile`` path); uploads are checked whole (every path through the
guard, every extension rule) before the first byte is written, then each
file is written atomically by ``files_write_raw``'s rules, so a refused
upload writes nothing.  Errors are envd's ``{"code", "message"}`` with the
HTTP status, the message carrying sandboxd's §6 code and rule.
"""

from __future__ import annotations

import email.parser
import email.policy
import posixpath
from typing import Any

from twisted.internet.defer import Deferred
from twisted.web.server import NOT_DONE_YET

from sandboxd.e2b.door import REST, Call, Procedure
from sandboxd.errors import ApiError, Code, bad_request, unsupported
from sandboxd.guard import PathGuard
from sandboxd.policy.defaults import E2B_MAX_UPLOAD_FILES
from sandboxd.routes import files as file_routes
from sandboxd.routes import system as system_routes
from sandboxd.web.messages import StreamResponse


def _query(call: Call, name: str) -> str | None:
    values = call.request.args.get(name.encode())
    if not values:
        return None
    if len(values) > 1:
        raise ApiError(
            400,
            f"the query parameter {name!r} is given more than once",
            "ValueError",
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
    headers = {
        name.decode("latin-1").lower(): values[-1].decode("latin-1")
        for name, values in call.headers.items()
        if name in (b"range", b"if-none-match", b"if-range")
    }
    request = call.server_request(query={"path": path})
    request.headers = headers
    response = file_routes.files_read_raw(request)
    raw = call.request
    if not isinstance(response, StreamResponse):
        # 304 (If-None-Match): status and headers only.
        raw.setResponseCode(response.status)
        for name, value in response.headers.items():
            raw.setHeader(name.encode(), value.encode())
        call.status = response.status
        raw.finish()
        call.done()
        return NOT_DONE_YET
    raw.setResponseCode(response.status)
    call.status = response.status
    for name, value in response.headers.items():
        raw.setHeader(name.encode(), value.encode())
    raw.setHeader(b"content-disposition", b"attachment")

    def sent(count: int) -> None:
        call.bytes_out = count
        if not call.closed:
            raw.finish()
        call.done()

    def failed(_: Any) -> None:
        # The length was announced: cut the connection so the client sees it.
        if not call.closed:
            raw.channel.transport.abortConnection()
        call.done()

    response.write_to(raw).addCallbacks(sent, failed)
    return NOT_DONE_YET


# -- uploads ----------------------------------------------------------------------


def _parts(content_type: str, body: bytes) -> list[tuple[str | None, bytes]]:
    """The ``(filename, bytes)`` of every file part of a multipart body."""
    head = f"Content-Type: {content_type}\r\nMIME-Version: 1.0\r\n\r\n".encode()
    message = email.parser.BytesParser(policy=email.policy.HTTP).parsebytes(head + body)
    if not message.is_multipart():
        raise bad_request("the multipart body has no parts")
    out: list[tuple[str | None, bytes]] = []
    for part in message.iter_parts():
        payload = part.get_payload(decode=True)
        if payload is None:
            payload = b""
        out.append((part.get_filename(), bytes(payload)))
        if len(out) > E2B_MAX_UPLOAD_FILES:
            raise ApiError(
                413,
                f"at most {E2B_MAX_UPLOAD_FILES} files per upload",
                "ValueError",
                Code.PAYLOAD_TOO_LARGE,
                limit=E2B_MAX_UPLOAD_FILES,
            )
    return out


def upload(call: Call, _: Any) -> Deferred[Any]:
    """
    ``POST /files?path=``: write one file (octet-stream, or multipart with
    ``path``) or several (multipart, each part's file name its path).
    """
    content_type = getattr(call.request, "e2b_content_type", None) or ""
    kind = content_type.split(";", 1)[0].strip().lower()
    encoding = call.header("content-encoding")
    if encoding and encoding.lower() != "identity":
        raise unsupported(f"Content-Encoding {encoding!r} is not accepted")
    path = _query(call, "path")
    body = call.request.content.read()
    files: list[tuple[str, bytes]] = []
    if kind == "application/octet-stream":
        if not path:
            raise bad_request("'path' is required with application/octet-stream")
        files.append((path, body))
    elif kind == "multipart/form-data":
        parts = _parts(content_type, body)
        if path is not None and len(parts) == 1:
            files.append((path, parts[0][1]))
        else:
            for name, data in parts:
                if not name:
                    raise bad_request("every file part needs a file name (its path)")
                files.append((name, data))
    else:
        raise bad_request(
            "the body must be multipart/form-data or application/octet-stream"
        )
    if not files:
        raise bad_request("no file in the upload")
    request = call.server_request()
    guard = PathGuard(call.rule)
    cap = file_routes.max_bytes(request)
    for target, data in files:
        # Every refusal before the first write: a refused upload writes nothing.
        file_routes.check_extension(request, target)
        guard.check(target, "write")
        if len(data) > cap:
            raise ApiError(
                413,
                f"{target}: the file is over the limit of {cap} bytes",
                "ValueError",
                Code.PAYLOAD_TOO_LARGE,
                limit=cap,
                rule=call.rule.source("limits.max_bytes") or "default:limits.max_bytes",
            )

    def write_all() -> list[dict[str, Any]]:
        written = []
        for target, data in files:
            result = file_routes.write_bytes(request, guard, target, data, True, None)
            written.append(
                {
                    "name": posixpath.basename(result["path"]),
                    "type": "file",
                    "path": result["path"],
                }
            )
        return written

    written: Deferred[Any] = call.context.in_thread(write_all)
    return written


PROCEDURES = {
    "GET /health": Procedure("GET /health", REST, "health", health),
    "GET /envs": Procedure("GET /envs", REST, "env_get", envs),
    "GET /files": Procedure("GET /files", REST, "files_read_raw", download),
    "POST /files": Procedure("POST /files", REST, "files_write_raw", upload),
}
