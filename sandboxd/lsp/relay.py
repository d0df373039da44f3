# -*- test-case-name: tests.lsp.test_connect,tests.lsp.test_checks -*-
"""
An editor's own language server (``lsp_connect``): the server's child,
and the editor's messages relayed to it and its messages to the editor.

The editor speaks LSP itself; the daemon does not.  One WebSocket text
frame is one JSON-RPC message.  What the server sends goes to the editor
unchanged.  What the editor sends is looked at first
(:mod:`sandboxd.lsp.checks`): a frame that is not a JSON object is answered
with a JSON-RPC error; a request naming a file the caller may not read is
answered with an error and not passed on, a notification is dropped and
the editor told with a ``window/logMessage``, an answer to the server's
own request is turned into an error for the server; an answer to a
request the server never sent the editor is dropped.  The editor's
settings are taken out unless the policy lets them through, and the
server's ``workspace/configuration`` is then answered by the relay, with
none (:meth:`~sandboxd.lsp.checks.EditorRules.keeps_settings`).
Everything else goes to the server byte for byte.

The server runs as :class:`~sandboxd.lsp.session.LspSession`'s does (its
own session, the request's user, no secrets, the root as its working
directory); its output is not read while the editor is not reading
(:meth:`hold`), and it is ended, whole tree, when the editor goes.
"""

from __future__ import annotations

import json
from collections import OrderedDict
from typing import Any, Protocol

from twisted.internet.defer import Deferred, succeed
from twisted.logger import Logger

from sandboxd.jsonrpc import (
    INVALID_REQUEST,
    PARSE_ERROR,
    REQUEST_FAILED,
    content_length_frame,
    encode,
    error,
    notification,
    result,
)
from sandboxd.lsp.catalog import ServerSpec
from sandboxd.lsp.checks import EditorRules, Refusal
from sandboxd.lsp.session import message_head, server_child, too_large
from sandboxd.policy import defaults
from sandboxd.policy.confinement import Confinement
from sandboxd.processes.command import RunAs

log = Logger(namespace="sandboxd.lsp")

#: Close codes (RFC 6455 §7.4.1).
NORMAL = 1000
GOING_AWAY = 1001
INTERNAL_ERROR = 1011

#: ``window/logMessage`` types.
LOG_ERROR = 1
LOG_WARNING = 2


class Editor(Protocol):
    """What the relay needs of the editor's socket."""

    def send(self, body: bytes) -> None:
        """One message to the editor (a text frame)."""

    def hang_up(self, code: int, reason: str) -> None:
        """Close the socket with ``code`` and ``reason``."""


class EditorRelay:
    """One editor's language server, and the messages between them."""

    def __init__(
        self,
        reactor: Any,
        children: Any,
        spec: ServerSpec,
        owner: str,
        root: str,
        run_as: RunAs | None,
        limits: dict[str, Any],
        rules: EditorRules,
        confine: Confinement | None = None,
    ) -> None:
        self.spec = spec
        self.confine = confine
        self.owner = owner
        self.root = root
        self.run_as = run_as
        self.limits = limits
        self.rules = rules
        self.editor: Editor | None = None
        self.stderr, self.process = server_child(
            reactor,
            children,
            limits,
            self._message,
            self._broken,
            self._exited,
            self._oversized,
        )
        self.framer = self.process.framer
        #: The editor sent ``exit``: the server's exit is the end it asked for.
        self.exit_sent = False
        self.closed = False
        #: Why the server's output is not read now (the editor's socket is
        #: not open yet, or its client is not reading).
        self._holds: set[str] = set()
        #: The server's requests the editor was given and has not answered
        #: (by their ids as JSON): only these may it answer.
        self._asked: OrderedDict[str, None] = OrderedDict()

    # -- life ----------------------------------------------------------------

    def start(self, argv: list[str], env: dict[str, str]) -> None:
        """
        Spawn the server; its output waits until the editor's socket is
        open (:meth:`editor_opened`).

        :raises OSError: it could not be started.
        """
        self.process.spawn(argv[0], argv, env, self.root, self.run_as, self.confine)
        self.hold("opening")

    def attach(self, editor: Editor, reader: Any) -> None:
        """
        The editor's socket: what the server says goes there, and
        ``reader`` (its connection, as a producer) is paused while the
        server's stdin pipe is full.
        """
        self.editor = editor
        self.process.child.throttle_stdin(reader)

    def editor_opened(self) -> None:
        """The socket's handshake is done: the server's output flows."""
        self.release("opening")

    def hold(self, why: str) -> None:
        """Stop reading the server's output for ``why``."""
        self._holds.add(why)
        self.process.child.pause_reading()

    def release(self, why: str) -> None:
        """``why`` is over; the output is read again once nothing else holds it."""
        self._holds.discard(why)
        if not self._holds:
            self.process.child.resume_reading()

    def close(self) -> Deferred[Any]:
        """End the server's whole tree (TERM, KILL after the grace); fires once gone."""
        self.closed = True
        self.framer.stop()
        if self.process.pid is None:
            return succeed(None)
        self.process.terminate()
        return self.process.wait_gone()

    @property
    def pid(self) -> int | None:
        """The server's pid once spawned."""
        return self.process.pid

    def hang_up(self, code: int, reason: str) -> None:
        """Close the editor's socket (unless the server is already ended)."""
        if self.editor is not None and not self.closed:
            self.editor.hang_up(code, reason)

    def _exited(self, code: int | None, signal: str | None) -> None:
        if self.closed:
            return
        if self.exit_sent and code == 0:
            self.hang_up(NORMAL, "the language server exited")
            return
        how = f"was killed by {signal}" if signal else f"exited with status {code}"
        tail = self.stderr.tail_text(200).strip().splitlines()
        log.info(
            "editor's language server {server} {how}",
            server=self.spec.id,
            how=how,
        )
        reason = f"the language server {how}"
        if tail:
            reason += f": {tail[-1]}"
        self.hang_up(INTERNAL_ERROR, reason)

    def _broken(self, reason: str) -> None:
        self.hang_up(INTERNAL_ERROR, f"the language server sent {reason}")
        self.process.kill()

    # -- server -> editor ----------------------------------------------------

    def _oversized(self, head: bytes, size: int) -> None:
        """
        A message of the server's over ``max_message_bytes``, read past
        (the server and the socket live on): an answer to the editor
        becomes an error for its request, a request of the server's is
        refused to it, and the editor is told with a ``window/logMessage``.
        """
        fields = message_head(head)
        what = too_large(size, self.limits["max_message_bytes"])
        method, request_id = fields.get("method"), fields.get("id")
        if method is None and request_id is not None:
            self._tell_editor(
                error(request_id, REQUEST_FAILED, f"sandboxd read past {what}")
            )
            return
        if request_id is not None:
            self.process.write(
                content_length_frame(
                    encode(
                        error(request_id, REQUEST_FAILED, f"sandboxd read past {what}")
                    )
                )
            )
        self._log(
            LOG_ERROR,
            f"sandboxd did not pass on the language server's {method or 'message'}: {what}",
        )

    def _message(self, body: bytes) -> None:
        """
        One message of the server's: to the editor as it came; a request's
        id is kept (what the editor may answer), and one the relay
        answers itself (:meth:`EditorRules.keeps_from_editor`) is not sent on.
        """
        try:
            body.decode("utf-8")
        except UnicodeDecodeError:
            self._broken("a message that is not UTF-8")
            return
        if b'"method"' in body and b'"id"' in body and self._server_request(body):
            return
        if self.editor is not None:
            self.editor.send(body)

    def _server_request(self, body: bytes) -> bool:
        """Keep a request's id; True when the relay answered it instead of the editor."""
        try:
            message = json.loads(body)
        except (ValueError, RecursionError):
            return False
        if not isinstance(message, dict) or "id" not in message:
            return False
        method = message.get("method")
        if not isinstance(method, str):
            return False
        if self.rules.keeps_from_editor(method):
            params = message.get("params")
            items = params.get("items") if isinstance(params, dict) else None
            count = len(items) if isinstance(items, list) else 0
            answer = result(message["id"], [None] * count)
            self.process.write(content_length_frame(encode(answer)))
            return True
        self._asked[_id_key(message["id"])] = None
        while len(self._asked) > defaults.LSP_EDITOR_PENDING_REQUESTS:
            self._asked.popitem(last=False)
        return False

    # -- editor -> server ----------------------------------------------------

    def from_editor(self, payload: bytes) -> None:
        """One text frame of the editor's: checked, then passed on or answered."""
        try:
            message = json.loads(payload)
        except (UnicodeDecodeError, ValueError, RecursionError) as e:
            self._tell_editor(
                error(None, PARSE_ERROR, f"a message is one JSON object: {e}")
            )
            return
        if not isinstance(message, dict):
            self._tell_editor(
                error(None, INVALID_REQUEST, "a message is one JSON object")
            )
            return
        method = message.get("method")
        if method is None and "id" in message:
            key = _id_key(message["id"])
            if key not in self._asked:
                self._log(
                    LOG_ERROR,
                    f"sandboxd did not pass on an answer to {key}: the language "
                    "server has no request of that id waiting on the editor",
                )
                return
            del self._asked[key]
        refused = self.rules.refusal(message)
        if refused is not None:
            self._refuse(message, refused)
            return
        if method == "exit":
            self.exit_sent = True
        rewritten, removed = self.rules.keeps_settings(message)
        if removed is not None:
            self._log(LOG_WARNING, f"sandboxd did not pass on {removed}")
        if rewritten:
            payload = encode(message)
        self.process.write(content_length_frame(payload))

    def _refuse(self, message: dict[str, Any], refused: Refusal) -> None:
        """A request gets an error; a notification is dropped, the editor told."""
        method = message.get("method")
        has_id = "id" in message
        if isinstance(method, str) and has_id:
            self._tell_editor(
                error(message["id"], REQUEST_FAILED, refused.message, refused.data())
            )
            return
        if has_id and method is None:
            # An answer to the server's own request: the server hears an
            # error instead, rather than waiting for ever.
            self.process.write(
                content_length_frame(
                    encode(
                        error(
                            message["id"],
                            REQUEST_FAILED,
                            refused.message,
                            refused.data(),
                        )
                    )
                )
            )
            what = "an answer to the language server"
        else:
            what = str(method)
        self._log(LOG_ERROR, f"sandboxd did not pass on {what}: {refused.message}")

    def _log(self, kind: int, text: str) -> None:
        """A ``window/logMessage`` to the editor."""
        self._tell_editor(
            notification("window/logMessage", {"type": kind, "message": text})
        )

    def _tell_editor(self, message: dict[str, Any]) -> None:
        if self.editor is not None:
            self.editor.send(encode(message))


def _id_key(request_id: Any) -> str:
    """A request id as its JSON (``1`` and ``"1"`` are different ids)."""
    try:
        return json.dumps(request_id, sort_keys=True)
    except (TypeError, ValueError):
        return repr(request_id)
