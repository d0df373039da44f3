# -*- test-case-name: tests.client.test_resume -*-
"""
What the client does when the connection is cut mid-answer (a proxy in
front of the daemon aborts the socket): streams resume after the last
event seen, downloads after the last byte received, reads are retried.
"""

from __future__ import annotations

import os
import re
from typing import Any

from sandboxd.client import Sandbox
from sandboxd.client.errors import ConnectionFailed
from tests.client.base import ClientCase, listen_proxy


class ResumeTests(ClientCase):
    """Cut connections, resumed."""

    def test_process_output_resumes_with_last_event_id(self) -> Any:
        """
        A followed output stream cut after its second event reconnects with
        ``Last-Event-ID`` of the last event received and carries on: every
        event arrives exactly once, in order, up to ``exit``.
        """

        def cut(index: int, seen: bytes) -> bool:
            return proxy.cuts == 0 and b"\nid: 2\n" in seen

        proxy, url = listen_proxy(self, cut)

        def body() -> None:
            direct = self.sandbox()
            p = direct.commands.start(
                ["sh", "-c", "for i in 1 2 3 4 5 6; do echo $i; sleep 0.1; done"]
            )
            with Sandbox(url, token=self.daemon.token) as via_proxy:
                handle = via_proxy.commands.connect(p.pid)
                events = [(e.id, e.event, e.data) for e in handle.stream()]
            ids = [i for i, _, _ in events]
            self.assertEqual(ids, list(range(1, 8)))
            self.assertEqual(
                "".join(d["data"] for _, name, d in events if name == "stdout"),
                "1\n2\n3\n4\n5\n6\n",
            )
            self.assertEqual(events[-1][1:], ("exit", {"exit_code": 0}))
            self.assertEqual(proxy.cuts, 1)
            # The cut comes after a read holding event 2 (and perhaps more):
            # one reconnection names the last whole event the client had.
            resumed = [
                int(m.group(1))
                for r in proxy.requests
                if (m := re.search(rb"last-event-id: (\d+)\r\n", bytes(r).lower()))
                and int(m.group(1)) > 0
            ]
            self.assertEqual(len(resumed), 1, resumed)
            self.assertGreaterEqual(resumed[0], 2)

        return self.in_thread(body)

    def test_download_resumes_with_range(self) -> Any:
        """
        A raw download cut after about 1 MB is continued with ``Range`` and
        ``If-Range``: the local file is whole and equal.
        """
        data = os.urandom(3 * 1024 * 1024)
        with open(self.path("big.bin"), "wb") as f:
            f.write(data)

        def cut(index: int, seen: bytes) -> bool:
            return proxy.cuts == 0 and len(seen) > 1_000_000

        proxy, url = listen_proxy(self, cut)
        local = os.path.realpath(self.mktemp())
        os.makedirs(local)

        def body() -> None:
            with Sandbox(url, token=self.daemon.token) as sb:
                size = sb.files.download("big.bin", os.path.join(local, "big.bin"))
            self.assertEqual(size, len(data))
            with open(os.path.join(local, "big.bin"), "rb") as f:
                self.assertEqual(f.read(), data)
            self.assertEqual(proxy.cuts, 1)
            second = bytes(proxy.requests[-1]).lower()
            self.assertIn(b"range: bytes=", second)
            self.assertIn(b"if-range: ", second)

        return self.in_thread(body)

    def test_download_keeps_partial_file(self) -> Any:
        """
        A daemon that goes away mid-download (every connection cut) fails
        with ConnectionFailed; the partial file is kept, never presented as
        the complete one, and a later call completes it.
        """
        data = os.urandom(2 * 1024 * 1024)
        with open(self.path("big.bin"), "wb") as f:
            f.write(data)

        def cut(index: int, seen: bytes) -> bool:
            if proxy.cuts == 0 and len(seen) > 300_000:
                proxy.refuse = True  # and it does not come back
                return True
            return False

        proxy, url = listen_proxy(self, cut)
        local = os.path.join(os.path.realpath(self.mktemp()))
        os.makedirs(local)
        target = os.path.join(local, "big.bin")

        def body() -> None:
            with Sandbox(url, token=self.daemon.token, retries=1) as sb:
                with self.assertRaises(ConnectionFailed):
                    sb.files.download("big.bin", target)
                self.assertFalse(os.path.exists(target))
                kept = os.path.getsize(target + ".part")
                self.assertGreater(kept, 0)
                proxy.refuse = False
                sb.files.download("big.bin", target)
            with open(target, "rb") as f:
                self.assertEqual(f.read(), data)
            self.assertFalse(os.path.exists(target + ".part"))

        return self.in_thread(body)

    def test_idempotent_read_retried(self) -> Any:
        """A GET whose answer is cut is sent again, and answers."""

        def cut(index: int, seen: bytes) -> bool:
            return proxy.cuts == 0 and len(seen) > 10

        proxy, url = listen_proxy(self, cut)

        def body() -> None:
            with Sandbox(url, token=self.daemon.token) as sb:
                self.assertGreater(sb.system.info()["cpu_count"], 0)
            self.assertEqual(proxy.cuts, 1)

        return self.in_thread(body)
