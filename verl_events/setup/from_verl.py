"""verl's own profiler config, mapped onto our observers.

A config holding verl's ``global_profiler`` block (as in verl's precision
debugger guide) and the role blocks' ``profiler.enable`` is translated to
the equivalent ``observers:`` list; the rest of a full verl config is
verl's business and ignored here.  What verl does, we do:

* ``global_profiler.steps`` selects the steps; null profiles nothing;
* only roles whose ``profiler.enable`` is true are observed;
* ``precision_debugger`` dumps per stage under ``{save_path}/step_{N}/{stage}``,
  skips ``rollout_generate``, defaults to verl's training stages, and warns
  that ``precision_debugger.steps`` is deprecated and ignored;
* nsys / npu / torch take their options from verl's tool configs, and
  their rank selection from the role block (``all_ranks``, ``ranks``, else
  rank 0).
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping
from typing import Any

from verl_events.events.errors import ConfigError, VerlEventsWarning

ROLE_BLOCKS = {
    "actor": ("actor_rollout_ref", "actor"),
    "ref": ("actor_rollout_ref", "ref"),
    "rollout": ("actor_rollout_ref", "rollout"),
    "critic": ("critic",),
    "reward_model": ("reward_model",),
}
#: The stages verl's precision debugger knows, rollout_generate excluded.
PRECISION_DEBUGGER_STAGES = (
    "actor_update",
    "actor_compute_log_prob",
    "ref_compute_log_prob",
    "compute_values",
    "critic_update",
    "compute_rm_score",
)
SUPPORTED_TOOLS = ("precision_debugger", "nsys", "npu", "torch")


def is_verl_config(raw: Mapping[str, Any]) -> bool:
    return "global_profiler" in raw


def _block(raw: Mapping[str, Any], *path: str) -> Mapping[str, Any]:
    node: Any = raw
    for key in path:
        node = node.get(key) if isinstance(node, Mapping) else None
    return node if isinstance(node, Mapping) else {}


def _role_profiler(raw: Mapping[str, Any], role: str) -> Mapping[str, Any]:
    return _block(_block(raw, *ROLE_BLOCKS[role]), "profiler")


def from_verl_config(raw: Mapping[str, Any]) -> dict[str, Any]:
    """Our config (``save_path``, ``strict``, ``observers``) for verl's keys.

    An ``observers:`` list given beside verl's keys is kept, after the
    translated observer; ``strict`` and ``max_failures`` likewise.
    """
    profiler = raw["global_profiler"]
    if not isinstance(profiler, Mapping):
        raise ConfigError(
            f"global_profiler: {profiler!r} is not allowed; use a mapping like verl's global_profiler block"
        )
    ours = {key: raw[key] for key in ("strict", "max_failures") if key in raw}
    ours["save_path"] = profiler.get("save_path") or "outputs/profile"
    extra = list(raw.get("observers") or [])
    tool = profiler.get("tool")
    if tool is None:
        ours["observers"] = extra
        return ours
    if tool not in SUPPORTED_TOOLS:
        raise ConfigError(
            f"global_profiler.tool: {tool!r} has no verl_events observer; supported: {', '.join(SUPPORTED_TOOLS)} "
            "(or list observers: yourself)"
        )
    roles = [role for role in ROLE_BLOCKS if _role_profiler(raw, role).get("enable") is True]
    steps = profiler.get("steps")
    if steps is None or not roles:
        why = "global_profiler.steps is null" if steps is None else "no role has profiler.enable: true"
        warnings.warn(f"{why}, so {tool} profiles nothing, as in verl", VerlEventsWarning, stacklevel=4)
        ours["observers"] = extra
        return ours
    tools = _block(profiler, "global_tool_config")
    selection: dict[str, Any] = {"steps": steps, "roles": roles}
    if tool == "precision_debugger":
        observer, strict = _precision_debugger(_block(tools, "precision_debugger"), selection)
        ours.setdefault("strict", strict)
    else:
        observer = _profiler(raw, tool, tools, roles, selection)
    ours["observers"] = [observer, *extra]
    return ours


def _profiler(
    raw: Mapping[str, Any], tool: str, tools: Mapping[str, Any], roles: list[str], selection: dict[str, Any]
) -> dict[str, Any]:
    """The observer for verl's nsys, torch or npu profiler, from the first enabled role's block."""
    first = _role_profiler(raw, roles[0])
    if not first.get("all_ranks"):
        selection["ranks"] = list(first.get("ranks") or [0])
    options = _block(first, "tool_config", tool)
    # Values go through as verl's config holds them: the observers' option
    # check then refuses a "no" where a bool belongs, as for our own form.
    if tool == "nsys":
        discrete = _block(tools, "nsys").get("discrete", options.get("discrete", False))
        return {"name": "nsys", "discrete": discrete, **selection}
    if tool == "torch":
        return {
            "name": "torch_profiler",
            "contents": options.get("contents") or [],
            "discrete": options.get("discrete", False),
            **selection,
        }
    return {
        "name": "npu",
        "contents": options.get("contents") or [],
        "level": options.get("level", "level0"),
        "analysis": options.get("analysis", True),
        "discrete": options.get("discrete", False),
        **selection,
    }


def _precision_debugger(block: Mapping[str, Any], selection: dict[str, Any]) -> tuple[dict[str, Any], bool]:
    if block.get("steps") is not None:
        warnings.warn(
            "global_tool_config.precision_debugger.steps is deprecated and ignored, as in verl; "
            "global_profiler.steps selects the steps",
            VerlEventsWarning,
            stacklevel=5,
        )
    stages = block.get("stages")
    if stages is None:
        stages = list(PRECISION_DEBUGGER_STAGES)
    elif "rollout_generate" in stages:
        warnings.warn(
            "global_tool_config.precision_debugger.stages: rollout_generate is skipped, as in verl",
            VerlEventsWarning,
            stacklevel=5,
        )
        stages = [stage for stage in stages if stage != "rollout_generate"]
    observer = {"name": "msprobe", "stages": list(stages), **selection}
    if block.get("config_path") is not None:
        observer["config_path"] = block["config_path"]
    return observer, bool(block.get("strict", False))
