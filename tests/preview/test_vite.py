"""
A real Vite dev server behind the preview door, in headless Chromium: the
page loads through a link, and an edit to a module reaches the open page
through Vite's HMR WebSocket (no reload). Slow (npm installs Vite once into
a cache); skipped, saying why, without node, npm, the network, Playwright
or Chromium.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time
from typing import Any

from twisted.internet import reactor
from twisted.internet.defer import inlineCallbacks
from twisted.internet.task import deferLater
from twisted.internet.threads import deferToThread

from tests.chromium import SKIP_REASON, chromium_page
from tests.preview.test_door import DoorCase

#: Where Vite is installed once for these tests.
CACHE = os.path.join(
    os.environ.get("XDG_CACHE_HOME", os.path.expanduser("~/.cache")),
    "sandboxd-tests",
    "vite6",
)

INDEX = (
    '<!doctype html><html><body><div id="v">-</div>'
    '<script type="module" src="/main.js"></script></body></html>'
)
MAIN = """import { msg } from "./msg.js";
document.getElementById("v").textContent = msg;
if (import.meta.hot) {
  import.meta.hot.accept("./msg.js", (m) => {
    document.getElementById("v").textContent = m.msg;
  });
}
"""


def vite_installed() -> str | None:
    """Install Vite into the cache if needed; the reason it cannot be, or None."""
    if shutil.which("node") is None or shutil.which("npm") is None:
        return "node and npm are not installed (scripts/install-test-tools.sh)"
    if os.path.exists(os.path.join(CACHE, "node_modules", "vite", "bin", "vite.js")):
        return None
    os.makedirs(CACHE, exist_ok=True)
    try:
        subprocess.run(
            [
                "npm",
                "install",
                "--no-audit",
                "--no-fund",
                "--silent",
                # Without a network, give up in seconds rather than minutes.
                "--fetch-timeout=20000",
                "--fetch-retries=1",
                "vite@6",
            ],
            cwd=CACHE,
            check=True,
            timeout=300,
            capture_output=True,
        )
    except (subprocess.SubprocessError, OSError) as e:
        return f"npm could not install vite (no network?): {e}"
    return None


class ViteTests(DoorCase):
    """Vite's HMR through the door."""

    timeout = 400
    skip = SKIP_REASON

    @inlineCallbacks
    def test_hmr_through_the_door(self) -> None:
        """An edit to a module updates the open page in place."""
        why = yield deferToThread(vite_installed)
        if why is not None:
            self.skipTest(why)
        project = os.path.realpath(self.mktemp())
        os.makedirs(project)
        os.symlink(
            os.path.join(CACHE, "node_modules"), os.path.join(project, "node_modules")
        )
        for name, text in (
            ("index.html", INDEX),
            ("main.js", MAIN),
            ("msg.js", 'export const msg = "one";\n'),
        ):
            with open(os.path.join(project, name), "w") as f:
                f.write(text)
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        vite = subprocess.Popen(
            [
                "node",
                os.path.join(project, "node_modules", "vite", "bin", "vite.js"),
                "--port",
                str(port),
                "--strictPort",
                "--host",
                "127.0.0.1",
            ],
            cwd=project,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )

        def stop() -> None:
            try:
                os.killpg(vite.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            vite.wait(timeout=10)

        self.addCleanup(stop)
        deadline = time.monotonic() + 60
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                if time.monotonic() > deadline:
                    self.fail("vite did not listen within 60 s")
                yield deferLater(reactor, 0.2, lambda: None)
        yield self.expose(port=port)
        minted = yield self.request("POST", f"/preview/ports/{port}/link", {})
        url = minted.json()["url"]

        def browse() -> dict[str, Any]:
            seen: dict[str, Any] = {}
            with chromium_page() as page:
                page.goto(url)
                page.wait_for_function(
                    "document.getElementById('v').textContent === 'one'",
                    timeout=60000,
                )
                # Vite's client says so once its WebSocket is up.
                page.wait_for_timeout(1500)
                page.evaluate("window.kept = 42")
                with open(os.path.join(project, "msg.js"), "w") as f:
                    f.write('export const msg = "two";\n')
                page.wait_for_function(
                    "document.getElementById('v').textContent === 'two'",
                    timeout=60000,
                )
                seen["kept"] = page.evaluate("window.kept")
                seen["url"] = page.url
            return seen

        seen = yield deferToThread(browse)
        self.assertEqual(seen["kept"], 42, "the page was reloaded, not hot-updated")
        self.assertNotIn("sbx_link", seen["url"])
