#!/bin/sh
# Install the programs some tests drive, when they are missing and apt-get
# can run (root, Debian), saying so first; SKIP_TEST_TOOLS=1 installs
# nothing.  Never fails the build: a test whose tool is still missing skips
# and names the tool.
#
# chromium: the browser tests drive Debian's Chromium through Playwright
# (Playwright's own browser download cannot run here); the Python side
# comes from the `browser` extra (pip install -e '.[dev,browser]').
#
# npm: installs E2B's JavaScript SDK for tests/e2b/test_js_sdk.py and Qwen
# Code's CLI for tests/agents/test_real_cli.py
# (scripts/install-npm-package.sh, run next by make test-tools).
missing=""
command -v git >/dev/null 2>&1 || missing="$missing git"
command -v node >/dev/null 2>&1 || missing="$missing nodejs"
command -v npm >/dev/null 2>&1 || missing="$missing npm"
[ -x "${SANDBOXD_CHROMIUM:-/usr/bin/chromium}" ] || missing="$missing chromium"
[ -n "$missing" ] || exit 0
if [ -n "${SKIP_TEST_TOOLS:-}" ]; then
    echo "missing test tools:$missing (SKIP_TEST_TOOLS is set); the tests that need them will skip"
elif [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "installing test tools with apt-get (system packages):$missing"
    echo "  (make test SKIP_TEST_TOOLS=1 installs nothing; those tests then skip)"
    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $missing) >/dev/null 2>&1 \
        || echo "could not install$missing; the tests that need them will skip"
else
    echo "missing test tools:$missing (not root or no apt-get); the tests that need them will skip"
fi
exit 0
