#!/usr/bin/env bash
# Run the test suite (sets up .venv first).  Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup-venv.sh
exec ./.venv/bin/python -m pytest "$@"
