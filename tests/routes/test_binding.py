"""
``sandboxd.routes``: the table holds a stand-in for each built-in endpoint
until its group's first request, which imports the group's handlers.
"""

from __future__ import annotations

from twisted.trial.unittest import SynchronousTestCase

from sandboxd.endpoints import DOOR_METHODS, CapabilityGroup, Endpoint
from sandboxd.routes import FirstCall, builtin_table, core, load_all
from sandboxd.testing import make_request, memory_context, memory_site


class FirstCallTests(SynchronousTestCase):
    """What a stand-in stands for, and when it is replaced."""

    def test_every_endpoint_is_served_by_its_group(self) -> None:
        """
        Once every group is loaded, no built-in endpoint keeps a stand-in
        (each is handled by one of its group's modules), and every raw-body
        endpoint has a sink.
        """
        table = builtin_table()
        load_all(table)
        left = [e.id for e in table if isinstance(e.handler, FirstCall)]
        self.assertEqual(left, [])
        served = [e for e in table if e.method not in DOOR_METHODS]
        self.assertTrue(all(e.handler is not None for e in served))
        raw = [e.id for e in served if e.body == "raw" and e.sink is None]
        self.assertEqual(raw, [])

    def test_first_request_attaches_its_group(self) -> None:
        """
        A built table holds stand-ins; the first request to a group, after
        the table is frozen, answers and leaves that group's real handlers
        in the table, and only that group's.
        """
        context = memory_context()
        table = context.table
        self.assertIsInstance(table.get("health").handler, FirstCall)
        table.freeze()
        reply = make_request(memory_site(context), "GET", "/health")
        self.assertEqual((reply.status, reply.json()), (200, {"status": "ok"}))
        self.assertIs(table.get("health").handler, core.health)
        self.assertNotIsInstance(table.get("capabilities").handler, FirstCall)
        self.assertIsInstance(table.get("files_list").handler, FirstCall)
        sink = table.get("files_write_raw").sink
        self.assertIsInstance(getattr(sink, "__self__", None), FirstCall)

    def test_custom_route_keeps_its_handler(self) -> None:
        """A template's route is bound as given, never through a stand-in."""
        table = builtin_table()

        def hello(request: object) -> dict[str, str]:
            return {"hello": "world"}

        table.register("GET", "/hello", hello)
        load_all(table)
        self.assertIs(table.get("GET /hello").handler, hello)

    def test_endpoint_no_module_handles(self) -> None:
        """
        A declared endpoint that its group's modules do not handle is an
        error naming it when first called, not a loop or a silent 404.
        """
        table = builtin_table()
        table.add(
            Endpoint("ghost", "GET", "/ghost", CapabilityGroup.SYSTEM, ("system:read",))
        )
        stand_in = FirstCall(table, "ghost")
        table.bind("ghost", stand_in)
        with self.assertRaises(RuntimeError) as caught:
            stand_in(None)
        self.assertIn("'ghost'", str(caught.exception))
