# -*- test-case-name: tests.browser.test_socksgate -*-
"""
The only way out of the sandbox's browser: a SOCKS5 proxy in the worker.

Chromium is started with ``--proxy-server=socks5://127.0.0.1:PORT`` and
``--proxy-bypass-list=<-loopback>``, so every connection a page opens
(navigations, redirects, subresources, fetches, WebSockets; loopback
included) is a SOCKS5 ``CONNECT`` to this gate, naming the host as the page
wrote it. The gate resolves the name itself, applies the URL policy's
``block_private_networks`` to every address, and connects to the address it
checked. The check and the connection cannot disagree: there is no second
resolution (Chromium's own resolver, a DNS answer that changes between
check and connect) for a page to exploit.

The gate listens on a loopback TCP port (Chromium speaks SOCKS over TCP
only), so it admits only sockets owned by its own user: the sandbox's
commands run as another user (``params.default_user``) and cannot borrow
it. (Without a separate user they could; they could equally open the
connection themselves.)

Standard library only, like :mod:`urlpolicy`: the worker loads it without
importing sandboxd (and it loads :mod:`sandboxd.sockdiag`, standard library
only too, by its path).
"""

from __future__ import annotations

import asyncio
import ipaddress
import os
import socket
from collections.abc import Callable
from typing import Any

if __package__:
    from sandboxd import sockdiag
else:
    # Loaded by the worker run as a script: sandboxd/sockdiag.py by its
    # path, without importing the sandboxd package.
    import importlib.util

    _spec = importlib.util.spec_from_file_location(
        "sockdiag",
        os.path.join(os.path.dirname(os.path.dirname(__file__)), "sockdiag.py"),
    )
    assert _spec is not None and _spec.loader is not None
    sockdiag = importlib.util.module_from_spec(_spec)
    _spec.loader.exec_module(sockdiag)

try:
    from .urlpolicy import (
        Refusal,
        UrlPolicy,
        check_addresses,
        check_host,
        is_loopback_name,
    )
except ImportError:  # loaded as a script's sibling (see worker.py)
    from urlpolicy import (  # type: ignore[import-not-found,no-redef]
        Refusal,
        UrlPolicy,
        check_addresses,
        check_host,
        is_loopback_name,
    )

#: SOCKS5 reply codes (RFC 1928 §6).
OK = 0x00
FAILURE = 0x01
NOT_ALLOWED = 0x02
HOST_UNREACHABLE = 0x04
REFUSED = 0x05
COMMAND_NOT_SUPPORTED = 0x07
ADDRESS_NOT_SUPPORTED = 0x08


class SocksGate:
    """
    A SOCKS5 ``CONNECT`` proxy on loopback that judges every destination.

    :param policy: returns the URL policy in force (it changes per call).
    :param refused: called with each :class:`Refusal`, so a navigation
        can say which rule stopped it.
    :param unreachable: called with ``(host, port, why)`` for a
        destination that does not resolve or refuses the connection:
        Chromium reads every SOCKS failure as one error, so a navigation
        can say which it was.
    :param handshake_seconds: bound on the greeting, the request, the
        resolution and the connect, each.
    :param idle_seconds: a tunnel with no byte either way for this long is
        closed.
    :param max_tunnels: tunnels open at once; past it a new one is refused.
    :param owner: the uid whose sockets may connect (default: this
        process's); None from :func:`os.getuid` is never used.
    """

    def __init__(
        self,
        policy: Callable[[], UrlPolicy],
        refused: Callable[[Refusal], None] = lambda r: None,
        unreachable: Callable[[str, int, str], None] = lambda h, p, why: None,
        handshake_seconds: float = 10.0,
        idle_seconds: float = 300.0,
        max_tunnels: int = 256,
        owner: int | None = None,
    ) -> None:
        self.policy = policy
        self.refused = refused
        self.unreachable = unreachable
        self.handshake_seconds = handshake_seconds
        self.idle_seconds = idle_seconds
        self.max_tunnels = max_tunnels
        self.owner = os.getuid() if owner is None else owner
        self.tunnels = 0
        #: Connections closed because another user's socket opened them.
        self.strangers = 0
        #: Every destination connected to, as ``(host asked, address used, port)``.
        self.connected: list[tuple[str, str, int]] = []
        self.server: asyncio.base_events.Server | None = None
        self.port = 0

    async def start(self) -> int:
        """Listen on 127.0.0.1 (a kernel-chosen port); returns the port."""
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = self.server.sockets[0].getsockname()[1]
        return self.port

    def chromium_args(self) -> list[str]:
        """The switches that send every connection of Chromium through the gate."""
        return [
            f"--proxy-server=socks5://127.0.0.1:{self.port}",
            # Chromium bypasses any proxy for loopback unless told not to.
            "--proxy-bypass-list=<-loopback>",
            # WebRTC's UDP would go around a TCP proxy.
            "--force-webrtc-ip-handling-policy=disable_non_proxied_udp",
        ]

    async def close(self) -> None:
        """Stop listening (open tunnels end with the process)."""
        if self.server is not None:
            self.server.close()
            self.server = None

    # -- one client ------------------------------------------------------------

    async def _serve(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        if self.tunnels >= self.max_tunnels:
            writer.close()
            return
        peer = writer.get_extra_info("peername")
        if not peer or socket_owner(int(peer[1]), self.port, peer[0]) != self.owner:
            self.strangers += 1
            writer.close()
            return
        self.tunnels += 1
        try:
            await self._tunnel(reader, writer)
        except (OSError, asyncio.IncompleteReadError, TimeoutError):
            pass
        except asyncio.CancelledError:
            # The worker is stopping: this tunnel just ends (asyncio's
            # stream callback would log a cancelled handler as an error).
            pass
        finally:
            self.tunnels -= 1
            writer.close()

    async def _tunnel(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        async with asyncio.timeout(self.handshake_seconds):
            version, count = await reader.readexactly(2)
            if version != 5:
                return
            methods = await reader.readexactly(count)
            if 0 not in methods:  # "no authentication" is all the gate speaks
                writer.write(b"\x05\xff")
                return
            writer.write(b"\x05\x00")
            _, command, _, kind = await reader.readexactly(4)
            if kind == 1:
                host = socket.inet_ntop(socket.AF_INET, await reader.readexactly(4))
            elif kind == 4:
                host = socket.inet_ntop(socket.AF_INET6, await reader.readexactly(16))
            elif kind == 3:
                size = (await reader.readexactly(1))[0]
                host = (await reader.readexactly(size)).decode("ascii", "replace")
            else:
                _reply(writer, ADDRESS_NOT_SUPPORTED)
                return
            port = int.from_bytes(await reader.readexactly(2), "big")
            if command != 1:  # CONNECT only: no BIND, no UDP ASSOCIATE
                _reply(writer, COMMAND_NOT_SUPPORTED)
                return
            try:
                addresses = await self.choose(host, port)
            except Refusal as refusal:
                self.refused(refusal)
                _reply(writer, NOT_ALLOWED)
                return
            if not addresses:
                self.unreachable(host, port, "net::ERR_NAME_NOT_RESOLVED")
                _reply(writer, HOST_UNREACHABLE)
                return
            failure: OSError | None = None
            for address in addresses:
                try:
                    up_reader, up_writer = await asyncio.open_connection(address, port)
                    break
                except OSError as e:
                    failure = e
            else:
                self.unreachable(
                    host,
                    port,
                    "net::ERR_CONNECTION_REFUSED"
                    if isinstance(failure, ConnectionRefusedError)
                    else f"net::ERR_CONNECTION_FAILED ({getattr(failure, 'strerror', None) or failure})",
                )
                _reply(writer, REFUSED)
                return
        self.connected.append((host, address, port))
        _reply(writer, OK)
        activity = [asyncio.get_running_loop().time()]
        try:
            await asyncio.gather(
                self._pipe(reader, up_writer, activity),
                self._pipe(up_reader, writer, activity),
            )
        finally:
            up_writer.close()

    async def choose(self, host: str, port: int) -> list[str]:
        """
        The addresses to connect to for ``host``, in order: resolved here,
        once, and every one checked; none when it does not resolve and
        nothing forbids that.

        :raises Refusal: ``block_private_networks`` forbids the host or one
            of its addresses, or the host does not resolve while it is on.
        """
        policy = self.policy()
        url = f"//{_bracketed(host)}:{port}"
        check_host(policy, url, host)
        try:
            return [str(ipaddress.ip_address(host))]
        except ValueError:
            pass
        if host.rstrip(".") and is_loopback_name(host):
            # Chromium maps localhost and *.localhost to loopback itself,
            # never asking a resolver (glibc without nss-myhostname knows
            # no *.localhost): the preview's 22050.localhost links open.
            addresses = ["127.0.0.1", "::1"]
            check_addresses(policy, url, addresses)
            return addresses
        try:
            infos = await asyncio.get_running_loop().getaddrinfo(
                host, port, type=socket.SOCK_STREAM
            )
        except OSError:
            infos = []
        addresses = list(dict.fromkeys(str(info[4][0]) for info in infos))
        if not addresses and policy.block_private:
            raise Refusal(
                f"the host {host} does not resolve; with block_private_networks "
                "such a host counts as a private network host",
                policy.rule("params.block_private_networks"),
            )
        check_addresses(policy, url, addresses)
        return addresses

    async def _pipe(
        self,
        source: asyncio.StreamReader,
        sink: asyncio.StreamWriter,
        activity: list[float],
    ) -> None:
        loop = asyncio.get_running_loop()
        try:
            while True:
                try:
                    async with asyncio.timeout(self.idle_seconds):
                        data = await source.read(65536)
                except TimeoutError:
                    # Idle means no byte either way, not just this one.
                    if loop.time() - activity[0] < self.idle_seconds:
                        continue
                    raise
                if not data:
                    break
                activity[0] = loop.time()
                sink.write(data)
                await sink.drain()
        except (OSError, TimeoutError):
            sink.close()
        finally:
            if not sink.is_closing() and sink.can_write_eof():
                try:
                    sink.write_eof()
                except OSError:
                    pass


def socket_owner(
    peer_port: int, local_port: int, peer_host: str = "127.0.0.1"
) -> int | None:
    """
    The uid owning the loopback socket bound to ``peer_host:peer_port``
    and connected to ``127.0.0.1:local_port`` (the gate), asked of the
    kernel by those addresses (:mod:`sandboxd.sockdiag`), else found in its
    TCP tables (each read walks every connection's bucket, milliseconds a
    connection); None when not found.
    """
    uid = sockdiag.connection_uid((peer_host, peer_port), ("127.0.0.1", local_port))
    if uid is not None:
        return None if uid < 0 else uid
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            # LF-ended lines, no newline translation: the kernel's text.
            with open(table, newline="") as f:
                rows = f.read().split("\n")[1:]
        except OSError:
            continue
        for row in rows:
            fields = row.split()
            if len(fields) < 8:
                continue
            if (
                int(fields[1].rsplit(":", 1)[1], 16) == peer_port
                and int(fields[2].rsplit(":", 1)[1], 16) == local_port
            ):
                return int(fields[7])
    return None


def _reply(writer: Any, code: int) -> None:
    # BND.ADDR 0.0.0.0:0: nothing Chromium needs.
    writer.write(bytes([5, code, 0, 1, 0, 0, 0, 0, 0, 0]))


def _bracketed(host: str) -> str:
    return f"[{host}]" if ":" in host else host
