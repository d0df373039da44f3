"""
A result document read with its big output strings taken without the
JSON parser gives exactly what ``json.loads`` gives, for every output the
daemon can send and for documents the short way must leave to the parser.
"""

from __future__ import annotations

import json
from typing import Any

from twisted.python.monkey import MonkeyPatcher
from twisted.trial.unittest import SynchronousTestCase

from sandboxd.client import _resultjson
from sandboxd.client._resultjson import BIG_RESULT_BYTES, FEW_ESCAPES, loads_result
from tests.kernels.test_output import BAD, TEXTS, known_output

BIG = "x" * BIG_RESULT_BYTES


def result(stdout: str, stderr: str = "", **extra: Any) -> dict[str, Any]:
    """A result document in the daemon's field order."""
    return {
        "execution_id": "x_0123456789abcdef",
        "context_id": "c_0123",
        "state": "ok",
        "started": True,
        "execution_count": 4,
        "stdout": stdout,
        "stderr": stderr,
        "results": [{"data": {"text/plain": "2"}, "metadata": {}}],
        "error": None,
        "duration_ms": 12.5,
        "truncated": False,
        "dropped_bytes": 0,
        "events_url": "/code/contexts/c_0123/executions/x_0123456789abcdef/events",
        **extra,
    }


def compact(value: Any, ascii_only: bool = False) -> bytes:
    """The API's JSON for ``value``."""
    return json.dumps(value, separators=(",", ":"), ensure_ascii=ascii_only).encode()


class LoadsResultTests(SynchronousTestCase):
    """The short read against the parser."""

    def same(self, body: bytes) -> Any:
        """``loads_result`` gives what ``json.loads`` gives (its types too)."""
        got = loads_result(body)
        want = json.loads(body)
        self.assertEqual(got, want)
        self.assertEqual(list(got), list(want), "key order")
        return got

    def short_way(self, body: bytes) -> bool:
        """Whether the short way read it (the parser saw only the rest)."""
        want = json.loads(body)
        calls: list[int] = []
        real = json.loads

        def counting(data: Any) -> Any:
            calls.append(len(data))
            return real(data)

        patcher = MonkeyPatcher((_resultjson.json, "loads", counting))
        got = patcher.runWithPatches(loads_result, body)
        self.assertEqual(got, want)
        return max(calls) < BIG_RESULT_BYTES

    def test_texts(self) -> None:
        """Every text, big, in stdout and stderr: the same value, read the short way."""
        for text in TEXTS:
            body = compact(result(BIG + text, text + BIG))
            self.same(body)
            if "\\u" not in body.decode() and "\\" not in text:
                self.assertTrue(self.short_way(body), text)

    def test_a_print(self) -> None:
        """A big print (quotes, tabs, accents, its newlines): read the short way."""
        text = known_output(BIG_RESULT_BYTES)[: 200 * 60]
        body = compact(result(BIG + text[: FEW_ESCAPES * 2]))
        self.same(body)
        plain = compact(result(BIG + "\n"))
        self.assertTrue(self.short_way(plain))
        self.assertEqual(loads_result(plain)["stdout"], BIG + "\n")

    def test_left_to_the_parser(self) -> None:
        """Many escapes, ``\\u`` escapes, ASCII-only JSON: the parser's answer."""
        many = BIG + '"q"\n' * (FEW_ESCAPES + 1)
        for body in (
            compact(result(many)),
            compact(result(BIG + "\x01 bell")),
            compact(result(BIG + "é"), ascii_only=True),
            compact(result(BIG + "\\" * (4 * FEW_ESCAPES) + '"')),
        ):
            self.assertFalse(self.short_way(body))

    def test_bad_bytes(self) -> None:
        """Output that was not UTF-8 arrives as U+FFFD: the same either way."""
        for raw in BAD:
            self.same(compact(result(BIG + raw.decode("utf-8", "replace"))))

    def test_keys_elsewhere(self) -> None:
        """A ``stdout`` key inside a value or a string is not taken for the document's."""
        nested = {"data": {"text/plain": "2"}, "stdout": "inner " + BIG}
        tricky = result("outer", results=[nested], error={'k,"stdout":"': BIG})
        body = compact(
            {"results": [nested], **{k: v for k, v in tricky.items() if k != "results"}}
        )
        self.same(body)
        self.same(compact({"note": ',"stdout":"' + BIG, **result("x")}))

    def test_key_given_twice(self) -> None:
        """A key given twice (never from the daemon): the parser decides which wins."""
        body = compact(result(BIG))[:-1] + b',"stdout":"later"}'
        self.assertEqual(loads_result(body)["stdout"], "later")

    def test_not_json(self) -> None:
        """What is not JSON raises as ``json.loads`` does."""
        body = compact(result(BIG))[:-2]
        self.assertRaises(ValueError, loads_result, body)
        self.assertRaises(ValueError, loads_result, b"[" + body)

    def test_small_and_odd(self) -> None:
        """Small documents, other shapes: the parser's answer."""
        for value in (result("small"), [1, 2], "text", {"stdout": BIG}, {}):
            self.same(compact(value))
