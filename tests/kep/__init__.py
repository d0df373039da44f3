"""
Tests of the KEP door (kubernetes-sigs/agent-sandbox's runtime protocol).

The tests run grpcio, the client, in the process that runs the daemon
(never so in use: the daemon imports no gRPC library).  A terminal's
child is forked from that process, and grpcio's fork handlers would then
log into the terminal ("E1205 ... completion_queue ..."), which a test
reading the terminal's output sees.  They are off for the tests' process,
before grpcio is first imported.
"""

import os

os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "false")
os.environ.setdefault("GRPC_VERBOSITY", "NONE")
