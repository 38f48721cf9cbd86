"""The weight_sync observer on verl 0.9.1's real trainer — ``python -m verl.trainer.main_ppo``
under Ray, FSDP2 on gloo, CPU, two FSDP ranks — with three faults made to happen (issue 27).

Each rank syncs into its own rollout server (verl_events.apps.verl_cpu.hf_rollout, a Ray actor:
``tensor_model_parallel_size=1`` gives one replica per rank), and the observer's receipt is
taken in that actor.  The faults (:class:`verl_events.apps.inject.SyncFault`), one per sync, in docs/weight-sync.md's
"Try it" config, which is the run's config:

* sync 1, rank 0: the engine keeps one tensor's old value (written back in the server's
  process after it loaded the sync);
* sync 2, both ranks: step 2's ``actor_update`` runs and is then undone on each rank's FSDP
  shard, so the sync after it resends the previous payload although the optimizer stepped;
* sync 3, rank 1: after loading, the engine's layer 1 is scaled by 1.01 in the server's process.

Every other sync is the control: no alarm (the one-rank healthy control is
tests/test_verl_trainer.py's run).  One trainer run, about a minute on 2 cores.  LoRA's first
sync on the same job is tests/test_verl_lora_sync.py's; an adapter sync without its adapter
tensors is tested at the observer with a real peft model (tests/test_weight_sync.py).
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from pathlib import Path

import pytest

pytest.importorskip("torch")  # verl's real trainer
pytest.importorskip("verl")

from verl_events.apps.cli import main as verl_events_main
from verl_events.apps.verl_cpu import job
from verl_events.observers.weight_sync.record import SyncRecord, weight_sync_log_path

from .support import REPO, doc_blocks, on

pytestmark = [pytest.mark.filterwarnings("ignore::DeprecationWarning"), pytest.mark.slow]

KEPT = "model.layers.0.self_attn.q_proj.weight"
WEIGHT_SYNC_DOC = (REPO / "docs/weight-sync.md").read_text()
#: The doc's "Try it" config: weight_sync with its canary, then the three faults.
(DOC_CONFIG,) = [block for block in doc_blocks("yaml", WEIGHT_SYNC_DOC) if "SyncFault" in block]
TWO_RANKS = [
    "trainer.n_gpus_per_node=2",
    "+ray_kwargs.ray_init.num_gpus=2",
    "ray_kwargs.ray_init.num_cpus=16",
]
TIMEOUT_S = 600


@dataclass(frozen=True)
class Run:
    save_path: Path
    code: int
    log: str


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Run:
    files = job.prepare(tmp_path_factory.mktemp("weight-sync-job"))
    root = tmp_path_factory.mktemp("weight-sync")
    save_path = root / "profile"
    (root / "weight_sync.yaml").write_text(on(root, DOC_CONFIG))
    base = {k: v for k, v in os.environ.items() if not k.startswith("VERL_EVENTS_")}
    env = job.trainer_env(base) | {"VERL_EVENTS_CONFIG": str(root / "weight_sync.yaml")}
    overrides = job.merge_overrides(job.trainer_args(files, steps=3), TWO_RANKS)
    log = root / "trainer.log"
    code = job.run_trainer(overrides, env, log=log, timeout=TIMEOUT_S)
    return Run(save_path, code, log.read_text())


def syncs(save_path: Path) -> dict[tuple[int | None, int], SyncRecord]:
    lines = weight_sync_log_path(save_path).read_text().splitlines()
    return {(r.step, r.rank): r for r in map(SyncRecord.from_json, lines)}


def test_every_sync_of_both_ranks_is_in_the_ledger_with_its_receipt(run: Run) -> None:
    assert run.code == 0, run.log[-6000:]
    records = syncs(run.save_path)
    assert sorted(records) == [(step, rank) for step in range(4) for rank in (0, 1)]
    for (step, _rank), record in records.items():
        assert record.complete and record.tensors > 0, record
        assert record.optimizer_stepped is (step > 0), record
        # The engine holds the trainer's dtype (rollout.dtype=float32): every sent tensor's bytes compared.
        assert record.receipt is not None and record.receipt["same_dtype"], record
        assert record.receipt["compared"] + len(record.receipt["not_updated"]) == record.tensors, record
        # The canary on both ranks at every sync (a collective forward under FSDP); step 0 is the baseline.
        assert record.canary is not None, record
        assert (record.canary["tolerance"] is None) is (step == 0), record
    assert records[(0, 0)].changed is None
    assert all(records[(1, rank)].changed == records[(1, rank)].tensors for rank in (0, 1))


def test_each_fault_is_one_alarm_naming_its_tensor_or_layer_and_every_other_sync_has_none(run: Run) -> None:
    alarms = {
        key: [(a.kind, a.layer, a.tensors[0] if a.tensors else None) for a in record.alarms]
        for key, record in syncs(run.save_path).items()
        if record.alarms
    }
    assert alarms.pop((1, 0)) == [("not_updated", "layer 0", KEPT)]
    stale = [alarms.pop((2, rank)) for rank in (0, 1)]
    assert [[kind for kind, _, _ in found] for found in stale] == [["stale_payload"], ["stale_payload"]]
    # The altered layer: by name (its bytes differ from what was sent), and by the canary,
    # which needs no name: the engine's output departs from the trainer's at layer 1.
    (kind, layer, tensor), canary = alarms.pop((3, 1))
    assert (kind, layer) == ("differs", "layer 1")
    assert tensor is not None and tensor.startswith("model.layers.1.")
    assert canary == ("canary", "layer 1", None)
    assert alarms == {}


def test_weights_and_diagnose_name_the_first_alarm(run: Run, capsys: pytest.CaptureFixture[str]) -> None:
    assert verl_events_main(["weights", str(run.save_path)]) == 1
    out = capsys.readouterr().out
    assert "8 sync(s) on 2 rank(s), steps 0-3; 5 alarms" in out
    assert f"step 1, rank 0: not_updated (layer 0): {KEPT} changed in the payload" in out
    assert "step 3, rank 1: differs (layer 1)" in out
    assert "step 3, rank 1: canary (layer 1): the engine's forward of the canary sequences departs" in out
    assert verl_events_main(["weights", str(run.save_path), "--json"]) == 1
    shown = json.loads(capsys.readouterr().out)
    kinds = [(s["step"], s["rank"], [a["kind"] for a in s["alarms"]]) for s in shown["syncs"] if s["alarms"]]
    assert kinds == [
        (1, 0, ["not_updated"]),
        (2, 0, ["stale_payload"]),
        (2, 1, ["stale_payload"]),
        (3, 1, ["differs", "canary"]),
    ]
    assert verl_events_main(["diagnose", str(run.save_path)]) == 1
    out = capsys.readouterr().out
    assert "first anomaly:" in out
    assert "weight sync alarm not_updated (layer 0)" in out


def test_the_docs_command_prints_the_docs_output_twice_in_a_row(run: Run, capsys: pytest.CaptureFixture[str]) -> None:
    """docs/weight-sync.md's ``verl-events weights`` and its output, from this run (the figures
    of the canary's line depend on the CPU's rounding: they are compared as numbers-to-be)."""
    (command,) = [b for b in doc_blocks("bash", WEIGHT_SYNC_DOC) if b.startswith("verl-events weights")]
    (shown,) = [b for b in doc_blocks("text", WEIGHT_SYNC_DOC) if b.startswith("run /shared/profile")]
    argv = on(run.save_path.parent, command).split()[1:]
    for _ in range(2):
        assert verl_events_main(argv) == 1
        out = capsys.readouterr().out
        assert _figures_masked(out) == _figures_masked(on(run.save_path.parent, shown))


def _figures_masked(text: str) -> str:
    return re.sub(r"\d+\.\d+(e-?\d+)?", "<x>", text.strip())
