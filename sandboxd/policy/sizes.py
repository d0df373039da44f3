# -*- test-case-name: tests.policy.test_engine -*-
"""Size strings of the policy (``5MB``, ``1GiB``, ``512KB``, plain bytes)."""

from __future__ import annotations

import math
import re

_UNITS = {
    "": 1,
    "B": 1,
    "KB": 10**3,
    "MB": 10**6,
    "GB": 10**9,
    "TB": 10**12,
    "KIB": 2**10,
    "MIB": 2**20,
    "GIB": 2**30,
    "TIB": 2**40,
}
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([A-Za-z]*)\s*$")


def parse_size(value: object) -> int:
    """
    Bytes from a policy size: an integer, or a number and a unit.

    MB is 10**6 and MiB 2**20, as SPEC §5.2 says.  Raises ValueError for
    anything else, negative numbers and booleans included.
    """
    if isinstance(value, bool):
        raise ValueError(f"not a size: {value!r}")
    if isinstance(value, int):
        if value < 0:
            raise ValueError(f"a size cannot be negative: {value}")
        return value
    if isinstance(value, str):
        m = _SIZE.match(value)
        if m and m.group(2).upper() in _UNITS:
            size = float(m.group(1)) * _UNITS[m.group(2).upper()]
            # Enough digits make the float infinite, which int() refuses
            # with an OverflowError no caller expects.
            if not math.isfinite(size):
                raise ValueError(f"not a size: {value!r} is too large")
            return int(size)
    raise ValueError(f"not a size: {value!r} (use bytes, or 512KB, 5MB, 1GiB)")
