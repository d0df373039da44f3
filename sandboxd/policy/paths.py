# -*- test-case-name: tests.policy.test_matrix -*-
"""
The policy half of path decisions: lexical, never touching the file system.

``/capabilities/check`` answers with this alone, so its answer for a path
outside the boundary is the same whether or not the path exists.  The
path guard (:mod:`sandboxd.access.guard`) runs the same decision first and then
resolves the path by file descriptor.
"""

from __future__ import annotations

import fnmatch
import functools
import posixpath
import re

import attrs

from sandboxd.errors import ApiError, Code, forbidden
from sandboxd.policy.defaults import PATH_DECISIONS_KEPT
from sandboxd.policy.rules import EffectiveRule

#: Never reachable, whatever a policy allows.
FORBIDDEN_ROOTS = ("/proc", "/sys", "/dev")

#: :data:`FORBIDDEN_ROOTS` as one set look-up and one prefix test, for
#: :func:`in_system_root` (asked about every path of every file call).
_SYSTEM_ROOTS = frozenset(FORBIDDEN_ROOTS)
_BELOW_SYSTEM_ROOTS = tuple(root + "/" for root in FORBIDDEN_ROOTS)


@attrs.frozen
class PathDecision:
    """The outcome for one path: allowed, or the code and rule that refused."""

    path: str
    allowed: bool
    code: Code | None = None
    rule: str | None = None
    #: An allowed path made absolute and normalised, as it was decided (""
    #: in a refusal): the guard resolves this very spelling, so a path is
    #: made absolute once per resolution, and not at all when its decision
    #: was kept.
    target: str = attrs.field(default="", eq=False)

    def as_json(self) -> dict[str, object]:
        """The form ``/capabilities/check`` returns."""
        out: dict[str, object] = {"path": self.path, "allowed": self.allowed}
        if self.code:
            out["code"] = str(self.code)
        if self.rule:
            out["rule"] = self.rule
        return out


@functools.lru_cache(maxsize=512)
def glob_regex(pattern: str) -> re.Pattern[str]:
    """
    A policy glob as a regex over absolute paths.

    ``**`` crosses directories (``**/x`` also matches ``x`` at the top,
    ``d/**`` also matches ``d`` itself); ``*`` and ``?`` stay within one
    segment.
    """
    out = []
    i = 0
    while i < len(pattern):
        if pattern.startswith("**/", i):
            out.append("(?:.*/)?")
            i += 3
        elif pattern.startswith("/**", i) and i + 3 == len(pattern):
            out.append("(?:/.*)?")
            i += 3
        elif pattern.startswith("**", i):
            out.append(".*")
            i += 2
        elif pattern[i] == "*":
            out.append("[^/]*")
            i += 1
        elif pattern[i] == "?":
            out.append("[^/]")
            i += 1
        else:
            out.append(re.escape(pattern[i]))
            i += 1
    return re.compile("".join(out) + r"\Z")


def matches(entry: str, path: str, base_dir: str) -> bool:
    """
    Whether ``path`` (absolute, normalised) falls under one allow/deny entry.

    An entry without glob characters is a directory (or file) and matches
    itself and everything below it; a relative entry is relative to the base
    dir, except ``**`` globs, which match anywhere.
    """
    if not any(c in entry for c in "*?["):
        root = entry if entry.startswith("/") else posixpath.join(base_dir, entry)
        root = posixpath.normpath(root)
        return root == "/" or path == root or path.startswith(root + "/")
    if not entry.startswith(("/", "**")):
        entry = posixpath.join(base_dir, entry)
    return glob_regex(entry).match(path) is not None


def covers(entry: str, path: str, base_dir: str) -> bool:
    """
    Whether a ``deny`` or ``read_only`` entry protects ``path``.

    Beyond :func:`matches`, as the seed reads the same lists: an entry
    protects everything below what it names (``**/.ssh`` covers
    ``~/.ssh/id_rsa``), and an entry with no ``/`` names a file or
    directory anywhere (``*.pem``, ``.env``).  Each reading only adds
    protection, so a list means at least what it means on the seed.
    """
    if matches(entry, path, base_dir):
        return True
    if "/" not in entry:
        return any(fnmatch.fnmatchcase(part, entry) for part in path.split("/") if part)
    if any(c in entry for c in "*?["):
        parent = posixpath.dirname(path)
        while parent not in ("/", ""):
            if matches(entry, parent, base_dir):
                return True
            parent = posixpath.dirname(parent)
    return False


def _first_allowed_directory(rule: EffectiveRule) -> str | None:
    """The first ``paths.allow`` entry that names a directory (no glob), made absolute."""
    for entry in rule.paths.allow:
        if not any(c in entry for c in "*?["):
            return absolute(entry, rule.base_dir)
    return None


def request_target(rule: EffectiveRule, path: str) -> str:
    """
    Where a request's ``path`` points: an absolute path as it is; a
    relative one from the base dir, or, when that lands outside
    ``paths.allow``, from the first directory ``paths.allow`` lists, as
    agent-sandbox-server takes every relative path under an allow list.
    A path that is allowed from the base dir keeps that meaning.
    """
    target = absolute(path, rule.base_dir)
    allow = rule.paths.allow
    if path.startswith("/") or not allow:
        return target
    if any(matches(entry, target, rule.base_dir) for entry in allow):
        return target
    first = _first_allowed_directory(rule)
    return target if first is None else absolute(path, first)


def absolute(path: str, base_dir: str) -> str:
    """A request path made absolute (relative to the base dir) and normalised."""
    joined = path if path.startswith("/") else posixpath.join(base_dir, path)
    normal = posixpath.normpath(joined)
    return "/" + normal.lstrip("/")


def under(path: str, root: str) -> bool:
    """Whether ``path`` is ``root`` or below it."""
    return root == "/" or path == root or path.startswith(root + "/")


def in_system_root(path: str) -> bool:
    """
    Whether the absolute ``path`` is one of :data:`FORBIDDEN_ROOTS` or
    below one: :func:`under` for each root, in two C calls rather than a
    Python call per root.
    """
    return path in _SYSTEM_ROOTS or path.startswith(_BELOW_SYSTEM_ROOTS)


def is_daemon_file(target: str, daemon_files: tuple[str, ...]) -> bool:
    """
    Whether ``target`` is one of the daemon's files, a rotation of one, or
    inside one of its directories (the state dir).
    """
    return any(
        target == own or target.startswith((own + ".", own + "/"))
        for own in daemon_files
    )


def decide(rule: EffectiveRule, path: str, op: str = "read") -> PathDecision:
    """
    Decide a path by policy alone.

    The decision depends on the rule and the path's spelling only, and a
    rule is made once per policy load: the same path is decided again and
    again (every command's working directory, the base directory), so the
    rule keeps its answers (:attr:`EffectiveRule.decisions`, emptied when
    full).

    :param op: ``read``, ``write`` or ``delete``.
    """
    memo = rule.decisions
    key = (path, op)
    found: PathDecision | None = memo.get(key)
    if found is not None:
        return found
    decision = _decide(rule, path, op)
    if len(memo) >= PATH_DECISIONS_KEPT:
        memo.clear()
    memo[key] = decision
    return decision


def _decide(rule: EffectiveRule, path: str, op: str) -> PathDecision:
    """:func:`decide`, worked out."""
    if "\x00" in path:
        return PathDecision(path, False, Code.INVALID_PATH)
    target = request_target(rule, path)
    if in_system_root(target):
        return PathDecision(path, False, Code.PATH_NOT_ALLOWED, "guard:system-paths")
    if is_daemon_file(target, rule.daemon_files):
        return PathDecision(path, False, Code.PATH_DENIED, "guard:daemon-files")
    allow = rule.paths.allow
    if allow:
        if not any(matches(entry, target, rule.base_dir) for entry in allow):
            return PathDecision(
                path,
                False,
                Code.PATH_NOT_ALLOWED,
                rule.source("paths.allow") or "paths.allow",
            )
    elif not under(target, rule.base_dir):
        return PathDecision(path, False, Code.PATH_NOT_ALLOWED, "guard:base_dir")
    for entry in rule.paths.deny:
        if covers(entry, target, rule.base_dir):
            return PathDecision(
                path, False, Code.PATH_DENIED, rule.source("paths.deny")
            )
    if op in ("write", "delete"):
        for entry in rule.paths.read_only:
            if covers(entry, target, rule.base_dir):
                return PathDecision(
                    path, False, Code.READ_ONLY, rule.source("paths.read_only")
                )
        if op == "delete" and target == rule.base_dir:
            # The base dir itself: inside the boundary, but never removed
            # (nor moved away), as the seed refuses it (``path_denied``).
            return PathDecision(path, False, Code.PATH_DENIED, "guard:base_dir")
    return PathDecision(path, True, target=target)


#: The endpoints whose call writes a file it names, and so meets the
#: rule's ``params.allow_extensions`` and ``deny_extensions`` (after the
#: path decision, as agent-sandbox-server checks them): the base64 and
#: raw uploads, resumable uploads, edits, moves and extracted archives
#: (each member).  ``/capabilities/check``
#: asks :func:`check_extension` of these, the handlers call it.
EXTENSION_ENDPOINTS = frozenset(
    {
        "upload",
        "files_upload_stream",
        "files_write_raw",
        "files_uploads_create",
        "files_edit",
        "files_move",
        "files_extract",
    }
)


def check_extension(rule: EffectiveRule, path: str) -> None:
    """
    ``params.deny_extensions`` then ``allow_extensions`` on the file name
    of ``path`` (any case; an entry with or without its dot): policy
    alone, so a check answers it without touching the disk.

    :raises ApiError: 403 ``extension_not_allowed`` naming the rule.
    """
    params = rule.params
    name = path.rsplit("/", 1)[-1].lower()

    def has(exts: tuple[str, ...]) -> bool:
        return any(
            name.endswith(e.lower() if e.startswith(".") else "." + e.lower())
            for e in exts
        )

    refused: ApiError | None = None
    if params.deny_extensions and has(params.deny_extensions):
        refused = forbidden(
            f"this file extension is not allowed: {path}",
            Code.EXTENSION_NOT_ALLOWED,
            rule=rule.source("params.deny_extensions"),
        )
    elif params.allow_extensions is not None and not has(params.allow_extensions):
        refused = forbidden(
            f"this file extension is not allowed: {path}",
            Code.EXTENSION_NOT_ALLOWED,
            rule=rule.source("params.allow_extensions"),
        )
    if refused is not None:
        raise refused
