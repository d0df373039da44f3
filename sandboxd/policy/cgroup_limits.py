# -*- test-case-name: tests.processes.test_cgroups -*-
"""
The policy's ``cgroups`` object: the daemon's and its children's shares
of a delegated cgroup v2 hierarchy (applied by
:mod:`sandboxd.processes.cgroups`; docs/operations.md).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import attrs

from sandboxd.policy.defaults import (
    CGROUP_CHILDREN_CPU_WEIGHT,
    CGROUP_CHILDREN_PIDS_MAX,
    CGROUP_DAEMON_CPU_WEIGHT,
    CGROUP_DAEMON_MEMORY_LOW,
    CGROUP_DAEMON_MEMORY_MIN,
    MIB,
)
from sandboxd.policy.sizes import parse_size

#: The keys of the policy's ``cgroups`` object.
CGROUP_KEYS = (
    "enabled",
    "daemon_cpu_weight",
    "children_cpu_weight",
    "daemon_memory_min",
    "daemon_memory_low",
    "children_memory_high",
    "children_memory_max",
    "children_pids_max",
)

#: The kernel's range of ``cpu.weight``.
_WEIGHTS = (1, 10000)
_SIZES = (
    "daemon_memory_min",
    "daemon_memory_low",
    "children_memory_high",
    "children_memory_max",
)
#: The least memory the children's limits may leave them: below it no
#: shell starts, and a typo (``64`` for ``64MiB``) would look like a hang.
CHILDREN_MEMORY_FLOOR = 16 * MIB
#: Keys whose ``null`` means "no limit" (the kernel's ``max``).
_UNLIMITED = ("children_memory_high", "children_memory_max", "children_pids_max")


@attrs.frozen
class CgroupLimits:
    """
    What the policy asks of a delegated cgroup v2 hierarchy.

    :ivar daemon_cpu_weight: ``cpu.weight`` of the daemon's leaf (1..10000).
    :ivar children_cpu_weight: ``cpu.weight`` of the children's leaf.
    :ivar daemon_memory_min: the daemon's ``memory.min`` in bytes: memory
        the kernel never reclaims from it (the reserve).
    :ivar daemon_memory_low: the daemon's ``memory.low`` in bytes: reclaimed
        only when no unprotected memory is left.
    :ivar children_memory_high: the children's ``memory.high`` (throttled
        and reclaimed above it), None for no limit.
    :ivar children_memory_max: the children's ``memory.max`` (the OOM
        killer acts inside their leaf above it), None for no limit.
    :ivar children_pids_max: the children's ``pids.max``, None for no limit.
    """

    enabled: bool = True
    daemon_cpu_weight: int = CGROUP_DAEMON_CPU_WEIGHT
    children_cpu_weight: int = CGROUP_CHILDREN_CPU_WEIGHT
    daemon_memory_min: int = CGROUP_DAEMON_MEMORY_MIN
    daemon_memory_low: int = CGROUP_DAEMON_MEMORY_LOW
    children_memory_high: int | None = None
    children_memory_max: int | None = None
    children_pids_max: int | None = CGROUP_CHILDREN_PIDS_MAX


def cgroup_limits_from(value: Any) -> CgroupLimits:
    """
    The policy's ``cgroups`` value: ``true``/``false`` or an object of
    :data:`CGROUP_KEYS` (sizes as bytes or ``"64MiB"``).

    :raises ValueError: naming the key at fault.
    """
    if isinstance(value, bool):
        return CgroupLimits(enabled=value)
    if not isinstance(value, Mapping):
        raise ValueError("cgroups: expected true, false or an object")
    fields: dict[str, Any] = {}
    for key, item in value.items():
        if key not in CGROUP_KEYS:
            raise ValueError(
                f"cgroups: unknown key {key!r} (known: {', '.join(CGROUP_KEYS)})"
            )
        fields[key] = _field(key, item)
    limits = CgroupLimits(**fields)
    if limits.daemon_memory_low < limits.daemon_memory_min:
        raise ValueError(
            "cgroups.daemon_memory_low: below daemon_memory_min "
            f"({limits.daemon_memory_low} < {limits.daemon_memory_min} bytes)"
        )
    high, top = limits.children_memory_high, limits.children_memory_max
    if high is not None and top is not None and high > top:
        raise ValueError(
            f"cgroups.children_memory_high: above children_memory_max ({high} > {top} bytes)"
        )
    return limits


def _field(key: str, item: Any) -> Any:
    """One key's value, checked."""
    if key == "enabled":
        if not isinstance(item, bool):
            raise ValueError("cgroups.enabled: expected true or false")
        return item
    if item is None and key in _UNLIMITED:
        return None
    if key in _SIZES:
        try:
            size = parse_size(item)
        except ValueError as e:
            raise ValueError(f"cgroups.{key}: {e}") from None
        if key.startswith("children_") and size < CHILDREN_MEMORY_FLOOR:
            raise ValueError(
                f"cgroups.{key}: {size} bytes is below {CHILDREN_MEMORY_FLOOR} "
                "(16MiB; no child could start); null for no limit"
            )
        return size
    if isinstance(item, bool) or not isinstance(item, int):
        raise ValueError(f"cgroups.{key}: expected an integer")
    low, high = _WEIGHTS if key.endswith("_cpu_weight") else (1, 4194304)
    if not low <= item <= high:
        raise ValueError(f"cgroups.{key}: {item} is outside {low}..{high}")
    return item
