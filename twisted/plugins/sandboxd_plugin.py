"""
The twistd plugin: ``twistd -n sandboxd --port tcp:9000 ...``.

Kept to one lazy ServiceMaker so that discovering plugins never imports
sandboxd, and never installs a reactor behind ``--reactor``'s back.
"""

import gc

from twisted.application.service import ServiceMaker


class _ServiceMaker(ServiceMaker):
    @property
    def options(self):  # type: ignore[no-untyped-def]
        """
        ``sandboxd.daemon.tap.Options``, imported now that twistd runs sandboxd.

        What is alive first (the interpreter, Twisted, twistd) lives as long
        as the daemon: frozen, no collection during start-up walks it again,
        and none runs until the daemon listens
        (``sandboxd.daemon.server.release_memory``).
        """
        gc.freeze()
        gc.disable()
        return super().options


sandboxd = _ServiceMaker(
    "sandboxd",
    "sandboxd.daemon.tap",
    "The in-sandbox control daemon (files, processes, terminals, tools).",
    "sandboxd",
)
