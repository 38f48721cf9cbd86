"""TrackerObserver: stage times, overheads and the sentinel's anomalies, read back from what
each real client library wrote — TensorBoard event files, a W&B offline run, an MLflow file
store — with no network."""

from __future__ import annotations

import json
import logging
import math
import re
import shlex
import shutil
import struct
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch")
pytest.importorskip("tensorboard")
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from verl import DataProto

import verl_events
from verl_events import ConfigError, ObserverError, emits_stage
from verl_events.layout import run_id
from verl_events.observers.timing import TimingRecord, timing_log_path
from verl_events.observers.tracker import tensorboard_dir

from ..support import run_two_gloo_ranks, tensorboard_scalars, verl_events_exe

REPO = Path(__file__).resolve().parents[2]
DOC = (REPO / "docs/trackers.md").read_text()

GRAD_NORMS = {1: 1.5, 2: 1.4, 3: 5000.0, 4: 1.3}  # step 3 breaks the rule below
RULES = {"actor/grad_norm": {"above": 1000}}


class Worker:
    """verl-shaped stages: the update runs two mini-batches (train_batch, nested) and returns
    its metrics in a DataProto, as verl's legacy workers do."""

    @emits_stage("actor_compute_log_prob")
    def compute_log_prob(self, data: DataProto) -> DataProto:
        return DataProto.from_single_dict(data={}, meta_info={})

    @emits_stage("actor_update")
    def update_actor(self, data: DataProto) -> DataProto:
        for _ in range(2):
            self.train_batch(data)
        return DataProto.from_single_dict(data={}, meta_info={"metrics": dict(data.meta_info["metrics"])})

    @emits_stage("train_batch")
    def train_batch(self, data: DataProto) -> None:
        sum(range(1000))


def train(save_path: Path, tracker: dict[str, Any], steps: dict[int, float] = GRAD_NORMS) -> None:
    config = {
        "save_path": str(save_path),
        "observers": [
            {"name": "timing"},
            {"name": "sentinel", "rules": RULES},
            {"name": "tracker", **tracker},
            {"_target_": "verl_events.testing:RecordingObserver"},  # named by its import path
        ],
    }
    worker = Worker()
    with verl_events.install(config):
        for step, grad_norm in steps.items():
            batch = DataProto.from_single_dict(
                data={}, meta_info={"global_steps": step, "metrics": {"actor/grad_norm": grad_norm}}
            )
            worker.compute_log_prob(batch)
            worker.update_actor(batch)


def timing_sums(save_path: Path, rank: int = 0) -> dict[tuple[int, str], float]:
    """Each step's time of each stage, summed from the timing log (the reference)."""
    sums: dict[tuple[int, str], float] = {}
    for line in timing_log_path(save_path, rank).read_text().splitlines():
        record = TimingRecord.from_json(line)
        assert record.step is not None
        key = (record.step, record.stage)
        sums[key] = sums.get(key, 0.0) + record.elapsed_s
    return sums


def assert_sent(values: dict[str, dict[int, float]], save_path: Path, float32: bool) -> None:
    """What the tracker must have sent for ``train``'s three steps on rank 0."""
    tolerance = 1e-6 if float32 else 1e-12  # TensorBoard stores float32
    for (step, stage), seconds in timing_sums(save_path).items():
        assert values[f"stage_s/{stage}"][step] == pytest.approx(seconds, rel=tolerance), (step, stage)
    assert set(values["stage_s/train_batch"]) == {1, 2, 3, 4}
    # From the stage's first anomaly on; a stage that never had one has no line of zeros.
    assert values["anomalies/actor_update"] == {3: 1, 4: 0}
    assert "anomalies/actor_compute_log_prob" not in values
    assert values["anomaly/actor/grad_norm"] == {3: 5000.0}
    assert_meaningful(values)
    hooks = {f"hook_s/actor_update/{name}" for name in ("timing", "sentinel", "tracker", "RecordingObserver")}
    assert hooks | {"hook_s/train_batch/sentinel", "overhead_s/actor_update"} <= set(values)
    assert all(seconds >= 0 for seconds in values["overhead_s/actor_update"].values())


def assert_meaningful(values: dict[str, dict[int, float]]) -> None:
    """No series that is zero throughout, no tag naming an import path."""
    zero_throughout = sorted(tag for tag, points in values.items() if not any(points.values()))
    assert not zero_throughout, zero_throughout
    assert not [tag for tag in values if ":" in tag or "verl_events." in tag]


def test_tensorboard_gets_every_steps_stage_times_overheads_and_anomalies(tmp_path: Path) -> None:
    train(tmp_path, {"backends": ["tensorboard"]})
    values = tensorboard_scalars(tensorboard_dir(tmp_path, 0))
    assert_sent(values, tmp_path, float32=True)
    # One point per step: each stage's values went out once, at the end of its outermost stage.
    events = EventAccumulator(str(tensorboard_dir(tmp_path, 0)))
    events.Reload()
    assert [e.step for e in events.Scalars("stage_s/train_batch")] == [1, 2, 3, 4]
    assert [e.step for e in events.Scalars("anomalies/actor_update")] == [3, 4]
    # The anomaly's sentence is in TensorBoard's Text tab.
    events = EventAccumulator(str(tensorboard_dir(tmp_path, 0)))
    events.Reload()
    (text,) = events.Tensors("anomaly/text_summary")
    assert text.step == 3 and b"actor/grad_norm" in text.tensor_proto.string_val[0]


def test_a_step_is_on_disk_when_its_stages_end_before_the_run_closes(tmp_path: Path) -> None:
    """A Ray worker may be killed without closing: nothing may wait for close."""
    config = {"save_path": str(tmp_path), "observers": [{"name": "tracker"}]}
    worker = Worker()
    with verl_events.install(config):
        for step in (1, 2):
            batch = DataProto.from_single_dict(data={}, meta_info={"global_steps": step, "metrics": {}})
            worker.update_actor(batch)
        sent = tensorboard_scalars(tensorboard_dir(tmp_path, 0))
        assert set(sent["stage_s/actor_update"]) == {1, 2} and set(sent["stage_s/train_batch"]) == {1, 2}


def test_another_runs_tracker_files_make_install_refuse(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("VERL_EVENTS_RUN_ID", "first")
    only_tracker = {"save_path": str(tmp_path), "observers": [{"name": "tracker"}]}
    with verl_events.install(only_tracker):
        Worker().compute_log_prob(DataProto.from_single_dict(data={}, meta_info={"global_steps": 1}))
    monkeypatch.setenv("VERL_EVENTS_RUN_ID", "second")
    with pytest.raises(ConfigError, match=r"already holds 1 tracker file\(s\) from another run .*tensorboard/rank0"):
        verl_events.install(only_tracker)


# -- W&B offline ------------------------------------------------------------------


def wandb_records(run_file: Path) -> list[Any]:
    """The records of a W&B run file (``run-*.wandb``): W&B's framing of LevelDB's log
    format — a 7-byte header, then 32 KiB blocks of chunks, each with a 7-byte header
    (CRC, length, type: 1 whole, 2 first, 3 middle, 4 last) — holding protobuf Records."""
    from wandb.proto import wandb_internal_pb2

    data = run_file.read_bytes()
    assert data[:4] == b":W&B", run_file
    block, position, parts, records = 32768, 7, b"", []
    while position + 7 <= len(data):
        left = block - position % block
        if left < 7:
            position += left
            continue
        _crc, length, kind = struct.unpack("<IHB", data[position : position + 7])
        if kind == 0:  # padding at a block's end
            position += left
            continue
        chunk = data[position + 7 : position + 7 + length]
        position += 7 + length
        parts = chunk if kind in (1, 2) else parts + chunk
        if kind in (1, 4):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(parts)
            records.append(record)
    return records


def test_wandb_offline_gets_one_run_per_rank_grouped_by_the_run(tmp_path: Path) -> None:
    pytest.importorskip("wandb")
    train(tmp_path, {"backends": ["wandb"], "wandb": {"mode": "offline"}})
    (run_file,) = tmp_path.glob("wandb/offline-run-*/run-*.wandb")
    # W&B's own service process writes the run file; on a busy machine ``finish()`` returns
    # before its last records are there (read at once, a CI run found no ``run`` record in it).
    # The file is whole once it holds the ``exit`` record, which finishing the run writes.
    give_up = time.monotonic() + 60
    records = wandb_records(run_file)
    while not any(r.WhichOneof("record_type") == "exit" for r in records) and time.monotonic() < give_up:
        time.sleep(0.2)
        records = wandb_records(run_file)
    (run,) = [r.run for r in records if r.WhichOneof("record_type") == "run"]
    assert (run.display_name, run.run_group, run.project) == (f"{run_id()}-rank0", run_id(), "verl_events")
    values: dict[str, dict[int, float]] = {}
    for record in records:
        if record.WhichOneof("record_type") == "history":
            # W&B 0.31 writes each key as a one-element nested_key; older ones as key.
            items = {item.key or ".".join(item.nested_key): json.loads(item.value_json) for item in record.history.item}
            for key, value in items.items():
                if not key.startswith("_"):
                    values.setdefault(key, {})[items["_step"]] = value
    assert_sent(values, tmp_path, float32=False)


# -- MLflow -----------------------------------------------------------------------


def test_mlflow_gets_the_same_metrics_through_its_client(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("mlflow")
    from mlflow.tracking import MlflowClient

    # A local file store stands in for a tracking server; MLflow 3 asks for this opt-in.
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    uri = f"file:{tmp_path / 'mlruns'}"
    train(tmp_path, {"backends": ["mlflow"], "project": "tiny", "mlflow": {"tracking_uri": uri}})
    client = MlflowClient(tracking_uri=uri)
    experiment = client.get_experiment_by_name("tiny")
    assert experiment is not None
    (run,) = client.search_runs([experiment.experiment_id])
    assert run.info.run_name == f"{run_id()}-rank0" and run.data.tags["verl_events.run"] == run_id()
    assert run.info.status == "FINISHED"
    values = {
        key: {m.step: m.value for m in client.get_metric_history(run.info.run_id, key)} for key in run.data.metrics
    }
    assert_sent(values, tmp_path, float32=False)


# -- failures and bad config ------------------------------------------------------


def test_a_failing_backend_is_logged_once_and_the_others_and_training_go_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    pytest.importorskip("mlflow")
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    train(tmp_path, {"backends": ["mlflow", "tensorboard"]})
    errors = [r.getMessage() for r in caplog.records if r.name == "verl_events.tracker" and r.levelno >= logging.ERROR]
    assert len(errors) == 1 and "mlflow backend could not open a run on rank 0" in errors[0], errors
    assert "MLFLOW_TRACKING_URI" in errors[0]
    assert tensorboard_scalars(tensorboard_dir(tmp_path, 0))["anomalies/actor_update"] == {3: 1, 4: 0}


def test_strict_raises_the_backends_failure(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("mlflow")
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    config = {"save_path": str(tmp_path), "strict": True, "observers": [{"name": "tracker", "backends": ["mlflow"]}]}
    worker = Worker()
    with pytest.raises(ObserverError, match="'tracker' failed in on_stage_report .* strict mode stops") as raised:
        with verl_events.install(config):
            for step in (1, 2):
                worker.compute_log_prob(DataProto.from_single_dict(data={}, meta_info={"global_steps": step}))
    assert "tracking_uri" in str(raised.value.__cause__)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"backends": ["console"]}, "option backends: 'console' is not a tracker; allowed: tensorboard, wandb, mlflow"),
        ({"backends": []}, r"option backends: \[\] is not allowed; use a list of tensorboard, wandb, mlflow"),
        ({"wandb": {"mode": "offline"}}, "option wandb: only applies with wandb in backends"),
        (
            {"tensorboard": {"logdir": "x"}},
            "option tensorboard.logdir: unknown option; the tensorboard backend takes log_dir",
        ),
    ],
)
def test_bad_options_are_refused_at_install_in_a_sentence(
    tmp_path: Path, options: dict[str, Any], message: str
) -> None:
    with pytest.raises(ConfigError, match=message):
        verl_events.install({"save_path": str(tmp_path), "observers": [{"name": "tracker", **options}]})


# -- two ranks --------------------------------------------------------------------


@pytest.mark.slow
def test_two_gloo_ranks_each_send_their_own_run_and_ranks_selects_which(tmp_path: Path) -> None:
    result = run_two_gloo_ranks(
        tmp_path,
        """
        import verl_events
        from verl_events import stage
        for name, ranks in (("all", None), ("first", [0])):
            tracker = {"name": "tracker", "ranks": ranks} if ranks else {"name": "tracker"}
            with verl_events.install({"save_path": name, "observers": [tracker]}):
                for step in (1, 2):
                    with stage("actor_update", step=step):
                        dist.all_reduce(__import__("torch").ones(1))
        dist.destroy_process_group()
        """,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    for rank in (0, 1):
        assert set(tensorboard_scalars(tensorboard_dir(tmp_path / "all", rank))["stage_s/actor_update"]) == {1, 2}
    assert [p.name for p in (tmp_path / "first/tensorboard").iterdir()] == ["rank0"]
    assert not math.isnan(tensorboard_scalars(tensorboard_dir(tmp_path / "first", 0))["stage_s/actor_update"][2])


# -- the doc's demo ---------------------------------------------------------------


@pytest.mark.slow
def test_the_docs_demo_command_twice_sends_each_run_to_its_own_tensorboard_run(tmp_path: Path) -> None:
    """docs/trackers.md's command, run twice as written, in a folder with examples/."""
    (command,) = re.findall(r"```bash\n(verl-events demo --config examples/tracker.yaml[^\n]*)\n```", DOC)
    shutil.copytree(REPO / "examples", tmp_path / "examples")
    for _ in range(2):
        argv = shlex.split(command)
        result = subprocess.run([verl_events_exe(), *argv[1:]], cwd=tmp_path, capture_output=True, text=True)
        assert result.returncode == 0, result.stderr[-3000:]
    runs = sorted(p for p in (tmp_path / "outputs/tracker").iterdir() if p.name != "latest")
    assert len(runs) == 2
    for run in runs:
        values = tensorboard_scalars(tensorboard_dir(run, 0))
        counts = values["anomalies/actor_update"]
        # --inject nan@4 corrupts a weight during step 4's actor update: its line begins there.
        assert sorted(counts) == [4, 5, 6] and counts[4] >= 1, counts
        assert min(values["anomalies/actor_compute_log_prob"]) == 5
        assert values["anomalies/actor_compute_log_prob"][5] >= 1
        assert_meaningful(values)
        # The demo's weight fault is a _target_ observer: its hook time is named by its class.
        assert "hook_s/actor_update/WeightFault" in values
        assert math.isnan(values["anomaly/actor/grad_norm"][4])
        assert {step for step in values["stage_s/actor_update"]} == set(range(1, 7))
