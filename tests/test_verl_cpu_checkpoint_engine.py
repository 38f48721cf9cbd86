"""The CPU checkpoint engine (verl_events.apps.verl_cpu.checkpoint_engine) driven as verl's
``CheckpointEngineManager`` drives it: ``prepare``, ``build_topology``, ``init_process_group``, the
sender's ``send_weights`` beside each reader's ``receive_weights``, ``finalize``.

The round trips run on a real local Ray (the mailbox is a Ray actor), with real torch tensors,
the sender and two readers in this process, each reader in a thread as each rollout worker is a
process. The overrides are checked against verl's own Hydra config. Then verl's real main_ppo
runs on the engine in ``separate_async`` (2 steps, the always-on preset and the weight_sync
observer): the suite's one run of that mode.
"""

from __future__ import annotations

import asyncio
import json
import os
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("verl")

with warnings.catch_warnings():  # verl's single_controller imports Ray's state API, which warns that it moved
    warnings.simplefilter("ignore", DeprecationWarning)
    from verl.checkpoint_engine.base import CheckpointEngineRegistry

    from verl_events.apps.verl_cpu.checkpoint_engine import BACKEND, SEPARATE_ASYNC, CpuRayCheckpointEngine
from verl_events.apps.cli import main as verl_events_main
from verl_events.apps.verl_cpu import job
from verl_events.apps.verl_cpu.engine_options import ROLLOUT_ENGINES
from verl_events.observers.timing import TimingRecord, timing_log_files

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")

Named = list[tuple[str, Any]]


def weights(scale: float) -> Named:
    """Three dtypes, shapes from a scalar to a matrix: a bf16 weight, an int buffer, a bool mask."""
    return [
        ("model.embed_tokens.weight", torch.arange(24, dtype=torch.float32).reshape(6, 4) * scale),
        ("model.layers.0.mlp.up_proj.weight", (torch.ones(3, 5) * scale).to(torch.bfloat16)),
        ("model.rotary.inv_freq", torch.tensor([1, 2, 3], dtype=torch.int64)),
        ("model.norm.eps", torch.tensor(scale)),
        ("lm_head.mask", torch.tensor([True, False])),
    ]


def join_sync(sender: CpuRayCheckpointEngine, readers: list[CpuRayCheckpointEngine]) -> None:
    """What CheckpointEngineManager.build_process_group does for one trainer rank and the readers."""
    metadata = [engine.prepare() for engine in (sender, *readers)]
    actor_kwargs, rollout_kwargs = CpuRayCheckpointEngine.build_topology(1, len(readers), metadata)
    sender.init_process_group(**{key: values[0] for key, values in actor_kwargs.items()})
    for rank, reader in enumerate(readers):
        reader.init_process_group(**{key: values[rank] for key, values in rollout_kwargs.items()})


def read(engine: CpuRayCheckpointEngine, step: int) -> Named:
    return list(engine.receive_weights(global_steps=step))


async def sync(sender: CpuRayCheckpointEngine, readers: list[CpuRayCheckpointEngine], sent: Named, step: int) -> Any:
    join_sync(sender, readers)
    # In threads: a reader blocks on each fetch, as the rollout worker's event loop does.
    reading = asyncio.gather(*(asyncio.to_thread(read, reader, step) for reader in readers))
    await asyncio.sleep(0.2)  # the readers wait for buckets that are not there yet
    metrics = await sender.send_weights(iter(sent), global_steps=step)
    received = await reading
    for engine in (sender, *readers):
        engine.finalize()
    return metrics, received


def assert_same(received: Named, sent: Named) -> None:
    assert [name for name, _ in received] == [name for name, _ in sent]
    for (name, got), (_, want) in zip(received, sent, strict=True):
        assert got.dtype == want.dtype, name
        assert torch.equal(got, want), name


@pytest.fixture
def local_ray() -> Iterator[None]:
    import ray

    # address="local": a private cluster, never one someone else started on this machine.
    ray.init(address="local", num_cpus=1, include_dashboard=False, log_to_driver=False)
    try:
        yield
    finally:
        ray.shutdown()


@pytest.mark.slow
def test_readers_get_the_senders_names_dtypes_and_values_in_order_twice_at_one_step(local_ray: None) -> None:
    # 16-byte buckets: every tensor but the scalars and the mask spans a bucket of its own.
    sender = CpuRayCheckpointEngine(bucket_size=16, is_master=True)
    readers = [CpuRayCheckpointEngine(bucket_size=16) for _ in range(2)]

    # Two syncs at global step 0, as separate_async makes: the second must not read the first.
    for scale in (1.0, 2.0):
        metrics, received = asyncio.run(sync(sender, readers, weights(scale), step=0))
        for by_reader in received:
            assert_same(by_reader, weights(scale))
    assert metrics["checkpoint_engine/buckets"] == 4.0
    assert metrics["checkpoint_engine/payload_mbytes"] * 2**20 == sum(t.nbytes for _, t in weights(1.0))


@pytest.mark.slow
def test_a_reader_whose_sender_never_sends_times_out_naming_the_setting(local_ray: None) -> None:
    sender = CpuRayCheckpointEngine(bucket_size=1 << 20, is_master=True)
    reader = CpuRayCheckpointEngine(bucket_size=1 << 20, timeout_s=0.5)
    join_sync(sender, [reader])
    with pytest.raises(TimeoutError, match=r"did not come within 0.5 s.*engine_kwargs\.cpu_ray\.timeout_s"):
        read(reader, step=1)


def test_a_trainer_rank_that_is_not_master_walks_the_generator_and_sends_nothing() -> None:
    """Unsharding each FSDP parameter is a collective: every trainer rank must run the generator."""
    walked: list[str] = []

    def named() -> Iterator[tuple[str, Any]]:
        for name, tensor in weights(1.0):
            walked.append(name)
            yield name, tensor

    engine = CpuRayCheckpointEngine(bucket_size=16)
    engine.init_process_group(mailbox=object(), token="t", sends=False)  # the mailbox is never touched
    assert asyncio.run(engine.send_weights(named())) == {}
    assert walked == [name for name, _ in weights(1.0)]


def test_sending_or_receiving_outside_a_sync_is_refused() -> None:
    engine = CpuRayCheckpointEngine(bucket_size=16, is_master=True)
    with pytest.raises(RuntimeError, match="send_weights called outside a sync; .*build_topology"):
        asyncio.run(engine.send_weights(iter(weights(1.0))))
    with pytest.raises(RuntimeError, match="receive_weights called outside a sync"):
        engine.receive_weights()


def test_a_topology_without_exactly_one_master_trainer_rank_is_refused() -> None:
    with pytest.raises(ValueError, match="exactly one trainer rank must be is_master to send, got ranks \\[\\]"):
        CpuRayCheckpointEngine.build_topology(2, 1, [{"is_master": False}] * 3)


def test_a_bucket_size_or_timeout_that_is_not_positive_is_refused() -> None:
    with pytest.raises(ValueError, match="bucket_size and timeout_s must be > 0, not 0 and 600"):
        CpuRayCheckpointEngine(bucket_size=0)


def test_importing_the_module_registers_the_engine_under_its_backend_name() -> None:
    assert CheckpointEngineRegistry.get(BACKEND) is CpuRayCheckpointEngine


def test_the_overrides_compose_with_the_jobs_into_a_config_separate_async_accepts(tmp_path: Path) -> None:
    """Every key exists in verl's own config, and the values pass separate_async's asserts
    (trainer_separate_async.py:57-70) and select this engine."""
    from hydra import compose, initialize_config_dir
    from verl.trainer import main_ppo

    files = job.JobFiles(tmp_path, tmp_path / "model", tmp_path / "d.parquet", tmp_path / "d.parquet", tmp_path, "f")
    overrides = job.trainer_args(files, mode="separate_async")
    assert job.merge_overrides(overrides, SEPARATE_ASYNC) == overrides  # the job's mode carries them all
    config_dir = Path(main_ppo.__file__).parent / "config"
    with initialize_config_dir(config_dir=str(config_dir), version_base=None):
        config = compose("ppo_trainer", [o for o in overrides if not o.startswith("hydra.")])
    assert config.trainer.v1.trainer_mode == "separate_async"
    assert config.trainer.v1.sampler.custom_sampler.path is None  # verl's own asynchronous buffer
    separate = config.trainer.v1.separate_async
    assert (
        config.data.train_batch_size
        == separate.parameter_sync_step * config.actor_rollout_ref.actor.ppo_mini_batch_size
    )
    rollout = config.actor_rollout_ref.rollout
    assert rollout.nnodes > 0 and rollout.n_gpus_per_node > 0
    assert (rollout.checkpoint_engine.backend, rollout.checkpoint_engine.custom_backend_module) == (
        BACKEND,
        CpuRayCheckpointEngine.__module__,
    )
    assert config.ray_kwargs.ray_init.num_gpus == config.trainer.n_gpus_per_node + rollout.n_gpus_per_node


@pytest.mark.slow
def test_verls_separate_async_trainer_runs_on_the_engine_with_every_stage_seen(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """verl's real main_ppo in separate_async (2 steps), the always-on preset watching: the run
    ends 0, the stages show what this mode does twice (two syncs at step 0, one to the
    standalone rollout through this engine and one to the colocated replica; each compute stage
    once per ``parameter_sync_step`` mini-batch group), the mismatch observer compares each
    recomputation, the weight_sync ledger has a line for every sync, and diagnose calls the run
    healthy."""
    files = job.prepare(tmp_path / "job")
    save_path = tmp_path / "profile"
    weight_sync = {"name": "weight_sync", **ROLLOUT_ENGINES["weight_sync"]}  # the receipt from the job's server
    config = {"preset": "always_on", "save_path": str(save_path), "observers": [weight_sync]}
    (tmp_path / "observers.yaml").write_text(json.dumps(config))
    base = {k: v for k, v in os.environ.items() if not k.startswith("VERL_EVENTS_")}
    env = job.trainer_env(base) | {"VERL_EVENTS_CONFIG": str(tmp_path / "observers.yaml")}
    log = tmp_path / "trainer.log"
    code = job.run_trainer(job.trainer_args(files, steps=2, mode="separate_async"), env, log=log, timeout=900)
    assert code == 0, log.read_text()[-6000:]

    records = [
        TimingRecord.from_json(line) for path in timing_log_files(save_path) for line in path.read_text().splitlines()
    ]
    seen = [(r.stage, r.step) for r in records if r.stage != "rollout_wake_up"]
    compute = ["actor_compute_log_prob", "ref_compute_log_prob", "actor_update"]
    assert seen.count(("update_weights", 0)) == 2, seen
    for step in (1, 2):
        assert [seen.count((stage, step)) for stage in compute] == [2, 2, 2], seen
        assert seen.count(("update_weights", step)) == 1, seen
    mismatch = [json.loads(line) for line in (save_path / "mismatch.jsonl").read_text().splitlines()]
    assert sorted((m["stage"], m["step"]) for m in mismatch) == [("actor_compute_log_prob", s) for s in (1, 1, 2, 2)]
    # Each line says which weights its two sides had (verl's tags; the trainer's version is step - 1).
    for line in mismatch:
        weights = line["weights"]
        assert weights["trainer"] == line["step"] - 1 and weights["rollout_max"] <= weights["trainer"], mismatch
    # A ledger line for each sync the trainer's rank ran: the engine's, seen at its send_weights,
    # with no receipt (the rollout loads them in its own process, after the send returned: asked
    # at the send's end, the engine still held the previous weights), and the colocated
    # replica's, at the adapter, with its receipt; none unchecked, no alarm.
    ledger = [json.loads(line) for line in (save_path / "weight_sync.jsonl").read_text().splitlines()]
    syncs = [step for stage, step in seen if stage == "update_weights"]
    assert sorted(line["step"] for line in ledger) == sorted(syncs), (ledger, seen)
    assert {line["seen_at"] for line in ledger} == {
        "CpuRayCheckpointEngine.send_weights",
        "the rollout adapter's update_weights",
    }, ledger
    assert all(line["unchecked"] is None and line["tensors"] > 0 and not line["alarms"] for line in ledger), ledger
    for line in ledger:
        engine_sent = line["seen_at"] == "CpuRayCheckpointEngine.send_weights"
        assert line["receipt"] is None if engine_sent else line["receipt"]["compared"] == 27, ledger
    assert verl_events_main(["diagnose", str(save_path), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["verdict"] == "healthy"


def test_the_job_refuses_a_mode_verl_has_not_and_a_mode_for_the_legacy_trainer(tmp_path: Path) -> None:
    files = job.JobFiles(tmp_path, tmp_path / "model", tmp_path / "d.parquet", tmp_path / "d.parquet", tmp_path, "f")
    with pytest.raises(ValueError, match=r"mode 'fast' is not one of verl's v1 trainer modes \(sync, colocate_async"):
        job.trainer_args(files, mode="fast")
    with pytest.raises(ValueError, match=r"mode 'colocate_async' is a mode of verl's v1 trainer; legacy=True runs v0"):
        job.trainer_args(files, mode="colocate_async", legacy=True)
    assert "trainer.use_v1=False" in job.trainer_args(files, legacy=True)
