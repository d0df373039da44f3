"""The one family of request parsers every route reads with (:mod:`sandboxd.web.params`)."""

from __future__ import annotations

import ast
import itertools
import os
from typing import Any

from twisted.trial.unittest import SynchronousTestCase

import sandboxd
from sandboxd.api.fields import Field
from sandboxd.errors import ApiError
from sandboxd.web import params
from sandboxd.web.params import flag


class FlagTests(SynchronousTestCase):
    """One set of words for every route, and a clear 400 for the rest."""

    def test_words(self) -> None:
        """JSON booleans and true/yes/on/1, false/no/off/0 in any case."""
        for value in (True, "true", "YES", "On", "1", 1):
            self.assertIs(flag(value, "x"), True, value)
        for value in (False, "false", "No", "OFF", "0", 0):
            self.assertIs(flag(value, "x", True), False, value)

    def test_missing_is_default(self) -> None:
        """Absent takes the route's default; empty says neither and is 400 (issue 22)."""
        self.assertIs(flag(None, "x", True), True)
        with self.assertRaises(ApiError):
            flag("", "x")

    def test_anything_else_is_400(self) -> None:
        """Other words are 400 invalid_param naming the parameter."""
        with self.assertRaises(ApiError) as cm:
            flag("maybe", "follow")
        self.assertEqual(
            (cm.exception.status, cm.exception.code), (400, "invalid_param")
        )
        self.assertIn("'follow'", cm.exception.message)


def refusal(test: SynchronousTestCase, call: Any) -> ApiError:
    """The 400 ``call()`` raises (failing the test if it raises nothing)."""
    with test.assertRaises(ApiError) as cm:
        call()
    test.assertEqual(cm.exception.status, 400)
    return cm.exception


class FamilyTests(SynchronousTestCase):
    """One parser per kind; every refusal is a 400 naming the field."""

    def test_strict_flag(self) -> None:
        """``words=False``: only JSON true/false, and an explicit null is refused."""
        self.assertIs(params.flag(True, "stdin", words=False), True)
        for value in ("yes", 1, None):
            error = refusal(self, lambda v=value: params.flag(v, "stdin", words=False))
            self.assertIn("'stdin'", error.message)

    def test_integer(self) -> None:
        """JSON integers and their text; bounds; missing is the default or a 400."""
        self.assertEqual(params.integer("3", "depth", 1, 1, 10), 3)
        self.assertEqual(params.integer(4, "depth", 1, 1, 10), 4)
        self.assertEqual(params.integer(2.0, "depth", 1, 1, 10), 2)
        self.assertEqual(params.integer(None, "depth", 1, 1, 10), 1)
        self.assertEqual(params.integer("", "depth", 1, 1, 10), 1)
        self.assertIsNone(params.integer(None, "limit", None))
        for bad, words in (
            ("x", "must be an integer"),
            (True, "must be an integer"),
            (1.5, "must be an integer"),
            (11, "within 1..10"),
            (0, "within 1..10"),
        ):
            error = refusal(self, lambda b=bad: params.integer(b, "depth", 1, 1, 10))
            self.assertIn("'depth'", error.message)
            self.assertIn(words, error.message)
        self.assertIn(
            "at least 0",
            refusal(self, lambda: params.integer(-1, "after", 0, low=0)).message,
        )
        self.assertEqual(
            refusal(self, lambda: params.integer(None, "signal")).message,
            "missing 'signal'",
        )

    def test_number(self) -> None:
        """Finite numbers and their text; ``clamp`` cuts to ``high`` instead of refusing."""
        self.assertEqual(params.number("1.5", "wait", 0.0), 1.5)
        self.assertEqual(params.number(900, "wait", 0.0, 0, 600, clamp=True), 600)
        for bad in ("x", True, "nan", "inf", [1]):
            error = refusal(self, lambda b=bad: params.number(b, "wait", 0.0))
            self.assertIn("'wait' must be a number", error.message)
        self.assertIn(
            "at least 0",
            refusal(self, lambda: params.number(-1, "delay", low=0)).message,
        )
        self.assertIn(
            "within 0..1",
            refusal(self, lambda: params.number(2, "q", None, 0, 1)).message,
        )

    def test_seconds(self) -> None:
        """A positive JSON number (no text), cut to the ceiling; absent is the default."""
        self.assertEqual(params.seconds(5, "timeout", None, ceiling=2.0), 2.0)
        self.assertEqual(params.seconds(None, "timeout", 30.0), 30.0)
        self.assertIsNone(params.seconds(None, "idle_timeout", None))
        for bad in ("5", True, float("nan"), 0, -1):
            error = refusal(self, lambda b=bad: params.seconds(b, "idle_timeout", None))
            self.assertIn("'idle_timeout'", error.message)

    def test_dimension(self) -> None:
        """A JSON integer a winsize holds; text and null are refused."""
        self.assertEqual(params.dimension(80, "cols"), 80)
        for bad in ("80", None, 0, 65536, True):
            error = refusal(self, lambda b=bad: params.dimension(b, "cols"))
            self.assertIn("'cols'", error.message)

    def test_strings(self) -> None:
        """Strings, required strings, lists of strings and string maps."""
        self.assertEqual(params.string("a", "tag", None), "a")
        self.assertIsNone(params.string(None, "tag", None))
        self.assertEqual(params.required("p", "path"), "p")
        self.assertEqual(
            refusal(self, lambda: params.required("", "path")).message, "missing 'path'"
        )
        self.assertIn(
            "'tag' must be a string",
            refusal(self, lambda: params.string(3, "tag", None)).message,
        )
        self.assertEqual(params.strings(["a"], "scopes", None, 1), ["a"])
        self.assertIn(
            "'scopes'",
            refusal(self, lambda: params.strings(["a", 1], "scopes")).message,
        )
        self.assertIn(
            "'scopes'",
            refusal(self, lambda: params.strings([], "scopes", None, 1)).message,
        )
        self.assertEqual(params.string_map({"A": "1"}, "env"), {"A": "1"})
        self.assertIn(
            "'env'", refusal(self, lambda: params.string_map({"A": 1}, "env")).message
        )
        self.assertEqual(params.one_of("zip", "format", ("zip", "tar.gz")), "zip")
        self.assertIn(
            "zip, tar.gz",
            refusal(
                self, lambda: params.one_of("rar", "format", ("zip", "tar.gz"))
            ).message,
        )

    def test_path(self) -> None:
        """A path without NUL (and, when asked, without a '..' segment): else invalid_path."""
        self.assertEqual(params.path(None, "path", "."), ".")
        self.assertEqual(params.path("a..b/c", "path", ".", parents=False), "a..b/c")
        for bad in ("a\x00b", "a/../b"):
            error = refusal(
                self, lambda b=bad: params.path(b, "file", None, parents=False)
            )
            self.assertEqual(error.code, "invalid_path")


def _quotes_name(node: ast.expr) -> bool:
    """Whether ``node`` is an f-string quoting a field name: ``f"'{name}' ..."``."""
    if not isinstance(node, ast.JoinedStr):
        return False
    pieces = node.values
    return any(
        isinstance(before, ast.Constant)
        and str(before.value).endswith("'")
        and isinstance(value, ast.FormattedValue)
        and isinstance(value.value, ast.Name)
        and value.value.id == "name"
        and value.conversion == -1
        for before, value in itertools.pairwise(pieces)
    )


def _generic_parsers(path: str) -> list[str]:
    """
    Functions in the module at ``path`` that take a field ``name`` and raise
    ``bad_request`` quoting it (``'{name}' must be ...``): parsers of their
    own, as the route modules used to copy.
    """
    with open(path, encoding="utf-8") as f:
        tree = ast.parse(f.read())
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            continue
        if "name" not in {a.arg for a in node.args.args}:
            continue
        for inner in ast.walk(node):
            if (
                isinstance(inner, ast.Call)
                and isinstance(inner.func, ast.Name)
                and inner.func.id == "bad_request"
                and any(_quotes_name(arg) for arg in inner.args)
            ):
                found.append(f"{os.path.basename(path)}:{node.name}")
                break
    return found


class OneFamilyTests(SynchronousTestCase):
    """The route modules parse with :mod:`sandboxd.web.params`, not their own copies."""

    def test_no_copied_parsers(self) -> None:
        """No route module (nor the PTY WebSocket) defines a parser of its own."""
        package = os.path.dirname(sandboxd.__file__)
        routes = os.path.join(package, "routes")
        paths = [
            os.path.join(routes, n)
            for n in sorted(os.listdir(routes))
            if n.endswith(".py")
        ]
        paths.append(os.path.join(package, "terminals", "websocket.py"))
        self.assertEqual([p for path in paths for p in _generic_parsers(path)], [])

    def test_check_finds_a_copy(self) -> None:
        """The check is not vacuous: it finds a parser shaped like the old copies."""
        params_path = params.__file__
        self.assertIn("params.py:integer", _generic_parsers(params_path))


class DeclaredTypesTests(SynchronousTestCase):
    """A body checked against its schema's JSON types before a handler acts."""

    FIELDS = (
        Field("name"),
        Field("count", "integer"),
        Field("ratio", "number"),
        Field("on", "boolean"),
        Field("opts", "object"),
        Field("items", "array"),
        Field("anything", "any"),
    )

    def test_right_types_and_null_pass(self) -> None:
        """Each declared type, null for any field, and anything for ``any``."""
        params.declared_types(
            {
                "name": "x",
                "count": 2,
                "ratio": 1,
                "on": False,
                "opts": {},
                "items": [],
                "anything": [1],
            },
            self.FIELDS,
        )
        params.declared_types({f.name: None for f in self.FIELDS}, self.FIELDS)

    def test_wrong_types_are_400(self) -> None:
        """A wrong type is 400 invalid_param; a boolean is no number; param on request."""
        for name, value in [
            ("name", 1),
            ("count", "2"),
            ("count", True),
            ("ratio", False),
            ("on", "true"),
            ("opts", []),
            ("items", {}),
        ]:
            with self.assertRaises(ApiError) as caught:
                params.declared_types({name: value}, self.FIELDS)
            self.assertEqual(
                (caught.exception.status, caught.exception.code), (400, "invalid_param")
            )
            self.assertNotIn("param", caught.exception.body())
        with self.assertRaises(ApiError) as caught:
            params.declared_types({"on": 1}, self.FIELDS, name_param=True)
        self.assertEqual(caught.exception.body()["param"], "on")
