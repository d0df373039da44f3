"""
Awkward but legitimate output and file names through the E2B door, as the
``e2b`` SDK shows them: output as the bytes printed (the SDK decodes them,
U+FFFD for what is not UTF-8), names as ``files.list`` and ``watch_dir``
both show them.
"""

from __future__ import annotations

import asyncio
import os
import time
from typing import Any

from twisted.internet.defer import inlineCallbacks

from tests.e2b.sdk import E2BCase

#: Line separators JSON leaves raw, a NUL, a lone CR and a byte that is not
#: UTF-8 on one line; then a 4-byte character written in two writes.
AWKWARD = (
    "printf 'a\\302\\205b\\342\\200\\250c\\342\\200\\251d\\000e\\rf\\377g\\n'; "
    "printf '\\360\\237'; sleep 0.3; printf '\\230\\200z\\n'"
)
AWKWARD_TEXT = "a\u0085b\u2028c\u2029d\x00e\rf\ufffdg\n\U0001f600z\n"


class ContentTests(E2BCase):
    """Output and names through ``commands`` and ``files``."""

    @inlineCallbacks
    def test_awkward_output(self) -> Any:
        """``commands.run`` gets the printed text, to the result and to ``on_stdout``."""

        def job() -> Any:
            chunks: list[str] = []
            result = self.sandbox().commands.run(AWKWARD, on_stdout=chunks.append)
            return result.stdout, "".join(chunks)

        stdout, streamed = yield self.sdk(job)
        self.assertEqual(stdout, AWKWARD_TEXT)
        self.assertEqual(streamed, AWKWARD_TEXT)

    @inlineCallbacks
    def test_awkward_names_listed_and_watched(self) -> Any:
        """
        Names with a newline, a leading dash, a trailing space or U+2028
        are listed and watched as written; a name that is not UTF-8 is
        shown with its bad byte as ``\\xNN`` by both, and does not stop
        ``watch_dir`` from reporting the other names.
        """
        names = [b"nl\nname", b"-dash", b"space ", "sep\u2028name".encode(), b"b\xff"]
        shown = ["nl\nname", "-dash", "space ", "sep\u2028name", "b\\xff"]
        root = os.path.join(self.base_dir, "w").encode()
        os.makedirs(root)

        def job() -> Any:
            sbx = self.sandbox()
            handle = sbx.files.watch_dir("w")
            for name in names:
                with open(os.path.join(root, name), "wb"):
                    pass
            seen: set[str] = set()
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline and len(seen) < len(names):
                seen |= {e.name for e in handle.get_new_events()}
                time.sleep(0.1)
            handle.stop()
            listed = {e.name for e in sbx.files.list("w")}
            return seen, listed

        seen, listed = yield self.sdk(job)
        self.assertEqual(listed, set(shown))
        self.assertEqual(seen, set(shown))

    @inlineCallbacks
    def test_a_listed_name_not_utf8_can_be_used(self) -> Any:
        """
        A name that is not UTF-8, as ``files.list`` shows it (``\\xNN``),
        can be read, described, renamed and removed through the SDK; a
        name typed with a literal ``\\x`` that names no such file is
        written as typed, never as those bytes.
        """
        root = os.path.join(self.base_dir, "nu").encode()
        os.makedirs(root)
        for name, data in ((b"bad\xff\xfe", b"one"), (b"caf\xe9.txt", b"two")):
            with open(os.path.join(root, name), "wb") as f:
                f.write(data)

        def job() -> Any:
            sbx = self.sandbox()
            listed = sorted(e.path for e in sbx.files.list("nu"))
            bad, cafe = listed
            info = sbx.files.get_info(bad)
            read = sbx.files.read(cafe, format="bytes")
            exists = sbx.files.exists(bad)
            renamed = sbx.files.rename(cafe, "nu/cafe.txt").name
            sbx.files.remove(bad)
            sbx.files.write("nu/lit\\xe9.txt", "typed")
            return listed, info.name, info.size, read, exists, renamed

        listed, name, size, read, exists, renamed = yield self.sdk(job)
        self.assertEqual(
            [os.path.basename(p) for p in listed], ["bad\\xff\\xfe", "caf\\xe9.txt"]
        )
        self.assertEqual(
            (name, size, bytes(read), exists), ("bad\\xff\\xfe", 3, b"two", True)
        )
        self.assertEqual(renamed, "cafe.txt")
        self.assertEqual(sorted(os.listdir(root)), [b"cafe.txt", b"lit\\xe9.txt"])

    @inlineCallbacks
    def test_streamed_watch_with_a_name_not_utf8(self) -> Any:
        """
        The async SDK's ``watch_dir`` (envd's ``WatchDir`` stream) reports
        a name that is not UTF-8 as ``\\xNN`` and goes on with the next.
        """
        root = os.path.join(self.base_dir, "aw").encode()
        os.makedirs(root)

        def job() -> Any:
            from e2b import AsyncSandbox

            async def main() -> Any:
                sbx = await AsyncSandbox.create()
                names: set[str] = set()
                watch = await sbx.files.watch_dir(
                    "aw", on_event=lambda e: names.add(e.name)
                )
                for name in (b"b\xff", b"after"):
                    with open(os.path.join(root, name), "wb"):
                        pass
                for _ in range(200):
                    if "after" in names:
                        break
                    await asyncio.sleep(0.05)
                await watch.stop()
                return names

            return asyncio.run(main())

        names = yield self.sdk(job)
        self.assertEqual(names, {"b\\xff", "after"})
