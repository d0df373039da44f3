#!/bin/sh
# Install one npm package (the version given) into DIR/node_modules for the
# tests that drive it: `install-npm-package.sh DIR PACKAGE VERSION TESTS
# [PACKAGE VERSION]...`; the pairs after TESTS go in with it, in the same
# npm call (a later `npm install --prefix DIR` would prune an earlier
# one's packages).  Nothing when those versions are there already or
# SKIP_TEST_TOOLS=1.  Never fails the build: without node, npm or the
# registry, TESTS skip and say why.
dir="$1"
package="$2"
version="$3"
tests="$4"
shift 4
specs=
missing=
set -- "$package" "$version" "$@"
while [ "$#" -ge 2 ]; do
    manifest="$dir/node_modules/$1/package.json"
    if ! { [ -f "$manifest" ] && grep -q "\"version\": \"$2\"" "$manifest"; }; then
        missing=1
    fi
    specs="${specs:+$specs }$1@$2"
    shift 2
done
if [ -z "$missing" ]; then
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
echo "installing $specs with npm into $dir (for $tests)"
mkdir -p "$dir"
# $specs unquoted on purpose: one word per package.
# shellcheck disable=SC2086
npm install --silent --no-audit --no-fund --no-save --prefix "$dir" \
    $specs >/dev/null 2>&1 \
    || echo "could not install $package; $tests will skip"
exit 0
