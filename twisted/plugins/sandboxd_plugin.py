"""
The twistd plugin: ``twistd -n sandboxd --port tcp:9000 ...``.

Kept to one lazy ServiceMaker so that discovering plugins never imports
sandboxd, and never installs a reactor behind ``--reactor``'s back.
"""

from twisted.application.service import ServiceMaker

sandboxd = ServiceMaker(
    "sandboxd",
    "sandboxd.tap",
    "The in-sandbox control daemon (files, processes, terminals, tools).",
    "sandboxd",
)
