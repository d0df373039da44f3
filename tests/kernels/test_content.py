"""
The built-in kernel's tracebacks for a cell holding characters that
``str.splitlines`` ends a line at but Python's tokenizer does not.
"""

from __future__ import annotations

from typing import Any

from twisted.internet.defer import inlineCallbacks

from tests.kernels.test_contexts import CodeTestCase


class TracebackLineTests(CodeTestCase):
    """A traceback quotes the line that failed."""

    def setUp(self) -> Any:
        # No ipykernel needed: skip CodeTestCase's check.
        return super(CodeTestCase, self).setUp()

    @inlineCallbacks
    def test_line_after_a_form_feed_and_line_separator(self) -> Any:
        """
        A cell whose earlier lines hold a form feed, NEL and U+2028 (a
        string's contents, a page break) has its failing line quoted in
        the traceback, not a piece of an earlier line.
        """
        ctx = yield self.context(kernel="sandboxd-python")
        ran = yield self.execute(
            ctx["id"],
            "s = 'a\u2028b\u0085c'\n\x0c\nt = 'd\x0ce'\n1/0  # the failing line\n",
        )
        self.assertIn("1/0  # the failing line", "".join(ran["error"]["traceback"]))
