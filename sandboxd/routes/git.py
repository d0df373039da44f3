# -*- test-case-name: tests.routes.test_git -*-
"""
Handlers of the ``git`` group (SPEC §24): git that writes.

Local calls (init, add, commit, log, branches, checkout, reset, restore,
stash, remotes, config) run git to completion within the local limits;
remote calls (clone, fetch, pull, push) are jobs
(:mod:`sandboxd.git.jobs`) whose remote was checked by the daemon first
(:mod:`sandboxd.git.remotes`) and whose credentials reach git only through
the askpass socket (:mod:`sandboxd.git.askpass`).
"""

from __future__ import annotations

import contextlib
import fnmatch
import os
from collections.abc import AsyncIterator, Set
from typing import Any

from sandboxd.access.audit import redact_url_secrets
from sandboxd.access.guard import PathGuard, os_error
from sandboxd.errors import (
    ApiError,
    Code,
    bad_request,
    file_exists,
    forbidden,
    insufficient_storage,
    limit_exceeded,
    limit_rule,
    noted,
    policy_rule,
    unavailable,
)
from sandboxd.git import NO_DIFF_PROGRAMS, parse_numstat, truncate_diff
from sandboxd.git.askpass import Secret, dot_segments, under_prefix
from sandboxd.git.jobs import GitJob, GitJobTable
from sandboxd.git.outcomes import (
    BRANCH_FORMAT,
    LOG_ARGS,
    parse_branches,
    parse_log,
    parse_push,
    parse_remotes,
    push_rejection,
    push_report,
    redact,
)
from sandboxd.git.remotes import (
    Remote,
    check_addresses,
    literal_addresses,
    parse_remote,
)
from sandboxd.git.runner import (
    GitCall,
    conflict_error,
    ref_name,
    repo_path,
    require_text,
)
from sandboxd.git.target import CloneTarget, hold_dir
from sandboxd.git.worktree import (
    KeepBudget,
    KeptTree,
    keep,
    put_back,
    remove_empty_dirs,
)
from sandboxd.policy import defaults
from sandboxd.processes.environment import BOOT_ENVIRON
from sandboxd.web import params
from sandboxd.web.messages import ServerRequest, ServerResponse, SSEResponse
from sandboxd.web.sse import Follower, SSEChannel, resume_point

# -- shared ----------------------------------------------------------------------


async def _repo(request: ServerRequest, value: Any, op: str = "write") -> GitCall:
    """The call for the repository at ``value`` (404 when it is none)."""
    path, held = repo_path(request, value)
    call = GitCall(request.context, request.rule, path, user=_user(request), held=held)
    request.audit["repo"] = call.cwd
    await call.open_repository(op)
    return call


def _user(request: ServerRequest) -> Any:
    """Who git runs as: the body's ``user`` (the query's for GET and DELETE)."""
    value = request.body.get("user")
    return value if value is not None else request.arg("user")


def _text(data: bytes) -> str:
    return data.decode("utf-8", "replace")


async def _current_branch(call: GitCall) -> str | None:
    """The checked-out branch, or None when HEAD is detached."""
    result = await call.run(["symbolic-ref", "--short", "-q", "HEAD"], check=False)
    name = _text(result.stdout).strip()
    return name if result.exit_code == 0 and name else None


async def _head(call: GitCall) -> str | None:
    """HEAD's commit, or None in a repository with no commit yet."""
    result = await call.run(
        ["rev-parse", "-q", "--verify", "HEAD^{commit}"], check=False
    )
    sha = _text(result.stdout).strip()
    return sha if result.exit_code == 0 and sha else None


def _check_protected(request: ServerRequest, branch: str | None, what: str) -> None:
    """403 ``protected_branch`` when ``branch`` matches ``params.protected_branches``."""
    if branch is None:
        return
    for pattern in request.rule.params.protected_branches:
        if fnmatch.fnmatchcase(branch, pattern):
            raise forbidden(
                f"the branch {branch!r} is protected ({pattern}): {what} is not allowed",
                Code.PROTECTED_BRANCH,
                rule=policy_rule(request.rule, "params.protected_branches"),
                branch=branch,
            )


def _files(
    request: ServerRequest, call: GitCall, value: Any, name: str = "files"
) -> list[str]:
    """
    Paths inside the work tree, each through the guard (no ``..``, no
    option) where git takes it: relative to the directory the call named.
    """
    files = params.strings(value, name, min_items=1)
    guard = PathGuard(request.rule)
    for item in files:
        params.path(item, name, parents=False)
        guard.check(os.path.join(call.cwd, item), "write")
    return files


async def _denied_among(
    request: ServerRequest, call: GitCall, listing: list[str]
) -> list[str]:
    """
    The paths git lists with ``listing`` (NUL-separated, from the top of
    the work tree) that ``paths.deny`` refuses; none without deny rules.

    A call that names a directory (``.``) or the whole tree (``all``)
    would otherwise stage, commit, show or push a file the same call
    refuses when named.

    :raises ApiError: 403 ``path_denied`` when the listing was cut short
        (the rest is unknown, so may hold one).
    """
    if not request.rule.paths.deny or call.top is None:
        return []
    try:
        listed = await _listed(call, listing)
    except _ListCut:
        listed = None
    if listed is None:
        raise forbidden(
            "the files this call would take cannot all be listed (too many, or "
            "git refused), so they cannot be checked against paths.deny; name "
            "fewer files",
            Code.PATH_DENIED,
            rule=request.rule.source("paths.deny") or "policy:paths.deny",
        )
    guard = PathGuard(request.rule)
    out = []
    for raw in listed:
        path = raw.decode("utf-8", "surrogateescape")
        decision = guard.decide(os.path.join(call.top, path), "read")
        if not decision.allowed and decision.code is Code.PATH_DENIED:
            out.append(path)
    return out


def _holds_denied(
    request: ServerRequest, paths: list[str], what: str, hint: str
) -> ApiError:
    """403 ``path_denied``: the call would ``what`` the denied ``paths``."""
    listed = ", ".join(paths[:10])
    if len(paths) > 10:
        listed += f" and {len(paths) - 10} more"
    return forbidden(
        f"{what} paths the policy denies ({listed}); nothing was done: {hint}",
        Code.PATH_DENIED,
        rule=request.rule.source("paths.deny") or "policy:paths.deny",
        paths=paths[:100],
    )


#: ``git ls-files`` arguments listing what ``git add`` of a pathspec (or
#: ``add -A`` from the top) stages: changed, removed and new files.
_ADDABLE = ["ls-files", "-z", "--full-name", "-m", "-d", "-o", "--exclude-standard"]


# -- local: init, add, commit ------------------------------------------------------


async def git_init(request: ServerRequest) -> dict[str, Any]:
    """``POST /git/init {path, initial_branch?: "main", bare?: false}``."""
    body = request.body
    text = params.path(body.get("path"), "path", parents=False)
    guard = PathGuard(request.rule)
    target = guard.check(text, "write")
    branch = ref_name(body.get("initial_branch") or "main", "initial_branch")
    bare = params.flag(body.get("bare"), "bare")
    parent, parent_fd = hold_dir(guard, guard.cwd(os.path.dirname(target) or "/"))
    call = GitCall(
        request.context, request.rule, parent, user=_user(request), held=parent_fd
    )
    args = ["init", "-q", f"--initial-branch={branch}"]
    if bare:
        args.append("--bare")
    # git works in the directory held, named "." (a name would be looked
    # up again, through whatever link was put there meanwhile).
    place = CloneTarget(parent_fd, parent, os.path.basename(target), "the target")
    try:
        place.make(call.uid_gid if os.geteuid() == 0 else None, reuse_full=True)
        before = [] if place.made else place.entries()
    except OSError as e:
        place.close()
        raise os_error(e, text) from None
    inner = GitCall(
        request.context,
        request.rule,
        place.path,
        user=_user(request),
        held=os.dup(place.fd),
    )
    try:
        try:
            await inner.run([*args, "--", "."])
            place.place()
        except BaseException:
            # What git made and gave up on, and the directory made for it;
            # in a directory that was there, only the repository's entries
            # that were not (another call's repository may be there by
            # now).  An error answer leaves the sandbox as it was.
            if place.made or inner.child is not None:
                keep = set(before) | set(place.entries()) - _init_entries(bare)
                place.undo(keep)
            raise
    finally:
        place.close()
    # git re-initialises an existing repository and keeps its HEAD (it
    # ignores --initial-branch with a warning): answer the branch it has.
    head = await inner.run(["symbolic-ref", "--short", "-q", "HEAD"], check=False)
    current: str | None = branch  # git could not read HEAD: what it was asked
    if head.exit_code == 0:
        current = _text(head.stdout).rstrip("\n") or None
    elif head.exit_code == 1:  # HEAD is detached
        current = None
    return {"path": target, "initial_branch": current, "bare": bare}


#: What ``git init --bare`` makes in the directory it is given.
_BARE_ENTRIES = frozenset(
    {"HEAD", "config", "description", "hooks", "info", "objects", "refs", "branches"}
)


def _init_entries(bare: bool) -> frozenset[str]:
    """The entries ``git init`` makes in its directory."""
    return _BARE_ENTRIES if bare else frozenset({".git"})


async def git_add(request: ServerRequest) -> dict[str, Any]:
    """``POST /git/add {path, files: [..]} | {path, all: true}`` → ``{staged}``."""
    body = request.body
    call = await _repo(request, body.get("path"))
    if params.flag(body.get("all"), "all"):
        args = ["add", "-A"]
        listing = ["-C", call.top or call.cwd, *_ADDABLE]
    else:
        files = _files(request, call, body.get("files"))
        args = ["add", "--", *files]
        listing = [*_ADDABLE, "--", *files]
    denied = await _denied_among(request, call, listing)
    if denied:
        raise _holds_denied(
            request, denied, "this would stage", "name the files to stage"
        )
    await call.run(args)
    staged = await call.run(["diff", "--cached", "--name-only", "-z"])
    return {"staged": [n for n in _text(staged.stdout).split("\0") if n]}


def _author_env(request: ServerRequest, author: Any) -> dict[str, str]:
    """``GIT_AUTHOR_*``/``GIT_COMMITTER_*`` from the body's or the policy's author."""
    chosen = (
        author if author is not None else request.context.policy.document.git.author
    )
    if chosen is None:
        return {}
    if not isinstance(chosen, dict):
        raise bad_request("'author' must be an object {name, email}")
    name = require_text(chosen.get("name"), "author.name", 256)
    email = require_text(chosen.get("email"), "author.email", 256)
    if "\n" in name or "\n" in email:
        raise bad_request("'author' must not hold newlines")
    return {
        "GIT_AUTHOR_NAME": name,
        "GIT_AUTHOR_EMAIL": email,
        "GIT_COMMITTER_NAME": name,
        "GIT_COMMITTER_EMAIL": email,
    }


async def _identity(
    request: ServerRequest, call: GitCall, author: Any
) -> dict[str, str]:
    """
    Who a commit is made as: the body's author, else the policy's, else
    what the repository's configuration says, completed from its user's
    global git configuration.
    """
    return _author_env(request, author) or await call.identity_from_home()


async def git_commit(request: ServerRequest) -> dict[str, Any]:
    """
    ``POST /git/commit {path, message, author?, allow_empty?, amend?, files?,
    signoff?}`` → ``{commit, branch, summary}``; 403 on a protected branch.
    """
    body = request.body
    message = require_text(
        body.get("message"), "message", defaults.GIT_MESSAGE_MAX_BYTES
    )
    call = await _repo(request, body.get("path"))
    branch = await _current_branch(call)
    _check_protected(request, branch, "committing")
    call.env.update(await _identity(request, call, body.get("author")))
    args = ["commit", "-q", "-F", "-", "--no-edit", "--cleanup=strip"]
    if params.flag(body.get("allow_empty"), "allow_empty"):
        args.append("--allow-empty")
    if params.flag(body.get("amend"), "amend"):
        args.append("--amend")
    if params.flag(body.get("signoff"), "signoff"):
        args.append("--signoff")
    staged = ["diff", "--cached", "--name-only", "-z", "--no-renames"]
    listings = [staged]
    if body.get("files") is not None:
        files = _files(request, call, body.get("files"))
        args += ["--", *files]
        # A commit of named paths takes their files as they are.
        listings = [
            [*staged, "--", *files],
            ["ls-files", "-z", "--full-name", "-m", "-d", "--", *files],
        ]
    denied = [
        p for listing in listings for p in await _denied_among(request, call, listing)
    ]
    if denied:
        raise _holds_denied(
            request,
            sorted(set(denied)),
            "the commit would hold",
            "unstage them (git_reset with files), or name the files to commit",
        )
    await call.run(args, stdin=message.encode("utf-8"))
    sha = await _head(call)
    stats = await call.run(
        [
            "show",
            *NO_DIFF_PROGRAMS,
            "--numstat",
            "-z",
            "--format=",
            "--no-renames",
            "HEAD",
        ]
    )
    return {"commit": sha, "branch": branch, "summary": parse_numstat(stats.stdout)}


# -- local: reading ----------------------------------------------------------------


async def git_log(request: ServerRequest) -> dict[str, Any]:
    """``GET /git/log?path=&ref=&max=50&file=`` → ``{commits}``."""
    call = await _repo(request, request.arg("path"), "read")
    count = params.integer(
        request.arg("max"), "max", 50, low=1, high=defaults.GIT_LOG_MAX
    )
    ref = ref_name(request.arg("ref") or "HEAD", "ref")
    if await _head(call) is None and ref == "HEAD":
        return {"commits": []}
    args = ["log", *LOG_ARGS, f"--max-count={count}", ref, "--"]
    file = params.path(request.arg("file"), "file", None, parents=False)
    if file:
        PathGuard(request.rule).check(os.path.join(call.cwd, file), "read")
        args.append(file)
    result = await call.run(args)
    return {"commits": parse_log(result.stdout)}


async def git_show(request: ServerRequest) -> dict[str, Any]:
    """``GET /git/show?path=&rev=HEAD`` → the commit and its diff (capped at 1 MB)."""
    call = await _repo(request, request.arg("path"), "read")
    rev = ref_name(request.arg("rev") or "HEAD", "rev")
    meta = await call.run(["log", "-1", *LOG_ARGS, rev, "--"])
    commits = parse_log(meta.stdout)
    if not commits:
        raise bad_request(f"no commit {rev!r}")
    # The changes of denied files are left out of the diff (their names
    # are said): the rest of the commit is the caller's to read.
    withheld = await _denied_among(
        request,
        call,
        ["show", "-z", "--format=", "--name-only", "--no-renames", "-m", rev, "--"],
    )
    excluded = [f":(exclude,literal,top){path}" for path in withheld]
    limit = defaults.MB
    call.max_output = limit + 1
    patch = await call.run(
        [
            *("show", *NO_DIFF_PROGRAMS, "--format=", "--patch", "--no-color"),
            *(rev, "--", *([":(top)", *excluded] if excluded else [])),
        ],
        own_pathspecs=bool(excluded),
    )
    diff, truncated = truncate_diff(patch.stdout, limit, cut=patch.truncated)
    out = {**commits[0], "diff": diff, "truncated": truncated}
    if withheld:
        out["withheld"] = sorted(set(withheld))
    return out


async def git_branches(request: ServerRequest) -> dict[str, Any]:
    """``GET /git/branches?path=`` → ``{current, detached, branches}``."""
    call = await _repo(request, request.arg("path"), "read")
    result = await call.run(
        ["for-each-ref", f"--format={BRANCH_FORMAT}", "refs/heads", "refs/remotes"]
    )
    current = await _current_branch(call)
    return {
        "current": current,
        "detached": current is None and await _head(call) is not None,
        "branches": parse_branches(result.stdout),
    }


async def git_remotes(request: ServerRequest) -> dict[str, Any]:
    """``GET /git/remotes?path=`` → ``{remotes: [{name, fetch_url, push_url}]}``."""
    call = await _repo(request, request.arg("path"), "read")
    result = await call.run(["remote", "-v"])
    return {"remotes": parse_remotes(result.stdout)}


# -- local: branches, checkout, reset, restore, stash ---------------------------------


async def git_branch_create(request: ServerRequest) -> dict[str, Any]:
    """``POST /git/branches {path, name, start_point?, checkout?: false}``."""
    body = request.body
    call = await _repo(request, body.get("path"))
    name = ref_name(body.get("name"), "name")
    start = body.get("start_point")
    args = (
        ["switch", "-q", "-c", name]
        if params.flag(body.get("checkout"), "checkout")
        else ["branch", name]
    )
    if start is not None:
        args.append(ref_name(start, "start_point"))
    await call.run(args)
    sha = await call.run(["rev-parse", f"refs/heads/{name}"])
    return {"name": name, "commit": _text(sha.stdout).strip()}


async def git_branch_delete(request: ServerRequest) -> dict[str, Any]:
    """``DELETE /git/branches?path=&name=&force=false``; 403 for a protected one."""
    call = await _repo(request, request.arg("path"))
    name = ref_name(request.arg("name"), "name")
    _check_protected(request, name, "deleting it")
    force = params.flag(request.arg("force"), "force")
    await call.run(["branch", "-D" if force else "-d", name])
    return {"name": name, "deleted": True}


async def git_checkout(request: ServerRequest) -> dict[str, Any]:
    """``POST /git/checkout {path, ref, create?, force?}`` → ``{branch, commit, detached}``."""
    body = request.body
    call = await _repo(request, body.get("path"))
    ref = ref_name(body.get("ref"), "ref")
    args = ["checkout", "-q"]
    if params.flag(body.get("force"), "force"):
        args.append("--force")
    # A detached HEAD's commits that no ref holds are left behind by a
    # checkout of anything else (git warns; an agent has no reflog to
    # find them again): the answer names them.
    detached_at = None if await _current_branch(call) else await _head(call)
    if params.flag(body.get("create"), "create"):
        args += ["-b", ref]
        await call.run(args)
    else:
        args += [ref, "--"]
        await _switch_tree(request, call, args, ref)
    branch = await _current_branch(call)
    head = await _head(call)
    out: dict[str, Any] = {"branch": branch, "commit": head, "detached": branch is None}
    if detached_at is not None and detached_at != head:
        lost = await call.run(
            [
                "rev-list",
                f"--max-count={defaults.GIT_LEFT_BEHIND_MAX}",
                detached_at,
                "--not",
                "--branches",
                "--tags",
                "--remotes",
                "HEAD",
                "--",
            ],
            check=False,
        )
        left = _text(lost.stdout).split() if lost.exit_code == 0 else []
        if left:
            out["left_behind"] = left
    return out


async def _switch_tree(
    request: ServerRequest,
    call: GitCall,
    args: list[str],
    target: str,
    kept: KeptTree | None = None,
) -> None:
    """
    Run a git call that moves the work tree from HEAD's commit to
    ``target``'s (a checkout, a reset that writes the tree).  When the disk
    fills on the way, git stops with some files written and HEAD and the
    index as they were; the files it changed are then put back, so the 507
    means nothing happened: the ``kept`` ones as they were read before
    (a hard reset overwrites local changes, which git does not hold), else
    as HEAD has them (git refuses the others when a file they write has
    local changes).
    """
    try:
        await call.run(args)
    except ApiError as e:
        if e.code is not Code.INSUFFICIENT_STORAGE:
            raise
        if kept is not None:
            raise _after_put_back(e, await _put_kept_back(request, kept, e)) from None
        # HEAD is where it was: the failed call did not move it.
        before, after = await _head(call), await _commit_of(call, target)
        if before is None or after is None:
            raise
        if await _back_from_index(call, before, after):
            raise insufficient_storage(
                f"{e.message} (the disk is full: the work tree was put back as it was)"
            ) from None
        raise insufficient_storage(
            f"{e.message} (the disk is full, and the work tree could not be put "
            "back: some files are as the target has them, or cut short; once "
            "there is room, a forced checkout of the current branch restores them)"
        ) from None


async def _commit_of(call: GitCall, ref: str) -> str | None:
    """The commit ``ref`` names, or None."""
    result = await call.run(
        ["rev-parse", "-q", "--verify", "--end-of-options", f"{ref}^{{commit}}"],
        check=False,
    )
    sha = _text(result.stdout).strip()
    return sha if result.exit_code == 0 and sha else None


async def _back_from_index(
    call: GitCall, before: str, after: str, spare: Set[bytes] = frozenset()
) -> bool:
    """
    Put the files that differ between ``before`` (HEAD, whose content the
    index still holds) and ``after`` back as ``before`` has them: those
    ``before`` has from the index, those only ``after`` has removed, with
    the directories made for them that are left empty.  Git does it, as
    the call's user, from the top of the work tree (its paths are the
    top's, whichever directory the call named), so that no path is
    followed through a link.  Whether it all went back.

    :param spare: paths left as they are, and directories (``dir/``) with
        all below them: what the call did not write (local changes, which
        git refuses to overwrite; the user's untracked files).
    """
    top = call.top
    if top is None:
        return False
    listed = await call.run(
        ["diff-tree", "-r", "-z", "--no-renames", "--name-status", before, after],
        check=False,
    )
    fields = listed.stdout.split(b"\0")
    spared_dirs = tuple(p for p in spare if p.endswith(b"/"))
    changed = [
        (status, path)
        for status, path in zip(fields[0::2], fields[1::2], strict=False)
        if path not in spare and not path.startswith(spared_dirs)
    ]
    kept = [path for status, path in changed if status != b"A"]
    added = [
        path.decode("utf-8", "surrogateescape")
        for status, path in changed
        if status == b"A"
    ]
    ok = listed.exit_code == 0
    if kept:
        result = await call.run(
            ["-C", top, "checkout-index", "-f", "-q", "-z", "--stdin"],
            check=False,
            stdin=b"\0".join(kept) + b"\0",
        )
        ok = ok and result.exit_code == 0
    for start in range(0, len(added), _PATHS_PER_CALL):
        result = await call.run(
            [
                *("-C", top, "--literal-pathspecs", "clean", "-f", "-q", "-x", "--"),
                *added[start : start + _PATHS_PER_CALL],
            ],
            check=False,
        )
        ok = ok and result.exit_code == 0
    _remove_emptied(top, added)
    return ok


def _remove_emptied(top: str, files: list[str]) -> None:
    """Remove the directories of ``files`` (paths under ``top``) left empty."""
    folders = {f.rpartition("/")[0] for f in files}
    for folder in list(folders):
        while "/" in folder:
            folder = folder.rpartition("/")[0]
            folders.add(folder)
    folders.discard("")
    remove_empty_dirs(top, folders)


#: Paths named on one git command line when the work tree is put back.
_PATHS_PER_CALL = 500


async def git_reset(request: ServerRequest) -> dict[str, Any]:
    """
    ``POST /git/reset {path, mode?: mixed, target?: HEAD, files?}``; ``hard``
    needs ``params.allow_hard_reset``.
    """
    body = request.body
    mode = params.one_of(
        body.get("mode") or "mixed", "mode", ("soft", "mixed", "hard", "merge", "keep")
    )
    if mode == "hard" and not request.rule.params.allow_hard_reset:
        raise forbidden(
            "a hard reset is not allowed by policy",
            Code.PARAM_NOT_ALLOWED,
            rule=policy_rule(request.rule, "params.allow_hard_reset"),
        )
    call = await _repo(request, body.get("path"))
    target = ref_name(body.get("target") or "HEAD", "target")
    if body.get("files") is not None:
        await call.run(
            ["reset", "-q", target, "--", *_files(request, call, body.get("files"))]
        )
    elif mode in ("hard", "keep", "merge"):
        # These write the work tree; a hard one over local changes too.
        args = ["reset", "-q", f"--{mode}", target]
        listings = (
            [["diff-index", "--name-only", "-z", target]] if mode == "hard" else []
        )
        async with _keeping(call, listings) as kept:
            await _switch_tree(request, call, args, target, kept)
    else:
        await call.run(["reset", "-q", f"--{mode}", target])
    branch = await _current_branch(call)
    return {"mode": mode, "branch": branch, "commit": await _head(call)}


async def git_restore(request: ServerRequest) -> dict[str, Any]:
    """``POST /git/restore {path, files, staged?, worktree?, source?}``."""
    body = request.body
    call = await _repo(request, body.get("path"))
    files = _files(request, call, body.get("files"))
    args = ["restore"]
    staged = params.flag(body.get("staged"), "staged")
    worktree = params.flag(body.get("worktree"), "worktree", not staged)
    if staged:
        args.append("--staged")
    if worktree:
        args.append("--worktree")
    source = body.get("source")
    if source is not None:
        source = ref_name(source, "source")
        args.append(f"--source={source}")
    listings = []
    if worktree:
        # What the restore may overwrite: the files that differ from its
        # source (the index, else HEAD for a staged one too).
        base = source or ("HEAD" if staged else None)
        diff = ["diff-index", base] if base else ["diff-files"]
        listings.append([*diff, "--name-only", "-z", "--", *files])
    async with _keeping(call, listings) as kept:
        try:
            await call.run([*args, "--", *files])
        except ApiError as e:
            raise _after_put_back(e, await _put_kept_back(request, kept, e)) from None
    return {"restored": files, "staged": staged, "worktree": worktree}


@contextlib.asynccontextmanager
async def _keeping(
    call: GitCall, listings: list[list[str]], always: bool = False
) -> AsyncIterator[KeptTree | None]:
    """
    The work tree's files that git lists with ``listings`` (each a git call
    printing NUL-separated paths from the top), kept as they are now
    (:mod:`sandboxd.git.worktree`) while the block runs; None when there is
    no work tree or nothing listed.  Their bytes count against the budget
    of all calls in flight (:data:`~sandboxd.policy.defaults.GIT_KEEP_TOTAL_BYTES`):
    past it a call keeps what is left.

    :param always: keep them however much room the disk has; else only
        when it has less than :data:`~sandboxd.policy.defaults.GIT_KEEP_BELOW_FREE_BYTES`
        free, since only a full disk stops such a call half-way, and the
        listing costs a git process on every call.
    """
    free = call.free_bytes()
    if not always and free is not None and free >= defaults.GIT_KEEP_BELOW_FREE_BYTES:
        yield None
        return
    budget = _keep_budget(call.context)
    granted = budget.take(defaults.GIT_KEEP_BYTES)
    try:
        kept = await _keep(call, listings, granted)
        held = kept.size if kept is not None else 0
        budget.give(granted - held)
        granted = held
        yield kept
    finally:
        budget.give(granted)


async def _keep(
    call: GitCall, listings: list[list[str]], limit: int
) -> KeptTree | None:
    """What :func:`_keeping` keeps, at most ``limit`` bytes of it."""
    if call.top is None or not listings:
        return None
    paths: list[str] = []
    cut = False
    for listing in listings:
        try:
            listed = await _listed(call, listing)
        except _ListCut:
            cut = True
            continue
        # A listing git refuses (a stash with no untracked files) lists none.
        paths += [p.decode("utf-8", "surrogateescape") for p in listed or []]
    if not paths and not cut:
        return None
    found: KeptTree = await call.context.in_thread(keep, call.top, paths, limit)
    if cut:
        found.unkept.append("(files past what git's listing may print)")
    return found


class _ListCut(Exception):
    """A listing longer than a git call may print: some paths are unknown."""


async def _listed(call: GitCall, listing: list[str]) -> list[bytes] | None:
    """
    The paths git prints NUL-separated for ``listing``; None when git
    refused.  Raises :class:`_ListCut` when the list was cut at the call's
    output bound, since a path missing from it would be taken as untouched.
    """
    result = await call.run(listing, check=False)
    if result.exit_code != 0:
        return None
    if result.truncated:
        raise _ListCut()
    return [p for p in result.stdout.split(b"\0") if p]


def _untracked(top: str) -> list[str]:
    """The git call listing the untracked files (not the ignored ones) from ``top``."""
    return ["-C", top, "ls-files", "-o", "-z", "--exclude-standard"]


def _keep_budget(context: Any) -> KeepBudget:
    if context.git_keep_budget is None:
        context.git_keep_budget = KeepBudget(defaults.GIT_KEEP_TOTAL_BYTES)
    budget: KeepBudget = context.git_keep_budget
    return budget


async def _stash_ref(call: GitCall) -> bytes:
    """The commit ``refs/stash`` names (empty when there is no stash)."""
    result = await call.run(["rev-parse", "-q", "--verify", "refs/stash"], check=False)
    return result.stdout


async def _push_undone(
    request: ServerRequest,
    call: GitCall,
    kept: KeptTree | None,
    e: ApiError,
    before: bytes,
) -> ApiError:
    """
    A stash push that failed, perhaps (on a full disk) after it made the
    stash, with the work tree half reset: the files are put back, then a
    stash made on the way dropped, so that nothing happened; while a file
    is not as it was, the stash stays, since the changes are in it.
    """
    left = await _put_kept_back(request, kept, e)
    if await _stash_ref(call) == before:
        return _after_put_back(e, left)
    if left:
        return noted(
            _after_put_back(e, left),
            "the changes are in the stash made on the way, stash@{0}",
        )
    dropped = await call.run(["stash", "drop", "-q"], check=False)
    if dropped.exit_code != 0:
        return _after_put_back(
            e,
            [],
            "the work tree was put back as it was, and the stash made on the "
            "way is still there, stash@{0}",
        )
    return _after_put_back(e, [], "the work tree was put back as it was")


async def _unmerged(call: GitCall) -> bool:
    """Whether the index holds a conflict (a merge that stopped half-done)."""
    result = await call.run(["ls-files", "-u", "-z"], check=False)
    return result.exit_code != 0 or bool(result.stdout)


async def _put_kept_back(
    request: ServerRequest, kept: KeptTree | None, e: ApiError
) -> list[str]:
    """
    Put back the ``kept`` files a call that failed with ``e`` may have
    written; the paths that are not as they were (with a full disk, also
    those that were not kept, which git may have written half-way).
    """
    if kept is None:
        return []
    wrong: list[str] = await request.context.in_thread(put_back, kept)
    if e.code is Code.INSUFFICIENT_STORAGE:
        wrong += [p for p in kept.unkept if p not in wrong]
    return wrong


def _after_put_back(
    e: ApiError, left: list[str], done: str = "the work tree was put back as it was"
) -> ApiError:
    """
    ``e``, saying what became of the work tree when it matters: with a
    full disk what was ``done``, or the paths ``left`` not as they were.
    """
    if left:
        listed = ", ".join(left[:10])
        if len(left) > 10:
            listed += f" and {len(left) - 10} more"
        return noted(
            e, f"the work tree could not all be put back as it was: check {listed}"
        )
    if e.code is not Code.INSUFFICIENT_STORAGE:
        return e
    return noted(e, f"the disk is full: {done}")


async def git_stash(request: ServerRequest) -> dict[str, Any]:
    """``POST /git/stash {path, action: push|pop|list|drop, message?, index?}``."""
    body = request.body
    action = params.one_of(
        body.get("action") or "push", "action", ("push", "pop", "list", "drop")
    )
    call = await _repo(request, body.get("path"))
    index = params.integer(body.get("index"), "index", 0, low=0, high=10000)
    if action == "push":
        args = ["stash", "push", "-q", "--include-untracked"]
        if body.get("message") is not None:
            args += [
                "-m",
                require_text(
                    body.get("message"), "message", defaults.GIT_MESSAGE_MAX_BYTES
                ),
            ]
        before = await _stash_ref(call)
        # What the push may write: the changed files it resets, and the
        # untracked ones it removes.
        listings = [["diff-index", "--name-only", "-z", "HEAD"]]
        if call.top is not None:
            listings.append(_untracked(call.top))
        async with _keeping(call, listings) as kept:
            try:
                await call.run(args, own_pathspecs=True)
            except ApiError as e:
                raise await _push_undone(request, call, kept, e, before) from None
        if await _stash_ref(call) == before:
            raise conflict_error("no_local_changes", "no local changes to stash")
    elif action == "pop":
        stash = f"stash@{{{index}}}"
        # What the pop may write: the files the stash changed, and its
        # untracked ones (git restores those first, and leaves them when
        # the merge that follows fails).
        listings = [
            [
                "diff-tree",
                "-r",
                "-z",
                "--name-only",
                "--no-renames",
                f"{stash}^1",
                stash,
            ],
            ["ls-tree", "-r", "-z", "--name-only", "--full-tree", f"{stash}^3"],
        ]
        # Always: a pop git refuses leaves the untracked files, whatever the room.
        async with _keeping(call, listings, always=True) as kept:
            try:
                await call.run(["stash", "pop", "-q", stash])
            except ApiError as e:
                if e.code is not Code.INSUFFICIENT_STORAGE and await _unmerged(call):
                    raise  # a conflict, left for the caller to resolve, as git does
                raise _after_put_back(
                    e, await _put_kept_back(request, kept, e)
                ) from None
    elif action == "drop":
        await call.run(["stash", action, "-q", f"stash@{{{index}}}"])
    listing = await call.run(["stash", "list", "--format=%gd%x1f%H%x1f%gs"])
    stashes = []
    # A stash's message may hold U+2028 or NEL: lines end at LF only.
    for line in _text(listing.stdout).split("\n"):
        if not line:
            continue
        ref, _, rest = line.partition("\x1f")
        sha, _, subject = rest.partition("\x1f")
        stashes.append({"ref": ref, "commit": sha, "message": subject})
    return {"action": action, "stashes": stashes}


async def git_remote_add(request: ServerRequest) -> dict[str, Any]:
    """``POST /git/remotes {path, name, url}``: the URL through the remote policy."""
    body = request.body
    name = ref_name(body.get("name"), "name")
    remote = parse_remote(body.get("url"), request.rule)
    call = await _repo(request, body.get("path"))
    await call.run(["remote", "add", name, remote.url])
    request.audit["remote"] = redact_url_secrets(remote.url)
    return {"name": name, "fetch_url": redact_url_secrets(remote.url)}


def _config_key(request: ServerRequest, value: Any) -> str:
    key = params.string(value, "key", min_length=1)
    allowed = request.rule.params.git_config_keys
    if key.lower() not in {k.lower() for k in allowed}:
        raise forbidden(
            f"the config key {key!r} is not allowed (allowed: {', '.join(allowed)})",
            Code.PARAM_NOT_ALLOWED,
            rule=policy_rule(request.rule, "params.git_config_keys"),
        )
    return key


async def git_config_get(request: ServerRequest) -> dict[str, Any]:
    """``GET /git/config?path=&key=``: one allowed key, or all of them."""
    call = await _repo(request, request.arg("path"), "read")
    key = request.arg("key")
    keys = (
        [_config_key(request, key)]
        if key
        else list(request.rule.params.git_config_keys)
    )
    values: dict[str, str | None] = {}
    for name in keys:
        result = await call.run(["config", "--local", "--get", name], check=False)
        values[name] = (
            _text(result.stdout).rstrip("\n") if result.exit_code == 0 else None
        )
    return {"values": values}


async def git_config_set(request: ServerRequest) -> dict[str, Any]:
    """``POST /git/config {path, key, value}``: local scope, allowed keys only."""
    body = request.body
    key = _config_key(request, body.get("key"))
    value = require_text(body.get("value"), "value", defaults.GIT_MESSAGE_MAX_BYTES)
    if "\n" in value:
        raise bad_request("'value' must be one line")
    call = await _repo(request, body.get("path"))
    await call.run(["config", "--local", key, value])
    return {"key": key, "value": value}


# -- remote jobs -------------------------------------------------------------------


def _jobs(request: ServerRequest) -> GitJobTable:
    context = request.context
    if context.git_jobs is None:
        context.git_jobs = GitJobTable(context.reactor)
    table: GitJobTable = context.git_jobs
    return table


def _job(request: ServerRequest) -> GitJob:
    """The job the path names, if the caller may see it (else 404)."""
    return _jobs(request).get(request.path_params["job_id"], request.identity)


def _secret(request: ServerRequest, remote: Remote, auth: Any) -> Secret | None:
    """The secret a call names (``auth``), checked against the remote."""
    if auth is None:
        return None
    if not isinstance(auth, dict):
        raise bad_request("'auth' must be {credential} or {username, password}")
    if "credential" in auth:
        name = params.string(auth.get("credential"), "auth.credential", min_length=1)
        spec = request.context.policy.document.git.credentials.get(name)
        if spec is None:
            raise bad_request(f"no git credential named {name!r} in the policy")
        if not under_prefix(redact_url_secrets(remote.url), spec.url_prefix):
            dots = (
                " (and never to a URL whose path holds '.' or '..' segments)"
                if dot_segments(remote.url)
                else ""
            )
            raise forbidden(
                f"the credential {name!r} may only be sent to {spec.url_prefix}{dots}",
                Code.URL_NOT_ALLOWED,
                rule=f"policy:git.credentials.{name}.url_prefix",
            )
        token = _read_token(spec.token_file, spec.token_env, name)
        request.audit["credential"] = name
        return Secret(spec.username, token, spec.url_prefix, name)
    username = params.string(auth.get("username"), "auth.username", min_length=1)
    password = params.string(auth.get("password"), "auth.password", min_length=1)
    if "\n" in username or "\n" in password:
        raise bad_request("'auth' values must be one line")
    request.audit["credential"] = "inline"
    return Secret(username, password, remote.origin + "/", "inline")


def _read_token(token_file: str | None, token_env: str | None, name: str) -> str:
    """A policy credential's secret, read at the call (never cached)."""
    value = ""
    if token_file:
        try:
            with open(token_file, encoding="utf-8") as f:
                value = f.read(64 * 1024).strip()
        except OSError:
            value = ""
    elif token_env:
        value = BOOT_ENVIRON.get(token_env) or os.environ.get(token_env, "")
    if not value:
        raise unavailable(f"the git credential {name!r} has no secret")
    return value


async def _pin(request: ServerRequest, remote: Remote) -> str:
    """Resolve and check the remote's host; the address git is pinned to."""
    from sandboxd.git import remotes

    addresses = literal_addresses(remote)
    if addresses is None:
        try:
            addresses = await request.context.in_thread(
                remotes.system_resolve, remote.host, remote.port
            )
        except OSError:
            addresses = []
    return check_addresses(remote, addresses, request.rule)


async def _remote_of(
    call: GitCall, request: ServerRequest, name: str, push: bool
) -> Remote:
    """
    The URL git will use for ``name`` (after ``insteadOf``), checked.

    A remote with several URLs (a push goes to every ``pushurl``) is
    refused: each would need its own check and address pin.
    """
    args = ["remote", "get-url", "--all", *(["--push"] if push else []), name]
    result = await call.run(args, check=False)
    if result.exit_code != 0:
        raise bad_request(f"no remote named {name!r}")
    urls = [u for u in _text(result.stdout).split("\n") if u.strip()]
    for url in urls:
        checked = parse_remote(url.strip(), request.rule)
    if len(urls) != 1:
        raise bad_request(f"the remote {name!r} has {len(urls)} URLs; give it one")
    return checked


def _start_job(
    request: ServerRequest, op: str, path: str, credential: Secret | None, work: Any
) -> GitJob:
    table = _jobs(request)
    limit = request.rule.limits.max_jobs or defaults.GIT_REMOTE_LIMITS["max_jobs"]
    if table.running() >= limit:
        raise limit_exceeded(
            429,
            f"{limit} git jobs are running; wait for one or cancel it",
            Code.TOO_MANY_JOBS,
            rule=limit_rule(request.rule, "max_jobs"),
        )
    job = GitJob(
        op, path, request.identity.id, credential.label if credential else None
    )
    job.hidden = (credential.password,) if credential is not None else ()
    return table.start(job, work)


def _wait(request: ServerRequest) -> float:
    """
    How long a remote call waits for its job, read before the job starts:
    a bad ``wait`` refused after the start would leave the job running.
    """
    return params.number(request.body.get("wait"), "wait", 0.0, low=0.0, high=3600.0)


async def _answer(request: ServerRequest, job: GitJob, wait: float) -> Any:
    """200 with the result when the job ends within ``wait``, else 202."""
    if wait > 0:
        await job.wait(wait, request.context.reactor)
    if job.running:
        return ServerResponse(
            status=202,
            body={
                "job_id": job.job_id,
                "state": "running",
                "events_url": f"/git/jobs/{job.job_id}/events",
            },
        )
    if job.error is not None:
        raise job.error
    return {"job_id": job.job_id, "state": job.state, **(job.result or {})}


def _timeout(request: ServerRequest) -> float | None:
    ceiling = request.rule.limits.run_ceiling
    return params.seconds(
        request.body.get("timeout"), "timeout", ceiling, ceiling=ceiling
    )


async def git_clone(request: ServerRequest) -> Any:
    """
    ``POST /git/clone {url, path, branch?, commit?, depth?, single_branch?,
    filter?, auth?, user?, wait?, timeout?}``: a job.
    """
    body = request.body
    wait = _wait(request)
    timeout = _timeout(request)
    remote = parse_remote(body.get("url"), request.rule)
    text = params.path(body.get("path"), "path", parents=False)
    guard = PathGuard(request.rule)
    target = guard.check(text, "write")
    if os.path.lexists(target) and (not os.path.isdir(target) or os.listdir(target)):
        raise file_exists(f"the clone target exists and is not empty: {text}")
    parent, parent_fd = hold_dir(guard, guard.cwd(os.path.dirname(target) or "/"))
    args = ["clone", "--progress", "--no-recurse-submodules"]
    if body.get("branch") is not None:
        args += ["--branch", ref_name(body.get("branch"), "branch")]
    if body.get("depth") is not None:
        args.append(
            f"--depth={params.integer(body.get('depth'), 'depth', 1, low=1, high=10**9)}"
        )
    if params.flag(body.get("single_branch"), "single_branch"):
        args.append("--single-branch")
    if body.get("filter") is not None:
        args.append(
            f"--filter={params.one_of(body.get('filter'), 'filter', ('blob:none', 'tree:0'))}"
        )
    if params.flag(body.get("recurse_submodules"), "recurse_submodules"):
        raise bad_request(
            "recurse_submodules is not supported: submodule URLs escape the remote policy"
        )
    commit = (
        ref_name(body.get("commit"), "commit")
        if body.get("commit") is not None
        else None
    )
    secret = _secret(request, remote, body.get("auth"))
    pin = await _pin(request, remote)
    user = _user(request)
    call = GitCall(
        request.context,
        request.rule,
        parent,
        user=user,
        timeout=timeout,
        held=parent_fd,
    )
    request.audit["remote"] = redact_url_secrets(remote.url)
    request.audit["repo"] = target
    place = CloneTarget(parent_fd, parent, os.path.basename(target))

    async def work(job: GitJob) -> dict[str, Any]:
        job.call = call
        try:
            place.make(call.uid_gid if os.geteuid() == 0 else None)
        except OSError as e:
            raise os_error(e, text) from None
        try:
            # git works in the directory held, named "." (a name would be
            # looked up again), then the clone takes the target's name.
            clone = GitCall(
                request.context,
                request.rule,
                place.path,
                user=user,
                timeout=timeout,
                held=os.dup(place.fd),
            )
            job.call = clone
            await clone.run(
                [*args, "--", remote.url, "."],
                remote=remote,
                pin=pin,
                secret=secret,
                observe=job.observe,
            )
            if commit is not None:
                # Before the clone takes its name: a commit it cannot check
                # out leaves nothing behind.  (The repository is git's own,
                # just made: this checkout runs as the clone's own did.)
                await clone.run(["checkout", "-q", "--detach", commit, "--"])
            place.place()
            repo = GitCall(
                request.context,
                request.rule,
                target,
                user=user,
                timeout=timeout,
                held=os.dup(place.fd),
            )
            job.call = repo
            await repo.open_repository()
            branch = await _current_branch(repo)
            head = await _head(repo)
        except BaseException:
            # A failed, cancelled or killed clone leaves a partial
            # directory: remove what this call made, once git's tree is
            # gone.  An error answer means nothing happened.
            killing = getattr(job.call.child, "killing", None)
            if killing is not None:
                await killing
            await request.context.in_thread(place.undo)
            raise
        finally:
            place.close()
        return {"path": target, "head": {"branch": branch, "commit": head}}

    job = _start_job(request, "clone", target, secret, work)
    return await _answer(request, job, wait)


async def _remote_call(
    request: ServerRequest, push: bool = False
) -> tuple[GitCall, Remote, str, str, Secret | None]:
    body = request.body
    call = await _repo(request, body.get("path"))
    call.timeout = _timeout(request)
    name = ref_name(body.get("remote") or "origin", "remote")
    remote = await _remote_of(call, request, name, push)
    secret = _secret(request, remote, body.get("auth"))
    pin = await _pin(request, remote)
    request.audit["remote"] = redact_url_secrets(remote.url)
    return call, remote, name, pin, secret


async def git_fetch(request: ServerRequest) -> Any:
    """``POST /git/fetch {path, remote?, refspec?, prune?, auth?, wait?}``: a job."""
    body = request.body
    wait = _wait(request)
    call, remote, name, pin, secret = await _remote_call(request)
    args = ["fetch", "--progress", "--no-recurse-submodules"]
    if params.flag(body.get("prune"), "prune"):
        args.append("--prune")
    args.append(name)
    if body.get("refspec") is not None:
        refspec = params.string(body.get("refspec"), "refspec", min_length=1)
        if refspec.startswith(("-", "+")) or "\x00" in refspec:
            raise bad_request("'refspec' must not start with '-' or '+'")
        args.append(refspec)

    async def work(job: GitJob) -> dict[str, Any]:
        job.call = call
        await call.run(args, remote=remote, pin=pin, secret=secret, observe=job.observe)
        return {"path": call.cwd, "remote": name}

    job = _start_job(request, "fetch", call.cwd, secret, work)
    return await _answer(request, job, wait)


async def git_pull(request: ServerRequest) -> Any:
    """``POST /git/pull {path, remote?, branch?, ff_only?: true, rebase?: false, auth?, wait?}``."""
    body = request.body
    wait = _wait(request)
    call, remote, name, pin, secret = await _remote_call(request)
    # No diffstat: it would run the repository's textconv programs.
    args = ["pull", "--progress", "--no-recurse-submodules", "--no-edit", "--no-stat"]
    rebase = params.flag(body.get("rebase"), "rebase")
    if rebase:
        args.append("--rebase")
    elif params.flag(body.get("ff_only"), "ff_only", True):
        args.append("--ff-only")
    else:
        args.append("--no-rebase")
    args.append(name)
    if body.get("branch") is not None:
        args.append(ref_name(body.get("branch"), "branch"))

    # A merge commit, or a rebased one, is made as the policy's author
    # (else as the repository's or its user's).
    call.env.update(await _identity(request, call, None))

    async def work(job: GitJob) -> dict[str, Any]:
        job.call = call
        before = await _head(call)
        # A merge (a fast-forward too) leaves the files with local changes
        # it does not write as they are: a put-back must as well.
        local = None if rebase else await _left_by_a_merge(call)
        try:
            await call.run(
                args, remote=remote, pin=pin, secret=secret, observe=job.observe
            )
        except ApiError as e:
            if rebase:
                raise await _rebase_undone(call, e) from None
            if e.code is not Code.INSUFFICIENT_STORAGE or local is None:
                raise
            raise await _merge_undone(call, e, before, local) from None
        return {
            "path": call.cwd,
            "branch": await _current_branch(call),
            "old": before,
            "new": await _head(call),
        }

    job = _start_job(request, "pull", call.cwd, secret, work)
    return await _answer(request, job, wait)


async def _left_by_a_merge(call: GitCall) -> set[bytes] | None:
    """
    The paths a merge leaves as they are (None: unknown): those whose
    files or index entries differ from HEAD (git refuses a merge that
    would write one), the untracked files (git refuses to overwrite one),
    and the ignored ones, whole directories of them as ``dir/`` (git may
    overwrite one, which no put-back could bring back; it is not removed).
    """
    if call.top is None:
        return None
    listings = [
        ["diff-index", "--name-only", "-z", "HEAD"],
        _untracked(call.top),
        [*_untracked(call.top), "-i", "--directory"],
    ]
    paths: set[bytes] = set()
    for listing in listings:
        try:
            listed = await _listed(call, listing)
        except _ListCut:
            return None
        if listed is None:
            return None
        paths.update(listed)
    return paths


async def _rebase_undone(call: GitCall, e: ApiError) -> ApiError:
    """
    A pull's rebase that stopped (a conflict, a full disk): aborted, since
    no endpoint could go on with it, so that the branch and its files are
    as they were; the fetched commits stay.
    """
    found = await call.run(["rev-parse", "--git-path", "rebase-merge"], check=False)
    state = os.path.join(call.cwd, _text(found.stdout).strip())
    rebasing = os.path.isdir(state) or os.path.isdir(
        os.path.join(os.path.dirname(state), "rebase-apply")
    )
    if found.exit_code != 0 or not rebasing:
        return e
    aborted = await call.run(["rebase", "--abort"], check=False)
    if aborted.exit_code != 0:
        return noted(
            e,
            "the rebase stopped and could not be aborted: the repository is "
            "in the middle of a rebase",
        )
    # git's hints (run "git rebase --continue") name what the abort undid.
    kept = [line for line in e.message.split("\n") if not line.startswith("hint:")]
    return noted(
        e.reworded("\n".join(kept)),
        "the rebase was aborted: the branch is as it was; a pull without "
        "rebase merges, and leaves a conflict to resolve and commit",
    )


async def _merge_undone(
    call: GitCall, e: ApiError, before: str | None, local: set[bytes]
) -> ApiError:
    """
    A pull whose merge met a full disk (507 ``e``) with HEAD still at
    ``before``: the files it wrote are put back as HEAD has them, all but
    the ``local`` ones, which it did not write.  The fetched commits stay.
    """
    fetched = await _commit_of(call, "FETCH_HEAD")
    if before is None or fetched is None or await _head(call) != before:
        return e
    if await _back_from_index(call, before, fetched, local):
        return noted(
            e,
            "the disk is full: the work tree was put back as it was; the "
            "fetched commits are kept, so a pull with room merges them",
        )
    return noted(
        e,
        "the disk is full, and the work tree could not be put back: some "
        "files are as the fetched commit has them, or cut short",
    )


async def git_push(request: ServerRequest) -> Any:
    """
    ``POST /git/push {path, remote?, branch?, set_upstream?, force?, tags?,
    auth?, wait?}`` → ``{updated: [..], remote_verified}``.
    """
    body = request.body
    wait = _wait(request)
    force = params.flag(body.get("force"), "force")
    if force and not request.rule.params.allow_force_push:
        raise forbidden(
            "force push is not allowed by policy",
            Code.PARAM_NOT_ALLOWED,
            rule=policy_rule(request.rule, "params.allow_force_push"),
        )
    call, remote, name, pin, secret = await _remote_call(request, push=True)
    branch = body.get("branch")
    branch = (
        ref_name(branch, "branch")
        if branch is not None
        else await _current_branch(call)
    )
    if branch is None:
        raise bad_request("HEAD is detached: name the 'branch' to push")
    _check_protected(request, branch, "pushing to it")
    local = await call.run(
        ["rev-parse", "-q", "--verify", f"refs/heads/{branch}"], check=False
    )
    if local.exit_code != 0:
        raise bad_request(f"no local branch {branch!r}")
    sha = _text(local.stdout).strip()
    # What the remote has not seen (no branch of it holds): no file of it
    # the policy denies may leave.
    unseen = ["log", "-z", "--format=", "--name-only", "--no-renames", "-m"]
    unseen += [f"refs/heads/{branch}", "--not", f"--remotes={name}", "--"]
    denied = await _denied_among(request, call, unseen)
    if denied:
        raise _holds_denied(
            request,
            sorted(set(denied)),
            "the push would send commits that change",
            "those commits must leave them out to be pushed through this API",
        )
    args = ["push", "--porcelain", "--progress", "--no-recurse-submodules"]
    if params.flag(body.get("set_upstream"), "set_upstream"):
        args.append("--set-upstream")
    if force:
        args.append("--force-with-lease")
    if params.flag(body.get("tags"), "tags"):
        args.append("--follow-tags")
    args += [name, f"refs/heads/{branch}:refs/heads/{branch}"]

    async def work(job: GitJob) -> dict[str, Any]:
        job.call = call
        result = await call.run(
            args,
            remote=remote,
            pin=pin,
            secret=secret,
            observe=job.observe,
            check=False,
        )
        updated = await _pushed_commits(call, parse_push(result.stdout), branch, sha)
        refused = [u["ref"] for u in updated if u["status"] == "rejected"]
        if refused:
            # git names the remote's commit only for an update it made; a
            # refused ref is as the remote has it still.
            listed = await call.run(
                ["ls-remote", name, *refused],
                remote=remote,
                pin=pin,
                secret=secret,
                check=False,
            )
            theirs = _remote_refs(listed.stdout) if listed.exit_code == 0 else {}
            for entry in updated:
                if entry["status"] == "rejected" and entry["old"] is None:
                    entry["old"] = theirs.get(entry["ref"])
        if result.exit_code != 0:
            text = redact(
                _text(result.stderr) + "\n" + push_report(result.stdout), job.hidden
            )
            if any(
                u["status"] == "rejected" and "remote rejected" not in u["summary"]
                for u in updated
            ):
                error = conflict_error("non_fast_forward", push_rejection(updated))
                error.extra["updated"] = updated
                raise error
            from sandboxd.git.outcomes import (
                classify_failure,
                remote_message,
                without_progress,
            )

            failure = classify_failure(without_progress(text), result.exit_code, True)
            if updated:
                failure.extra["updated"] = updated
            said = remote_message(text)
            if said:
                failure.extra["remote_message"] = said
            raise failure
        verify = await call.run(
            ["ls-remote", name, f"refs/heads/{branch}"],
            remote=remote,
            pin=pin,
            secret=secret,
            check=False,
        )
        seen = _text(verify.stdout).split()
        return {
            "path": call.cwd,
            "branch": branch,
            "updated": updated,
            "remote_verified": verify.exit_code == 0 and bool(seen) and seen[0] == sha,
        }

    job = _start_job(request, "push", call.cwd, secret, work)
    return await _answer(request, job, wait)


async def _pushed_commits(
    call: GitCall, updated: list[dict[str, Any]], branch: str, sha: str
) -> list[dict[str, Any]]:
    """
    ``updated`` with whole object names: the branch's ``new`` is the
    commit pushed (or offered, when refused), which git leaves out for a
    new branch, and a tag's is the local tag's object; a ref the remote
    already had as it is was ``old`` there too; abbreviations git printed
    are spelled out.  ``old`` stays null where the remote had no such ref
    (a refused one's is filled by the caller).
    """
    for entry in updated:
        if entry["ref"] == f"refs/heads/{branch}":
            entry["new"] = sha
        elif entry["new"] is None and entry["ref"].startswith("refs/tags/"):
            found = await call.run(
                ["rev-parse", "-q", "--verify", "--end-of-options", entry["ref"]],
                check=False,
            )
            entry["new"] = _text(found.stdout).strip() or None
        if entry["status"] == "up_to_date" and entry["old"] is None:
            entry["old"] = entry["new"]
        for key in ("old", "new"):
            short = entry.get(key)
            if short and len(short) < len(sha):
                found = await call.run(
                    ["rev-parse", "-q", "--verify", "--end-of-options", short],
                    check=False,
                )
                full = _text(found.stdout).strip()
                if found.exit_code == 0 and full:
                    entry[key] = full
    return updated


def _remote_refs(listing: bytes) -> dict[str, str]:
    """``ref -> object`` from ``git ls-remote``'s lines."""
    refs: dict[str, str] = {}
    for line in _text(listing).splitlines():
        sha, _, ref = line.partition("\t")
        if sha and ref:
            refs[ref] = sha
    return refs


# -- jobs --------------------------------------------------------------------------


def git_jobs_list(request: ServerRequest) -> dict[str, Any]:
    """``GET /git/jobs``: the caller's running and recently finished jobs."""
    jobs = _jobs(request).visible(request.identity)
    return {"jobs": [job.describe() for job in jobs]}


def git_job_get(request: ServerRequest) -> dict[str, Any]:
    """``GET /git/jobs/{job_id}``: one of the caller's jobs."""
    return _job(request).describe()


async def git_job_cancel(request: ServerRequest) -> dict[str, Any]:
    """``DELETE /git/jobs/{job_id}``: ends git's whole tree, then answers."""
    table = _jobs(request)
    job = _job(request)
    await table.cancel(job)
    return job.describe()


def git_job_events(request: ServerRequest) -> SSEResponse:
    """``GET /git/jobs/{job_id}/events``: progress, lines, then ``exit`` (SPEC §9)."""
    job = _job(request)
    after = resume_point(request.query, request.headers)

    def start(channel: SSEChannel) -> None:
        Follower(job.log, channel, after)

    return SSEResponse(start=start)


HANDLERS = {
    "git_clone": git_clone,
    "git_fetch": git_fetch,
    "git_pull": git_pull,
    "git_push": git_push,
    "git_jobs_list": git_jobs_list,
    "git_job_get": git_job_get,
    "git_job_cancel": git_job_cancel,
    "git_job_events": git_job_events,
    "git_init": git_init,
    "git_add": git_add,
    "git_commit": git_commit,
    "git_log": git_log,
    "git_show": git_show,
    "git_branches": git_branches,
    "git_branch_create": git_branch_create,
    "git_branch_delete": git_branch_delete,
    "git_checkout": git_checkout,
    "git_reset": git_reset,
    "git_restore": git_restore,
    "git_stash": git_stash,
    "git_remotes": git_remotes,
    "git_remote_add": git_remote_add,
    "git_config_get": git_config_get,
    "git_config_set": git_config_set,
}
