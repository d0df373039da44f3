"""
A git remote on loopback for the tests: ``git http-backend`` run as CGI by
Twisted, behind Basic auth, over TLS with a CA made for the test (with
``cryptography``), plus a path that answers with a redirect to another
host and an optional delay that keeps git waiting (for process scans and
cancels).
"""

from __future__ import annotations

import base64
import datetime
import ipaddress
import os
import shutil
import subprocess
from typing import Any

from twisted.internet import reactor
from twisted.internet.defer import CancelledError, Deferred
from twisted.internet.task import deferLater
from twisted.web import resource, server
from twisted.web.twcgi import CGIScript

BACKEND = "/usr/lib/git-core/git-http-backend"


def missing() -> str | None:
    """Why the remote cannot be built here, or None."""
    if shutil.which("git") is None:
        return "git is not installed"
    if not os.path.exists(BACKEND):
        return "git-http-backend is not installed"
    try:
        import cryptography  # noqa: F401
    except ImportError:
        return "the cryptography package is not installed (to make a test CA)"
    return None


def make_ca(directory: str, name: str = "sandboxd test CA") -> tuple[str, str, str]:
    """
    A CA (its common name ``name``) and a certificate for 127.0.0.1 and
    localhost: ``(ca, cert, key)`` paths.
    """
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    now = datetime.datetime.now(datetime.UTC)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    ca = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(hours=1))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(ca_key, hashes.SHA256())
    )
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")]))
        .issuer_name(ca_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(hours=1))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(
            x509.SubjectAlternativeName(
                [
                    x509.IPAddress(ipaddress.ip_address("127.0.0.1")),
                    x509.DNSName("localhost"),
                ]
            ),
            critical=False,
        )
        .sign(ca_key, hashes.SHA256())
    )
    paths = tuple(os.path.join(directory, n) for n in ("ca.pem", "cert.pem", "key.pem"))
    with open(paths[0], "wb") as f:
        f.write(ca.public_bytes(serialization.Encoding.PEM))
    with open(paths[1], "wb") as f:
        f.write(cert.public_bytes(serialization.Encoding.PEM))
    with open(paths[2], "wb") as f:
        f.write(
            key.private_bytes(
                serialization.Encoding.PEM,
                serialization.PrivateFormat.PKCS8,
                serialization.NoEncryption(),
            )
        )
    return paths[0], paths[1], paths[2]


class Backend(CGIScript):
    """``git http-backend`` for one project root, authenticated by the parent."""

    def __init__(self, root: str, user: str | None) -> None:
        super().__init__(BACKEND, reactor=reactor)
        self.root = root
        self.user = user

    def runProcess(self, env: Any, request: Any, qargs: Any = ()) -> None:
        # The remote's own processes are not the sandbox's: keep the
        # Authorization header out of them so a scan looks at the client only.
        env = {
            k: v
            for k, v in env.items()
            if k not in (b"HTTP_AUTHORIZATION", "HTTP_AUTHORIZATION")
        }
        env["GIT_PROJECT_ROOT"] = self.root
        env["GIT_HTTP_EXPORT_ALL"] = "1"
        if self.user:
            env["REMOTE_USER"] = self.user
        super().runProcess(env, request, list(qargs))


class Gate(resource.Resource):
    """Basic auth (when a password is set), a delay, then the backend."""

    isLeaf = True

    def __init__(self, remote: LoopbackRemote) -> None:
        super().__init__()
        self.remote = remote

    def render(self, request: Any) -> Any:
        remote = self.remote
        remote.requests += 1
        if request.postpath[:1] == [b"redirect"]:
            request.setResponseCode(302)
            request.setHeader(
                b"location",
                f"https://127.0.0.2:{remote.port}/repo.git/info/refs".encode(),
            )
            return b""
        if remote.password is not None:
            expected = base64.b64encode(f"{remote.username}:{remote.password}".encode())
            header = request.getHeader(b"authorization") or b""
            if header != b"Basic " + expected:
                request.setResponseCode(401)
                request.setHeader(b"www-authenticate", b'Basic realm="test"')
                return b"auth required\n"
        backend = Backend(remote.root, remote.username if remote.password else None)
        # twcgi joins postpath as text (a Twisted quirk): hand it text.
        request.postpath = [p.decode() for p in request.postpath]
        if remote.delay:
            d: Deferred[None] = deferLater(reactor, remote.delay, lambda: None)
            remote.pending.add(d)
            d.addCallback(lambda _: backend.render(request))
            d.addErrback(lambda f: f.trap(CancelledError))
            d.addBoth(lambda _: remote.pending.discard(d))
            # A client that leaves (a cancelled clone) ends the wait too.
            request.notifyFinish().addBoth(lambda _: d.cancel())
            return server.NOT_DONE_YET
        return backend.render(request)


class LoopbackRemote:
    """
    Bare repositories under ``root`` served at ``https://127.0.0.1:PORT/NAME``.

    :ivar password: None for an open remote.
    :ivar delay: seconds each request is held before git gets an answer.
    """

    def __init__(
        self, directory: str, username: str = "agent", password: str | None = None
    ) -> None:
        self.directory = directory
        self.root = os.path.join(directory, "srv")
        os.makedirs(self.root, exist_ok=True)
        self.username = username
        self.password = password
        self.delay = 0.0
        self.requests = 0
        self.ca, self.cert, self.key = make_ca(directory)
        self.port = 0
        self._listening: Any = None
        #: Requests held by ``delay``, cancelled at stop.
        self.pending: set[Deferred[None]] = set()

    def start(self) -> None:
        """Listen on 127.0.0.1 with TLS."""
        from twisted.internet import ssl

        with open(self.cert) as c, open(self.key) as k:
            pem = c.read() + k.read()
        options = ssl.PrivateCertificate.loadPEM(pem).options()
        site = server.Site(Gate(self))
        self._listening = reactor.listenSSL(0, site, options, interface="127.0.0.1")
        self.port = self._listening.getHost().port

    def stop(self) -> Any:
        """Stop listening; drop the requests still held by ``delay``."""
        for d in list(self.pending):
            d.cancel()
        return self._listening.stopListening()

    def url(self, name: str = "repo.git") -> str:
        """The https URL of one repository."""
        return f"https://127.0.0.1:{self.port}/{name}"

    def make_repo(
        self, name: str = "repo.git", files: dict[str, str] | None = None
    ) -> str:
        """A bare repository with one commit on main holding ``files``."""
        bare = os.path.join(self.root, name)
        work = os.path.join(self.directory, "seed-" + name)
        run(self.directory, "init", "-q", "--bare", "-b", "main", bare)
        run(bare, "config", "http.receivepack", "true")
        run(self.directory, "init", "-q", "-b", "main", work)
        for path, text in (files or {"README": "hello\n"}).items():
            with open(os.path.join(work, path), "w") as f:
                f.write(text)
        run(work, "add", "-A")
        run(work, "commit", "-q", "-m", "seed")
        run(work, "push", "-q", bare, "main")
        return bare


def serve_remote(case: Any, password: str | None) -> LoopbackRemote:
    """
    A remote in ``case``'s temporary directory holding ``repo.git`` (one
    commit), listening until ``case`` cleans up.
    """
    remote = LoopbackRemote(os.path.realpath(case.mktemp()), password=password)
    remote.start()
    case.addCleanup(remote.stop)
    remote.make_repo()
    return remote


def run(cwd: str, *args: str) -> str:
    """The test's own git, outside the daemon."""
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": cwd,
        "GIT_CONFIG_NOSYSTEM": "1",
        "GIT_CONFIG_GLOBAL": "/dev/null",
        "GIT_AUTHOR_NAME": "T",
        "GIT_AUTHOR_EMAIL": "t@example.com",
        "GIT_COMMITTER_NAME": "T",
        "GIT_COMMITTER_EMAIL": "t@example.com",
    }
    return subprocess.run(
        ["git", *args], cwd=cwd, env=env, check=True, capture_output=True, text=True
    ).stdout


def main(directory: str) -> None:
    """
    Serve ``repo.git`` (one commit) from ``directory`` until killed, for a
    test whose daemon runs in a process of its own with no reactor in the
    test: print the port, then the CA's path, each on a line.
    """
    remote = LoopbackRemote(directory)
    remote.make_repo()
    remote.start()
    print(remote.port, flush=True)
    print(remote.ca, flush=True)
    reactor.run()


if __name__ == "__main__":
    import sys

    main(sys.argv[1])
