"""
Awkward but legitimate output through the MCP door, as the official
``mcp`` SDK shows it: whole characters where the output was cut or read
in pieces, and no output counted as dropped that was not.
"""

from __future__ import annotations

import os
from typing import Any

from twisted.internet.defer import inlineCallbacks

from sandboxd.policy.defaults import MAX_LINE_BYTES
from tests.mcp.helpers import McpTestCase

#: More three-byte characters than a line's bound holds, in two writes (the
#: line is cut before its end is read; the bound is not a multiple of 3).
LONG_LINE_CHARS = MAX_LINE_BYTES // 3 + 2000
LONG_LINE = (
    'python3 -c "import sys, time; w = sys.stdout.buffer;'
    f" w.write(b'\\xe2\\x82\\xac' * {LONG_LINE_CHARS}); w.flush(); time.sleep(0.3);"
    " w.write(b'\\xe2\\x82\\xac' * 100 + b'\\n')\""
)

#: A 4-byte character whose first two bytes are read before the rest.
SPLIT_CHARACTER = "bash -c \"printf '\\360\\237'; sleep 0.3; printf '\\230\\200z\\n'\""


class OutputTests(McpTestCase):
    """``shell_stream`` and ``process_output`` with output read in pieces."""

    @inlineCallbacks
    def test_long_line_and_split_character(self) -> Any:
        """
        A line past the stream's bound comes back without a replacement
        character (cut between characters); a background process's
        character read in two reads is whole, nothing reported dropped.
        """

        async def body(client: Any) -> Any:
            long = await client.call_tool("shell_stream", {"command": LONG_LINE})
            started = await client.call_tool(
                "process_start", {"command": SPLIT_CHARACTER}
            )
            pid = started.structured_content["pid"]
            await client.call_tool("process_output", {"pid": pid, "follow": True})
            page = await client.call_tool("process_output", {"pid": pid, "after": 0})
            return long, page

        long, page = yield self.with_client(body)
        stdout = long.structured_content["stdout"]
        self.assertNotIn("\ufffd", stdout)
        # The pieces the line was sent in are joined again: the output as printed.
        self.assertEqual(stdout, "\u20ac" * (LONG_LINE_CHARS + 100) + "\n")
        content = page.structured_content
        self.assertEqual([e["data"] for e in content["events"]], ["\U0001f600z\n"])
        self.assertEqual((content["dropped"], content["dropped_bytes"]), (False, 0))

    @inlineCallbacks
    def test_output_as_printed_and_within_the_sdk_bound(self) -> Any:
        """
        Output without a last newline comes back without one; output too
        large for one message of the SDK's (1 MiB) comes back cut to fit,
        its start kept and ``truncated`` said, rather than the SDK failing.
        """

        async def body(client: Any) -> Any:
            bare = await client.call_tool(
                "shell_stream", {"command": "printf 'a%.0s' $(seq 70000)"}
            )
            big = await client.call_tool(
                "shell_stream",
                {
                    "command": "python3 -c \"print(('x' * 99 + '\\\\n') * 9000, end='')\""
                },
            )
            return bare, big

        bare, big = yield self.with_client(body)
        self.assertEqual(bare.structured_content["stdout"], "a" * 70000)
        content = big.structured_content
        self.assertTrue(content["truncated"])
        self.assertTrue(content["stdout"].startswith("x" * 99 + "\n"))
        self.assertLess(len(content["stdout"]), 900_000)


class BigReadTests(McpTestCase):
    """``download`` and ``resources/read`` of a text file over one result."""

    def _big(self) -> list[str]:
        lines = [f"x{n} = {n}\n" for n in range(1, 200_001)]
        with open(os.path.join(self.base_dir, "big.py"), "w") as f:
            f.write("".join(lines))
        with open(os.path.join(self.base_dir, "small.txt"), "w") as f:
            f.write("one\ntwo\n")
        return lines

    def _check_part(self, lines: list[str], text: str, got: dict[str, Any]) -> None:
        # Whole lines, as many as the counts say, and the next offset the
        # line after the last one given.
        self.assertTrue(text.endswith("\n"))
        given = text.count("\n")
        self.assertEqual(text, "".join(lines[:given]))
        self.assertLess(given, len(lines))
        self.assertEqual(got["lines"], given)
        self.assertEqual(got["next_offset"], given + 1)
        self.assertEqual(got["total_lines"], len(lines))
        self.assertTrue(got["more"])
        self.assertTrue(got["truncated"])

    @inlineCallbacks
    def test_cut_at_a_line_end_and_counted(self) -> Any:
        """
        A text file too big for one result is cut at the end of a line;
        ``lines`` counts the lines given, ``next_offset`` and the note name
        the line to read on from (with a range and without one), and the
        bytes are not sent again as base64; ``resources/read`` says it is
        a part, in ``_meta`` and in a note.  An offset past the end says so.
        """
        lines = self._big()

        async def body(client: Any) -> Any:
            ranged = await client.call_tool(
                "download", {"path": "big.py", "offset": 1, "limit": 100_000}
            )
            whole = await client.call_tool("download", {"path": "big.py"})
            resource = await client.read_resource(f"file://{self.base_dir}/big.py")
            past = await client.call_tool(
                "download", {"path": "small.txt", "offset": 100}
            )
            return ranged, whole, resource, past

        ranged, whole, resource, past = yield self.with_client(body)
        for got in (ranged, whole):
            self.assertFalse(got.is_error, got)
            structured = got.structured_content
            self._check_part(lines, got.content[0].text, structured)
            self.assertNotIn("content_base64", structured)
            self.assertIn(
                f"read on with offset {structured['next_offset']}",
                got.content[1].text,
            )
        part = resource.contents[0]
        meta = part.meta
        assert meta is not None
        self._check_part(lines, part.text, {**meta, "more": True})
        self.assertIn(f"offset {meta['next_offset']}", resource.contents[1].text)
        self.assertEqual(past.content[0].text, "")
        self.assertIn("past the end", past.content[1].text)
        self.assertIn("2 lines", past.content[1].text)
