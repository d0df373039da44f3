"""
The console's Code page in headless Chromium: code contexts as cells
against a real daemon and a real kernel (the built-in ``sandboxd-python``,
which needs nothing but the standard library; ipykernel for the plot).
"""

from __future__ import annotations

import json
import os
from typing import Any

from twisted.internet.defer import inlineCallbacks
from twisted.trial.unittest import SkipTest

from tests.kernels.test_contexts import KERNEL_START_SECONDS
from tests.webui import test_browser
from tests.webui.test_browser import POLICY, ConsoleCase, wait_true

CODE_POLICY: dict[str, Any] = {
    **POLICY,
    "groups": {"console": True, "code": True},
    "endpoints": {
        **POLICY["endpoints"],
        "group:code": {
            "limits": {
                "interrupt_grace_seconds": 3,
                "start_timeout_seconds": KERNEL_START_SECONDS,
            }
        },
    },
}

#: The newest cell, and what it shows.
LAST = "[data-testid=code-cell]:last-child"


def run_cell(page: Any, code: str, state: str = "ok", timeout: float = 20.0) -> None:
    """Type ``code`` into the editor, run it, and wait until its cell ends in ``state``."""
    before = page.locator("[data-testid=code-cell]").count()
    page.fill("[data-testid=code-input]", code)
    page.click("[data-testid=code-run]")
    wait_true(
        page,
        f"document.querySelectorAll('[data-testid=code-cell]').length === {before + 1}"
        f" && document.querySelector('{LAST}').dataset.state === '{state}'",
        timeout,
    )


def last_text(page: Any, testid: str) -> str:
    """The text of ``testid`` in the newest cell."""
    return str(page.text_content(f"{LAST} [data-testid={testid}]"))


def new_context(page: Any, kernel: str) -> None:
    """Open the Code page and start a context of ``kernel``."""
    page.click("[data-testid=nav-code]")
    page.wait_for_selector(
        f"[data-testid=code-kernel] option[value='{kernel}']", state="attached"
    )
    page.select_option("[data-testid=code-kernel]", kernel)
    page.click("[data-testid=code-context-new]")
    page.wait_for_selector(
        "[data-testid=code-context-status][data-state=idle]",
        timeout=KERNEL_START_SECONDS * 1000,
    )


class CodeCellTests(ConsoleCase):
    """Cells in a context of the built-in kernel."""

    policy = CODE_POLICY

    @inlineCallbacks
    def test_state_stream_errors_interrupt_restart(self) -> Any:
        """
        ``x = 41`` then ``x + 1`` shows 42; prints appear while the cell
        still runs; an error shows its name and traceback; HTML is offered
        as a download and never rendered; a reload shows the cells again;
        a ``time.sleep(60)`` cell is interrupted; a restart says state was
        lost (``x`` is gone); delete ends the kernel; no CSP violation.
        """
        url = yield self.link()

        def steps(page: Any, seen: dict[str, Any]) -> None:
            page.goto(url)
            page.wait_for_selector("body[data-ready=true]")
            new_context(page, "sandboxd-python")
            seen["cid"] = page.input_value("[data-testid=code-context]")
            run_cell(page, "x = 41")
            run_cell(page, "x + 1")
            seen["result"] = last_text(page, "code-result")
            page.fill(
                "[data-testid=code-input]",
                "import time\nfor i in range(3):\n    print('tick', i, flush=True)\n    time.sleep(0.5)",
            )
            page.click("[data-testid=code-run]")
            page.wait_for_selector(f"{LAST} [data-testid=code-stdout]")
            seen["running_when_printed"] = page.get_attribute(LAST, "data-state")
            wait_true(page, f"document.querySelector('{LAST}').dataset.state === 'ok'")
            seen["ticks"] = last_text(page, "code-stdout")
            run_cell(page, "1/0", state="error")
            seen["error"] = last_text(page, "code-error-name")
            seen["traceback"] = last_text(page, "code-traceback")
            run_cell(
                page,
                "class Page:\n    def _repr_html_(self):\n"
                "        return '<b id=rendered>bold</b><img src=x onerror=alert(1)>'\n"
                "    def __repr__(self):\n        return 'a Page'\nPage()",
            )
            seen["html_buttons"] = page.eval_on_selector_all(
                f"{LAST} [data-testid=code-download]",
                "els => els.map(e => e.dataset.mime)",
            )
            seen["html_text"] = last_text(page, "code-text")
            seen["rendered"] = page.locator("#rendered").count()
            page.screenshot(path=os.path.join(test_browser.SHOTS, "code-cells.png"))
            page.reload()
            page.wait_for_selector("body[data-ready=true]")
            wait_true(
                page,
                "document.querySelectorAll('[data-testid=code-cell]').length === 5"
                " && document.querySelectorAll('[data-testid=code-result]').length === 2",
            )
            seen["after_reload"] = page.eval_on_selector_all(
                "[data-testid=code-result] [data-testid=code-text]",
                "els => els.map(e => e.textContent)",
            )
            page.fill("[data-testid=code-input]", "import time\ntime.sleep(60)")
            page.click("[data-testid=code-run]")
            page.wait_for_selector(f"{LAST}[data-state=running]")
            page.click("[data-testid=code-interrupt]")
            wait_true(
                page,
                f"document.querySelector('{LAST}').dataset.state === 'interrupted'",
                timeout=15,
            )
            seen["interrupted_error"] = page.eval_on_selector_all(
                f"{LAST} [data-testid=code-error]",
                "els => els.map(e => e.dataset.ename)",
            )
            run_cell(page, "x")
            seen["x_after_interrupt"] = last_text(page, "code-text")
            page.click("[data-testid=code-restart]")
            page.wait_for_selector("[data-testid=banner][data-kind=context-restarted]")
            seen["restart_banner"] = page.text_content("[data-testid=banner]")
            page.wait_for_selector(
                "[data-testid=code-context-status][data-state=idle]",
                timeout=KERNEL_START_SECONDS * 1000,
            )
            run_cell(page, "x", state="error")
            seen["x_after_restart"] = last_text(page, "code-error-name")
            page.screenshot(path=os.path.join(test_browser.SHOTS, "code-restarted.png"))
            page.click("[data-testid=code-delete]")
            page.click("[data-testid=code-delete-confirm]")
            wait_true(
                page,
                "document.querySelectorAll('[data-testid=code-cell]').length === 0",
            )

        seen = yield self.browse(steps)
        self.assertEqual(seen["result"], "42")
        self.assertEqual(seen["running_when_printed"], "running")
        self.assertEqual(seen["ticks"], "tick 0\ntick 1\ntick 2\n")
        self.assertIn("ZeroDivisionError", seen["error"])
        self.assertIn("1/0", seen["traceback"])
        self.assertEqual(seen["html_buttons"], ["text/html"])
        self.assertEqual(seen["html_text"], "a Page")
        self.assertEqual(seen["rendered"], 0)
        self.assertEqual(seen["after_reload"], ["42", "a Page"])
        self.assertEqual(seen["interrupted_error"], ["KeyboardInterrupt"])
        self.assertEqual(seen["x_after_interrupt"], "41")
        self.assertIn("state", seen["restart_banner"])
        self.assertIn("NameError", seen["x_after_restart"])
        listed = yield self.request("GET", "/code/contexts")
        self.assertEqual(
            [c["id"] for c in listed.json()["contexts"] if c["state"] != "closed"], []
        )
        self.assertNoCspViolation(seen)


class CodePlotTests(ConsoleCase):
    """Rich results from ipykernel: a matplotlib figure, JSON, SVG."""

    policy = CODE_POLICY

    def setUp(self) -> Any:
        from tests.kernels.test_contexts import need_ipykernel

        need_ipykernel()
        try:
            import matplotlib  # noqa: F401
        except ImportError:
            raise SkipTest("matplotlib is not installed") from None
        return super().setUp()

    @inlineCallbacks
    def test_plot_json_svg(self) -> Any:
        """
        ``plt.plot`` then ``plt.show()`` in a python3 context shows the
        figure as an image; JSON is shown as indented text; an SVG (with a
        script in it) is only offered for download.
        """
        url = yield self.link()

        def steps(page: Any, seen: dict[str, Any]) -> None:
            page.goto(url)
            page.wait_for_selector("body[data-ready=true]")
            new_context(page, "python3")
            run_cell(
                page,
                "import matplotlib.pyplot as plt\nplt.plot([1, 3, 2])\nplt.show()",
                timeout=60,
            )
            page.wait_for_selector(f"{LAST} [data-testid=code-image]")
            wait_true(
                page,
                f"document.querySelector('{LAST} [data-testid=code-image]').naturalWidth > 0",
            )
            seen["src"] = page.get_attribute(f"{LAST} [data-testid=code-image]", "src")
            seen["width"] = page.evaluate(
                f"document.querySelector('{LAST} [data-testid=code-image]').naturalWidth"
            )
            run_cell(
                page,
                "from IPython.display import JSON, SVG, display\n"
                "display(JSON({'rows': [1, 2]}))\n"
                'SVG(\'<svg xmlns="http://www.w3.org/2000/svg" id="drawn">'
                "<script>alert(1)</script></svg>')",
                timeout=30,
            )
            seen["json"] = last_text(page, "code-json")
            seen["svg_buttons"] = page.eval_on_selector_all(
                f"{LAST} [data-testid=code-download]",
                "els => els.map(e => e.dataset.mime)",
            )
            seen["svg_drawn"] = page.locator("svg#drawn").count()
            page.screenshot(path=os.path.join(test_browser.SHOTS, "code-plot.png"))

        seen = yield self.browse(steps)
        self.assertTrue(seen["src"].startswith("blob:"))
        self.assertGreater(seen["width"], 100)
        self.assertEqual(json.loads(seen["json"]), {"rows": [1, 2]})
        self.assertIn("\n", seen["json"])  # indented
        self.assertEqual(seen["svg_buttons"], ["image/svg+xml"])
        self.assertEqual(seen["svg_drawn"], 0)
        self.assertNoCspViolation(seen)


class CodeQueueTests(ConsoleCase):
    """Cells sent while one runs, and what a read-only link gets."""

    policy = CODE_POLICY

    @inlineCallbacks
    def test_queued_cells_then_interrupt(self) -> Any:
        """
        Seven cells sent behind a ``time.sleep(60)`` (more than the six
        connections a browser opens to one origin) wait their turn;
        Interrupt still reaches the daemon; then they run in order.
        """
        url = yield self.link()

        def steps(page: Any, seen: dict[str, Any]) -> None:
            page.goto(url)
            page.wait_for_selector("body[data-ready=true]")
            new_context(page, "sandboxd-python")
            page.fill("[data-testid=code-input]", "import time\ntime.sleep(60)")
            page.click("[data-testid=code-run]")
            page.wait_for_selector("[data-testid=code-cell][data-state=running]")
            for _ in range(7):
                page.fill(
                    "[data-testid=code-input]", "n = globals().get('n', 0) + 1\nn"
                )
                page.click("[data-testid=code-run]")
            wait_true(
                page,
                "[...document.querySelectorAll('[data-testid=code-cell]')]"
                ".every(c => c.dataset.execution)",
            )
            seen["states_before"] = page.eval_on_selector_all(
                "[data-testid=code-cell]", "els => els.map(e => e.dataset.state)"
            )
            page.click("[data-testid=code-interrupt]")
            wait_true(
                page,
                f"document.querySelector('{LAST}').dataset.state === 'ok'",
                timeout=20,
            )
            seen["states"] = page.eval_on_selector_all(
                "[data-testid=code-cell]", "els => els.map(e => e.dataset.state)"
            )
            seen["values"] = page.eval_on_selector_all(
                "[data-testid=code-result]", "els => els.map(e => e.textContent)"
            )

        seen = yield self.browse(steps)
        self.assertEqual(seen["states_before"], ["running"] + ["queued"] * 7)
        self.assertEqual(seen["states"], ["interrupted"] + ["ok"] * 7)
        self.assertEqual(seen["values"], [str(i) for i in range(1, 8)])
        self.assertNoCspViolation(seen)

    @inlineCallbacks
    def test_read_only_link(self) -> Any:
        """
        A ``code:read`` link sees a context's cells and their output, and
        a cell the agent runs meanwhile appears with its output; it has no
        editor, Run, New context, Interrupt, Restart or Delete; a forced
        execute with it is 403.
        """
        made = yield self.request(
            "POST", "/code/contexts", {"kernel": "sandboxd-python"}
        )
        self.assertEqual(made.status, 201, made.body)
        cid = made.json()["id"]
        ran = yield self.request(
            "POST", f"/code/contexts/{cid}/execute", {"code": "print('seen'); 6 * 7"}
        )
        self.assertEqual(ran.json()["state"], "ok", ran.body)
        url = yield self.link(scopes=["core:read", "code:read"])

        def steps(page: Any, seen: dict[str, Any]) -> None:
            page.goto(url)
            page.wait_for_selector("body[data-ready=true]")
            page.wait_for_selector("[data-testid=code-cell][data-state=ok]")
            seen["navs"] = page.eval_on_selector_all(
                "nav [data-testid]", "els => els.map(e => e.dataset.testid)"
            )
            seen["stdout"] = page.text_content("[data-testid=code-stdout]")
            seen["result"] = page.text_content("[data-testid=code-result]")
            self.call(
                "POST",
                f"/code/contexts/{cid}/execute",
                {"code": "print('agent was here')"},
            )
            wait_true(
                page,
                "document.querySelectorAll('[data-testid=code-cell][data-state=ok]').length === 2",
            )
            seen["watched"] = page.text_content(f"{LAST} [data-testid=code-stdout]")
            page.screenshot(path=os.path.join(test_browser.SHOTS, "code-watching.png"))
            seen["controls"] = {
                t: page.locator(f"[data-testid={t}]").count()
                for t in (
                    "code-input",
                    "code-run",
                    "code-context-new",
                    "code-kernel",
                    "code-interrupt",
                    "code-restart",
                    "code-delete",
                )
            }
            seen["forced"] = page.evaluate(
                f"(async () => {{ const r = await fetch('/code/contexts/{cid}/execute', {{method: 'POST',"
                " headers: {Authorization: 'Bearer ' + sessionStorage.getItem('sandboxd.console.link'),"
                " 'Content-Type': 'application/json'}, body: JSON.stringify({code: '1'})});"
                " return {status: r.status, body: await r.json()}; })()"
            )

        seen = yield self.browse(steps)
        self.assertEqual(seen["navs"], ["nav-code"])
        self.assertEqual(seen["stdout"], "seen\n")
        self.assertEqual(seen["result"], "42")
        self.assertEqual(seen["watched"], "agent was here\n")
        self.assertEqual(set(seen["controls"].values()), {0})
        self.assertEqual(seen["forced"]["status"], 403)
        self.assertEqual(seen["forced"]["body"]["code"], "missing_scope")
        self.assertNoCspViolation(seen)
