# -*- test-case-name: tests.routes.test_git -*-
"""
One git call of the ``git`` group (SPEC §24): the git CLI as a managed
child (the request's user, its own process group, a timeout and an idle
timeout that end the whole tree, capped output), with the repository's
power to run code or reach the network switched off on the command line.

:mod:`sandboxd.git` already stops what ``status`` and ``diff`` could run;
writes and remotes add more doors: hooks, transports, credential helpers,
redirects, proxies and URL-specific HTTP settings named by the
repository's config.  Each is overridden here with ``-c``, which git reads
last.
"""

from __future__ import annotations

import contextlib
import os
import weakref
from collections.abc import AsyncIterator, Callable, Iterable
from typing import Any

from twisted.internet import defer
from twisted.internet.defer import DeferredLock

from sandboxd import processes
from sandboxd.access.guard import PathGuard
from sandboxd.errors import (
    ApiError,
    bad_request,
    git_conflict,
    internal,
    not_found,
    timed_out,
)
from sandboxd.git import (
    IDENTITY_PATTERN,
    WHERE_ARGS,
    UnsettableName,
    ceiling_for,
    config_names,
    git_argv,
    git_environment,
    holder_of,
    identity_environment,
    identity_values,
    parse_alternates,
    parse_places,
    program_overrides,
    settable,
    unsaid_identity,
)
from sandboxd.git.askpass import AskpassSession, Secret
from sandboxd.git.outcomes import UNWRITTEN, classify_failure, redact
from sandboxd.git.remotes import Remote, literal_addresses, pin_setting
from sandboxd.git.target import hold_dir
from sandboxd.policy import defaults
from sandboxd.policy.rules import EffectiveRule
from sandboxd.processes.command import RunAs, resolve_user
from sandboxd.processes.environment import BOOT_ENVIRON, child_environment

#: Settings of every call of the group, after :data:`sandboxd.git.SAFE_CONFIG`.
WRITE_CONFIG: tuple[str, ...] = (
    "protocol.allow=never",
    "protocol.https.allow=always",
    "credential.helper=",
    "credential.useHttpPath=true",
    "http.followRedirects=false",
    "http.sslVerify=true",
    "http.extraHeader=",
    "submodule.recurse=false",
    "core.sshCommand=ssh -o BatchMode=yes -o StrictHostKeyChecking=yes",
    "gc.auto=0",
    "maintenance.auto=false",
    "commit.gpgSign=false",
    "tag.gpgSign=false",
    "core.editor=true",
    "sequence.editor=true",
    # Programs a fetch, pull or push would run for the repository: one
    # listing an alternate's refs, a signature check of the merged
    # commits, the signing of a push.
    "core.alternateRefsCommand=true",
    "merge.verifySignatures=false",
    "push.gpgSign=false",
    # A cookie jar is a file git writes wherever the repository says.
    "http.cookieFile=",
    "http.saveCookies=false",
)

#: Keys of a URL-specific or per-remote section (``http.<url>.proxy``,
#: ``remote.origin.proxy``) that could send git elsewhere or lower TLS, and
#: what each is forced to (``None``: the proxy the daemon's environment names).
_NETWORK_KEYS: dict[str, str | None] = {
    "proxy": None,
    "sslverify": "true",
    "followredirects": "false",
    "curloptresolve": "",
    "extraheader": "",
    "sslcainfo": "",
    "sslcapath": "",
    "cookiefile": "",
    "savecookies": "false",
}

#: What a remote's own program settings are put back to: the commands an
#: ``ssh`` remote runs at the other end.
_REMOTE_PROGRAMS = {
    "uploadpack": "git-upload-pack",
    "receivepack": "git-receive-pack",
}

Observer = Callable[[int, bytes], None]


def proxy_of(env: dict[str, str]) -> str:
    """The proxy the daemon's environment names for https, or ``""`` (none)."""
    for name in ("https_proxy", "HTTPS_PROXY", "all_proxy", "ALL_PROXY"):
        if env.get(name):
            return env[name]
    return ""


def network_overrides(names: Iterable[str], proxy: str) -> list[str]:
    """
    ``-c`` settings that cancel the repository's URL-specific HTTP settings
    and per-remote proxies (``http.https://x/.proxy``), which git prefers to
    the general ones given on the command line.
    """
    out: list[str] = []
    for name in names:
        lowered = name.lower()
        section, _, rest = lowered.partition(".")
        key = lowered.rsplit(".", 1)[-1]
        if section not in ("http", "remote") or rest.count(".") < 1:
            continue
        if section == "remote" and key in _REMOTE_PROGRAMS:
            out.append(f"{settable(name)}={_REMOTE_PROGRAMS[key]}")
            continue
        if key not in _NETWORK_KEYS or (section == "remote" and key != "proxy"):
            continue
        value = _NETWORK_KEYS[key]
        out.append(f"{settable(name)}={proxy if value is None else value}")
    return out


def protocol_overrides(names: Iterable[str], allowed: Iterable[str]) -> list[str]:
    """
    ``-c`` settings that refuse every transport the repository allows by
    name (``protocol.ext.allow=always``, ``protocol.file.allow``), which
    git prefers to the general ``protocol.allow=never`` given on the
    command line; the ``allowed`` ones stay as the daemon sets them.
    A remote helper (``remote.NAME.vcs``, ``ext::``) is a transport too.
    """
    keep = {p.lower() for p in allowed}
    out: list[str] = []
    for name in names:
        lowered = name.lower()
        if not (lowered.startswith("protocol.") and lowered.endswith(".allow")):
            continue
        protocol = name[len("protocol.") : -len(".allow")]
        if protocol and protocol.lower() not in keep:
            out.append(f"{settable(name)}=never")
    return out


class GitCall:
    """
    Where one request's git runs, as whom, with which settings and limits.

    :ivar cwd: the directory git runs in (the repository, or the parent of
        a clone's target), as checked.
    :ivar held: the descriptor of that directory, opened by the guard when
        it was checked, or None: git starts in the directory held
        (:func:`~sandboxd.processes.held_directory`), so a link swapped in
        at ``cwd`` afterwards cannot send it outside the base dir.  The
        call owns it and closes it when it is dropped.
    """

    def __init__(
        self,
        context: Any,
        rule: EffectiveRule,
        cwd: str,
        user: Any = None,
        timeout: float | None = None,
        held: int | None = None,
    ) -> None:
        self.context = context
        self.rule = rule
        self.cwd = cwd
        self.held = held
        self._start_in = cwd
        #: What closes the descriptors held (each at most once).
        self._releases: list[weakref.finalize[Any, Any]] = []
        if held is not None:
            self._start_in = processes.held_directory(held)
            self._releases.append(weakref.finalize(self, os.close, held))
        self.run_as: RunAs | None = resolve_user(user, rule)
        base = child_environment(context, rule, base=BOOT_ENVIRON)
        self.proxy = proxy_of(base)
        self.env = git_environment(base, ceiling=ceiling_for(cwd, rule.base_dir))
        if self.run_as is not None:
            self.run_as.apply(self.env)
        ca_file = context.policy.document.git.ca_file
        if ca_file:
            self.env["GIT_SSL_CAINFO"] = ca_file
        self.timeout = timeout if timeout is not None else rule.limits.timeout_seconds
        self.idle_timeout = rule.limits.idle_timeout_seconds
        self.max_output = rule.limits.max_output_bytes or 1024 * 1024
        self.config: list[str] = [*WRITE_CONFIG, f"http.proxy={self.proxy}"]
        #: The transports git may use.
        self.protocols = ["https"]
        if "ssh" in rule.params.git_protocols:
            self.config.append("protocol.ssh.allow=always")
            self.protocols.append("ssh")
        self.git_dir: str | None = None
        self.top: str | None = None
        #: Where a call ``-C top`` starts instead: the top held, once the
        #: repository is opened (see :meth:`run`).
        self._top_start: str | None = None
        #: The repository whose writing calls run one at a time (its git
        #: dir), once it is opened for writing.
        self.lock_key: str | None = None
        #: The last child, for a job's ``process`` field and its cancel.
        self.child: Any = None
        #: The names the repository's own configuration sets, once opened.
        self.local_names: list[str] | None = None

    def release(self) -> None:
        """
        Close the directories held, once no more git runs for this call
        (a finished job keeps its call to describe it); dropping the call
        closes them too.
        """
        for release in self._releases:
            release()

    @property
    def uid_gid(self) -> tuple[int, int]:
        """Who the askpass helper must be."""
        if self.run_as is not None and os.geteuid() == 0:
            return self.run_as.uid, self.run_as.gid
        return os.geteuid(), os.getegid()

    async def open_repository(self, op: str = "write") -> None:
        """
        Find the repository at ``cwd`` (404 when there is none), check that
        every place git reads or writes it lies where the caller may
        (``op``), and learn which of its settings to cancel.

        The places are its work tree, its git dir, the common dir a linked
        work tree's ``commondir`` names (refs, objects and config live
        there), the object, ref and reflog directories (each may be a
        link), and the object directories ``objects/info/alternates`` names
        (read only): each is a door out of the base dir as a ``.git`` file
        naming another directory is.
        """
        result = await self.run(list(WHERE_ARGS), check=False)
        if result.exit_code != 0:
            text = redact(result.stderr.decode("utf-8", "replace"), ())
            if "not a git repository" in text:
                raise not_found(f"not a git repository: {self.cwd}")
            raise classify_failure(text, result.exit_code)
        places = parse_places(result.stdout, self.cwd)
        if places is None:
            raise bad_request(
                f"a path of the repository at {self.cwd} holds a line break"
            )
        self.top, self.git_dir = places.top, places.git_dir
        guard = PathGuard(self.rule)
        for place in sorted(places.holders):
            guard.check(place, op)
        if self.held is not None and places.top is not None:
            if places.top == self.cwd:
                self._top_start = self._start_in
            else:
                _, top_fd = hold_dir(guard, places.top, op)
                self._releases.append(weakref.finalize(self, os.close, top_fd))
                self._top_start = processes.held_directory(top_fd)
        if os.path.lexists(places.alternates_file):
            counted = await self.run(["count-objects", "-v"])
            for other in parse_alternates(counted.stdout):
                guard.check(holder_of(os.path.realpath(other)), "read")
        if op == "write":
            self.lock_key = places.common_dir
        names = await self.run(["config", "--null", "--list", "--name-only"])
        listed = config_names(names.stdout)
        self.local_names = listed
        try:
            self.config += program_overrides(listed)
            self.config += network_overrides(listed, self.proxy)
            self.config += protocol_overrides(listed, self.protocols)
        except UnsettableName as e:
            raise e.as_error() from None
        if self.rule.params.git_hooks and self.git_dir:
            self.config.append(f"core.hooksPath={os.path.join(self.git_dir, 'hooks')}")

    async def identity_from_home(self) -> dict[str, str]:
        """
        The commit identity the user's global git configuration
        (``~/.gitconfig``, ``~/.config/git/config``) gives, for each part
        the repository's own configuration leaves unsaid, as
        ``GIT_AUTHOR_*``/``GIT_COMMITTER_*``.

        git otherwise runs with no global configuration (it may name
        programs to run), but ``git config --global user.name`` is how a
        sandbox's user says who they are, and a commit made for them
        should say it too: only the identity settings are read from there,
        by a ``git config`` run as that user.  Nothing before the
        repository is opened, and no ``git config`` when the repository
        names the whole identity itself.
        """
        if self.local_names is None or not unsaid_identity(self.local_names):
            return {}
        result = await self.run(
            ["config", "--global", "--null", "--get-regexp", IDENTITY_PATTERN],
            check=False,
            home_config=True,
        )
        if result.exit_code != 0:  # 1: none set; else no home or a bad file
            return {}
        return identity_environment(self.local_names, identity_values(result.stdout))

    def argv(
        self, args: list[str], remote: Remote | None = None, pin: str = ""
    ) -> list[str]:
        """
        git's argv: the safe settings, ours, the address pin, then ``args``.

        A host given as an address literal needs no pin (curl looks nothing
        up for it), and curl cannot parse a pin for an IPv6 literal at all.
        """
        extra = list(self.config)
        if (
            remote is not None
            and pin
            and remote.scheme == "https"
            and literal_addresses(remote) is None
        ):
            extra.append(pin_setting(remote, pin))
        return git_argv("git", args, extra)

    async def run(
        self,
        args: list[str],
        *,
        check: bool = True,
        remote: Remote | None = None,
        pin: str = "",
        secret: Secret | None = None,
        observe: Observer | None = None,
        timeout: float | None = None,
        stdin: bytes | None = None,
        own_pathspecs: bool = False,
        home_config: bool = False,
    ) -> processes.RunResult:
        """
        Run git to completion; with ``check``, a failure becomes the error
        the client sees (:func:`~sandboxd.git.outcomes.classify_failure`).

        With a ``secret``, git asks for it through a one-shot askpass
        session that ends with the call.  In a repository opened for
        writing, a local call waits for the others there to end first
        (:meth:`_turn`).

        :param own_pathspecs: for a call that names no path of the
            caller's: git's pathspec magic is left on, since some commands
            pass it to the git they run themselves (a stash of untracked
            files cleans them with ``:/``, which taken literally names no
            file, so they would stay).
        :param home_config: let git read the user's global configuration
            (for :meth:`identity_from_home` alone).

        ``args`` starting ``-C TOP`` (the repository's top) start git in the
        top held since the repository was opened instead: git would look
        the name up again.
        """
        start_in = self._start_in
        if args[:1] == ["-C"] and self.top is not None and args[1:2] == [self.top]:
            if self._top_start is not None:
                args, start_in = args[2:], self._top_start
        async with self._turn(remote, timeout):
            env = dict(self.env)
            if own_pathspecs:
                del env["GIT_LITERAL_PATHSPECS"]
            if home_config:
                del env["GIT_CONFIG_GLOBAL"]
            session: AskpassSession | None = None
            if secret is not None:
                uid, gid = self.uid_gid
                session = AskpassSession(
                    self.context.reactor,
                    secret,
                    uid,
                    gid,
                    self.context.scratch.directory(),
                )
                env.update(session.start())

            def spawned(child: Any) -> None:
                self.child = child
                if session is not None:
                    session.git_pid = child.pid

            hidden = (secret.password,) if secret is not None else ()
            try:
                result = await processes.run_collect(
                    self.context.reactor,
                    self.argv(args, remote, pin),
                    children=self.context.children,
                    env=env,
                    cwd=start_in,
                    timeout=timeout if timeout is not None else self.timeout,
                    idle_timeout=self.idle_timeout if remote is not None else None,
                    max_output_bytes=self.max_output,
                    run_as=self.run_as,
                    stdin=stdin,
                    observe=observe,
                    on_spawned=spawned,
                )
            except FileNotFoundError:
                raise internal("git is not installed", "FileNotFoundError") from None
            finally:
                if session is not None:
                    session.close()
            if result.timed_out or result.idle_timed_out:
                idle = result.idle_timed_out
                limit = self.idle_timeout if idle else (timeout or self.timeout)
                if idle:
                    raise timed_out(
                        f"IdleTimeout: git printed nothing for {limit:g} s and was stopped",
                        idle=True,
                    )
                raise timed_out(f"git timed out after {limit:g} s")
            if check and result.exit_code != 0:
                # Both: a merge says its conflicts on stdout, after a fetch
                # whose progress went to stderr.
                text = redact(
                    result.stderr.decode("utf-8", "replace")
                    + "\n"
                    + result.stdout.decode("utf-8", "replace"),
                    hidden,
                )
                no_room = UNWRITTEN in text.lower() and self.no_room()
                raise classify_failure(
                    text, result.exit_code, remote is not None, no_room
                )
            return result

    @contextlib.asynccontextmanager
    async def _turn(
        self, remote: Remote | None, timeout: float | None
    ) -> AsyncIterator[None]:
        """
        A local call's turn in a repository opened for writing: the lock its
        writing calls take one after another (git fails a call that finds
        another's lock file at once, and an agent's tool calls often come
        together); the wait is bounded as the call is.  Remote calls (a fetch
        can last minutes) and reads do not wait.
        """
        if self.lock_key is None or remote is not None:
            yield
            return
        locks: dict[str, DeferredLock] = self.context.git_locks
        lock = locks.setdefault(self.lock_key, DeferredLock())
        waited = timeout if timeout is not None else self.timeout
        if waited is None:
            waited = float(defaults.GIT_LOCAL_LIMITS["timeout_seconds"])
        acquired = lock.acquire()
        acquired.addTimeout(waited, self.context.reactor)
        try:
            await acquired
        except defer.TimeoutError:
            raise git_conflict(
                f"another call has been working in this repository for {waited:g} s; "
                "try again once it is done",
                "locked",
            ) from None
        try:
            yield
        finally:
            lock.release()
            if not lock.locked:
                locks.pop(self.lock_key, None)

    def no_room(self) -> bool:
        """Whether the work tree's file system has no block left for git's user."""
        return self.free_bytes() == 0

    def free_bytes(self) -> int | None:
        """The bytes git's user may still write on the work tree's file system."""
        try:
            st = os.statvfs(self._start_in)
        except OSError:
            return None
        uid, _ = self.uid_gid
        # Root may write into the blocks reserved for it.
        return (st.f_bfree if uid == 0 else st.f_bavail) * st.f_frsize


def repo_path(request: Any, value: Any, name: str = "path") -> tuple[str, int]:
    """
    A repository directory from the request, through the guard: its
    resolved path and a descriptor held on it (see :func:`hold_dir`).
    """
    from sandboxd.web import params

    text = params.path(value, name, ".", parents=False)
    guard = PathGuard(request.rule)
    checked = guard.check(text, "read")
    if not os.path.isdir(checked):
        if os.path.lexists(checked):
            # Often a file of the repository, named where its directory goes.
            raise not_found(
                f"not a git repository: {text} is a file, not a directory; "
                f"'{name}' names the repository's directory"
            )
        raise not_found(f"not a git repository (no such directory): {text}")
    try:
        return hold_dir(guard, text)
    except ApiError as e:
        if e.status in (400, 404):
            raise not_found(
                f"not a git repository (no such directory): {text}"
            ) from None
        raise


def require_text(value: Any, name: str, limit: int) -> str:
    """A non-empty string without NUL, at most ``limit`` bytes."""
    if not isinstance(value, str) or not value:
        raise bad_request(f"'{name}' must be a non-empty string")
    if "\x00" in value or len(value.encode("utf-8", "surrogatepass")) > limit:
        raise bad_request(f"'{name}' holds NUL or is over {limit} bytes")
    return value


def ref_name(value: Any, name: str) -> str:
    """
    A branch, tag or commit name: never an option, never a path trick.

    :raises ApiError: 400 ``invalid_param``.
    """
    if not isinstance(value, str) or not value:
        raise bad_request(f"'{name}' must be a non-empty string")
    if value.startswith("-") or any(c in value for c in "\x00\n\r \t~^:?*[\\"):
        if not (
            name in ("target", "rev", "ref", "source", "start_point", "commit")
            and _revision(value)
        ):
            raise bad_request(f"'{name}' is not a valid ref name: {value!r}")
    if ".." in value and name not in ("rev",):
        raise bad_request(f"'{name}' is not a valid ref name: {value!r}")
    return value


def _revision(value: str) -> bool:
    """``HEAD~2``, ``main^``: revision suffixes allowed where a revision is."""
    return not value.startswith("-") and not any(
        c in value for c in "\x00\n\r \t:?*[\\"
    )


def conflict_error(kind: str, message: str) -> ApiError:
    """409 ``git_conflict`` with ``kind``."""
    return git_conflict(message, kind)
