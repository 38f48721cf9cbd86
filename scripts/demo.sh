#!/usr/bin/env bash
# Run the demo (sets up .venv first).  Extra arguments go to the demo.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup-venv.sh
exec ./.venv/bin/python examples/quickstart.py "$@"
