"""
The E2B-compatible port (SPEC §18): envd's Connect RPC services
``process.Process`` and ``filesystem.Filesystem`` and its REST routes, so
the E2B SDKs drive sandboxd, each call governed by sandboxd's gate as the
endpoint doing the same job (the table is ``docs/e2b.md``).

- :mod:`~sandboxd.e2b.connect`: Connect framing and errors (JSON codec);
- :mod:`~sandboxd.e2b.door`: calls through the gate, one audit line each;
- :mod:`~sandboxd.e2b.process`, :mod:`~sandboxd.e2b.filesystem`,
  :mod:`~sandboxd.e2b.rest`: the procedures;
- :mod:`~sandboxd.e2b.entries`: envd's ``EntryInfo``;
- :mod:`~sandboxd.e2b.service`: the listener.
"""

from sandboxd.e2b.service import E2BService, procedures, setup

__all__ = ["E2BService", "procedures", "setup"]
