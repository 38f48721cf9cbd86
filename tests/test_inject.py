"""The weight-fault observer that the demo's --inject and the real-verl sentinel test use."""

from __future__ import annotations

from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

import verl_events  # noqa: E402
from verl_events import ConfigError, stage  # noqa: E402
from verl_events.apps.demo.model import TinyCausalLM  # noqa: E402
from verl_events.apps.demo.options import INJECTED_WEIGHT, Injection  # noqa: E402


def fault_entry(**keys: object) -> dict[str, object]:
    return {"_target_": "verl_events.apps.inject:WeightFault", "stages": ["actor_update"], **keys}


def run(model: torch.nn.Module, tmp_path: Path, steps: range, **keys: object) -> None:
    with verl_events.install({"save_path": str(tmp_path), "observers": [fault_entry(**keys)]}):
        for step in steps:
            with stage("actor_update", step=step, model=model):
                pass


def test_nan_goes_into_one_element_at_the_step_and_only_once(tmp_path: Path) -> None:
    model = TinyCausalLM()
    run(model, tmp_path, range(1, 3), kind="nan", step=2, parameter=INJECTED_WEIGHT)
    weight = model.get_parameter(INJECTED_WEIGHT)
    assert int(torch.isnan(weight).sum()) == 1
    assert all(torch.isfinite(p).all() for name, p in model.named_parameters() if name != INJECTED_WEIGHT)


def test_a_stage_it_corrupts_still_counts_as_unprofiled(tmp_path: Path) -> None:
    """It profiles nothing: actor_update keeps its baseline in the overhead table."""
    from verl_events.apps.read.overhead import overhead_table, read_timing_records

    config = {"save_path": str(tmp_path), "observers": [{"name": "timing"}, fault_entry(kind="nan", step=2)]}
    with verl_events.install(config):
        for step in range(1, 4):
            with stage("actor_update", step=step, model=TinyCausalLM()):
                pass
    records = read_timing_records(tmp_path)
    assert [(r.step, r.profiled, r.profiled_by) for r in records] == [(1, False, ()), (2, False, ()), (3, False, ())]
    assert all("verl_events.apps.inject:WeightFault" in r.hook_s for r in records)  # seen, and its cost measured
    [row] = overhead_table(records)
    assert (row.profiled_by, row.unprofiled_n, row.profiled_n) == ((), 3, 0)


def test_spike_scales_the_first_linear_weight_by_default(tmp_path: Path) -> None:
    model = TinyCausalLM()
    before = {name: p.detach().clone() for name, p in model.named_parameters()}
    run(model, tmp_path, range(1, 4), kind="spike", step=3, scale=4.0)
    first_linear = "blocks.0.qkv.weight"  # the embeddings come first, but are not Linear layers
    assert torch.equal(model.get_parameter(first_linear), before[first_linear] * 4.0)
    assert all(torch.equal(p, before[name]) for name, p in model.named_parameters() if name != first_linear)


@pytest.mark.parametrize(
    ("keys", "message"),
    [
        ({"kind": "zero", "step": 2}, "option kind: 'zero' is not allowed; use one of 'nan', 'spike'"),
        ({"kind": "nan", "step": 0}, "step: 0 is not allowed; use a step number >= 1"),
    ],
)
def test_bad_options_are_named(tmp_path: Path, keys: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        verl_events.install({"save_path": str(tmp_path), "observers": [fault_entry(**keys)]})


@pytest.mark.parametrize("text", ["nan", "nan@", "nan@0", "nan@7", "zero@2", "nan@two"])
def test_the_demo_names_a_bad_inject_value(text: str) -> None:
    with pytest.raises(
        ValueError,
        match=rf"--inject: '{text}' is not allowed; use KIND@STEP with KIND one of nan, spike, nan-once, "
        r"nan-flaky and STEP from 1 to 6",
    ):
        Injection.parse(text, steps=6)
