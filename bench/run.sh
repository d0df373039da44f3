#!/usr/bin/env bash
# `make bench`: every workload against a freshly started daemon.
#
# 1. The shared harness (W0-W7) with the reference peers in the same
#    invocation, so the figures compare: stdlib-tuned and fastapi.
# 2. The raw file routes, which the peers do not have (bench/raw_files.py).
# 3. The MCP door's overhead per call over plain HTTP (bench/mcp_overhead.py).
# 4. The kernel's PTY ceiling for W6 (bench/pty_ceiling.py).
# 5. W8: start-up time and idle memory against the Twisted floor
#    (the shared harness's startup.py; STARTUP_ROUNDS, default 7).
# 6. The Python client's overhead over curl and bare httpx (bench/client_overhead.py).
# 7. The E2B door through the real e2b SDK against the HTTP API (bench/e2b_door.py).
# 8. What a group's first request costs, its imports included (bench/first_request.py).
# 9. The preview door against nginx (bench/preview_door.py; needs nginx and wrk).
# 10. A clone through POST /git/clone against plain git clone (bench/git_clone.py).
# 11. A code context against jupyter_client driving the same ipykernel (bench/code_contexts.py).
# 12. W1 at c1 against the bare Twisted floor in one invocation: how much of
#     a call is Twisted's and how much is the daemon's own (gate, policy,
#     audit, metrics, headers, JSON).
# 13. W9 with the busy work started through the daemon (bench/busy.py), and
#     the instructions of one call at c1 under callgrind (bench/percall.py,
#     PERCALL=1; slow).
#
# SHARED_BENCH points at the shared harness (default ../shared/bench);
# RUN_ARGS is passed to it (e.g. RUN_ARGS="--only W1,W1b --duration 3").
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
SHARED_BENCH="${SHARED_BENCH:-$ROOT/../shared/bench}"
PEERS="${PEERS:-stdlib-tuned fastapi}"
cd "$ROOT"
# The harness starts each server in the harness's session; bench/own_session.py gives
# the daemon a session of its own, as a service manager or a container does
# (a root daemon raises its session's scheduling group only when it leads it).
# The harness starts the daemon with a token: as root, the daemon must be told
# that its children run as root (the figures are for that), or it refuses.
CHILDREN=""
if [ "$(id -u)" = 0 ]; then
  CHILDREN=" --policy $ROOT/bench/root-children.json"
fi
if [ -x "$SHARED_BENCH/compare.sh" ]; then
  [ -d "${BENCH_HOME:-$HOME/.cache/sandboxd-bench}/venv" ] || "$SHARED_BENCH/setup.sh"
  # shellcheck disable=SC2086
  "$SHARED_BENCH/compare.sh" $PEERS \
    sandboxd="$ROOT/.venv/bin/python $ROOT/bench/own_session.py $ROOT/.venv/bin/twistd -n --pidfile= sandboxd --port tcp:{port}:interface=127.0.0.1 --pty-port tcp:{pty_port}:interface=127.0.0.1 --base-dir {base_dir}$CHILDREN"
else
  cat >&2 <<EOF
The W0-W7 harness and its reference peers are not in this repository: they
are the project's shared benchmark folder (shared/bench), expected beside the
checkout at $SHARED_BENCH. Copy or link it there, or set SHARED_BENCH=DIR,
to run W0-W7; it also needs wrk (apt-get install wrk; its setup.sh does
that). Skipping W0-W7; the raw-file, MCP and PTY-ceiling runs follow.
EOF
fi
# W8: time to the first 200 /health and idle RSS, interleaved with the Twisted
# floor (the least a Twisted Web daemon can be) in the same invocation, and
# with the same floor started by twistd (what twistd itself costs a start).
if [ -f "$SHARED_BENCH/startup.py" ]; then
  # Both plugin directories get their dropin.cache first, as an install does.
  PYTHONPATH="$ROOT/bench/twistd_floor" "$ROOT/.venv/bin/python" -c \
    "from twisted.plugin import IPlugin, getPlugins; list(getPlugins(IPlugin))"
  "$ROOT/.venv/bin/python" "$SHARED_BENCH/startup.py" --rounds "${STARTUP_ROUNDS:-7}" \
    --results "${RESULTS:-$PWD/bench-results}" \
    twisted-floor="$ROOT/.venv/bin/python $SHARED_BENCH/peers/twisted_floor.py --port {port}" \
    twistd-floor="env PYTHONPATH=$ROOT/bench/twistd_floor $ROOT/.venv/bin/twistd -n --pidfile= floor --port {port}" \
    sandboxd-twistd="$ROOT/.venv/bin/twistd -n --pidfile= sandboxd --port tcp:{port}:interface=127.0.0.1 --pty-port tcp:{pty_port}:interface=127.0.0.1 --base-dir {base_dir}$CHILDREN" \
    sandboxd-serve="$ROOT/.venv/bin/sandboxd serve --port tcp:{port}:interface=127.0.0.1 --pty-port tcp:{pty_port}:interface=127.0.0.1 --base-dir {base_dir}$CHILDREN"
else
  echo "startup.py not found at $SHARED_BENCH; skipping W8" >&2
fi
"$ROOT/.venv/bin/python" "$ROOT/bench/raw_files.py" --size-mib "${RAW_MIB:-1024}"
"$ROOT/.venv/bin/python" "$ROOT/bench/mcp_overhead.py" \
  --calls "${MCP_CALLS:-2000}" --shell-calls "${MCP_SHELL_CALLS:-400}" --rounds "${MCP_ROUNDS:-2}"
# The kernel's ceiling for W6's terminal throughput, with no server at all.
"$ROOT/.venv/bin/python" "$ROOT/bench/pty_ceiling.py"
# The E2B door against the HTTP API, through the real e2b SDK.
"$ROOT/.venv/bin/python" "$ROOT/bench/e2b_door.py" \
  --commands "${E2B_COMMANDS:-400}" --size-mib "${E2B_MIB:-64}"
# What a group's first request costs, now that it imports the group's handlers.
"$ROOT/.venv/bin/python" "$ROOT/bench/first_request.py" --daemons "${FIRST_DAEMONS:-7}"
# The preview door against nginx as a reverse proxy, to the same upstreams.
"$ROOT/.venv/bin/python" "$ROOT/bench/preview_door.py" --duration "${PREVIEW_SECONDS:-5}" \
  --messages "${PREVIEW_MESSAGES:-2000}" --rounds "${PREVIEW_ROUNDS:-3}"
# What sandboxd.client costs over curl (raw transfers) and bare httpx (/shell).
"$ROOT/.venv/bin/python" "$ROOT/bench/client_overhead.py" --size-mib "${RAW_MIB:-1024}" \
  --runs "${CLIENT_RUNS:-200}" --rounds "${CLIENT_ROUNDS:-3}"
# A clone through the git group's job against plain git clone of the same remote.
"$ROOT/.venv/bin/python" "$ROOT/bench/git_clone.py" --size-mib "${GIT_MIB:-50}" \
  --rounds "${GIT_ROUNDS:-3}"
# A code context (kernel through the hub child) against jupyter_client driving
# the same ipykernel directly: 1+1 latency and a big print's throughput.
# The daemon's priority policy off (CODE_PRIORITY=children: both kernels
# lowered instead), as docs/performance.md's figures.
"$ROOT/.venv/bin/python" "$ROOT/bench/code_contexts.py" \
  --calls "${CODE_CALLS:-300}" --mib "${CODE_MIB:-10}" --rounds "${CODE_ROUNDS:-2}" \
  --prints "${CODE_PRINTS:-3}" --priority "${CODE_PRIORITY:-off}"
# W1 /health at c1 and c32: the Twisted floor (reactor, one resource) beside
# the daemon, in one invocation.
if [ -x "$SHARED_BENCH/compare.sh" ]; then
  RUN_ARGS="--only W1 ${RUN_ARGS:-}" RESULTS="${RESULTS:-$PWD/bench-results}/w1-floor" \
    "$SHARED_BENCH/compare.sh" \
    twisted-floor="$ROOT/.venv/bin/python $SHARED_BENCH/peers/twisted_floor.py --port {port}" \
    sandboxd="$ROOT/.venv/bin/python $ROOT/bench/own_session.py $ROOT/.venv/bin/twistd -n --pidfile= sandboxd --port tcp:{port}:interface=127.0.0.1 --pty-port tcp:{pty_port}:interface=127.0.0.1 --base-dir {base_dir}$CHILDREN"
fi
# W9 with the burners started through the daemon itself: priority on and off.
"$ROOT/.venv/bin/python" "$ROOT/bench/busy.py" --seconds "${BUSY_SECONDS:-5}" --shells "${BUSY_SHELLS:-30}"
# Instructions per call at c1 (callgrind): repeatable on a loaded machine.
if [ -n "${PERCALL:-}" ] && command -v valgrind >/dev/null; then
  "$ROOT/.venv/bin/python" "$ROOT/bench/percall.py" --mode callgrind --calls "${PERCALL_CALLS:-1000}"
  "$ROOT/.venv/bin/python" "$ROOT/bench/percall.py" --mode callgrind --server floor \
    --floor "$SHARED_BENCH/peers/twisted_floor.py" --calls "${PERCALL_CALLS:-1000}"
fi
