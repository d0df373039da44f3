"""The audit file: JSON lines, masked secrets, rotation by size."""

from __future__ import annotations

import json
import os
import time

from twisted.trial.unittest import SynchronousTestCase

from sandboxd.audit import (
    AuditLog,
    make_record,
    redact_query,
    should_record,
)
from sandboxd.policy.defaults import AUDIT_KEEP_FILES


class AuditTests(SynchronousTestCase):
    """What an operator finds in the audit file."""

    def test_modes(self) -> None:
        """all records everything, deny only refusals and failures, off nothing."""
        self.assertTrue(should_record("all", 200))
        self.assertFalse(should_record("deny", 200))
        self.assertTrue(should_record("deny", 403))
        self.assertFalse(should_record("off", 500))

    def test_redaction(self) -> None:
        """Values of token-like parameters are masked; others kept."""
        self.assertEqual(
            redact_query("access_token=abc&path=x&api_key=k"),
            "access_token=%2A%2A%2A&path=x&api_key=%2A%2A%2A",
        )

    def test_rotation(self) -> None:
        """Past the size bound the file rotates, keeping a bounded number of old files."""
        path = os.path.join(os.path.abspath(self.mktemp()))
        os.makedirs(os.path.dirname(path), exist_ok=True)
        log = AuditLog(path, rotate_bytes=2000)
        record = make_record(
            identity="ci",
            endpoint="download",
            method="GET",
            path="/download",
            query="path=a",
            status=200,
            code=None,
            rule=None,
            started=time.monotonic(),
            bytes_in=0,
            bytes_out=10,
            client="127.0.0.1",
        )
        for _ in range(200):
            log.write(record)
        log.close()
        names = sorted(os.listdir(os.path.dirname(path)))
        base = os.path.basename(path)
        self.assertIn(base, names)
        self.assertIn(base + ".1", names)
        self.assertLessEqual(
            len([n for n in names if n.startswith(base + ".")]), AUDIT_KEEP_FILES
        )
        with open(path) as f:
            for line in f:
                self.assertEqual(json.loads(line)["identity"], "ci")
