"""
The door of the Kubernetes agent-sandbox runtime protocol (KEP-539.2):
its process API is gRPC over HTTP/2 cleartext, which the project's
Python SDK reaches with an insecure channel.

- :mod:`sandboxd.kep.wire`: a small proto3 codec (no ``protobuf`` in the
  daemon).
- :mod:`sandboxd.kep.schema`: the ``process.v1`` messages.
- :mod:`sandboxd.kep.grpc`: the gRPC server over h2c (needs the ``kep``
  extra, ``h2``).
"""
