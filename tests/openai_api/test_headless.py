"""
The seed's own runtimes through the ``/v1`` door, as its users call them:
``codex`` and ``qwen-code`` (by any of its names) run their headless CLIs,
faked on PATH, driven by the official ``openai`` SDK.
"""

from __future__ import annotations

import os
from typing import Any

from twisted.internet.defer import inlineCallbacks
from twisted.trial.unittest import SkipTest

from tests.agents.test_clibridge import fake_clis, runs
from tests.agents.test_real_cli import (
    CODEX_BIN,
    Responses,
    codex_home,
    environment,
    serve,
)
from tests.openai_api.sdk import OpenAICase, caught, openai_policy
from tests.openai_api.test_restart import RestartCase
from tests.openai_api.vaults import SERVER, TOKEN, bearer_vault, mcp_agent


class FakeCLICase(OpenAICase):
    """A daemon whose agents' CLIs are the fakes on PATH (:func:`fake_clis`)."""

    def setUp(self) -> Any:
        fake_clis(self)
        return super().setUp()


class HeadlessVaultTests(FakeCLICase):
    """A vault's credential for a session's MCP tool reaches a headless CLI."""

    policy = openai_policy(params={"mcp_servers": "http"})

    @inlineCallbacks
    def test_credential_reaches_the_cli_not_its_arguments(self) -> Any:
        """
        codex gets the tool's server with the token in a variable of its
        environment that its ``-c`` overrides name; qwen reads it from the
        settings it is handed; neither's command line holds it.
        """
        agents = self.client().beta.agents

        def run(model: str) -> None:
            vault, _ = bearer_vault(agents)
            session = agents.sessions.create(
                **self.session_body(
                    agent={**mcp_agent(), "model": model}, vault_ids=[vault.id]
                )
            )
            with agents.sessions.stream(session.id, input="echo ok") as stream:
                list(stream)

        for model in ("codex", "qwen"):
            yield self.sdk(run, model)
        codex, qwen = runs(self.base_dir)
        for run_ in (codex, qwen):
            self.assertFalse([a for a in run_["argv"] if TOKEN in a], run_["argv"])
        self.assertIn(f'mcp_servers.docs.url="{SERVER}"', codex["argv"])
        self.assertEqual(
            codex["mcp_env"], {"SANDBOXD_MCP_SECRET_0_0": f"Bearer {TOKEN}"}
        )
        self.assertEqual(
            qwen["mcp_config"]["mcpServers"]["docs"],
            {"httpUrl": SERVER, "headers": {"Authorization": f"Bearer {TOKEN}"}},
        )


class HeadlessRuntimeTests(FakeCLICase):
    @inlineCallbacks
    def test_seed_runtimes_stream_a_turn(self) -> Any:
        """
        A session on ``codex`` and one on ``qwen`` each stream a turn: the
        CLI's answer is the message item's text, streamed as deltas, and the
        turn reports the CLI's token counts.
        """
        client = self.client()

        def run(model: str, text: str) -> Any:
            session = client.beta.agents.sessions.create(
                **self.session_body(agent={"model": model})
            )
            with client.beta.agents.sessions.stream(session.id, input=text) as stream:
                events = list(stream)
            turns = list(client.beta.agents.sessions.turns.list(session.id))
            return session, events, turns

        for model, agent_id in (("codex", "codex"), ("qwen", "qwen-code")):
            session, events, turns = yield self.sdk(
                run, model, f"echo from {model} here"
            )
            self.assertEqual(session.agent.id, agent_id)
            deltas = [
                e.delta
                for e in events
                if e.type == "agent.session.turn.output_text.delta"
            ]
            self.assertEqual("".join(deltas), f"from {model} here")
            self.assertEqual(events[-2].type, "agent.session.turn.completed")
            [turn] = turns
            self.assertEqual(turn.status, "completed")
            self.assertGreater(turn.usage.output_tokens, 0)
        self.assertEqual([r["cli"] for r in runs(self.base_dir)], ["codex", "qwen"])

    @inlineCallbacks
    def test_model_is_handed_to_the_cli(self) -> Any:
        """A model that names no runtime is the CLI's ``-m``."""
        client = self.client()

        def run() -> Any:
            session = client.beta.agents.sessions.create(
                **self.session_body(agent={"model": "gpt-5-codex"}),
                extra_body={"adapter": "codex"},
            )
            with client.beta.agents.sessions.stream(
                session.id, input="echo ok"
            ) as stream:
                list(stream)
            return session

        session = yield self.sdk(run)
        self.assertEqual(session.agent.model, "gpt-5-codex")
        [run_] = runs(self.base_dir)
        self.assertIn("--model=gpt-5-codex", run_["argv"])

    @inlineCallbacks
    def test_runtimes_say_how_each_runs(self) -> Any:
        """``/v1/agents/runtimes``: installed, the binary that runs, no approvals for a CLI."""
        import httpx

        def run() -> Any:
            return httpx.get(
                self.daemon.url + "/v1/agents/runtimes",
                headers={"Authorization": "Bearer u-token"},
                timeout=30,
            )

        reply = yield self.sdk(run)
        self.assertEqual(reply.status_code, 200, reply.text)
        shown = {r["name"]: r for r in reply.json()["data"]}
        for name, cli in (("codex", "codex"), ("qwen-code", "qwen")):
            self.assertTrue(shown[name]["installed"])
            self.assertEqual(shown[name]["protocol"], f"headless:{cli}")
            self.assertEqual(shown[name]["binary"], cli)
            self.assertFalse(shown[name]["capabilities"]["approvals"])
        self.assertEqual(shown["fake"]["protocol"], "acp")
        self.assertTrue(shown["fake"]["capabilities"]["approvals"])

    @inlineCallbacks
    def test_reported_files_are_artifacts(self) -> Any:
        """
        The files a CLI reports writing (codex's ``file_change`` with a path
        relative to its directory, qwen's ``write_file``) are the turn's
        artifacts.
        """
        client = self.client()
        artifacts = client.beta.agents.sessions.artifacts

        def run(model: str, name: str) -> Any:
            session = client.beta.agents.sessions.create(
                **self.session_body(agent={"model": model})
            )
            with client.beta.agents.sessions.stream(
                session.id, input=f"write {name} bytes-from-{model}"
            ) as stream:
                list(stream)
            [artifact] = list(artifacts.list(session.id))
            content = artifacts.with_raw_response.content(
                artifact.id, session_id=session.id
            )
            return artifact, content.content

        for model in ("codex", "qwen"):
            name = f"{model}-out.txt"
            artifact, content = yield self.sdk(run, model, name)
            self.assertEqual(
                artifact.path, os.path.realpath(os.path.join(self.base_dir, name))
            )
            self.assertEqual(content, f"bytes-from-{model}".encode())

    @inlineCallbacks
    def test_responses_continue_the_cli_session(self) -> Any:
        """
        ``responses.create`` on ``qwen-code`` streams the CLI's answer; a
        response continuing it resumes the CLI's own session.
        """
        client = self.client()

        def run() -> Any:
            first = client.responses.create(
                model="qwen-code", input="echo first answer"
            )
            with client.responses.create(
                model="qwen-code",
                input="echo second answer",
                previous_response_id=first.id,
                stream=True,
            ) as stream:
                deltas = [
                    e.delta for e in stream if e.type == "response.output_text.delta"
                ]
            return first, deltas

        first, deltas = yield self.sdk(run)
        self.assertEqual(first.output_text, "first answer")
        self.assertEqual("".join(deltas), "second answer")
        self.assertGreater(len(deltas), 1)
        one, two = runs(self.base_dir)
        self.assertFalse([a for a in one["argv"] if a.startswith("--resume")])
        self.assertIn("--resume=sess_fake_1", two["argv"])

    @inlineCallbacks
    def test_commands_are_command_execution_items(self) -> Any:
        """A command the CLI ran is a ``command_execution`` item with its output and exit code."""
        client = self.client()

        def run() -> Any:
            session = client.beta.agents.sessions.create(
                **self.session_body(agent={"model": "codex"})
            )
            with client.beta.agents.sessions.stream(
                session.id, input="run echo out; exit 3"
            ) as stream:
                list(stream)
            return list(client.beta.agents.sessions.items.list(session.id, order="asc"))

        items = yield self.sdk(run)
        [command] = [i for i in items if i.type == "command_execution"]
        self.assertEqual(command.command, "echo out; exit 3")
        self.assertEqual(command.output, "out\n")
        self.assertEqual(command.exit_code, 3)
        self.assertEqual(command.status, "failed")


class RealCodexResponseTests(OpenAICase):
    """``responses.create`` on the real codex (``make test-tools`` installs it)."""

    policy = openai_policy(params={"permission_mode": {"*": "auto"}, "deny_modes": []})

    def setUp(self) -> Any:
        if not os.path.exists(os.path.join(CODEX_BIN, "codex")):
            raise SkipTest(f"codex is not in {CODEX_BIN} (make test-tools installs it)")
        self.model = Responses()
        home = os.path.realpath(self.mktemp())
        os.makedirs(home)
        values = codex_home(home, serve(self, self.model))
        values.update(
            PATH=CODEX_BIN + os.pathsep + os.environ.get("PATH", ""), HOME=home
        )
        environment(self, values)
        return super().setUp()

    @inlineCallbacks
    def test_command_item_of_a_real_cli(self) -> Any:
        """
        A command the model has codex run is a ``command_execution`` output
        item with codex's command line, output and exit code, then the
        model's answer.
        """
        client = self.client()

        def run() -> Any:
            return client.responses.create(
                model="codex", input="run: echo real; exit 3"
            )

        response = yield self.sdk(run)
        [command] = [i for i in response.output if i.type == "command_execution"]
        self.assertIn("echo real; exit 3", command.command)
        self.assertEqual(command.exit_code, 3)
        self.assertEqual(command.output, "real\n")
        self.assertTrue(response.output_text.startswith("ran: "), response.output_text)


class McpCallItemTests(FakeCLICase):
    """An MCP tool a headless CLI calls, as agent-sandbox-server shows it."""

    # Four agents at once, all the caller's.
    policy = openai_policy(limits={"max_per_identity": 4})

    @inlineCallbacks
    def test_server_and_tool(self) -> Any:
        """
        The ``mcp_call`` item names the server (``server_label``) and the
        tool (``name``) the CLI called, for codex's ``mcp_tool_call`` and a
        ``mcp__SERVER__TOOL`` tool use alike.
        """
        client = self.client()

        def run(model: str) -> Any:
            session = client.beta.agents.sessions.create(
                **self.session_body(agent={"model": model})
            )
            with client.beta.agents.sessions.stream(
                session.id, input="mcp issues lookup_issue"
            ) as stream:
                list(stream)
            items = client.beta.agents.sessions.items.list(session.id, order="asc")
            response = client.responses.create(
                model=model, input="mcp issues lookup_issue"
            )
            return list(items), response

        for model in ("codex", "qwen"):
            items, response = yield self.sdk(run, model)
            for found in (items, response.output):
                [call] = [i for i in found if i.type == "mcp_call"]
                self.assertEqual(
                    (call.server_label, call.name), ("issues", "lookup_issue")
                )
                self.assertEqual(call.status, "completed")


class HeadlessRestartTests(RestartCase):
    """A headless CLI's session after the daemon restarted."""

    def setUp(self) -> Any:
        fake_clis(self)
        return super().setUp()

    @inlineCallbacks
    def test_next_turn_resumes_the_cli_session(self) -> Any:
        """The first turn after a restart resumes the CLI's session of before."""
        client = self.client()
        sessions = client.beta.agents.sessions

        def before() -> Any:
            session = sessions.create(**self.session_body(agent={"model": "codex"}))
            with sessions.stream(session.id, input="echo first") as stream:
                list(stream)
            return session

        session = yield self.sdk(before)
        yield self.restart()
        again = self.client().beta.agents.sessions

        def after() -> Any:
            with again.stream(session.id, input="echo second") as stream:
                list(stream)
            return [i.output_text for i in again.items.list(session.id, order="asc")]

        texts = yield self.sdk(after)
        self.assertEqual(texts, ["first", "second"])
        first, second = runs(self.base_dir)
        self.assertNotIn("resume", first["argv"])
        self.assertEqual(second["argv"][1:3], ["resume", "th_fake_1"])


class ReasoningEffortTests(FakeCLICase):
    """``reasoning.effort`` reaches an agent with a thought-level setting."""

    @inlineCallbacks
    def test_effort_reaches_codex(self) -> Any:
        """
        A definition's effort is codex's ``model_reasoning_effort`` in its
        sessions; a response's own effort too.
        """
        client = self.client()
        sessions = client.beta.agents.sessions
        environment = {"type": "self_hosted", "workspace_directory": self.base_dir}

        def run() -> Any:
            made = client.beta.agents.create(
                model="codex", reasoning={"effort": "high"}
            )
            session = sessions.create(agent_id=made.id, environment=environment)
            with sessions.stream(session.id, input="echo thought") as stream:
                list(stream)
            response = client.responses.create(
                model="codex", input="echo quick", reasoning={"effort": "low"}
            )
            return made, response

        made, response = yield self.sdk(run)
        self.assertEqual(made.reasoning.effort, "high")
        self.assertEqual(response.output_text, "quick")
        first, second = runs(self.base_dir)
        self.assertIn('model_reasoning_effort="high"', first["argv"])
        self.assertIn('model_reasoning_effort="low"', second["argv"])

    @inlineCallbacks
    def test_refused_where_it_cannot_apply(self) -> Any:
        """
        An effort for an agent without the setting, a summary, an effort
        OpenAI does not name: 400 naming the field, and no agent left running.
        """
        client = self.client()
        sessions = client.beta.agents.sessions

        def run() -> Any:
            body = self.session_body(
                agent={"model": "qwen", "reasoning": {"effort": "high"}}
            )
            no_setting = caught(lambda: sessions.create(**body))
            summary = caught(
                lambda: client.beta.agents.create(
                    model="codex", reasoning={"summary": "auto"}
                )
            )
            unknown = caught(
                lambda: client.beta.agents.create(
                    model="codex", reasoning={"effort": "maximal"}
                )
            )
            kept = sessions.create(**self.session_body(agent={"model": "codex"}))
            return no_setting, summary, unknown, list(sessions.list()), kept

        no_setting, summary, unknown, listed, kept = yield self.sdk(run)
        self.assertEqual(no_setting.status_code, 400)
        self.assertIn("no reasoning effort setting", no_setting.message)
        self.assertEqual(summary.status_code, 400)
        self.assertEqual(summary.body["param"], "reasoning.summary")
        self.assertEqual(unknown.status_code, 400)
        self.assertEqual(unknown.body["param"], "reasoning.effort")
        self.assertEqual([s.id for s in listed], [kept.id])
        # Only the kept session's agent runs in the engine.
        reply = yield self.request("GET", "/agents/sessions", token="r-token")
        self.assertEqual(reply.status, 200, reply.body)
        self.assertEqual([s["agent"] for s in reply.json()["sessions"]], ["codex"])
