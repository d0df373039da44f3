# -*- test-case-name: tests.test_endpoints -*-
"""
Step 2 of the pipeline: the route tree built from the endpoint table.

Each node is a plain object (twisted.web's resource traversal is never used:
the pipeline matches before any body is read): static segments are its
children, a ``{param}`` segment is its one wildcard child.  Matching walks the tree
with the normalised segments, preferring static children and falling back
to the wildcard, so ``/process/list`` beats ``/process/{pid}``.
"""

from __future__ import annotations

from sandboxd.endpoints import DOOR_METHODS, Endpoint, RouteTable, param_name


class RouteNode:
    """One path position: static children, a wildcard child, and endpoints."""

    def __init__(self) -> None:
        self.static: dict[str, RouteNode] = {}
        self.wildcard: RouteNode | None = None
        self.methods: dict[str, Endpoint] = {}

    def add(self, segments: tuple[str, ...], endpoint: Endpoint) -> None:
        """Place ``endpoint`` below this node."""
        if not segments:
            self.methods.setdefault(endpoint.method, endpoint)
            return
        head, rest = segments[0], segments[1:]
        name = param_name(head)
        if name is None:
            child = self.static.get(head)
            if child is None:
                child = self.static[head] = RouteNode()
        else:
            if self.wildcard is None:
                self.wildcard = RouteNode()
            child = self.wildcard
        child.add(rest, endpoint)

    def find(
        self, segments: tuple[str, ...], method: str, values: list[str]
    ) -> Endpoint | None:
        """The endpoint for ``method`` at ``segments``; wildcard values go to ``values``."""
        if not segments:
            return self.methods.get(method)
        head, rest = segments[0], segments[1:]
        child = self.static.get(head)
        if child is not None:
            found = child.find(rest, method, values)
            if found is not None:
                return found
        if self.wildcard is not None:
            found = self.wildcard.find(rest, method, values)
            if found is not None:
                values.insert(0, head)
                return found
        return None


class Router:
    """The HTTP routes of a table, as a tree of :class:`RouteNode`."""

    def __init__(self, table: RouteTable) -> None:
        self.root = RouteNode()
        #: Each endpoint's parameter names in path order, read from its
        #: template once here rather than on every match.
        self._names: dict[Endpoint, tuple[str, ...]] = {}
        #: ``(method, segments)`` of the paths without a parameter, found in
        #: one look-up (``/health``, ``/process/list``) rather than a walk.
        self._fixed: dict[tuple[str, tuple[str, ...]], Endpoint] = {}
        for endpoint in table:
            if endpoint.method not in DOOR_METHODS:
                self._names[endpoint] = tuple(
                    n for n in map(param_name, endpoint.segments) if n is not None
                )
                self.root.add(endpoint.segments, endpoint)
                for path in endpoint.also:
                    self.root.add(tuple(s for s in path.split("/") if s), endpoint)
        # A fixed path's own endpoint, as the walk would find it (a path a
        # template with parameters also matches keeps the walk's answer).
        for endpoint in table:
            if endpoint.method in DOOR_METHODS:
                continue
            for segments in (
                endpoint.segments,
                *(tuple(s for s in p.split("/") if s) for p in endpoint.also),
            ):
                if all(param_name(s) is None for s in segments):
                    values: list[str] = []
                    found = self.root.find(segments, endpoint.method, values)
                    if found is not None and not values:
                        self._fixed[(endpoint.method, segments)] = found

    def match(
        self, method: str, segments: tuple[str, ...]
    ) -> tuple[Endpoint, dict[str, str]] | None:
        """``(endpoint, path params)``, or None when nothing matches."""
        fixed = self._fixed.get((method, segments))
        if fixed is not None:
            return fixed, {}
        values: list[str] = []
        endpoint = self.root.find(segments, method, values)
        if endpoint is None:
            return None
        if not values:
            return endpoint, {}
        names = self._names[endpoint]
        if len(values) != len(names):  # one of the endpoint's other paths
            return endpoint, {}
        return endpoint, dict(zip(names, values, strict=True))
