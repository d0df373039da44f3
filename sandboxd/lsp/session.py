# -*- test-case-name: tests.lsp.test_lsp -*-
"""
One language server: its child, the JSON-RPC peer over its stdio, the
documents it has open and the diagnostics it published.

The server runs as one of the daemon's children (its own session, the
request's user, no secrets, its whole tree ended with it).  The daemon is
the editor: before each question it reads the file and opens it, or sends
its new text when it changed on disk, so the answer is about the file as
it is now; the server's own requests are answered as a plain editor
would (no configuration, no edits applied).  Every question has a
timeout; a server that dies fails what waits on it at once, and the
session is ``failed`` (the next question starts a new one).  A server
that lets :data:`~sandboxd.policy.defaults.LSP_TIMEOUTS_BEFORE_RESTART`
questions in a row time out is taken for hung (stopped, looping): its
tree is killed and the session failed the same way, rather than every
later question waiting out its timeout too.
"""

from __future__ import annotations

import itertools
import json
import re
import time
from collections import OrderedDict, deque
from collections.abc import Callable
from typing import Any

from twisted.internet.defer import Deferred, TimeoutError, succeed
from twisted.internet.task import deferLater
from twisted.logger import Logger

from sandboxd.agents.process import AgentProcess, HeadTailLog
from sandboxd.errors import (
    ApiError,
    Code,
    payload_too_large,
    server_unavailable,
    timed_out,
)
from sandboxd.jsonrpc import (
    METHOD_NOT_FOUND,
    REQUEST_FAILED,
    Connection,
    ConnectionLost,
    ContentLengthFramer,
    RpcError,
    content_length_frame,
    encode,
    notification,
)
from sandboxd.jsonrpc import error as error_message
from sandboxd.lsp.answers import most_severe, severity_counts, uri_of
from sandboxd.lsp.catalog import ServerSpec
from sandboxd.lsp.sources import digest_of
from sandboxd.lsp.text import ENCODINGS
from sandboxd.lsp.watched import Seen, Watchers, changes
from sandboxd.policy import defaults
from sandboxd.policy.confinement import Confinement
from sandboxd.processes.command import RunAs
from sandboxd.waiters import Waiters

log = Logger(namespace="sandboxd.lsp")

_ids = itertools.count(1)

#: The error code an answer read past is turned into (not one a server sends:
#: JSON-RPC leaves -32000 to -32099 to the implementation).
_ANSWER_TOO_LARGE = -32099

#: The server's log messages kept per session.
KEPT_LOG_MESSAGES = 50

#: What the daemon, as an editor, says it can do.
CLIENT_CAPABILITIES: dict[str, Any] = {
    "general": {"positionEncodings": list(ENCODINGS)},
    "workspace": {
        "configuration": True,
        "workspaceFolders": True,
        "symbol": {"dynamicRegistration": False},
        # The files a server reads but the daemon has not open change on
        # disk too (sandboxd.lsp.watched).
        "didChangeWatchedFiles": {
            "dynamicRegistration": True,
            "relativePatternSupport": True,
        },
    },
    "textDocument": {
        "synchronization": {"dynamicRegistration": False, "didSave": False},
        "publishDiagnostics": {"relatedInformation": False, "versionSupport": True},
        "hover": {"contentFormat": ["markdown", "plaintext"]},
        "definition": {"linkSupport": True},
        "references": {},
        "documentSymbol": {"hierarchicalDocumentSymbolSupport": True},
        "completion": {
            "completionItem": {
                "snippetSupport": False,
                "documentationFormat": ["markdown", "plaintext"],
            }
        },
    },
    "window": {"workDoneProgress": False},
}


def server_child(
    reactor: Any,
    children: Any,
    limits: dict[str, Any],
    on_message: Callable[[bytes], None],
    on_broken: Callable[[str], None],
    on_exit: Callable[[int | None, str | None], None],
    on_oversized: Callable[[bytes, int], None] | None = None,
) -> tuple[HeadTailLog, AgentProcess]:
    """
    A language server's child, not yet spawned, and the head and tail of
    its stderr: stdout in ``Content-Length`` frames up to
    ``max_message_bytes``, each to ``on_message``; a longer one read past,
    its head to ``on_oversized``; broken framing to ``on_broken``; the
    exit to ``on_exit``.
    """
    stderr = HeadTailLog(defaults.LSP_STDERR_BYTES)
    framer = ContentLengthFramer(
        limits["max_message_bytes"], on_message, on_broken, on_oversized
    )
    return stderr, AgentProcess(reactor, children, stderr, framer, on_exit)


_DECODER = json.JSONDecoder()
_SPACE = re.compile(r"[ \t\n\r]*")


def _past_space(text: str, i: int) -> int:
    found = _SPACE.match(text, i)
    return found.end() if found is not None else i


def message_head(head: bytes) -> dict[str, Any]:
    """
    What the start of a message too large to read says of it: the plain
    members before the first list or object (``id``, ``method``), and
    those ``params`` starts with (a publishDiagnostics' ``uri`` and
    ``version``, which servers put before its list), as far as they go.
    """
    text = head.decode("utf-8", "replace")
    fields: dict[str, Any] = {}
    into = fields
    i = _past_space(text, 0)
    if not text.startswith("{", i):
        return fields
    i += 1
    while True:
        i = _past_space(text, i)
        if text.startswith(",", i):
            i = _past_space(text, i + 1)
        try:
            key, i = _DECODER.raw_decode(text, i)
        except ValueError:
            return fields
        i = _past_space(text, i)
        if not isinstance(key, str) or not text.startswith(":", i):
            return fields
        i = _past_space(text, i + 1)
        if key == "params" and into is fields and text.startswith("{", i):
            into = fields["params"] = {}
            i += 1
            continue
        if text.startswith(("{", "["), i):
            return fields
        try:
            into[key], i = _DECODER.raw_decode(text, i)
        except ValueError:
            return fields


def too_large(size: int, limit: int) -> str:
    """How a message read past is described."""
    return f"a message of {size} bytes (max_message_bytes {limit})"


class Document:
    """A file the server has open: its version and a digest of the text sent."""

    def __init__(self, uri: str, language: str) -> None:
        self.uri = uri
        self.language = language
        self.version = 0
        self.digest = b""


class Diagnostics:
    """What the server last published for one document."""

    def __init__(self) -> None:
        self.items: list[Any] = []
        #: How many more the last publish held than are kept.
        self.dropped = 0
        #: How many the last publish held of each severity, kept or not.
        self.counts: dict[str, int] = severity_counts([])
        self.version: int | None = None
        #: The size of the last publish when it was too large to read.
        self.oversized: int | None = None
        #: How many publishes have come for this document.
        self.count = 0
        self.published = Waiters[None]()


class LspSession:
    """One language server for one project root, user and owner."""

    def __init__(
        self,
        reactor: Any,
        children: Any,
        spec: ServerSpec,
        owner: str,
        root: str,
        run_as: RunAs | None,
        limits: dict[str, Any],
    ) -> None:
        self.id = f"lsp_{next(_ids)}"
        self.reactor = reactor
        self.spec = spec
        self.owner = owner
        self.root = root
        self.run_as = run_as
        self.limits = limits
        #: What the server is confined to (``params.confine``), once started.
        self.confine: Confinement | None = None
        self.state = "starting"
        self.created_at = time.time()
        #: When it answered ``initialize`` (monotonic).
        self.ready_at = 0.0
        self.last_activity = time.monotonic()
        self.capabilities: dict[str, Any] = {}
        #: How the server counts characters in a line (its choice of ours).
        self.encoding = "utf-16"
        self.server_info: dict[str, Any] | None = None
        self.failure: str | None = None
        self.documents: OrderedDict[str, Document] = OrderedDict()
        self.diagnostics: dict[str, Diagnostics] = {}
        self.messages: deque[dict[str, Any]] = deque(maxlen=KEPT_LOG_MESSAGES)
        self.stderr, self.process = server_child(
            reactor,
            children,
            limits,
            self._message,
            self._broken,
            self._exited,
            self._oversized,
        )
        self.conn = Connection(self.process.write, self, content_length_frame)
        self._ready: Waiters[None] = Waiters()
        #: Questions in a row the server let time out.
        self.timeouts = 0
        #: Questions being answered with this session (none is stopped to
        #: make room while one is).
        self.held = 0
        #: The file watchers the server registered, and the project's files
        #: as last seen (None before the first look, or once the project
        #: was found too large to watch).
        self.watchers = Watchers()
        self.files: dict[str, Seen] | None = None
        self.watching = True

    # -- life ----------------------------------------------------------------

    def start(
        self,
        argv: list[str],
        env: dict[str, str],
        confine: Confinement | None = None,
    ) -> Deferred[None]:
        """
        Spawn the server (under ``confine``) and ``initialize`` it; fires
        once it answered, or fails (504 ``timeout`` past
        ``start_timeout_seconds``, 502 when it exits or refuses).  Every
        other caller waits on :meth:`ready`.
        """
        self.confine = confine
        try:
            self.process.spawn(argv[0], argv, env, self.root, self.run_as, confine)
        except OSError as e:
            self._fail(f"could not start {argv[0]}: {e.strerror or e}")
            return self.ready()
        params: dict[str, Any] = {
            "processId": None,
            "clientInfo": {"name": "sandboxd"},
            "rootUri": uri_of(self.root),
            "rootPath": self.root,
            "workspaceFolders": [{"uri": uri_of(self.root), "name": self.root}],
            "capabilities": CLIENT_CAPABILITIES,
        }
        if self.spec.initialization_options is not None:
            params["initializationOptions"] = self.spec.initialization_options
        d = self._ask("initialize", params, self.limits["start_timeout_seconds"])
        d.addCallbacks(self._initialized, self._start_failed)
        return self.ready()

    def _initialized(self, result: Any) -> None:
        if self.state != "starting":
            return
        if isinstance(result, dict):
            caps = result.get("capabilities")
            self.capabilities = caps if isinstance(caps, dict) else {}
            chosen = self.spec.counts_in or self.capabilities.get("positionEncoding")
            if chosen in ENCODINGS:
                self.encoding = chosen
            info = result.get("serverInfo")
            self.server_info = info if isinstance(info, dict) else None
        self.conn.notify("initialized", {})
        self.ready_at = time.monotonic()
        self.state = "ready"
        self._ready.fire(None)

    def _start_failed(self, failure: Any) -> None:
        error = failure.value
        if isinstance(error, ApiError) and error.code == Code.TIMEOUT:
            self._fail("it did not answer initialize in time", error)
        else:
            self._fail(f"initialize failed: {_reason(error)}")
        self.process.kill()

    def ready(self) -> Deferred[None]:
        """Fires once the server is ready; fails as :meth:`start` does."""
        d: Deferred[None] = Deferred()
        if self.state == "ready":
            d.callback(None)
        elif self.state in ("failed", "closed"):
            d.errback(self._gone())
        else:
            d = self._ready.wait()
        return d

    def _fail(self, why: str, error: ApiError | None = None) -> None:
        if self.state in ("failed", "closed"):
            return
        self.state = "failed"
        self.failure = why
        log.info(
            "language server {id} ({server}) failed: {why}",
            id=self.id,
            server=self.spec.id,
            why=why,
        )
        self._ready.fail(error or self._gone())
        self.conn.close(ConnectionLost(why))
        for diag in self.diagnostics.values():
            diag.published.fire(None)

    def _gone(self) -> ApiError:
        why = self.failure or self.state
        tail = self.stderr.tail_text(2000)
        return server_unavailable(
            f"the language server {self.spec.id} is not running ({why})",
            session_id=self.id,
            stderr=tail or None,
        )

    def _exited(self, code: int | None, signal: str | None) -> None:
        how = f"was killed by {signal}" if signal else f"exited with status {code}"
        self._fail(f"it {how}")

    def _broken(self, reason: str) -> None:
        self._fail(f"it sent {reason}")
        self.process.kill()

    def close(self) -> Deferred[Any]:
        """``shutdown`` and ``exit`` if it is up, then end its tree; fires once gone."""
        polite = self.state == "ready"
        self._fail("closed")
        self.state = "closed"
        if self.process.pid is None:
            return succeed(None)  # never spawned: nothing to end
        if polite and not self.process.exited:
            # The peer is closed: the goodbye goes straight to the pipe, and
            # a server that takes its time over it is ended anyway.
            shutdown = {"jsonrpc": "2.0", "id": -1, "method": "shutdown"}  # no params
            for message in (shutdown, notification("exit")):
                self.process.write(content_length_frame(encode(message)))
            later = self.reactor.callLater(
                defaults.LSP_SHUTDOWN_SECONDS, self.process.terminate
            )
            gone = self.process.wait_gone()

            def ended(result: Any) -> Any:
                if later.active():
                    later.cancel()
                return result

            gone.addBoth(ended)
            return gone
        self.process.terminate()
        return self.process.wait_gone()

    @property
    def pid(self) -> int | None:
        """The server's pid once spawned."""
        return self.process.pid

    def touch(self) -> None:
        """A question came: the idle clock restarts."""
        self.last_activity = time.monotonic()

    def hold(self) -> None:
        """A question uses the session until :meth:`release`."""
        self.held += 1
        self.touch()

    def release(self) -> None:
        """A question is answered: the idle clock restarts from its end."""
        self.held -= 1
        self.touch()

    @property
    def idle(self) -> bool:
        """Ready, and no question is being answered with it."""
        return self.state == "ready" and self.held <= 0

    # -- questions -----------------------------------------------------------

    def ask(self, method: str, params: Any) -> Deferred[Any]:
        """One request, bounded by ``timeout_seconds``."""
        self.touch()
        if self.state != "ready":
            d: Deferred[Any] = Deferred()
            d.errback(self._gone())
            return d
        return self._ask(method, params, self.limits["timeout_seconds"])

    def _ask(self, method: str, params: Any, timeout: float) -> Deferred[Any]:
        d = self.conn.request(method, params)
        request_id = self.conn.last_request_id

        def given_up(result: Any, _timeout: float) -> Any:
            self.conn.forget(request_id)
            if self.state == "ready":
                self.conn.notify("$/cancelRequest", {"id": request_id})
            raise TimeoutError()

        d.addTimeout(timeout, self.reactor, onTimeoutCancel=given_up)
        d.addCallbacks(
            self._answered, self._answer_failed, errbackArgs=(method, timeout)
        )
        return d

    def _answered(self, result: Any) -> Any:
        self.timeouts = 0
        return result

    def _answer_failed(self, failure: Any, method: str, timeout: float) -> Any:
        error = failure.value
        if isinstance(error, TimeoutError):
            message = (
                f"the language server {self.spec.id} did not answer {method} "
                f"within {timeout:g} s"
            )
            if self.state == "ready":
                message += self._timed_out()
            raise timed_out(message, status=504, limit=timeout)
        if isinstance(error, RpcError) and error.code == _ANSWER_TOO_LARGE:
            self.timeouts = 0
            limit = self.limits["max_message_bytes"]
            raise payload_too_large(
                limit,
                message=f"the language server's answer to {method} was "
                f"{error.message}, over the {limit} bytes a message may have "
                "(max_message_bytes): ask a narrower question",
            )
        if isinstance(error, RpcError):
            self.timeouts = 0
            raise server_unavailable(
                f"the language server {self.spec.id} refused {method}: {error.message}",
                session_id=self.id,
                lsp_error={"code": error.code, "message": error.message},
            )
        if isinstance(error, ConnectionLost):
            raise self._gone()
        return failure

    def _timed_out(self) -> str:
        """
        Count a question the server let time out; at the bound, end it.
        What the caller is told, to follow the timeout's message.
        """
        self.timeouts += 1
        bound = defaults.LSP_TIMEOUTS_BEFORE_RESTART
        if self.timeouts < bound:
            return (
                f" (after {bound - self.timeouts} more in a row it is restarted; "
                f"DELETE /lsp/sessions/{self.id} restarts it now)"
            )
        self._fail(f"it did not answer {bound} questions in a row: it was stopped")
        self.process.kill()
        return (
            f", nor the {bound - 1} before it: it was taken for hung and stopped, "
            "and the next question starts a new one"
        )

    async def ask_warm(self, method: str, params: Any) -> Any:
        """
        :meth:`ask`, asked again while the server is young and answers
        nothing (:data:`~sandboxd.policy.defaults.LSP_WARMUP_SECONDS`), within
        the question's ``timeout_seconds``.
        """
        deadline = self.reactor.seconds() + self.limits["timeout_seconds"]
        while True:
            result = await self.ask(method, params)
            young = time.monotonic() - self.ready_at < defaults.LSP_WARMUP_SECONDS
            pause = defaults.LSP_WARMUP_RETRY_SECONDS
            if result or not young or self.reactor.seconds() + pause >= deadline:
                return result
            await deferLater(self.reactor, pause, lambda: None)

    def supports(self, capability: str) -> bool:
        """Whether the server said it answers ``capability`` (``hoverProvider``...)."""
        value = self.capabilities.get(capability)
        return value is not None and value is not False

    # -- the project's files -------------------------------------------------

    @property
    def wants_files(self) -> bool:
        """
        Whether the project's files should be looked at before a question:
        for the first look (what later ones are compared with), then while
        the server has watchers registered.
        """
        return self.watching and (self.files is None or bool(self.watchers))

    def files_seen(self, now: dict[str, Seen] | None) -> None:
        """
        The project's files now (:func:`~sandboxd.lsp.watched.scan`): the
        server is told of the changes its watchers match since the last
        look, and every open document is sent again at the next question
        about it (the server answers about it anew, with the other files
        as they are now).  None (too many files) stops the looking.
        """
        if now is None:
            self.watching = False
            self.files = None
            self.messages.append(
                {
                    "type": 2,
                    "message": "sandboxd: the project has more files than "
                    "it watches; changes to files not open are not sent",
                }
            )
            return
        before, self.files = self.files, now
        if before is None or not self.watchers or self.state != "ready":
            return
        found = [
            {"uri": uri_of(path), "type": kind}
            for path, kind in changes(before, now)
            if self.watchers.match(path)
        ]
        if not found:
            return
        self.conn.notify("workspace/didChangeWatchedFiles", {"changes": found})
        for doc in self.documents.values():
            doc.digest = b""

    # -- documents -----------------------------------------------------------

    def sync(self, path: str, language: str, text: str, digest: bytes) -> bool:
        """
        Make the server see ``text`` as ``path``'s content: open it, or send
        the whole new text if it changed (``digest``, from
        :func:`~sandboxd.lsp.sources.digest_of`, tells).  True when
        something was sent.
        """
        doc = self.documents.get(path)
        if doc is not None and doc.digest == digest:
            self.documents.move_to_end(path)
            return False
        if doc is None:
            doc = Document(uri_of(path), language)
            doc.version = 1
            self.conn.notify(
                "textDocument/didOpen",
                {
                    "textDocument": {
                        "uri": doc.uri,
                        "languageId": language,
                        "version": doc.version,
                        "text": text,
                    }
                },
            )
            self.documents[path] = doc
            self._close_oldest()
        else:
            doc.version += 1
            self.conn.notify(
                "textDocument/didChange",
                {
                    "textDocument": {"uri": doc.uri, "version": doc.version},
                    "contentChanges": [{"text": text}],
                },
            )
            self.documents.move_to_end(path)
        doc.digest = digest
        self.diagnostics.setdefault(doc.uri, Diagnostics())
        return True

    def refresh(self, texts: dict[str, str | None]) -> None:
        """
        Bring open documents up to date with ``texts``, their text on disk
        now (:func:`~sandboxd.lsp.sources.texts_now`): a changed one is
        sent, one that could not be read is closed (the server reads it
        itself, if it can).
        """
        for path, text in texts.items():
            doc = self.documents.get(path)
            if doc is None:
                continue
            if text is None:
                del self.documents[path]
                self.conn.notify(
                    "textDocument/didClose", {"textDocument": {"uri": doc.uri}}
                )
                self.diagnostics.pop(doc.uri, None)
                continue
            digest = digest_of(text)
            if digest != doc.digest:
                self.sync(path, doc.language, text, digest)

    def _close_oldest(self) -> None:
        while len(self.documents) > defaults.LSP_OPEN_DOCUMENTS:
            _, old = self.documents.popitem(last=False)
            self.conn.notify(
                "textDocument/didClose", {"textDocument": {"uri": old.uri}}
            )
            self.diagnostics.pop(old.uri, None)

    async def diagnostics_of(
        self, path: str, fresh: bool, timeout: float
    ) -> tuple[Diagnostics, bool]:
        """
        ``(diagnostics, settled)``: what the server publishes for ``path`` once it
        has said something about its current text and then nothing more for
        :data:`~sandboxd.policy.defaults.LSP_DIAGNOSTICS_SETTLE_SECONDS`;
        ``settled`` is False when it said nothing about that text within
        ``timeout`` (the diagnostics are then what it said before, if any).

        :param fresh: the text was just sent (:meth:`sync`): what was
            published before does not count.
        """
        doc = self.documents[path]
        diag = self.diagnostics.setdefault(doc.uri, Diagnostics())
        if not fresh and diag.count:
            return diag, True
        deadline = self.reactor.seconds() + timeout
        seen = diag.count if fresh else 0
        while diag.count <= seen or (
            diag.version is not None and diag.version < doc.version
        ):
            if not await self._published(diag, deadline - self.reactor.seconds()):
                return diag, False
        settle = defaults.LSP_DIAGNOSTICS_SETTLE_SECONDS
        while await self._published(
            diag, min(settle, deadline - self.reactor.seconds())
        ):
            pass
        return diag, True

    async def _published(self, diag: Diagnostics, within: float) -> bool:
        """
        Whether another publish came within ``within`` seconds.

        :raises ApiError: the server is gone.
        """
        if self.state != "ready":
            raise self._gone()
        if within <= 0:
            return False
        count = diag.count
        d = diag.published.wait()
        d.addTimeout(within, self.reactor)
        try:
            await d
        except TimeoutError:
            return False
        if self.state != "ready":
            raise self._gone()
        return diag.count > count

    # -- what the server sends (the Peer of Connection) ----------------------

    def handle_request(self, request_id: Any, method: str, params: Any) -> Any:
        """Answer the server as an editor with no settings of its own would."""
        if method == "workspace/configuration":
            items = params.get("items") if isinstance(params, dict) else None
            return [None] * (len(items) if isinstance(items, list) else 0)
        if method == "workspace/workspaceFolders":
            return [{"uri": uri_of(self.root), "name": self.root}]
        if method == "workspace/applyEdit":
            return {"applied": False, "failureReason": "sandboxd applies no edits"}
        if method == "client/registerCapability":
            self._watch(params, register=True)
            return None
        if method == "client/unregisterCapability":
            self._watch(params, register=False)
            return None
        if method in (
            "window/workDoneProgress/create",
            "window/showMessageRequest",
            "window/showDocument",
        ):
            return None
        raise RpcError(METHOD_NOT_FOUND, f"sandboxd does not handle {method}")

    def _watch(self, params: Any, register: bool) -> None:
        """Keep or forget the file watchers a (un)registration names."""
        key = "registrations" if register else "unregisterations"
        items = params.get(key) if isinstance(params, dict) else None
        for item in items if isinstance(items, list) else []:
            if not isinstance(item, dict):
                continue
            if item.get("method") != "workspace/didChangeWatchedFiles":
                continue
            registration_id = str(item.get("id"))
            if register:
                self.watchers.register(registration_id, item.get("registerOptions"))
            else:
                self.watchers.unregister(registration_id)

    def handle_notification(self, method: str, params: Any) -> None:
        """Diagnostics are kept; log and show messages go to :attr:`messages`."""
        if method == "textDocument/publishDiagnostics" and isinstance(params, dict):
            self._publish(params)
        elif method in ("window/logMessage", "window/showMessage") and isinstance(
            params, dict
        ):
            self.messages.append(
                {
                    "type": params.get("type"),
                    "message": str(params.get("message"))[:2000],
                }
            )

    def _publish(self, params: dict[str, Any], oversized: int | None = None) -> None:
        uri = params.get("uri")
        if not isinstance(uri, str) or not any(
            d.uri == uri for d in self.documents.values()
        ):
            return
        diag = self.diagnostics.setdefault(uri, Diagnostics())
        diag.oversized = oversized
        items = params.get("diagnostics")
        items = items if isinstance(items, list) else []
        diag.items = most_severe(items, defaults.LSP_KEPT_DIAGNOSTICS)
        diag.dropped = len(items) - len(diag.items)
        diag.counts = severity_counts(items)
        version = params.get("version")
        diag.version = version if isinstance(version, int) else None
        diag.count += 1
        diag.published.fire(None)

    def _oversized(self, head: bytes, size: int) -> None:
        """
        A message over ``max_message_bytes``, read past rather than taken
        for broken framing (the server lives on): diagnostics say so for
        their document, an answer fails its question, a request of the
        server's is refused.
        """
        fields = message_head(head)
        what = too_large(size, self.limits["max_message_bytes"])
        method, request_id = fields.get("method"), fields.get("id")
        params = fields.get("params")
        if method == "textDocument/publishDiagnostics" and isinstance(params, dict):
            self._publish(params, oversized=size)
        elif method is None and request_id is not None:
            self.conn.message_received(
                encode(error_message(request_id, _ANSWER_TOO_LARGE, f"{size} bytes"))
            )
        elif request_id is not None:
            self.process.write(
                content_length_frame(
                    encode(
                        error_message(
                            request_id, REQUEST_FAILED, f"sandboxd read past {what}"
                        )
                    )
                )
            )
        self.messages.append(
            {
                "type": 2,
                "message": f"sandboxd read past {what}: {method or 'an answer'}",
            }
        )

    def handle_garbage(self, line: bytes, reason: str, message: Any) -> None:
        """Kept as a log message (a late answer to a question given up on is one)."""
        self.messages.append({"type": 0, "message": f"ignored: {reason}"})

    def _message(self, body: bytes) -> None:
        self.conn.message_received(body)

    # -- the document ----------------------------------------------------------

    def describe(self) -> dict[str, Any]:
        """The session document."""
        return {
            "id": self.id,
            "server": self.spec.id,
            "languages": list(self.spec.languages),
            "root": self.root,
            "state": self.state,
            "pid": self.pid,
            "user": self.run_as.name if self.run_as is not None else None,
            "owner": self.owner,
            "created_at": self.created_at,
            "idle_seconds": round(time.monotonic() - self.last_activity, 3),
            "open_documents": len(self.documents),
            "server_info": self.server_info,
            "position_encoding": self.encoding,
            "capabilities": sorted(
                k
                for k in self.capabilities
                if k.endswith("Provider") and self.supports(k)
            ),
            "failure": self.failure,
        }


def _reason(error: Any) -> str:
    if isinstance(error, ApiError):
        return error.message
    return str(error) or type(error).__name__
