# sandboxd: `make serve` runs the daemon, `make test` runs every test.
# Both create .venv and install the project first.

PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-stamp
WORKSPACE := workspace
# Three trial workers on two cores: the suite waits more than it computes
# (children, kernels, browsers, bounds it waits out on purpose), so a third
# worker fills the waits (docs/performance.md, "Three workers on two cores").
JOBS ?= 3

.PHONY: serve test seed-suite lint typecheck check bench compile test-tools clean

$(STAMP): setup.cfg pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[dev,browser,client,code]' --config-settings editable_mode=compat
	$(MAKE) --no-print-directory compile
	touch $(STAMP)

# What an installed daemon reads at start instead of working it out: the
# bytecode of sandboxd (an editable install gets none, and with
# PYTHONDONTWRITEBYTECODE set Python never writes it: every start would
# compile every module) and Twisted's plugin caches (dropin.cache, in
# twisted/plugins here and in site-packages; without them twistd imports
# every plugin module and tries to write the caches on each start).
compile:
	$(PY) -m compileall -q sandboxd twisted >/dev/null
	$(PY) -c "from twisted.plugin import IPlugin, getPlugins; list(getPlugins(IPlugin))"

# `make serve PORT=9100 PTY_PORT=9101` moves both listeners (loopback only).
PORT ?= 9000
PTY_PORT ?= 9001

serve: $(STAMP)
	mkdir -p $(WORKSPACE)
	$(VENV)/bin/twistd -n --pidfile= sandboxd \
		--port tcp:$(PORT):interface=127.0.0.1 \
		--pty-port tcp:$(PTY_PORT):interface=127.0.0.1 \
		--policy etc/policy.json --base-dir $(WORKSPACE)

# From npm, pinned, into the venv (scripts/install-npm-package.sh; the
# tests skip without them): E2B's JavaScript SDK for tests/e2b/test_js_sdk.py,
# the CLIs of Qwen Code, Codex and Claude Code for tests/agents/test_real_cli.py
# (the last two are native binaries of about 400 MB each), and the language
# servers pyright and typescript-language-server (with the typescript it
# drives) for tests/lsp/test_servers.py.
E2B_JS_VERSION := 2.8.0
QWEN_CODE_VERSION := 0.24.4
CODEX_VERSION := 0.169.0
CLAUDE_CODE_VERSION := 2.1.328
PYRIGHT_VERSION := 1.1.414
TSLS_VERSION := 5.3.0
TYPESCRIPT_VERSION := 6.0.3

# Tools some tests drive (git, node, chromium): when missing, and this
# machine is Debian and we are root, installed with apt-get (it says so
# first); `make test SKIP_TEST_TOOLS=1` installs nothing, and the tests
# that need a missing tool skip, saying why.
test-tools:
	@SKIP_TEST_TOOLS="$(SKIP_TEST_TOOLS)" scripts/install-test-tools.sh
	@SKIP_TEST_TOOLS="$(SKIP_TEST_TOOLS)" scripts/install-npm-package.sh $(VENV)/node-e2b \
		@e2b/code-interpreter $(E2B_JS_VERSION) tests/e2b/test_js_sdk.py
	@SKIP_TEST_TOOLS="$(SKIP_TEST_TOOLS)" scripts/install-npm-package.sh $(VENV)/node-qwen \
		@qwen-code/qwen-code $(QWEN_CODE_VERSION) tests/agents/test_real_cli.py
	@SKIP_TEST_TOOLS="$(SKIP_TEST_TOOLS)" scripts/install-npm-package.sh $(VENV)/node-codex \
		@openai/codex $(CODEX_VERSION) tests/agents/test_real_cli.py
	@SKIP_TEST_TOOLS="$(SKIP_TEST_TOOLS)" scripts/install-npm-package.sh $(VENV)/node-claude \
		@anthropic-ai/claude-code $(CLAUDE_CODE_VERSION) tests/agents/test_real_cli.py
	@SKIP_TEST_TOOLS="$(SKIP_TEST_TOOLS)" scripts/install-npm-package.sh $(VENV)/node-pyright \
		pyright $(PYRIGHT_VERSION) tests/lsp/test_servers.py
	@SKIP_TEST_TOOLS="$(SKIP_TEST_TOOLS)" scripts/install-npm-package.sh $(VENV)/node-tsls \
		typescript-language-server $(TSLS_VERSION) tests/lsp/test_servers.py \
		typescript $(TYPESCRIPT_VERSION)

# Then the seed's own test suite (agent-sandbox-server's published tests
# that start a server), every server it starts a sandboxd: what it finds
# is a failure unless scripts/seed_suite/differences.txt says why.
test: $(STAMP) test-tools
	$(PY) scripts/trial-summary.py --random=0 -j$(JOBS) tests
	$(MAKE) --no-print-directory seed-suite

# The seed's suites alone (about four minutes on two cores).
seed-suite: $(STAMP)
	$(PY) scripts/seed_suite/run.py

lint: $(STAMP)
	$(VENV)/bin/ruff check sandboxd tests twisted bench scripts
	$(VENV)/bin/ruff format --check sandboxd tests twisted bench scripts

typecheck: $(STAMP)
	$(VENV)/bin/mypy

check: lint typecheck test

bench: $(STAMP) compile
	bench/run.sh

clean:
	rm -rf $(VENV) _trial_temp* build *.egg-info
