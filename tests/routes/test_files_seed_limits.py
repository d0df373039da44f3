"""
The seed's limit names bound the file routes as they do on the seed:
``max_depth`` lowers how deep a listing may go, ``max_results`` how many
matches a search returns, ``max_files`` how many files an archive packs.
"""

from __future__ import annotations

import os
from typing import Any

from twisted.internet.defer import inlineCallbacks

from tests.helpers import DaemonTestCase


class SeedLimitTests(DaemonTestCase):
    policy = {
        "endpoints": {
            "files_list": {"limits": {"max_depth": 1}},
            "files_search": {"limits": {"max_results": 2}},
            "files_archive": {"limits": {"max_files": 2}},
        }
    }

    def put(self, rel: str) -> None:
        path = os.path.join(self.base_dir, rel)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "wb") as f:
            f.write(b"x")

    @inlineCallbacks
    def test_max_depth(self) -> Any:
        """A deeper listing than max_depth is asked for: max_depth is given."""
        self.put("d/sub/deep.txt")
        reply = yield self.request("GET", "/files/list?path=d&depth=3")
        self.assertEqual(reply.status, 200)
        self.assertEqual([e["name"] for e in reply.json()["entries"]], ["sub"])

    @inlineCallbacks
    def test_max_results(self) -> Any:
        """More matches than max_results: max_results of them, marked truncated."""
        for i in range(4):
            self.put(f"s/f{i}.py")
        reply = yield self.request(
            "POST", "/files/search", {"path": "s", "pattern": "*.py", "max_results": 10}
        )
        body = reply.json()
        self.assertEqual((len(body["results"]), body["truncated"]), (2, True))

    @inlineCallbacks
    def test_max_files(self) -> Any:
        """An archive of more files than max_files is 413 payload_too_large."""
        for i in range(3):
            self.put(f"a/f{i}.txt")
        reply = yield self.request("POST", "/files/archive", {"paths": ["a"]})
        self.assertEqual(
            (reply.status, reply.json()["code"]), (413, "payload_too_large")
        )
        reply = yield self.request("POST", "/files/archive", {"paths": ["a/f0.txt"]})
        self.assertEqual(reply.status, 200)
