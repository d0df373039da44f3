"""Handlers of the `process` group (not built yet: reported as not implemented)."""

from __future__ import annotations

from typing import Any

HANDLERS: dict[str, Any] = {}
