"""Shared test fixtures: a real daemon on loopback, in a temporary base dir."""

from __future__ import annotations

import json
import os
import random
import shutil
import socket
import tempfile
import time
from collections.abc import Iterator
from typing import Any

from twisted.internet import reactor
from twisted.internet.defer import inlineCallbacks
from twisted.trial.unittest import SkipTest, TestCase

from sandboxd import sysinfo
from sandboxd.processes.tree import proc_info
from sandboxd.testing import RunningDaemon, start_daemon

#: Ports this test process has handed out (never twice).
_HANDED_OUT: set[int] = set()


def _ephemeral_floor() -> int:
    """The lowest port the kernel picks for ``bind(0)`` and outgoing connections."""
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def without_netlink(test: Any) -> None:
    """
    For the rest of ``test``, no netlink socket can be made (as in a
    sandbox runtime that offers none): what asks the kernel through
    ``sock_diag`` must read ``/proc`` instead.
    """
    real = socket.socket

    def no_netlink(*args: Any, **kwargs: Any) -> socket.socket:
        if (args[:1] or [kwargs.get("family")])[0] == socket.AF_NETLINK:
            raise OSError(97, "Address family not supported by protocol")
        return real(*args, **kwargs)

    test.patch(socket, "socket", no_netlink)


def free_port() -> int:
    """
    A loopback port nothing listens on, for a server a test starts on a
    port it must name in advance (a child process's command line).

    Taken below the kernel's ephemeral range: a port the kernel handed out
    for ``bind(0)`` and released is soon handed out again, to another
    test's server or to any outgoing connection's own end, so a child
    started on it met "Address already in use" now and then.  This process
    never hands a port out twice; two test processes picking the same one
    at once is left to the bind check (one in thousands of ports).
    """
    top = _ephemeral_floor()
    for _ in range(200):
        port = random.randrange(max(1024, top - 12000), top)
        if port in _HANDED_OUT:
            continue
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
        _HANDED_OUT.add(port)
        return port
    raise RuntimeError("no free loopback port below the ephemeral range")


def tcp_rows() -> Iterator[list[str]]:
    """
    The host's TCP sockets, one row of ``/proc/net/tcp`` or ``tcp6`` each,
    split into fields: ``[1]`` the local address (``ADDR:PORT`` in hex),
    ``[3]`` the state (``0A`` is LISTEN), ``[9]`` the inode.
    """
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table) as f:
                rows = f.read().splitlines()[1:]
        except OSError:
            continue
        for row in rows:
            yield row.split()


def listening_inodes(port: int | None = None) -> set[str]:
    """
    The inodes of the sockets listening on ``port`` (on any port: None),
    as the daemon finds them (asked of the kernel: each read of the
    ``/proc`` tables walks its whole connection table, milliseconds, and
    the waits for a child's port poll this).
    """
    return {
        str(inode)
        for _, _, bound, inode in sysinfo.listening_sockets()
        if port is None or bound == port
    }


def fd_targets(pid: int | str) -> Iterator[tuple[str, str]]:
    """
    ``(/proc/PID/fd/N, what it points at)`` for each descriptor process
    ``pid`` has open (gone: none; one closed meanwhile is skipped).
    """
    try:
        names = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return
    for name in names:
        link = f"/proc/{pid}/fd/{name}"
        try:
            target = os.readlink(link)
        except OSError:
            continue
        yield link, target


def unnamed_files(directory: str, pid: int | str = "self") -> list[str]:
    """
    The files process ``pid`` writes in ``directory`` (or below it) that
    have no name yet (an upload's, made with ``O_TMPFILE``), as the
    ``/proc/PID/fd/N`` paths that read them.
    """
    top = os.path.realpath(directory)
    found = []
    for link, target in fd_targets(pid):
        where, _, rest = target.rpartition("/#")
        if (
            rest.endswith(" (deleted)")
            and rest[: -len(" (deleted)")].isdigit()
            and (where == top or where.startswith(top + "/"))
        ):
            found.append(link)
    return found


def socket_inodes(pid: int) -> set[str]:
    """The inodes of the sockets process ``pid`` has open (gone: none)."""
    return {
        target[8:-1] for _, target in fd_targets(pid) if target.startswith("socket:[")
    }


def someone_listens(port: int) -> bool:
    """Whether any process listens on ``port`` (any address, IPv4 or IPv6)."""
    return bool(listening_inodes(port))


def session_listens(sid: int, port: int) -> bool:
    """
    Whether a process of session ``sid`` holds the socket listening on
    ``port``.

    A child started on a port named in advance may lose it to another
    test's server between :func:`free_port` and its bind; a probe of the
    port then reaches that other server and mistakes it for the child.
    """
    return _held_by(port, "sid", sid)


def group_listens(pgid: int, port: int) -> bool:
    """
    Whether a process of process group ``pgid`` holds the socket listening
    on ``port``: :func:`session_listens` for a child started in a group of
    its own but in the test's session.
    """
    return _held_by(port, "pgid", pgid)


def process_listens(pid: int, port: int) -> bool:
    """Whether process ``pid`` itself holds a socket listening on ``port``."""
    return bool(socket_inodes(pid) & listening_inodes(port))


def _held_by(port: int, field: str, value: int) -> bool:
    """
    Whether a process whose ``field`` of :class:`ProcInfo` (``pgid``,
    ``sid``) is ``value`` holds the listener on ``port``.
    """
    inodes = listening_inodes(port)
    if not inodes:
        return False
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        info = proc_info(int(entry))
        if info is None or getattr(info, field) != value:
            continue
        if socket_inodes(info.pid) & inodes:
            return True
    return False


def refusing_port(test: Any) -> int:
    """
    A loopback port that refuses connections until ``test`` ends: bound
    here, never listened on, without ``SO_REUSEADDR``, so no other test's
    server can take it meanwhile and answer in its stead (as one could a
    :func:`free_port` port nothing holds).
    """
    held = socket.socket()
    held.bind(("127.0.0.1", 0))
    test.addCleanup(held.close)
    port: int = held.getsockname()[1]
    return port


#: What a server prints when its port was taken before it could bind.
PORT_TAKEN = ("address already in use", "errno 98")


def port_was_taken(output: str) -> bool:
    """Whether a server's output says it could not bind its port."""
    lowered = output.lower()
    return any(sign in lowered for sign in PORT_TAKEN)


def need_autogroups() -> None:
    """Skip unless the daemon may set session groups' nice values here."""
    try:
        with open("/proc/sys/kernel/sched_autogroup_enabled") as f:
            enabled = f.read().strip() == "1"
    except OSError:
        enabled = False
    if not enabled or os.geteuid() != 0:
        raise SkipTest("needs root and the kernel's autogroup scheduling")


def group_nice(pid: int) -> int:
    """The nice value of ``pid``'s session group (``/autogroup-N nice V``)."""
    with open(f"/proc/{pid}/autogroup") as f:
        return int(f.read().split()[-1])


def alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie counts as gone)."""
    info = proc_info(pid)
    return info is not None and info.state != "Z"


def until_exited(pid: int, seconds: float = 5.0) -> None:
    """
    Wait (``seconds`` at most) until ``pid`` has exited, left a zombie
    for its parent to reap (or is gone).
    """
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        info = proc_info(pid)
        if info is None or info.state == "Z":
            return
        time.sleep(0.002)


def unix_socket_path(test: Any, name: str) -> str:
    """
    A path for a unix socket named ``name``, in a directory of its own
    under /tmp removed at ``test``'s end: a socket's path is limited to
    about a hundred bytes, which trial's working directories can exceed.
    """
    directory = tempfile.mkdtemp(prefix="sbx", dir="/tmp")
    test.addCleanup(shutil.rmtree, directory, True)
    return os.path.join(directory, name)


def marked_argv0(marker: str) -> list[bytes]:
    """The program name of each process :func:`marked_pids` finds (gone ones left out)."""
    names = []
    for pid in marked_pids(marker):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                names.append(os.path.basename(f.read().split(b"\0", 1)[0]))
        except OSError:
            continue
    return names


def marked_pids(marker: str) -> list[int]:
    """Live (non-zombie) processes whose command line carries ``marker``."""
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) == os.getpid():
            continue
        try:
            with open(f"/proc/{name}/cmdline", "rb") as f:
                cmdline = f.read()
        except OSError:
            continue
        if marker.encode() in cmdline and alive(int(name)):
            found.append(int(name))
    return found


def kill_marked(marker: str) -> None:
    """Cleanup: SIGKILL whatever a failed test left behind."""
    for pid in marked_pids(marker):
        try:
            os.kill(pid, 9)
        except OSError:
            pass


class DaemonTestCase(TestCase):
    """
    A trial case with a real daemon per test.

    Subclasses set ``policy``, ``environ``, ``token`` or ``preset`` and call
    ``self.start()`` (or rely on ``setUp``'s default start).
    """

    timeout = 30
    policy: Any = None
    environ: dict[str, str] | None = None
    token: str | None = None
    preset: str | None = None
    #: Write the audit trail to ``self.audit_path`` (read it with ``audit_lines``).
    audit = False
    autostart = True

    def setUp(self) -> Any:
        self.base_dir = os.path.realpath(self.mktemp())
        os.makedirs(self.base_dir)
        self.audit_path = os.path.join(self.base_dir, "audit.log")
        if self.autostart:
            return self.start()
        return None

    @inlineCallbacks
    def start(self, stop_at_end: bool = True, **kwargs: Any) -> Any:
        """
        Start the daemon with this case's settings (overridable).

        :param stop_at_end: stop it in cleanup (a test that starts several
            daemons in turn stops each itself).
        """
        options = {
            "policy": self.policy,
            "environ": self.environ,
            "token": self.token,
            "preset": self.preset,
        }
        if self.audit:
            options["audit_log"] = self.audit_path
        options.update(kwargs)
        self.daemon: RunningDaemon = yield start_daemon(
            reactor, self.base_dir, **options
        )
        self.addCleanup(self.daemon.stop)
        return self.daemon

    @property
    def policy_path(self) -> str:
        """
        The policy file of :meth:`start_on_policy_file`: beside the base dir,
        so that listing or watching the base dir never shows it.
        """
        return os.path.join(os.path.dirname(self.base_dir), "policy.json")

    def write_policy_file(self, policy: Any) -> str:
        """Write ``policy`` as JSON to :attr:`policy_path`; the path."""
        with open(self.policy_path, "w") as f:
            json.dump(policy, f)
        return self.policy_path

    @inlineCallbacks
    def start_on_policy_file(self, policy: Any, **kwargs: Any) -> Any:
        """
        (Re)start the daemon reading ``policy`` from a file, as a deployment
        does, so that :meth:`reload_policy` can change it: a reload re-reads
        the file, while a policy given inline is fixed for the daemon's life.
        """
        self.write_policy_file(policy)
        running: RunningDaemon | None = getattr(self, "daemon", None)
        if running is not None:
            yield running.stop()
        daemon = yield self.start(policy=None, policy_file=self.policy_path, **kwargs)
        return daemon

    def reload_policy(self, policy: Any) -> None:
        """Rewrite the policy file and reload it; the reload must be accepted."""
        self.write_policy_file(policy)
        self.assertTrue(self.daemon.daemon.reload())

    def audit_lines(self) -> list[dict[str, Any]]:
        """The audit records written so far."""
        self.daemon.context.audit.flush()
        with open(self.audit_path) as f:
            return [json.loads(line) for line in f]

    def request(self, method: str, path: str, body: Any = None, **kwargs: Any) -> Any:
        """Shortcut for ``self.daemon.request``."""
        return self.daemon.request(method, path, body, **kwargs)


class ReadyPipe:
    """
    The read end of a pipe on the global reactor, calling ``on_read`` the
    first time it is readable: input that is ready in a chosen turn.
    """

    def __init__(self, on_read: Any) -> None:
        self.read_fd, self.write_fd = os.pipe()
        self.on_read = on_read

    def fileno(self) -> int:
        return self.read_fd

    def logPrefix(self) -> str:
        return "pipe"

    def doRead(self) -> None:
        os.read(self.read_fd, 64)
        reactor.removeReader(self)  # type: ignore[attr-defined]
        self.on_read()

    def connectionLost(self, reason: object) -> None:
        pass

    def close(self) -> None:
        reactor.removeReader(self)  # type: ignore[attr-defined]
        os.close(self.read_fd)
        os.close(self.write_fd)


def exchange(port: int, data: bytes) -> tuple[int, str, Any]:
    """
    Send ``data`` on one connection and read to its close: the answer's
    status, Content-Type and JSON body (blocking: run it in a thread).
    """
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        try:
            s.sendall(data)
        except OSError:
            pass  # refused before it was all sent: the answer is waiting
        out = b""
        while chunk := s.recv(65536):
            out += chunk
    head, _, body = out.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    fields = dict(line.lower().split(": ", 1) for line in lines[1:])
    return int(lines[0].split(" ")[1]), fields["content-type"], json.loads(body)


def trickle_body(port: int, head: bytes, seconds: float) -> tuple[bytes, float]:
    """
    Send ``head`` to ``port``, then its body a byte every 0.2 s for at most
    ``seconds``: what came back, and when the server answered or closed
    (blocking: run it in a thread).
    """
    out = b""
    with socket.create_connection(("127.0.0.1", port), timeout=15) as s:
        s.sendall(head)
        began = time.monotonic()
        s.settimeout(0.2)
        while time.monotonic() - began < seconds:
            try:
                s.sendall(b"x")
            except OSError:
                break
            try:
                chunk = s.recv(65536)
            except TimeoutError:
                continue
            except OSError:
                break
            if not chunk:
                break
            out += chunk
        return out, time.monotonic() - began
