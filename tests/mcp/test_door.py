"""
The MCP door end to end (SPEC §17): a real daemon on a loopback port
driven by the official ``mcp`` SDK client (and fastmcp's), plus plain HTTP
for the transport rules the SDK never breaks on purpose.
"""

from __future__ import annotations

import base64
import json
import os
import time
from typing import Any

import anyio
import httpx2
import mcp_types as types
from mcp.client.client import Client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError
from twisted.internet import reactor
from twisted.internet.defer import inlineCallbacks
from twisted.internet.task import deferLater
from twisted.internet.threads import deferToThread

from sandboxd.commands import CommandRegistry
from sandboxd.mcp import door as door_module
from sandboxd.mcp.protocol import VERSIONS
from sandboxd.mcp.tools import DEFAULT_SHELL
from tests.browser.test_supervisor import DOOR_START_SECONDS, SlowChromium
from tests.helpers import alive, exchange, kill_marked, marked_pids
from tests.mcp.helpers import CLIENT_TIMEOUT, McpTestCase, in_thread

READER = "reader-token"
ADMIN = "admin-token"

TOKENS = {
    "auth": {
        "tokens": [
            {"id": "reader", "token_env": "READER_TOKEN", "scopes": ["files:read"]},
            {"id": "admin", "token_env": "ADMIN_TOKEN", "scopes": ["*"]},
        ]
    }
}
TOKEN_ENV = {"READER_TOKEN": READER, "ADMIN_TOKEN": ADMIN}


def _names(listed: Any) -> set[str]:
    return {t.name for t in listed.tools}


def _sleep(seconds: float) -> Any:
    return deferLater(reactor, seconds, lambda: None)


#: How long a cancelled call's processes get to be gone.
GONE_SECONDS = 10.0


async def gone(*pids: int) -> None:
    """In a client thread: wait (bounded) until none of ``pids`` runs."""
    deadline = time.monotonic() + GONE_SECONDS
    while any(alive(pid) for pid in pids) and time.monotonic() < deadline:
        await anyio.sleep(0.1)


class LifecycleTests(McpTestCase):
    """initialize, negotiation, listing, and the tools' descriptions."""

    @inlineCallbacks
    def test_sdk_connects_and_lists(self) -> Any:
        """
        The SDK's default connect (a discover probe, then initialize) ends
        in a session on a revision we serve; the list holds the endpoints as
        tools, and leaves out the ones that cannot be one call.
        """

        async def body(client: Any) -> Any:
            return client.protocol_version, await client.list_tools()

        version, listed = yield self.with_client(body)
        self.assertIn(version, VERSIONS)
        names = _names(listed)
        self.assertTrue(
            {"files_list", "shell", "shell_stream", "process_start"} <= names
        )
        for excluded in ("files_read_raw", "files_write_raw", "pty_connect", "mcp"):
            self.assertNotIn(excluded, names)
        tools = {t.name: t for t in listed.tools}
        self.assertTrue(tools["files_list"].annotations.read_only_hint)
        self.assertTrue(tools["files_delete"].annotations.destructive_hint)
        self.assertFalse(tools["files_mkdir"].annotations.destructive_hint)
        self.assertTrue(tools["files_mkdir"].annotations.idempotent_hint)
        self.assertIn("path", tools["files_stat"].input_schema["properties"])
        self.assertEqual(tools["files_stat"].input_schema["required"], ["path"])
        self.assertIn("exists", tools["files_stat"].output_schema["properties"])

    @inlineCallbacks
    def test_unknown_cursor(self) -> Any:
        """The list is one page: a cursor it never gave is invalid params."""

        async def body(client: Any) -> Any:
            try:
                await client.list_tools(cursor="nope")
            except MCPError as e:
                return e.error.code
            return None

        code = yield self.with_client(body)
        self.assertEqual(code, -32602)

    @inlineCallbacks
    def test_legacy_mode_both_revisions(self) -> Any:
        """An initialize asking for 2025-06-18 or 2025-11-25 gets it back."""
        for version in ("2025-06-18", "2025-11-25"):
            reply = yield self.initialize(version)
            self.assertEqual(reply.status_code, 200)
            self.assertEqual(reply.json()["result"]["protocolVersion"], version)
            self.assertTrue(reply.headers["mcp-session-id"])

    @inlineCallbacks
    def test_unknown_revision_gets_latest(self) -> Any:
        """A revision we do not serve is answered with the latest we do."""
        reply = yield self.initialize("1999-01-01")
        self.assertEqual(reply.json()["result"]["protocolVersion"], VERSIONS[-1])

    @inlineCallbacks
    def test_deep_nesting_is_a_parse_error(self) -> Any:
        """A message nested past the parser's depth is -32700, and the daemon lives."""
        deep = b'{"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": '
        deep += b"[" * 100000 + b"]" * 100000 + b"}"
        reply = yield self.http("POST", raw=deep)
        self.assertEqual(reply.status_code, 400)
        self.assertEqual(reply.json()["error"]["code"], -32700)
        health = yield self.request("GET", "/health")
        self.assertEqual(health.status, 200)

    @inlineCallbacks
    def test_fastmcp_client(self) -> Any:
        """fastmcp's client lists the tools and calls one."""
        from fastmcp import Client as FastClient

        with open(os.path.join(self.base_dir, "a.txt"), "w") as f:
            f.write("hello")

        async def work() -> Any:
            async with FastClient(self.mcp_url) as client:
                tools = await client.list_tools()
                result = await client.call_tool("files_stat", {"path": "a.txt"})
                return {t.name for t in tools}, result.structured_content

        names, stat = yield in_thread(work)
        self.assertIn("files_stat", names)
        self.assertEqual(stat["size"], 5)


class ToolCallTests(McpTestCase):
    """tools/call through the handlers."""

    @inlineCallbacks
    def test_files_round_trip(self) -> Any:
        """upload, stat, download (as text content) and delete a file."""
        data = base64.b64encode(b"hello mcp\n").decode()

        async def body(client: Any) -> Any:
            up = await client.call_tool(
                "upload", {"path": "notes/a.txt", "content_base64": data}
            )
            stat = await client.call_tool("files_stat", {"path": "notes/a.txt"})
            down = await client.call_tool("download", {"path": "notes/a.txt"})
            gone = await client.call_tool("files_delete", {"path": "notes/a.txt"})
            return up, stat, down, gone

        up, stat, down, gone = yield self.with_client(body)
        self.assertFalse(up.is_error)
        self.assertEqual(up.structured_content["bytes"], 10)
        self.assertTrue(stat.structured_content["exists"])
        self.assertEqual(down.content[0].text, "hello mcp\n")
        self.assertTrue(gone.structured_content["deleted"])
        self.assertFalse(os.path.exists(os.path.join(self.base_dir, "notes/a.txt")))

    @inlineCallbacks
    def test_files_grep(self) -> Any:
        """
        files_grep answers its matches as structured content (a read-only
        tool); a pattern that is not a regex is a tool error with its code.
        """
        os.makedirs(os.path.join(self.base_dir, "src"))
        with open(os.path.join(self.base_dir, "src/a.py"), "w") as f:
            f.write("def main():\n    return 0  # TODO: more\n")
        with open(os.path.join(self.base_dir, "src/min.js"), "w") as f:
            f.write("foo " * 2000 + "\n")
        with open(os.path.join(self.base_dir, "src/deep.js"), "w") as f:
            f.write("var a=1;" * 1000 + "NEEDLE;\n")

        async def body(client: Any) -> Any:
            listed = await client.list_tools()
            found = await client.call_tool(
                "files_grep", {"pattern": r"TODO:\s*\w+", "path": "src"}
            )
            bad = await client.call_tool("files_grep", {"pattern": "("})
            long = await client.call_tool(
                "files_grep", {"pattern": "foo", "path": "src/min.js"}
            )
            deep = await client.call_tool(
                "files_grep", {"pattern": "NEEDLE", "path": "src/deep.js"}
            )
            return listed, found, bad, long, deep

        listed, found, bad, long, deep = yield self.with_client(body)
        # A match deep in a long line: the text around it, text_column
        # counted in the whole line.
        [line] = deep.structured_content["matches"]
        self.assertEqual(line["columns"], [8001])
        self.assertEqual(line["text"][8001 - line["text_column"] :][:6], "NEEDLE", line)
        # One entry per line, its matches' columns listed; a long line cut
        # around its first match.
        [line] = long.structured_content["matches"]
        self.assertEqual(line["columns"][:3], [1, 5, 9])
        self.assertGreater(len(line["columns"]), 250)
        self.assertLessEqual(len(line["text"]), 240)
        self.assertEqual((line["text_column"], line["cut"]), (1, True))
        tools = {t.name: t for t in listed.tools}
        self.assertTrue(tools["files_grep"].annotations.read_only_hint)
        self.assertFalse(found.is_error, found.content)
        self.assertEqual(
            found.structured_content["matches"],
            [
                {
                    "path": os.path.join(self.base_dir, "src/a.py"),
                    "line": 2,
                    "columns": [17],
                    "text": "    return 0  # TODO: more",
                }
            ],
        )
        self.assertTrue(bad.is_error)
        self.assertEqual(bad.structured_content["code"], "invalid_param")

    @inlineCallbacks
    def test_names_that_are_not_utf8_and_line_separators(self) -> Any:
        """
        A file name that is not UTF-8 is listed as the files API lists it
        (its bad byte written as ``\\xe9``), and output holding U+2028
        arrives whole over the SSE stream a progress token asks for.
        """
        os.makedirs(os.path.join(self.base_dir, "odd"))
        odd = os.path.join(self.base_dir.encode(), b"odd/caf\xe9.txt")
        with open(odd, "wb") as f:
            f.write(b"inside")

        async def body(client: Any) -> Any:
            listed = await client.call_tool("files_list", {"path": "odd"})
            shell = await client.call_tool(
                "shell",
                {"command": "printf 'a\\342\\200\\250b\\n'"},
                progress_callback=lambda *_: None,
            )
            # The name as listed names the file back; a file:/// URI spells
            # the byte %E9, as the HTTP API's query does.
            read = await client.call_tool("download", {"path": "odd/caf\\xe9.txt"})
            resource = await client.read_resource(
                f"file://{self.base_dir}/odd/caf%E9.txt"
            )
            deleted = await client.call_tool(
                "files_delete", {"path": "odd/caf\\xe9.txt"}
            )
            return listed, shell, read, resource, deleted

        listed, shell, read, resource, deleted = yield self.with_client(body)
        self.assertFalse(listed.is_error, listed.content)
        names = [e["name"] for e in listed.structured_content["entries"]]
        self.assertEqual(names, ["caf\\xe9.txt"])
        self.assertEqual(read.content[0].text, "inside")
        self.assertEqual(resource.contents[0].text, "inside")
        self.assertFalse(deleted.is_error, deleted.content)
        self.assertFalse(os.path.exists(odd))
        self.assertFalse(shell.is_error, shell.content)
        self.assertEqual(shell.structured_content["stdout"], "a\u2028b\n")

    @inlineCallbacks
    def test_shell(self) -> Any:
        """shell answers with its output as structured content and text."""

        async def body(client: Any) -> Any:
            return await client.call_tool("shell", {"command": "echo hi"})

        result = yield self.with_client(body)
        self.assertFalse(result.is_error)
        # The client ended its session with DELETE as it closed.
        self.assertEqual(len(self.daemon.context.doors[b"/mcp"].sessions), 0)
        self.assertEqual(result.structured_content["stdout"], "hi\n")
        self.assertEqual(result.structured_content["exit_code"], 0)
        self.assertIn("hi", result.content[0].text)

    @inlineCallbacks
    def test_tool_call_counted_once(self) -> Any:
        """
        A ``tools/call`` is one request in ``sandboxd_requests_total``: under
        the tool's endpoint with ``door="mcp"``, not also as a POST to
        ``/mcp`` (summing the counter then overstated the calls answered).
        """
        from tests.test_metrics import samples

        opened = yield self.initialize()
        self.assertEqual(opened.status_code, 200, opened.text)
        headers = {
            "mcp-session-id": opened.headers["mcp-session-id"],
            "mcp-protocol-version": opened.json()["result"]["protocolVersion"],
        }
        called = yield self.http(
            "POST",
            {
                "jsonrpc": "2.0",
                "id": 2,
                "method": "tools/call",
                "params": {"name": "shell", "arguments": {"command": "echo hi"}},
            },
            headers,
        )
        self.assertEqual(called.status_code, 200, called.text)
        self.assertFalse(called.json()["result"].get("isError"), called.text)
        reply = yield self.request("GET", "/metrics")
        counted = {
            (dict(labels)["endpoint"], dict(labels)["door"]): value
            for (name, labels), value in samples(reply.body.decode()).items()
            if name == "sandboxd_requests_total" and value
        }
        # The initialize POST, and the call as the tool's endpoint.
        self.assertEqual(counted, {("mcp", "mcp"): 1.0, ("shell", "mcp"): 1.0})

    @inlineCallbacks
    def test_metrics_as_text(self) -> Any:
        """The Prometheus text of /metrics comes back as text content."""

        async def body(client: Any) -> Any:
            return await client.call_tool("metrics", {})

        result = yield self.with_client(body)
        self.assertFalse(result.is_error, result)
        self.assertIn("sandboxd_", result.content[0].text)
        self.assertTrue(result.structured_content["content_type"].startswith("text/"))

    @inlineCallbacks
    def test_stream_with_progress(self) -> Any:
        """
        shell_stream runs to completion; with a progressToken each new
        output arrives in a progress notification's message, and progress
        (bytes so far) only grows.
        """
        seen: list[tuple[float, str | None]] = []

        async def progress(
            done: float, total: float | None, message: str | None
        ) -> None:
            seen.append((done, message))

        async def body(client: Any) -> Any:
            return await client.call_tool(
                "shell_stream",
                {
                    "command": "sh -c 'echo one; sleep 0.3; echo two; sleep 0.3; echo three'"
                },
                progress_callback=progress,
            )

        result = yield self.with_client(body)
        self.assertEqual(result.structured_content["stdout"], "one\ntwo\nthree\n")
        self.assertEqual(result.structured_content["exit_code"], 0)
        self.assertGreaterEqual(len(seen), 2)
        values = [p for p, _ in seen]
        self.assertEqual(values, sorted(set(values)))
        self.assertEqual(values[-1], len("one\ntwo\nthree\n"))
        self.assertIn("one", "".join(m or "" for _, m in seen))

    @inlineCallbacks
    def test_background_process_and_output(self) -> Any:
        """process_start, then process_output with follow runs until it exits."""

        async def body(client: Any) -> Any:
            started = await client.call_tool(
                "process_start", {"command": "sh -c 'echo out; sleep 0.2; echo done'"}
            )
            pid = started.structured_content["pid"]
            followed = await client.call_tool(
                "process_output", {"pid": pid, "follow": True}
            )
            return followed

        followed = yield self.with_client(body)
        self.assertEqual(followed.structured_content["stdout"], "out\ndone\n")
        self.assertEqual(followed.structured_content["exit_code"], 0)

    @inlineCallbacks
    def test_unknown_tool_and_bad_arguments(self) -> Any:
        """
        A name that is no tool and an endpoint that is not a tool are
        JSON-RPC -32602; arguments that do not match the schema are a tool
        result with isError and a message naming the argument, which a
        model can read and correct.
        """

        async def body(client: Any) -> Any:
            codes = []
            for name, args in (
                ("no_such_tool", {}),
                ("files_read_raw", {"path": "x"}),
                ("files_stat", {}),
                ("files_stat", {"path": 3}),
                ("files_stat", {"path": "x", "bogus": 1}),
            ):
                try:
                    result = await client.call_tool(name, args)
                except MCPError as e:
                    codes.append((e.code, str(e)))
                else:
                    codes.append(
                        (
                            "isError" if result.is_error else None,
                            result.structured_content,
                        )
                    )
            return codes

        codes = yield self.with_client(body)
        self.assertEqual(
            [c for c, _ in codes], [-32602, -32602, "isError", "isError", "isError"]
        )
        self.assertIn("unknown tool", codes[0][1])
        self.assertIn("not served as a tool", codes[1][1])
        self.assertEqual(codes[2][1]["code"], "invalid_param")
        self.assertIn("path", codes[2][1]["error"])
        self.assertIn("type string", codes[3][1]["error"])
        self.assertIn("bogus", codes[4][1]["error"])

    @inlineCallbacks
    def test_cancel_kills_the_group(self) -> Any:
        """
        Cancelling a running shell_stream (notifications/cancelled) kills
        the child's whole process group, as an HTTP client leaving does.
        """
        marker = "mcp-cancel-marker"
        self.addCleanup(kill_marked, marker)

        async def body(client: Any) -> Any:
            box: dict[str, str] = {}
            first = anyio.Event()

            async def progress(done: float, total: Any, message: str | None) -> None:
                if message and "pids" not in box:
                    box["pids"] = message
                    first.set()

            async def call() -> None:
                await client.call_tool(
                    "shell_stream",
                    {
                        "command": f"sh -c 'sleep 30 {marker} & echo $$ $!; wait'",
                    },
                    progress_callback=progress,
                )

            async with anyio.create_task_group() as tg:
                tg.start_soon(call)
                await first.wait()
                tg.cancel_scope.cancel()
            # Give the courtesy cancel a moment on this session's connection.
            await anyio.sleep(0.2)
            # Watched while the client is still open, so that it is the
            # cancel that ends them, not the client's connections closing.
            shell, sleeper = (int(p) for p in box["pids"].split()[:2])
            await gone(shell, sleeper)
            return shell, sleeper

        shell, sleeper = yield self.with_client(
            body, seconds=CLIENT_TIMEOUT + GONE_SECONDS
        )
        self.assertFalse(alive(sleeper), "the group's child outlived the cancel")
        self.assertFalse(alive(shell))


class ModelToolsTests(McpTestCase):
    """What a model sees and calls: a small list, a shell, text writes, summaries."""

    @inlineCallbacks
    def test_default_list_fits_a_model(self) -> Any:
        """
        The default tools/list (every default group on, an all-scope token)
        has at most 30 tools and about 6.8k tokens (characters / 4); no
        terminal tool, which a model could not type into.
        """

        async def body(client: Any) -> Any:
            return await client.list_tools()

        listed = yield self.with_client(body)
        tools = [t.model_dump(by_alias=True, exclude_none=True) for t in listed.tools]
        size = len(json.dumps({"tools": tools}))
        self.assertLessEqual(len(tools), 30)
        # 6000 until files_edit and files_grep, the tools a model edits and
        # searches files with, joined it (files_archive and files_extract
        # left it then); 6500 until process_signal's answer said what an
        # exited command left running; 6550 until a process's answer said
        # whether its timeout ended it and what it left running, and
        # process_signal that 20 pauses; 6650 until files_grep and
        # files_search took exclude, no_ignore and hidden (ripgrep's ignore
        # rules, and the way past them); 6850 until upload took append (a
        # file too big for one message, written in parts).
        self.assertLessEqual(size / 4, 6880, size)
        names = {t["name"] for t in tools}
        self.assertIn("shell", names)
        self.assertFalse(any(n.startswith("pty_") for n in names), names)
        self.assertNotIn("openapi", names)

    @inlineCallbacks
    def test_shell_line_and_text_file(self) -> Any:
        """``cd x && ls`` works as a model expects; upload writes text as given."""

        async def body(client: Any) -> Any:
            up = await client.call_tool(
                "upload", {"path": "x/notes.txt", "content": "héllo\n"}
            )
            ls = await client.call_tool("shell", {"command": "cd x && ls"})
            argv = await client.call_tool("shell", {"argv": ["echo", "a && b"]})
            return up, ls, argv

        up, ls, argv = yield self.with_client(body)
        self.assertFalse(up.is_error, up)
        with open(os.path.join(self.base_dir, "x", "notes.txt"), "rb") as f:
            self.assertEqual(f.read(), "héllo\n".encode())
        self.assertEqual(ls.structured_content["stdout"], "notes.txt\n")
        self.assertEqual(argv.structured_content["stdout"], "a && b\n")

    @inlineCallbacks
    def test_upload_in_parts(self) -> Any:
        """
        A file written in parts: the first with upload, the rest with
        append (each after the ETag the last one answered); an append to a
        missing file is a 404 saying to write the first part without it,
        and a stale if_match a 412, neither writing anything.
        """

        async def body(client: Any) -> Any:
            first = await client.call_tool(
                "upload", {"path": "big/parts.txt", "content": "one\n"}
            )
            second = await client.call_tool(
                "upload",
                {
                    "path": "big/parts.txt",
                    "content": "two\n",
                    "append": True,
                    "if_match": first.structured_content["etag"],
                },
            )
            stale = await client.call_tool(
                "upload",
                {
                    "path": "big/parts.txt",
                    "content": "again\n",
                    "append": True,
                    "if_match": first.structured_content["etag"],
                },
            )
            missing = await client.call_tool(
                "upload", {"path": "big/none.txt", "content": "x", "append": True}
            )
            return second, stale, missing

        second, stale, missing = yield self.with_client(body)
        self.assertFalse(second.is_error, second)
        self.assertEqual(second.structured_content["bytes"], 4)
        self.assertEqual(second.structured_content["size"], 8)
        with open(os.path.join(self.base_dir, "big/parts.txt")) as f:
            self.assertEqual(f.read(), "one\ntwo\n")
        self.assertEqual(stale.structured_content["code"], "precondition_failed")
        self.assertEqual(missing.structured_content["status"], 404)
        self.assertIn("without append", missing.structured_content["error"])
        self.assertFalse(os.path.exists(os.path.join(self.base_dir, "big/none.txt")))

    @inlineCallbacks
    def test_read_some_lines(self) -> Any:
        """download with offset and limit gives a model those lines, as text."""
        with open(os.path.join(self.base_dir, "log.txt"), "w") as f:
            f.write("".join(f"line {n}\n" for n in range(1, 51)))

        async def body(client: Any) -> Any:
            return await client.call_tool(
                "download", {"path": "log.txt", "offset": -2, "limit": 1}
            )

        got = yield self.with_client(body)
        self.assertFalse(got.is_error, got)
        self.assertEqual(got.content[0].text, "line 49\n")
        self.assertEqual(got.structured_content["total_lines"], 50)

    @inlineCallbacks
    def test_edit_a_file(self) -> Any:
        """
        files_edit, as a model calls it: the file holds the new text; an
        old_text that is not there is a tool error saying so, and the file
        is left as it was.
        """
        path = os.path.join(self.base_dir, "app.py")
        with open(path, "w") as f:
            f.write("DEBUG = True\n")

        async def body(client: Any) -> Any:
            done = await client.call_tool(
                "files_edit",
                {"path": "app.py", "old_text": "True", "new_text": "False"},
            )
            missing = await client.call_tool(
                "files_edit",
                {"path": "app.py", "old_text": "True", "new_text": "x"},
            )
            return done, missing

        done, missing = yield self.with_client(body)
        self.assertFalse(done.is_error, done)
        self.assertEqual(done.structured_content["replacements"], 1)
        self.assertTrue(missing.is_error)
        self.assertIn("old_text is not in the file", missing.content[0].text)
        with open(path) as f:
            self.assertEqual(f.read(), "DEBUG = False\n")

    @inlineCallbacks
    def test_large_answers_summarised(self) -> Any:
        """capabilities and openapi answer in a few kB; one endpoint on request."""

        async def body(client: Any) -> Any:
            caps = await client.call_tool("capabilities", {})
            one = await client.call_tool("capabilities", {"endpoint": "shell"})
            spec = await client.call_tool("openapi", {})
            op = await client.call_tool("openapi", {"endpoint": "files_list"})
            bad = await client.call_tool("openapi", {"endpoint": "nope"})
            return caps, one, spec, op, bad

        caps, one, spec, op, bad = yield self.with_client(body)
        self.assertLess(len(caps.content[0].text), 8000)
        self.assertIn("shell", caps.structured_content["allowed"])
        self.assertEqual(one.structured_content["endpoint"], "shell")
        self.assertIn("limits", one.structured_content)
        self.assertLess(len(spec.content[0].text), 16000)
        ids = {o["id"] for o in spec.structured_content["operations"]}
        self.assertIn("files_list", ids)
        self.assertEqual(op.structured_content["path"], "/files/list")
        self.assertTrue(bad.is_error)


class AllToolsTests(McpTestCase):
    """``params.mcp_tools: all`` lists every tool the caller may call."""

    policy = {"endpoints": {"mcp": {"params": {"mcp_tools": "all"}}}}

    @inlineCallbacks
    def test_all_listed(self) -> Any:
        """The terminal tools and openapi are listed when asked for."""

        async def body(client: Any) -> Any:
            return await client.list_tools()

        listed = yield self.with_client(body)
        names = {t.name for t in listed.tools}
        self.assertIn("openapi", names)
        self.assertTrue(any(n.startswith("pty_") for n in names), names)


class JsonCancelTests(McpTestCase):
    """Cancelling a call answered as JSON (shell) ends its child too."""

    @inlineCallbacks
    def test_cancel_shell(self) -> Any:
        """notifications/cancelled for a running shell call kills its group."""
        marker = "30.4242"
        self.addCleanup(kill_marked, marker)

        async def body(client: Any) -> Any:
            async def call() -> None:
                await client.call_tool("shell", {"command": f"sleep {marker}"})

            async with anyio.create_task_group() as tg:
                tg.start_soon(call)
                for _ in range(100):
                    await anyio.sleep(0.05)
                    if marked_pids(marker):
                        break
                found = marked_pids(marker)
                tg.cancel_scope.cancel()
            await anyio.sleep(0.2)
            # Watched while the client is still open (see test_cancel_kills_the_group).
            await gone(*found)
            return found

        found = yield self.with_client(body, seconds=CLIENT_TIMEOUT + GONE_SECONDS)
        self.assertTrue(found, "the command never started")
        self.assertEqual(marked_pids(marker), [])


class PolicyTests(McpTestCase):
    """Scopes, switches and refusals decide the list and each call."""

    policy = {**TOKENS, "endpoints": {"files_search": {"enabled": False}}}
    environ = TOKEN_ENV

    @inlineCallbacks
    def test_reader_sees_read_tools_only(self) -> Any:
        """A files:read token lists only what files:read (and core:read) allow."""

        async def body(client: Any) -> Any:
            return await client.list_tools()

        listed = yield self.with_client(body, token=READER)
        names = _names(listed)
        self.assertTrue({"files_list", "files_stat", "download"} <= names)
        for denied in ("shell", "upload", "files_delete", "process_start", "env_set"):
            self.assertNotIn(denied, names)
        table = self.daemon.context.table
        for name in names:
            for scope in table.get(name).scopes:
                self.assertIn(scope, ("files:read", "core:read"))

    @inlineCallbacks
    def test_disabled_endpoint_has_no_tool(self) -> Any:
        """An endpoint the policy switched off is not listed, and a call is refused."""

        async def body(client: Any) -> Any:
            listed = await client.list_tools()
            called = await client.call_tool("files_search", {"pattern": "*"})
            return listed, called

        listed, called = yield self.with_client(body, token=ADMIN)
        self.assertNotIn("files_search", _names(listed))
        self.assertTrue(called.is_error)
        self.assertEqual(called.structured_content["code"], "endpoint_disabled")
        self.assertEqual(
            called.structured_content["rule"], "policy:endpoints.files_search"
        )

    @inlineCallbacks
    def test_refusal_is_a_tool_error(self) -> Any:
        """A tool the caller may not call answers isError with the §6 code and rule."""

        async def body(client: Any) -> Any:
            return await client.call_tool("shell", {"command": "true"})

        result = yield self.with_client(body, token=READER)
        self.assertTrue(result.is_error)
        self.assertEqual(result.structured_content["code"], "missing_scope")
        self.assertEqual(result.structured_content["scope"], "process:run")
        self.assertTrue(result.structured_content["rule"])

    @inlineCallbacks
    def test_reload_keeps_a_links_session_while_its_minter_stays(self) -> Any:
        """
        An MCP session opened with a link lives through a reload that keeps
        the link's minter, and ends with one that takes the minter out.
        """
        minted = yield self.request(
            "POST",
            "/auth/links",
            {"audience": "console", "scopes": ["files:read"]},
            token=ADMIN,
        )
        bearer = {"authorization": f"Bearer {minted.json()['token']}"}
        opened = yield self.initialize(headers=bearer)
        self.assertEqual(opened.status_code, 200, opened.text)
        door = self.daemon.context.doors[b"/mcp"]
        service = self.daemon.daemon
        self.assertTrue(service.reload())
        self.assertEqual(len(door.sessions), 1)
        listed = yield self.http(
            "POST",
            {"jsonrpc": "2.0", "id": 2, "method": "tools/list"},
            {
                **bearer,
                "mcp-session-id": opened.headers["mcp-session-id"],
                "mcp-protocol-version": opened.json()["result"]["protocolVersion"],
            },
        )
        self.assertEqual(listed.status_code, 200, listed.text)
        service.settings.policy = {
            **service.settings.policy,
            "auth": {"tokens": [TOKENS["auth"]["tokens"][0]]},
        }
        self.assertTrue(service.reload())
        self.assertEqual(len(door.sessions), 0)

    @inlineCallbacks
    def test_counted_link_spends_uses_on_calls(self) -> Any:
        """
        A counted link on /mcp spends one use per tool call it makes (not
        one for /mcp and one for the tool), none on the session's own
        traffic (initialize, tools/list, DELETE) nor on a call the gate
        refuses; used up, it is refused, but may still end its session.
        """
        minted = yield self.request(
            "POST",
            "/auth/links",
            {"audience": "console", "scopes": ["files:read"], "uses": 2},
            token=ADMIN,
        )
        link = minted.json()["token"]
        bearer = {"authorization": f"Bearer {link}"}

        def used() -> Any:
            d = self.request("GET", "/auth/links", token=ADMIN)
            return d.addCallback(lambda r: r.json()["links"][0]["used"])

        opened = yield self.initialize(headers=bearer)
        self.assertEqual(opened.status_code, 200, opened.text)
        self.assertEqual((yield used()), 0)
        headers = {
            **bearer,
            "mcp-session-id": opened.headers["mcp-session-id"],
            "mcp-protocol-version": opened.json()["result"]["protocolVersion"],
        }

        def call(rid: int, name: str, arguments: dict[str, Any]) -> Any:
            message = {
                "jsonrpc": "2.0",
                "id": rid,
                "method": "tools/call",
                "params": {"name": name, "arguments": arguments},
            }
            return self.http("POST", message, headers)

        def tools_list(rid: int) -> Any:
            return self.http(
                "POST", {"jsonrpc": "2.0", "id": rid, "method": "tools/list"}, headers
            )

        listed = yield call(2, "files_list", {"path": "."})
        self.assertEqual(listed.status_code, 200)
        self.assertFalse(listed.json()["result"].get("isError"), listed.text)
        self.assertEqual((yield used()), 1)
        refused = yield call(3, "shell", {"command": "true"})
        result = refused.json()["result"]
        self.assertTrue(result["isError"])
        self.assertEqual(result["structuredContent"]["code"], "missing_scope")
        self.assertEqual((yield used()), 1)
        tools = yield tools_list(4)
        self.assertEqual(tools.status_code, 200)
        self.assertEqual((yield used()), 1)
        last = yield call(5, "files_list", {"path": "."})
        self.assertFalse(last.json()["result"].get("isError"), last.text)
        self.assertEqual((yield used()), 2)
        spent = yield tools_list(6)
        self.assertEqual(spent.status_code, 401)
        self.assertEqual(spent.json()["error"]["data"]["code"], "link_invalid")
        ended = yield self.http("DELETE", None, headers)
        self.assertEqual(ended.status_code, 204)
        self.assertEqual(len(self.daemon.context.doors[b"/mcp"].sessions), 0)
        again = yield self.initialize(headers=bearer)
        self.assertEqual(again.status_code, 401)

    @inlineCallbacks
    def test_revoked_links_session_ends(self) -> Any:
        """
        Revoking a link ends its MCP sessions at once: its client, refused
        from then on, cannot end them, and they counted in its minter's share.
        """
        minted = yield self.request(
            "POST",
            "/auth/links",
            {"audience": "console", "scopes": ["files:read"]},
            token=ADMIN,
        )
        bearer = {"authorization": f"Bearer {minted.json()['token']}"}
        opened = yield self.initialize(headers=bearer)
        self.assertEqual(opened.status_code, 200, opened.text)
        door = self.daemon.context.doors[b"/mcp"]
        self.assertEqual(len(door.sessions), 1)
        revoked = yield self.request(
            "DELETE", f"/auth/links/{minted.json()['link_id']}", token=ADMIN
        )
        self.assertLess(revoked.status, 300, revoked.body)
        self.assertEqual(len(door.sessions), 0)

    @inlineCallbacks
    def test_wrong_token_is_401(self) -> Any:
        """A wrong token never opens a session: 401 with the code in data."""
        reply = yield self.initialize(headers={"authorization": "Bearer nope"})
        self.assertEqual(reply.status_code, 401)
        self.assertEqual(reply.json()["error"]["data"]["code"], "unauthorized")
        # RFC 6750: a client tells a bearer server from one wanting OAuth.
        self.assertEqual(reply.headers["www-authenticate"], 'Bearer realm="sandboxd"')
        stream = yield self.http("GET", None, {"authorization": "Bearer nope"})
        self.assertEqual(stream.status_code, 401)
        self.assertEqual(stream.json()["error"]["data"]["code"], "unauthorized")

    @inlineCallbacks
    def test_foreign_origin_refused(self) -> Any:
        """A browser Origin the policy does not allow is refused by the gate."""
        reply = yield self.initialize(
            headers={
                "authorization": f"Bearer {ADMIN}",
                "origin": "http://evil.example",
            }
        )
        self.assertEqual(reply.status_code, 403)
        self.assertEqual(reply.json()["error"]["data"]["code"], "origin_not_allowed")

    @inlineCallbacks
    def test_reload_notifies_list_changed(self) -> Any:
        """
        A policy reload that changes what a session may call sends
        notifications/tools/list_changed on its GET stream; the next list
        shows the change.
        """
        service = self.daemon.daemon

        async def body(client: Any) -> Any:
            changed = anyio.Event()

            async def handler(message: Any) -> None:
                if isinstance(message, types.ToolListChangedNotification):
                    changed.set()

            client.session._message_handler = handler
            before = _names(await client.list_tools())
            # Let the GET stream open before the reload.
            await anyio.sleep(0.5)

            def reload() -> bool:
                service.settings.policy["endpoints"]["files_stat"] = {"enabled": False}
                return bool(service.reload())

            from tests.mcp.helpers import on_reactor

            reloaded = on_reactor(reload)
            with anyio.fail_after(10):
                await changed.wait()
            after = _names(await client.list_tools())
            return reloaded, before, after

        reloaded, before, after = yield self.with_client(body, token=ADMIN)
        self.assertTrue(reloaded)
        self.assertIn("files_stat", before)
        self.assertNotIn("files_stat", after)


class OneCommandTests(McpTestCase):
    """A token that may run some commands only (``commands:run:NAME``)."""

    autostart = False
    policy = {
        "auth": {
            "tokens": [
                {
                    "id": "runner",
                    "token_env": "RUNNER_TOKEN",
                    "scopes": ["commands:list", "commands:run:hello"],
                }
            ]
        }
    }
    environ = {"RUNNER_TOKEN": "runner-token"}

    def setUp(self) -> Any:
        super().setUp()
        registry = CommandRegistry()

        @registry.command("hello")
        def hello(name: str = "World") -> str:
            return f"Hello, {name}!"

        @registry.command("other")
        def other() -> str:
            return "other"

        return self.start(registry=registry)

    @inlineCallbacks
    def test_run_command_listed_with_its_commands(self) -> Any:
        """
        ``tools/list`` offers ``run_command`` to a token holding only
        ``commands:run:hello``, naming the one command it may run, and the
        call it offers runs (was: left out of the list although the call
        ran, so a model never learnt it could run its command).
        """

        async def body(client: Any) -> Any:
            listed = await client.list_tools()
            called = await client.call_tool("run_command", {"name": "hello"})
            return listed, called

        listed, called = yield self.with_client(body, token="runner-token")
        tools = {t.name: t for t in listed.tools}
        self.assertIn("run_command", tools)
        description = tools["run_command"].description
        self.assertIn(
            'This token may run only these commands: hello(name: string = "World").',
            description,
        )
        self.assertNotIn("other", description)
        self.assertFalse(called.is_error, called)
        self.assertEqual(called.structured_content, {"result": "Hello, World!"})


class CommandArgumentsTests(McpTestCase):
    """run_command gives a template command the arguments REST does."""

    autostart = False

    def setUp(self) -> Any:
        super().setUp()
        registry = CommandRegistry()

        # The README's own example.
        @registry.command("hello", description="Say hello.")
        def hello(name: str = "World") -> str:
            return f"Hello, {name}!"

        @registry.command("show_path")
        def show_path(path: str, note: str = "") -> str:
            return f"{path!r} {note!r}"

        return self.start(registry=registry)

    @inlineCallbacks
    def test_name_argument(self) -> Any:
        """
        A command's argument called ``name`` is given in ``args`` (was: the
        tool's own ``name`` hid it, so hello always greeted "World");
        ``tools/list`` names the commands with their arguments, so a model
        need not guess; the earlier flat shape still runs where it is
        unambiguous, and an ambiguous call is refused saying how to write
        it, nothing run.
        """

        async def body(client: Any) -> Any:
            listed = await client.list_tools()
            calls = [
                await client.call_tool("run_command", arguments)
                for arguments in (
                    {"command": "hello", "args": {"name": "Alice"}},
                    {"name": "hello", "args": {"name": "Bob"}},
                    {"name": "hello"},
                    {"command": "hello", "name": "Eve"},
                )
            ]
            return listed, calls

        listed, calls = yield self.with_client(body)
        tool = next(t for t in listed.tools if t.name == "run_command")
        self.assertEqual(tool.input_schema["required"], ["command"])
        self.assertIn('hello(name: string = "World"): Say hello', tool.description)
        self.assertIn("show_path(path: string, note: string", tool.description)
        self.assertEqual(
            [c.structured_content for c in calls[:3]],
            [
                {"result": "Hello, Alice!"},
                {"result": "Hello, Bob!"},
                {"result": "Hello, World!"},
            ],
        )
        self.assertTrue(calls[3].is_error)
        self.assertIn("'args'", calls[3].content[0].text)

    @inlineCallbacks
    def test_path_argument_as_sent(self) -> Any:
        """
        A command's ``path`` argument arrives as sent, as over REST (was:
        ``\\xNN`` rewritten to a lone surrogate, the file tools' spelling
        of a byte, which means nothing to a command).
        """

        async def body(client: Any) -> Any:
            return await client.call_tool(
                "run_command",
                # The earlier, flat shape: the one whose path was rewritten.
                {"name": "show_path", "path": "a\\x9fb", "note": "a\\x9fb"},
            )

        called = yield self.with_client(body)
        self.assertFalse(called.is_error, called)
        self.assertEqual(
            called.structured_content, {"result": "'a\\\\x9fb' 'a\\\\x9fb'"}
        )
        reply = yield self.request(
            "POST", "/commands/show_path", {"path": "a\\x9fb", "note": "a\\x9fb"}
        )
        self.assertEqual(reply.json(), called.structured_content)


class LimitTests(McpTestCase):
    """A tool call counts against its endpoint's rate and concurrency limits."""

    policy = {
        "endpoints": {
            "files_stat": {"limits": {"rate_per_minute": 2}},
            "shell_stream": {"limits": {"max_concurrency": 1}},
        }
    }

    @inlineCallbacks
    def test_rate_and_concurrency(self) -> Any:
        """
        Past rate_per_minute a call is isError rate_limited; a second call
        while the only slot is held is isError concurrency_limited.
        """

        async def body(client: Any) -> Any:
            stats = [
                await client.call_tool("files_stat", {"path": "x"}) for _ in range(3)
            ]
            started = anyio.Event()
            out: dict[str, Any] = {}

            async def progress(done: float, total: Any, message: str | None) -> None:
                started.set()

            async def long_call() -> None:
                out["first"] = await client.call_tool(
                    "shell_stream",
                    {"command": "sh -c 'echo go; sleep 1'"},
                    progress_callback=progress,
                )

            async with anyio.create_task_group() as tg:
                tg.start_soon(long_call)
                await started.wait()
                out["second"] = await client.call_tool(
                    "shell_stream", {"command": "true"}
                )
            return stats, out

        stats, out = yield self.with_client(body)
        self.assertEqual([r.is_error for r in stats], [False, False, True])
        self.assertEqual(stats[2].structured_content["code"], "rate_limited")
        self.assertFalse(out["first"].is_error)
        self.assertTrue(out["second"].is_error)
        self.assertEqual(
            out["second"].structured_content["code"], "concurrency_limited"
        )


class LockedPresetTests(McpTestCase):
    """The locked preset (core only) has no MCP door either."""

    preset = "locked"

    @inlineCallbacks
    def test_locked_has_no_door(self) -> Any:
        """Under ``locked`` the mcp group is off: endpoint_disabled, preset rule."""
        reply = yield self.initialize()
        self.assertEqual(reply.status_code, 404)
        data = reply.json()["error"]["data"]
        self.assertEqual(data["code"], "endpoint_disabled")
        self.assertEqual(data["rule"], "preset:locked")


class SwitchedOffTests(McpTestCase):
    """``mcp`` is an endpoint id a policy can switch off."""

    policy = {"endpoints": {"mcp": {"enabled": False}}}

    @inlineCallbacks
    def test_mcp_disabled(self) -> Any:
        """POST /mcp is refused endpoint_disabled, with the rule."""
        reply = yield self.initialize()
        self.assertEqual(reply.status_code, 404)
        data = reply.json()["error"]["data"]
        self.assertEqual(data["code"], "endpoint_disabled")
        self.assertEqual(data["rule"], "policy:endpoints.mcp")


class BrowserStartTests(McpTestCase):
    """A browser tool whose Chromium does not start within the policy's time."""

    skip = SlowChromium.skip
    policy = SlowChromium.door_policy
    client_seconds = DOOR_START_SECONDS + CLIENT_TIMEOUT

    def setUp(self) -> Any:
        self.chromium = SlowChromium(self)
        return super().setUp()

    @inlineCallbacks
    def test_start_past_its_time(self) -> Any:
        """
        The tool result is ``isError`` with status 503 and code
        ``unavailable``, and nothing of the browser is left running.
        """

        async def body(client: Any) -> Any:
            return await client.call_tool("browser_evaluate", {"script": "1"})

        result = yield self.with_client(body)
        self.assertTrue(result.is_error)
        self.assertEqual(result.structured_content["status"], 503)
        self.assertEqual(result.structured_content["code"], "unavailable")
        self.assertIn("start_timeout_seconds", result.structured_content["error"])
        left = yield self.chromium.left_running()
        self.assertEqual(left, [])


#: Requests to the door the HTTP front refuses before routing.
REFUSED_MCP_HEADS = (
    (
        "an obs-folded line",
        b"POST /mcp HTTP/1.1\r\nHost: 127.0.0.1\r\nX-A: 1\r\n folded\r\n"
        b"Content-Type: application/json\r\nContent-Length: 2\r\n\r\n{}",
        "malformed_request",
    ),
    (
        "a Transfer-Encoding other than chunked",
        b"POST /mcp HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        b"Content-Type: application/json\r\nTransfer-Encoding: gzip\r\n\r\n",
        "malformed_request",
    ),
    (
        "a malformed chunk",
        b"POST /mcp HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        b"Content-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n"
        b"zz\r\n{}\r\n0\r\n\r\n",
        # (The API port reads no chunked body: refused before the chunk.)
        "transfer_encoding_not_allowed",
    ),
    (
        "a head over the bound",
        b"POST /mcp/ HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Pad: "
        + b"x" * (20 * 1024)
        + b"\r\n\r\n",
        "malformed_request",
    ),
)


class TransportTests(McpTestCase):
    """Streamable HTTP framing, sessions and their bounds."""

    policy = {
        "endpoints": {
            "mcp": {
                "limits": {
                    "max_sessions": 2,
                    "max_request_bytes": 4096,
                }
            }
        }
    }

    def _session_headers(self, reply: Any) -> dict[str, str]:
        return {
            "mcp-session-id": reply.headers["mcp-session-id"],
            "mcp-protocol-version": reply.json()["result"]["protocolVersion"],
        }

    @inlineCallbacks
    def test_delete_ends_the_session(self) -> Any:
        """DELETE ends a session; its id is unknown (404) afterwards."""
        opened = yield self.initialize()
        headers = self._session_headers(opened)
        listing = {"jsonrpc": "2.0", "id": 2, "method": "tools/list"}
        ok = yield self.http("POST", listing, headers)
        self.assertEqual(ok.status_code, 200)
        self.assertTrue(ok.json()["result"]["tools"])
        deleted = yield self.http("DELETE", None, headers)
        self.assertEqual(deleted.status_code, 204)
        after = yield self.http("POST", listing, headers)
        self.assertEqual(after.status_code, 404)
        self.assertEqual(after.json()["error"]["code"], -32001)

    @inlineCallbacks
    def test_sessions_are_bounded(self) -> Any:
        """
        Past max_sessions an initialize is 429 too_many_sessions, with
        ``Retry-After``: the time until the first quiet session can make
        room, at most a minute.
        """
        for _ in range(2):
            opened = yield self.initialize()
            self.assertEqual(opened.status_code, 200)
        refused = yield self.initialize()
        self.assertEqual(refused.status_code, 429)
        self.assertEqual(refused.json()["error"]["data"]["code"], "too_many_sessions")
        retry = int(refused.headers["retry-after"])
        self.assertTrue(55 <= retry <= 60, retry)
        self.assertEqual(refused.json()["error"]["data"]["retry_after"], retry)

    @inlineCallbacks
    def test_quiet_session_makes_room(self) -> Any:
        """
        At max_sessions, a session left with no call and no connection (a
        client that crashed) is closed for a new one; its id is then
        unknown (404), as an MCP client expects before initializing anew.
        """
        self.patch(door_module, "MCP_SESSION_QUIET_SECONDS", 0.3)
        first = yield self.initialize()
        second = yield self.initialize()
        yield _sleep(0.2)
        ping = {"jsonrpc": "2.0", "id": 2, "method": "ping"}
        used = yield self.http("POST", ping, self._session_headers(second))
        self.assertEqual(used.status_code, 200)
        yield _sleep(0.2)
        third = yield self.initialize()
        self.assertEqual(third.status_code, 200, third.text)
        gone = yield self.http("POST", ping, self._session_headers(first))
        self.assertEqual(gone.status_code, 404)
        kept = yield self.http("POST", ping, self._session_headers(second))
        self.assertEqual(kept.status_code, 200)

    @inlineCallbacks
    def test_bad_messages(self) -> Any:
        """
        Batches, non-JSON, oversized messages, a request with no session
        and an unsupported MCP-Protocol-Version are refused as JSON-RPC
        errors with the HTTP status the transport names.
        """
        opened = yield self.initialize()
        headers = self._session_headers(opened)
        ping = {"jsonrpc": "2.0", "id": 5, "method": "ping"}
        batch = yield self.http("POST", [ping, ping], headers)
        self.assertEqual(batch.status_code, 400)
        self.assertEqual(batch.json()["error"]["code"], -32600)
        self.assertIn("batch", batch.json()["error"]["message"])
        for junk_body in (
            b"{nope",
            b'{"jsonrpc": "2.0", "id": 1, "method": "ping", "method": "x"}',
            b'{"jsonrpc": "2.0", "id": NaN, "method": "ping"}',
            b'"just a string"',
        ):
            junk = yield self.http("POST", raw=junk_body, headers=headers)
            self.assertEqual(junk.status_code, 400, junk_body[:40])
            self.assertIn(junk.json()["error"]["code"], (-32700, -32600))
        big = {**ping, "params": {"x": "y" * 5000}}
        huge = yield self.http("POST", big, headers)
        self.assertEqual(huge.status_code, 413)
        self.assertEqual(huge.json()["error"]["data"]["code"], "payload_too_large")
        self.assertIn("append: true", huge.json()["error"]["message"])
        self.assertEqual(
            huge.json()["error"]["data"]["setting"],
            "endpoints.mcp.limits.max_request_bytes",
        )
        nosession = yield self.http("POST", ping)
        self.assertEqual(nosession.status_code, 400)
        wrong = yield self.http(
            "POST", ping, {**headers, "mcp-protocol-version": "1999-01-01"}
        )
        self.assertEqual(wrong.status_code, 400)
        unknown = yield self.http("POST", ping, {**headers, "mcp-session-id": "nope"})
        self.assertEqual(unknown.status_code, 404)
        fine = yield self.http("POST", ping, headers)
        self.assertEqual(fine.json(), {"jsonrpc": "2.0", "id": 5, "result": {}})
        health = yield self.request("GET", "/health")
        self.assertEqual(health.status, 200)

    @inlineCallbacks
    def test_refused_heads(self) -> Any:
        """
        A request the HTTP front refuses before the door reads it (an
        obs-folded line, a Transfer-Encoding other than chunked, a chunk
        that is not one, a head over the bound) is a JSON-RPC error with
        ``id`` null, the §6 code in ``data``, at 400: the framing of every
        other answer of the door (was the API port's plain JSON error).  A
        chunked body is refused by the door's own rule, in the same framing.
        """
        for what, data, code in REFUSED_MCP_HEADS:
            status, kind, body = yield deferToThread(exchange, self.daemon.port, data)
            self.assertEqual((status, kind), (400, "application/json"), what)
            self.assertEqual(body["jsonrpc"], "2.0", what)
            self.assertIsNone(body["id"], what)
            self.assertEqual(body["error"]["code"], -32600, what)
            self.assertEqual(body["error"]["data"]["code"], code, what)
        health = yield self.request("GET", "/health")
        self.assertEqual(health.status, 200)

    @inlineCallbacks
    def test_sdk_reads_a_refused_head(self) -> Any:
        """
        The SDK's client whose head is too large (a header of its own
        over the bound) raises an MCPError with the door's message, not
        its stand-in "Server returned an error response".
        """
        pad = {"X-Pad": "x" * (20 * 1024)}

        async def work() -> Any:
            async with httpx2.AsyncClient(headers=pad, timeout=CLIENT_TIMEOUT) as http:
                client = Client(streamable_http_client(self.mcp_url, http_client=http))
                try:
                    async with client:
                        pass
                except BaseException as e:
                    # The SDK raises it from its task group, wrapped.
                    while isinstance(e, BaseExceptionGroup) and len(e.exceptions) == 1:
                        e = e.exceptions[0]
                    return e
            return None

        error = yield in_thread(work)
        self.assertIsInstance(error, MCPError)
        self.assertEqual(error.error.code, -32600)
        self.assertIn("malformed HTTP request", error.error.message)

    @inlineCallbacks
    def test_reload_switching_the_door_off_ends_sessions(self) -> Any:
        """A reload that disables mcp closes every session."""
        yield self.initialize()
        door = self.daemon.context.doors[b"/mcp"]
        self.assertEqual(len(door.sessions), 1)
        service = self.daemon.daemon
        service.settings.policy["endpoints"]["mcp"]["enabled"] = False
        self.assertTrue(service.reload())
        self.assertEqual(len(door.sessions), 0)
        refused = yield self.initialize()
        self.assertEqual(refused.status_code, 404)

    @inlineCallbacks
    def test_notification_is_202(self) -> Any:
        """A notification is accepted with 202 and no body."""
        opened = yield self.initialize()
        headers = self._session_headers(opened)
        reply = yield self.http(
            "POST",
            {"jsonrpc": "2.0", "method": "notifications/initialized"},
            headers,
        )
        self.assertEqual(reply.status_code, 202)
        self.assertEqual(reply.content, b"")

    def _stream_lines(self, headers: dict[str, str], call: dict[str, Any]) -> Any:
        """POST one call and read its SSE answer to the end, line by line."""
        import httpx2

        url = self.mcp_url

        async def work() -> Any:
            sent = {
                "accept": "application/json, text/event-stream",
                "content-type": "application/json",
                **headers,
            }
            async with httpx2.AsyncClient(timeout=10) as client:
                async with client.stream("POST", url, json=call, headers=sent) as r:
                    return [line async for line in r.aiter_lines()]

        return in_thread(work)

    @inlineCallbacks
    def test_priming_event_by_revision(self) -> Any:
        """
        A 2025-11-25 session's SSE answer starts with a priming event (an
        id, no data) so it can be resumed before anything is sent; a
        2025-06-18 one starts with its first message.
        """
        call = {
            "jsonrpc": "2.0",
            "id": 3,
            "method": "tools/call",
            "params": {"name": "shell_stream", "arguments": {"command": "true"}},
        }
        firsts = {}
        for version in ("2025-06-18", "2025-11-25"):
            opened = yield self.initialize(version)
            lines = yield self._stream_lines(self._session_headers(opened), call)
            events = [line for line in lines if line and not line.startswith(":")]
            firsts[version] = events[:2]
            self.assertTrue(events[-1].startswith("data: {"))
        self.assertEqual(firsts["2025-11-25"][1], "data:")
        self.assertEqual(firsts["2025-06-18"][1], "event: message")

    @inlineCallbacks
    def test_resume_by_last_event_id(self) -> Any:
        """
        A client that loses a call's SSE stream resumes it with GET and
        Last-Event-ID: it gets the events after that id, then the answer.
        """
        import httpx2

        opened = yield self.initialize()
        headers = self._session_headers(opened)
        url = self.mcp_url
        call = {
            "jsonrpc": "2.0",
            "id": 9,
            "method": "tools/call",
            "params": {
                "name": "shell_stream",
                "arguments": {"command": "sh -c 'echo a; sleep 0.5; echo b'"},
                "_meta": {"progressToken": "t"},
            },
        }

        async def work() -> Any:
            sent = {
                "accept": "application/json, text/event-stream",
                "content-type": "application/json",
                **headers,
            }
            async with httpx2.AsyncClient(timeout=10) as client:
                first_id = None
                async with client.stream("POST", url, json=call, headers=sent) as r:
                    assert r.headers["content-type"].startswith("text/event-stream")
                    async for line in r.aiter_lines():
                        if line.startswith("id: "):
                            first_id = line[4:]
                        if line.startswith("data: {"):
                            break  # the first progress event: drop the stream
                resumed = []
                async with client.stream(
                    "GET", url, headers={**sent, "last-event-id": first_id or ""}
                ) as r:
                    async for line in r.aiter_lines():
                        if line.startswith("data: {"):
                            resumed.append(line[6:])
                return first_id, resumed

        first_id, resumed = yield in_thread(work)
        import json

        messages = [json.loads(m) for m in resumed]
        self.assertTrue(first_id)
        self.assertEqual(messages[-1]["id"], 9)
        self.assertEqual(
            messages[-1]["result"]["structuredContent"]["stdout"], "a\nb\n"
        )
        progress = [m for m in messages if m.get("method") == "notifications/progress"]
        self.assertTrue(any("b" in m["params"]["message"] for m in progress))
        self.assertFalse(any(m["params"]["message"] == "a" for m in progress))


class IdleTests(McpTestCase):
    """Sessions expire."""

    policy = {"endpoints": {"mcp": {"limits": {"idle_timeout_seconds": 1}}}}

    _session_headers = TransportTests._session_headers

    @inlineCallbacks
    def test_idle_session_expires(self) -> Any:
        """A session idle past limits.idle_timeout_seconds is gone."""
        opened = yield self.initialize()
        headers = self._session_headers(opened)
        yield _sleep(2.0)
        after = yield self.http(
            "POST", {"jsonrpc": "2.0", "id": 2, "method": "ping"}, headers
        )
        self.assertEqual(after.status_code, 404)
        self.assertEqual(len(self.daemon.context.doors[b"/mcp"].sessions), 0)


class ResourceTests(McpTestCase):
    """Files as resources, through the path guard."""

    @inlineCallbacks
    def test_list_and_read(self) -> Any:
        """
        resources/list is the base dir's top level; resources/read gives
        text as text, binary as a blob, and refuses a path outside.
        """
        with open(os.path.join(self.base_dir, "t.txt"), "w") as f:
            f.write("text here")
        with open(os.path.join(self.base_dir, "b.bin"), "wb") as f:
            f.write(b"\x00\xff\x10")
        png = b"\x89PNG\r\n\x1a\n" + b"\x00" * 40
        with open(os.path.join(self.base_dir, "p.png"), "wb") as f:
            f.write(png)

        async def body(client: Any) -> Any:
            listed = await client.list_resources()
            templates = await client.list_resource_templates()
            uris = {str(r.uri) for r in listed.resources}
            text = await client.read_resource(f"file://{self.base_dir}/t.txt")
            blob = await client.read_resource(f"file://{self.base_dir}/b.bin")
            try:
                await client.read_resource("file:///etc/passwd")
            except MCPError as e:
                refused = e
            picture = await client.read_resource(f"file://{self.base_dir}/p.png")
            shown = await client.call_tool("download", {"path": "p.png"})
            return uris, templates, text, blob, refused, picture, shown

        uris, templates, text, blob, refused, picture, shown = yield self.with_client(
            body
        )
        # A picture is an image to the model, and a refusal is the server's
        # own code (the request was valid).
        self.assertEqual(picture.contents[0].mime_type, "image/png")
        self.assertEqual([c.type for c in shown.content], ["image"])
        self.assertEqual(base64.b64decode(shown.content[0].data), png)
        self.assertEqual(refused.error.code, -32000)
        self.assertIn(f"file://{self.base_dir}/t.txt", uris)
        self.assertEqual(
            templates.resource_templates[0].uri_template, "file:///{+path}"
        )
        self.assertEqual(text.contents[0].text, "text here")
        self.assertEqual(base64.b64decode(blob.contents[0].blob), b"\x00\xff\x10")
        self.assertEqual(refused.error.data["code"], "path_not_allowed")


class AuditTests(McpTestCase):
    """Every call is one audit line, governed as its endpoint, via mcp."""

    audit = True
    policy = {"defaults": {"audit": "all"}}

    @inlineCallbacks
    def test_audit_lines(self) -> Any:
        """A tools/call is audited as its endpoint with via=mcp, and /mcp itself too."""

        async def body(client: Any) -> Any:
            return await client.call_tool("files_stat", {"path": "x"})

        yield self.with_client(body)
        lines = self.audit_lines()
        calls = [r for r in lines if r.get("endpoint") == "files_stat"]
        self.assertEqual(len(calls), 1)
        self.assertEqual(calls[0]["via"], "mcp")
        self.assertEqual(calls[0]["tool"], "files_stat")
        self.assertEqual(calls[0]["status"], 200)
        doors = [r for r in lines if r.get("endpoint") == "mcp"]
        self.assertTrue(doors)
        self.assertTrue(all(r["via"] == "mcp" for r in doors))
        self.assertIn("initialize", {r.get("rpc") for r in doors})

    @inlineCallbacks
    def test_shell_line_carries_the_argv(self) -> Any:
        """A shell tool call's line carries the argv it ran, as the HTTP door's does."""

        async def body(client: Any) -> Any:
            return await client.call_tool("shell", {"command": "echo audited"})

        yield self.with_client(body)
        yield self.request(
            "POST", "/shell", {"command": "echo audited", "shell": DEFAULT_SHELL}
        )
        lines = [r for r in self.audit_lines() if r.get("endpoint") == "shell"]
        by_door = {r["via"]: r.get("argv") for r in lines}
        self.assertEqual(by_door["mcp"], by_door["http"])
        self.assertIn("echo audited", by_door["mcp"])


class TerminalOwnerTests(McpTestCase):
    """A terminal is its creator's through MCP too: "not yours" is "not there"."""

    policy = {
        "auth": {
            "tokens": [
                {"id": "alice", "token_env": "ALICE_TOKEN", "scopes": ["terminal:use"]},
                {"id": "bob", "token_env": "BOB_TOKEN", "scopes": ["terminal:use"]},
            ]
        }
    }
    environ = {"ALICE_TOKEN": "alice-token", "BOB_TOKEN": "bob-token"}

    @inlineCallbacks
    def test_anothers_terminal_is_unknown(self) -> Any:
        """
        Bob's pty_detail, pty_resize and pty_delete_session of Alice's session answer as
        for an id nobody has (the id he gave aside); pty_list_sessions does not show it,
        and the session is still there at its size.
        """
        reply = yield self.request(
            "POST", "/pty/sessions", {"cols": 80, "rows": 24}, token="alice-token"
        )
        sid = json.loads(reply.body)["session_id"]
        self.addCleanup(
            self.request, "DELETE", f"/pty/sessions/{sid}", token="alice-token"
        )

        async def body(client: Any) -> Any:
            out = []
            for target in (sid, "no-such-session"):
                answers = []
                for tool, args in (
                    ("pty_detail", {"id": target}),
                    ("pty_resize", {"id": target, "cols": 33, "rows": 7}),
                    ("pty_delete_session", {"id": target}),
                ):
                    result = await client.call_tool(tool, args)
                    shown = json.dumps(result.structured_content)
                    answers.append((result.is_error, shown.replace(target, "ID")))
                out.append(answers)
            listed = await client.call_tool("pty_list_sessions", {})
            return out, listed.structured_content

        (theirs, nobodys), listed = yield self.with_client(body, token="bob-token")
        self.assertEqual(theirs, nobodys)
        self.assertTrue(all(is_error for is_error, _ in theirs))
        self.assertEqual(listed["sessions"], [])
        reply = yield self.request("GET", f"/pty/sessions/{sid}", token="alice-token")
        described = json.loads(reply.body)
        self.assertEqual((described["cols"], described["rows"]), (80, 24))


class QuietDisconnectTests(McpTestCase):
    """With audit: deny, a client's normal session leaves no failure line."""

    audit = True
    policy = {"defaults": {"audit": "deny"}}

    @inlineCallbacks
    def test_normal_session_not_a_failure(self) -> Any:
        """Open, list, call, close: no 499 (the server stream ending is normal)."""

        async def body(client: Any) -> Any:
            await client.list_tools()
            return await client.call_tool("files_list", {})

        yield self.with_client(body)
        # The session's own server stream (GET), opened and then left by
        # the client, as a client that ends its session does.
        import httpx2

        opened = yield self.initialize()
        headers = {
            "accept": "text/event-stream",
            "mcp-session-id": opened.headers["mcp-session-id"],
        }

        async def work() -> Any:
            async with httpx2.AsyncClient(timeout=10) as client:
                async with client.stream("GET", self.mcp_url, headers=headers) as r:
                    assert r.status_code == 200
                    await anyio.sleep(0.2)
                await client.delete(self.mcp_url, headers=headers)

        yield in_thread(work)
        yield self._drain()
        lines = self.audit_lines()
        self.assertEqual([r for r in lines if r.get("status") == 499], [], lines)


def _call(rid: int, name: str, arguments: dict[str, Any]) -> dict[str, Any]:
    return {
        "jsonrpc": "2.0",
        "id": rid,
        "method": "tools/call",
        "params": {"name": name, "arguments": arguments},
    }


class LostStreamTests(McpTestCase):
    """
    A call whose SSE stream is lost waits a grace (the idle timeout here)
    for its client to resume it; then it is let go, and its session with it.
    """

    policy = {"endpoints": {"mcp": {"limits": {"idle_timeout_seconds": 2}}}}

    _session_headers = TransportTests._session_headers

    def _drop_after_priming(self, headers: dict[str, str], call: dict[str, Any]) -> Any:
        """POST a streamed call and leave after its first event id."""
        url = self.mcp_url

        async def work() -> str:
            sent = {
                "accept": "application/json, text/event-stream",
                "content-type": "application/json",
                **headers,
            }
            async with httpx2.AsyncClient(timeout=10) as client:
                async with client.stream("POST", url, json=call, headers=sent) as r:
                    assert r.headers["content-type"].startswith("text/event-stream")
                    async for line in r.aiter_lines():
                        if line.startswith("id: "):
                            return line[4:]
            raise AssertionError("no event id")

        return in_thread(work)

    @inlineCallbacks
    def test_dead_follower_frees_its_session(self) -> Any:
        """
        A client that dies while following a process that keeps running
        does not hold its session: once the grace is over the follow is
        cancelled (the process runs on) and the idle session expires.
        """
        opened = yield self.initialize()
        headers = self._session_headers(opened)
        started = yield self.http(
            "POST", _call(2, "process_start", {"command": "sleep 30"}), headers
        )
        pid = started.json()["result"]["structuredContent"]["pid"]
        self.addCleanup(lambda: os.kill(pid, 9) if alive(pid) else None)
        yield self._drop_after_priming(
            headers, _call(3, "process_output", {"pid": pid, "follow": True})
        )
        yield _sleep(4.0)
        after = yield self.http(
            "POST", {"jsonrpc": "2.0", "id": 4, "method": "ping"}, headers
        )
        self.assertEqual(after.status_code, 404)
        self.assertEqual(len(self.daemon.context.doors[b"/mcp"].sessions), 0)
        self.assertTrue(alive(pid), "the followed process was not the call's")

    @inlineCallbacks
    def test_resumed_within_the_grace(self) -> Any:
        """
        A call that outlasts the grace is not let go while its client came
        back in time: the resumed stream gets its answer.
        """
        opened = yield self.initialize()
        headers = self._session_headers(opened)
        first = yield self._drop_after_priming(
            headers, _call(3, "shell_stream", {"command": "sleep 3; echo b"})
        )
        yield _sleep(1.0)
        url = self.mcp_url

        async def resume() -> list[str]:
            sent = {"accept": "text/event-stream", **headers, "last-event-id": first}
            async with httpx2.AsyncClient(timeout=10) as client:
                async with client.stream("GET", url, headers=sent) as r:
                    return [
                        line[6:]
                        async for line in r.aiter_lines()
                        if line.startswith("data: {")
                    ]

        resumed = yield in_thread(resume)
        answer = json.loads(resumed[-1])
        self.assertEqual(answer["id"], 3)
        self.assertEqual(answer["result"]["structuredContent"]["stdout"], "b\n")


class SlowJsonCallTests(McpTestCase):
    """A call still running after a moment is answered as SSE."""

    _session_headers = TransportTests._session_headers

    @inlineCallbacks
    def test_docs_client_survives_a_long_call(self) -> Any:
        """
        The docs' client (httpx's 5 s read timeout) waits out a shell call
        of 7 s: the answer turns into SSE with keep-alive comments.
        """

        async def work() -> Any:
            async with httpx2.AsyncClient() as http:
                transport = streamable_http_client(self.mcp_url, http_client=http)
                async with Client(transport) as client:
                    return await client.call_tool(
                        "shell", {"command": "sleep 7; echo done"}
                    )

        result = yield in_thread(work, 20)
        self.assertEqual(result.structured_content["stdout"], "done\n")

    @inlineCallbacks
    def test_quick_call_stays_json(self) -> Any:
        """A call answered at once is one JSON body, as before."""
        opened = yield self.initialize()
        answer = yield self.http(
            "POST",
            _call(2, "shell", {"command": "echo hi"}),
            self._session_headers(opened),
        )
        self.assertTrue(answer.headers["content-type"].startswith("application/json"))
        self.assertEqual(answer.json()["result"]["structuredContent"]["stdout"], "hi\n")


#: A command printing 5 MB between two marks.
BIG_OUTPUT = "printf START; head -c 5000000 /dev/zero | tr '\\0' x; printf END"


class ResultBoundTests(McpTestCase):
    """Every tool result fits one message of the SDK's, its cut said in its text."""

    @inlineCallbacks
    def test_shell_result_is_bounded(self) -> Any:
        """
        shell printing 5 MB answers well under 1 MiB: the output's head
        and tail, truncated said in the structure and in the text.
        """

        async def body(client: Any) -> Any:
            return await client.call_tool("shell", {"command": BIG_OUTPUT})

        result = yield self.with_client(body)
        out = result.structured_content
        size = len(json.dumps(out)) + len(result.content[0].text)
        self.assertLess(size, 1024 * 1024)
        self.assertTrue(out["truncated"])
        self.assertTrue(out["stdout"].startswith("START"))
        self.assertTrue(out["stdout"].endswith("END"))
        self.assertIn("[truncated", result.content[0].text)
        self.assertTrue(result.content[0].text.startswith("START"))

    @inlineCallbacks
    def test_stream_cut_lands_near_the_bound(self) -> Any:
        """
        shell_stream printing 5 MB keeps about as much as one result can
        carry (not a quarter of it), head and tail, and its text says so.
        """

        async def body(client: Any) -> Any:
            return await client.call_tool(
                "shell_stream", {"command": BIG_OUTPUT + "; echo"}
            )

        result = yield self.with_client(body)
        stdout = result.structured_content["stdout"]
        self.assertGreater(len(stdout), 400_000)
        self.assertTrue(stdout.startswith("START"))
        self.assertTrue(stdout.endswith("END\n"))
        self.assertIn("[truncated", result.content[0].text)

    @inlineCallbacks
    def test_stream_timeout_said_in_text(self) -> Any:
        """A stream that timed out says why in the text a model reads."""

        async def body(client: Any) -> Any:
            return await client.call_tool(
                "shell_stream", {"command": "echo start; sleep 5", "timeout": 1}
            )

        result = yield self.with_client(body)
        self.assertTrue(result.is_error)
        text = result.content[0].text
        self.assertIn("timed out", text)
        self.assertIn("[timeout", text)

    @inlineCallbacks
    def test_progress_keeps_newlines_and_names_stderr(self) -> Any:
        """
        The progress messages, joined, are the output as printed, stderr's
        after a [stderr] line.
        """
        seen: list[str] = []

        async def progress(done: float, total: Any, message: str | None) -> None:
            seen.append(message or "")

        command = (
            "printf 'a\\nb\\n'; sleep 0.2; printf c; sleep 0.2; printf 'd\\n\\n\\n';"
            " sleep 0.2; printf 'E\\n' >&2; sleep 0.2; printf 'x  \\n'"
        )

        async def follow(client: Any) -> Any:
            started = await client.call_tool("process_start", {"command": command})
            return await client.call_tool(
                "process_output",
                {"pid": started.structured_content["pid"], "follow": True},
                progress_callback=progress,
            )

        yield self.with_client(follow)
        self.assertEqual("".join(seen), "a\nb\ncd\n\n\n[stderr]\nE\n[stdout]\nx  \n")


class InternalFailureTests(McpTestCase):
    """A call that fails inside the server says so."""

    _session_headers = TransportTests._session_headers

    @inlineCallbacks
    def test_failure_is_not_called_a_cancel(self) -> Any:
        """
        A call whose answer fails outside its handler (here, its audit
        line) is a JSON-RPC internal error, logged: not "cancelled",
        which would blame the client.
        """
        from sandboxd.mcp import calls

        real = calls.gate.audit

        def broken(*args: Any, **kwargs: Any) -> None:
            if (kwargs.get("extra") or {}).get("tool"):
                raise RuntimeError("audit broke")
            real(*args, **kwargs)

        self.patch(calls.gate, "audit", broken)
        opened = yield self.initialize()
        answer = yield self.http(
            "POST",
            _call(2, "files_list", {"path": "."}),
            self._session_headers(opened),
        )
        self.assertEqual(answer.json()["error"]["code"], -32603)
        self.assertEqual(len(self.flushLoggedErrors(RuntimeError)), 1)
