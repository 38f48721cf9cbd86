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
    echo "setup: installing into .venv, about 2 minutes the first time; pip's own lines follow"
    # Progress: pip's lines for each package it collects and installs, one
    # line each (no progress bars in logs and CI); its errors go to stderr,
    # and a failing pip still fails this script (pipefail).
    pip="./.venv/bin/python -m pip --disable-pip-version-check"
    progress() { "$@" | { grep --line-buffered -E "^(Collecting|Installing|Successfully)" || true; }; }
    # torch first and pinned: a bare torch requirement may pull a multi-GB CUDA build.
    echo "setup: [1/2] torch 2.13.0 (CPU)"
    progress $pip install --progress-bar off torch==2.13.0
    echo "setup: [2/2] verl-events[msprobe,nsys,demo,dev,verl-cpu] and verl 0.9.1"
    progress $pip install --progress-bar off -e ".[msprobe,nsys,demo,dev,verl-cpu]" "verl==0.9.1"
    echo "setup: done"
    echo "$want" > "$stamp"
fi
