# -*- test-case-name: tests.routes.test_devtools -*-
"""
Handlers of the ``dev_tools`` group (SPEC §7.7): code runs and git.

A code run is a child like any other (SPEC §7.4): its own session, the
guarded cwd, the caller's ``env`` over the daemon's minus secrets, the
policy's user, a wall-clock limit that ends the whole tree, capped output.
git is the daemon's own helper: it starts from the boot environment with
everything that could make a repository run code switched off
(:mod:`sandboxd.git`).
"""

from __future__ import annotations

import os
import weakref
from typing import Any

from twisted.internet.defer import Deferred, DeferredList

from sandboxd import processes
from sandboxd.access.guard import PathGuard
from sandboxd.errors import (
    ApiError,
    Code,
    bad_request,
    forbidden,
    git_error,
    internal,
    payload_too_large,
    policy_rule,
    timed_out,
)
from sandboxd.policy import defaults
from sandboxd.policy.confinement import confinement_of
from sandboxd.policy.rules import EffectiveRule
from sandboxd.processes.command import (
    RUNTIMES,
    check_command_allowed,
    find_executable,
    language_name,
    resolve_user,
)
from sandboxd.processes.environment import (
    BOOT_ENVIRON,
    child_environment,
    note_argv,
    validate_env,
)
from sandboxd.web import params
from sandboxd.web.messages import ServerRequest
from sandboxd.web.params import flag, seconds, string


def _timeout_error(
    what: str, seconds: float | None, idle: bool = False, **extra: Any
) -> ApiError:
    """408 ``timeout``, or ``idle_timeout`` for a run that printed nothing."""
    if idle:
        return timed_out(
            f"IdleTimeout: {what} printed nothing for {seconds:g} s and was stopped",
            idle=True,
            **extra,
        )
    return timed_out(f"{what} timed out after {seconds:g} s", **extra)


def _text(data: bytes) -> str:
    return data.decode("utf-8", "replace")


async def code_run(request: ServerRequest) -> dict[str, Any]:
    """
    ``POST /code/run {"language"?, "code", "timeout"?, "cwd"?, "env"?, "user"?}``.

    ``language`` is ``python`` when not given, and read in any case, as
    on the seed.
    """
    body = request.body
    rule = request.rule
    language = language_name(body.get("language", "python"))
    if language not in rule.params.languages:
        raise forbidden(
            f"the language {language!r} is not allowed"
            f" (allowed: {', '.join(rule.params.languages) or 'none'})",
            Code.LANGUAGE_NOT_ALLOWED,
            rule=policy_rule(rule, "params.languages"),
        )
    code = string(body.get("code"), "code")
    if "\x00" in code:
        raise bad_request("'code' must not contain NUL")
    if len(code.encode("utf-8", "surrogatepass")) > defaults.CODE_MAX_BYTES:
        raise payload_too_large(
            defaults.CODE_MAX_BYTES,
            message=f"'code' is over {defaults.CODE_MAX_BYTES} bytes; upload it as a file"
            " and run it with /shell",
        )
    ceiling = rule.limits.run_ceiling  # a longer request timeout is cut to it
    timeout = seconds(body.get("timeout"), "timeout", ceiling, ceiling=ceiling)
    idle = seconds(body.get("idle_timeout"), "idle_timeout", None)
    cwd = PathGuard(rule).cwd(body.get("cwd"))
    run_as = resolve_user(body.get("user"), rule)
    env = child_environment(request.context, rule, validate_env(body.get("env")))
    if run_as is not None:
        run_as.apply(env)
    names, flag = RUNTIMES[language]
    executable = next((p for n in names if (p := find_executable(n, env))), None)
    if executable is None:
        raise internal(
            f"{language} runtime not found ({' or '.join(names)} is not on PATH)",
            "FileNotFoundError",
        )
    check_command_allowed(rule, [executable])
    note_argv(request, [executable, flag, code], validate_env(body.get("env")))
    limit = (
        rule.limits.max_output_bytes
        or defaults.ENDPOINT_LIMITS["code_run"]["max_output_bytes"]
    )
    try:
        result = await processes.run_collect(
            request.context.reactor,
            [executable, flag, code],
            children=request.context.children,
            env=env,
            cwd=cwd,
            timeout=timeout,
            max_output_bytes=limit,
            idle_timeout=idle,
            run_as=run_as,
            confine=confinement_of(rule, env.get("HOME")),
        )
    except FileNotFoundError:
        raise internal(f"{language} runtime not found", "FileNotFoundError") from None
    printed: dict[str, Any] = {
        "stdout": _text(result.stdout),
        "stderr": _text(result.stderr),
    }
    if result.truncated:
        printed["truncated"] = True
        printed["dropped_bytes"] = result.dropped_bytes
    # What the code printed before it was stopped says where it stuck, as
    # /shell's timeout answer does.
    if result.timed_out:
        raise _timeout_error("the code run", timeout, **printed)
    if result.idle_timed_out:
        raise _timeout_error("the code run", idle, idle=True, **printed)
    out: dict[str, Any] = {
        "stdout": printed["stdout"],
        "stderr": printed["stderr"],
        "exit_code": result.exit_code,
        "language": language,
        "execution_time_ms": round(result.duration_ms, 2),
    }
    if result.truncated:
        out["truncated"] = True
        out["dropped_bytes"] = result.dropped_bytes
    return out


# -- git ---------------------------------------------------------------------


class _Git:
    """One git request: where it runs, with what, within which limits."""

    def __init__(self, request: ServerRequest) -> None:
        from sandboxd import git  # on the first git call, not at start

        self.request = request
        self.rule: EffectiveRule = request.rule
        from sandboxd.git.target import hold_dir

        path = params.path(request.arg("path"), "path", ".", parents=False)
        guard = PathGuard(self.rule)
        # git starts in the directory checked, held open: a link swapped in
        # at its path meanwhile cannot send it outside the base dir.
        self.cwd, held = hold_dir(guard, guard.cwd(path))
        weakref.finalize(self, os.close, held)
        self.start_in = processes.held_directory(held)
        self.env = git.git_environment(
            child_environment(request.context, self.rule, base=BOOT_ENVIRON),
            ceiling=git.ceiling_for(self.cwd, self.rule.base_dir),
        )
        self.run_as = resolve_user(None, self.rule)
        self.timeout = self.rule.limits.timeout_seconds
        self.extra_config: list[str] = []
        #: The work tree's top (names in git's output are relative to it),
        #: once :meth:`prepare` learnt it; None for a bare repository.
        self.top: str | None = None
        #: The git dir, once :meth:`prepare` learnt it.
        self.git_dir: str | None = None

    async def run(self, args: list[str], max_output_bytes: int = defaults.MIB) -> Any:
        """Run git; the result, or the error the client sees."""
        from sandboxd import git  # on the first git call, not at start

        argv = git.git_argv("git", args, self.extra_config)
        try:
            result = await processes.run_collect(
                self.request.context.reactor,
                argv,
                children=self.request.context.children,
                env=self.env,
                cwd=self.start_in,
                timeout=self.timeout,
                max_output_bytes=max_output_bytes,
                run_as=self.run_as,
            )
        except FileNotFoundError:
            raise internal("git is not installed", "FileNotFoundError") from None
        if result.timed_out:
            raise _timeout_error("git", self.timeout)
        if result.exit_code != 0:
            message = (
                _text(result.stderr).strip() or f"git exited with {result.exit_code}"
            )
            # The first line ended by LF or CR (not at U+2028 or NEL, which
            # a path or a ref name in git's message may hold).
            raise git_error(message.replace("\r", "\n").split("\n")[0][:1000])
        return result

    async def prepare(self) -> None:
        """
        Learn the repository's filter drivers (to empty them) and check
        that every place git reads it lies where the caller may look: its
        work tree, its git dir, the common dir ``commondir`` names, the
        object, ref and reflog directories, and the object directories
        ``objects/info/alternates`` names.
        """
        from sandboxd import git  # on the first git call, not at start

        where, config = await _both(
            self.run(list(git.WHERE_ARGS)),
            self.run(["config", "--null", "--list", "--name-only"]),
        )
        places = git.parse_places(where.stdout, self.cwd)
        if places is None:
            raise git_error("a path of the repository holds a line break")
        self.top = places.top
        self.git_dir = places.git_dir
        guard = PathGuard(self.rule)
        for place in sorted(places.holders):
            guard.check(place, "read")
        if os.path.lexists(places.alternates_file):
            listed = await self.run(["count-objects", "-v"])
            for other in git.parse_alternates(listed.stdout):
                guard.check(git.holder_of(os.path.realpath(other)), "read")
        try:
            self.extra_config = git.filter_overrides(git.config_names(config.stdout))
        except git.UnsettableName as e:
            raise e.as_error() from None

    def shown(self, name: str) -> bool:
        """
        Whether the policy lets the caller see ``name``, a path git printed
        relative to the work tree's top: decided on its name, as a listing
        decides (git reports a link as a link, never what it leads to).
        """
        if self.top is None:
            return True
        return PathGuard(self.rule).decide(os.path.join(self.top, name)).allowed

    def file_arg(self) -> list[str]:
        """``-- FILE`` for ``?file=``, checked like ``path``."""
        name = params.path(self.request.arg("file"), "file", None, parents=False)
        if not name:
            return []
        PathGuard(self.rule).check(os.path.join(self.cwd, name), "read")
        return ["--", name]


async def _both(first: Any, second: Any) -> tuple[Any, Any]:
    """
    Await two coroutines side by side; then the first one's error, if any.

    Both are awaited even when one fails at once: each runs a child, and
    an answer sent while the other's child still runs would leave it
    behind the call (a ``rev-parse`` refused outside a repository used to
    answer before its ``config`` twin had ended).
    """
    results = await DeferredList(
        [Deferred.fromCoroutine(first), Deferred.fromCoroutine(second)],
        consumeErrors=True,
    )
    for ok, value in results:
        if not ok:
            value.raiseException()
    return results[0][1], results[1][1]


async def git_status(request: ServerRequest) -> dict[str, Any]:
    """``GET /git/status?path=.``."""
    from sandboxd import git  # on the first git call, not at start

    run = _Git(request)
    await run.prepare()
    result = await run.run(
        [
            "status",
            "--porcelain=v1",
            "-b",
            "-z",
            "--untracked-files=normal",
            "--ignore-submodules=dirty",
        ],
        max_output_bytes=16 * defaults.MIB,
    )
    if result.truncated:
        raise git_error("git status printed more than can be returned")
    # A denied file is not named, as files_list does not name it.
    shown = run.shown if request.rule.paths.deny else None
    return git.status_result(result.stdout, shown, git.in_progress(run.git_dir))


async def git_diff(request: ServerRequest) -> dict[str, Any]:
    """``GET /git/diff?path=.&staged=false&file=``."""
    from sandboxd import git  # on the first git call, not at start

    run = _Git(request)
    staged = flag(request.arg("staged"), "staged")
    files = run.file_arg()
    if not files and request.rule.paths.deny:
        # A whole-tree diff prints the changes of every file, denied ones
        # too: as on the seed, the caller names the file it may read.
        raise forbidden(
            "a 'file' is required while paths.deny rules apply: a diff of the"
            " whole repository would show the changes of denied files",
            Code.PATH_DENIED,
            rule=request.rule.source("paths.deny") or "policy:paths.deny",
        )
    await run.prepare()
    limit = (
        request.rule.limits.max_output_bytes
        or defaults.ENDPOINT_LIMITS["git_diff"]["max_output_bytes"]
    )
    common = [
        "diff",
        *git.NO_DIFF_PROGRAMS,
        "--no-color",
        "--ignore-submodules=dirty",
    ]
    if staged:
        common.append("--cached")
    # Twice the limit keeps a head of exactly ``limit`` bytes when git
    # prints more (the capture keeps head and tail halves).
    patch, numstat = await _both(
        run.run([*common, *files], max_output_bytes=2 * limit),
        run.run(
            [*common, "--numstat", "-z", *files], max_output_bytes=16 * defaults.MIB
        ),
    )
    if request.rule.paths.deny:
        _refuse_denied_changes(run, files[-1], numstat)
    stdout = patch.stdout[:limit] if patch.truncated else patch.stdout
    diff, truncated = git.truncate_diff(stdout, limit, cut=patch.truncated)
    out: dict[str, Any] = {"diff": diff, "stats": git.parse_numstat(numstat.stdout)}
    if truncated:
        out["truncated"] = True
    return out


def _refuse_denied_changes(run: _Git, file: str, numstat: Any) -> None:
    """
    403 when the diff of ``file`` shows the changes of a file the policy
    denies: git takes a directory (``.``, ``conf``) as every file below it,
    so a diff of one is a diff of the denied files there too.  The names
    are those of the numstat run beside the diff, with the same arguments;
    none is given back.
    """
    from sandboxd import git  # on the first git call, not at start

    if numstat.truncated:
        raise git_error(
            f"the diff of {file!r} changes more files than can be checked; name a file"
        )
    denied = sum(not run.shown(n) for n in git.numstat_names(numstat.stdout))
    if denied:
        raise forbidden(
            f"the diff of {file!r} would show the changes of {denied} file(s)"
            " paths.deny refuses: name a file, or a directory holding no"
            " changed denied file",
            Code.PATH_DENIED,
            rule=run.rule.source("paths.deny") or "policy:paths.deny",
        )


HANDLERS: dict[str, Any] = {
    "code_run": code_run,
    "git_status": git_status,
    "git_diff": git_diff,
}
