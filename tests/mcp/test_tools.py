"""
Tools generated from the endpoint table (SPEC §17): names, schemas,
annotations, what is left out, the argument check, and how answers become
tool results.
"""

from __future__ import annotations

import base64
import json
from typing import Any

from twisted.trial.unittest import SynchronousTestCase

from sandboxd.api.schema import schema_for
from sandboxd.commands import CommandRegistry
from sandboxd.endpoints import DOOR_METHODS
from sandboxd.errors import missing_scope
from sandboxd.mcp.calls import CollectingChannel, error_result, value_result
from sandboxd.mcp.protocol import commands_note
from sandboxd.mcp.tools import DEFAULT_SHELL, NOT_TOOLS, ArgumentError, Toolbox, check
from sandboxd.routes import builtin_table


class ToolboxTests(SynchronousTestCase):
    """The table's endpoints as tools."""

    def setUp(self) -> None:
        self.table = builtin_table()
        self.box = Toolbox(self.table)

    def tool(self, name: str) -> Any:
        tool = self.box.get(name)
        assert tool is not None
        return tool

    def test_every_endpoint_is_a_tool_or_has_a_reason(self) -> None:
        """
        Each implemented endpoint is a tool, unless NOT_TOOLS says why not
        or it is the ``/v1`` door's (OpenAI's shapes of the agents routes).
        """
        for endpoint in self.table:
            if (
                not endpoint.implemented
                or endpoint.method in DOOR_METHODS
                or endpoint.door == "openai"
            ):
                self.assertNotIn(endpoint.id, self.box.tools)
                continue
            if endpoint.id in NOT_TOOLS:
                self.assertNotIn(endpoint.id, self.box.tools)
            else:
                self.assertIn(endpoint.id, self.box.tools, endpoint.id)
        for name in NOT_TOOLS:
            self.assertIn(name, self.table)

    def test_custom_routes(self) -> None:
        """A named custom route is a tool; one named ``"GET /path"`` cannot be."""
        table = builtin_table()
        table.register("GET", "/hello", lambda r: {"hi": 1}, name="hello")
        table.register("GET", "/anon", lambda r: {})
        box = Toolbox(table)
        self.assertIn("hello", box.tools)
        self.assertNotIn("GET /anon", box.tools)
        self.assertEqual(
            box.tools["hello"].descriptor["inputSchema"]["additionalProperties"], True
        )

    def test_template_route_path_parameters_are_its_own(self) -> None:
        """
        A template route's {name}, {id} or {pid} is described as part of
        its path, as a string: not as the built-in routes' parameters.
        """
        table = builtin_table()
        table.register("GET", "/hello/{name}/{pid}", lambda r: {}, name="hello")
        properties = (
            Toolbox(table).tools["hello"].descriptor["inputSchema"]["properties"]
        )
        self.assertEqual(
            properties["name"],
            {"type": "string", "description": "the {name} part of /hello/{name}/{pid}"},
        )
        self.assertEqual(properties["pid"]["type"], "string")

    def test_descriptions_speak_mcp(self) -> None:
        """
        No tool's title, description or argument speaks of HTTP statuses or
        SSE (a call runs to its end); every argument has a type, and the
        file tools' arguments say what they are.
        """
        for name, tool in self.box.tools.items():
            d = tool.descriptor
            texts = [d["title"], d["description"]] + [
                spec.get("description", "")
                for spec in d["inputSchema"]["properties"].values()
            ]
            for text in texts:
                self.assertNotRegex(text, r"\b(202|SSE)\b", name)
            for arg, spec in d["inputSchema"]["properties"].items():
                self.assertIn("type", spec, f"{name}.{arg}")
        for name, arg in (
            ("download", "path"),
            ("upload", "path"),
            ("upload", "content_base64"),
            ("files_move", "source"),
            ("files_move", "destination"),
            ("files_edit", "new_text"),
        ):
            spec = self.tool(name).descriptor["inputSchema"]["properties"][arg]
            self.assertIn("description", spec, f"{name}.{arg}")
        self.assertEqual(self.tool("download").descriptor["title"], "Read a file")

    def test_no_stdin_a_model_cannot_answer(self) -> None:
        """
        code_execute does not offer allow_stdin: input() would wait for an
        answer a model waiting for the call's result cannot send.
        """
        schema = self.tool("code_execute").descriptor["inputSchema"]
        self.assertNotIn("allow_stdin", schema["properties"])

    def test_union_types_checked(self) -> None:
        """An argument of two types takes either, and nothing else."""
        schema = self.tool("process_signal").descriptor["inputSchema"]
        check(schema, {"pid": 5, "signal": "TERM"})
        check(schema, {"pid": 5, "signal": 15})
        with self.assertRaises(ArgumentError) as caught:
            check(schema, {"pid": 5, "signal": [15]})
        self.assertIn("string or integer", str(caught.exception))

    def test_descriptor_from_the_schema(self) -> None:
        """Name, title, description and schemas come from the table and schema."""
        stat = self.tool("files_stat").descriptor
        self.assertEqual(stat["name"], "files_stat")
        self.assertEqual(stat["title"], "Describe one path")
        self.assertTrue(stat["description"].startswith("Describe one path"))
        declared = {f.name for f in schema_for("files_stat").query}
        self.assertEqual(set(stat["inputSchema"]["properties"]), declared)
        self.assertFalse(stat["inputSchema"]["additionalProperties"])
        self.assertEqual(
            set(stat["outputSchema"]["properties"]),
            {f.name for f in schema_for("files_stat").response},
        )

    def test_path_parameters_are_required_inputs(self) -> None:
        """``{pid}`` becomes a required argument, with query and body fields."""
        signal = self.tool("process_signal").descriptor["inputSchema"]
        self.assertIn("pid", signal["required"])
        self.assertEqual(signal["properties"]["pid"]["type"], "integer")
        self.assertIn("signal", signal["properties"])

    def test_output_accepts_null(self) -> None:
        """Output fields accept null, as several are until known (exit_code)."""
        get = self.tool("process_detail").descriptor["outputSchema"]
        self.assertEqual(get["properties"]["exit_code"]["type"], ["integer", "null"])
        self.assertNotIn("required", get)

    def test_annotations(self) -> None:
        """readOnly for GET; destructive, idempotent and open-world as declared."""

        def hints(name: str) -> dict[str, Any]:
            # MCP's defaults for the hints a tool leaves out.
            defaults = {
                "readOnlyHint": False,
                "destructiveHint": True,
                "idempotentHint": False,
                "openWorldHint": True,
            }
            return {**defaults, **self.tool(name).descriptor["annotations"]}

        self.assertTrue(hints("files_list")["readOnlyHint"])
        self.assertTrue(hints("files_list")["idempotentHint"])
        for name in ("files_delete", "files_move", "process_signal", "env_set"):
            self.assertTrue(hints(name)["destructiveHint"], name)
            self.assertFalse(hints(name)["readOnlyHint"])
        self.assertFalse(hints("shell")["idempotentHint"])
        self.assertTrue(hints("files_delete")["idempotentHint"])
        self.assertTrue(hints("browser_navigate")["openWorldHint"])
        self.assertFalse(hints("files_list")["openWorldHint"])

    def test_annotations_truthful(self) -> None:
        """
        Tools that run commands can change anything and reach the network;
        tools that write given content can replace files; POSTs that only
        answer a question are read-only.
        """

        def hints(name: str) -> dict[str, Any]:
            # MCP's defaults for the hints a tool leaves out.
            defaults = {
                "readOnlyHint": False,
                "destructiveHint": True,
                "idempotentHint": False,
                "openWorldHint": True,
            }
            return {**defaults, **self.tool(name).descriptor["annotations"]}

        for name in (
            "shell",
            "shell_stream",
            "process_start",
            "run_command",
            "code_execute",
            "code_execution_input",
        ):
            self.assertTrue(hints(name)["destructiveHint"], name)
            self.assertTrue(hints(name)["openWorldHint"], name)
        for name in ("code_context_delete", "code_context_restart"):
            # A context's state (its variables, imports) is lost.
            self.assertTrue(hints(name)["destructiveHint"], name)
        for name in ("upload", "files_upload_stream", "files_extract"):
            self.assertTrue(hints(name)["destructiveHint"], name)
            self.assertFalse(hints(name)["readOnlyHint"], name)
        for name in (
            "files_search",
            "files_grep",
            "files_archive",
            "capabilities_check",
        ):
            self.assertTrue(hints(name)["readOnlyHint"], name)
            self.assertNotIn(
                "destructiveHint", self.tool(name).descriptor["annotations"]
            )
            self.assertFalse(hints(name)["openWorldHint"], name)

    def test_browser_annotations(self) -> None:
        """
        browser_console empties the buffer it reads: not read-only, not
        idempotent (a retry gets nothing), not destructive; evaluate runs
        any script (destructive, open world); click and type can submit
        forms to the web (open world).
        """
        console = self.tool("browser_console").descriptor["annotations"]
        self.assertEqual(
            console,
            {**console, "openWorldHint": False, "destructiveHint": False},
        )
        self.assertNotIn("readOnlyHint", console)
        self.assertNotIn("idempotentHint", console)
        evaluate = self.tool("browser_evaluate").descriptor["annotations"]
        self.assertTrue(evaluate["destructiveHint"])
        self.assertTrue(evaluate["openWorldHint"])
        for name in ("browser_click", "browser_type"):
            self.assertTrue(
                self.tool(name).descriptor["annotations"]["openWorldHint"], name
            )

    def test_follow_dropped_where_it_never_ends(self) -> None:
        """Agent event logs are paged: their follow argument is not offered."""
        events = self.tool("agents_events").descriptor["inputSchema"]
        self.assertNotIn("follow", events["properties"])
        output = self.tool("process_output").descriptor["inputSchema"]
        self.assertIn("follow", output["properties"])

    def test_split(self) -> None:
        """Arguments go back to path, query (as HTTP strings) and body."""
        path, query, body = self.tool("process_output").split(
            {"pid": 12, "follow": True, "after": 3}
        )
        self.assertEqual(path, {"pid": "12"})
        self.assertEqual(query, {"follow": "true", "after": "3"})
        self.assertEqual(body, {})
        path, query, body = self.tool("shell").split({"command": "ls", "timeout": 5})
        self.assertEqual((path, query), ({}, {}))
        self.assertEqual(body, {"command": "ls", "timeout": 5, "shell": DEFAULT_SHELL})

    def test_shell_by_default_argv_on_request(self) -> None:
        """
        A model's command runs through a shell unless it says otherwise;
        argv runs a program with no shell; neither or both is an argument
        error.
        """
        for name in ("shell", "shell_stream", "process_start"):
            tool = self.tool(name)
            _, _, body = tool.split({"command": "cd x && ls"})
            self.assertEqual(body["shell"], DEFAULT_SHELL)
            _, _, body = tool.split({"command": "ls", "shell": "sh"})
            self.assertEqual(body["shell"], "sh")
            _, _, body = tool.split({"argv": ["printf", "%s", "a b"]})
            self.assertEqual(body, {"command": "printf %s 'a b'"})
            for bad in ({}, {"command": "ls", "argv": ["ls"]}, {"argv": []}):
                with self.assertRaises(ArgumentError):
                    tool.split(bad)
            self.assertNotIn("required", tool.descriptor["inputSchema"])

    def test_text_writes(self) -> None:
        """upload takes text as content (UTF-8), or bytes as content_base64."""
        tool = self.tool("upload")
        _, _, body = tool.split({"path": "a.txt", "content": "héllo\n"})
        self.assertEqual(body, {"path": "a.txt", "content_base64": "aMOpbGxvCg=="})
        _, _, body = tool.split({"path": "a.bin", "content_base64": "AA=="})
        self.assertEqual(body["content_base64"], "AA==")
        for bad in (
            {"path": "a"},
            {"path": "a", "content": "x", "content_base64": "AA=="},
        ):
            with self.assertRaises(ArgumentError):
                tool.split(bad)
        self.assertEqual(tool.descriptor["inputSchema"]["required"], ["path"])

    def test_open_body_takes_any_argument(self) -> None:
        """run_command's arguments are free-form."""
        _, _, body = self.tool("run_command").split({"name": "x", "anything": [1]})
        self.assertEqual(body, {"anything": [1]})


class CommandsNoteTests(SynchronousTestCase):
    """run_command's listing of the caller's commands stays within its bound."""

    def test_bounded(self) -> None:
        """
        Commands past the budget are counted, not listed, so a template
        with many commands cannot swell every model's tools/list.
        """
        registry = CommandRegistry()
        for i in range(200):
            registry.register(
                lambda who="x": who, name=f"command_{i:03}", description="Does a thing."
            )
        cmds = sorted(registry, key=lambda c: c.name)
        note = commands_note(cmds, 1200)
        self.assertLess(len(note), 1300)
        self.assertTrue(note.startswith('command_000(who: string = "x"): Does a thing'))
        self.assertRegex(note, r"; and 1\d\d more \(list_commands lists them all\)$")


class CheckTests(SynchronousTestCase):
    """The argument check names what is wrong."""

    schema = {
        "type": "object",
        "properties": {
            "path": {"type": "string"},
            "depth": {"type": "integer"},
            "ratio": {"type": "number"},
            "kind": {"type": "string", "enum": ["a", "b"]},
            "paths": {"type": "array", "items": {"type": "string"}},
            "flag": {"type": "boolean"},
        },
        "required": ["path"],
        "additionalProperties": False,
    }

    def refused(self, arguments: dict[str, Any]) -> str:
        with self.assertRaises(ArgumentError) as caught:
            check(self.schema, arguments)
        return str(caught.exception)

    def test_good(self) -> None:
        """Matching arguments pass (an integer is a number; null is absent)."""
        check(self.schema, {"path": "x", "depth": 2, "ratio": 1, "kind": None})

    def test_bad(self) -> None:
        """Each mismatch is refused with the argument's name."""
        self.assertIn("'path'", self.refused({}))
        self.assertIn("'depth'", self.refused({"path": "x", "depth": "2"}))
        self.assertIn("'depth'", self.refused({"path": "x", "depth": True}))
        self.assertIn("'flag'", self.refused({"path": "x", "flag": 1}))
        self.assertIn("'kind'", self.refused({"path": "x", "kind": "c"}))
        self.assertIn("'paths'", self.refused({"path": "x", "paths": [1]}))
        self.assertIn("'nope'", self.refused({"path": "x", "nope": 1}))


class ResultTests(SynchronousTestCase):
    """Handler answers as tool results."""

    def setUp(self) -> None:
        self.box = Toolbox(builtin_table())

    def test_screenshot_is_image_content(self) -> None:
        """browser_screenshot answers with MCP image content."""
        tool = self.box.get("browser_screenshot")
        assert tool is not None
        png = base64.b64encode(b"\x89PNG....").decode()
        result = value_result(tool, {"image_base64": png, "width": 2, "height": 3})
        self.assertEqual(
            result["content"], [{"type": "image", "data": png, "mimeType": "image/png"}]
        )
        self.assertEqual(result["structuredContent"]["width"], 2)
        self.assertNotIn("image_base64", result["structuredContent"])

    def test_screenshot_too_big_is_refused_with_a_hint(self) -> None:
        """
        A full page's screenshot taller than a model takes, or bigger than
        one result carries, is a 413 saying how to take one that fits.
        """
        from sandboxd.errors import ApiError

        tool = self.box.get("browser_screenshot")
        assert tool is not None
        small = base64.b64encode(b"\x89PNG....").decode()
        big = base64.b64encode(b"\x89PNG" + b"\x00" * 2_000_000).decode()
        for image, height in ((small, 211852), (big, 800)):
            with self.assertRaises(ApiError) as caught:
                value_result(
                    tool, {"image_base64": image, "width": 1280, "height": height}
                )
            self.assertEqual(caught.exception.status, 413)
            self.assertIn("full_page: false", caught.exception.message)
            self.assertIn(f"1280x{height}", caught.exception.message)

    def test_browser_answers_fit_one_result(self) -> None:
        """
        A page's content of 3 MB (quotes, escaped twice in the message) is
        cut to fit one tool result, with ``truncated`` and the ``next_offset``
        to read on from; a console read leaves out its oldest entries and
        counts them; a script's result too big is a 413.
        """
        from sandboxd.errors import ApiError
        from sandboxd.policy.defaults import MCP_RESULT_JSON_BYTES

        tool = self.box.get("browser_content")
        assert tool is not None
        page = '<a href="x">é</a>' * 200000
        result = value_result(
            tool,
            {
                "content": page,
                "url": "http://example.com/",
                "title": "t",
                "total_bytes": len(page.encode()),
                "offset": 10,
                "truncated": False,
            },
        )
        self.assertLessEqual(len(json.dumps(result)), MCP_RESULT_JSON_BYTES)
        structured = result["structuredContent"]
        self.assertTrue(structured["truncated"])
        self.assertTrue(page.startswith(structured["content"]))
        self.assertGreater(len(structured["content"]), 100000)
        self.assertEqual(
            structured["next_offset"], 10 + len(structured["content"].encode())
        )
        self.assertIn('"next_offset"', result["content"][0]["text"])

        tool = self.box.get("browser_console")
        assert tool is not None
        logs = [{"type": "log", "text": f"{i}" + '"' * 16000} for i in range(100)]
        result = value_result(tool, {"logs": logs})
        self.assertLessEqual(len(json.dumps(result)), MCP_RESULT_JSON_BYTES)
        kept = result["structuredContent"]["logs"]
        self.assertEqual(kept[-1]["text"][:2], "99")
        self.assertEqual(result["structuredContent"]["dropped"], 100 - len(kept))

        tool = self.box.get("browser_evaluate")
        assert tool is not None
        with self.assertRaises(ApiError) as caught:
            value_result(tool, {"result": "x" * MCP_RESULT_JSON_BYTES})
        self.assertEqual(caught.exception.status, 413)

    def text_of(self, name: str, value: dict[str, Any]) -> str:
        tool = self.box.get(name)
        assert tool is not None
        result = value_result(tool, value)
        self.assertEqual(result["structuredContent"], value)
        [content] = result["content"]
        return str(content["text"])

    def test_text_answers_are_text(self) -> None:
        """
        A diff, a commit, a script's run and a page of a process's output
        are shown as the text they hold (the patch, git show's layout, the
        output), not one JSON string of escaped newlines.
        """
        diff = "diff --git a/x b/x\n@@ -1 +1,2 @@\n small\n+changed\n"
        stats = {"files_changed": 1, "insertions": 1, "deletions": 0}
        self.assertEqual(
            self.text_of("git_diff", {"diff": diff, "stats": stats}),
            diff + "[1 files changed, +1 -0]",
        )
        shown = self.text_of(
            "git_show",
            {
                "commit": "abc123",
                "parents": ["p1"],
                "author": {"name": "A", "email": "a@x", "time": 0},
                "committer": {"name": "A", "email": "a@x", "time": 0},
                "subject": "Fix it",
                "body": "Why.\n",
                "diff": diff,
                "truncated": False,
            },
        )
        self.assertEqual(
            shown,
            "commit abc123\nAuthor: A <a@x>\n\n    Fix it\n    \n    Why.\n\n" + diff,
        )
        run = {
            "stdout": "The Zen\n",
            "stderr": "warn\n",
            "exit_code": 0,
            "language": "python",
            "execution_time_ms": 3.0,
        }
        self.assertEqual(
            self.text_of("code_run", run), "The Zen\n\n[stderr]\nwarn\n\n[exit_code 0]"
        )
        page = {
            "pid": 7,
            "state": "running",
            "exit_code": None,
            "timed_out": False,
            "events": [
                {"seq": 1, "stream": "stdout", "data": "ready\n"},
                {"seq": 2, "stream": "stderr", "data": "GET /"},
                {"seq": 3, "stream": "stdout", "data": "done\n"},
            ],
            "next": 3,
            "dropped": False,
            "dropped_bytes": 0,
        }
        self.assertEqual(
            self.text_of("process_output", page),
            "ready\n[stderr]\nGET /\n[stdout]\ndone\n[running]\n[next: 3]",
        )

    def test_text_file_read_is_text(self) -> None:
        """A text file read shows the text; a binary one the JSON."""
        tool = self.box.get("download")
        assert tool is not None
        text = value_result(
            tool, {"path": "/a", "content_base64": base64.b64encode(b"hi\n").decode()}
        )
        self.assertEqual(text["content"], [{"type": "text", "text": "hi\n"}])
        blob = value_result(
            tool, {"path": "/b", "content_base64": base64.b64encode(b"\xff").decode()}
        )
        self.assertIn("content_base64", blob["content"][0]["text"])

    def test_raw_text_answer(self) -> None:
        """A raw text answer (Prometheus metrics) is text content."""
        from sandboxd.mcp.calls import raw_result
        from sandboxd.web.messages import ServerResponse

        result = raw_result(
            ServerResponse(200, raw=b"up 1\n", headers={"content-type": "text/plain"})
        )
        self.assertEqual(result["content"], [{"type": "text", "text": "up 1\n"}])
        self.assertEqual(result["structuredContent"]["bytes"], 5)

    def test_refusal(self) -> None:
        """A refusal is isError with the §6 code, rule and status."""
        result = error_result(missing_scope("shell", "process:run", "endpoint:shell"))
        self.assertTrue(result["isError"])
        self.assertEqual(result["structuredContent"]["code"], "missing_scope")
        self.assertEqual(result["structuredContent"]["rule"], "endpoint:shell")
        self.assertEqual(result["structuredContent"]["status"], 403)


class CollectingChannelTests(SynchronousTestCase):
    """An SSE handler's frames read back into one result."""

    def test_lines_progress_and_exit(self) -> None:
        """
        Line events join with newlines; progress gets each line as printed
        (its newline kept) and its stream, and counts bytes.
        """
        seen: list[tuple[str, int, str]] = []
        channel = CollectingChannel(lambda m, n, s: seen.append((m, n, s)))
        channel.write_raw(b'event: stdout\ndata: {"data": "one"}\n\nevent: std')
        channel.write_raw(b'err\ndata: {"data": "two"}\n\n: keep-alive\n\n')
        channel.send("exit", {"exit_code": 3})
        channel.close()
        result = channel.result()
        self.assertEqual(seen, [("one\n", 4, "stdout"), ("two\n", 8, "stderr")])
        self.assertEqual(result["structuredContent"]["stdout"], "one\n")
        self.assertEqual(result["structuredContent"]["stderr"], "two\n")
        self.assertEqual(result["structuredContent"]["exit_code"], 3)
        self.assertFalse(result["isError"])

    def test_cap(self) -> None:
        """
        Output past the cap is counted, not kept: its head and its latest
        lines are, the bytes between them named, and it is marked truncated.
        """
        channel = CollectingChannel(None, cap=8)
        for n in range(4):
            channel.send("stdout", {"data": f"ab{n}"})
        result = channel.result()
        structured = result["structuredContent"]
        self.assertEqual(
            structured["stdout"], "ab0\n\n[... 8 bytes left out ...]\nab3\n"
        )
        self.assertTrue(structured["truncated"])
        self.assertEqual(channel.seen, 16)
        self.assertIn("[truncated", result["content"][0]["text"])

    def test_disconnect_runs_callbacks(self) -> None:
        """A cancelled call disconnects: the handler's callbacks run once."""
        channel = CollectingChannel(None)
        calls: list[int] = []
        channel.on_disconnect(lambda: calls.append(1))
        channel.disconnect()
        channel.disconnect()
        self.assertEqual(calls, [1])
        self.assertTrue(channel.client_gone)
        self.assertTrue(channel.done.called)
