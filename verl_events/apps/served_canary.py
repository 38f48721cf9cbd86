"""Deprecated: the canary's vLLM and SGLang side is :mod:`verl_events.observers.weight_sync.served`.

This module re-exports it, with a DeprecationWarning, until 0.3: a config's
``canary_engine: verl_events.apps.served_canary:vllm_canary`` still works.
"""

from __future__ import annotations

import warnings

from verl_events.observers.weight_sync.served import (
    SAMPLING,
    canary_request,
    sglang_canary,
    side_from_outputs,
    vllm_canary,
)

__all__ = ["SAMPLING", "canary_request", "sglang_canary", "side_from_outputs", "vllm_canary"]

warnings.warn(
    "verl_events.apps.served_canary moved to verl_events.observers.weight_sync.served; the old module goes in 0.3",
    DeprecationWarning,
    stacklevel=2,
)
