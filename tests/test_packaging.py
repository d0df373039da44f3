# -*- test-case-name: tests.test_packaging -*-
"""What the wheel holds: every package of the tree, listed in setup.cfg."""

from __future__ import annotations

import configparser
import os

from twisted.trial.unittest import SynchronousTestCase

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def packages_on_disk() -> set[str]:
    """Every directory under sandboxd/ with an __init__.py, as a dotted name."""
    found = set()
    for folder, _, files in os.walk(os.path.join(ROOT, "sandboxd")):
        if "__init__.py" in files:
            relative = os.path.relpath(folder, ROOT)
            found.add(relative.replace(os.sep, "."))
    return found


class PackagesTests(SynchronousTestCase):
    """setup.cfg lists packages by hand (``find:`` would miss twisted.plugins)."""

    def test_every_package_is_listed(self) -> None:
        """A package missing from setup.cfg would be missing from the wheel."""
        config = configparser.ConfigParser()
        config.read(os.path.join(ROOT, "setup.cfg"))
        listed = set(config["options"]["packages"].split())
        self.assertEqual(packages_on_disk() - listed, set())
