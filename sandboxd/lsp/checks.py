# -*- test-case-name: tests.lsp.test_checks -*-
"""
What an editor on ``lsp_connect`` may send its language server.

The daemon does not speak LSP on that socket; it looks into each message
only for the files it names, because the server opens whatever it is
told about.  Every URI (``uri``, ``rootUri``, ``targetUri`` and any other
``...Uri``) and every ``rootPath``, at any depth of a message's
``params`` (or of the ``result`` of an answer to the server's own
request), must name a local path (``file://``) the caller may read under
the policy, judged as the REST routes judge a path (:meth:`PathGuard.check`:
links followed, so a link in the project that leads out of the boundary or
into a denied directory is refused by the name of the link, since the
server would follow it); the workspace the server is given (``rootUri``,
``rootPath``, ``workspaceFolders``, folders added later, under any
spelling of ``workspace/didChangeWorkspaceFolders``) must lie within the
socket's root once resolved; ``workspace/executeCommand`` runs only the commands
``params.lsp_commands`` names, since a command does whatever the server
makes of it.  A URI of another scheme is refused: nobody would check what
the server reads for it.

Settings are kept from the server unless ``params.lsp_settings`` lets
them through: servers take settings that name programs to run or
interpreters to use (pylsp's pylint ``executable`` and ``args``, jedi's
``environment``, pyright's ``pythonPath``, typescript-language-server's
``tsserver.path``, gopls' and rust-analyzer's build commands), so an
editor that could set them would run what it likes with no more than
``lsp:use``.  Every way an editor gives settings is closed:
``initialize``'s ``initializationOptions`` is removed,
``workspace/didChangeConfiguration`` is passed on with no ``settings``
(the server may still ask, and the relay answers its
``workspace/configuration`` itself, with none), and either given with
positional ``params`` is refused.  A method is recognised however a
server would: pylsp takes ``WORKSPACE/did_change_configuration`` and
``$initialize`` for the same methods, so names are compared without case
or punctuation (:func:`method_key`).
"""

from __future__ import annotations

import re
from typing import Any

import attrs

from sandboxd.access.guard import PathGuard
from sandboxd.errors import ApiError, Code
from sandboxd.lsp.answers import path_of

#: Keys whose value is the workspace (a URI, or a list of folders).
_ROOT_URIS = frozenset({"rootUri"})
_FOLDER_LISTS = frozenset({"workspaceFolders"})
_NOT_NAME = re.compile(r"[^a-z0-9]")


def method_key(method: str) -> str:
    """
    ``method`` as every server's dispatch would take it: lower case,
    letters and digits only (pylsp drops ``$``, turns ``/`` into ``__``
    and camel case into snake case before it looks a method up).
    """
    return _NOT_NAME.sub("", method.lower())


_EXECUTE = method_key("workspace/executeCommand")
#: ``workspace/didChangeWorkspaceFolders`` names its new folders ``added``.
_CHANGE_FOLDERS = method_key("workspace/didChangeWorkspaceFolders")
_INITIALIZE = method_key("initialize")
_CHANGE_SETTINGS = method_key("workspace/didChangeConfiguration")
#: The methods that carry an editor's settings, and the key that holds them.
_SETTINGS = {_INITIALIZE: "initializationOptions", _CHANGE_SETTINGS: "settings"}


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
    #: Whether the editor's settings reach the server (``params.lsp_settings``).
    settings: bool = False
    #: Where ``params.lsp_settings`` was set, for what the editor is told.
    settings_rule: str = "default:params.lsp_settings"

    def refusal(self, message: dict[str, Any]) -> Refusal | None:
        """None when ``message`` may go to the server, else why not."""
        method = message.get("method")
        key = method_key(method) if isinstance(method, str) else ""
        if key == _EXECUTE:
            refused = self._command(message.get("params"))
            if refused is not None:
                return refused
        params = message.get("params")
        if key in _SETTINGS and not self.settings and not isinstance(params, dict):
            if params is not None:
                return Refusal(
                    f"the params of {method} must be an object",
                    Code.INVALID_PARAM,
                )
        if isinstance(method, str):
            return self._walk(params, key)
        return self._walk(message.get("result"), "")

    def keeps_settings(self, message: dict[str, Any]) -> tuple[bool, str | None]:
        """
        Take the settings out of ``message`` (in place) unless the policy
        lets them through: whether it carries settings at all (then it is
        sent as parsed, never as its bytes, which a server's parser might
        read otherwise) and what was taken out, for the editor's log.
        """
        method = message.get("method")
        if self.settings or not isinstance(method, str):
            return False, None
        field = _SETTINGS.get(method_key(method))
        params = message.get("params")
        if field is None or not isinstance(params, dict):
            return False, None
        if params.get(field) is None:
            return True, None
        if field == "settings":
            params[field] = None
        else:
            del params[field]
        return True, (
            f"the {field} of {method}: an editor's settings reach the server "
            f"only when params.lsp_settings allows it ({self.settings_rule})"
        )

    def keeps_from_editor(self, method: Any) -> bool:
        """
        Whether the relay answers the server's request ``method`` itself,
        with no settings, rather than ask the editor
        (``workspace/configuration`` unless the policy lets settings through).
        """
        return (
            not self.settings
            and isinstance(method, str)
            and method_key(method) == method_key("workspace/configuration")
        )

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
        """
        Every URI and path named anywhere in ``value``, checked (no
        recursion); ``method`` is the message's :func:`method_key`.
        """
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
                    stack.append((v, True))
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
        # Resolved as a read through the REST routes is: the server opens
        # the path it is given, following every link on the way.
        try:
            resolved = self.guard.check(path, "read")
        except ApiError as e:
            rule = e.extra.get("rule")
            return Refusal(
                e.message,
                e.code or Code.PATH_NOT_ALLOWED,
                rule if isinstance(rule, str) else None,
            )
        if workspace and not _within(resolved, self.root):
            return Refusal(
                f"{key}: {path} is outside this socket's root {self.root}",
                Code.PATH_NOT_ALLOWED,
            )
        return None


def _within(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip("/") + "/")
