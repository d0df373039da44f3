#!/bin/sh
# Install E2B's JavaScript code-interpreter SDK (@e2b/code-interpreter,
# the version given) with npm into DIR/node_modules, for
# tests/e2b/test_js_sdk.py; nothing when that version is there already or
# SKIP_TEST_TOOLS=1.  Never fails the build: without node, npm or the
# registry the test skips and says why.
dir="$1"
version="$2"
package="$dir/node_modules/@e2b/code-interpreter/package.json"
if [ -f "$package" ] && grep -q "\"version\": \"$version\"" "$package"; then
    exit 0
fi
if [ -n "${SKIP_TEST_TOOLS:-}" ]; then
    echo "@e2b/code-interpreter is not installed (SKIP_TEST_TOOLS is set); tests/e2b/test_js_sdk.py will skip"
    exit 0
fi
if ! command -v npm >/dev/null 2>&1; then
    echo "no npm: tests/e2b/test_js_sdk.py will skip"
    exit 0
fi
echo "installing @e2b/code-interpreter@$version with npm into $dir (for tests/e2b/test_js_sdk.py)"
mkdir -p "$dir"
npm install --silent --no-audit --no-fund --no-save --prefix "$dir" \
    "@e2b/code-interpreter@$version" >/dev/null 2>&1 \
    || echo "could not install @e2b/code-interpreter; tests/e2b/test_js_sdk.py will skip"
exit 0
