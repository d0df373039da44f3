# -*- test-case-name: tests.test_cli -*-
"""
Assembling the daemon: the policy, the context, the listeners and the group
services, under one ``MultiService`` that starts and stops them in order.

``twistd sandboxd`` (:mod:`sandboxd.daemon.tap`), ``sandboxd serve``
(:mod:`sandboxd.cli`) and the Python API (:class:`SandboxServer`,
:func:`start`) all build the daemon here.
"""

from __future__ import annotations

import gc
import importlib
import importlib.util
import os
import re
import signal
import sys
import threading
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import attrs
from twisted.application.service import MultiService
from twisted.internet.defer import Deferred, DeferredList, maybeDeferred
from twisted.internet.error import CannotListenError
from twisted.internet.interfaces import IReactorFromThreads
from twisted.internet.task import LoopingCall
from twisted.logger import Logger

from sandboxd._version import __version__
from sandboxd.access import guard
from sandboxd.access.audit import AuditLog
from sandboxd.access.held import end_revoked as end_revoked_held
from sandboxd.access.links import ExpiryWatch
from sandboxd.access.tracing import Tracer, TraceSettings
from sandboxd.commands import CommandRegistry, default_registry
from sandboxd.daemon import hardening
from sandboxd.daemon.context import Context, as_clock
from sandboxd.daemon.listener import OwnEndpoint
from sandboxd.daemon.readiness import ListenAfter, Listener, all_listening
from sandboxd.daemon.scratch import sweep
from sandboxd.daemon.services import setup_services
from sandboxd.daemon.startup import (
    StartRefused,
    address_text,
    check_base_dir,
    check_children_user,
    check_endpoint,
    check_exposure,
    default_host,
    exposed,
    groups_on,
    import_commands,
    interface_of,
    load_everyday,
    startup_line,
    state_dir_problem,
)
from sandboxd.endpoints import RouteTable
from sandboxd.files.atomic import abort_unfinished_at_shutdown
from sandboxd.libc import libc, trim_when_free
from sandboxd.policy import Policy, PolicyError, load_policy
from sandboxd.policy.defaults import (
    HEAP_KEPT_FREE_BYTES,
    HEAP_MMAP_THRESHOLD_BYTES,
    HEAP_TRIM_QUIET_SECONDS,
    SHUTDOWN_TIMEOUT_SECONDS,
    TRACE_STOP_SECONDS,
)
from sandboxd.policy.lint import template_warnings
from sandboxd.processes.cgroups import CHILD_CGROUPS
from sandboxd.processes.environment import BOOT_ENVIRON, login_defaults
from sandboxd.processes.priority import CHILD_PRIORITY
from sandboxd.processes.strays import end_strays
from sandboxd.processes.tree import marker_scope
from sandboxd.routes import default_table
from sandboxd.web.connections import ConnectionLimits
from sandboxd.web.factory import SandboxSite
from sandboxd.web.sse import end_revoked

log = Logger(namespace="sandboxd")

#: No --host: numeric ports bind loopback without a token, every interface
#: with one (SPEC §20, :func:`sandboxd.daemon.startup.default_host`).
DEFAULT_HOST: str | None = None
DEFAULT_PORT = 9000
DEFAULT_PTY_PORT = 9001

#: When start-up's garbage is collected and its free heap handed back: after
#: the listeners (so it never delays the first /health), well before anyone
#: measures idle memory.
TRIM_AFTER_SECONDS = 0.25


def listen_string(port: str | int, host: str | None) -> str:
    """A Twisted endpoint string from a port number or an endpoint string."""
    text = str(port)
    if text.isdigit() and host is not None:
        interface = host.replace(":", "\\:")
        text = f"tcp:{text}:interface={interface}"
    # A bare number (no interface known yet) is made a string later.
    return text if text.isdigit() else check_endpoint(text)


def port_number(description: str) -> int | None:
    """The TCP port of an endpoint string, when it has one."""
    parts = description.split(":")
    if parts[0] in ("tcp", "ssl", "tls") and len(parts) > 1 and parts[1].isdigit():
        return int(parts[1])
    for part in parts:
        if part.startswith("port="):
            return int(part[5:])
    return None


def default_pty_port(http: str) -> str:
    """
    The PTY port when none is given: the HTTP port's number plus one (the
    client's default too), so a second daemon on another ``--port`` does
    not collide on 9001; 0 (a port the kernel picks) when the HTTP port is
    0; 9001 when the HTTP listener has no number (a unix socket).
    """
    number = port_number(http)
    if number is None:
        return str(DEFAULT_PTY_PORT)
    return "0" if number == 0 else str(number + 1)


def code_files(specs: Iterable[str]) -> list[str]:
    """
    The code the daemon runs as its own: each ``--commands`` template (its
    file and the bytecode Python caches for it; a package's whole
    directory), sandboxd's own package, and its virtualenv.  A caller who
    could write one of them would run code as the daemon's user at the
    next start, so no path operation reaches them (when they are inside
    the base dir; elsewhere the guard changes nothing).
    """
    found = [os.path.dirname(os.path.dirname(os.path.abspath(__file__)))]
    if os.path.exists(os.path.join(sys.prefix, "pyvenv.cfg")):
        found.append(sys.prefix)
    for spec in specs:
        if spec.endswith(".py") or os.sep in spec:
            origin: str | None = os.path.abspath(spec)
        else:
            module = sys.modules.get(spec)
            origin = getattr(module, "__file__", None)
            if origin is None:
                try:
                    found_spec = importlib.util.find_spec(spec)
                except (ImportError, ValueError):
                    found_spec = None
                origin = found_spec.origin if found_spec is not None else None
        if not origin or not os.path.isabs(origin):
            continue
        folder, name = os.path.split(origin)
        if name == "__init__.py":
            found.append(folder)
            continue
        found.append(origin)
        found.append(os.path.join(folder, "__pycache__", os.path.splitext(name)[0]))
    return found


@attrs.define
class Settings:
    """Everything needed to build a daemon (command line or Python API)."""

    #: A port number (bound on ``host``) or a Twisted endpoint string.
    port: str = str(DEFAULT_PORT)
    pty_port: str | None = None
    #: The interface numeric ports bind; None: loopback without a token.
    host: str | None = DEFAULT_HOST
    #: Serve a non-loopback listener with no token (SPEC §20).
    allow_unauthenticated: bool = False
    #: The base of the ``ws_url`` clients are given (SPEC §20).
    pty_public_url: str | None = None
    #: The E2B-compatible port (SPEC §18); None: it does not listen.
    e2b_port: str | None = None
    #: The preview door (SPEC §23); None: it does not listen.
    preview_port: str | None = None
    #: Where browsers reach the door (wins over the policy's).
    preview_public_url: str | None = None
    #: A second listener of the E2B door (E2B's code-interpreter port).
    e2b_code_port: str | None = None
    #: agent-sandbox's REST filesystem API (KEP-539.2); None: the KEP door
    #: does not listen.
    kep_rest_port: str | None = None
    #: agent-sandbox's gRPC ProcessService, beside the REST port.
    kep_grpc_port: str | None = None
    #: What KEP paths are relative to; None: the base dir.
    kep_root: str | None = None
    policy: Any = None
    policy_file: str | None = None
    preset: str | None = None
    base_dir: str | None = None
    commands: tuple[str, ...] = ()
    audit_log: str | None = None
    #: The file twistd logs to (``--logfile``), absolute; None: no file.
    log_file: str | None = None
    #: Where the daemon keeps what must outlive it (capability links' counts
    #: and revocations, the ``/v1`` door's sessions, files and webhook
    #: endpoints); None: see :func:`state_dir`.
    state_dir: str | None = None
    environ: Mapping[str, str] | None = None
    #: Work in the base dir, so children started there need no chdir
    #: (the fast posix_spawn path).  Off for embedded and test daemons,
    #: whose host process owns its working directory.
    chdir: bool = False
    #: Refuse a policy reload that would run children as root (a root
    #: daemon with tokens and no ``params.default_user``), as the start is
    #: refused.  On for the daemon the command line starts; embedded and
    #: test daemons decide for themselves.
    root_children_check: bool = False
    #: HTTP connection bounds (None: ``$ABX_MAX_CONNECTIONS`` and friends,
    #: else the defaults; see :class:`~sandboxd.web.connections.ConnectionLimits`).
    max_connections: int | None = None
    max_connections_per_address: int | None = None
    head_deadline: float | None = None
    idle_timeout: float | None = None
    body_min_rate: float | None = None


def release_memory() -> None:
    """
    Hand the heap that start-up left free back to the system.

    Importing Twisted, autobahn and pyOpenSSL peaks well above what the idle
    daemon uses; glibc keeps that memory unless asked (a few MB of idle RSS).
    The objects start-up created live as long as the daemon: freezing them
    keeps every later full collection from walking them again (tens of
    milliseconds of pause each time otherwise).  The console script and the
    twistd plugin turn the collector off for the start-up; it is turned
    back on here, once the daemon listens.
    """
    gc.collect()
    gc.freeze()
    gc.enable()
    trim = getattr(libc(), "malloc_trim", None)
    if trim is not None:
        trim(0)
    steady_heap()


#: glibc's ``mallopt`` parameters (``malloc.h``).
M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3


def steady_heap() -> None:
    """
    Keep the heap that big outputs free for the next ones, up to a bound.

    A big output (a code context's 10 MiB print: its pieces, its text,
    its document) is tens of megabytes allocated and freed again with each
    execution. glibc gives the top of its heap back to the system once
    more than its trim threshold is free there, and maps blocks over its
    mmap threshold afresh each time; both thresholds start low and rise
    only as blocks of the size are freed, so whether the next output
    reuses memory or faults every page of it in again (several times the
    cost of the copies that fill it) hung on the order of earlier
    allocations. These are the values glibc itself rises to at most
    (``DEFAULT_MMAP_THRESHOLD_MAX`` on 64-bit, and twice that), set from
    the start: the free heap kept stays within them.
    """
    mallopt = getattr(libc(), "mallopt", None)
    if mallopt is not None:
        mallopt(M_MMAP_THRESHOLD, HEAP_MMAP_THRESHOLD_BYTES)
        mallopt(M_TRIM_THRESHOLD, 2 * HEAP_MMAP_THRESHOLD_BYTES)


class DaemonService(MultiService):
    """
    The whole daemon; stops listeners first, then every group's children.

    ``MultiService`` stops its children concurrently; sandboxd needs an
    order (no new requests while children are being killed) and a bound
    (a stop that never finishes would hang twistd forever).
    """

    def __init__(
        self,
        context: Context,
        listeners: list[Any],
        groups: list[Any],
        settings: Settings,
    ) -> None:
        super().__init__()
        self.context = context
        self.settings = settings
        self.listeners = listeners
        self.groups = groups
        for service in groups + listeners:
            service.setServiceParent(self)
        #: The handlers this service replaced, put back when it has stopped.
        self._previous_signals: dict[int, Any] = {}
        self._trim: Any = None
        #: What a reload reads for its environment: the one the daemon
        #: started with.  ``POST /env`` changes ``os.environ`` (for the
        #: children started later); that must not reach the configuration.
        self._environ: Mapping[str, str] = (
            dict(os.environ) if settings.environ is None else settings.environ
        )
        #: Hands the free heap back now and then (:meth:`_sweep_heap`).
        self.heap_sweep = LoopingCall(self._sweep_heap)
        self.heap_sweep.clock = as_clock(context.reactor)
        #: Ends what a link held open when it is revoked or expires.
        self.link_watch = ExpiryWatch(
            as_clock(context.reactor), context.links, self._end_disallowed
        )

    def privilegedStartService(self) -> None:
        """
        Listen (twistd calls this first, before dropping privileges).

        :raises StartRefused: when a listener cannot bind (SPEC §20).
        """
        try:
            super().privilegedStartService()
        except CannotListenError as e:
            raise StartRefused(_cannot_listen(e)) from None

    def startService(self) -> None:
        """
        Start the group services, then listen; warn when wide open.

        :raises StartRefused: when a listener cannot bind (SPEC §20), after
            stopping what had started.
        """
        # Before any service can start a child: a child left in the
        # daemon's cgroup would keep it from handing its controllers down.
        CHILD_CGROUPS.configure(self.context.policy.document.cgroups)
        try:
            super().startService()
        except CannotListenError as e:
            self.stopService()
            raise StartRefused(_cannot_listen(e)) from None
        policy = self.context.policy
        if policy.tokens.local_mode:
            for description in self.listen_descriptions():
                if exposed(description):
                    log.warn(
                        "sandboxd: NO TOKEN is configured and {port} listens on {iface} "
                        "(--allow-unauthenticated): anyone who can reach it controls "
                        "this sandbox. Set ABX_SERVER_TOKEN_FILE or policy auth.tokens.",
                        port=description,
                        iface=interface_of(description),
                    )
        for problem in self.context.tracer.problems:
            log.warn("sandboxd: traces: {problem}", problem=problem)
        for warning in policy.warnings:
            # Not ``warning=``: an event with that key is, to Twisted's
            # legacy observers, a Python warning, formatted with a
            # ``filename`` this event does not have (KeyError in the log).
            log.warn("sandboxd: policy warning: {text}", text=warning)
        for warning in template_warnings(
            self.context.registry, self.context.table, policy.document
        ):
            log.warn("sandboxd: template warning: {text}", text=warning)
        log.info(
            "{line}",
            line=startup_line(
                __version__,
                self.bound_addresses(),
                policy,
                groups_on(policy, self.context.table),
                self.context.tracer.destination,
            ),
        )
        CHILD_PRIORITY.configure(policy.document.priority)
        abort_unfinished_at_shutdown(self.context.reactor)
        if self.settings.environ is None:
            self._fill_login_environ()
            self._hide_secrets()
        self._install_hup()
        self._enter_base_dir()
        self.context.children.scope = marker_scope(self.context.policy.base_dir)
        self._clean_up_after_killed_daemons()
        self._trim = self.context.reactor.callLater(TRIM_AFTER_SECONDS, self._settle)
        self.heap_sweep.start(HEAP_TRIM_QUIET_SECONDS, now=False)
        self.link_watch.start()

    def _clean_up_after_killed_daemons(self) -> None:
        """
        End the processes daemons killed outright left running
        (:mod:`sandboxd.processes.strays`) and remove what they left in the
        temporary directory (:mod:`sandboxd.daemon.scratch`), on a thread of
        its own that ends with the work: the pool's threads, once started,
        stay, and a fresh daemon starts none until a call needs one.  A
        reactor that takes nothing from threads (a test's, in memory)
        leaves it.
        """
        reactor: Any = self.context.reactor
        if not IReactorFromThreads.providedBy(reactor):
            return
        scope = self.context.children.scope

        def work() -> None:
            try:
                ended = end_strays(scope)
                removed = sweep()
            except Exception as e:  # reported; the daemon goes on
                reactor.callFromThread(
                    log.warn,
                    "sandboxd: what stopped daemons left was not cleaned up: {e}",
                    e=e,
                )
            else:
                reactor.callFromThread(_ended, ended)
                reactor.callFromThread(_swept, removed)

        try:
            threading.Thread(target=work, name="sandboxd-sweep", daemon=True).start()
        except RuntimeError as e:
            log.warn(
                "sandboxd: no thread to clean up what stopped daemons left: {e}", e=e
            )

    def _settle(self) -> None:
        """
        Once the daemon listens: the everyday groups' handlers loaded
        (:func:`sandboxd.daemon.startup.load_everyday`), then start-up's
        heap handed back (:func:`release_memory`, which also freezes what
        the loading made).
        """
        load_everyday(self.context.policy, self.context.table)
        release_memory()

    def _sweep_heap(self) -> None:
        """
        The free heap back to the system once it holds more than a bound.

        :func:`steady_heap` lets the heap keep what big outputs free for the
        next ones; code executions give it back once they stop
        (:class:`~sandboxd.libc.QuietTrim`), and this catches the rest (a
        big command output, a download, an upload's body) so that an idle
        daemon never holds more than the bound for longer than a period.
        """
        trim_when_free(HEAP_KEPT_FREE_BYTES)

    def listen_descriptions(self) -> list[str]:
        """The endpoint strings of the listeners this daemon opens."""
        descriptions = [s.endpoint_description for s in self.listeners]
        if self.context.policy.rules["pty_connect"].enabled and self.context.pty_listen:
            descriptions.append(self.context.pty_listen)
        e2b = self.context.e2b
        if e2b is not None and self.context.policy.rules["e2b"].enabled:
            descriptions.append(e2b.description)
            if e2b.code_description is not None:
                descriptions.append(e2b.code_description)
        preview = self.context.preview
        if preview is not None and self.context.policy.rules["preview_proxy"].enabled:
            descriptions.append(preview.description)
        kep = self.context.kep
        if kep is not None and self.context.policy.rules["kep"].enabled:
            descriptions.append(kep.description)
            if kep.grpc_description is not None:
                descriptions.append(kep.grpc_description)
        return descriptions

    def bound_addresses(self) -> list[tuple[str, str]]:
        """``(name, address)`` of every listener that is listening now."""
        found: list[tuple[str, str]] = []
        for service in self.listeners:
            waiting = getattr(service, "_waitingForPort", None)
            result = getattr(waiting, "result", None)
            if result is not None and hasattr(result, "getHost"):
                found.append((service.name, address_text(result.getHost())))
            else:
                found.append((service.name, service.endpoint_description))
        terminals = self.context.terminals
        port = getattr(terminals, "port", None)
        if port is not None:
            found.append(("pty", address_text(port.getHost())))
        e2b_port = getattr(self.context.e2b, "port", None)
        if e2b_port is not None:
            found.append(("e2b", address_text(e2b_port.getHost())))
        code_port = getattr(self.context.e2b, "code_port", None)
        if code_port is not None:
            found.append(("e2b-code", address_text(code_port.getHost())))
        preview_port = getattr(self.context.preview, "port", None)
        if preview_port is not None:
            found.append(("preview", address_text(preview_port.getHost())))
        for name, attribute in (("kep-rest", "port"), ("kep-grpc", "grpc_port")):
            kep_port = getattr(self.context.kep, attribute, None)
            if kep_port is not None:
                found.append((name, address_text(kep_port.getHost())))
        return found

    def _fill_login_environ(self) -> None:
        """``HOME``, ``USER``, ``LOGNAME`` and ``PATH`` for children, where missing."""
        added = login_defaults(os.environ, os.geteuid())
        if not added:
            return
        os.environ.update(added)
        BOOT_ENVIRON.update(added)
        users = sorted(
            {
                rule.params.default_user
                for rule in self.context.policy.rules.values()
                if rule.params.default_user
            }
            if os.geteuid() == 0
            else set()
        )
        log.info("{note}", note=login_environ_note(added, users))

    def _hide_secrets(self) -> None:
        """
        Keep the daemon's secrets out of its children's reach through
        ``/proc/<daemon pid>`` (see :mod:`sandboxd.daemon.hardening`).
        """
        names = set(self.context.policy.secret_env_names())
        names.update(n for n in os.environ if n.startswith("ABX_SERVER_"))
        scrubbed = hardening.scrub_startup_environ(names)
        if scrubbed:
            log.info(
                "sandboxd: {names} removed from /proc/{pid}/environ",
                names=", ".join(sorted(scrubbed)),
                pid=os.getpid(),
            )
        if not hardening.forbid_tracing():
            log.warn(
                "sandboxd: prctl(PR_SET_DUMPABLE, 0) failed; same-user children can read the daemon's memory"
            )

    def _enter_base_dir(self) -> None:
        policy = self.context.policy
        guard.pin_anchors(
            policy.anchors, policy.base_dir, guard.allowed_roots(policy.rules.values())
        )
        if self.settings.chdir and os.path.isdir(self.context.base_dir):
            os.chdir(self.context.base_dir)

    def _install_hup(self) -> None:
        """
        SIGHUP reloads the policy (and reopens the audit file).  SIGUSR1
        rotates a twistd log file; with none to rotate (``sandboxd serve``
        logs to stdout) it reopens the audit file, or is logged and
        ignored.  SIGQUIT stops the daemon as SIGTERM does (some images'
        ``STOPSIGNAL``, nginx's graceful stop); SIGUSR2 is logged and
        ignored.  Each of these signals' default action would kill the
        daemon with no stop at all, orphaning its children.
        """
        reactor = self.context.reactor
        if not hasattr(reactor, "callFromThread") or not hasattr(signal, "SIGHUP"):
            return

        def usr1() -> None:
            if self.context.audit.path is None:
                log.info(
                    "sandboxd: SIGUSR1 ignored: there is no log file to rotate"
                    " (the log goes to stdout)"
                )
            else:
                self.context.audit.reopen("SIGUSR1")

        def quit_() -> None:
            log.info("sandboxd: SIGQUIT: stopping, as for SIGTERM")
            running: Any = reactor
            if running.running:
                running.stop()

        try:
            self._previous_signals[signal.SIGHUP] = signal.signal(
                signal.SIGHUP, lambda *_: reactor.callFromThread(self.reload)
            )
            for signum, act in (
                (signal.SIGUSR1, usr1),
                (signal.SIGQUIT, quit_),
                (
                    signal.SIGUSR2,
                    lambda: log.info("sandboxd: SIGUSR2 ignored: it asks nothing"),
                ),
            ):
                if signal.getsignal(signum) in (signal.SIG_DFL, None):
                    self._previous_signals[signum] = signal.signal(
                        signum, lambda *_, act=act: reactor.callFromThread(act)
                    )
        except ValueError:
            pass  # not the main thread (tests)

    def _hold_signals(self) -> None:
        """
        For the rest of the stop, SIGHUP, SIGTERM and SIGINT are logged
        (once each) and otherwise ignored: SIGHUP's default action would
        kill the daemon before its children are ended, and Twisted's own
        SIGTERM handler would try to stop a reactor already stopping.
        """
        reactor = self.context.reactor
        if not hasattr(reactor, "callFromThread") or not hasattr(signal, "SIGHUP"):
            return
        seen: set[int] = set()

        def held(signum: int, frame: Any) -> None:
            if signum in seen:
                return
            seen.add(signum)
            reactor.callFromThread(
                log.info,
                "sandboxd: {name} while stopping: ignored, the stop goes on",
                name=signal.Signals(signum).name,
            )

        for signum in (signal.SIGHUP, signal.SIGTERM, signal.SIGINT, signal.SIGQUIT):
            try:
                previous = signal.signal(signum, held)
            except ValueError:
                return  # not the main thread (tests)
            self._previous_signals.setdefault(signum, previous)

    def _restore_signals(self) -> None:
        """Put back the handlers this service replaced."""
        for signum, previous in self._previous_signals.items():
            try:
                signal.signal(signum, previous)
            except (ValueError, TypeError):
                pass  # not the main thread, or a handler not set from Python
        self._previous_signals.clear()

    def reload(self) -> bool:
        """Re-read the policy; an invalid one is refused and the old one stays."""
        # A reload is what logrotate's postrotate sends: the audit file is
        # reopened whatever becomes of the policy.
        self.context.audit.reopen("a reload")
        s = self.settings
        try:
            policy = load_policy(
                self.context.table,
                explicit=s.policy,
                path=s.policy_file or self.context.policy.file,
                preset=s.preset,
                base_dir=s.base_dir,
                environ=self._environ,
                daemon_files=daemon_files(s, self._environ),
            )
            # The start's checks, the exposure rule with them: a policy
            # that drops the last token must not leave a listener that
            # every interface reaches open to anyone.
            check_start(s, policy, self._environ)
            if s.root_children_check:
                check_children_user(policy, self.context.table, os.geteuid())
        except PolicyError as e:
            log.error(
                "sandboxd: policy reload refused, the old policy stays: {error}",
                error=str(e),
            )
            self.context.metrics.reloads["refused"] += 1
            return False
        before = self.context.policy.tokens
        self.context.replace_policy(policy)
        CHILD_PRIORITY.configure(policy.document.priority)
        CHILD_CGROUPS.configure(policy.document.cgroups)
        self.context.metrics.reloads["ok"] += 1
        self._enter_base_dir()
        for door in self.context.doors.values():
            door.policy_reloaded()
        if self.context.e2b is not None:
            self.context.e2b.policy_reloaded()
        if self.context.preview is not None:
            self.context.preview.policy_reloaded()
        if self.context.kep is not None:
            self.context.kep.policy_reloaded()
        if self.context.agents is not None:
            self.context.agents.policy_reloaded()
        # Connections admitted under the old policy that it no longer lets in.
        self._end_disallowed(before)
        log.info(
            "sandboxd: policy reloaded (revision {revision})", revision=policy.revision
        )
        return True

    def _end_disallowed(self, before: Any = None) -> None:
        """
        End every connection that lasts as long as its client keeps it
        (terminal sockets, event streams, the doors' held streams) whose
        caller the policy no longer lets in, or whose link has ended; after
        a reload, ``before`` (the replaced policy's identities) also ends
        the terminals and the coding agents of an identity taken out.
        """
        if self.context.terminals is not None:
            self.context.terminals.factory.policy_reloaded(before)
        mcp = self.context.doors.get(b"/mcp")
        if mcp is not None:
            mcp.end_disallowed()
        agents = self.context.agents.existing() if self.context.agents else None
        if agents is not None and before is not None:
            agents.owners_removed(before)
        end_revoked(self.context)
        end_revoked_held(self.context)

    def stopService(self) -> Deferred[Any]:
        """Stop listening, end every child, flush the audit log; bounded."""
        self.running = False
        self.context.draining = True
        self.link_watch.stop()
        CHILD_PRIORITY.restore()
        if self._trim is not None and self._trim.active():
            self._trim.cancel()
        if self.heap_sweep.running:
            self.heap_sweep.stop()
        self._hold_signals()
        listeners = DeferredList(
            [maybeDeferred(s.stopService) for s in self.listeners], consumeErrors=True
        )

        def stop_groups(_: Any) -> Deferred[Any]:
            return DeferredList(
                [maybeDeferred(s.stopService) for s in reversed(self.groups)],
                consumeErrors=True,
            )

        d: Deferred[Any] = listeners.addCallback(stop_groups)
        d.addTimeout(SHUTDOWN_TIMEOUT_SECONDS, as_clock(self.context.reactor))
        d.addErrback(
            lambda f: log.warn(
                "sandboxd: shutdown timed out: {f}", f=f.getErrorMessage()
            )
        )
        d.addBoth(lambda _: self._last_spans())

        def flush(_: Any) -> None:
            self.context.audit.flush()
            self.context.scratch.close()
            CHILD_CGROUPS.restore()
            self._restore_signals()
            # twistd re-raises the stopping signal at exit so the status
            # reads "killed by SIGTERM"; after a graceful stop SPEC §1 wants
            # exit 0, so forget the signal (twistd reads it after run()).
            reactor: Any = self.context.reactor
            if getattr(reactor, "_exitSignal", None) is not None:
                reactor._exitSignal = None

        return d.addBoth(flush)

    def _last_spans(self) -> Deferred[Any]:
        """The spans of the last calls to the collector, within a bound."""
        clock = as_clock(self.context.reactor)
        d = maybeDeferred(self.context.tracer.stop, TRACE_STOP_SECONDS)
        d.addTimeout(TRACE_STOP_SECONDS, clock)
        d.addErrback(
            lambda f: log.warn(
                "sandboxd: traces: the last spans were not sent: {f}",
                f=f.getErrorMessage(),
            )
        )
        return d.addBoth(lambda _: self.context.tracer.close())


def build_tracer(environ: Mapping[str, str], reactor: Any) -> Tracer:
    """
    The daemon's tracer: with an exporter when the environment names a
    collector (the exporter's module is imported only then), else one that
    only reads ids.  What could not be taken is in its ``problems``, for
    the start to log.
    """
    settings = TraceSettings.from_environ(environ)
    problems = list(settings.problems)
    exporter = None
    if settings.endpoint is not None:
        from sandboxd.access.otlp import Exporter

        try:
            exporter = Exporter(settings, reactor)
        except ValueError as e:
            problems.append(f"{e}; no spans are sent")
    tracer = Tracer(settings, reactor, exporter)
    tracer.problems = tuple(problems)
    return tracer


def _cannot_listen(error: CannotListenError) -> str:
    """``sandboxd: cannot listen on HOST:PORT: <the OS's reason>``."""
    where = error.interface or "*"
    port = f"[{where}]:{error.port}" if ":" in where else f"{where}:{error.port}"
    cause = error.socketError
    reason = getattr(cause, "strerror", None) or str(cause)
    return f"sandboxd: cannot listen on {port}: {reason}"


def connection_limits(settings: Settings) -> ConnectionLimits:
    """
    The HTTP connection bounds of ``settings`` (or their environment).

    :raises PolicyError: for a bound that is not a positive number.
    """
    try:
        return ConnectionLimits.from_settings(
            os.environ if settings.environ is None else settings.environ,
            settings.max_connections,
            settings.max_connections_per_address,
            settings.head_deadline,
            settings.idle_timeout,
            settings.body_min_rate,
        )
    except ValueError as e:
        raise PolicyError(f"connection limits: {e}") from None


def validate_settings(settings: Settings, table: RouteTable | None = None) -> Policy:
    """
    Import the commands and check the policy, the base dir and the
    listeners' exposure, as the daemon would at start.

    :return: the compiled policy, which :func:`build` can be given so that
        a start compiles it once.
    :raises PolicyError: for anything that must stop the start.
    """
    connection_limits(settings)
    for spec in settings.commands:
        import_commands(spec)
    environ = os.environ if settings.environ is None else settings.environ
    table = table if table is not None else default_table()
    policy = compile_policy(settings, table, environ)
    check_start(settings, policy, environ)
    check_children_user(policy, table, os.geteuid())
    return policy


def compile_policy(
    settings: Settings, table: RouteTable, environ: Mapping[str, str]
) -> Policy:
    """The policy the settings name, compiled against ``table``."""
    return load_policy(
        table,
        explicit=settings.policy,
        path=settings.policy_file,
        preset=settings.preset,
        base_dir=settings.base_dir,
        environ=environ,
        daemon_files=daemon_files(settings, environ),
    )


def listeners_of(
    settings: Settings, policy: Policy, environ: Mapping[str, str]
) -> tuple[str, str]:
    """
    The HTTP and PTY endpoint strings: numeric ports bind ``--host``, or
    loopback without a token and every interface with one; the PTY port
    follows the HTTP port's interface.
    """
    host = settings.host if settings.host is not None else default_host(policy)
    http = listen_string(settings.port, host)
    pty = settings.pty_port or environ.get("ABX_PTY_PORT") or default_pty_port(http)
    return http, listen_string(pty, interface_of(http))


def _ended(ended: list[tuple[int, str]]) -> None:
    if ended:
        log.warn(
            "sandboxd: ended {count} process(es) a daemon that stopped without "
            "ending them left running: {which}",
            count=len(ended),
            which=", ".join(f"{pid} ({name})" for pid, name in ended),
        )


def _swept(removed: list[str]) -> None:
    for path in removed:
        log.info(
            "sandboxd: removed {path}, left by a daemon that stopped without "
            "cleaning up",
            path=path,
        )


def check_start(
    settings: Settings, policy: Policy, environ: Mapping[str, str]
) -> tuple[str, str]:
    """
    Refuse a start that cannot serve or would serve everyone (SPEC §20).

    :return: the HTTP and PTY endpoint strings.
    :raises PolicyError: naming the base dir or the listener.
    """
    check_base_dir(policy.base_dir)
    http, pty = listeners_of(settings, policy, environ)
    opened = [http, pty] if policy.rules["pty_connect"].enabled else [http]
    e2b = e2b_listen(settings, http)
    if e2b is not None and policy.rules["e2b"].enabled:
        opened.append(e2b)
        code = e2b_code_listen(settings, http)
        if code is not None:
            opened.append(code)
    preview = preview_listen(settings, http)
    if preview is not None and policy.rules["preview_proxy"].enabled:
        opened.append(preview)
    kep = kep_listen(settings.kep_rest_port, http)
    if kep is not None and policy.rules["kep"].enabled:
        opened.append(kep)
        grpc = kep_listen(settings.kep_grpc_port, http)
        if grpc is not None:
            opened.append(grpc)
    check_exposure(opened, policy, settings.allow_unauthenticated)
    return http, pty


def e2b_code_listen(settings: Settings, http: str) -> str | None:
    """The E2B door's second (code-interpreter) listener, if asked for."""
    if not settings.e2b_code_port or not settings.e2b_port:
        return None
    return listen_string(settings.e2b_code_port, interface_of(http))


def e2b_listen(settings: Settings, http: str) -> str | None:
    """The E2B port's endpoint string (a number binds the HTTP port's interface)."""
    if not settings.e2b_port:
        return None
    return listen_string(settings.e2b_port, interface_of(http))


def kep_listen(port: str | None, http: str) -> str | None:
    """A KEP listener's endpoint string (a number binds the HTTP port's interface)."""
    if not port:
        return None
    return listen_string(port, interface_of(http))


def preview_listen(settings: Settings, http: str) -> str | None:
    """The preview door's endpoint string (a number binds the HTTP port's interface)."""
    if not settings.preview_port:
        return None
    return listen_string(settings.preview_port, interface_of(http))


#: Endpoint-string options that name a TLS file (``ssl:``), the directory
#: of keys and certificates (``tls:``'s ``path``) or the listener's socket
#: (``unix:``'s ``path``).
_TLS_FILE_OPTIONS = (
    "privateKey",
    "certKey",
    "extraCertChain",
    "dhParameters",
    "caCertsDir",
    "path",
)

#: The OpenTelemetry variables that name the trace exporter's CA bundle,
#: client certificate and client key.
_OTLP_FILE_VARIABLES = tuple(
    f"OTEL_EXPORTER_OTLP_{scope}{name}"
    for scope in ("", "TRACES_")
    for name in ("CERTIFICATE", "CLIENT_CERTIFICATE", "CLIENT_KEY")
)


def tls_files(description: str) -> list[str]:
    """
    The files and directories of keys and certificates an endpoint string
    names: ``ssl:``'s options, and ``tls:``'s directory, its first
    positional argument, which the listener re-reads for a new name.
    """
    parts = [p.replace("\\:", ":") for p in re.split(r"(?<!\\):", description)]
    found = []
    for part in parts[1:]:
        name, equals, value = part.partition("=")
        if equals and name in _TLS_FILE_OPTIONS and value:
            found.append(value)
    if parts[0] == "tls" and len(parts) > 1 and "=" not in parts[1] and parts[1]:
        found.append(parts[1])
    return found


def state_dir(settings: Settings, environ: Mapping[str, str]) -> str | None:
    """
    The state directory, absolute: ``--state-dir``, else
    ``$ABX_SERVER_STATE_DIR``, else agent-sandbox-server's
    ``$ABX_AGENTS_STATE_DIR``; None: nothing outlives the daemon.
    """
    found = (
        settings.state_dir
        or environ.get("ABX_SERVER_STATE_DIR")
        or environ.get("ABX_AGENTS_STATE_DIR")
    )
    return os.path.abspath(found) if found else None


def login_environ_note(added: Mapping[str, str], default_users: Sequence[str]) -> str:
    """
    The start's line about the login variables it filled in for children:
    which ones, and who gets them.  A root daemon's children that run as
    ``params.default_user`` get that user's instead, so the line must not
    say every child gets root's.
    """
    values = ", ".join(f"{k}={v}" for k, v in sorted(added.items()))
    line = f"sandboxd: {', '.join(sorted(added))} not set in the daemon's environment;"
    if not default_users:
        return f"{line} children get {values}"
    who = ", ".join(repr(u) for u in default_users)
    return (
        f"{line} children run as the daemon's user get {values}; those run as"
        f" another user (params.default_user {who}) get that user's"
    )


def daemon_files(settings: Settings, environ: Mapping[str, str]) -> list[str]:
    """
    Files of the daemon's that the policy does not name: the audit log,
    twistd's log (the audit's home without one), the TLS keys and
    certificates of its listeners and of the trace exporter, and the code
    it runs (:func:`code_files`).  A key read through the file API lets
    anyone on the path impersonate the daemon; a log deleted erases the
    trail.
    """
    files = [settings.audit_log or environ.get("ABX_SERVER_AUDIT_LOG") or ""]
    files.append(settings.log_file or "")
    files += [environ.get(name, "").strip() for name in _OTLP_FILE_VARIABLES]
    files += code_files(settings.commands)
    files.append(state_dir(settings, environ) or "")
    for listener in (
        settings.port,
        settings.pty_port or environ.get("ABX_PTY_PORT"),
        settings.e2b_port,
        settings.preview_port,
        settings.e2b_code_port,
        settings.kep_rest_port,
        settings.kep_grpc_port,
    ):
        files += tls_files(listener or "")
    return [f for f in files if f]


def build(
    settings: Settings,
    reactor: Any = None,
    table: RouteTable | None = None,
    registry: CommandRegistry | None = None,
    policy: Policy | None = None,
) -> DaemonService:
    """
    Build (but do not start) the daemon service.

    :param policy: what :func:`validate_settings` returned for the same
        settings and table (the command line checks them first); else the
        commands are imported and the policy compiled here.
    """
    if reactor is None:
        from twisted.internet import reactor as global_reactor

        reactor = global_reactor
    environ = os.environ if settings.environ is None else settings.environ
    table = table if table is not None else default_table()
    registry = registry if registry is not None else default_registry
    if policy is None:
        for spec in settings.commands:
            import_commands(spec)
        policy = compile_policy(settings, table, environ)
    http_listen, pty_listen = check_start(settings, policy, environ)
    registry.freeze()
    table.freeze()
    context = Context(
        reactor=reactor,
        table=table,
        policy=policy,
        registry=registry,
        audit=AuditLog(settings.audit_log or environ.get("ABX_SERVER_AUDIT_LOG")),
        state_dir=state_dir(settings, environ),
    )
    problem = state_dir_problem(context.state_dir)
    if problem is not None:
        # Warned, not refused: everything else the daemon serves works.
        log.warn("sandboxd: WARNING: {problem}", problem=problem)
    context.tracer = build_tracer(environ, reactor)
    context.http_port = port_number(http_listen)
    context.pty_listen = pty_listen
    context.pty_public_url = settings.pty_public_url
    context.preview_public_url = settings.preview_public_url
    context.pty_port = port_number(context.pty_listen)
    groups = setup_services(context)
    e2b = e2b_listen(settings, http_listen)
    if e2b is not None:
        from sandboxd.e2b import setup as setup_e2b

        groups.append(
            setup_e2b(
                context,
                e2b,
                connection_limits(settings),
                e2b_code_listen(settings, http_listen),
            )
        )
    preview = preview_listen(settings, http_listen)
    if preview is not None:
        from sandboxd.preview import setup as setup_preview

        groups.append(setup_preview(context, preview, connection_limits(settings)))
    kep = kep_listen(settings.kep_rest_port, http_listen)
    if kep is not None:
        from sandboxd.kep import setup as setup_kep

        groups.append(
            setup_kep(
                context,
                kep,
                kep_listen(settings.kep_grpc_port, http_listen),
                settings.kep_root,
                connection_limits(settings),
            )
        )
    site = SandboxSite(context, reactor=reactor, limits=connection_limits(settings))
    context.metrics.site = site
    # /health answers only once the policy is in force and every other
    # listener listens (sandboxd.daemon.readiness): the HTTP port opens last.
    endpoint = ListenAfter(
        OwnEndpoint(context, http_listen), lambda: all_listening(groups)
    )
    http = Listener(endpoint, site)
    # A port that cannot bind fails the start (SPEC §20), not just a log line.
    http._raiseSynchronously = True
    http.endpoint_description = http_listen  # type: ignore[attr-defined]
    http.setName("http")
    return DaemonService(context, [http], groups, settings)


class SandboxServer:
    """
    The Python interface: ``SandboxServer(...).serve(port=9000)``.

    ``serve()`` freezes the command registry and route table, then runs the
    reactor until :meth:`shutdown` or a signal stops it.
    """

    def __init__(
        self,
        host: str | None = DEFAULT_HOST,
        registry: CommandRegistry | None = None,
        route_table: RouteTable | None = None,
        policy: Any = None,
        base_dir: str | None = None,
        preset: str | None = None,
    ) -> None:
        self.host = host
        self.registry = registry
        self.route_table = route_table
        self.policy = policy
        self.base_dir = base_dir
        self.preset = preset
        self.daemon: DaemonService | None = None
        self._reactor: Any = None

    def build(
        self,
        port: int | str = DEFAULT_PORT,
        pty_port: int | str | None = None,
        reactor: Any = None,
    ) -> DaemonService:
        """The daemon service, unstarted (for embedding in another application)."""
        settings = Settings(
            port=listen_string(port, self.host),
            pty_port=listen_string(pty_port, self.host)
            if pty_port is not None
            else None,
            host=self.host,
            policy=self.policy,
            preset=self.preset,
            base_dir=self.base_dir,
        )
        self.daemon = build(settings, reactor, self.route_table, self.registry)
        return self.daemon

    def serve(
        self, port: int | str = DEFAULT_PORT, pty_port: int | str | None = None
    ) -> None:
        """Run the daemon in the foreground until interrupted."""
        from twisted.internet import reactor

        self._reactor = reactor
        daemon = self.build(port, pty_port, reactor)
        daemon.startService()
        reactor.addSystemEventTrigger("before", "shutdown", daemon.stopService)
        reactor.run()

    def shutdown(self) -> None:
        """Stop a daemon started by :meth:`serve` (thread-safe)."""
        if self._reactor is not None:
            self._reactor.callFromThread(self._reactor.stop)


def start(
    port: int = DEFAULT_PORT, host: str | None = DEFAULT_HOST, **kwargs: Any
) -> None:
    """Blocking convenience: ``start(9000)`` serves until interrupted."""
    SandboxServer(host=host, **kwargs).serve(port)
