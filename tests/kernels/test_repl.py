"""
The built-in kernel ``sandboxd-python`` (stdlib only) through the same
API: the scenarios every kernel shares (state, values, errors, figures,
``input()``, interrupts: :class:`~tests.kernels.test_contexts.KernelScenarios`),
a subprocess's output, and the default where no ipykernel can run.
"""

from __future__ import annotations

from typing import Any

from twisted.internet.defer import inlineCallbacks

from sandboxd.kernels import kernelspecs
from tests.kernels.test_contexts import CodeTestCase, KernelScenarios


class BuiltinScenarios(KernelScenarios, CodeTestCase):
    """The shared scenarios on ``sandboxd-python``."""

    kernel = "sandboxd-python"

    def setUp(self) -> Any:
        # No ipykernel needed: skip CodeTestCase's check.
        return super(CodeTestCase, self).setUp()


class BuiltinKernelTests(CodeTestCase):
    """What only the built-in kernel does."""

    def setUp(self) -> Any:
        # No ipykernel needed: skip CodeTestCase's check.
        return super(CodeTestCase, self).setUp()

    @inlineCallbacks
    def test_subprocess_output(self) -> Any:
        """A subprocess's output is the execution's stdout too."""
        ctx = yield self.context(kernel="sandboxd-python")
        sub = yield self.execute(
            ctx["id"],
            "import subprocess\nsubprocess.run(['echo', 'from a child'])\nNone",
        )
        self.assertEqual(sub["stdout"], "from a child\n")

    @inlineCallbacks
    def test_default_without_jupyter(self) -> Any:
        """Where the hub cannot run, a context with no kernel named is ``sandboxd-python``."""
        self.patch(kernelspecs, "jupyter_usable", lambda: False)
        listed = yield self.request("GET", "/code/kernels")
        self.assertEqual(
            [k["name"] for k in listed.json()["kernels"]], ["sandboxd-python"]
        )
        self.assertEqual(listed.json()["default"], "sandboxd-python")
        ctx = yield self.context()
        self.assertEqual(ctx["kernel"], "sandboxd-python")
        result = yield self.execute(ctx["id"], "1 + 1")
        self.assertEqual(result["results"][0]["data"]["text/plain"], "2")
