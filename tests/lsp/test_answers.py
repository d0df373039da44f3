"""What language servers answer, as an agent reads it (pure)."""

from __future__ import annotations

from twisted.trial.unittest import SynchronousTestCase

from sandboxd.lsp import answers
from sandboxd.lsp.text import Text

_RANGE = {"start": {"line": 0, "character": 4}, "end": {"line": 0, "character": 9}}


class AnswerTests(SynchronousTestCase):
    """Each of LSP's alternative shapes comes out the same way."""

    def test_uris(self) -> None:
        """file URIs with escapes become paths; others are left out."""
        self.assertEqual(answers.uri_of("/w/a b#.py"), "file:///w/a%20b%23.py")
        self.assertEqual(answers.path_of("file:///w/a%20b%23.py"), "/w/a b#.py")
        self.assertIsNone(answers.path_of("untitled:1"))
        self.assertIsNone(answers.path_of("file://otherhost/x"))
        self.assertIsNone(answers.path_of(None))

    def test_locations_and_links(self) -> None:
        """One Location, a list, LocationLinks and null all give (path, range)."""
        loc = {"uri": "file:///a.py", "range": _RANGE}
        link = {
            "targetUri": "file:///b.py",
            "targetRange": {"start": {"line": 9, "character": 0}},
            "targetSelectionRange": _RANGE,
        }
        self.assertEqual(answers.locations(loc), [("/a.py", _RANGE)])
        self.assertEqual(
            answers.locations([loc, link]), [("/a.py", _RANGE), ("/b.py", _RANGE)]
        )
        self.assertEqual(answers.locations(None), [])
        self.assertEqual(answers.locations([{"uri": "jar:x", "range": _RANGE}]), [])

    def test_diagnostics(self) -> None:
        """Severity by name (error when absent), code and source kept, file order."""
        text = Text("x = y\nimport os\n")
        items = [
            {
                "range": {"start": {"line": 1, "character": 0}},
                "message": "unused",
                "severity": 2,
                "source": "pyflakes",
            },
            {"range": _RANGE, "message": "undefined name 'y'", "code": "E0602"},
        ]
        out = answers.diagnostics(items, text)
        self.assertEqual(
            [(d["line"], d["severity"]) for d in out], [(1, "error"), (2, "warning")]
        )
        self.assertEqual(out[0]["code"], "E0602")
        self.assertEqual(out[1]["source"], "pyflakes")

    def test_hover_text(self) -> None:
        """MarkupContent, marked strings with a language, and lists of them."""
        self.assertEqual(
            answers.hover_text({"kind": "markdown", "value": "**x**"}), "**x**"
        )
        self.assertEqual(
            answers.hover_text([{"language": "python", "value": "def f()"}, "Doc."]),
            "```python\ndef f()\n```\n\nDoc.",
        )
        self.assertEqual(answers.hover_text(None), "")

    def test_completions(self) -> None:
        """Sorted by sortText, cut at the limit, the text an edit would insert."""
        result = {
            "isIncomplete": True,
            "items": [
                {"label": "b", "sortText": "2", "kind": 3},
                {"label": "a", "sortText": "1", "textEdit": {"newText": "a()"}},
                {"label": "c", "sortText": "3", "documentation": {"value": "doc"}},
            ],
        }
        items, incomplete, truncated = answers.completions(result, 2)
        self.assertEqual(
            [(i["label"], i["insert_text"]) for i in items], [("a", "a()"), ("b", "b")]
        )
        self.assertEqual(items[1]["kind"], "function")
        self.assertEqual((incomplete, truncated), (True, True))
        items, _, truncated = answers.completions(result["items"], 10)
        self.assertEqual((items[2]["documentation"], truncated), ("doc", False))

    def test_completions_ranked_by_what_was_typed(self) -> None:
        """
        The name typed first, then those starting with it (same case, then
        another), then the rest, each group in the server's order.
        """
        labels = ["Walk_x", "fwalk", "walker", "walk", "WALK", "a"]
        items = [{"label": x, "sortText": f"{n}"} for n, x in enumerate(labels)]
        ranked, _, _ = answers.completions(items, 10, "walk")
        self.assertEqual(
            [i["label"] for i in ranked],
            ["walk", "walker", "Walk_x", "WALK", "fwalk", "a"],
        )
        plain, _, _ = answers.completions(items, 10)
        self.assertEqual([i["label"] for i in plain], labels)

    def test_document_symbols_flattened(self) -> None:
        """Hierarchical symbols come out flat, each naming its container."""
        text = Text("class A:\n    def m(self):\n        pass\n")
        tree = [
            {
                "name": "A",
                "kind": 5,
                "range": {"start": {"line": 0, "character": 0}},
                "selectionRange": {"start": {"line": 0, "character": 6}},
                "children": [
                    {
                        "name": "m",
                        "kind": 6,
                        "range": {"start": {"line": 1, "character": 4}},
                        "selectionRange": {"start": {"line": 1, "character": 8}},
                    }
                ],
            }
        ]
        out = answers.document_symbols(tree, text, "/a.py")
        self.assertEqual(
            [
                (s["name"], s["kind"], s["container"], s["line"], s["column"])
                for s in out
            ],
            [("A", "class", None, 1, 7), ("m", "method", "A", 2, 9)],
        )
        self.assertEqual(out[0]["body"], {"line": 1, "end_line": 1})
        whole = {
            "start": {"line": 0, "character": 0},
            "end": {"line": 3, "character": 0},
        }
        tree[0]["range"] = whole
        out = answers.document_symbols(tree, text, "/a.py")
        # A body ending at a line's start ends with the line before.
        self.assertEqual(out[0]["body"], {"line": 1, "end_line": 3})
        flat = [
            {
                "name": "m",
                "kind": 6,
                "containerName": "A",
                "location": {"uri": "file:///a.py", "range": _RANGE},
            }
        ]
        self.assertEqual(
            answers.document_symbols(flat, text, "/a.py")[0]["container"], "A"
        )

    def test_workspace_symbols(self) -> None:
        """Each symbol with its file; one with only a URI sits at the top of its file."""
        result = [
            {
                "name": "A",
                "kind": 5,
                "location": {"uri": "file:///a.py", "range": _RANGE},
            },
            {"name": "B", "kind": 5, "location": {"uri": "file:///b.py"}},
            {"name": "C", "kind": 5, "location": {"uri": "http://x"}},
        ]
        out = answers.workspace_symbols(result)
        self.assertEqual(
            [(f["name"], p) for f, p, _ in out], [("A", "/a.py"), ("B", "/b.py")]
        )
        self.assertEqual(out[1][2]["start"], {"line": 0, "character": 0})
