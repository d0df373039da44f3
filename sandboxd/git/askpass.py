# -*- test-case-name: tests.git.test_outcomes -*-
"""
Giving git a password without putting it anywhere (SPEC §24).

A password in argv is readable by every user (``/proc/*/cmdline``), one in
the environment by the same user (``/proc/*/environ``), one in the URL
lands in ``.git/config``, one in a credential store lands on disk.  So git
gets ``GIT_ASKPASS`` pointing at a small program
(:mod:`sandboxd.git.askpass_client`) that asks the daemon over a unix
socket made for this one git process: in a 0700 directory owned by the
call's user, answering only a peer whose ``SO_PEERCRED`` shows that user and
a process descended from this git, that presents the call's nonce, and
whose prompt names a URL under the credential's prefix.  Each question
(user name, password) is answered once; after the password the socket is
closed and its directory removed.
"""

from __future__ import annotations

import hmac
import os
import secrets
import shutil
import socket
import struct
import sys
import tempfile
from typing import Any
from urllib.parse import unquote, urlsplit

import attrs
from twisted.internet.defer import maybeDeferred
from twisted.internet.protocol import Factory, Protocol

from sandboxd.policy.defaults import KIB

#: The longest request a helper may send (nonce and prompt).
_MAX_REQUEST = 4 * KIB


@attrs.frozen(repr=False)
class Secret:
    """
    A user name and password for one call, and where they may be sent.

    ``repr`` is suppressed so that no traceback or log line ever shows it.
    """

    username: str
    password: str
    url_prefix: str
    #: ``NAME`` of a policy credential, or ``inline``: what the audit says.
    label: str

    def __repr__(self) -> str:
        return f"<Secret {self.label}>"


def parent_pid(pid: int) -> int | None:
    """The parent of ``pid`` from ``/proc/PID/stat``, or None when it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            data = f.read()
    except OSError:
        return None
    # The command name is in parentheses and may hold spaces or ')'.
    fields = data[data.rindex(b")") + 2 :].split()
    try:
        return int(fields[1])
    except (IndexError, ValueError):
        return None


def descends_from(pid: int, ancestor: int) -> bool:
    """Whether ``pid`` is ``ancestor`` or one of its descendants."""
    seen = 0
    while pid > 1 and seen < 64:
        if pid == ancestor:
            return True
        parent = parent_pid(pid)
        if parent is None:
            return False
        pid = parent
        seen += 1
    return False


def peer_credentials(sock: socket.socket) -> tuple[int, int, int]:
    """``(pid, uid, gid)`` of a unix socket's peer, from the kernel."""
    raw = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    pid, uid, gid = struct.unpack("3i", raw)
    return pid, uid, gid


def prompt_url(prompt: str) -> tuple[str, str] | None:
    """
    ``("username"|"password", URL)`` from git's prompt, e.g.
    ``Password for 'https://user@host/repo.git': ``; None for any other.
    """
    for word, kind in (("Username for '", "username"), ("Password for '", "password")):
        if prompt.startswith(word):
            url = prompt[len(word) :]
            end = url.rfind("'")
            if end <= 0:
                return None
            return kind, url[:end]
    return None


def without_userinfo(url: str) -> str:
    """``https://user@host/x`` as ``https://host/x`` (git names the user it asks for)."""
    scheme, sep, rest = url.partition("://")
    if not sep:
        return url
    authority, slash, path = rest.partition("/")
    return f"{scheme}://{authority.rpartition('@')[2]}{slash}{path}"


def dot_segments(url: str) -> bool:
    """
    Whether ``url``'s path holds a ``.`` or ``..`` segment (percent-encoded
    too): git (curl) removes them before it connects, so the text compared
    with a prefix is not the URL asked for.
    """
    path = urlsplit(url).path
    return any(unquote(part) in (".", "..") for part in path.split("/"))


def under_prefix(url: str, prefix: str) -> bool:
    """
    Whether ``url`` is ``prefix`` or below it, segment-wise: the prefix
    ``https://host/org`` covers ``https://host/org/x`` and ``.../org.git``,
    not ``https://host/organisation``.
    """
    if not url.startswith(prefix) or dot_segments(url):
        return False
    rest = url[len(prefix) :]
    return (
        prefix.endswith("/") or rest in ("", ".git") or rest.startswith(("/", ".git/"))
    )


class _Answer(Protocol):
    """One helper's connection: one question, at most one answer."""

    session: AskpassSession

    def connectionMade(self) -> None:
        self.buffer = b""
        transport: Any = self.transport
        try:
            self.peer = peer_credentials(transport.socket)
        except OSError:
            self.peer = (0, -1, -1)

    def dataReceived(self, data: bytes) -> None:
        self.buffer += data
        if len(self.buffer) > _MAX_REQUEST:
            self.refuse()
            return
        if self.buffer.count(b"\n") < 2:
            return
        nonce, prompt, _ = self.buffer.split(b"\n", 2)
        answer = self.session.answer(
            self.peer,
            nonce.decode("ascii", "replace"),
            prompt.decode("utf-8", "replace"),
        )
        if answer is None:
            self.refuse()
            return
        transport: Any = self.transport
        transport.write(b"+" + answer.encode("utf-8"))
        transport.loseConnection()
        self.session.answered()

    def refuse(self) -> None:
        transport: Any = self.transport
        transport.write(b"-")
        transport.loseConnection()


class AskpassSession:
    """
    The one-shot socket of one git process.

    :ivar refusals: why helpers were refused (for tests and the error
        message; never holds the secret).
    """

    def __init__(
        self,
        reactor: Any,
        secret: Secret,
        uid: int,
        gid: int,
        parent: str | None = None,
    ) -> None:
        self.reactor = reactor
        self._secret: Secret | None = secret
        self.uid = uid
        self.gid = gid
        #: Where its directory is made (the daemon's scratch directory).
        self.parent = parent
        self.nonce = secrets.token_urlsafe(24)
        self.git_pid: int | None = None
        self.asked: set[str] = set()
        self.refusals: list[str] = []
        self.directory = ""
        self._port: Any = None

    def start(self) -> dict[str, str]:
        """
        Make the directory, the helper and the socket; the environment
        variables git needs to use them.
        """
        self.directory = tempfile.mkdtemp(prefix="sandboxd-askpass-", dir=self.parent)
        client = os.path.join(self.directory, "askpass.py")
        here = os.path.dirname(os.path.abspath(__file__))
        shutil.copyfile(os.path.join(here, "askpass_client.py"), client)
        script = os.path.join(self.directory, "askpass")
        with open(script, "w", encoding="utf-8") as f:
            f.write(f"#!/bin/sh\nexec '{_python()}' -I -S '{client}' \"$@\"\n")
        os.chmod(script, 0o700)
        os.chmod(client, 0o600)
        path = os.path.join(self.directory, "socket")
        factory = Factory.forProtocol(_Answer)
        factory.protocol = type("Answer", (_Answer,), {"session": self})
        self._port = self.reactor.listenUNIX(path, factory, mode=0o600)
        if os.geteuid() == 0 and self.uid != 0:
            for name in (self.directory, client, script, path):
                os.chown(name, self.uid, self.gid)
        return {
            "GIT_ASKPASS": script,
            "SSH_ASKPASS": script,
            "SSH_ASKPASS_REQUIRE": "force",
            "SANDBOXD_ASKPASS_SOCKET": path,
            "SANDBOXD_ASKPASS_NONCE": self.nonce,
        }

    def answer(self, peer: tuple[int, int, int], nonce: str, prompt: str) -> str | None:
        """The answer to one helper's question, or None to refuse it."""
        secret = self._secret
        pid, uid, _ = peer
        reason = None
        if secret is None:
            reason = "the session is closed"
        elif not hmac.compare_digest(nonce.encode(), self.nonce.encode()):
            reason = "wrong nonce"
        elif uid != self.uid:
            reason = f"peer uid {uid} is not the call's user"
        elif self.git_pid is None or not descends_from(pid, self.git_pid):
            reason = f"peer pid {pid} is not part of this git call"
        asked = prompt_url(prompt)
        if reason is None and asked is None:
            reason = "not a user name or password prompt"
        if reason is None and asked is not None and secret is not None:
            kind, url = asked
            if kind in self.asked:
                reason = f"the {kind} was already given"
            elif not under_prefix(without_userinfo(url), secret.url_prefix):
                reason = "the prompt names a URL outside the credential's url_prefix"
            else:
                self.asked.add(kind)
                return secret.username if kind == "username" else secret.password
        self.refusals.append(reason or "refused")
        return None

    def answered(self) -> None:
        """After the password, nothing more is answered: close now."""
        if "password" in self.asked:
            self.close()

    def close(self) -> None:
        """Forget the secret, stop listening, remove the directory."""
        self._secret = None
        directory, self.directory = self.directory, ""

        def remove(result: object = None) -> object:
            if directory:
                shutil.rmtree(directory, ignore_errors=True)
            return None

        if self._port is not None:
            port, self._port = self._port, None
            # The port unlinks its socket when it has stopped: remove the
            # directory after that, not under it.
            maybeDeferred(port.stopListening).addBoth(remove)
        else:
            remove()


def _python() -> str:
    """
    An interpreter the call's user can run: the system's when there is one
    (the daemon's own may sit in a directory only root can enter).
    """
    for candidate in ("/usr/bin/python3", sys.executable):
        if candidate and os.access(candidate, os.X_OK):
            return candidate
    return sys.executable
