"""
Headless Chromium for the browser tests (Playwright driving Debian's
Chromium): where it is, why a test skips without it, and the flags a
machine with no network and no screen needs.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from typing import Any

CHROMIUM = os.environ.get("SANDBOXD_CHROMIUM", "/usr/bin/chromium")

SKIP_REASON: str | None = None
try:
    import playwright.sync_api  # noqa: F401
except ImportError:
    SKIP_REASON = "Playwright is not installed (pip install -e '.[browser]')"
else:
    if not os.access(CHROMIUM, os.X_OK):
        SKIP_REASON = (
            f"Chromium is not installed at {CHROMIUM} "
            "(scripts/install-test-tools.sh installs it)"
        )

#: Without the background-networking flags Chromium keeps trying hosts a
#: closed network refuses.
ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-dev-shm-usage",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    "--no-proxy-server",
]


@contextlib.contextmanager
def chromium_page(**options: Any) -> Iterator[Any]:
    """
    A page (``options`` go to ``new_page``) of a headless Chromium started
    for it and closed after; Playwright's sync API blocks, so use it in a
    thread of its own.
    """
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=ARGS, headless=True)
        try:
            yield browser.new_page(**options)
        finally:
            browser.close()
