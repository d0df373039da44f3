"""
The path guard (SPEC §11.1): one place that decides every path the daemon
touches (files, cwd of shell/process/PTY/code, git path).

This first version checks the policy lexically and then on the resolved
location; the file-descriptor walk (openat2 ``RESOLVE_BENEATH``) that makes
check and use one step lands with the file_ops group.
"""

from __future__ import annotations

import os
import stat
from typing import Any

from sandboxd.errors import ApiError
from sandboxd.policy.paths import PathDecision, decide
from sandboxd.policy.rules import EffectiveRule

_MESSAGES = {
    "path_not_allowed": "path is outside the allowed area",
    "path_denied": "path is denied by policy",
    "read_only": "path is read-only",
    "symlink_denied": "symbolic links are not allowed here",
}


def refusal(decision: PathDecision) -> ApiError:
    """The error for a refused decision (same whether the path exists or not)."""
    if decision.code == "invalid_path":
        return ApiError(400, "NUL is not allowed in a path", "ValueError", "invalid_path")
    code = decision.code or "path_not_allowed"
    return ApiError(
        403,
        f"{_MESSAGES.get(code, 'path refused')}: {decision.path}",
        "PermissionError",
        code,
        rule=decision.rule,
    )


class PathGuard:
    """Decides paths for one endpoint's merged rule."""

    def __init__(self, rule: EffectiveRule) -> None:
        self.rule = rule

    @classmethod
    def for_request(cls, request: Any) -> PathGuard:
        """The guard of a request's endpoint."""
        return cls(request.rule)

    @property
    def base_dir(self) -> str:
        """The boundary."""
        return self.rule.base_dir

    def check(self, path: Any, op: str = "read") -> str:
        """
        The absolute, resolved path for ``op`` on ``path``, or a refusal.

        :raises ApiError: 400 for a non-string or NUL path; 403 with the
            guard's code otherwise.
        """
        if not isinstance(path, str) or path == "":
            raise ApiError(400, "'path' must be a non-empty string", "ValueError", "invalid_param")
        first = decide(self.rule, path, op)
        if not first.allowed:
            raise refusal(first)
        absolute = os.path.normpath(path if path.startswith("/") else os.path.join(self.base_dir, path))
        resolved = os.path.realpath(absolute)
        if resolved != absolute:
            if self.rule.paths.symlinks == "deny" and _has_symlink(absolute, self.base_dir):
                raise refusal(PathDecision(path, False, "symlink_denied", self.rule.source("paths.symlinks")))
            second = decide(self.rule, resolved, op)
            if not second.allowed:
                raise refusal(PathDecision(path, False, second.code, second.rule))
        return resolved

    def cwd(self, path: Any = None) -> str:
        """A guarded working directory (default: the base dir)."""
        if path is None or path == "":
            target = self.base_dir
        else:
            target = self.check(path, "read")
        try:
            st = os.stat(target)
        except OSError:
            raise ApiError(400, f"cwd does not exist: {path}", "ValueError", "invalid_param") from None
        if not stat.S_ISDIR(st.st_mode):
            raise ApiError(400, f"cwd is not a directory: {path}", "ValueError", "invalid_param")
        return target


def _has_symlink(path: str, base: str) -> bool:
    """Whether any component of ``path`` below ``base`` is a symlink."""
    current = path
    while current not in ("/", "") and current != base:
        if os.path.islink(current):
            return True
        current = os.path.dirname(current)
    return False
