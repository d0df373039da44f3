# -*- test-case-name: tests.kernels.test_contexts -*-
"""
The ``code`` group's service: its contexts, the kernel hubs (one per user
the kernels run as), the spilled display items, the idle sweep, and the
orderly stop.

Built on the group's first request (a
:class:`~sandboxd.daemon.firstuse.ServiceOnFirstUse` until then); a user's hub
child starts with that user's first context and again after it dies.
"""

from __future__ import annotations

import functools
import hashlib
import os
import secrets
import shutil
from typing import Any

from twisted.application.service import Service
from twisted.internet.defer import Deferred, DeferredList
from twisted.internet.interfaces import IDelayedCall
from twisted.logger import Logger

from sandboxd.errors import ApiError, Code, limit_exceeded, not_found
from sandboxd.kernels.contexts import CodeContext, Execution, hub_key
from sandboxd.kernels.hubclient import HubClient
from sandboxd.kernels.jsontext import SMALL_OUTPUT_BYTES
from sandboxd.libc import QuietTrim
from sandboxd.policy import defaults
from sandboxd.processes.command import RunAs
from sandboxd.processes.environment import child_environment
from sandboxd.waiters import Waiters

log = Logger(namespace="sandboxd.kernels")


class CodeService(Service):
    """Every code context of the daemon."""

    def __init__(self, context: Any) -> None:
        """:param context: the daemon's :class:`~sandboxd.daemon.context.Context`."""
        self.context = context
        self.reactor = context.reactor
        self.children = context.children
        self.contexts: dict[str, CodeContext] = {}
        #: One hub per user its kernels run as (by uid).
        self._hubs: dict[int, HubClient] = {}
        self.hub_starts = 0
        self._hub_deaths: dict[int, list[float]] = {}
        self._sweep: IDelayedCall | None = None
        #: Where display values over ``max_display_bytes`` are kept, made
        #: at the first (a daemon that never spills, or never starts, makes
        #: none to leave behind).
        self.spill_dir: str | None = None
        #: oid -> (context id, path, mime, bytes)
        self.outputs: dict[str, tuple[str, str, str, int, str]] = {}
        self.spilled_bytes = 0
        #: (identity id, language) -> the context E2B's ``/execute`` uses
        #: when it names none (made on first use).
        self.e2b_defaults: dict[tuple[str, str], str] = {}
        #: The same keys -> the calls waiting while that default is made.
        self.e2b_pending: dict[tuple[str, str], Waiters[CodeContext]] = {}
        self.heap_trim = QuietTrim(self.reactor, defaults.HEAP_TRIM_QUIET_SECONDS)

    # -- the hubs --------------------------------------------------------------

    def hub(self, run_as: RunAs | None = None) -> HubClient:
        """
        The hub of ``run_as``'s kernels, started now if none runs.

        One hub per user, running as that user: a hub connects to the
        sockets its kernels bind in a directory their user owns, so a hub
        as root would follow wherever that user points them; as the user it
        can reach nothing the user could not, and holds no other user's
        kernels (their keys, their output).
        """
        key = hub_key(run_as)
        hub = self._hubs.get(key)
        if hub is None or hub.gone:
            env = child_environment(self.context, None)
            own = key == os.geteuid()
            hub = HubClient(
                self.reactor,
                self.children,
                env,
                # Somewhere any user may be (the base dir may be closed to them).
                self.context.base_dir if own else "/",
                functools.partial(self._hub_event, key),
                functools.partial(self._hub_exited, key),
                run_as=None if own else run_as,
            )
            self._hubs[key] = hub
            self.hub_starts += 1
        return hub

    def hub_send(self, run_as: RunAs | None, command: dict[str, Any]) -> None:
        """Send to ``run_as``'s hub if one runs (a command for a gone hub is moot)."""
        hub = self._hubs.get(hub_key(run_as))
        if hub is not None and not hub.gone:
            hub.send(command)

    def _hub_event(self, key: int, event: dict[str, Any]) -> None:
        cid = event.get("cid")
        ctx = self.contexts.get(cid) if isinstance(cid, str) else None
        # A hub speaks only for its own user's contexts (one that names
        # another's is ignored: it runs as a user whose code could write
        # to its pipe).
        if ctx is not None and ctx.hub_key == key and not ctx.builtin:
            ctx.hub_event(event)

    def _hub_exited(self, key: int, reason: str) -> None:
        log.warn(
            "the kernel hub of uid {uid} is gone: {reason}", uid=key, reason=reason
        )
        if not self.running:
            return
        now = self.reactor.seconds()
        deaths = [t for t in self._hub_deaths.get(key, []) if now - t < 60] + [now]
        self._hub_deaths[key] = deaths
        served = [c for c in self.contexts.values() if c.hub_key == key]
        if len(deaths) > defaults.CODE_HUB_RESTARTS_PER_MINUTE:
            # A hub that keeps dying is not restarted in a loop: its
            # contexts fail (restart or delete them; a later one tries again).
            self._hub_deaths.pop(key, None)
            for ctx in served:
                ctx.hub_failed(reason)
            return
        for ctx in served:
            ctx.hub_lost()

    # -- contexts --------------------------------------------------------------

    def add(self, ctx: CodeContext) -> None:
        """Register a new context (its kernel starts next)."""
        self.contexts[ctx.id] = ctx
        self._arm_sweep()

    def get(self, cid: str, identity: Any) -> CodeContext:
        """
        The context ``cid`` if ``identity`` may see it (``acts_for`` its owner).

        :raises ApiError: 404 for an unknown id and for another identity's
            context alike (its existence is not disclosed).
        """
        ctx = self.contexts.get(cid)
        if ctx is None or not identity.acts_for(ctx.owner):
            raise not_found(f"no code context {cid!r}")
        return ctx

    def kernel_ports(self) -> set[int]:
        """The TCP ports the live kernels listen on for themselves (never previewed)."""
        ports: set[int] = set()
        for ctx in self.contexts.values():
            ports.update(ctx.kernel_ports)
        return ports

    def visible(self, identity: Any) -> list[CodeContext]:
        """The contexts ``identity`` may see."""
        return [c for c in self.contexts.values() if identity.acts_for(c.owner)]

    def check_room(self, identity: Any, limits: dict[str, Any]) -> None:
        """
        :raises ApiError: 429 ``too_many_contexts`` at ``max_contexts`` or
            ``max_contexts_per_identity``.
        """
        live = [c for c in self.contexts.values() if c.state != "closed"]
        total = limits["max_contexts"]
        mine = limits["max_contexts_per_identity"]
        if len(live) >= total:
            raise _too_many(
                f"{len(live)} code contexts are open (max_contexts {total})", total
            )
        own = sum(1 for c in live if c.owner == identity.root)
        if own >= mine:
            raise _too_many(
                f"you have {own} code contexts open (max_contexts_per_identity {mine})",
                mine,
            )

    def remove(self, ctx: CodeContext) -> Deferred[None]:
        """Close ``ctx`` and forget it (and its spilled outputs)."""
        self.contexts.pop(ctx.id, None)
        for oid, (cid, path, _, size, _) in list(self.outputs.items()):
            if cid == ctx.id:
                self._drop_output(oid, path, size)
        return ctx.close()

    def execution_ended(self, ctx: CodeContext, x: Execution) -> None:
        """
        An execution ended (the idle clock restarts). After a big output,
        or once one is forgotten, the memory freed goes back to the system
        when no more come for a while.
        """
        ctx.touch()
        if x.big_output or ctx.forgotten_bytes >= SMALL_OUTPUT_BYTES:
            self.heap_trim.soon()

    # -- display spill -----------------------------------------------------------

    def spill(
        self, ctx: CodeContext, x: Execution, data: dict[str, Any]
    ) -> tuple[dict[str, Any], list[dict[str, Any]]]:
        """
        Keep display values within ``max_display_bytes`` each (and the
        execution's results within ``max_output_bytes``): a bigger one is
        written to a file served by ``code_output_get`` as it is (see
        :func:`served_bytes`) and replaced by a ``ref``.
        """
        out: dict[str, Any] = {}
        refs: list[dict[str, Any]] = []
        for mime, value in data.items():
            text = value if isinstance(value, str) else None
            encoded = (
                text.encode("utf-8", "surrogatepass")
                if text is not None
                else _json_bytes(value)
            )
            size = len(encoded)
            over_item = size > x.limits.max_display_bytes
            over_total = x.results_bytes + size > x.limits.max_output_bytes
            if not over_item and not over_total:
                out[mime] = value
                x.results_bytes += size
                continue
            # The ref describes the bytes its URL serves (what a client
            # that checks the digest of its download has), not the value
            # as the kernel sent it.
            served = served_bytes(mime, encoded)
            ref: dict[str, Any] = {
                "mime": mime,
                "bytes": len(served),
                "sha256": hashlib.sha256(served).hexdigest(),
            }
            spilled = None
            if self.spilled_bytes + len(served) <= defaults.CODE_MAX_SPILL_BYTES:
                spilled = self._spill(served)
            if spilled is not None:
                oid, path = spilled
                self.outputs[oid] = (ctx.id, path, mime, len(served), ref["sha256"])
                self.spilled_bytes += len(served)
                ref["oid"] = oid
                ref["url"] = f"/code/contexts/{ctx.id}/outputs/{oid}"
            else:
                ref["dropped"] = True
            refs.append(ref)
        return out, refs

    def _spill(self, encoded: bytes) -> tuple[str, str] | None:
        """
        Write a display item to the spill directory: its oid and path, or None when
        the disk cannot take it (full, or no descriptor left), in which case
        nothing of it is left there and the item is reported dropped.
        """
        oid = "o_" + secrets.token_hex(8)
        if self.spill_dir is None:
            try:
                self.spill_dir = self.context.scratch.mkdtemp("sandboxd-code-out-")
            except OSError:
                return None
        path = os.path.join(self.spill_dir, oid)
        # One bounded write (max_display_bytes or less) to a private
        # directory; a thread would reorder the events.
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        except OSError:
            return None
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(encoded)
        except OSError:
            try:
                os.unlink(path)
            except OSError:
                pass
            return None
        return oid, path

    def output(self, ctx: CodeContext, oid: str) -> tuple[str, str, int, str]:
        """``(path, mime, bytes, sha256)`` of a spilled item of ``ctx``."""
        entry = self.outputs.get(oid)
        if entry is None or entry[0] != ctx.id:
            raise not_found(f"no output {oid!r} in {ctx.id}")
        return entry[1], entry[2], entry[3], entry[4]

    def _drop_output(self, oid: str, path: str, size: int) -> None:
        self.outputs.pop(oid, None)
        self.spilled_bytes -= size
        try:
            os.unlink(path)
        except OSError:
            pass

    # -- idle sweep and stop -------------------------------------------------------

    def _arm_sweep(self) -> None:
        # Often enough for the shortest idle timeout of the contexts open.
        every = min(
            [defaults.CODE_SWEEP_SECONDS]
            + [max(0.5, c.idle_timeout / 2) for c in self.contexts.values()]
        )
        if self._sweep is not None and self._sweep.active():
            if self._sweep.getTime() - self.reactor.seconds() <= every:
                return
            self._sweep.cancel()
        self._sweep = self.reactor.callLater(every, self._sweep_idle)

    def _sweep_idle(self) -> None:
        import time

        self._sweep = None
        now = time.monotonic()
        for ctx in list(self.contexts.values()):
            # Only a context waiting for work is idle (not one starting,
            # restarting or running); a dead one nobody restarts would
            # hold its slot and its outputs for good.
            idle = ctx.state == "idle" and ctx.current is None and not ctx.queue
            closable = idle or ctx.state == "dead"
            if closable and now - ctx.last_activity > ctx.idle_timeout:
                log.info(
                    "code context {id} {state}: closed", id=ctx.id, state=ctx.state
                )
                self.remove(ctx)
        if self.contexts:
            self._arm_sweep()

    def stopService(self) -> Deferred[None]:
        """Close every context, then the hub; bounded by the kill grace."""
        super().stopService()  # type: ignore[no-untyped-call]
        if self._sweep is not None and self._sweep.active():
            self._sweep.cancel()
        self.heap_trim.cancel()
        waits: list[Deferred[Any]] = [
            self.remove(c) for c in list(self.contexts.values())
        ]
        waits += [hub.stop() for hub in self._hubs.values() if not hub.gone]
        done: Deferred[Any] = DeferredList(waits, consumeErrors=True)

        def cleanup(_: Any) -> None:
            spill_dir, self.spill_dir = self.spill_dir, None
            if spill_dir is not None:
                shutil.rmtree(spill_dir, ignore_errors=True)

        done.addCallback(cleanup)
        return done


def _too_many(message: str, limit: int) -> ApiError:
    return limit_exceeded(429, message, Code.TOO_MANY_CONTEXTS, limit=limit)


def served_bytes(mime: str, encoded: bytes) -> bytes:
    """
    What ``code_output_get`` serves of a display value: a raster image
    decoded from the base64 Jupyter sends it in (a client saving it gets
    the image), anything else as it came.
    """
    if mime.startswith("image/") and not mime.startswith("image/svg"):
        import base64
        import binascii

        try:
            return base64.b64decode(encoded, validate=False)
        except (binascii.Error, ValueError):
            return encoded
    return encoded


def _json_bytes(value: Any) -> bytes:
    import json

    return json.dumps(value, separators=(",", ":")).encode()
