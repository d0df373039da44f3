"""
Code contexts (stateful kernels): kernelspecs, the kernel hub child and
its daemon-side client, contexts and their executions, and the service
that owns them. The daemon side imports no ZMQ: :mod:`sandboxd.kernels.hub`
runs in its own process.
"""
