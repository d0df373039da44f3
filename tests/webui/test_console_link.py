"""
The web console across the end of its link, in headless Chromium against a
real daemon on loopback: what a person typed survives a new link, a new
URL pasted into the same tab is taken, terminals come back, the
identity's other terminals can be attached or ended, and the keyboard can
leave a terminal.
"""

from __future__ import annotations

import os
from typing import Any

from twisted.internet.defer import inlineCallbacks

from tests.lsp.test_connect import close_timers
from tests.webui.test_browser import (
    SHOTS,
    ConsoleCase,
    screen_text,
    wait_screen,
    wait_true,
)

#: The login screen, shown.
LOGIN = "[data-testid=login]:not([hidden])"


class NewLinkCase(ConsoleCase):
    """Helpers to end a console link and mint the next one from the browser's thread."""

    def revoke(self) -> None:
        """Revoke the link the page uses, as its owner would."""
        reply = self.call("DELETE", f"/auth/links/{self.link_id}")
        self.assertEqual(reply.status, 200, reply.body)

    def next_link(self) -> str:
        """A new console link's token (what a person pastes)."""
        reply = self.call("POST", "/auth/links", {"audience": "console"})
        self.assertEqual(reply.status, 201, reply.body)
        self.link_id = reply.json()["link_id"]
        return str(reply.json()["token"])

    def log_in_again(self, page: Any) -> None:
        """Paste a new link on the login screen and open it."""
        page.fill("[data-testid=login-link]", self.next_link())
        page.click("[data-testid=login-submit]")
        page.wait_for_selector("[data-testid=login]", state="hidden")


class DraftTests(NewLinkCase):
    """An edit being typed when the link ends."""

    @inlineCallbacks
    def test_edit_survives_a_new_link(self) -> Any:
        """
        The link ends while a file is being edited: Save shows the login
        screen and the editor stays on screen with the text; a new link
        pasted there takes over without reloading the page, and Save then
        writes the text to the file.
        """
        url = yield self.link()
        path = os.path.join(self.base_dir, "notes.txt")
        with open(path, "w") as f:
            f.write("line one\n")
        draft = "line one\na paragraph typed for a long while\n"

        def steps(page: Any, seen: dict[str, Any]) -> None:
            page.goto(url)
            page.wait_for_selector("body[data-ready=true]")
            page.evaluate("window.sameDocument = true")
            page.click("[data-testid=nav-files]")
            page.click("[data-testid=file-entry][data-name='notes.txt']")
            page.wait_for_selector("[data-testid=file-text]")
            page.click("[data-testid=file-edit]")
            page.fill("[data-testid=file-editor]", draft)
            self.revoke()
            page.click("[data-testid=file-save]")
            page.wait_for_selector(LOGIN)
            seen["editor_shown"] = page.is_visible("[data-testid=file-editor]")
            seen["on_screen"] = page.input_value("[data-testid=file-editor]")
            page.screenshot(path=os.path.join(SHOTS, "login-over-editor.png"))
            self.log_in_again(page)
            seen["same_document"] = page.evaluate("window.sameDocument === true")
            seen["kept"] = page.input_value("[data-testid=file-editor]")
            seen["banner_after"] = page.is_visible("[data-testid=banner]")
            page.click("[data-testid=file-save]")
            wait_true(
                page,
                "document.querySelector('[data-testid=file-save-status]').textContent.startsWith('Saved')",
            )

        seen = yield self.browse(steps)
        self.assertTrue(seen["editor_shown"])
        self.assertEqual(seen["on_screen"], draft)
        self.assertTrue(seen["same_document"])
        self.assertEqual(seen["kept"], draft)
        # The old link's "could not save" is gone with it.
        self.assertFalse(seen["banner_after"])
        with open(path) as f:
            self.assertEqual(f.read(), draft)
        self.assertNoCspViolation(
            {**seen, "console": [m for m in seen["console"] if "401" not in m]}
        )


class PastedUrlTests(NewLinkCase):
    """A new ``/ui/#link=...`` URL pasted into a tab already on the console."""

    @inlineCallbacks
    def test_new_url_in_the_same_tab(self) -> Any:
        """
        On the login screen after the link ended, and on a bare ``/ui/``,
        pasting a new URL (only the fragment changes, so the browser does
        not reload) logs the page in and takes the link out of the address
        bar.
        """
        url = yield self.link()
        bare = f"{self.daemon.url}/ui/"

        def steps(page: Any, seen: dict[str, Any]) -> None:
            page.goto(url)
            page.wait_for_selector("body[data-ready=true]")
            seen["first_identity"] = page.text_content("[data-testid=identity]")
            self.revoke()
            # The Files page's first listing finds the link gone.
            page.click("[data-testid=nav-files]")
            page.wait_for_selector(LOGIN)
            page.goto(f"{bare}#link={self.next_link()}")
            page.wait_for_selector("[data-testid=login]", state="hidden")
            seen["after_expiry_url"] = page.url
            seen["identity"] = page.text_content("[data-testid=identity]")
            # A tab with no link at all.
            page.evaluate("sessionStorage.clear()")
            page.goto(bare)
            page.reload()
            page.wait_for_selector(LOGIN)
            page.goto(f"{bare}#link={self.next_link()}")
            page.wait_for_selector("body[data-ready=true]")
            seen["bare_url"] = page.url
            seen["bare_login_shown"] = page.is_visible("[data-testid=login]")

        seen = yield self.browse(steps)
        self.assertEqual(seen["after_expiry_url"], bare)
        self.assertTrue(seen["identity"].startswith("link:"))
        self.assertNotEqual(seen["identity"], seen["first_identity"])
        self.assertEqual(seen["bare_url"], bare)
        self.assertFalse(seen["bare_login_shown"])


def statuses(page: Any) -> list[Any]:
    """Each terminal's session and status."""
    return list(
        page.evaluate(
            "[...document.querySelectorAll('[data-testid=terminal]')]"
            ".map(e => [e.dataset.session, e.dataset.status])"
        )
    )


class ReattachTests(NewLinkCase):
    """Terminals across the end of a link."""

    @inlineCallbacks
    def test_new_link_reattaches(self) -> Any:
        """
        A terminal whose link is revoked ends saying so, but its shell runs
        on; a new link pasted on the login screen re-attaches it, with no
        line twice, and it takes input again.
        """
        url = yield self.link()

        def steps(page: Any, seen: dict[str, Any]) -> None:
            page.goto(url)
            page.wait_for_selector("body[data-ready=true]")
            page.click("[data-testid=terminal-new]")
            page.wait_for_selector("[data-testid=terminal][data-status=connected]")
            page.click("[data-testid=terminal] .xterm")
            page.keyboard.type("echo BEFORE-$((1+1))\n")
            wait_screen(page, "BEFORE-2")
            sid = page.get_attribute("[data-testid=terminal]", "data-session")
            seen["sid"] = sid
            self.revoke()
            page.wait_for_selector(LOGIN)
            page.wait_for_selector(
                "[data-testid=terminal][data-status^='closed:']", timeout=15000
            )
            seen["lost"] = statuses(page)
            seen["daemon_lists"] = [
                s["id"] for s in self.call("GET", "/pty/sessions").json()["sessions"]
            ]
            self.log_in_again(page)
            page.wait_for_selector("[data-testid=terminal][data-status=connected]")
            seen["back"] = statuses(page)
            seen["remembered"] = page.evaluate(
                "sessionStorage.getItem('sandboxd.console.terminals')"
            )
            page.click("[data-testid=terminal] .xterm")
            page.keyboard.type("echo AFTER-$((2+2))\n")
            wait_screen(page, "AFTER-4")
            seen["screen"] = screen_text(page)

        seen = yield self.browse(steps)
        # The daemon closed the revoked link's socket: let autobahn's close timer run out.
        yield close_timers()
        sid = seen["sid"]
        self.assertEqual(seen["lost"], [[sid, "closed: the link was revoked"]])
        self.assertIn(sid, seen["daemon_lists"])
        self.assertEqual(seen["back"], [[sid, "connected"]])
        self.assertIn(sid, seen["remembered"])
        # The scrollback once: the command line shows ``$((1+1))``, its output "BEFORE-2".
        self.assertEqual(seen["screen"].count("BEFORE-2"), 1)


class OtherSessionsTests(ConsoleCase):
    """The identity's terminals that no tab of this page shows."""

    @inlineCallbacks
    def test_attach_and_end_other_sessions(self) -> Any:
        """
        Terminals opened elsewhere (a browser tab closed since, an agent)
        are listed on the Terminals page; Attach shows one with its
        scrollback, End ends another's shell, freeing the identity's share.
        """
        url = yield self.link()
        made = []
        for _ in range(2):
            reply = yield self.request(
                "POST", "/pty/sessions", {"cols": 80, "rows": 24}
            )
            self.assertEqual(reply.status, 200, reply.body)
            made.append(reply.json()["session_id"])
        kept, ended = made

        def steps(page: Any, seen: dict[str, Any]) -> None:
            page.goto(url)
            page.wait_for_selector("body[data-ready=true]")
            page.wait_for_selector("[data-testid=terminal-other]")
            seen["listed"] = sorted(
                page.eval_on_selector_all(
                    "[data-testid=terminal-other]",
                    "els => els.map(e => e.dataset.session)",
                )
            )
            seen["tabs_before"] = page.locator("[data-testid=terminal]").count()
            page.click(f"[data-testid=terminal-end][data-session='{ended}']")
            page.wait_for_selector(
                f"[data-testid=terminal-other][data-session='{ended}']",
                state="detached",
            )
            seen["ended_status"] = self.call("GET", f"/pty/sessions/{ended}").status
            page.click(f"[data-testid=terminal-attach][data-session='{kept}']")
            page.wait_for_selector(
                f"[data-testid=terminal][data-session='{kept}'][data-status=connected]"
            )
            page.click("[data-testid=terminal] .xterm")
            page.keyboard.type("echo ATTACHED-$((3*3))\n")
            wait_screen(page, "ATTACHED-9")
            seen["others_after"] = page.locator("[data-testid=terminal-other]").count()
            page.screenshot(path=os.path.join(SHOTS, "terminals-others.png"))

        seen = yield self.browse(steps)
        self.assertEqual(seen["listed"], sorted(made))
        self.assertEqual(seen["tabs_before"], 0)
        self.assertEqual(seen["ended_status"], 404)
        self.assertEqual(seen["others_after"], 0)
        self.assertNoCspViolation(seen)


class TerminalKeyboardTests(ConsoleCase):
    """Leaving a terminal without a mouse."""

    @inlineCallbacks
    def test_escape_then_tab_leaves(self) -> Any:
        """
        Tab and Escape alone stay in the terminal (the shell needs them);
        Escape then Tab, or Escape then Shift+Tab, moves the focus to the
        terminal's tab, and Enter there goes back in.
        """
        url = yield self.link()
        focused = (
            "(() => { const e = document.activeElement;"
            " return (e.dataset && e.dataset.testid) || e.className; })()"
        )

        def steps(page: Any, seen: dict[str, Any]) -> None:
            page.goto(url)
            page.wait_for_selector("body[data-ready=true]")
            page.click("[data-testid=terminal-new]")
            page.wait_for_selector("[data-testid=terminal][data-status=connected]")
            page.click("[data-testid=terminal] .xterm")
            page.keyboard.press("Tab")
            page.keyboard.press("Escape")
            seen["alone"] = page.evaluate(focused)
            page.keyboard.press("Tab")
            seen["escape_tab"] = page.evaluate(focused)
            page.keyboard.press("Enter")
            page.wait_for_timeout(100)
            seen["back_in"] = page.evaluate(focused)
            page.keyboard.press("Escape")
            page.keyboard.press("Shift+Tab")
            seen["escape_shift_tab"] = page.evaluate(focused)
            seen["hint"] = page.evaluate(
                "(document.querySelector('[data-testid=terminal-keys]') || {}).textContent"
            )

        seen = yield self.browse(steps)
        self.assertIn("xterm-helper-textarea", seen["alone"])
        self.assertEqual(seen["escape_tab"], "terminal-tab")
        self.assertIn("xterm-helper-textarea", seen["back_in"])
        self.assertEqual(seen["escape_shift_tab"], "terminal-tab")
        self.assertIn("Esc then Tab", seen["hint"])
        self.assertNoCspViolation(seen)
