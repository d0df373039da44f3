"""``twistd floor``: the Twisted floor under twistd (see ``floor_tap``)."""

from twisted.application.service import ServiceMaker

floor = ServiceMaker(
    "floor", "floor_tap", "The Twisted floor, started by twistd.", "floor"
)
