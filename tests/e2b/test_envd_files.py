"""
The file calls of the E2B door where envd has its own behaviour, seen
through the real SDK (and a plain HTTP client where the SDK cannot send
what is tested): what E2B code ported unchanged meets.
"""

from __future__ import annotations

import os
from io import BytesIO
from typing import Any

from twisted.internet import reactor
from twisted.internet.defer import inlineCallbacks
from twisted.web.client import Agent, FileBodyProducer, readBody
from twisted.web.http_headers import Headers

from sandboxd.policy.defaults import E2B_MAX_UPLOAD_FILES
from tests.e2b.sdk import E2BCase, caught


class UploadRefusalTests(E2BCase):
    """A refused upload big enough to be spooled to disk keeps its answer."""

    @inlineCallbacks
    def test_too_many_files(self) -> Any:
        """
        ``write_files`` of more files than an upload takes is 413 with the
        bound named (not 500), and writes nothing.
        """
        from e2b.sandbox.filesystem.filesystem import WriteEntry

        count = E2B_MAX_UPLOAD_FILES + 1

        def job() -> Any:
            entries = [
                WriteEntry(path=f"up/f{i}.txt", data="x" * 200) for i in range(count)
            ]
            return caught(lambda: self.sandbox().files.write_files(entries))

        refused = yield self.sdk(job)
        self.assertIn(
            f"413: at most {E2B_MAX_UPLOAD_FILES} files per upload", str(refused)
        )
        self.assertFalse(os.path.exists(os.path.join(self.base_dir, "up")))

    @inlineCallbacks
    def test_malformed_big_multipart(self) -> Any:
        """A spooled multipart body whose last part never closes is 400."""
        body = b"".join(
            b'--B\r\nContent-Disposition: form-data; name="file"; '
            b'filename="up/m%d.txt"\r\n\r\n%s\r\n' % (i, b"y" * 1000)
            for i in range(300)
        )
        body += (
            b'--B\r\nContent-Disposition: form-data; name="file"; '
            b'filename="up/bad.txt"\r\n\r\nno closing delimiter'
        )
        response = yield Agent(reactor).request(
            b"POST",
            f"{self.e2b_url}/files".encode(),
            Headers({b"content-type": [b"multipart/form-data; boundary=B"]}),
            FileBodyProducer(BytesIO(body)),
        )
        answer = yield readBody(response)
        self.assertEqual(response.code, 400, answer)
        self.assertIn(b"a multipart part without its closing delimiter", answer)
        self.assertFalse(os.path.exists(os.path.join(self.base_dir, "up")))
