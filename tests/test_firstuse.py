"""``sandboxd.daemon.firstuse.ServiceOnFirstUse``: built once, on the first use."""

from __future__ import annotations

from typing import Any

from twisted.application.service import Service
from twisted.trial.unittest import SynchronousTestCase

from sandboxd.daemon.firstuse import ServiceOnFirstUse


class Door(Service):
    def __init__(self) -> None:
        self.calls: list[Any] = []
        self.reloads = 0

    def exchange(self, value: Any) -> str:
        self.calls.append(value)
        return "answered"

    def policy_reloaded(self) -> None:
        self.reloads += 1


class ServiceOnFirstUseTests(SynchronousTestCase):
    """The stand-in builds nothing until used, then forwards to one service."""

    def test_nothing_built_until_used(self) -> None:
        """Creating, starting, reloading and stopping the stand-in builds nothing."""
        builds: list[Door] = []
        stand_in = ServiceOnFirstUse(
            "door", lambda: builds.append(Door()) or builds[-1]
        )
        stand_in.startService()
        stand_in.policy_reloaded()
        self.assertIsNone(stand_in.stopService())
        self.assertFalse(stand_in.built)
        self.assertEqual(builds, [])
        self.assertEqual(stand_in.name, "door")

    def test_first_read_builds_once(self) -> None:
        """The first attribute read builds; later reads reuse the same service."""
        builds: list[Door] = []

        def build() -> Door:
            builds.append(Door())
            return builds[-1]

        stand_in = ServiceOnFirstUse("door", build)
        self.assertEqual(stand_in.exchange(1), "answered")
        self.assertEqual(stand_in.exchange(2), "answered")
        self.assertTrue(stand_in.built)
        self.assertEqual(len(builds), 1)
        self.assertEqual(builds[0].calls, [1, 2])
        self.assertIs(stand_in.get(), builds[0])

    def test_built_while_running_is_started_and_stopped(self) -> None:
        """A service built while the daemon runs is started, then stopped with it."""
        stand_in = ServiceOnFirstUse("door", Door)
        stand_in.startService()
        door = stand_in.get()
        self.assertTrue(door.running)
        stand_in.policy_reloaded()
        self.assertEqual(door.reloads, 1)
        stand_in.stopService()
        self.assertFalse(door.running)

    def test_built_before_start_starts_with_the_daemon(self) -> None:
        """Built before the daemon starts, the service starts with the stand-in."""
        stand_in = ServiceOnFirstUse("door", Door)
        door = stand_in.get()
        self.assertFalse(door.running)
        stand_in.startService()
        self.assertTrue(door.running)

    def test_private_names_do_not_build(self) -> None:
        """Probing a private name (copy, pickle, repr helpers) builds nothing."""
        stand_in = ServiceOnFirstUse("door", Door)
        self.assertFalse(hasattr(stand_in, "__wrapped__"))
        self.assertFalse(stand_in.built)
