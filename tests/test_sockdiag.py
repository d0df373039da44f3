"""
The kernel's TCP sockets through ``sock_diag``: the same listening sockets
``/proc/net/tcp{,6}`` lists, a connection's owner by its addresses, and the
``/proc`` files read instead where netlink cannot be asked.
"""

from __future__ import annotations

import os
import socket

from twisted.trial.unittest import SynchronousTestCase

from sandboxd import sockdiag, sysinfo
from tests.helpers import without_netlink


def _from_proc() -> set[tuple[str, str, int, int]]:
    found = set()
    for protocol, name in (("tcp", "net/tcp"), ("tcp6", "net/tcp6")):
        with open(os.path.join("/proc", name)) as f:
            text = f.read()
        found |= {
            (protocol, address, port, inode)
            for address, port, inode in sysinfo.parse_proc_net_tcp(text, protocol)
        }
    return found


def _listener(family: int, host: str) -> socket.socket | None:
    try:
        sock = socket.socket(family, socket.SOCK_STREAM)
    except OSError:
        return None
    try:
        sock.bind((host, 0))
    except OSError:
        sock.close()
        return None
    sock.listen()
    return sock


class SockDiagTests(SynchronousTestCase):
    """Asked of the real kernel, in this process's network namespace."""

    def setUp(self) -> None:
        if sockdiag.listening() is None:
            raise self.skipTest("this kernel offers no sock_diag netlink")

    def listen(self, family: int, host: str) -> socket.socket | None:
        sock = _listener(family, host)
        if sock is not None:
            self.addCleanup(sock.close)
        return sock

    def test_listening_as_proc_lists_it(self) -> None:
        """
        The listening sockets, IPv4 and IPv6, are those ``/proc/net/tcp{,6}``
        lists, with the same protocol, address, port and inode.
        """
        mine = [
            self.listen(socket.AF_INET, "127.0.0.1"),
            self.listen(socket.AF_INET, "0.0.0.0"),
            self.listen(socket.AF_INET6, "::1"),
            self.listen(socket.AF_INET6, "::"),
        ]
        # An established pair is not listed.
        server = mine[0]
        assert server is not None
        client = socket.create_connection(server.getsockname())
        self.addCleanup(client.close)
        accepted, _ = server.accept()
        self.addCleanup(accepted.close)
        found = sockdiag.listening()
        assert found is not None
        # Both read at nearly the same moment; other tests' listeners may
        # come and go between, so mine are compared exactly and the rest
        # only where both saw them.
        proc = _from_proc()
        for sock in filter(None, mine):
            inode = os.fstat(sock.fileno()).st_ino
            ours = [entry for entry in found if entry[3] == inode]
            self.assertEqual(ours, [entry for entry in proc if entry[3] == inode])
            self.assertEqual(ours[0][2], sock.getsockname()[1])
        ports = {entry[2] for entry in found}
        self.assertNotIn(client.getsockname()[1], ports)

    def test_listening_ports(self) -> None:
        """sysinfo.listening_ports takes the kernel's answer: my port is in it."""
        sock = self.listen(socket.AF_INET, "127.0.0.1")
        assert sock is not None
        port = sock.getsockname()[1]
        self.assertIn(port, sysinfo.listening_ports())
        sock.close()
        self.assertNotIn(port, sysinfo.listening_ports())

    def test_ports_of_this_process(self) -> None:
        """ports_of a process in this namespace: its own listeners only."""
        sock = self.listen(socket.AF_INET, "127.0.0.1")
        assert sock is not None
        port = sock.getsockname()[1]
        self.assertIn(port, sysinfo.ports_of(os.getpid()))
        self.assertNotIn(port, sysinfo.ports_of(os.getppid()))

    def test_connection_uid(self) -> None:
        """
        A connected socket's uid, found by its own address and its peer's;
        -1 for addresses no socket has (the listener's own address, the
        peer reversed).
        """
        server = self.listen(socket.AF_INET, "127.0.0.1")
        assert server is not None
        client = socket.create_connection(server.getsockname())
        self.addCleanup(client.close)
        accepted, _ = server.accept()
        self.addCleanup(accepted.close)
        local, remote = client.getsockname(), client.getpeername()
        self.assertEqual(sockdiag.connection_uid(local, remote), os.getuid())
        self.assertEqual(sockdiag.connection_uid(remote, local), os.getuid())
        self.assertEqual(sockdiag.connection_uid(local, ("127.0.0.1", 1)), -1)
        self.assertEqual(sockdiag.connection_uid(("not an address", 1), remote), -1)

    def test_connection_uid_ipv6(self) -> None:
        """The same over IPv6 loopback."""
        server = self.listen(socket.AF_INET6, "::1")
        if server is None:
            raise self.skipTest("no IPv6 loopback here")
        client = socket.create_connection(server.getsockname()[:2])
        self.addCleanup(client.close)
        accepted, _ = server.accept()
        self.addCleanup(accepted.close)
        local, remote = client.getsockname()[:2], client.getpeername()[:2]
        self.assertEqual(sockdiag.connection_uid(local, remote), os.getuid())


class WithoutNetlinkTests(SynchronousTestCase):
    """Where netlink cannot be asked, the ``/proc`` files are read."""

    def setUp(self) -> None:
        without_netlink(self)

    def test_none(self) -> None:
        """Each function says it could not ask."""
        self.assertIsNone(sockdiag.listening())
        self.assertIsNone(sockdiag.connection_uid(("127.0.0.1", 1), ("127.0.0.1", 2)))

    def test_sysinfo_reads_proc(self) -> None:
        """The ports come from /proc/net/tcp instead, the same."""
        sock = _listener(socket.AF_INET, "127.0.0.1")
        assert sock is not None
        self.addCleanup(sock.close)
        self.assertIn(sock.getsockname()[1], sysinfo.listening_ports())
        self.assertIn(sock.getsockname()[1], sysinfo.ports_of(os.getpid()))
