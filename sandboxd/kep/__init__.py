"""
The KEP door: the runtime protocol of kubernetes-sigs/agent-sandbox
(KEP-539.2), so its SDK (``k8s-agent-sandbox``) drives sandboxd, each call
governed by sandboxd's gate as the endpoint doing the same job.  (That
project's reference daemon is also called sandboxd; it is a different
program.)

- :mod:`~sandboxd.kep.access`: who a call is (``params.unauthenticated_as``);
- :mod:`~sandboxd.kep.errors`: sandboxd's refusals as the protocol's codes;
- :mod:`~sandboxd.kep.rest`: the REST filesystem API;
- :mod:`~sandboxd.kep.schema`: the ``process.v1`` messages, in
  :mod:`sandboxd.proto3`'s terms (no ``protobuf`` in the daemon);
- :mod:`~sandboxd.kep.grpc`: the gRPC server over cleartext HTTP/2 (needs
  the ``kep`` extra, ``h2``);
- :mod:`~sandboxd.kep.service`: the listeners.
"""

from sandboxd.kep.service import KepService, setup

__all__ = ["KepService", "setup"]
