"""
Environment files and templates (``client.beta.agents.environments.files``
and ``.templates``) and ``GET /v1/agents/runtimes``, with the official
``openai`` SDK: files staged into a guarded workspace, all or none, never
replacing one, never the agent's own configuration.
"""

from __future__ import annotations

import base64
import os
from typing import Any

import httpx
from twisted.internet.defer import inlineCallbacks

from tests.openai_api.sdk import OpenAICase, caught
from tests.openai_api.test_files import state_of


def b64(data: bytes) -> str:
    """``data`` as base64 text."""
    return base64.b64encode(data).decode()


class EnvironmentFilesTests(OpenAICase):
    """Files staged into an environment's workspace."""

    @inlineCallbacks
    def test_template_files_and_stored_file(self) -> Any:
        """
        An environment made from a template gets the template's files and
        variables, then its own (a stored file by id among them); more files
        are staged later and listed with their sizes; the agent's commands
        see the template's variable.
        """
        state_of(self)
        client = self.client()
        envs = client.beta.agents.environments
        work = os.path.join(self.base_dir, "work")
        os.makedirs(work)

        def run() -> Any:
            stored = client.files.create(file=("s.txt", b"stored"), purpose="user_data")
            template = envs.templates.create(
                name="base",
                env={"GREETING": "hallo"},
                files=[
                    {"type": "inline", "path": "/workspace/a.txt", "data": b64(b"AAA")},
                    {"type": "file_id", "path": "/lib/s.txt", "file_id": stored.id},
                ],
            )
            env = envs.create(
                environment={
                    "type": "self_hosted",
                    "workspace_directory": work,
                    "environment_template_id": template.id,
                    "files": [
                        {
                            "type": "inline",
                            "path": "/workspace/b/c.txt",
                            "data": b64(b"C"),
                        }
                    ],
                }
            )
            added = envs.files.create(
                env.id, type="inline", path="/d.txt", data=b64(b"DDDD")
            )
            same = envs.files.create(
                env.id, type="inline", path="/d.txt", data=b64(b"DDDD")
            )
            listed = list(envs.files.list(env.id, limit=2))
            prefixed = [f.path for f in envs.files.list(env.id, path="/workspace/b")]
            session = client.beta.agents.sessions.create(
                agent={"model": "fake"},
                environment={"type": "self_hosted", "id": env.id},
            )
            with client.beta.agents.sessions.stream(
                session.id, input="terminal printenv GREETING"
            ) as s:
                list(s)
            items = list(
                client.beta.agents.sessions.items.list(session.id, order="asc")
            )
            templates = [t.id for t in envs.templates.list()]
            renamed = envs.templates.update(template.id, name="renamed")
            deleted = envs.templates.delete(template.id)
            return (
                template,
                env,
                added,
                same,
                listed,
                prefixed,
                items,
                templates,
                renamed,
                deleted,
            )

        (
            template,
            env,
            added,
            same,
            listed,
            prefixed,
            items,
            templates,
            renamed,
            deleted,
        ) = yield self.sdk(run)
        self.assertTrue(template.id.startswith("envtmpl_"))
        self.assertEqual(
            [(f.type, f.path) for f in template.files],
            [("inline", "/workspace/a.txt"), ("file_id", "/workspace/lib/s.txt")],
        )
        self.assertEqual(
            sorted((f.path, f.size_bytes) for f in env.files),
            [
                ("/workspace/a.txt", 3),
                ("/workspace/b/c.txt", 1),
                ("/workspace/lib/s.txt", 6),
            ],
        )
        for rel, data in (
            ("a.txt", b"AAA"),
            ("b/c.txt", b"C"),
            ("lib/s.txt", b"stored"),
            ("d.txt", b"DDDD"),
        ):
            with open(os.path.join(work, rel), "rb") as f:
                self.assertEqual(f.read(), data)
        self.assertEqual((added.path, added.size_bytes), ("/workspace/d.txt", 4))
        self.assertEqual(same.size_bytes, 4)
        # Two pages of two, followed by the SDK through the page token.
        self.assertEqual(
            [(f.path, f.size_bytes) for f in listed],
            [
                ("/workspace/a.txt", 3),
                ("/workspace/b/c.txt", 1),
                ("/workspace/d.txt", 4),
                ("/workspace/lib/s.txt", 6),
            ],
        )
        self.assertEqual(prefixed, ["/workspace/b/c.txt"])
        command = next(i for i in items if i.type == "command_execution")
        self.assertEqual(command.output, "hallo\n")
        self.assertEqual(templates, [template.id])
        self.assertEqual(renamed.name, "renamed")
        self.assertTrue(deleted.deleted)

    @inlineCallbacks
    def test_list_prefix_in_either_form(self) -> Any:
        """
        A listing's ``path`` prefix names files as staging does:
        ``/workspace/src``, ``/src`` and ``src`` list the same files; a
        prefix that matches nothing lists nothing.
        """
        client = self.client()
        envs = client.beta.agents.environments
        work = os.path.join(self.base_dir, "work")
        os.makedirs(work)

        def run() -> Any:
            env = envs.create(
                environment={
                    "type": "self_hosted",
                    "workspace_directory": work,
                    "files": [
                        {"type": "inline", "path": "/src/a.py", "data": b64(b"a")},
                        {"type": "inline", "path": "/top.txt", "data": b64(b"t")},
                    ],
                }
            )
            return {
                prefix: [f.path for f in envs.files.list(env.id, path=prefix)]
                for prefix in ("/workspace/src", "/src", "src", "/src/a.py", "/x/")
            }

        listed = yield self.sdk(run)
        self.assertEqual(
            listed,
            {
                "/workspace/src": ["/workspace/src/a.py"],
                "/src": ["/workspace/src/a.py"],
                "src": ["/workspace/src/a.py"],
                "/src/a.py": ["/workspace/src/a.py"],
                "/x/": [],
            },
        )

    @inlineCallbacks
    def test_all_or_nothing(self) -> Any:
        """
        An environment whose files include the agent's instructions file
        (403 ``path_denied``), or a file that differs from one already there
        (409 ``file_exists``), stages none of them and is not stored;
        a staged file never replaces one.
        """
        client = self.client()
        envs = client.beta.agents.environments
        work = os.path.join(self.base_dir, "work")
        os.makedirs(work)
        with open(os.path.join(work, "kept.txt"), "wb") as f:
            f.write(b"mine")

        def attempt(last: dict[str, Any]) -> Any:
            return caught(
                lambda: envs.create(
                    environment={
                        "type": "self_hosted",
                        "workspace_directory": work,
                        "files": [
                            {
                                "type": "inline",
                                "path": "/new/one.txt",
                                "data": b64(b"1"),
                            },
                            last,
                        ],
                    }
                )
            )

        def run() -> Any:
            denied = attempt(
                {"type": "inline", "path": "/AGENTS.md", "data": b64(b"x")}
            )
            hidden = attempt(
                {"type": "inline", "path": "/.git/config", "data": b64(b"x")}
            )
            clash = attempt(
                {"type": "inline", "path": "/kept.txt", "data": b64(b"other")}
            )
            escape = attempt(
                {"type": "inline", "path": "/../up.txt", "data": b64(b"x")}
            )
            env = envs.create(
                environment={"type": "self_hosted", "workspace_directory": work}
            )
            replace = caught(
                lambda: envs.files.create(
                    env.id, type="inline", path="/kept.txt", data=b64(b"other")
                )
            )
            return denied, hidden, clash, escape, replace, [e.id for e in envs.list()]

        denied, hidden, clash, escape, replace, listed = yield self.sdk(run)
        self.assertEqual(
            (denied.status_code, denied.body["code"]), (403, "path_denied")
        )
        self.assertEqual(
            (hidden.status_code, hidden.body["code"]), (403, "path_denied")
        )
        self.assertEqual((clash.status_code, clash.body["code"]), (409, "file_exists"))
        self.assertEqual(escape.status_code, 400)
        self.assertEqual(
            (replace.status_code, replace.body["code"]), (409, "file_exists")
        )
        self.assertEqual(len(listed), 1)
        self.assertEqual(sorted(os.listdir(work)), ["kept.txt"])
        with open(os.path.join(work, "kept.txt"), "rb") as f:
            self.assertEqual(f.read(), b"mine")

    @inlineCallbacks
    def test_hosted_settings_refused(self) -> Any:
        """A template with a hosted environment's settings is 400, not ignored."""
        envs = self.client().beta.agents.environments

        def run() -> Any:
            return (
                caught(
                    lambda: envs.templates.create(
                        name="x", packages={"python": ["numpy"]}
                    )
                ),
                caught(
                    lambda: envs.templates.create(
                        name="x", setup_commands=[{"command": "ls"}]
                    )
                ),
                list(envs.templates.list()),
            )

        packages, setup, listed = yield self.sdk(run)
        self.assertEqual(
            (packages.status_code, packages.body["param"]), (400, "packages")
        )
        self.assertEqual(setup.status_code, 400)
        self.assertEqual(listed, [])


class RuntimesTests(OpenAICase):
    """``GET /v1/agents/runtimes``: the catalogue as runtimes."""

    def test_runtimes(self) -> Any:
        """The fake agent is listed as an installed ACP runtime the caller may run."""
        d = self.sdk(
            httpx.get,
            self.daemon.url + "/v1/agents/runtimes",
            headers={"Authorization": "Bearer u-token"},
        )

        def check(answer: Any) -> None:
            self.assertEqual(answer.status_code, 200, answer.text)
            body = answer.json()
            fake = next(r for r in body["data"] if r["id"] == "fake")
            self.assertEqual(
                (fake["object"], fake["installed"], fake["allowed"], fake["protocol"]),
                ("agent.runtime", True, True, "acp"),
            )
            self.assertIn("claude", [r["id"] for r in body["data"]])
            # As agent-sandbox-server's: the name adapter takes, the names
            # that pick it too, and which one runs when none is named.
            claude = next(r for r in body["data"] if r["id"] == "claude")
            self.assertEqual(claude["name"], "claude")
            self.assertIn("claude-code", claude["aliases"])
            self.assertEqual([r["id"] for r in body["data"] if r["default"]], ["codex"])

        return d.addCallback(check)
