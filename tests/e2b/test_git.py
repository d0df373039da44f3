"""
The real E2B SDK's ``sandbox.git`` through the E2B door: it puts the
password in the clone URL (so in the command's argv); the clone works and
the audit line shows ``***`` where the password was.
"""

from __future__ import annotations

import json
import os
import secrets
from typing import Any

from twisted.internet.defer import inlineCallbacks

from tests.e2b.sdk import E2BCase
from tests.git.remote import missing, serve_remote


class SdkGitCloneTests(E2BCase):
    """``sandbox.git.clone(url, username=, password=)`` over the E2B port."""

    audit = True
    autostart = False
    skip = missing()
    password = "pw-" + secrets.token_hex(12)
    extra_policy = {"defaults": {"audit": "all"}}

    @inlineCallbacks
    def setUp(self) -> Any:
        yield super().setUp()
        self.remote = serve_remote(self, self.password)
        yield self.start()

    @inlineCallbacks
    def test_clone_with_password_is_masked_in_the_audit(self) -> Any:
        """The SDK's clone succeeds; no audit line holds the password, and its argv shows ***@."""
        target = os.path.join(self.base_dir, "cloned")

        def job() -> Any:
            sbx = self.sandbox()
            return sbx.git.clone(
                self.remote.url(),
                path=target,
                username=self.remote.username,
                password=self.password,
                envs={"GIT_SSL_CAINFO": self.remote.ca},
            )

        yield self.sdk(job)
        self.assertTrue(os.path.exists(os.path.join(target, "README")))
        lines = self.audit_lines()
        self.assertNotIn(self.password, json.dumps(lines))
        argvs = [
            " ".join(line.get("argv", [])) for line in lines if line.get("via") == "e2b"
        ]
        self.assertTrue(
            any(f"https://***@127.0.0.1:{self.remote.port}" in a for a in argvs), argvs
        )
