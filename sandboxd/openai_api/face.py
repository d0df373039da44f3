# -*- test-case-name: tests.openai_api.test_sessions -*-
"""
The OpenAI face of one engine session: its ``agent.session`` object, turns,
items and event log, folded from the engine's events as they are appended.

The face subscribes to the engine session's log, so every ACP update is
projected synchronously in wire order: an agent message chunk becomes an
``output_text.delta`` of a ``message`` item, a thought a reasoning summary
delta, a tool call a ``command_execution`` (kind ``execute``) or
``mcp_call`` item, a held permission request a ``requires_action``.  The
projected events go to a log of their own (:class:`~sandboxd.eventlog.EventLog`,
one ``seq`` per frame), which gives the SSE stream the §9 contract: an
``id:`` on every frame, ``after``/``Last-Event-ID`` resume, a ``gap`` when
retention dropped what was asked for.

ACP cannot steer a running turn, so input sent during a turn queues a
successor turn (as the seed does), at most the caller's
``limits.max_queued`` of them.
"""

from __future__ import annotations

import hashlib
import json
import secrets
import time
from collections import OrderedDict, deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, cast

from sandboxd.errors import (
    ApiError,
    Code,
    agent_unavailable,
    bad_request,
    idempotency_mismatch,
)
from sandboxd.eventlog import Event, EventLog, json_size
from sandboxd.openai_api.redact import Redactor
from sandboxd.openai_api.subagent_records import Subagents
from sandboxd.openai_api.subagent_records import describe as describe_subagent
from sandboxd.policy import defaults
from sandboxd.waiters import Waiters

if TYPE_CHECKING:
    from twisted.internet.defer import Deferred

    from sandboxd.agents.session import AgentSession

#: The id prefix of an ``mcp_call`` item that is the agent's own tool (an
#: edit, a read, a search), not a call to an MCP server: a response's output
#: shows it as agent-sandbox-server's ``tool_call`` item.
NATIVE_TOOL_PREFIX = "tc_"

#: Turns (with their items) kept per session.
MAX_TURNS_KEPT = defaults.AGENT_KEPT_ITEMS


def new_id(prefix: str) -> str:
    """An OpenAI-style id: the prefix and 24 hex characters."""
    return prefix + secrets.token_hex(12)


def body_digest(body: Any) -> str:
    """The SHA-256 of a body's canonical JSON (for ``Idempotency-Key``)."""
    text = json.dumps(body, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode()).hexdigest()


class IdempotencyBook:
    """
    ``Idempotency-Key`` → (body digest, result): the same key with the same
    body answers the first result again, with another body 409.

    A key is remembered for :data:`~sandboxd.policy.defaults.OPENAI_IDEMPOTENCY_SECONDS`
    from its first use (OpenAI's window) and among the ``size`` newest;
    past either it is a new key.  Times are wall-clock seconds, so a book
    kept across a restart keeps its window.
    """

    def __init__(
        self,
        size: int = defaults.OPENAI_IDEMPOTENCY_KEYS,
        on_change: Callable[[], None] | None = None,
        clock: Callable[[], float] = time.time,
        window: float = defaults.OPENAI_IDEMPOTENCY_SECONDS,
    ) -> None:
        self.size = size
        self.window = window
        self._clock = clock
        #: key -> (body digest, result, stored at), oldest first.
        self._book: OrderedDict[str, tuple[str, Any, float]] = OrderedDict()
        #: Called after every :meth:`store` (the registry keeps the book).
        self.on_change = on_change
        #: Keys claimed by a create still under way: body digest, and the
        #: duplicates waiting for its outcome.
        self._in_flight: dict[str, tuple[str, Waiters[None]]] = {}

    def lookup(self, key: str | None, body: Any) -> Any:
        """The result stored for ``key``, None when the key is new."""
        if key is None:
            return None
        check_key(key)
        self._forget_expired()
        found = self._book.get(key)
        if found is None:
            return None
        digest, result, _ = found
        if digest != body_digest(body):
            raise idempotency_mismatch()
        return result

    async def claim(self, key: str | None, body: Any) -> Any:
        """
        The result stored for ``key``; or None, and the key is the
        caller's until it stores a result (:meth:`store`) or lets it go
        (:meth:`release`).  A duplicate sent while the first is still
        under way (a client or proxy that retried because the first looked
        lost, or sent the same create twice at once) waits for the first's
        outcome and is answered its result, so one key never starts two
        agents; when the first fails, one waiting duplicate goes ahead in
        its place.
        """
        if key is None:
            return None
        while True:
            known = self.lookup(key, body)
            if known is not None:
                return known
            pending = self._in_flight.get(key)
            if pending is None:
                self._in_flight[key] = (body_digest(body), Waiters())
                return None
            if pending[0] != body_digest(body):
                raise idempotency_mismatch()
            await pending[1].wait()

    def release(self, key: str | None) -> None:
        """
        The claimer of ``key`` is done (it failed, or it stored): the
        duplicates waiting for it look again.
        """
        pending = self._in_flight.pop(key, None) if key is not None else None
        if pending is not None:
            pending[1].fire(None)

    def store(self, key: str | None, body: Any, result: Any) -> None:
        """Remember ``result`` for ``key`` (the oldest key goes beyond the bound)."""
        if key is None:
            return
        self._put(key, body_digest(body), result, self._clock())
        self.release(key)
        if self.on_change is not None:
            self.on_change()

    def entries(self) -> list[tuple[str, str, Any, float]]:
        """
        Each key with its body digest, result and the time it was stored,
        oldest first (to be kept).
        """
        self._forget_expired()
        return [(key, *entry) for key, entry in self._book.items()]

    def restore(
        self, key: str, digest: str, result: Any, stored_at: float | None = None
    ) -> None:
        """
        Put back an entry a previous daemon kept (the bounds still hold).  One
        kept without its time (by an older daemon) counts from now.
        """
        self._put(
            key, digest, result, self._clock() if stored_at is None else stored_at
        )
        self._forget_expired()

    def _put(self, key: str, digest: str, result: Any, stored_at: float) -> None:
        self._book[key] = (digest, result, stored_at)
        self._book.move_to_end(key)
        while len(self._book) > self.size:
            self._book.popitem(last=False)

    def _forget_expired(self) -> None:
        """Drop the keys older than the window (oldest first, so from the front)."""
        oldest = self._clock() - self.window
        while self._book:
            key, (_, _, stored_at) = next(iter(self._book.items()))
            if stored_at > oldest:
                break
            del self._book[key]


def check_key(key: str) -> None:
    """An ``Idempotency-Key``: 1-128 printable ASCII characters."""
    if not 0 < len(key) <= 128 or not all(" " < c <= "~" for c in key):
        raise bad_request(
            "Idempotency-Key must be 1-128 printable ASCII characters",
            param="Idempotency-Key",
        )


def token_usage(usage: Any) -> dict[str, Any] | None:
    """An ACP ``PromptResponse.usage`` as OpenAI's TokenUsage (None if absent)."""
    if not isinstance(usage, dict):
        return None

    def count(*names: str) -> int:
        for name in names:
            value = usage.get(name)
            if isinstance(value, int) and not isinstance(value, bool):
                return value
        return 0

    inp = count("inputTokens", "input_tokens")
    out = count("outputTokens", "output_tokens")
    total = count("totalTokens", "total_tokens") or inp + out
    return {
        "input_tokens": inp,
        "input_tokens_details": {
            "cached_tokens": count("cachedReadTokens", "cached_tokens")
        },
        "output_tokens": out,
        "output_tokens_details": {
            "reasoning_tokens": count("thoughtTokens", "reasoning_tokens")
        },
        "total_tokens": total,
    }


#: Engine turn error codes → OpenAI's ``SessionTurnError.code``.
_TURN_ERRORS = {
    "agent_exited": "sandbox_error",
    "agent_killed": "sandbox_error",
    "message_too_large": "sandbox_error",
    "max_turn_seconds": "request_timeout",
}


#: The error of a turn stopped by a bound (:attr:`WireTurn.stopped_by`).
_STOPPED: dict[str, Callable[[], dict[str, str]]] = {
    "max_turn_seconds": lambda: {
        "code": "request_timeout",
        "message": "the turn ran past max_turn_seconds and was stopped",
    },
    "max_items": lambda: {
        "code": "sandbox_error",
        "message": (
            f"the turn made {defaults.OPENAI_TURN_ITEMS} items (messages, "
            "thoughts, tool calls), as many as a turn may, and was stopped"
        ),
    },
}


class WireTurn:
    """One turn as OpenAI shows it (``agent.session.turn``)."""

    def __init__(self, face: SessionFace, text: str, blocks: list[dict[str, Any]]):
        self.id = new_id("turn_")
        self.face = face
        self.text = text
        self.blocks = blocks
        self.created_at = int(time.time())
        self.started_at: int | None = None
        self.completed_at: int | None = None
        self.status = "queued"
        self.error: dict[str, Any] | None = None
        self.usage: dict[str, Any] | None = None
        self.engine_id: str | None = None
        self._items: list[dict[str, Any]] = []
        #: Each item's place among them, by identity (asked for every
        #: streamed piece: a search of the list compared whole items).
        self._places: dict[int, int] = {}
        #: What stopped the turn when it was not its caller (its
        #: ``max_turn_seconds``, its items' bound), for its error.
        self.stopped_by: str | None = None
        #: The open message or reasoning item whose streamed pieces are not
        #: yet in its text, and those pieces.
        self._growing: tuple[dict[str, Any], list[str]] | None = None
        self.waiters: Waiters[None] = Waiters()
        self.announced = False

    @property
    def ended(self) -> bool:
        """Whether the turn is over."""
        return self.status in ("completed", "failed", "cancelled")

    @property
    def items(self) -> list[dict[str, Any]]:
        """The turn's items, an open one's text whole."""
        self.settle()
        return self._items

    def add(self, item: dict[str, Any]) -> None:
        """A new item of the turn, its place remembered."""
        self._places[id(item)] = len(self._items)
        self._items.append(item)

    @property
    def full(self) -> bool:
        """Whether the turn has :data:`~sandboxd.policy.defaults.OPENAI_TURN_ITEMS`."""
        return len(self._items) >= defaults.OPENAI_TURN_ITEMS

    def index_of(self, item: dict[str, Any]) -> int:
        """
        Where ``item`` is among the turn's items (its ``output_index``),
        without joining an open item's text: asked for every streamed piece.
        """
        place = self._places.get(id(item))
        if place is None or self._items[place] is not item:
            # One read back with the turn (not added here): found once.
            place = next(i for i, kept in enumerate(self._items) if kept is item)
            self._places[id(item)] = place
        return place

    def holds(self, item: dict[str, Any]) -> bool:
        """Whether ``item`` is one of the turn's, without joining any text."""
        place = self._places.get(id(item))
        return place is not None and self._items[place] is item

    def grow(self, item: dict[str, Any], text: str) -> None:
        """
        Add streamed ``text`` to a message's or reasoning item's text.

        The pieces are joined when the items are read: adding each to the
        text would copy the whole text once per piece, a long answer in
        small pieces costing the square of its length.
        """
        if self._growing is None or self._growing[0] is not item:
            self.settle()
            self._growing = (item, [])
        self._growing[1].append(text)

    def settle(self) -> None:
        """Join the open item's streamed pieces into its text."""
        if self._growing is None:
            return
        item, pieces = self._growing
        self._growing = None
        part = item["content"][0] if item["type"] == "message" else item["summary"][0]
        part["text"] += "".join(pieces)

    def describe(self) -> dict[str, Any]:
        """The ``agent.session.turn`` object."""
        return {
            "id": self.id,
            "object": "agent.session.turn",
            "agent_id": self.face.agent["id"],
            "session_id": self.face.id,
            "status": self.status,
            "created_at": self.created_at,
            "started_at": self.started_at,
            "completed_at": self.completed_at,
            "error": self.error,
            "subagent_id": None,
            "usage": self.usage,
        }

    def output_text(self) -> str:
        """The text of the turn's last assistant message."""
        for item in reversed(self.items):
            if item["type"] == "message":
                return "".join(c.get("text", "") for c in item["content"])
        return ""


class SessionFace:
    """
    One engine session seen through the ``/v1`` door.

    :ivar owner: the identity that created it; another one sees a 404.
    :ivar hidden: a session behind a response (not listed with sessions).
    """

    def __init__(
        self,
        engine: AgentSession,
        owner: str,
        agent: dict[str, Any],
        environment: dict[str, Any],
        metadata: dict[str, str],
        hidden: bool = False,
    ) -> None:
        limit = engine.rule.limits.max_event_bytes
        self._setup(
            new_id("agsess_"),
            owner,
            agent,
            environment,
            metadata,
            hidden,
            EventLog(limit or defaults.AGENT_LIMITS["max_event_bytes"]),
        )
        self.engine = engine
        self.redactor = Redactor(
            engine.env[name] for name in engine.entry.env_pass if engine.env.get(name)
        )
        self._unsubscribe = engine.log.subscribe(self._on_engine)

    @property
    def runtime(self) -> str:
        """
        The agent's runtime name, which labels its own tool calls'
        ``server_label`` (as agent-sandbox-server labels them).
        """
        return str(self.agent["runtime"])

    def _setup(
        self,
        face_id: str,
        owner: str,
        agent: dict[str, Any],
        environment: dict[str, Any],
        metadata: dict[str, str],
        hidden: bool,
        log: EventLog,
    ) -> None:
        """What a face holds whether its agent runs or it was restored."""
        self.id = face_id
        self.owner = owner
        self.agent = agent
        self.environment = environment
        self.metadata = metadata
        self.hidden = hidden
        self.created_at = self.last_active_at = int(time.time())
        self.log = log
        self.turns: OrderedDict[str, WireTurn] = OrderedDict()
        self.queue: deque[WireTurn] = deque()
        self.current: WireTurn | None = None
        self.idempotency = IdempotencyBook()
        self.required: OrderedDict[str, dict[str, Any]] = OrderedDict()
        self.failed = False
        #: Fired each time the agent failed and the face went dormant.
        self.fallen: Waiters[None] = Waiters()
        #: A restored session's agent is being started again.
        self.reviving = False
        #: A restored session's last event id as its file had it (0: none).
        self.kept_seq = 0
        self.instructions = agent.get("instructions")
        self._starting: WireTurn | None = None
        self._open: dict[str, Any] | None = None
        self._open_key: tuple[Any, ...] | None = None
        self._tools: dict[str, dict[str, Any]] = {}
        self._shown_busy = False
        self.redactor = Redactor(())
        #: What the agent's CLI reported of its subagents.
        self.subagents = Subagents(self._redacted)
        #: The conversation's latest response, when responses drive it.
        self.last_response_id: str | None = None
        #: The vaults the session was given, and the credentials of theirs
        #: handed to its agent (checked again before every turn).
        self.vault_ids: list[str] = []
        self.credential_ids: list[str] = []
        #: The agent's MCP tools as answers show them (header values masked).
        self.tools: list[dict[str, Any]] = []
        #: Copies a completed turn's written files (artifacts); the turn is
        #: reported completed once the Deferred it returns fires.
        self.snapshot: Callable[[WireTurn], Deferred[None] | None] | None = None
        self._unsubscribe = _nothing

    @classmethod
    def restored(
        cls,
        face_id: str,
        owner: str,
        agent: dict[str, Any],
        environment: dict[str, Any],
        metadata: dict[str, str],
        log: EventLog,
        cwd: str,
        acp_session_id: str | None = None,
        hidden: bool = False,
    ) -> SessionFace:
        """
        A session read back from the state dir: its agent ended with the
        daemon that ran it; the session is ``idle``, its turns, items and
        events are what the caller reads, and new input starts its agent
        again (:meth:`revive`).
        """
        face = cls.__new__(cls)
        face._setup(face_id, owner, agent, environment, metadata, hidden, log)
        # Nothing runs behind it: the stand-in answers the few questions
        # the routes ask of an engine (its state, its held requests).
        face.engine = cast("AgentSession", Dormant(cwd, acp_session_id))
        return face

    @property
    def dormant(self) -> bool:
        """
        Whether no agent runs behind the session: it was restored after a
        restart, or put to sleep (:meth:`sleep`), and has had no input since.
        """
        return isinstance(self.engine, Dormant)

    @property
    def can_sleep(self) -> bool:
        """
        Whether the session's agent could give its slot up now: it runs,
        waits for nothing and holds no turn, so only its warm state is lost.
        """
        return (
            not self.dormant
            and not self.busy
            and not self.failed
            and not self.log.closed
            and self.engine.state == "idle"
        )

    def sleep(self) -> AgentSession:
        """
        Stop following the agent's session, so that its end is not the
        face's: the face stands on a :class:`Dormant` stand-in as after a
        restart (its turns, items, log and responses kept, nothing shown to
        its clients), and new input starts its agent again (:meth:`revive`).

        :return: the engine session, which the caller closes.
        """
        engine = self.engine
        self._unsubscribe()
        self._unsubscribe = _nothing
        self.engine = cast("AgentSession", Dormant(engine.cwd, engine.acp_session_id))
        return engine

    def _idled_out(self, data: dict[str, Any]) -> None:
        """
        The agent is about to be closed for idling: a conversation behind
        responses goes to sleep instead of ending, so that its next
        response (``previous_response_id``, an hour or a week later) starts
        its agent again, as after a restart. Its engine closes on its own.
        """
        if self.hidden and self.can_sleep:
            self.sleep()

    def revive(self, engine: AgentSession) -> None:
        """
        A dormant session's agent runs again (new input came): the face
        follows the new engine session; its log goes on (a client that
        follows it sees the new turn).
        """
        self.engine = engine
        self.redactor = Redactor(
            engine.env[name] for name in engine.entry.env_pass if engine.env.get(name)
        )
        self._unsubscribe = engine.log.subscribe(self._on_engine)

    # -- what the routes show -----------------------------------------------

    @property
    def status(self) -> str:
        """``idle``, ``in_progress``, ``requires_action`` or ``failed``."""
        if self.failed:
            return "failed"
        if self.required:
            return "requires_action"
        if self.current is not None or self.queue:
            return "in_progress"
        return "idle"

    @property
    def busy(self) -> bool:
        """Whether a turn runs or waits."""
        return self.current is not None or bool(self.queue)

    def usage(self) -> dict[str, Any] | None:
        """The sum of the turns' usage, or None when no turn reported any."""
        known = [t.usage for t in self.turns.values() if t.usage]
        if not known:
            return None
        total = token_usage({})
        assert total is not None
        for u in known:
            total["input_tokens"] += u["input_tokens"]
            total["output_tokens"] += u["output_tokens"]
            total["total_tokens"] += u["total_tokens"]
            for part, key in (
                ("input_tokens_details", "cached_tokens"),
                ("output_tokens_details", "reasoning_tokens"),
            ):
                total[part][key] += u[part][key]
        return total

    def describe(self) -> dict[str, Any]:
        """The ``agent.session`` object."""
        error = None
        if self.failed and self.engine.error:
            error = str(self.engine.error.get("message") or self.engine.error)
        return {
            "id": self.id,
            "object": "agent.session",
            "agent": {
                "id": self.agent["id"],
                "name": self.agent.get("name"),
                "model": self.agent["model"],
                "instructions": self.agent.get("instructions"),
                "multi_agent": {"enabled": False},
                "reasoning": {"effort": None, "summary": None},
                "service_tier": "default",
                "text": {"format": {"type": "text"}, "verbosity": "medium"},
                "tools": self.tools,
            },
            "created_at": self.created_at,
            "environment": self.environment,
            "error": error,
            "last_active_at": self.last_active_at,
            "metadata": self.metadata,
            "required_actions": list(self.required.values()),
            "status": self.status,
            "usage": self.usage(),
            "vault_ids": list(self.vault_ids),
        }

    def items(self, turn_id: str | None = None) -> list[dict[str, Any]]:
        """Every item of every kept turn (or of one), in turn order."""
        turns = (
            [self.turns[turn_id]] if turn_id is not None else list(self.turns.values())
        )
        return [item for t in turns for item in t.items]

    # -- input --------------------------------------------------------------

    def submit(
        self,
        text: str,
        blocks: list[dict[str, Any]],
        max_queued: int = defaults.AGENT_LIMITS["max_queued"],
    ) -> WireTurn:
        """
        A turn for ``blocks``: started now on an idle session, else queued
        behind the running one, if fewer than ``max_queued`` wait already
        (the caller's ``limits.max_queued``).
        """
        self.require_live()
        if (self.current is not None or self.queue) and len(self.queue) >= max_queued:
            raise bad_request(
                f"{len(self.queue)} turns are already queued on this session "
                f"(max_queued {max_queued})",
                Code.INVALID_PARAM,
            )
        if self.instructions:
            # Ahead of the first prompt, in its first text block (as the
            # seed sends a definition's instructions to agents without a
            # system prompt of their own).
            head = f"{self.instructions}\n\n---\n\n"
            if blocks and blocks[0].get("type") == "text":
                blocks = [{**blocks[0], "text": head + blocks[0]["text"]}, *blocks[1:]]
            else:
                blocks = [{"type": "text", "text": head}, *blocks]
            self.instructions = None
        turn = WireTurn(self, text, blocks)
        self._keep(turn)
        self.last_active_at = int(time.time())
        if self.current is None and not self.queue:
            try:
                self._start(turn)
            except ApiError:
                # Refused before it began: the caller gets the error, and
                # no trace of a turn is left behind.
                self.turns.pop(turn.id, None)
                raise
        else:
            self.queue.append(turn)
            self._emit_turn("agent.session.turn.created", turn)
        return turn

    def require_live(self) -> None:
        """The session still has an agent to run turns (else 503, final)."""
        _gone(self)

    def cancel(self) -> WireTurn | None:
        """Cancel the running turn (queued ones stay, as the seed does)."""
        turn = self.current
        if turn is not None:
            self.engine.turn_control.cancel()
        return turn

    def cancel_turn(self, turn: WireTurn) -> None:
        """Cancel one turn: a queued one at once, the running one through ACP."""
        if turn in self.queue:
            self.queue.remove(turn)
            self._finish(turn, "cancelled", None)
        elif turn is self.current:
            self.engine.turn_control.cancel()

    def _keep(self, turn: WireTurn) -> None:
        self.turns[turn.id] = turn
        while len(self.turns) > MAX_TURNS_KEPT:
            oldest = next(iter(self.turns.values()))
            if not oldest.ended:
                break
            self.turns.popitem(last=False)

    def _start(self, turn: WireTurn) -> None:
        self._starting = turn
        try:
            self.engine.turn_control.start(turn.blocks)
        except ApiError as e:
            self._starting = None
            if turn.announced:
                turn.error = {"code": "internal_error", "message": e.message}
                self._finish(turn, "failed", None)
            raise
        finally:
            self._starting = None

    def _next(self) -> None:
        while self.queue and self.current is None:
            turn = self.queue.popleft()
            try:
                self._start(turn)
            except ApiError:
                continue
        if self.current is None and not self.queue:
            self._idle()

    # -- the engine's events ------------------------------------------------

    def _on_engine(self, event: Event | None) -> None:
        if event is None:
            self._closed()
            return
        handler = _FOLD.get(event.event)
        if handler is not None:
            handler(self, event.data)

    def _turn_started(self, data: dict[str, Any]) -> None:
        turn = self._starting
        if turn is None:
            # A turn started through the native routes: shown here too.
            turn = WireTurn(self, "", [])
            self._keep(turn)
        turn.engine_id = data.get("turn_id")
        self.current = turn
        turn.status = "in_progress"
        turn.started_at = int(time.time())
        if not self._shown_busy:
            self._shown_busy = True
            self._emit_session("agent.session.in_progress")
        if not turn.announced:
            self._emit_turn("agent.session.turn.created", turn)
        self._emit_turn("agent.session.turn.in_progress", turn)

    def _message(self, data: dict[str, Any]) -> None:
        turn = self.current
        role = data.get("role")
        if turn is None or role not in ("agent", "thought"):
            return
        content = data.get("content")
        text = (
            content.get("text")
            if isinstance(content, dict) and content.get("type") == "text"
            else None
        )
        if not isinstance(text, str):
            return
        key = (role, data.get("message_id"))
        if self._open is not None and self._open_key != key:
            self._close_open("commentary")
        if self._open is None:
            if turn.full:
                self._stop(turn, "max_items")
                return
            self._open_item(turn, role)
            self._open_key = key
        item = self._open
        assert item is not None
        self._delta(turn, item, item["_stream"].feed(text))

    def _delta(self, turn: WireTurn, item: dict[str, Any], text: str) -> None:
        """Append (already redacted) text to an open message or reasoning item."""
        if not text:
            return
        kept = item.get("_bytes", 0) + len(text.encode())
        if kept > self.engine.max_message_bytes:
            # What one line from the agent may hold is what an item keeps;
            # past it the item ends ``incomplete``, as a cut-off answer.
            item["_cut"] = True
            return
        item["_bytes"] = kept
        common = self._item_ref(turn, item)
        turn.grow(item, text)
        if item["type"] == "message":
            self._emit(
                "agent.session.turn.output_text.delta",
                content_index=0,
                delta=text,
                **common,
            )
        else:
            self._emit(
                "agent.session.turn.reasoning_summary_text.delta",
                summary_index=0,
                delta=text,
                **common,
            )

    def _open_item(self, turn: WireTurn, role: str) -> None:
        if role == "agent":
            item: dict[str, Any] = {
                "id": new_id("msg_"),
                "type": "message",
                "role": "assistant",
                "status": "in_progress",
                "turn_id": turn.id,
                "phase": None,
                "content": [{"type": "output_text", "text": ""}],
            }
        else:
            item = {
                "id": new_id("rs_"),
                "type": "reasoning",
                "status": "in_progress",
                "turn_id": turn.id,
                "summary": [{"type": "summary_text", "text": ""}],
            }
        item["_stream"] = self.redactor.stream()
        turn.add(item)
        self._open = item
        common = self._item_ref(turn, item)
        shown = _public(item)
        if item["type"] == "message":
            shown["content"] = []
        else:
            shown["summary"] = []
        self._emit(
            "agent.session.turn.item.added",
            session_id=self.id,
            turn_id=turn.id,
            output_index=common["output_index"],
            item=shown,
        )
        if item["type"] == "message":
            self._emit(
                "agent.session.turn.content_part.added",
                content_index=0,
                part={"type": "output_text", "text": ""},
                **common,
            )
        else:
            self._emit(
                "agent.session.turn.reasoning_summary_part.added",
                summary_index=0,
                part={"type": "summary_text", "text": ""},
                **common,
            )

    def _item_ref(self, turn: WireTurn, item: dict[str, Any]) -> dict[str, Any]:
        return {
            "session_id": self.id,
            "turn_id": turn.id,
            "item_id": item["id"],
            "output_index": turn.index_of(item),
        }

    def _close_open(self, phase: str, cut: bool = False) -> None:
        """
        The open message or reasoning item is done: ``incomplete`` when its
        turn was cut short (cancelled, failed) or it was kept short.
        """
        item, self._open, self._open_key = self._open, None, None
        turn = self.current
        if item is None or turn is None:
            return
        self._delta(turn, item, item["_stream"].flush())
        turn.settle()
        item["status"] = "incomplete" if cut or item.get("_cut") else "completed"
        if item["type"] == "message":
            item["phase"] = phase
        self._emit_closed(turn, item)

    def _emit_closed(self, turn: WireTurn, item: dict[str, Any]) -> None:
        """
        The events that end ``item``: a message's or a thought's text and
        part, then the item itself (a tool call's: the item alone).
        """
        common = self._item_ref(turn, item)
        if item["type"] == "message":
            part = item["content"][0]
            self._emit(
                "agent.session.turn.output_text.done",
                content_index=0,
                text=part["text"],
                **common,
            )
            self._emit(
                "agent.session.turn.content_part.done",
                content_index=0,
                part=dict(part),
                **common,
            )
        elif item["type"] == "reasoning":
            part = item["summary"][0]
            self._emit(
                "agent.session.turn.reasoning_summary_text.done",
                summary_index=0,
                text=part["text"],
                **common,
            )
            self._emit(
                "agent.session.turn.reasoning_summary_part.done",
                summary_index=0,
                part=dict(part),
                **common,
            )
        self._emit_item_done(turn, item)

    def _emit_item_done(self, turn: WireTurn, item: dict[str, Any]) -> None:
        self._emit(
            "agent.session.turn.item.done",
            session_id=self.id,
            turn_id=turn.id,
            output_index=turn.index_of(item),
            item=_public(item),
        )

    def _tool_call(self, data: dict[str, Any]) -> None:
        turn = self.current
        tool_call_id = data.get("tool_call_id")
        if turn is None or not isinstance(tool_call_id, str):
            return
        self._close_open("commentary")
        if turn.full:
            self._stop(turn, "max_items")
            return
        kind = data.get("kind") or "other"
        raw_input = _update_of(data.get("raw")).get("rawInput")
        if kind == "execute":
            command = raw_input.get("command") if isinstance(raw_input, dict) else None
            item: dict[str, Any] = {
                "id": new_id("cmd_"),
                "type": "command_execution",
                "status": "in_progress",
                "turn_id": turn.id,
                "command": str(command or data.get("title") or ""),
                "cwd": self.engine.cwd,
                "output": None,
                "exit_code": None,
                "duration_ms": None,
            }
        else:
            server, name = _mcp_call(data.get("raw"))
            item = {
                # The id tells a real MCP call from the agent's own tool in
                # every later view of the item (stored, streamed): a
                # response's output shows the latter as a ``tool_call``.
                "id": new_id("mcp_" if server else NATIVE_TOOL_PREFIX),
                "type": "mcp_call",
                "status": "in_progress",
                "turn_id": turn.id,
                "server_label": server or self.runtime,
                "name": name or str(data.get("title") or kind),
                "arguments": raw_input if raw_input is not None else {},
                "output": None,
            }
            item["error"] = None  # an item's field, not an error body
        item["_started"] = time.monotonic()
        if item["type"] == "command_execution":
            item["command"] = self.redactor.redact(item["command"])
        else:
            item["arguments"] = self._redacted(item["arguments"])
        item["_tool_call_id"] = tool_call_id
        turn.add(item)
        self._tools[tool_call_id] = item
        self._emit(
            "agent.session.turn.item.added",
            session_id=self.id,
            turn_id=turn.id,
            output_index=turn.index_of(item),
            item=_public(item),
        )
        if data.get("status") in ("completed", "failed"):
            self._tool_done(item, data.get("status"), data.get("content"))

    def _tool_update(self, data: dict[str, Any]) -> None:
        item = self._tools.get(str(data.get("tool_call_id")))
        if item is None or item["status"] != "in_progress":
            return
        status = data.get("status")
        if status in ("completed", "failed"):
            delta = data.get("delta")
            delta = delta if isinstance(delta, dict) else {}
            self._tool_done(item, status, delta.get("content"), delta.get("rawOutput"))

    def _tool_done(
        self, item: dict[str, Any], status: Any, content: Any, raw_output: Any = None
    ) -> None:
        turn = self.current
        if turn is None:
            return
        text = _kept(self.redactor.redact(_content_text(content)))
        item["status"] = "completed" if status == "completed" else "failed"
        if item["type"] == "command_execution":
            item["output"] = text
            item["duration_ms"] = int((time.monotonic() - item["_started"]) * 1000)
            # An agent that ran the command itself may say how it exited;
            # a terminal the daemon ran for it says so below.
            code = raw_output.get("exit_code") if isinstance(raw_output, dict) else None
            if isinstance(code, int) and not isinstance(code, bool):
                item["exit_code"] = code
            self._terminal_result(item)
        elif status == "completed":
            item["output"] = text
        else:
            item["error"] = text or "the tool call failed"
        # Done: nothing more of it is taken (the turn's items keep it).
        self._tools.pop(item["_tool_call_id"], None)
        self._emit(
            "agent.session.turn.item.done",
            session_id=self.id,
            turn_id=turn.id,
            output_index=turn.index_of(item),
            item=_public(item),
        )

    def _terminal_started(self, data: dict[str, Any]) -> None:
        """A command's terminal: its output streams as it is read."""
        turn = self.current
        item = self._tools.get(str(data.get("tool_call_id")))
        terminal = self.engine.terminals.get(str(data.get("terminal_id")))
        if (
            turn is None
            or item is None
            or terminal is None
            or item["type"] != "command_execution"
        ):
            return

        stop: list[Any] = []
        stream = item["_out"] = self.redactor.stream()

        def output(event: Event | None) -> None:
            if event is None or event.event == "exit":
                for unsubscribe in stop:
                    unsubscribe()
            elif item["status"] == "in_progress":
                self._output_delta(item, stream.feed(str(event.data.get("data", ""))))

        for event in terminal.log.since(0)[1]:
            output(event)
        if not terminal.log.closed:
            stop.append(terminal.log.subscribe(output))

    def _subagent(self, data: dict[str, Any]) -> None:
        record, changes = self.subagents.take(data.get("subagent"))
        for change in changes:
            # OpenAI's session events for a subagent (agent-sandbox-server
            # sends none).
            self._emit(
                f"agent.session.subagent.{change}",
                subagent=describe_subagent(record, self.id, self.agent["id"]),
            )

    def _redacted(self, value: Any) -> Any:
        """A JSON value with the secrets in its strings replaced."""
        if not self.redactor.secrets:
            return value
        return json.loads(self.redactor.redact(json.dumps(value)))

    def _output_delta(self, item: dict[str, Any], text: str) -> None:
        """A command's output as it is read (already redacted)."""
        turn = self.current
        if not text or turn is None or not turn.holds(item):
            return
        self._emit(
            "agent.output.command_execution_output.delta",
            session_id=self.id,
            turn_id=turn.id,
            item_id=item["id"],
            output_index=turn.index_of(item),
            delta=text,
        )

    def _terminal_result(self, item: dict[str, Any]) -> None:
        """A command's own command line, output and exit code, from its terminal."""
        for terminal in self.engine.terminals.values():
            if terminal.tool_call_id == item["_tool_call_id"]:
                redact = self.redactor.redact
                item["command"] = redact(" ".join([terminal.command, *terminal.args]))
                item["output"] = redact(terminal.output()["output"])
                item["exit_code"] = terminal.exit_code
        stream = item.get("_out")
        if stream is not None:
            self._output_delta(item, stream.flush())

    def _permission_requested(self, data: dict[str, Any]) -> None:
        turn = self.current
        request_id = data.get("request_id")
        if turn is None or not isinstance(request_id, str):
            return
        held = self.engine.pending.get(request_id)
        if held is None or held.policy.get("decision") != "ask":
            return  # the policy decides it (answered the moment it was asked)
        tool = self.engine.tool_calls.get(str(data.get("tool_call_id"))) or {}
        raw_input = ((data.get("raw") or {}).get("toolCall") or {}).get("rawInput")
        if raw_input is None:
            raw_input = tool.get("rawInput")
        if raw_input is None:
            paths = [
                loc.get("path")
                for loc in tool.get("locations") or []
                if isinstance(loc, dict)
            ]
            raw_input = {"paths": paths} if paths else {}
        title = (
            data.get("title") or tool.get("title") or data.get("kind") or "tool call"
        )
        self.required[request_id] = {
            "type": "mcp_approval_request",
            "request_id": request_id,
            "turn_id": turn.id,
            "request": {
                "type": "mcp_tool_call",
                "server_label": self.runtime,
                "name": str(title),
                "arguments": self._redacted(raw_input),
                "message": self.redactor.redact(f"The agent asks to run: {title}"),
            },
        }
        turn.status = "waiting"
        self._emit_session("agent.session.requires_action")

    def _permission_resolved(self, data: dict[str, Any]) -> None:
        if self.required.pop(str(data.get("request_id")), None) is None:
            return
        turn = self.current
        if not self.required and turn is not None and not turn.ended:
            turn.status = "in_progress"
            self._emit_session("agent.session.in_progress")

    def _stop(self, turn: WireTurn, why: str) -> None:
        """Stop ``turn`` for ``why`` (a bound of its own), once."""
        if turn.stopped_by is None:
            turn.stopped_by = why
            self.engine.turn_control.cancel(why)

    def _cancelling(self, data: dict[str, Any]) -> None:
        """A turn is being cancelled: by its time limit, its error will say."""
        turn = self.current
        if turn is not None and data.get("by") == "max_turn_seconds":
            turn.stopped_by = turn.stopped_by or "max_turn_seconds"

    def _turn_ended(self, data: dict[str, Any]) -> None:
        turn = self.current
        if turn is None or turn.engine_id != data.get("turn_id"):
            return
        cut = data.get("state") == "failed" or data.get("stop_reason") == "cancelled"
        self._close_open("final_answer", cut)
        for item in turn.items:
            if item["status"] == "in_progress":
                item["status"] = "incomplete"
                self._emit_item_done(turn, item)
        engine_turn = self.engine.turns.get(turn.engine_id or "")
        turn.usage = token_usage(engine_turn.usage if engine_turn else None)
        if data.get("state") == "failed":
            error = data.get("error") or {}
            code = _TURN_ERRORS.get(str(error.get("code")), "internal_error")
            turn.error = {"code": code, "message": str(error.get("message") or "")}
            status = "failed"
        elif data.get("stop_reason") == "cancelled":
            status = "cancelled"
        else:
            status = "completed"
        if turn.stopped_by == "max_items":
            status = "failed"  # even when it ended before the cancel came
        if turn.stopped_by is not None and status != "completed":
            # Stopped by a bound, not by its caller: the error says which.
            turn.error = _STOPPED[turn.stopped_by]()
        for request_id in [
            r for r, a in self.required.items() if a["turn_id"] == turn.id
        ]:
            self.required.pop(request_id)
        held = self.snapshot(turn) if status == "completed" and self.snapshot else None
        if held is None:
            self._conclude(turn, status)
        else:
            # The turn's files are copied before it is reported completed,
            # so a client that saw the turn end finds its artifacts.
            held.addBoth(lambda _: self._conclude(turn, status))

    def _conclude(self, turn: WireTurn, status: str) -> None:
        self.current = None
        self._finish(turn, status, turn.usage)
        if self.queue:
            self.engine.reactor.callLater(0, self._next)
        else:
            self._idle()

    def _idle(self) -> None:
        self._shown_busy = False
        self._emit_session("agent.session.idle")

    def _finish(self, turn: WireTurn, status: str, usage: Any) -> None:
        # Its tool calls the agent never said were done are done with it.
        for tool_call_id, item in list(self._tools.items()):
            if item["turn_id"] == turn.id:
                del self._tools[tool_call_id]
        turn.status = status
        turn.completed_at = int(time.time())
        self.last_active_at = turn.completed_at
        extra = {"usage": usage} if usage is not None else {}
        self._emit_turn(f"agent.session.turn.{status}", turn, **extra)
        turn.waiters.fire(None)

    def _session_failed(self, data: dict[str, Any]) -> None:
        if data.get("state") != "failed" or self.failed:
            return
        self.failed = True
        self.required.clear()
        for turn in list(self.queue):
            turn.error = {"code": "sandbox_error", "message": "the agent is gone"}
            self._finish(turn, "failed", None)
        self.queue.clear()
        self._emit_session("agent.session.failed")

    def _closed(self) -> None:
        self._unsubscribe()
        if self.failed and not self.log.closed:
            self._fell()
            return
        for turn in list(self.queue):
            self._finish(turn, "cancelled", None)
        self.queue.clear()
        if not self.log.closed:
            self.log.close()

    def _fell(self) -> None:
        """
        The agent failed on its own (it crashed, or was killed at a turn's
        ``max_turn_seconds``) and its session has ended: the face goes
        dormant, as after a restart, so the session (or conversation) is
        not lost with its agent: its turns, items and log are kept, it is
        ``idle``, and new input starts its agent again (:meth:`revive`,
        resuming the agent's own session when it can).
        """
        engine = self.engine
        self._unsubscribe = _nothing
        turn = self.current
        if turn is not None and not turn.ended:
            turn.error = turn.error or {
                "code": "sandbox_error",
                "message": "the agent is gone",
            }
            self._finish(turn, "failed", turn.usage)
        self.current = None
        self._open = self._open_key = None
        self._tools.clear()
        self.engine = cast("AgentSession", Dormant(engine.cwd, engine.acp_session_id))
        self.failed = False
        self._idle()
        self.fallen.fire(None)

    @property
    def falling(self) -> bool:
        """
        Whether the agent is failing or being killed (a turn it would not
        end was stopped): it is about to go, and the face to go dormant.
        """
        return not self.dormant and (self.failed or self.engine.error is not None)

    def end_restored(self, message: str) -> None:
        """
        A restored session's turns that were running or queued when its
        daemon stopped end ``failed`` with ``message``, in its log too,
        followed by the session's ``idle``.  The log stays open: new input
        starts the agent again and its events follow.
        """
        for turn in self.turns.values():
            if turn.ended:
                continue
            turn.error = {"code": "sandbox_error", "message": message}
            for item in turn.items:
                if item.get("status") == "in_progress":
                    # Ended as a running turn's items end, so a client
                    # following the turn sees each one close.
                    item["status"] = "incomplete"
                    self._emit_closed(turn, item)
            self._finish(turn, "failed", turn.usage)
        self.last_active_at = max(
            [self.last_active_at, *(t.completed_at or 0 for t in self.turns.values())]
        )
        _, tail = self.log.since(self.log.last_seq - 1)
        if not tail or tail[-1].event != "agent.session.idle":
            # Once: a session restored again says nothing new.
            self._emit_session("agent.session.idle")

    # -- the wire log ---------------------------------------------------------

    def _emit(self, type: str, **fields: Any) -> None:
        if self.log.closed:
            return
        data = {"type": type, "event_id": f"evt_{self.log.last_seq + 1:010d}"}
        data.update(fields)
        self.log.append(type, data, json_size(data))

    def _emit_session(self, type: str) -> None:
        self._emit(type, session=self.describe())

    def _emit_turn(self, type: str, turn: WireTurn, **extra: Any) -> None:
        turn.announced = True
        self._emit(
            type, session_id=self.id, turn_id=turn.id, turn=turn.describe(), **extra
        )


class Dormant:
    """The engine of a dormant session: closed, holding nothing."""

    state = "closed"
    error = None
    session_id = ""

    def __init__(self, cwd: str, acp_session_id: str | None = None) -> None:
        self.cwd = cwd
        self.acp_session_id = acp_session_id
        self.pending: dict[str, Any] = {}

    async def close(self, reason: str | None = None) -> None:
        """Nothing runs, so nothing is to close."""


def _nothing() -> None:
    """An unsubscribe with nothing to undo."""


def _gone(face: SessionFace) -> None:
    """The session's agent is gone: 503 ``agent_unavailable``, permanent."""
    if face.failed or face.engine.state in ("closing", "closed", "failed"):
        raise agent_unavailable(
            f"the session's agent is gone ({face.engine.state})",
            state=face.engine.state,
        )


def _public(item: dict[str, Any]) -> dict[str, Any]:
    """An item without the face's own bookkeeping keys."""
    return {k: v for k, v in item.items() if not k.startswith("_")}


def _kept(text: str) -> str:
    """
    At most :data:`OPENAI_ITEM_OUTPUT_CHARS` of a tool's output: its end,
    after a line that says how much went.  The turn's items hold every
    call's output for as long as the session is kept.
    """
    limit = defaults.OPENAI_ITEM_OUTPUT_CHARS
    if len(text) <= limit:
        return text
    return f"[{len(text) - limit} characters not kept]\n" + text[-limit:]


def _content_text(content: Any) -> str:
    """The text of ACP tool-call content (``content`` and ``terminal`` parts)."""
    if not isinstance(content, list):
        return ""
    out = []
    for part in content:
        if isinstance(part, dict):
            inner = part.get("content")
            if isinstance(inner, dict) and isinstance(inner.get("text"), str):
                out.append(inner["text"])
    return "\n".join(out)


_FOLD = {
    "turn.started": SessionFace._turn_started,
    "message.delta": SessionFace._message,
    "tool_call": SessionFace._tool_call,
    "tool_call.update": SessionFace._tool_update,
    "permission.requested": SessionFace._permission_requested,
    "permission.resolved": SessionFace._permission_resolved,
    "turn.ended": SessionFace._turn_ended,
    "turn.cancelling": SessionFace._cancelling,
    "session.state": SessionFace._session_failed,
    "session.idle_timeout": SessionFace._idled_out,
    "terminal.started": SessionFace._terminal_started,
    "subagent": SessionFace._subagent,
}


def _mcp_call(raw: Any) -> tuple[str | None, str | None]:
    """
    The MCP server and tool a tool call (``raw``: its ``session/update``
    notification's parameters) names in its ``_meta``, as the headless
    CLIs' bridge reports an MCP tool; else ``(None, None)``: any other tool
    call is the agent's own (``server_label``: the runtime's name).
    """
    meta = _update_of(raw).get("_meta")
    mcp = meta.get("mcp") if isinstance(meta, dict) else None
    if not isinstance(mcp, dict):
        return None, None
    server, tool = mcp.get("server"), mcp.get("tool")
    if not isinstance(server, str) or not isinstance(tool, str):
        return None, None
    return server, tool


def _update_of(raw: Any) -> dict[str, Any]:
    """The ``update`` of a ``session/update`` notification's parameters."""
    update = raw.get("update") if isinstance(raw, dict) else None
    return update if isinstance(update, dict) else {}
