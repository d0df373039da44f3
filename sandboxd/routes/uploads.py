# -*- test-case-name: tests.routes.test_uploads -*-
"""
Handlers of the resumable uploads of the ``file_ops`` group.

``POST /files/uploads`` refuses whatever can be refused (the guard, the
size, an existing file, a bad mode, ``If-Match``) and creates the staging
file; ``POST /files/uploads/{upload_id}?offset=N`` appends its raw body,
streamed through the same writer as ``POST /files/raw``, and renames the
file into place once ``size`` bytes are in; ``GET`` says where an upload
stands and ``DELETE`` drops it.  The upload table is
:class:`sandboxd.files.uploads.UploadTable`.
"""

from __future__ import annotations

import os
from typing import Any

from twisted.internet.defer import Deferred
from twisted.python.failure import Failure

from sandboxd.access.guard import refusal
from sandboxd.errors import (
    ApiError,
    Code,
    bad_request,
    limit_exceeded,
    limit_rule,
    limit_setting,
    not_found,
    payload_too_large,
)
from sandboxd.files.atomic import parse_mode
from sandboxd.files.uploads import Upload, UploadTable
from sandboxd.policy.defaults import ENDPOINT_LIMITS, identity_cap
from sandboxd.policy.paths import PathDecision, decide
from sandboxd.routes.files import (
    atomic_writer,
    hashed_write,
    if_match_of,
    max_bytes,
)
from sandboxd.web.messages import ServerRequest, ServerResponse
from sandboxd.web.params import flag, integer, required, string

_DEFAULTS = ENDPOINT_LIMITS["files_uploads_create"]


def _table(request: ServerRequest) -> UploadTable:
    table = request.context.uploads
    if table is None:  # a context built without the groups' services
        raise bad_request("uploads are not set up on this daemon")
    return table.get()


def _owner(request: ServerRequest) -> str:
    """
    Who an upload belongs to: the token identity that created it, or that
    minted the link that did (its share is the minter's, and the minter may
    carry the upload on or drop it).
    """
    return request.identity.root if request.identity is not None else ""


def _upload(request: ServerRequest) -> Upload:
    upload_id = request.path_params["upload_id"]
    return _table(request).get(_owner(request), upload_id)


def files_uploads_create(request: ServerRequest) -> Any:
    """``POST /files/uploads``: every refusal here, then the staging file."""
    body = request.body
    path = required(string(body.get("path"), "path", None), "path")
    size = integer(body.get("size"), "size", low=0)
    overwrite = flag(body.get("overwrite", True), "overwrite", words=False)
    mode = parse_mode(body.get("mode"))
    cap = max_bytes(request)
    if size > cap:
        raise payload_too_large(
            cap,
            "the upload's size",
            setting=limit_setting(request.endpoint.id, "max_bytes"),
        )
    table = _table(request)
    rule = request.rule
    limit = rule.limits.max_sessions or _DEFAULTS["max_sessions"]
    mine = identity_cap(
        limit, len(request.context.policy.tokens.ids()), rule.limits.max_per_identity
    )
    table.check_room(
        limit,
        limit_rule(rule, "max_sessions"),
        _owner(request),
        mine,
        limit_rule(rule, "max_per_identity"),
    )
    idle = rule.limits.idle_timeout_seconds or _DEFAULTS["idle_timeout_seconds"]
    writer = atomic_writer(request, path, overwrite, mode, if_match_of(request))
    if writer.named:
        # A file system without unnamed files: the staging file has its name
        # from the start, and a crash would leave it beside the target.
        request.context.scratch.staging(
            os.path.join(os.path.dirname(writer.path), writer.tmp_name)
        )
    upload = table.create(_owner(request), writer, size, path, float(idle))
    request.audit["upload_id"] = upload.id
    return ServerResponse(status=201, body=upload.record())


def files_uploads_list(request: ServerRequest) -> Any:
    """
    ``GET /files/uploads``: the caller's own open uploads, so that a client
    that lost its upload ids (it crashed) can carry one on or drop it when
    the table is full.
    """
    table = _table(request)
    return {"uploads": [u.record() for u in table.mine(_owner(request))]}


def files_uploads_get(request: ServerRequest) -> Any:
    """``GET /files/uploads/{upload_id}``: the record with the current offset."""
    return _upload(request).record()


def files_uploads_delete(request: ServerRequest) -> Any:
    """``DELETE /files/uploads/{upload_id}``: staging file removed."""
    upload = _upload(request)
    _table(request).drop(upload)
    return {"upload_id": upload.id, "deleted": True}


def files_uploads_append(request: ServerRequest) -> Any:
    """``POST /files/uploads/{upload_id}``: the sink has written (and renamed)."""
    return request.sink_result


def _declared_length(request: ServerRequest) -> int:
    raw = request.headers.get("content-length")
    # Twisted has parsed it already (a bad one never gets here); the
    # pipeline refuses Transfer-Encoding, so no header is an empty body.
    return int(raw) if raw and raw.strip().isdigit() else 0


def _offset_mismatch(upload: Upload, offset: int) -> ApiError:
    """
    400 ``invalid_param``: the append does not start where the upload
    stands.  The current offset is in the body, so a client carries on
    from there without asking (SPEC §6 pairs ``invalid_param`` with 400).
    """
    return bad_request(
        f"the upload is at offset {upload.offset}, not {offset}: "
        f"send from {upload.offset}",
        offset=upload.offset,
        upload_id=upload.id,
    )


#: The endpoints whose current rule must still allow an upload's target.
_DECIDING = ("files_uploads_create", "files_uploads_append")


def _still_allowed(context: Any, upload: Upload) -> None:
    """
    The upload's target decided again under the policy in force now (a
    reload may have denied it since the create): the ``paths`` rules of
    the create and append endpoints, as the guard decides a write.

    A refusal leaves the upload as it is (nothing the caller did not ask
    to drop is dropped): a policy that allows the path again lets it
    finish, ``DELETE`` or the idle expiry removes it.

    :raises ApiError: 403 with the guard's code and rule.
    """
    for endpoint in _DECIDING:
        d = decide(context.policy.rule(endpoint), upload.path, "write")
        if not d.allowed:
            raise refusal(PathDecision(upload.display, False, d.code, d.rule))


class AppendSink:
    """
    One append's body, written to the staging file as it arrives.

    Refused at header time (nothing read, nothing written) when ``offset``
    is not the upload's, when it would run past ``size``, while another
    append runs, or when the policy in force no longer allows the target
    (:func:`_still_allowed`).  Bytes that arrived are kept when the
    connection is cut: once they are written, ``offset`` counts them.  The
    target is decided once more before the rename: a refusal there keeps
    the bytes (counted) and the upload, and renames nothing.
    """

    def __init__(self, request: ServerRequest) -> None:
        table = _table(request)
        upload = _upload(request)
        offset = integer(request.query.get("offset"), "offset", low=0)
        length = _declared_length(request)
        if upload.busy:
            raise limit_exceeded(
                429,
                f"another append to upload {upload.id} is running",
                Code.CONCURRENCY_LIMITED,
                headers={"Retry-After": "1"},
                retry_after=1,
                offset=upload.offset,
            )
        if offset != upload.offset:
            raise _offset_mismatch(upload, offset)
        if offset + length > upload.size:
            raise payload_too_large(
                upload.size,
                message=f"the body runs past the upload's size: {offset} + "
                f"{length} > {upload.size}",
            )
        _still_allowed(request.context, upload)
        self.context = request.context
        self.table = table
        self.upload = upload
        self.received = 0
        self.settled = False
        self.dropped = False
        self.body = hashed_write(request, upload.writer, upload.sha256)
        table.hold(upload)
        upload.stop_append = self._stop
        request.audit["upload_id"] = upload.id

    def write(self, data: bytes) -> None:
        """One chunk, queued for the hashing and the writing thread."""
        if self.dropped:
            raise not_found(f"the upload was dropped: {self.upload.id}")
        self.received += len(data)
        self.body.write(data)

    def _stop(self) -> None:
        """The upload was dropped (DELETE, expiry, stop) while this ran."""
        self.dropped = True
        self.body.when_idle(self.upload.writer.abort)

    def _settle(self) -> None:
        """The queued bytes are written: count them, free the upload."""
        self.settled = True
        upload = self.upload
        upload.stop_append = None
        upload.offset += self.received
        self.table.release(upload)

    def _lost(self, failure: Failure) -> Failure:
        """A write failed (ENOSPC ...): the staging file is gone, so is the upload."""
        self.settled = True
        self.upload.stop_append = None
        self.upload.busy = False
        self.table.drop(self.upload)
        return failure

    def finish(self) -> Deferred[dict[str, Any]]:
        """The whole body is in: once written, count it; rename when whole."""

        def written(_: object) -> dict[str, Any]:
            upload = self.upload
            if self.dropped:
                raise not_found(f"the upload was dropped: {upload.id}")
            self._settle()
            if upload.offset < upload.size:
                return {
                    "upload_id": upload.id,
                    "offset": upload.offset,
                    "size": upload.size,
                    "complete": False,
                }
            _still_allowed(self.context, upload)
            # The rename rechecks overwrite and If-Match; a refusal there
            # removes the staging file (the upload cannot complete any more).
            self.table.forget(upload)
            etag = upload.writer.commit()
            return {
                "path": upload.path,
                "bytes": upload.writer.bytes,
                "sha256": upload.sha256.hexdigest(),
                "etag": etag,
                "complete": True,
            }

        # A client that leaves now cancels the answer, not the write: what
        # arrived is counted (and a whole upload renamed) all the same.
        answer: Deferred[dict[str, Any]] = Deferred()
        self.body.flush().addCallbacks(written, self._lost).chainDeferred(answer)
        return answer

    def abort(self) -> None:
        """
        The client left mid-body (or the answer was refused): what arrived
        is kept, counted once it is written.
        """
        if self.settled or self.dropped:
            return

        def written(_: object) -> None:
            if not self.settled and not self.dropped:
                self._settle()

        self.body.flush().addCallbacks(written, self._lost).addErrback(lambda _: None)


HANDLERS: dict[str, Any] = {
    "files_uploads_create": files_uploads_create,
    "files_uploads_list": files_uploads_list,
    "files_uploads_get": files_uploads_get,
    "files_uploads_append": files_uploads_append,
    "files_uploads_delete": files_uploads_delete,
}

SINKS: dict[str, Any] = {"files_uploads_append": AppendSink}
