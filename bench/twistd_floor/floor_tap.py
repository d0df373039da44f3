"""
The Twisted floor as a twistd plugin: ``twistd -n floor --port N``.

The same daemon as the shared harness's ``peers/twisted_floor.py`` (the
reactor, the endpoint parser, one resource answering ``GET /health``),
started by twistd instead of a script. Its time to ready against the
script's is what twistd's own machinery costs a start (its option parsing,
plugin discovery, logging set-up and imports), so ``twistd -n sandboxd``
can be read against both. Run with ``PYTHONPATH=bench/twistd_floor``.

``python bench/twistd_floor/floor_tap.py --port N`` runs the same service
as a script, with no twistd, as the shared harness's floor runs: the
floor ``bench/percall.py`` measures by default, so that it needs nothing
outside this checkout.
"""

from typing import Any

from twisted.application.service import Service
from twisted.python import usage


class Options(usage.Options):
    optParameters = [["port", None, None, "TCP port (bound on 127.0.0.1)."]]


class Listen(Service):
    """Listens on one endpoint at start, as the script does."""

    def __init__(self, description: str, factory: Any) -> None:
        self.description = description
        self.factory = factory

    def privilegedStartService(self) -> None:
        from twisted.internet import endpoints, reactor

        endpoints.serverFromString(reactor, self.description).listen(self.factory)


def makeService(options: Options) -> Service:
    from twisted.web import resource, server

    class Health(resource.Resource):
        isLeaf = True

        def render_GET(self, request: Any) -> bytes:
            request.setHeader(b"content-type", b"application/json")
            return b'{"status":"ok"}'

    site = server.Site(Health())  # type: ignore[no-untyped-call]
    return Listen(f"tcp:{options['port']}:interface=127.0.0.1", site)


def main() -> None:
    """The floor as a script: ``--port`` parsed, the service started, the reactor run."""
    from twisted.internet import reactor

    options = Options()  # type: ignore[no-untyped-call]
    options.parseOptions()  # type: ignore[no-untyped-call]
    service = makeService(options)
    service.privilegedStartService()
    reactor.run()


if __name__ == "__main__":
    main()
