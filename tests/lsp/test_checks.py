"""
What an editor on ``lsp_connect`` may send its server
(:class:`sandboxd.lsp.checks.EditorRules`), message by message, with no
server: the files named anywhere in a message, the workspace within the
socket's root, the commands the policy lets run.
"""

from __future__ import annotations

import os
from typing import Any

import attrs
from twisted.trial.unittest import SynchronousTestCase

from sandboxd.access.guard import PathGuard
from sandboxd.errors import ApiError, Code
from sandboxd.lsp.answers import uri_of
from sandboxd.lsp.checks import EditorRules
from tests.test_guard import make_rule


class EditorRulesTests(SynchronousTestCase):
    """Each message is passed or refused with the guard's code."""

    def setUp(self) -> None:
        self.base = os.path.realpath(self.mktemp())
        self.root = os.path.join(self.base, "proj")
        os.makedirs(self.root)
        guard = PathGuard(make_rule(self.base, deny=["**/secret/**"]))
        self.rules = EditorRules(
            guard, self.root, ("pylsp.allowed",), "policy:test:params.lsp_commands"
        )

    def code(self, message: dict[str, Any]) -> Code | None:
        refused = self.rules.refusal(message)
        return None if refused is None else refused.code

    def test_files_anywhere_in_params(self) -> None:
        """A URI is checked at any depth, under any key ending in Uri."""
        inside = uri_of(os.path.join(self.root, "a.py"))
        ok = {"method": "x", "params": {"a": [{"b": {"uri": inside}}]}}
        self.assertIsNone(self.code(ok))
        deep = {"method": "x", "params": {"a": [{"b": {"uri": "file:///etc/passwd"}}]}}
        self.assertEqual(self.code(deep), Code.PATH_NOT_ALLOWED)
        other = {"method": "x", "params": {"targetUri": "file:///etc/passwd"}}
        self.assertEqual(self.code(other), Code.PATH_NOT_ALLOWED)
        renamed = {"method": "x", "params": {"files": [{"newUri": "file:///etc/x"}]}}
        self.assertEqual(self.code(renamed), Code.PATH_NOT_ALLOWED)

    def test_denied_and_foreign_uris(self) -> None:
        """A denied path carries the deny rule; a URI of another scheme is refused."""
        secret = uri_of(os.path.join(self.root, "secret", "k.py"))
        refused = self.rules.refusal({"method": "x", "params": {"uri": secret}})
        assert refused is not None
        self.assertEqual(refused.data(), {"code": "path_denied", "rule": "policy:test"})
        for uri in ("untitled:Untitled-1", "https://example.com/a.py", 7):
            self.assertEqual(
                self.code({"method": "x", "params": {"uri": uri}}),
                Code.INVALID_PARAM,
                uri,
            )
        self.assertIsNone(self.code({"method": "x", "params": {"rootUri": None}}))

    def test_workspace_within_root(self) -> None:
        """rootUri, rootPath, workspaceFolders and added folders must lie within the root."""
        beside = os.path.join(self.base, "other")
        for params in (
            {"rootUri": uri_of(beside)},
            {"rootPath": beside},
            {"workspaceFolders": [{"uri": uri_of(beside), "name": "o"}]},
        ):
            self.assertEqual(
                self.code({"method": "initialize", "id": 1, "params": params}),
                Code.PATH_NOT_ALLOWED,
                params,
            )
        added = {"event": {"added": [{"uri": uri_of(beside)}], "removed": []}}
        self.assertEqual(
            self.code(
                {"method": "workspace/didChangeWorkspaceFolders", "params": added}
            ),
            Code.PATH_NOT_ALLOWED,
        )
        # A file beside the root may still be read: only the workspace is bounded.
        self.assertIsNone(
            self.code({"method": "x", "params": {"uri": uri_of(beside + "/m.py")}})
        )
        self.assertIsNone(
            self.code(
                {
                    "method": "initialize",
                    "params": {
                        "rootUri": uri_of(self.root),
                        "rootPath": self.root,
                        "workspaceFolders": [{"uri": uri_of(self.root), "name": "p"}],
                    },
                }
            )
        )

    def test_answers_to_the_server(self) -> None:
        """An answer's result is checked as a request's params are."""
        answer = {"id": 3, "result": [{"uri": "file:///etc/passwd", "name": "x"}]}
        self.assertEqual(self.code(answer), Code.PATH_NOT_ALLOWED)
        self.assertIsNone(self.code({"id": 3, "result": [None]}))

    def test_commands(self) -> None:
        """Only the commands params.lsp_commands names run."""
        run = {"method": "workspace/executeCommand", "id": 1, "params": {}}
        run["params"] = {"command": "pylsp.allowed"}
        self.assertIsNone(self.code(run))
        run["params"] = {"command": "pylsp.other"}
        refused = self.rules.refusal(run)
        assert refused is not None
        self.assertEqual(
            refused.data(),
            {"code": "command_not_allowed", "rule": "policy:test:params.lsp_commands"},
        )

    def test_commands_under_another_spelling(self) -> None:
        """A spelling pylsp dispatches as workspace/executeCommand is held to the same list."""
        for method in ("WORKSPACE/execute_command", "$workspace/executeCommand"):
            run = {"method": method, "id": 1, "params": {"command": "pylsp.other"}}
            self.assertEqual(self.code(run), Code.COMMAND_NOT_ALLOWED, method)

    def test_settings_taken_out(self) -> None:
        """
        By default initializationOptions is removed and didChangeConfiguration's
        settings emptied, under any spelling; positional params are refused;
        with params.lsp_settings they stay.
        """
        init = {
            "id": 1,
            "method": "initialize",
            "params": {"initializationOptions": {"a": 1}},
        }
        self.assertEqual(self.rules.keeps_settings(init)[0], True)
        self.assertEqual(init["params"], {})
        change = {
            "method": "$Workspace/did_change_configuration",
            "params": {"settings": {"a": 1}},
        }
        rewritten, removed = self.rules.keeps_settings(change)
        self.assertTrue(rewritten)
        assert removed is not None
        self.assertIn("params.lsp_settings", removed)
        self.assertEqual(change["params"], {"settings": None})
        listed = {
            "method": "workspace/didChangeConfiguration",
            "params": [{"settings": 1}],
        }
        self.assertEqual(self.code(listed), Code.INVALID_PARAM)
        self.assertTrue(self.rules.keeps_from_editor("workspace/configuration"))
        allowing = attrs.evolve(self.rules, settings=True)
        init = {
            "id": 1,
            "method": "initialize",
            "params": {"initializationOptions": {"a": 1}},
        }
        self.assertEqual(allowing.keeps_settings(init), (False, None))
        self.assertEqual(init["params"], {"initializationOptions": {"a": 1}})
        self.assertIsNone(allowing.refusal(listed))
        self.assertFalse(allowing.keeps_from_editor("workspace/configuration"))

    def test_links_are_followed_as_the_rest_routes_follow_them(self) -> None:
        """
        A URI through a link in the project is judged by where the link
        leads, as a REST read of the same path is: out of the boundary
        (path_not_allowed) or into a denied directory (path_denied), by
        file or as the workspace; a link that stays inside and allowed
        passes, but not as a workspace outside the root.
        """
        outside = os.path.realpath(self.mktemp())
        os.makedirs(outside)
        os.makedirs(os.path.join(self.root, "secret"))
        os.makedirs(os.path.join(self.base, "other"))
        os.symlink(outside, os.path.join(self.root, "outlink"))
        os.symlink("/etc", os.path.join(self.root, "etclink"))
        os.symlink(
            os.path.join(self.root, "secret"), os.path.join(self.base, "other", "sec")
        )
        os.symlink(os.path.join(self.base, "other"), os.path.join(self.root, "side"))
        guard = self.rules.guard
        cases = [
            (os.path.join(self.root, "outlink", "creds.py"), Code.PATH_NOT_ALLOWED),
            (os.path.join(self.root, "etclink", "passwd"), Code.PATH_NOT_ALLOWED),
            (os.path.join(self.base, "other", "sec", "keys.py"), Code.PATH_DENIED),
        ]
        for path, code in cases:
            with self.assertRaises(ApiError) as rest:
                guard.check(path)
            self.assertEqual(rest.exception.code, code, path)
            for message in (
                {"method": "textDocument/hover", "id": 1, "params": {"uri": path}},
                {"method": "initialize", "id": 1, "params": {"rootUri": path}},
            ):
                message["params"] = {k: uri_of(v) for k, v in message["params"].items()}
                self.assertEqual(self.code(message), code, (path, message))
        side = os.path.join(self.root, "side")
        self.assertIsNone(
            self.code({"method": "x", "params": {"uri": uri_of(side + "/m.py")}})
        )
        for params in (
            {"rootUri": uri_of(side)},
            {"rootPath": side},
            {"workspaceFolders": [{"uri": uri_of(side), "name": "s"}]},
        ):
            refused = self.rules.refusal(
                {"method": "initialize", "id": 1, "params": params}
            )
            assert refused is not None, params
            self.assertEqual(refused.code, Code.PATH_NOT_ALLOWED)
            self.assertIn("outside this socket's root", refused.message)

    def test_added_folders_under_every_spelling(self) -> None:
        """
        A folder added outside the root is refused under each spelling
        pylsp dispatches as workspace/didChangeWorkspaceFolders, and so
        is a folder list that is not a list.
        """
        beside = uri_of(os.path.join(self.base, "other"))
        for method in (
            "workspace/didChangeWorkspaceFolders",
            "workspace/did_change_workspace_folders",
            "Workspace/DidChangeWorkspaceFolders",
            "$/workspace/didChangeWorkspaceFolders",
        ):
            added = {"event": {"added": [{"uri": beside}], "removed": []}}
            self.assertEqual(
                self.code({"method": method, "params": added}),
                Code.PATH_NOT_ALLOWED,
                method,
            )
        single = {"workspaceFolders": {"uri": beside, "name": "o"}}
        self.assertEqual(
            self.code({"method": "initialize", "id": 1, "params": single}),
            Code.PATH_NOT_ALLOWED,
        )
