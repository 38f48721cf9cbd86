#!/usr/bin/env bash
# The core suite in a bare venv: verl-events and pytest only, no torch, no tools.
# It shows the core needs none of them; the tool suites skip or are left out.
# Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
python=${PYTHON:-python3.11}
command -v "$python" >/dev/null || python=python3
if [ ! -x .venv-core/bin/python ]; then
    echo "test-core: creating .venv-core with $("$python" --version)"
    "$python" -m venv .venv-core
fi
stamp=.venv-core/.verl-events-installed
want=$(sha256sum pyproject.toml scripts/test-core.sh | sha256sum | cut -d' ' -f1)
if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
    echo "test-core: installing verl-events (no extras) and pytest into .venv-core"
    ./.venv-core/bin/python -m pip --quiet --disable-pip-version-check install -e . "pytest>=8"
    echo "$want" > "$stamp"
fi
if ./.venv-core/bin/python -c "import torch" 2>/dev/null; then
    echo "test-core: torch is importable in .venv-core; this suite must run without it" >&2
    exit 1
fi
exec ./.venv-core/bin/python -m pytest -q "$@"
