"""
The preview door (SPEC §23): a listener of its own where a browser opens a
web app running in the sandbox, forwarded to ``127.0.0.1:PORT`` once the
port is exposed.  Imported only when ``--preview-port`` is given or the
``preview`` group's routes are first called.
"""

from __future__ import annotations

from sandboxd.preview.service import PreviewService, setup

__all__ = ["PreviewService", "setup"]
