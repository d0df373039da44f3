# -*- test-case-name: tests.processes.test_priority -*-
"""
The policy's ``priority`` object: how far below the daemon its children
run (applied by :mod:`sandboxd.processes.priority`; docs/operations.md).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import attrs

from sandboxd.policy.defaults import (
    AGENT_NICE,
    CHILD_GROUP_AFTER_MAX_MS,
    CHILD_GROUP_AFTER_MS,
    CHILD_IO_LEVEL,
    CHILD_NICE,
    CHILD_OOM_SCORE_ADJ,
    DAEMON_NICE,
    DAEMON_OOM_SCORE_ADJ,
)

#: The keys of the policy's ``priority`` object.
PRIORITY_KEYS = (
    "enabled",
    "children_nice",
    "children_group_nice",
    "children_group_after_ms",
    "agents_nice",
    "children_io_level",
    "children_oom_score_adj",
    "daemon_nice",
    "daemon_oom_score_adj",
)


@attrs.frozen
class Priorities:
    """
    What the policy asks for (``priority`` in the document).

    :ivar children_nice: nice value of every child (0..19; 0 the default
        priority, never the daemon's own when it raised it).
    :ivar children_group_nice: nice value of every child's session group
        under the kernel's autogroup scheduling (0..19), None for
        ``children_nice``'s: a group's weight counts once per session, so
        many busy sessions add up against the daemon's one group.
    :ivar children_group_after_ms: how long a child's session group runs
        before it is lowered to ``children_group_nice``; until then it is
        only as light as keeping all the children's groups within the
        daemon's share requires.  A short command (``/shell true``) ends
        before and competes with other work on equal terms; a build is
        lowered a moment after it starts.  0 lowers every group at once.
    :ivar agents_nice: nice value of each agent process and of its session
        group (0..19, never below the daemon's): the agent answers the
        user's every turn, so it is not made to wait behind the sandbox's
        work; the tools it runs itself inherit it.
    :ivar children_io_level: best-effort I/O level of every child (0..7,
        7 the lowest), or None to leave it.
    :ivar children_oom_score_adj: every child's ``oom_score_adj``
        (-1000..1000).
    :ivar daemon_nice: the daemon's own nice value when it may lower it
        (root; -20..0).
    :ivar daemon_oom_score_adj: the daemon's own ``oom_score_adj`` when it
        may lower it (root; -1000..0).
    """

    enabled: bool = True
    children_nice: int = CHILD_NICE
    children_group_nice: int | None = None
    children_group_after_ms: int = CHILD_GROUP_AFTER_MS
    agents_nice: int = AGENT_NICE
    children_io_level: int | None = CHILD_IO_LEVEL
    children_oom_score_adj: int = CHILD_OOM_SCORE_ADJ
    daemon_nice: int = DAEMON_NICE
    daemon_oom_score_adj: int = DAEMON_OOM_SCORE_ADJ


_RANGES = {
    "children_nice": (0, 19),
    "children_group_nice": (0, 19),
    "children_group_after_ms": (0, CHILD_GROUP_AFTER_MAX_MS),
    "agents_nice": (0, 19),
    "children_io_level": (0, 7),
    "children_oom_score_adj": (-1000, 1000),
    "daemon_nice": (-20, 0),
    "daemon_oom_score_adj": (-1000, 0),
}


def priorities_from(value: Any) -> Priorities:
    """
    The policy's ``priority`` value: ``true``/``false`` or an object of
    :data:`PRIORITY_KEYS`.

    :raises ValueError: naming the key at fault.
    """
    if isinstance(value, bool):
        return Priorities(enabled=value)
    if not isinstance(value, Mapping):
        raise ValueError("priority: expected true, false or an object")
    fields: dict[str, Any] = {}
    for key, item in value.items():
        if key not in PRIORITY_KEYS:
            raise ValueError(
                f"priority: unknown key {key!r} (known: {', '.join(PRIORITY_KEYS)})"
            )
        if key == "enabled":
            if not isinstance(item, bool):
                raise ValueError("priority.enabled: expected true or false")
        elif key in ("children_io_level", "children_group_nice") and item is None:
            pass
        else:
            low, high = _RANGES[key]
            if isinstance(item, bool) or not isinstance(item, int):
                raise ValueError(f"priority.{key}: expected an integer")
            if not low <= item <= high:
                raise ValueError(f"priority.{key}: {item} is outside {low}..{high}")
        fields[key] = item
    return Priorities(**fields)
