"""
The suite's own port helpers: a port held for refusals is not taken by
another server, and a listener is told apart by who holds it.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys

from twisted.trial.unittest import SynchronousTestCase

from tests.helpers import (
    group_listens,
    process_listens,
    refusing_port,
    session_listens,
    someone_listens,
)


class RefusingPortTests(SynchronousTestCase):
    """:func:`refusing_port` refuses connections and keeps other servers off."""

    def test_refuses_and_cannot_be_taken(self) -> None:
        """
        A connection is refused, and a server that binds with
        ``SO_REUSEADDR`` (as Twisted's listeners do) cannot take the port.
        """
        port = refusing_port(self)
        with self.assertRaises(ConnectionRefusedError):
            socket.create_connection(("127.0.0.1", port), timeout=5).close()
        server = socket.socket()
        self.addCleanup(server.close)
        server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        with self.assertRaises(OSError):
            server.bind(("127.0.0.1", port))
            server.listen()
        self.assertFalse(someone_listens(port))


class HolderTests(SynchronousTestCase):
    """Who holds a listening socket: this process, a child's group or session."""

    def test_this_process(self) -> None:
        """A socket listening here is this process's, not a child's group's."""
        server = socket.socket()
        self.addCleanup(server.close)
        server.bind(("127.0.0.1", 0))
        port = server.getsockname()[1]
        self.assertFalse(someone_listens(port))
        server.listen()
        self.assertTrue(someone_listens(port))
        self.assertTrue(process_listens(os.getpid(), port))
        self.assertTrue(group_listens(os.getpgid(0), port))
        self.assertTrue(session_listens(os.getsid(0), port))

    def test_a_child_in_its_own_group(self) -> None:
        """
        A child that listens in a group of its own, in this session: its
        group holds the socket, this process does not.
        """
        listen = (
            "import socket, sys\n"
            "s = socket.socket(); s.bind(('127.0.0.1', 0)); s.listen()\n"
            "print(s.getsockname()[1], flush=True); sys.stdin.read()\n"
        )
        child = subprocess.Popen(
            [sys.executable, "-c", listen],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            process_group=0,
        )
        self.addCleanup(child.wait)
        self.addCleanup(child.stdin.close)  # type: ignore[union-attr]
        port = int(child.stdout.readline())  # type: ignore[union-attr]
        child.stdout.close()  # type: ignore[union-attr]
        self.assertTrue(group_listens(child.pid, port))
        self.assertTrue(process_listens(child.pid, port))
        self.assertFalse(process_listens(os.getpid(), port))
        self.assertFalse(group_listens(os.getpgid(0), port))
