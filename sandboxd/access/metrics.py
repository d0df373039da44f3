# -*- test-case-name: tests.test_metrics -*-
"""
What ``GET /metrics`` reports (SPEC §20), in the Prometheus text format.

Counting is plain Python on the hot path (a dict increment per request);
``prometheus_client`` is imported only when ``/metrics`` is first asked
for, so a daemon nobody scrapes never loads it. Gauges (streams, sessions,
processes, connections) are read from the daemon's own tables at scrape
time rather than kept up to date.

No label carries a path, a command or a token: requests are labelled by
endpoint id (a fixed table), door, status and error code, all bounded.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterator
from typing import Any

import attrs

from sandboxd.policy.defaults import METRICS_LATENCY_BUCKETS

#: Children killed by their timeout or idle timeout, daemon-wide (a child
#: does not know which daemon started it; there is one per process).
TIMEOUT_KILLS: dict[str, int] = {"timeout": 0, "idle_timeout": 0}


def child_timed_out(reason: str) -> None:
    """Count a child ended by ``timeout`` or ``idle_timeout``."""
    if reason in TIMEOUT_KILLS:
        TIMEOUT_KILLS[reason] += 1


@attrs.define
class _Histogram:
    counts: list[int] = attrs.Factory(lambda: [0] * (len(METRICS_LATENCY_BUCKETS) + 1))
    total: float = 0.0

    def observe(self, seconds: float) -> None:
        self.counts[bisect.bisect_left(METRICS_LATENCY_BUCKETS, seconds)] += 1
        self.total += seconds

    def buckets(self) -> list[tuple[str, int]]:
        running = 0
        out = []
        for bound, count in zip(METRICS_LATENCY_BUCKETS, self.counts, strict=False):
            running += count
            out.append((repr(float(bound)), running))
        out.append(("+Inf", running + self.counts[-1]))
        return out


@attrs.define
class Metrics:
    """One daemon's counters (``context.metrics``)."""

    #: (endpoint, door, status, code) -> requests answered.
    requests: dict[tuple[str, str, str, str], int] = attrs.Factory(dict)
    #: (endpoint, door) -> latency histogram.
    latency: dict[tuple[str, str], _Histogram] = attrs.Factory(dict)
    #: door -> connections closed at once because a cap was reached.
    refused: dict[str, int] = attrs.Factory(dict)
    #: "ok" / "refused" -> policy reloads.
    reloads: dict[str, int] = attrs.Factory(lambda: {"ok": 0, "refused": 0})
    #: The HTTP site (set when the daemon is built).
    site: Any = None
    #: Every listening HTTP door's site (the API's, the E2B and the
    #: agent-sandbox runtime's ports, the preview's), for their open
    #: connections by door.
    sites: set[Any] = attrs.Factory(set)

    def request(
        self,
        endpoint: str | None,
        door: str,
        status: int,
        code: str | None,
        seconds: float,
    ) -> None:
        """Count one answered request and its latency."""
        name = endpoint or "none"
        key = (name, door, str(status), code or "")
        requests = self.requests
        requests[key] = requests.get(key, 0) + 1
        histogram = self.latency.get((name, door))
        if histogram is None:
            histogram = self.latency[(name, door)] = _Histogram()
        # _Histogram.observe, here: one call less on every request.
        histogram.counts[bisect.bisect_left(METRICS_LATENCY_BUCKETS, seconds)] += 1
        histogram.total += seconds

    def connection_refused(self, door: str) -> None:
        """Count a connection closed because a connection cap was reached."""
        self.refused[door] = self.refused.get(door, 0) + 1


def _gauges(
    context: Any, held_streams: int
) -> Iterator[tuple[str, str, float, dict[str, str]]]:
    """
    (name, help, value, labels) of what is open now.

    :param held_streams: the other doors' streams open now
        (:func:`sandboxd.access.held.streams_held`, which imports the gate).
    """
    yield (
        "sandboxd_streams_active",
        "Open event streams (SSE, and the other doors' streams).",
        len(context.streams) + held_streams,
        {},
    )
    terminals = context.terminals
    if terminals is not None:
        live = sum(1 for s in terminals.table.sessions.values() if not s.ended)
        yield "sandboxd_pty_sessions_active", "Terminal sessions running.", live, {}
        yield (
            "sandboxd_connections_active",
            "Open connections.",
            len(terminals.factory.clients),
            {"door": "ws"},
        )
    if context.processes is not None:
        yield (
            "sandboxd_background_processes_active",
            "Background processes running.",
            context.processes.running_count(),
            {},
        )
    agents = context.agents.existing() if context.agents is not None else None
    yield (
        "sandboxd_agent_sessions_active",
        "Coding-agent sessions running.",
        len(agents.live()) if agents is not None else 0,
        {},
    )
    doors: dict[str, int] = {"http": 0}
    for site in context.metrics.sites:
        doors[site.door] = doors.get(site.door, 0) + len(site.connections)
    for door, count in sorted(doors.items()):
        yield (
            "sandboxd_connections_active",
            "Open connections.",
            count,
            {"door": door},
        )


class _Collector:
    """Hands prometheus_client this daemon's numbers at scrape time."""

    def __init__(self, context: Any, held_streams: int) -> None:
        self.context = context
        self.held_streams = held_streams

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import (
            CounterMetricFamily,
            GaugeMetricFamily,
            HistogramMetricFamily,
        )

        metrics: Metrics = self.context.metrics
        requests = CounterMetricFamily(
            "sandboxd_requests",
            "Requests answered, by endpoint id, door, status and error code.",
            labels=["endpoint", "door", "status", "code"],
        )
        for labels, count in sorted(metrics.requests.items()):
            requests.add_metric(list(labels), count)
        yield requests
        latency = HistogramMetricFamily(
            "sandboxd_request_duration_seconds",
            "Time from a request's headers to its last byte.",
            labels=["endpoint", "door"],
        )
        for (endpoint, door), histogram in sorted(metrics.latency.items()):
            latency.add_metric(
                [endpoint, door], histogram.buckets(), sum_value=histogram.total
            )
        yield latency
        refused = CounterMetricFamily(
            "sandboxd_connections_refused",
            "Connections closed at once because a connection cap was reached.",
            labels=["door"],
        )
        for door in ("http", *sorted(set(metrics.refused) - {"http"})):
            refused.add_metric([door], metrics.refused.get(door, 0))
        yield refused
        killed = CounterMetricFamily(
            "sandboxd_children_timed_out",
            "Children ended by their timeout or idle timeout.",
            labels=["reason"],
        )
        for reason, count in sorted(TIMEOUT_KILLS.items()):
            killed.add_metric([reason], count)
        yield killed
        reloads = CounterMetricFamily(
            "sandboxd_policy_reloads",
            "Policy reloads (SIGHUP), applied or refused.",
            labels=["result"],
        )
        for result, count in sorted(metrics.reloads.items()):
            reloads.add_metric([result], count)
        yield reloads
        dropped = CounterMetricFamily(
            "sandboxd_audit_dropped",
            "Audit records the audit file could not take (a full disk), dropped whole.",
        )
        dropped.add_metric([], self.context.audit.dropped)
        yield dropped
        spans = CounterMetricFamily(
            "sandboxd_trace_spans",
            "Spans of calls by what became of them: exported to the collector,"
            " dropped (the queue was full) or failed (the collector did not take them).",
            labels=["result"],
        )
        for result, count in sorted(self.context.tracer.counts.items()):
            spans.add_metric([result], count)
        yield spans
        policy = self.context.policy
        info = GaugeMetricFamily(
            "sandboxd_policy_info",
            "The policy in force (value 1): its revision and preset.",
            labels=["revision", "preset"],
        )
        info.add_metric([policy.revision or "", policy.preset or ""], 1)
        yield info
        yield _build_info()
        families: dict[str, Any] = {}
        for name, help_text, value, where in _gauges(self.context, self.held_streams):
            family = families.get(name)
            if family is None:
                family = families[name] = GaugeMetricFamily(
                    name, help_text, labels=sorted(where)
                )
            family.add_metric([where[k] for k in sorted(where)], value)
        yield from families.values()


def _build_info() -> Any:
    """``sandboxd_build_info``: this daemon's version and Python (value 1)."""
    import platform

    from prometheus_client.core import GaugeMetricFamily

    from sandboxd._version import __version__

    family = GaugeMetricFamily(
        "sandboxd_build_info",
        "The daemon's build (value 1): its version and the Python it runs on.",
        labels=["version", "python"],
    )
    family.add_metric([__version__, platform.python_version()], 1)
    return family


def render(context: Any, held_streams: int = 0) -> tuple[bytes, str]:
    """
    The exposition text and its content type (imports prometheus_client):
    this daemon's numbers, and the process's own (``process_*``: resident
    memory, CPU seconds, open and maximum descriptors, start time, from
    /proc).
    """
    from prometheus_client import (
        CONTENT_TYPE_LATEST,
        CollectorRegistry,
        ProcessCollector,
        generate_latest,
    )

    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Collector(context, held_streams))
    ProcessCollector(registry=registry)
    return generate_latest(registry), CONTENT_TYPE_LATEST
