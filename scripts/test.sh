#!/usr/bin/env bash
# Run the test suite (sets up .venv first): ruff's lint and format check, pytest,
# then the core suite in a bare venv (scripts/test-core.sh).
# Extra arguments go to the main pytest run.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup-venv.sh
./.venv/bin/ruff check .
./.venv/bin/ruff format --check .
# Two workers: the Ray and verl trainer tests one after another on one (tests/conftest.py
# groups them), the rest beside them.
./.venv/bin/python -m pytest -n 2 --dist loadgroup "$@"
bash scripts/test-core.sh -p no:cacheprovider
