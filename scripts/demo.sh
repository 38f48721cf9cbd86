#!/usr/bin/env bash
# Run the CPU demo (sets up .venv first).  Extra arguments go to `verl-events demo`,
# e.g. --steps 8 --nproc 2 --config examples/stacked.yaml --save-path outputs/mine
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup-venv.sh
exec ./.venv/bin/verl-events demo "$@"
