"""
Awkward but legitimate output and file names through the seed's SDK
(``agent_sandbox``'s ``ServerClient``), which reads every event stream
with httpx's ``aiter_lines`` (a line reader that also ends a line at NEL,
U+2028 and U+2029): what sandboxd sends arrives whole, and names and
output read the same as from the seed's own server.
"""

from __future__ import annotations

import asyncio
import os
import shlex
from typing import Any

from twisted.internet.defer import inlineCallbacks

from tests.seed.harness import SeedCase


def printing(bad: str) -> str:
    """
    A command printing line separators JSON leaves raw, a NUL, a lone CR
    and ``bad`` (printf's escapes) on one line, then a 4-byte character
    written in two writes.
    """
    return "bash -c " + shlex.quote(
        f"printf 'a\\302\\205b\\342\\200\\250c\\342\\200\\251d\\000e\\rf{bad}g\\n'; "
        "printf '\\360\\237'; sleep 0.3; printf '\\230\\200z\\n'"
    )


def printed(bad: str) -> list[str]:
    """The lines :func:`printing` prints, with ``bad`` as text."""
    return [f"a\u0085b\u2028c\u2029d\x00e\rf{bad}g", "\U0001f600z"]


#: Names a directory listing and a watch must give back as written.
NAMES = ["nl\nname", "-dash", "space ", "sep\u2028name", "nel\u0085x"]


async def scenario(c: Any, base: str, command: str) -> dict[str, Any]:
    """``command``'s output three ways, then awkward names listed and watched."""
    out: dict[str, Any] = {}
    lines: list[str] = []
    streamed = await c.process.run_stream(command, on_stdout=lines.append)
    out["lines"] = lines
    out["streamed"] = streamed.stdout
    out["shell"] = (await c.process.shell(command)).stdout
    started = await c.process.start(command, capture_output=True)
    await c.process.wait(started.pid)
    page = await c.process.output(started.pid)
    out["output"] = "".join(e.data for e in page.events if e.stream == "stdout")
    listed = os.path.join(base, "listed")
    os.makedirs(listed)
    for name in NAMES:
        with open(os.path.join(listed, name), "w") as f:
            f.write(name)
    out["listed"] = sorted(e.name for e in await c.files.list(listed))
    out["read"] = [
        (await c.files.download(os.path.join(listed, name))).decode() for name in NAMES
    ]
    watched = os.path.join(base, "watched")
    os.makedirs(watched)

    async def make() -> None:
        await asyncio.sleep(1.0)
        for name in NAMES:
            with open(os.path.join(watched, name), "w"):
                pass

    maker = asyncio.ensure_future(make())
    events = await c.files.watch_for(watched, 3.0)
    await maker
    out["watched"] = sorted({os.path.basename(e.path) for e in events})
    return out


class ContentTests(SeedCase):
    """The same scenario against sandboxd and the seed's own server."""

    @inlineCallbacks
    def test_awkward_content_as_the_seed_server(self) -> Any:
        """
        Output holding line separators, a NUL, a lone CR, a bad byte and
        a character split across reads arrives whole through
        ``run_stream``, ``shell`` and ``output``; awkward names are listed,
        read and watched as written; all of it as the seed's server does.
        """
        ref = yield self.reference()
        ours = yield self.drive(lambda c: scenario(c, self.base_dir, printing("\\377")))
        # The seed's server answers /shell with a 500 for a byte that is
        # not UTF-8: its control run prints a 2-byte character there.
        theirs = yield self.drive(
            lambda c: scenario(c, ref.base_dir, printing("\\303\\251")),
            reference=True,
        )
        for seen, bad in ((ours, "\ufffd"), (theirs, "\u00e9")):
            lines = printed(bad)
            text = "".join(line + "\n" for line in lines)
            self.assertEqual(seen["lines"], lines)
            self.assertEqual(seen["streamed"], text)
            # The seed's /shell turns CR into LF; sandboxd keeps what was
            # printed (docs/migrating-from-agent-sandbox-server.md).
            shown = text if seen is ours else text.replace("\r", "\n")
            self.assertEqual(seen["shell"], shown)
            if seen is ours:
                # The seed's server decodes each read alone: the character
                # split across two reads is three U+FFFD there.
                self.assertEqual(seen["output"], text)
            self.assertEqual(seen["listed"], sorted(NAMES))
            self.assertEqual(seen["read"], NAMES)
            self.assertEqual(seen["watched"], sorted(NAMES))
