#!/usr/bin/env bash
# The whole test suite, Docker tests included (in CI a missing engine fails them, never skips).
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh chromium
exec .venv/bin/python -m pytest -v -rs "$@"
