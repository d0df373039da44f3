# -*- test-case-name: tests.web.test_pipeline -*-
"""
The daemon's shared state, handed to every handler as ``request.context``.

One object per daemon holds what the doors and the group modules share: the
route table and router, the compiled policy (swapped whole on reload),
limiters, the audit log, the command registry, and each group's service as
a typed attribute.  Nothing of this lives at module level, so two daemons in
one process (tests, an embedding application) share none of it.
"""

from __future__ import annotations

import socket
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol, cast

import attrs
from twisted.internet.defer import Deferred
from twisted.internet.interfaces import IDelayedCall, IReactorTime
from twisted.logger import Logger

from sandboxd.access.audit import AuditLog
from sandboxd.access.links import LinkTable
from sandboxd.access.metrics import Metrics
from sandboxd.access.tracing import Tracer, TraceSettings
from sandboxd.commands import CommandRegistry
from sandboxd.daemon.firstuse import ServiceOnFirstUse
from sandboxd.daemon.listener import OwnPorts
from sandboxd.daemon.scratch import Scratch
from sandboxd.endpoints import RouteTable
from sandboxd.policy import Policy
from sandboxd.policy.limits import ConcurrencyGate, RateLimiter
from sandboxd.processes.table import ChildTable
from sandboxd.threads import in_pool
from sandboxd.web.routing import Router

if TYPE_CHECKING:
    from sandboxd.agents.manager import AgentManager
    from sandboxd.browser.supervisor import BrowserSupervisor
    from sandboxd.files.uploads import UploadTable
    from sandboxd.files.watch import WatchService
    from sandboxd.kernels.service import CodeService
    from sandboxd.lsp.service import LspService
    from sandboxd.processes.service import ProcessService
    from sandboxd.terminals.service import TerminalService


log = Logger(namespace="sandboxd.daemon.context")


class Reactor(Protocol):
    """
    What the daemon asks of its reactor: a clock, processes and a thread
    pool (Twisted's reactor provides all of it; the in-memory harness of
    :mod:`sandboxd.testing` passes a ``MemoryReactorClock``, which has the
    clock only).
    """

    def seconds(self) -> float: ...

    def callLater(
        self, delay: float, callable: Callable[..., Any], *args: Any, **kw: Any
    ) -> IDelayedCall: ...

    def spawnProcess(self, *args: Any, **kwargs: Any) -> Any: ...

    def getThreadPool(self) -> Any: ...


def as_clock(reactor: Reactor) -> IReactorTime:
    """The reactor where Twisted asks for an ``IReactorTime`` (a zope
    interface, which a typing Protocol cannot stand for)."""
    return cast(IReactorTime, reactor)


@attrs.define(eq=False)
class Context:
    """Everything a request may need beyond itself."""

    reactor: Reactor
    table: RouteTable
    policy: Policy
    registry: CommandRegistry
    audit: AuditLog
    router: Router = attrs.field(init=False)
    rates: RateLimiter = attrs.field(init=False)
    concurrency: ConcurrencyGate = attrs.field(factory=ConcurrencyGate, init=False)
    children: ChildTable = attrs.field(factory=ChildTable, init=False)
    #: The SSE streams open now, through any door (``GET /metrics``).
    streams: set[Any] = attrs.field(factory=set, init=False)
    #: The groups' services (:mod:`sandboxd.daemon.services`); all but the
    #: processes' and the terminals' are built on first use.
    processes: ProcessService | None = attrs.field(default=None, init=False)
    terminals: TerminalService | None = attrs.field(default=None, init=False)
    watches: ServiceOnFirstUse[WatchService] | None = attrs.field(
        default=None, init=False
    )
    #: The resumable uploads open now (``files_uploads_*``).
    uploads: ServiceOnFirstUse[UploadTable] | None = attrs.field(
        default=None, init=False
    )
    browser: ServiceOnFirstUse[BrowserSupervisor] | None = attrs.field(
        default=None, init=False
    )
    agents: ServiceOnFirstUse[AgentManager] | None = attrs.field(
        default=None, init=False
    )
    #: The git group's remote jobs (``sandboxd.git.jobs.GitJobTable``),
    #: made on the group's first remote call.
    git_jobs: Any = attrs.field(default=None, init=False)
    git_keep_budget: Any = attrs.field(default=None, init=False)
    #: The repositories with a writing git call in flight: their locks, by git dir.
    git_locks: dict[str, Any] = attrs.field(factory=dict, init=False)
    #: Code contexts (kernels), built on the code group's first request.
    code: ServiceOnFirstUse[CodeService] | None = attrs.field(default=None, init=False)
    #: Language servers, built on the lsp group's first request.
    lsp: ServiceOnFirstUse[LspService] | None = attrs.field(default=None, init=False)
    #: Paths the site hands to a door of their own before the JSON
    #: pipeline (``/mcp``), to the door's ``exchange``.
    doors: dict[bytes, Any] = attrs.field(factory=dict, init=False)
    #: The E2B door's service (``sandboxd.e2b.service.E2BService``), when
    #: ``--e2b-port`` is given; typed loosely because the door imports the
    #: routes, which import this module.
    e2b: Any = attrs.field(default=None, init=False)
    #: The KEP door's service (``sandboxd.kep.service.KepService``), when
    #: ``--kep-rest-port`` is given.
    kep: Any = attrs.field(default=None, init=False)
    hostname: str = attrs.field(factory=socket.gethostname, init=False)
    started_at: float = attrs.field(factory=time.time, init=False)
    pty_port: int | None = None
    pty_listen: str | None = None
    #: The capability links minted by this daemon (SPEC §23).
    links: LinkTable = attrs.field(init=False)
    #: ``--preview-public-url`` (wins over the policy's).
    preview_public_url: str | None = attrs.field(default=None, init=False)
    #: Every port the daemon listens on (never previewable).
    own_ports: OwnPorts = attrs.field(factory=OwnPorts, init=False)
    #: The preview door's service (``sandboxd.preview.service.PreviewService``),
    #: when ``--preview-port`` is given.
    preview: Any = attrs.field(default=None, init=False)
    #: The daemon's own directory in the temporary directory.
    scratch: Scratch = attrs.field(factory=Scratch, init=False)
    #: What ``GET /metrics`` reports (counted as requests are answered).
    metrics: Metrics = attrs.field(factory=Metrics, init=False)
    #: Each call's span and trace ids (sends nothing unless the daemon is
    #: built with a collector to send to).
    tracer: Tracer = attrs.field(factory=lambda: Tracer(TraceSettings()), init=False)
    #: ``--pty-public-url``: the base of every ``ws_url`` (wins over the policy's).
    pty_public_url: str | None = None
    http_port: int | None = None
    draining: bool = False
    #: ``--state-dir`` (or ``$ABX_SERVER_STATE_DIR``): where what must outlive
    #: a restart is kept (capability links' counts and revocations, the /v1
    #: door's sessions, files and webhook endpoints); None: nothing is, but
    #: the /v1 door's files go to ``$XDG_STATE_HOME/sandboxd``.
    state_dir: str | None = None

    def __attrs_post_init__(self) -> None:
        self.router = Router(self.table)
        self.rates = RateLimiter(as_clock(self.reactor))
        # The clock is asked when a link is minted or checked, not now: a
        # reactor that is never run (a MemoryReactor building a daemon) has none.
        self.links = LinkTable.for_key_file(
            self.policy.document.link_key_file,
            lambda: self.reactor.seconds(),
            self.state_dir,
        )
        self._end_orphaned_links()

    def _end_orphaned_links(self) -> None:
        """
        End for good the links of identities the policy no longer has, and
        those made with a token it no longer has.
        """
        ended = self.links.end_orphans(self.policy.tokens)
        for rotated, why in (
            (False, "are not in the policy"),
            (True, "changed tokens"),
        ):
            links = [link for link in ended if link.minter_rotated is rotated]
            if links:
                log.info(
                    "sandboxd: {count} link(s) ended: their minters ({minters}) {why}",
                    count=len(links),
                    minters=", ".join(sorted({link.claims.sub for link in links})),
                    why=why,
                )

    @property
    def base_dir(self) -> str:
        """The path boundary of the policy in force."""
        return self.policy.base_dir

    def in_thread(self, f: Callable[..., Any], *args: Any, **kw: Any) -> Deferred[Any]:
        """Run blocking work (a walk, a /proc scan) in the reactor's thread pool."""
        return in_pool(self.reactor, f, *args, **kw)

    def replace_policy(self, policy: Policy) -> None:
        """Swap in a new compiled policy (reload); buckets start afresh."""
        policy.tokens.learn_from(self.policy.tokens)
        self.policy = policy
        self.rates.forget()
        self._end_orphaned_links()
