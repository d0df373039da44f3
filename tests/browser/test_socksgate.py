"""
The browser worker's SOCKS5 gate: every connection Chromium opens is
resolved, judged and connected by it (SPEC §7.8, §20).

Plain asyncio in the test process (the worker's own event loop kind); no
Chromium needed.
"""

from __future__ import annotations

import asyncio
import os
import socket
from typing import Any

from twisted.trial.unittest import SynchronousTestCase

from sandboxd.browser.socksgate import SocksGate, socket_owner
from sandboxd.browser.urlpolicy import Refusal, UrlPolicy
from tests.helpers import without_netlink

BLOCK = UrlPolicy(
    block_private=True,
    rules={"params.block_private_networks": "policy:endpoints.group:browser"},
)
OPEN = UrlPolicy()


async def socks_connect(
    port: int, host: str, dest_port: int, command: int = 1
) -> tuple[int, asyncio.StreamReader, asyncio.StreamWriter]:
    """Greet the gate and ask for ``host:dest_port``; its reply code and the streams."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(b"\x05\x01\x00")
    assert await reader.readexactly(2) == b"\x05\x00"
    try:
        packed = socket.inet_pton(socket.AF_INET, host)
        target = b"\x01" + packed
    except OSError:
        target = b"\x03" + bytes([len(host)]) + host.encode()
    writer.write(bytes([5, command, 0]) + target + dest_port.to_bytes(2, "big"))
    reply = await reader.readexactly(10)
    return reply[1], reader, writer


class GateTests(SynchronousTestCase):
    """What the gate lets through, and where it connects."""

    def run_async(self, policy: UrlPolicy, body: Any, **kwargs: Any) -> Any:
        async def main() -> Any:
            refused: list[Refusal] = []
            gate = SocksGate(lambda: policy, refused.append, **kwargs)
            port = await gate.start()

            async def echo(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
                w.write(await r.read(100))
                await w.drain()
                w.close()

            server = await asyncio.start_server(echo, "127.0.0.1", 0)
            target = server.sockets[0].getsockname()[1]
            try:
                return await asyncio.wait_for(body(gate, port, target, refused), 20)
            finally:
                server.close()
                await gate.close()

        return asyncio.run(main())

    def test_private_refused_when_blocked(self) -> None:
        """Loopback by address, by localhost names and an unresolvable name: refused (code 2)."""

        async def body(gate: SocksGate, port: int, target: int, refused: Any) -> Any:
            codes = []
            for host in (
                "127.0.0.1",
                "localhost",
                "localhost.",
                "a.localhost",
                "x.invalid",
            ):
                code, _, writer = await socks_connect(port, host, target)
                writer.close()
                codes.append(code)
            return codes, refused, gate.connected

        codes, refused, connected = self.run_async(BLOCK, body)
        self.assertEqual(codes, [2] * 5)
        self.assertEqual(len(refused), 5)
        self.assertEqual(refused[0].rule, "policy:endpoints.group:browser")
        self.assertEqual(connected, [])

    def test_open_connects_where_it_resolved(self) -> None:
        """Without the block, the gate connects to the address it resolved and relays bytes."""

        async def body(gate: SocksGate, port: int, target: int, refused: Any) -> Any:
            code, reader, writer = await socks_connect(port, "localhost", target)
            writer.write(b"ping")
            await writer.drain()
            echoed = await reader.read(100)
            writer.close()
            return code, echoed, gate.connected

        code, echoed, connected = self.run_async(OPEN, body)
        self.assertEqual((code, echoed), (0, b"ping"))
        [(asked, used, _)] = connected
        self.assertEqual(asked, "localhost")
        self.assertIn(used, ("127.0.0.1", "::1"))

    def test_localhost_names_are_loopback(self) -> None:
        """
        A name under .localhost (a preview's 22050.localhost) is loopback,
        as Chromium takes it, without a resolver that knows it; with the
        block on it is refused as localhost is.
        """

        async def body(gate: SocksGate, port: int, target: int, refused: Any) -> Any:
            code, reader, writer = await socks_connect(port, "22050.LocalHost.", target)
            writer.write(b"ping")
            await writer.drain()
            echoed = await reader.read(100)
            writer.close()
            return code, echoed, gate.connected, refused

        code, echoed, connected, refused = self.run_async(OPEN, body)
        self.assertEqual((code, echoed, refused), (0, b"ping", []))
        self.assertEqual(
            connected, [("22050.LocalHost.", "127.0.0.1", connected[0][2])]
        )

    def test_only_connect(self) -> None:
        """BIND and UDP ASSOCIATE are refused (code 7)."""

        async def body(gate: SocksGate, port: int, target: int, refused: Any) -> Any:
            code, _, writer = await socks_connect(port, "127.0.0.1", target, command=3)
            writer.close()
            return code

        self.assertEqual(self.run_async(OPEN, body), 7)

    def test_silent_client_dropped(self) -> None:
        """A client that never finishes its greeting is closed after the handshake bound."""

        async def body(gate: SocksGate, port: int, target: int, refused: Any) -> Any:
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            data = await asyncio.wait_for(reader.read(10), 5)
            writer.close()
            return data

        self.assertEqual(self.run_async(OPEN, body, handshake_seconds=0.2), b"")

    def test_tunnel_cap(self) -> None:
        """Past max_tunnels a new connection is closed at once."""

        async def body(gate: SocksGate, port: int, target: int, refused: Any) -> Any:
            first = await asyncio.open_connection("127.0.0.1", port)
            await asyncio.sleep(0.05)
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            data = await asyncio.wait_for(reader.read(10), 5)
            writer.close()
            first[1].close()
            return data

        self.assertEqual(self.run_async(OPEN, body, max_tunnels=1), b"")


class StrangerTests(SynchronousTestCase):
    """Only the gate's own user may use it."""

    def test_other_users_socket_closed(self) -> None:
        """A connection from a socket another uid owns is closed before the greeting."""

        async def main() -> Any:
            gate = SocksGate(lambda: OPEN, owner=os.getuid() + 1)
            port = await gate.start()
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            try:
                data = await asyncio.wait_for(reader.read(10), 5)
            except ConnectionResetError:
                data = b""
            writer.close()
            await gate.close()
            return data, gate.strangers

        self.assertEqual(asyncio.run(main()), (b"", 1))

    def test_socket_owner(self) -> None:
        """socket_owner finds a connected loopback socket's uid."""

        async def main() -> Any:
            server = await asyncio.start_server(lambda r, w: None, "127.0.0.1", 0)
            port = server.sockets[0].getsockname()[1]
            _, writer = await asyncio.open_connection("127.0.0.1", port)
            mine = writer.get_extra_info("sockname")[1]
            found = socket_owner(mine, port)
            writer.close()
            server.close()
            return found

        self.assertEqual(asyncio.run(main()), os.getuid())

    def test_socket_owner_from_tables(self) -> None:
        """
        Without netlink (a runtime that offers none) the owner is found in
        the kernel's TCP tables instead; a port no socket has, nowhere.
        """
        server = socket.socket()
        self.addCleanup(server.close)
        without_netlink(self)
        self.test_socket_owner()
        server.bind(("127.0.0.1", 0))
        self.assertIsNone(socket_owner(server.getsockname()[1], 1))
