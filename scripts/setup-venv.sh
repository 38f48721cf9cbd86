#!/usr/bin/env bash
# Create .venv (once) and install the project with what the demo and tests need.
# Re-running is cheap: the install is skipped while pyproject.toml is unchanged.
set -euo pipefail
cd "$(dirname "$0")/.."
python=${PYTHON:-python3.11}
command -v "$python" >/dev/null || python=python3
if [ ! -x .venv/bin/python ]; then
    echo "setup: creating .venv with $("$python" --version)"
    "$python" -m venv .venv
fi
stamp=.venv/.verl-events-installed
want=$(sha256sum pyproject.toml scripts/setup-venv.sh | sha256sum | cut -d' ' -f1)
if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
    echo "setup: installing torch (CPU) and verl-events[msprobe,nsys,demo,dev,verl-cpu] (verl 0.9.1) into .venv"
    pip="./.venv/bin/python -m pip --quiet --disable-pip-version-check"
    # torch first and pinned: a bare torch requirement may pull a multi-GB CUDA build.
    $pip install torch==2.13.0
    $pip install -e ".[msprobe,nsys,demo,dev,verl-cpu]" "verl==0.9.1"
    echo "$want" > "$stamp"
fi
