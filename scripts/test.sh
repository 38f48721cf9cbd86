#!/usr/bin/env bash
# Run the test suite (sets up .venv first): ruff's lint and format check, pytest,
# then the core suite in a bare venv (scripts/test-core.sh).
# Extra arguments go to the main pytest run.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup-venv.sh
./.venv/bin/ruff check .
./.venv/bin/ruff format --check .
./.venv/bin/python -m pytest "$@"
bash scripts/test-core.sh -p no:cacheprovider
