#!/bin/sh
# Install one npm package (the version given) into DIR/node_modules for the
# tests that drive it: `install-npm-package.sh DIR PACKAGE VERSION TESTS`.
# Nothing when that version is there already or SKIP_TEST_TOOLS=1.  Never
# fails the build: without node, npm or the registry, TESTS skip and say why.
dir="$1"
package="$2"
version="$3"
tests="$4"
manifest="$dir/node_modules/$package/package.json"
if [ -f "$manifest" ] && grep -q "\"version\": \"$version\"" "$manifest"; then
    exit 0
fi
if [ -n "${SKIP_TEST_TOOLS:-}" ]; then
    echo "$package is not installed (SKIP_TEST_TOOLS is set); $tests will skip"
    exit 0
fi
if ! command -v npm >/dev/null 2>&1; then
    echo "no npm: $tests will skip"
    exit 0
fi
echo "installing $package@$version with npm into $dir (for $tests)"
mkdir -p "$dir"
npm install --silent --no-audit --no-fund --no-save --prefix "$dir" \
    "$package@$version" >/dev/null 2>&1 \
    || echo "could not install $package; $tests will skip"
exit 0
