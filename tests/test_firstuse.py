"""``sandboxd.firstuse.FirstUse``: built once, on the first attribute read."""

from __future__ import annotations

from typing import Any

from twisted.trial.unittest import SynchronousTestCase

from sandboxd.firstuse import FirstUse


class Door:
    def __init__(self) -> None:
        self.calls: list[Any] = []

    def exchange(self, value: Any) -> str:
        self.calls.append(value)
        return "answered"


class FirstUseTests(SynchronousTestCase):
    """The stand-in builds nothing until used, then forwards to one object."""

    def test_nothing_built_until_used(self) -> None:
        """Creating the stand-in does not call ``build``."""
        builds: list[Door] = []
        stand_in = FirstUse(lambda: builds.append(Door()) or builds[-1])
        self.assertFalse(stand_in.built)
        self.assertEqual(builds, [])

    def test_first_read_builds_once(self) -> None:
        """The first attribute read builds; later reads reuse the same object."""
        builds: list[Door] = []

        def build() -> Door:
            builds.append(Door())
            return builds[-1]

        stand_in = FirstUse(build)
        self.assertEqual(stand_in.exchange(1), "answered")
        self.assertEqual(stand_in.exchange(2), "answered")
        self.assertTrue(stand_in.built)
        self.assertEqual(len(builds), 1)
        self.assertEqual(builds[0].calls, [1, 2])
        self.assertIs(stand_in.get(), builds[0])

    def test_private_names_do_not_build(self) -> None:
        """Probing a private name (copy, pickle, repr helpers) builds nothing."""
        stand_in = FirstUse(Door)
        self.assertFalse(hasattr(stand_in, "__wrapped__"))
        self.assertFalse(stand_in.built)
