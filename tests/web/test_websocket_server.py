"""
The autobahn classes both WebSocket doors use come without autobahn's
native helpers unless the operator asks for them, and the switch does not
leak into the daemon's environment (its children inherit that).
"""

from __future__ import annotations

import os
import subprocess
import sys

from twisted.trial.unittest import SynchronousTestCase

_PROBE = (
    "import os, sys\n"
    "import sandboxd.web.websocket_server\n"
    "print(os.environ.get('AUTOBAHN_USE_NVX'), 'autobahn.nvx' in sys.modules,"
    " 'pycparser' in sys.modules)\n"
)


def probe(**env: str) -> str:
    """What a fresh interpreter sees after importing the module."""
    base = {k: v for k, v in os.environ.items() if k != "AUTOBAHN_USE_NVX"}
    return subprocess.run(
        [sys.executable, "-c", _PROBE],
        env={**base, **env},
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout.strip()


class NativeHelpersTests(SynchronousTestCase):
    """Whether autobahn's NVX helpers (and pycparser) are loaded."""

    def test_left_out_by_default(self) -> None:
        """No operator choice: no NVX, no pycparser, and no variable left set."""
        self.assertEqual(probe(), "None False False")

    def test_operator_choice_kept(self) -> None:
        """``AUTOBAHN_USE_NVX=1`` from the operator is honoured and kept as given."""
        self.assertEqual(probe(AUTOBAHN_USE_NVX="1"), "1 True True")
