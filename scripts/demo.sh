#!/usr/bin/env bash
# Run the CPU demo (sets up .venv first).  Extra arguments go to `verl-events demo`.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup-venv.sh
exec ./.venv/bin/verl-events demo "$@"
