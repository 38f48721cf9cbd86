"""verl 0.9.1's first LoRA weight sync, on its default (v1) trainer: ``main_ppo`` under Ray, on CPU,
one FSDP rank, the tiny job with LoRA (rank 8, every linear layer), two steps.

verl's first sync of a LoRA model sends the base weights, then the adapter, in one
``update_weights`` (``base_sync_done=False``; ``workers/engine_workers.py``); every later sync
sends the adapter alone.  A user's observer (tests/support.py's ``NaNInBaseWeight``) puts a NaN
into one frozen base weight while the first sync runs, and puts it back when it ends, so that the
training after it is healthy:

- the first sync's line holds both payloads (27 base tensors, then 28 adapter tensors) and one
  ``nonfinite`` alarm naming the base tensor, which only the base payload carried;
- the two adapter-only syncs after it raise nothing: the base weights they leave out are no
  ``missing`` tensors, and the engine holds what they sent.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

pytest.importorskip("torch")  # verl's real trainer
pytest.importorskip("verl")
pytest.importorskip("peft")  # verl's LoRA

from verl_events.apps.cli import main as verl_events_main
from verl_events.apps.verl_cpu import job
from verl_events.observers.weight_sync.record import SyncRecord, weight_sync_log_path

REPO = Path(__file__).parent.parent
BASE_TENSOR = "model.layers.0.self_attn.q_proj.base_layer.weight"
LORA = [
    "actor_rollout_ref.model.lora_rank=8",
    "actor_rollout_ref.model.lora_alpha=16",
    "actor_rollout_ref.model.target_modules=all-linear",
]
pytestmark = [pytest.mark.filterwarnings("ignore::DeprecationWarning"), pytest.mark.slow]


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("lora")
    files = job.prepare(root / "job")
    receipt = "verl_events.apps.verl_cpu.hf_rollout:request_receipt"
    observers = [
        {"name": "timing"},
        {"name": "weight_sync", "receipt_engine": receipt},
        {"_target_": "tests.support:NaNInBaseWeight", "step": 0, "parameter": "q_proj.base_layer.weight"},
    ]
    config = {"save_path": str(root / "profile"), "observers": observers}
    (root / "observers.yaml").write_text(json.dumps(config))  # JSON is YAML
    base = {k: v for k, v in os.environ.items() if not k.startswith("VERL_EVENTS_")}
    env = job.trainer_env(base) | {"VERL_EVENTS_CONFIG": str(root / "observers.yaml"), "PYTHONPATH": str(REPO)}
    overrides = job.merge_overrides(job.trainer_args(files, steps=2), LORA)
    code = job.run_trainer(overrides, env, log=root / "trainer.log", timeout=600)
    assert code == 0, (root / "trainer.log").read_text()[-4000:]
    return root / "profile"


def test_the_first_lora_sync_judges_the_base_and_the_adapter_and_names_the_nan_in_the_base(run: Path) -> None:
    lines = sorted(
        (SyncRecord.from_json(line) for line in weight_sync_log_path(run).read_text().splitlines()),
        key=lambda r: r.step,
    )
    assert [r.step for r in lines] == [0, 1, 2]
    first, *later = lines
    assert (first.payloads, first.tensors, first.adapter_tensors) == (2, 55, 28), first
    assert first.nonfinite == [BASE_TENSOR]
    assert [(a.kind, a.tensors, a.layer) for a in first.alarms] == [("nonfinite", [BASE_TENSOR], "layer 0")]
    for record in later:  # the adapter alone, the engine holding what was sent
        assert (record.payloads, record.tensors, record.adapter_tensors) == (1, 28, 28), record
        assert record.alarms == [] and record.receipt is not None and record.receipt["compared"] == 28, record


def test_weights_and_diagnose_name_the_first_syncs_base_tensor(run: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert verl_events_main(["weights", str(run)]) == 1
    out = capsys.readouterr().out
    assert f"step 0, rank 0: nonfinite (layer 0): 1 of {BASE_TENSOR}'s values are NaN or infinite" in out, out
    assert verl_events_main(["diagnose", str(run), "--json"]) == 1
    result = json.loads(capsys.readouterr().out)
    assert result["verdict"] == "anomalous" and result["first"]["stage"] == "update_weights", result
    assert BASE_TENSOR in result["first"]["detail"]
