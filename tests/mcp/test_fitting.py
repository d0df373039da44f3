"""Tool results cut to fit one MCP message, near the bound rather than far under it."""

from __future__ import annotations

import base64
from typing import Any

from twisted.trial.unittest import SynchronousTestCase

from sandboxd.errors import ApiError
from sandboxd.mcp.fitting import fitted, head_and_tail, result_size

BOUND = 100_000


def _build(pieces: dict[str, Any], cut: bool) -> dict[str, Any]:
    structured = {**pieces, "truncated": True} if cut else pieces
    return {
        "content": [{"type": "text", "text": str(structured.get("stdout", ""))}],
        "structuredContent": structured,
    }


class FittedTests(SynchronousTestCase):
    """:func:`fitted`."""

    def test_small_result_untouched(self) -> None:
        """A result under the bound is built once, as it is."""
        out = fitted(_build, {"stdout": "hi"}, BOUND)
        self.assertEqual(out["structuredContent"], {"stdout": "hi"})

    def test_cut_lands_near_the_bound_head_and_tail_kept(self) -> None:
        """
        Text five times the bound is cut to its head and tail, the result
        just under the bound (not a half or a quarter of it), saying so.
        """
        text = "START" + "x" * (5 * BOUND) + "END"
        out = fitted(_build, {"stdout": text}, BOUND)
        size = result_size(out)
        self.assertLessEqual(size, BOUND)
        self.assertGreater(size, 0.9 * BOUND)
        stdout = out["structuredContent"]["stdout"]
        self.assertTrue(stdout.startswith("START"))
        self.assertTrue(stdout.endswith("END"))
        self.assertIn("characters left out", stdout)
        self.assertTrue(out["structuredContent"]["truncated"])

    def test_escapes_counted(self) -> None:
        """Text whose JSON is six times its length still fits."""
        text = "\x01" * (BOUND // 2)
        out = fitted(_build, {"stdout": text}, BOUND)
        self.assertLessEqual(result_size(out), BOUND)
        self.assertGreater(result_size(out), 0.8 * BOUND)

    def test_lists_keep_their_first_items(self) -> None:
        """A list is cut to its first items."""
        items = [{"line": n, "text": "y" * 100} for n in range(5000)]
        out = fitted(_build, {"matches": items}, BOUND)
        kept = out["structuredContent"]["matches"]
        self.assertEqual(kept, items[: len(kept)])
        self.assertLessEqual(result_size(out), BOUND)
        self.assertGreater(len(kept), 500)

    def test_base64_keeps_whole_bytes(self) -> None:
        """base64 data is cut to its first bytes, still valid base64."""
        raw = bytes(range(256)) * 2000
        data = base64.b64encode(raw).decode()
        out = fitted(_build, {"content_base64": data}, BOUND)
        kept = base64.b64decode(out["structuredContent"]["content_base64"])
        self.assertEqual(kept, raw[: len(kept)])
        self.assertLessEqual(result_size(out), BOUND)

    def test_no_piece_to_cut(self) -> None:
        """When the bulk is nothing it can cut, the answer is a 413."""

        def build(pieces: dict[str, Any], cut: bool) -> dict[str, Any]:
            return {"padding": "z" * (2 * BOUND), **pieces}

        with self.assertRaises(ApiError) as caught:
            fitted(build, {"n": 1}, BOUND)
        self.assertEqual(caught.exception.status, 413)

    def test_head_and_tail(self) -> None:
        """The mark says how many characters were left out."""
        self.assertEqual(head_and_tail("abcdef", 10), "abcdef")
        self.assertEqual(
            head_and_tail("abcdefgh", 4), "ab\n[... 4 characters left out ...]\ngh"
        )
