"""
The result document the client assembles from an execution's events, and
when it leaves that to the daemon's own document.
"""

from __future__ import annotations

from typing import Any

from twisted.trial.unittest import SynchronousTestCase

from sandboxd.client._execution import EventSplitter, ExecutionEvents

X = {"execution_id": "x_1"}


def ended(**fields: Any) -> dict[str, Any]:
    """An ``execution.ended`` event's data."""
    data = {
        **X,
        "state": "ok",
        "started": True,
        "execution_count": 3,
        "duration_ms": 1.5,
        "truncated": False,
        "dropped_bytes": 0,
    }
    data.update(fields)
    return data


def fed(*events: tuple[str, Any]) -> dict[str, Any] | None:
    """What :class:`ExecutionEvents` makes of ``events``."""
    seen = ExecutionEvents("ctx_1")
    for name, data in events:
        seen.feed(name, data)
    return seen.result()


class AssembleTests(SynchronousTestCase):
    """Events in, the result document out (or None)."""

    def test_document(self) -> None:
        """Output joined, displays and the error as the document has them, ids and counts from the end."""
        item = {"data": {"text/plain": "2"}, "metadata": {}, "is_result": True}
        result = fed(
            ("execution.started", {**X, "execution_count": 3}),
            ("stdout", {**X, "text": "a"}),
            ("stderr", {**X, "text": "w"}),
            ("stdout", {**X, "text": "b\n"}),
            ("display", {**X, **item}),
            (
                "error",
                {
                    **X,
                    "ename": "E",
                    "evalue": "v",
                    "traceback": ["t"],
                    "traceback_text": "t",
                },
            ),
            ("execution.ended", ended(state="error")),
        )
        self.assertEqual(
            result,
            {
                "execution_id": "x_1",
                "context_id": "ctx_1",
                "state": "error",
                "started": True,
                "execution_count": 3,
                "stdout": "ab\n",
                "stderr": "w",
                "results": [item],
                "error": {"ename": "E", "evalue": "v", "traceback": ["t"]},
                "duration_ms": 1.5,
                "truncated": False,
                "dropped_bytes": 0,
                "events_url": "/code/contexts/ctx_1/executions/x_1/events",
            },
        )

    def test_left_to_the_document(self) -> None:
        """Not ended, truncated, a gap, a timeout or lost state, a lone surrogate: None."""
        out = ("stdout", {**X, "text": "a"})
        self.assertIsNone(fed(out))
        self.assertIsNone(fed(out, ("execution.ended", ended(truncated=True))))
        self.assertIsNone(
            fed(("gap", {"from": 1, "to": 3}), out, ("execution.ended", ended()))
        )
        for state in ("timeout", "lost"):
            self.assertIsNone(fed(out, ("execution.ended", ended(state=state))))
        self.assertIsNone(
            fed(("stdout", {**X, "text": "\udc80"}), ("execution.ended", ended()))
        )
        self.assertIsNotNone(fed(out, ("execution.ended", ended(state="interrupted"))))


STREAM = (
    b": keep-alive\n\n"
    b'id: 1\nevent: stdout\ndata: {"text": "a\\n\\u00e9"}\n\n'
    b"event: two\r\ndata: [1,\r\ndata: 2]\r\n\r\n"
    b"event: plain\ndata:not json\n\n"
    b'data: {"big": "' + b"x" * 100_000 + b'"}\n\n'
)

EXPECTED = [
    ("stdout", {"text": "a\né"}),
    ("two", [1, 2]),
    ("plain", "not json"),
    ("message", {"big": "x" * 100_000}),
]


class SplitterTests(SynchronousTestCase):
    """SSE from bytes, however the bytes were cut."""

    def test_cuts(self) -> None:
        """Whole, in odd pieces or a byte at a time: the same events, data decoded."""
        for size in (len(STREAM), 7, 4096, 1):
            splitter = EventSplitter()
            events = []
            for at in range(0, len(STREAM), size):
                events += splitter.feed(STREAM[at : at + size])
            self.assertEqual(events, EXPECTED, size)
