# -*- test-case-name: tests.test_git -*-
"""
Running git on a repository the daemon does not trust, and reading its
output (SPEC §7.7).

A repository's own configuration can name commands that git runs on
``status`` and ``diff`` (``core.fsmonitor``, filter drivers, external diff
drivers, textconv, hooks, a pager).  The repository belongs to the sandbox,
so every git call here switches those off on the command line, where they
override anything the repository says, and runs with a pinned environment
(no system or global config, no prompts, no pager, literal pathspecs).

The parsers are pure functions of git's bytes so they can be tested
without a repository.

The ``git`` group (git that writes) builds on this module:
:mod:`~sandboxd.git.runner` (one call: user, limits, the settings that
close the repository's other doors), :mod:`~sandboxd.git.remotes` (which
remotes, resolved and pinned), :mod:`~sandboxd.git.askpass` (credentials
through a one-shot socket), :mod:`~sandboxd.git.jobs` (remote calls as
jobs) and :mod:`~sandboxd.git.outcomes` (what git's output means).
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

import attrs

from sandboxd.errors import ApiError, git_error
from sandboxd.files.walk import display_name

#: Settings given with ``-c`` on every call.  Command-line configuration is
#: read last, so it wins over the repository's ``.git/config``.
SAFE_CONFIG: tuple[str, ...] = (
    "core.fsmonitor=false",
    "core.hooksPath=/dev/null",
    "core.pager=cat",
    "core.attributesFile=/dev/null",
    "core.untrackedCache=false",
    "diff.external=",
    "color.ui=false",
    "diff.noprefix=false",
    "diff.mnemonicPrefix=false",
    "diff.relative=false",
    "status.relativePaths=false",
    # Signatures are checked by a program the repository may name (and
    # ``log.showSignature`` asks for it on every log and show); signing is
    # off on every call, so no gpg program is run either way.
    "log.showSignature=false",
    "gpg.program=/bin/false",
    "gpg.openpgp.program=/bin/false",
    "gpg.x509.program=/bin/false",
    "gpg.ssh.program=/bin/false",
    "gpg.ssh.defaultKeyCommand=/bin/false",
    # The ownership check exists so that a foreign repository's config
    # cannot run code as us; the settings above already stop that, and the
    # path guard decides which directories a caller may inspect.
    "safe.directory=*",
)

#: Arguments of every call that prints a diff (``show``, ``diff``): the
#: repository's diff drivers (``diff.NAME.textconv``, ``diff.NAME.command``,
#: chosen by its ``.gitattributes``) are programs, and no setting turns
#: them off.
NO_DIFF_PROGRAMS: tuple[str, ...] = ("--no-textconv", "--no-ext-diff")

#: Variables set in git's environment, whatever the daemon's says.
SAFE_ENV: dict[str, str] = {
    "GIT_CONFIG_NOSYSTEM": "1",
    "GIT_CONFIG_GLOBAL": "/dev/null",
    "GIT_ATTR_NOSYSTEM": "1",
    "GIT_TERMINAL_PROMPT": "0",
    "GIT_PAGER": "cat",
    "PAGER": "cat",
    "GIT_OPTIONAL_LOCKS": "0",
    "GIT_LITERAL_PATHSPECS": "1",
    "GIT_ASKPASS": "/bin/false",
    "SSH_ASKPASS": "/bin/false",
    "LC_ALL": "C",
}

#: Variables of the daemon's environment never handed to git: any of
#: them could point git at another repository, config or program.
_DROP_PREFIXES = ("GIT_",)
_DROP_NAMES = frozenset(
    {"EDITOR", "VISUAL", "LESS", "LESSOPEN", "LESSCLOSE", "XDG_CONFIG_HOME"}
)


def git_environment(
    base: Mapping[str, str], ceiling: str | None = None
) -> dict[str, str]:
    """
    git's environment: ``base`` without anything that steers git, plus
    :data:`SAFE_ENV`.

    :param ceiling: the directory above which git must not look for a
        repository (so a path inside the boundary never resolves to a
        repository that encloses the boundary).
    """
    env = {
        k: v
        for k, v in base.items()
        if not k.startswith(_DROP_PREFIXES) and k not in _DROP_NAMES
    }
    env.update(SAFE_ENV)
    if ceiling:
        env["GIT_CEILING_DIRECTORIES"] = ceiling
    return env


class UnsettableName(ValueError):
    """
    A setting of the repository that must be overridden but cannot be on
    git's command line: ``-c`` ends a name at its first ``=``, and a
    subsection (a driver's name, a URL) may hold one.
    """

    def as_error(self) -> ApiError:
        """400 ``git_error`` naming the setting: the call runs no git."""
        return git_error(
            f"the repository's configuration sets {self.args[0]!r}, which "
            "holds '=' and so cannot be switched off for git; rename it"
        )


def settable(name: str) -> str:
    """
    ``name`` when ``-c`` can set it.

    :raises UnsettableName: it holds ``=``.
    """
    if "=" in name:
        raise UnsettableName(name)
    return name


def _drivers(
    config_names: Iterable[str], section: str, key: str | None = None
) -> set[str]:
    """
    The subsections of ``section`` (``filter``, ``merge``) the repository
    configures (with ``key``: for which it sets that key, in lower case).
    """
    found = set()
    prefix = section + "."
    for name in config_names:
        lowered = name.lower()
        if not lowered.startswith(prefix) or lowered.count(".") < 2:
            continue
        if key is None or lowered.rsplit(".", 1)[1] == key:
            found.add(settable(name)[len(prefix) : name.rindex(".")])
    return found


def filter_overrides(config_names: Iterable[str]) -> list[str]:
    """
    ``-c`` settings that empty every filter driver the repository defines.

    Filter drivers are named by ``.gitattributes`` (which the repository
    controls) and configured as ``filter.NAME.clean``/``smudge``/``process``;
    git runs the clean filter on ``status`` and ``diff`` when it compares a
    file's content with the index.  An empty command is no filter at all,
    and ``required=false`` keeps git from failing for want of one.

    :raises UnsettableName: a driver's name holds ``=``.
    """
    out: list[str] = []
    for driver in sorted(_drivers(config_names, "filter")):
        for key in ("clean", "smudge", "process"):
            out.append(f"filter.{driver}.{key}=")
        out.append(f"filter.{driver}.required=false")
    return out


#: The command a merge driver the repository defines is replaced with:
#: git's own three-way text merge, as git does for a driver it does not
#: know (conflict markers where both sides changed a line).
TEXT_MERGE = "git merge-file --marker-size=%L -L ours -L base -L theirs %A %O %B"


def program_overrides(config_names: Iterable[str]) -> list[str]:
    """
    ``-c`` settings that keep git from running any program the repository
    names by a driver: filter drivers (:func:`filter_overrides`) and merge
    drivers (``merge.NAME.driver``, run by every merge: a pull, a
    rebase, a stash pop), which become git's own text merge.

    Diff drivers (``diff.NAME.textconv``, ``diff.NAME.command``) have no
    setting that turns them off; every call that prints a diff passes
    ``--no-textconv --no-ext-diff`` instead.

    :raises UnsettableName: a driver's name holds ``=``.
    """
    out = filter_overrides(config_names)
    for driver in sorted(_drivers(config_names, "merge", "driver")):
        out.append(f"merge.{driver}.driver={TEXT_MERGE}")
    return out


def git_argv(
    git: str, args: Iterable[str], extra_config: Iterable[str] = ()
) -> list[str]:
    """``git`` with the safe settings, ``--no-pager``, then ``args``."""
    argv = [git, "--no-pager"]
    for setting in (*SAFE_CONFIG, *extra_config):
        argv += ["-c", setting]
    argv += list(args)
    return argv


def config_names(output: bytes) -> list[str]:
    """The names printed by ``git config --null --list --name-only``."""
    return [n.decode("utf-8", "replace") for n in output.split(b"\0") if n.strip()]


#: The settings that name who makes a commit, as ``git config`` prints them.
IDENTITY_PATTERN = r"^(user|author|committer)\.(name|email)$"

#: The longest name or email taken from a user's global configuration.
_IDENTITY_MAX = 256


def identity_values(output: bytes) -> dict[str, str]:
    """
    The settings printed by ``git config --null --get-regexp
    IDENTITY_PATTERN`` (``name LF value NUL`` each), the last of a name
    winning as it does for git; values git could not put in a commit
    header (empty, over 256 characters, holding a line break) are left out.
    """
    values: dict[str, str] = {}
    for entry in output.split(b"\0"):
        name, sep, raw = entry.partition(b"\n")
        value = raw.decode("utf-8", "replace")
        if not sep or not value.strip() or len(value) > _IDENTITY_MAX:
            continue
        if "\n" in value or "\r" in value:
            continue
        values[name.decode("ascii", "replace").lower()] = value
    return values


def unsaid_identity(local_names: Iterable[str]) -> list[tuple[str, str]]:
    """
    The (role, part) pairs of a commit's identity (``author``/``committer``,
    ``name``/``email``) that the repository's own configuration
    (``local_names``) leaves unsaid.
    """
    local = {name.lower() for name in local_names}
    return [
        (role, part)
        for role in ("author", "committer")
        for part in ("name", "email")
        if f"user.{part}" not in local and f"{role}.{part}" not in local
    ]


def identity_environment(
    local_names: Iterable[str], home: Mapping[str, str]
) -> dict[str, str]:
    """
    ``GIT_AUTHOR_*``/``GIT_COMMITTER_*`` from ``home`` (a user's global
    settings, :func:`identity_values`) for each part of the identity the
    repository's own configuration (``local_names``) leaves unsaid, so that
    the repository's settings still win, as they do in git.
    """
    env: dict[str, str] = {}
    for role, part in unsaid_identity(local_names):
        value = home.get(f"{role}.{part}") or home.get(f"user.{part}")
        if value:
            env[f"GIT_{role.upper()}_{part.upper()}"] = value
    return env


# -- git status --------------------------------------------------------------

#: The porcelain codes of an unmerged path (git-status(1), "Short Format").
_UNMERGED = frozenset({"DD", "AU", "UD", "UA", "DU", "AA", "UU"})

_AHEAD_BEHIND = re.compile(r"\[(?P<body>[^\]]*)\]\s*$")


@attrs.frozen
class FileStatus:
    """One line of ``git status --porcelain``."""

    path: str
    status: str
    index: str
    worktree: str
    orig_path: str | None = None

    def as_json(self) -> dict[str, Any]:
        """
        The file entry of SPEC §7.7 (plus ``staged`` and ``orig_path``),
        names shown as ``files_list`` shows them (a byte that is not UTF-8
        as ``\\xNN``), so that a name can be given back percent-encoded.
        """
        out: dict[str, Any] = {
            "path": display_name(self.path),
            "status": self.status,
            "staged": self.index not in (" ", "?", "!") and self.status != "unmerged",
        }
        if self.orig_path is not None:
            out["orig_path"] = display_name(self.orig_path)
        return out


@attrs.frozen
class BranchInfo:
    """The ``## ...`` header of ``git status --porcelain -b``."""

    branch: str | None
    upstream: str | None = None
    ahead: int = 0
    behind: int = 0
    detached: bool = False
    gone: bool = False


def classify(xy: str) -> str:
    """
    The status word of a porcelain ``XY`` code.

    Unmerged pairs first (both sides carry meaning there); then what the
    index says, since a staged rename or addition describes the file better
    than a later edit; then the work tree.
    """
    if xy in _UNMERGED:
        return "unmerged"
    if xy == "??":
        return "untracked"
    if xy == "!!":
        return "ignored"
    x, y = xy[0], xy[1]
    for code in (x, y):
        if code == "R":
            return "renamed"
        if code == "C":
            return "copied"
    if x == "A":
        return "added"
    if "D" in (x, y):
        return "deleted"
    return "modified"


def parse_branch(line: str) -> BranchInfo:
    """Parse the text after ``## `` of the branch header."""
    text = line.strip()
    for prefix in ("No commits yet on ", "Initial commit on "):
        if text.startswith(prefix):
            # The rest is read as any header is: a fresh clone of an empty
            # repository says "main...origin/main [gone]" there.
            text = text[len(prefix) :]
            break
    if text.startswith("HEAD (no branch)"):
        return BranchInfo(branch="HEAD", detached=True)
    ahead = behind = 0
    gone = False
    match = _AHEAD_BEHIND.search(text)
    if match:
        text = text[: match.start()].rstrip()
        for part in match.group("body").split(","):
            word, _, number = part.strip().partition(" ")
            if word == "ahead" and number.isdigit():
                ahead = int(number)
            elif word == "behind" and number.isdigit():
                behind = int(number)
            elif word == "gone":
                gone = True
    branch, sep, upstream = text.partition("...")
    return BranchInfo(
        branch=branch or None,
        upstream=upstream if sep else None,
        ahead=ahead,
        behind=behind,
        gone=gone,
    )


def parse_status(output: bytes) -> tuple[BranchInfo, list[FileStatus]]:
    """
    Parse ``git status --porcelain=v1 -b -z``.

    With ``-z`` paths are printed verbatim (no C quoting) and a rename's
    entry is ``XY NEW\\0OLD\\0``.  Names keep their bytes (undecodable
    ones as surrogates, as the file API takes them).
    """
    branch = BranchInfo(branch=None)
    files: list[FileStatus] = []
    records = output.split(b"\0")
    i = 0
    while i < len(records):
        record = records[i].decode("utf-8", "surrogateescape")
        i += 1
        if not record:
            continue
        if record.startswith("## "):
            branch = parse_branch(record[3:])
            continue
        if len(record) < 4:
            continue
        xy, path = record[:2], record[3:]
        orig = None
        if "R" in xy or "C" in xy:
            if i < len(records):
                orig = records[i].decode("utf-8", "surrogateescape")
                i += 1
        files.append(FileStatus(path, classify(xy), xy[0], xy[1], orig))
    return branch, files


def status_result(
    output: bytes,
    shown: Callable[[str], bool] | None = None,
    operation: str | None = None,
) -> dict[str, Any]:
    """
    The body of ``GET /git/status`` from git's output.

    :param operation: what :func:`in_progress` says, named in the body.
    :param shown: whether a name (relative to the work tree's top) may be
        shown; a file it refuses is left out and counted in ``hidden``, a
        rename's refused old name is left out of its entry.
    """
    branch, files = parse_status(output)
    listed = []
    hidden = 0
    for f in files:
        if shown is not None and not shown(f.path):
            hidden += 1
            continue
        if shown is not None and f.orig_path is not None and not shown(f.orig_path):
            f = attrs.evolve(f, orig_path=None)
        listed.append(f.as_json())
    out: dict[str, Any] = {
        "branch": branch.branch,
        "clean": not files,
        "ahead": branch.ahead,
        "behind": branch.behind,
        "files": listed,
    }
    if hidden:
        out["hidden"] = hidden
    if operation is not None:
        out["in_progress"] = operation
    if branch.upstream is not None:
        out["upstream"] = branch.upstream
    if branch.detached:
        out["detached"] = True
    return out


#: What git leaves in the git dir while an operation waits for the user;
#: the first match wins (a rebase stopped on a pick may leave a
#: cherry-pick's mark too).
_IN_PROGRESS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("rebase", ("rebase-merge", "rebase-apply")),
    ("merge", ("MERGE_HEAD",)),
    ("cherry_pick", ("CHERRY_PICK_HEAD",)),
    ("revert", ("REVERT_HEAD",)),
    ("bisect", ("BISECT_LOG",)),
)


def in_progress(git_dir: str | None) -> str | None:
    """
    The operation a repository is in the middle of (``merge``, ``rebase``,
    ``cherry_pick``, ``revert``, ``bisect``), as ``git status`` says it in
    words; None when there is none.  Stopped on a conflict, the next
    commit concludes (or continues) it, which an agent must know.
    """
    if git_dir is None:
        return None
    for state, markers in _IN_PROGRESS:
        if any(os.path.lexists(os.path.join(git_dir, m)) for m in markers):
            return state
    return None


# -- git diff ----------------------------------------------------------------


def _numstat_records(output: bytes) -> Iterator[tuple[bytes, bytes, list[bytes]]]:
    """``(added, removed, names)`` of each record of ``git diff --numstat -z``."""
    records = output.split(b"\0")
    i = 0
    while i < len(records):
        record = records[i]
        i += 1
        if not record.strip():
            continue
        parts = record.split(b"\t", 2)
        if len(parts) < 3:
            continue
        added, removed, path = parts
        names = [path]
        if path == b"":
            names = records[i : i + 2]
            i += 2
        yield added, removed, names


def parse_numstat(output: bytes) -> dict[str, int]:
    """
    ``{files_changed, insertions, deletions}`` from ``git diff --numstat -z``.

    Binary files print ``-`` for both counts: they count as changed files
    with no lines.  With ``-z`` a rename is ``A\\tD\\t\\0OLD\\0NEW\\0``.
    A file in conflict has a record per side: it is one file changed.
    """
    files: set[tuple[bytes, ...]] = set()
    insertions = deletions = 0
    for added, removed, names in _numstat_records(output):
        files.add(tuple(names))
        if added.isdigit():
            insertions += int(added)
        if removed.isdigit():
            deletions += int(removed)
    return {
        "files_changed": len(files),
        "insertions": insertions,
        "deletions": deletions,
    }


def numstat_names(output: bytes) -> list[str]:
    """
    Every name ``git diff --numstat -z`` printed (a rename's both), relative
    to the work tree's top, undecodable bytes kept as surrogates: what the
    diff of the same arguments shows the changes of.
    """
    return [
        name.decode("utf-8", "surrogateescape")
        for _, _, names in _numstat_records(output)
        for name in names
    ]


def size_label(limit: int) -> str:
    """``1MB`` for 10**6, ``512KiB`` for 2**19: how the cap is named in the marker."""
    for unit, size in (
        ("GB", 10**9),
        ("MB", 10**6),
        ("KB", 10**3),
        ("MiB", 2**20),
        ("KiB", 2**10),
    ):
        if limit >= size and limit % size == 0:
            return f"{limit // size}{unit}"
    return f"{limit} bytes"


def truncate_diff(diff: bytes, limit: int, cut: bool = False) -> tuple[str, bool]:
    """
    The diff as text, cut at ``limit`` bytes with the seed's marker.

    The cut keeps whole lines where one ends in the last 4 KiB before the
    limit, so the marker never splits a line of the patch.

    :param cut: the diff is known to go on past ``diff`` (its capture
        dropped the rest), so it is cut even when it fits.
    """
    if len(diff) <= limit and not cut:
        return diff.decode("utf-8", "replace"), False
    head = diff[:limit]
    newline = head.rfind(b"\n", max(0, limit - 4096))
    if newline >= 0:
        head = head[: newline + 1]
    text = head.decode("utf-8", "replace")
    if not text.endswith("\n"):
        text += "\n"
    return text + f"... (truncated at {size_label(limit)})", True


#: ``git rev-parse`` arguments printing, a line each, where git reads and
#: writes a repository: its git dir; its common dir, where a linked work
#: tree's refs, objects and config live (``commondir`` in the git dir may
#: name any directory); the object, ref and reflog directories (any may be
#: a link); then the top of the work tree, which a bare repository has not.
WHERE_ARGS: tuple[str, ...] = (
    "rev-parse",
    "--absolute-git-dir",
    "--git-common-dir",
    *("--git-path", "objects"),
    *("--git-path", "refs"),
    *("--git-path", "logs"),
    "--show-toplevel",
)

#: The lines :data:`WHERE_ARGS` prints before the work tree's top.
_WHERE_LINES = 5


@attrs.frozen
class RepositoryPlaces:
    """Where git reads and writes a repository, as :data:`WHERE_ARGS` tells."""

    git_dir: str
    #: The common dir, resolved: what writing calls take turns on, since
    #: linked work trees share its refs.
    common_dir: str
    #: The object directory, resolved: its ``info/alternates`` may name
    #: other object directories git reads too.
    objects: str
    top: str | None
    #: The directories whose policy decides whether a call may use the
    #: repository (:func:`holder_of` each resolved place, and the top).
    holders: frozenset[str]

    @property
    def alternates_file(self) -> str:
        """The file naming the other object directories git reads objects from."""
        return os.path.join(self.objects, "info", "alternates")


def parse_places(output: bytes, cwd: str) -> RepositoryPlaces | None:
    """
    The places of ``git rev-parse`` :data:`WHERE_ARGS` run in ``cwd``
    (relative ones are taken from there), each resolved through links;
    None when git printed another number of lines than it was asked
    (a path holding a line break), since a path cut in two would be
    checked in place of the real one.
    """
    lines = [x for x in output.decode("utf-8", "surrogateescape").split("\n") if x]
    if len(lines) not in (_WHERE_LINES, _WHERE_LINES + 1):
        return None
    real = [os.path.realpath(os.path.join(cwd, x)) for x in lines[:_WHERE_LINES]]
    top = lines[_WHERE_LINES] if len(lines) > _WHERE_LINES else None
    holders = {holder_of(x) for x in real}
    if top is not None:
        holders.add(top)
    return RepositoryPlaces(
        git_dir=lines[0],
        common_dir=real[1],
        objects=real[2],
        top=top,
        holders=frozenset(holders),
    )


def parse_alternates(output: bytes) -> list[str]:
    """
    The object directories ``git count-objects -v`` names as alternates:
    every one git would read, those named by an alternate's own
    ``info/alternates`` too, resolved by git from relative forms.
    """
    prefix = b"alternate: "
    return [
        line[len(prefix) :].decode("utf-8", "surrogateescape")
        for line in output.split(b"\n")
        if line.startswith(prefix)
    ]


def holder_of(git_dir: str) -> str:
    """
    The repository a git dir belongs to: ``/r`` for ``/r/.git`` and for
    what lies in it (a linked work tree's ``/r/.git/worktrees/w``, the
    object directory ``/r/.git/objects``); the bare repository itself.

    The guard decides on that path, not on ``.git`` inside it: a policy that
    denies ``**/.git/**`` to the file endpoints (``hardened``) means "not by
    hand", and git's own writes there are what this group is for.
    """
    head, sep, _ = git_dir.partition("/.git/")
    if sep:
        return head
    return git_dir.removesuffix("/.git") or "/"


def has_parent_segment(path: str) -> bool:
    """Whether ``path`` has a ``..`` segment (refused outright by SPEC §7.7)."""
    return ".." in re.split(r"[/\\]", path)


def ceiling_for(directory: str, base_dir: str) -> str:
    """
    Where repository discovery stops: just above the base dir for paths
    inside it, else just above the directory itself.
    """
    base = os.path.normpath(base_dir)
    if directory == base or directory.startswith(base.rstrip("/") + "/"):
        return os.path.dirname(base) or "/"
    return os.path.dirname(directory) or "/"
