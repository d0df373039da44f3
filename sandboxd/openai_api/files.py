# -*- test-case-name: tests.openai_api.test_files -*-
"""
``client.files`` on the ``/v1`` door: a caller's files, stored under the
state directory (:mod:`.blobs`), for environments and templates to stage
into a workspace (``{type: file_id}``).

The seed serves only the create; the list, retrieve, content and delete
OpenAI's SDK also calls are served too, so a caller can see and free what
its quota holds.  A create takes OpenAI's multipart form (``file`` and
``purpose``) or the seed's JSON (``{purpose, filename?, data | file}``,
base64; a form's ``filename`` field names the file over its part's
file name, as the seed's does), is bounded per file (``limits.max_bytes``) and per identity
(``limits.max_files`` files, :data:`~sandboxd.policy.defaults.OPENAI_FILES_TOTAL_BYTES`),
and leaves nothing behind when refused.
"""

from __future__ import annotations

import binascii
import email.parser
import email.policy
import posixpath
import urllib.parse
from typing import Any

import pybase64

from sandboxd.errors import (
    bad_request,
    limit_setting,
    not_found,
    payload_too_large,
)
from sandboxd.openai_api.inputs import known_keys
from sandboxd.openai_api.registry import labelled, owner_of, page
from sandboxd.openai_api.stores import room_for_one, stores
from sandboxd.policy import defaults
from sandboxd.web.jsonbody import parse_object
from sandboxd.web.messages import ServerRequest, ServerResponse

#: The one purpose a file has here (as the seed's).
PURPOSE = "user_data"


class BodySink:
    """The create's body, kept whole (the pipeline caps its size)."""

    def __init__(self, request: ServerRequest) -> None:
        self.data = bytearray()

    def write(self, data: bytes) -> None:
        """Keep a chunk."""
        self.data += data

    def finish(self) -> bytes:
        """The whole body."""
        return bytes(self.data)

    def abort(self) -> None:
        """Let the bytes go."""
        self.data = bytearray()


def _filename(value: Any) -> str:
    """A file's name as shown: its last path component, bounded."""
    if value is None:
        return "upload"
    if not isinstance(value, str) or "\x00" in value:
        raise bad_request("filename must be a string", param="filename")
    # A backslash is a legal character of a POSIX name, not a separator.
    name = posixpath.basename(value) or "upload"
    if len(name) > defaults.OPENAI_MAX_FILENAME_CHARS:
        raise bad_request(
            f"filename is longer than {defaults.OPENAI_MAX_FILENAME_CHARS} characters",
            param="filename",
        )
    return name


def attachment(name: str, fallback: str) -> str:
    """
    A ``Content-Disposition`` for a download named ``name`` (RFC 6266):
    ``filename`` in printable ASCII for old clients (``_`` for each other
    character, and for ``"`` and ``\\``, which a quoted string would need
    escaped and some clients read as a path), and, when that is not the
    name, ``filename*`` with the name whole in UTF-8 (RFC 8187), which
    browsers and HTTP libraries prefer.
    """
    plain = "".join(c if " " <= c <= "~" and c not in '"\\' else "_" for c in name)
    plain = plain or fallback
    if plain == name:
        return f'attachment; filename="{plain}"'
    whole = urllib.parse.quote(name, safe="")
    return f"attachment; filename=\"{plain}\"; filename*=UTF-8''{whole}"


def _multipart(content_type: str, body: bytes) -> tuple[str, str, bytes]:
    """``(filename, purpose, bytes)`` of OpenAI's multipart form."""
    message = email.parser.BytesParser(policy=email.policy.HTTP).parsebytes(
        b"Content-Type: " + content_type.encode("latin-1") + b"\r\n\r\n" + body
    )
    if not message.is_multipart():
        raise bad_request("the body is not a multipart form")
    fields: dict[str, tuple[str | None, bytes]] = {}
    for part in message.iter_parts():
        name = part.get_param("name", header="content-disposition")
        if not isinstance(name, str):
            raise bad_request("a form part has no name")
        if name in fields:
            raise bad_request(f"{name}: given twice", param=name)
        payload = part.get_payload(decode=True)
        fields[name] = (
            part.get_filename(),
            payload if isinstance(payload, bytes) else b"",
        )
    known_keys(fields, ("file", "purpose", "filename"))
    if "file" not in fields:
        raise bad_request("file is required", param="file")
    filename, data = fields["file"]
    if "filename" in fields:
        # A filename field names the file over its part's (as the seed's form).
        filename = _text(fields["filename"][1], "filename")
    purpose = _text(fields.get("purpose", (None, b""))[1], "purpose")
    return _filename(filename), purpose, data


def _text(value: bytes, param: str) -> str:
    """A text field of the form."""
    try:
        return value.decode("utf-8")
    except UnicodeDecodeError:
        raise bad_request(f"{param} must be UTF-8 text", param=param) from None


def _json(body: bytes) -> tuple[str, str, bytes]:
    """``(filename, purpose, bytes)`` of the seed's JSON form."""
    fields = parse_object(body)
    known_keys(fields, ("purpose", "filename", "data", "file"))
    if ("data" in fields) == ("file" in fields):
        raise bad_request("give the bytes as data or file (base64), once", param="data")
    encoded = fields.get("data", fields.get("file"))
    if not isinstance(encoded, str):
        raise bad_request("data must be a base64 string", param="data")
    try:
        data = pybase64.b64decode(encoded, validate=True)
    except (binascii.Error, ValueError):
        raise bad_request("data is not valid base64", param="data") from None
    purpose = fields.get("purpose")
    return _filename(fields.get("filename")), str(purpose or ""), data


def parse_upload(content_type: str, body: bytes) -> tuple[str, str, bytes]:
    """
    ``(filename, purpose, bytes)`` of a create's body, multipart or JSON.

    :raises ApiError: 400 for anything else.
    """
    kind = content_type.split(";", 1)[0].strip().lower()
    if kind == "multipart/form-data":
        return _multipart(content_type, body)
    if kind in ("application/json", ""):
        return _json(body)
    raise bad_request("the body must be multipart/form-data or application/json")


def describe(record: dict[str, Any]) -> dict[str, Any]:
    """OpenAI's ``file`` object."""
    return {
        "id": record["id"],
        "object": "file",
        "bytes": record["bytes"],
        "created_at": record["created_at"],
        "filename": record["filename"],
        "purpose": record["purpose"],
        "status": "processed",
        "status_details": None,
        "expires_at": None,
    }


async def find(request: ServerRequest, file_id: str, param: str) -> dict[str, Any]:
    """The caller's file ``file_id``, or 404."""
    store = stores(request).files
    await store.ready(request.context.in_thread)
    record = store.find(owner_of(request), file_id)
    if record is None:
        raise not_found(f"No file found with id {file_id!r}", param=param)
    return record


async def read(request: ServerRequest, file_id: str, param: str) -> bytes:
    """The bytes of the caller's file ``file_id`` (404 when unknown)."""
    record = await find(request, file_id, param)
    return await stores(request).files.read(request.context.in_thread, record)


async def agents_files_create(request: ServerRequest) -> dict[str, Any]:
    """Store a file (within the caller's quota); nothing is kept when refused."""
    body: bytes = request.sink_result or b""
    filename, purpose, data = await request.context.in_thread(
        parse_upload, request.headers.get("content-type", ""), body
    )
    if purpose != PURPOSE:
        raise bad_request(
            f"purpose must be {PURPOSE!r} (files here are staged into workspaces)",
            param="purpose",
        )
    limit = request.rule.limits.max_bytes or defaults.OPENAI_FILE_BYTES
    if len(data) > limit:
        raise payload_too_large(
            limit,
            "the file",
            setting=limit_setting(request.endpoint.id, "max_bytes"),
        )
    store = stores(request).files
    await store.ready(request.context.in_thread)
    owner = owner_of(request)
    count, size = store.usage(owner)
    most = request.rule.limits.max_files or 1000
    room_for_one(
        count,
        most,
        "files",
        param="file",
        setting=limit_setting(request.endpoint.id, "max_files"),
    )
    total = defaults.OPENAI_FILES_TOTAL_BYTES
    if size + len(data) > total:
        raise payload_too_large(
            total,
            message=f"your files would hold more than {total} bytes; delete some first",
        )
    record = await store.add(request.context.in_thread, owner, filename, purpose, data)
    return describe(record)


async def agents_files_list(request: ServerRequest) -> dict[str, Any]:
    """The caller's files."""
    purpose = request.query.get("purpose")
    store = stores(request).files
    await store.ready(request.context.in_thread)
    mine = [
        describe(r)
        for r in store.records.values()
        if r["owner"] == owner_of(request) and purpose in (None, r["purpose"])
    ]
    return page(request, mine)


async def agents_files_get(request: ServerRequest) -> dict[str, Any]:
    """One file's object."""
    return describe(await find(request, request.path_params["file_id"], "file_id"))


async def agents_files_content(request: ServerRequest) -> ServerResponse:
    """One file's bytes, as an attachment never rendered by a browser."""
    record = await find(request, request.path_params["file_id"], "file_id")
    data = await stores(request).files.read(request.context.in_thread, record)
    return ServerResponse(
        raw=data,
        headers={
            "content-type": "application/octet-stream",
            "content-disposition": attachment(record["filename"], "upload"),
            "x-content-type-options": "nosniff",
            "cache-control": "no-store",
        },
    )


async def agents_files_delete(request: ServerRequest) -> dict[str, Any]:
    """Forget a file and remove its bytes."""
    record = await find(request, request.path_params["file_id"], "file_id")
    await stores(request).files.remove(request.context.in_thread, record)
    return {"id": record["id"], "object": "file", "deleted": True}


HANDLERS: dict[str, Any] = labelled(
    {
        "agents_files_create": agents_files_create,
        "agents_files_list": agents_files_list,
        "agents_files_get": agents_files_get,
        "agents_files_content": agents_files_content,
        "agents_files_delete": agents_files_delete,
    }
)
SINKS: dict[str, Any] = {"agents_files_create": BodySink}
