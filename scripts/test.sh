#!/usr/bin/env bash
# The whole test suite: the unit tests first (no engine needed; the first failure stops it),
# then the tests that start real containers (in CI a missing engine fails them, never skips).
set -uo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh chromium || exit 1
pass() {  # pytest's 5 means "none of these tests were selected": not a failure of the suite
    .venv/bin/python -m pytest "$@"; code=$?
    [ "$code" -eq 5 ] && code=0
    return "$code"
}

# The images every Docker test starts from (the local base, the node image on it) are built while
# the unit tests run: a build waits mostly on the network and the disk, the unit tests mostly sleep.
# A build that fails here is built again, and its failure shown, by the Docker tests' own fixture.
prebuild_log=$(mktemp -t tflab-prebuild.XXXXXX)
(
    set -e
    .venv/bin/python -m tflab base
    lab=$(mktemp -d -t tflab-prebuild-lab.XXXXXX)
    trap 'rm -rf "$lab"' EXIT
    port=$((40000 + RANDOM % 20000))
    .venv/bin/python -m tflab gen --lab "$lab/lab" --nodes 1 --name "prebuild$RANDOM" \
        --ssh-port-base "$port" --tensorboard-port-base "$((port + 10))" >/dev/null
    .venv/bin/python -m tflab build --lab "$lab/lab"
) >"$prebuild_log" 2>&1 &
prebuild=$!
prebuilt() {  # wait for the build (never left half done), and say how it went
    if wait "$prebuild"; then
        echo "test: images built beside the unit tests:"; tail -n 2 "$prebuild_log"; rm -f "$prebuild_log"
    else
        echo "test: building the images beside the unit tests failed (the Docker tests' fixture tries again):"
        tail -n 20 "$prebuild_log"; echo "(all of it: $prebuild_log)"
    fi
}

pass -m "not docker" -x -q -rs --durations=15 "$@" || { code=$?; prebuilt; exit "$code"; }
prebuilt
pass -m docker -v -rs --durations=15 "$@"  # the 15 slowest tests, measured, at the end
