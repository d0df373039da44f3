"""A session's MCP servers as each headless CLI takes them (in memory)."""

from __future__ import annotations

import json

from twisted.trial.unittest import SynchronousTestCase

from sandboxd.agents.climcp import Refused, handover


def http(name: str = "t", **extra: object) -> dict[str, object]:
    return {"type": "http", "name": name, "url": "https://mcp.example/", **extra}


class CheckTests(SynchronousTestCase):
    """What no CLI is handed."""

    def refused(self, servers: list[object], cli: str = "claude") -> str:
        return str(self.assertRaises(Refused, handover, cli, servers))

    def test_header_that_would_split_a_request(self) -> None:
        bad = [{"name": "X-A", "value": "a\r\nInjected: 1"}]
        self.assertIn("header 'X-A'", self.refused([http(headers=bad)]))
        bad = [{"name": "X A", "value": "a"}]
        self.assertIn("not valid", self.refused([http(headers=bad)]))

    def test_names(self) -> None:
        self.assertIn("named 't'", self.refused([http(), http()]))
        self.assertIn("letters, digits", self.refused([http(name="a.b")]))
        self.assertIn(
            "given twice",
            self.refused([http(headers=[{"name": "A", "value": "1"}] * 2)]),
        )

    def test_url_and_command(self) -> None:
        self.assertIn("http or https", self.refused([http(url="file:///etc/passwd")]))
        self.assertIn("no url or command", self.refused([{"name": "s"}]))
        self.assertIn("no transport", self.refused([{"name": "s", "type": "ws"}]))
        bad_env = {"name": "s", "command": "x", "env": [{"name": "1X", "value": ""}]}
        self.assertIn("variable name", self.refused([bad_env]))

    def test_codex_limits(self) -> None:
        sse = {"type": "sse", "name": "s", "url": "http://x/"}
        self.assertIn("not SSE", self.refused([sse], "codex"))
        one = {"name": "a", "command": "x", "env": [{"name": "K", "value": "1"}]}
        two = {"name": "b", "command": "x", "env": [{"name": "K", "value": "2"}]}
        self.assertIn("two values", self.refused([one, two], "codex"))
        same = {"name": "b", "command": "x", "env": [{"name": "K", "value": "1"}]}
        self.assertEqual(handover("codex", [one, same]).env, {"K": "1"})


class HandoverTests(SynchronousTestCase):
    def test_no_servers_nothing_handed(self) -> None:
        for cli in ("codex", "qwen", "claude"):
            given = handover(cli, [])
            self.assertEqual((given.args, given.env, given.config), ([], {}, None))

    def test_sse_for_claude_and_qwen(self) -> None:
        sse = {"type": "sse", "name": "s", "url": "http://x/sse"}
        claude = json.loads(handover("claude", [sse]).config or b"")
        self.assertEqual(
            claude["mcpServers"]["s"],
            {"type": "sse", "url": "http://x/sse", "headers": {}},
        )
        qwen = json.loads(handover("qwen", [sse]).config or b"")
        self.assertEqual(
            qwen["mcpServers"]["s"], {"url": "http://x/sse", "headers": {}}
        )

    def test_codex_quotes_what_it_writes(self) -> None:
        """Values go in as TOML strings: a quote or newline cannot end one."""
        server = {"name": "s", "command": 'a"b', "args": ["x\ny", "--z"]}
        args = handover("codex", [server]).args
        self.assertEqual(
            args,
            [
                "-c",
                'mcp_servers.s.command="a\\"b"',
                "-c",
                'mcp_servers.s.args=["x\\ny", "--z"]',
            ],
        )
