"""
E2B's JavaScript SDK (``@e2b/code-interpreter`` from npm, run by node) in
its debug mode against the E2B door and a real ipykernel: state kept
across ``runCode``, output streamed, a matplotlib PNG, an error by name, and
a context of its own created, used, listed and removed.
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import sys
from typing import Any

from twisted.internet import reactor
from twisted.internet.defer import inlineCallbacks
from twisted.internet.utils import getProcessOutputAndValue
from twisted.trial.unittest import SkipTest

from tests.e2b.sdk import E2BCase
from tests.kernels.test_contexts import KERNEL_START, need_ipykernel

#: Where ``make test`` installs the SDK (npm, pinned in the Makefile).
NODE_MODULES = os.environ.get(
    "SANDBOXD_E2B_JS", os.path.join(sys.prefix, "node-e2b", "node_modules")
)

SCRIPT = os.path.join(
    os.path.dirname(os.path.abspath(__file__)), "js", "code_interpreter_smoke.cjs"
)

#: The whole script (node's start, six runCode calls, a context) is over
#: within this.
SCRIPT_SECONDS = 120.0


class JavaScriptSDKTests(E2BCase):
    """``@e2b/code-interpreter`` unchanged, against sandboxd."""

    policy = {"groups": {"code": True}, **KERNEL_START}
    timeout = 180

    def setUp(self) -> Any:
        need_ipykernel()
        self.node = shutil.which("node")
        if self.node is None:
            raise SkipTest("node is not installed (make test installs it with apt)")
        if not os.path.isdir(os.path.join(NODE_MODULES, "@e2b", "code-interpreter")):
            raise SkipTest(
                f"@e2b/code-interpreter is not in {NODE_MODULES}"
                " (make test installs it with npm; no npm or no registry here)"
            )
        return super().setUp()

    @inlineCallbacks
    def test_run_code(self) -> Any:
        """State kept, stdout streamed, a PNG result, ZeroDivisionError, a context's lifecycle."""
        yield self.start()
        env = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "HOME": os.environ["HOME"],
            "NODE_PATH": NODE_MODULES,
            "E2B_DEBUG": "true",
            "E2B_SANDBOX_URL": self.e2b_url,
        }
        d = getProcessOutputAndValue(self.node, [SCRIPT], env=env, reactor=reactor)
        d.addTimeout(SCRIPT_SECONDS, reactor)
        out, err, code = yield d
        self.assertEqual(code, 0, err.decode(errors="replace")[-3000:])
        seen = json.loads(out.decode().strip().splitlines()[-1])
        self.assertEqual(seen["kept"], "42")
        self.assertEqual(seen["stdout"], ["a\nb\n"])
        self.assertEqual(seen["streamed"], "a\nb\n")
        self.assertIsNone(seen["plotError"])
        self.assertTrue(base64.b64decode(seen["png"]).startswith(b"\x89PNG"))
        self.assertEqual(seen["error"], "ZeroDivisionError")
        self.assertEqual(seen["contextValue"], "own")  # as E2B's server: no repr quotes
        self.assertEqual(seen["defaultSeesContext"], "False")
        self.assertTrue(seen["listed"])
        self.assertTrue(seen["removed"])
