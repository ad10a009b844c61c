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
pass -m "not docker" -x -q -rs --durations=15 "$@" || exit $?
pass -m docker -v -rs --durations=15 "$@"  # the 15 slowest tests, measured, at the end
