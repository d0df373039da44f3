# -*- test-case-name: tests.lsp.test_checks -*-
"""
What an editor on ``lsp_connect`` may send its language server.

The daemon does not speak LSP on that socket; it looks into each message
only for the files it names, because the server opens whatever it is
told about.  Every URI (``uri``, ``rootUri``, ``targetUri`` and any other
``...Uri``) and every ``rootPath``, at any depth of a message's
``params`` (or of the ``result`` of an answer to the server's own
request), must name a local path (``file://``) the caller may read under
the policy; the workspace the server is given (``rootUri``, ``rootPath``,
``workspaceFolders``, folders added later) must lie within the socket's
root; ``workspace/executeCommand`` runs only the commands
``params.lsp_commands`` names, since a command does whatever the server
makes of it.  A URI of another scheme is refused: nobody would check what
the server reads for it.
"""

from __future__ import annotations

import posixpath
from typing import Any

import attrs

from sandboxd.access.guard import PathGuard, refusal
from sandboxd.errors import Code
from sandboxd.lsp.answers import path_of

#: Keys whose value is the workspace (a URI, or a list of folders).
_ROOT_URIS = frozenset({"rootUri"})
_FOLDER_LISTS = frozenset({"workspaceFolders"})
#: ``workspace/didChangeWorkspaceFolders`` names its new folders ``added``.
_CHANGE_FOLDERS = "workspace/didChangeWorkspaceFolders"


@attrs.frozen
class Refusal:
    """Why a message is not passed on: a message and the guard's code and rule."""

    message: str
    code: Code
    rule: str | None = None

    def data(self) -> dict[str, Any]:
        """The JSON-RPC error's ``data``: ``{code, rule}``."""
        out: dict[str, Any] = {"code": str(self.code)}
        if self.rule is not None:
            out["rule"] = self.rule
        return out


@attrs.frozen
class EditorRules:
    """
    The checks of one socket: the path rules of ``lsp_connect``, the
    socket's root, and the commands the policy lets an editor run.
    """

    guard: PathGuard
    root: str
    commands: tuple[str, ...]
    #: Where ``params.lsp_commands`` was set, for a refusal's ``rule``.
    commands_rule: str

    def refusal(self, message: dict[str, Any]) -> Refusal | None:
        """None when ``message`` may go to the server, else why not."""
        method = message.get("method")
        if method == "workspace/executeCommand":
            refused = self._command(message.get("params"))
            if refused is not None:
                return refused
        if isinstance(method, str):
            return self._walk(message.get("params"), method)
        return self._walk(message.get("result"), "")

    def _command(self, params: Any) -> Refusal | None:
        command = params.get("command") if isinstance(params, dict) else None
        if isinstance(command, str) and command in self.commands:
            return None
        allowed = ", ".join(self.commands) or "none"
        return Refusal(
            f"the command {command!r} is not in params.lsp_commands (allowed: {allowed})",
            Code.COMMAND_NOT_ALLOWED,
            self.commands_rule,
        )

    def _walk(self, value: Any, method: str) -> Refusal | None:
        """Every URI and path named anywhere in ``value``, checked (no recursion)."""
        stack: list[tuple[Any, bool]] = [(value, False)]
        while stack:
            item, folder = stack.pop()
            if isinstance(item, list):
                stack.extend((v, folder) for v in item)
                continue
            if not isinstance(item, dict):
                continue
            for key, v in item.items():
                refused: Refusal | None = None
                if key == "uri" or key.endswith("Uri"):
                    refused = self._uri(key, v, folder or key in _ROOT_URIS)
                elif key == "rootPath":
                    refused = self._path(key, v, v, workspace=True)
                elif key in _FOLDER_LISTS or (
                    key == "added" and method == _CHANGE_FOLDERS
                ):
                    if isinstance(v, list):
                        stack.extend((f, True) for f in v)
                    continue
                else:
                    stack.append((v, False))
                if refused is not None:
                    return refused
        return None

    def _uri(self, key: str, value: Any, workspace: bool) -> Refusal | None:
        if value is None:
            return None
        path = path_of(value)
        if path is None:
            return Refusal(
                f"{key}: {str(value)[:200]!r} is not a file:// URI of a local path",
                Code.INVALID_PARAM,
            )
        return self._path(key, value, path, workspace)

    def _path(self, key: str, named: Any, path: Any, workspace: bool) -> Refusal | None:
        if path is None:
            return None
        if not isinstance(path, str) or not path.startswith("/"):
            return Refusal(
                f"{key}: {str(named)[:200]!r} is not an absolute path",
                Code.INVALID_PARAM,
            )
        decision = self.guard.decide(path, "read")
        if not decision.allowed:
            error = refusal(decision)
            return Refusal(
                error.message, error.code or Code.PATH_NOT_ALLOWED, error.rule
            )
        if workspace and not _within(posixpath.normpath(path), self.root):
            return Refusal(
                f"{key}: {path} is outside this socket's root {self.root}",
                Code.PATH_NOT_ALLOWED,
            )
        return None


def _within(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip("/") + "/")
