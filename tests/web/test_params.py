"""The boolean parameter every route reads (:mod:`sandboxd.web.params`)."""

from __future__ import annotations

from twisted.trial.unittest import SynchronousTestCase

from sandboxd.errors import ApiError
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
        """Absent or empty takes the route's default."""
        self.assertIs(flag(None, "x", True), True)
        self.assertIs(flag("", "x"), False)

    def test_anything_else_is_400(self) -> None:
        """Other words are 400 invalid_param naming the parameter."""
        with self.assertRaises(ApiError) as cm:
            flag("maybe", "follow")
        self.assertEqual(
            (cm.exception.status, cm.exception.code), (400, "invalid_param")
        )
        self.assertIn("'follow'", cm.exception.message)
