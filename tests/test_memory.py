"""The memory observer on real allocations (issue 28, part 1).

Host figures are the process's own (``/proc/self/status``), with its peak reset when a stage
begins; the stages allocate real tensors.  The device paths run against a stand-in device
module, since no CUDA or NPU is here: the stand-in is checked to take the calls the observer
makes with the real ``torch.cuda`` functions' signatures.  The cgroup reader is tried on this
machine's own cgroup and on folders holding the kernel's v1 and v2 file formats.
"""

from __future__ import annotations

import inspect
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")

import verl_events
from verl_events import ConfigError, stage
from verl_events.observers.memory.cgroup import find_cgroup, read_cgroup
from verl_events.observers.memory.host import read_status
from verl_events.observers.memory.record import MemoryRecord, memory_log_path

from .memory_support import MB, StandInCuda, allocate

pytestmark = pytest.mark.skipif(read_status() is None, reason="needs Linux /proc/self/status")


@pytest.fixture
def memory(tmp_path: Path) -> Iterator[Path]:
    with verl_events.install({"save_path": str(tmp_path), "observers": [{"name": "memory"}]}):
        yield tmp_path


def records(save_path: Path, rank: int = 0) -> list[MemoryRecord]:
    return [MemoryRecord.from_json(line) for line in memory_log_path(save_path, rank).read_text().splitlines()]


def test_a_stage_that_allocates_512_mb_peaks_500_mb_above_its_begin_and_an_idle_one_does_not(memory: Path) -> None:
    with stage("actor_update", role="actor", step=1):
        allocate(512)
    with stage("ref_compute_log_prob", role="ref", step=1):
        pass
    big, idle = records(memory)
    assert (big.stage, big.step, big.rank, big.host_peak) == ("actor_update", 1, 0, "reset")
    assert big.host_peak_bytes - big.host_begin_bytes >= 500 * MB
    assert big.host_end_bytes - big.host_begin_bytes < 100 * MB  # given back
    assert idle.host_peak_bytes - idle.host_begin_bytes < 50 * MB
    assert (big.device_peak_bytes, big.device) == (None, None)  # no device here


def test_an_enclosing_stage_keeps_the_peak_its_inner_stage_reached(memory: Path) -> None:
    with stage("actor_update", role="actor", step=2):
        with stage("train_batch", step=2):
            allocate(300)
        with stage("train_batch", step=2):
            pass
    first, second, outer = records(memory)
    assert [r.stage for r in (first, second, outer)] == ["train_batch", "train_batch", "actor_update"]
    assert first.host_peak_bytes - first.host_begin_bytes >= 290 * MB
    assert second.host_peak_bytes - second.host_begin_bytes < 50 * MB
    assert outer.host_peak_bytes >= first.host_peak_bytes


def test_a_stage_that_raises_is_recorded_with_its_error(memory: Path) -> None:
    with pytest.raises(ValueError), stage("actor_update", role="actor", step=3):
        raise ValueError("boom")
    (record,) = records(memory)
    assert record.error == "ValueError"


CALLED = (
    "is_available",
    "memory_allocated",
    "memory_reserved",
    "max_memory_allocated",
    "max_memory_reserved",
    "reset_peak_memory_stats",
    "mem_get_info",
)


def test_the_stand_in_takes_the_calls_as_torch_cudas_real_functions_do() -> None:
    """The observer calls each of these with no argument: the real torch.cuda functions
    (present in CPU builds too) must accept that, and the stand-in must mirror them."""
    for name in CALLED:
        real = inspect.signature(getattr(torch.cuda, name))
        real.bind()
        stand_in = inspect.signature(getattr(StandInCuda(), name))
        assert list(stand_in.parameters) == list(real.parameters), name


def test_on_a_device_each_stage_gets_its_own_peak_and_the_devices_use(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cuda = StandInCuda()
    monkeypatch.setattr("verl_events.observers.memory.observer.device_module", lambda: ("cuda", cuda))
    cuda.alloc(4 * 2**30)  # the model, held throughout
    with verl_events.install({"save_path": str(tmp_path), "observers": [{"name": "memory"}]}):
        with stage("actor_update", role="actor", step=1):
            cuda.alloc(6 * 2**30)  # activations
            cuda.allocated -= 6 * 2**30
        with stage("ref_compute_log_prob", role="ref", step=1):
            cuda.alloc(2**30)
    update, ref = records(tmp_path)
    assert update.device_peak_bytes == 10 * 2**30
    assert update.device == {
        "kind": "cuda",
        "allocated_begin": 4 * 2**30,
        "allocated_end": 4 * 2**30,
        "reserved_begin": 4 * 2**30,
        "reserved_end": 10 * 2**30,
        "peak_allocated": 10 * 2**30,
        "peak_reserved": 10 * 2**30,
        "used": 11 * 2**30,
        "total": 80 * 2**30,
    }
    # The second stage's peak is its own, not the first one's: reset when it began.
    assert ref.device_peak_bytes == 5 * 2**30
    assert cuda.resets == 2


def test_the_cgroup_reader_takes_both_kernel_formats_and_reads_this_machines(tmp_path: Path) -> None:
    v1 = tmp_path / "v1"
    job = v1.joinpath("memory", "job")  # cgroup v1's memory controller folder, not the observer's
    job.mkdir(parents=True)
    (job / "memory.usage_in_bytes").write_text("6012928000\n")
    (job / "memory.limit_in_bytes").write_text("9223372036854771712\n")
    (job / "memory.oom_control").write_text("oom_kill_disable 0\nunder_oom 0\noom_kill 2\n")
    (tmp_path / "cgroup-v1").write_text("5:devices:/\n4:memory:/job\n0::/\n")
    found = find_cgroup(tmp_path / "cgroup-v1", v1)
    assert found == (1, job)
    read = read_cgroup(found)
    assert read is not None and (read.limit_bytes, read.usage_bytes, read.oom_kills) == (None, 6012928000, 2)

    v2 = tmp_path / "v2"
    (v2 / "job").mkdir(parents=True)
    (v2 / "job/memory.current").write_text("1048576\n")
    (v2 / "job/memory.max").write_text("4294967296\n")
    (v2 / "job/memory.events").write_text("low 0\nhigh 0\nmax 3\noom 1\noom_kill 1\n")
    (tmp_path / "cgroup-v2").write_text("0::/job\n")
    read = read_cgroup(find_cgroup(tmp_path / "cgroup-v2", v2))
    assert read is not None and (read.version, read.limit_bytes, read.usage_bytes, read.oom_kills) == (
        2,
        4 * 2**30,
        2**20,
        1,
    )
    here = find_cgroup()
    if here is not None:  # a machine without a memory cgroup has nothing to read
        mine = read_cgroup(here)
        assert mine is not None and mine.usage_bytes is not None and mine.usage_bytes > 0


def test_the_records_hold_the_issues_fields_and_the_option_free_observer_refuses_options(tmp_path: Path) -> None:
    with verl_events.install({"save_path": str(tmp_path), "observers": [{"name": "memory"}]}):
        with stage("actor_update", role="actor", step=1):
            pass
    line = json.loads(memory_log_path(tmp_path, 0).read_text())
    assert {
        "step",
        "stage",
        "rank",
        "host_begin_bytes",
        "host_peak_bytes",
        "host_end_bytes",
        "device_peak_bytes",
    } <= set(line)
    with pytest.raises(ConfigError, match="interval"):
        verl_events.install({"save_path": str(tmp_path), "observers": [{"name": "memory", "interval": 1}]})


OOM_RANK = """\
import resource, sys
sys.path.insert(0, {repo!r})
import torch
import verl_events

config = {{"save_path": {save_path!r}, "observers": [{{"name": "watchdog"}}, {{"name": "memory"}}]}}
with verl_events.install(config):
    with verl_events.stage("actor_update", role="actor", step=1, rank=0):
        torch.ones(1000)
    # The address space it has now and 512 MiB more: the next 4 GiB cannot be had.
    size = int(open("/proc/self/status").read().split("VmSize:")[1].split()[0]) * 1024
    resource.setrlimit(resource.RLIMIT_AS, (size + 512 * 2**20, resource.RLIM_INFINITY))
    with verl_events.stage("actor_update", role="actor", step=2, rank=0):
        torch.ones(2**30)  # 4 GiB of float32
"""


@pytest.mark.slow
def test_a_rank_that_runs_out_of_memory_inside_a_stage_is_diagnosed_oom_with_that_stage(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A real out-of-memory: the address space limited with RLIMIT_AS, then torch's CPU
    allocator asked for 4 GiB inside step 2's actor_update."""
    import subprocess
    import sys

    from verl_events.apps.cli import main as verl_events_main

    from .support import REPO

    script = tmp_path / "rank.py"
    script.write_text(OOM_RANK.format(repo=str(REPO), save_path=str(tmp_path / "run")))
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 1, done.stderr
    assert "DefaultCPUAllocator: can't allocate memory" in done.stderr
    raised = [r for r in records(tmp_path / "run") if r.error is not None]
    assert [(r.step, r.stage, r.error, r.oom) for r in raised] == [
        (2, "actor_update", "RuntimeError", {"device": "cpu", "asked_bytes": 4 * 2**30})
    ]
    assert verl_events_main(["diagnose", str(tmp_path / "run"), "--json"]) == 1
    first = json.loads(capsys.readouterr().out)["first"]
    assert (first["kind"], first["rank"], first["step"], first["stage"]) == ("oom", 0, 2, "actor_update")
    assert first["detail"].startswith("out of memory (cpu); asked for 4.00 GiB; the process held ")
    assert "when actor_update began" in first["detail"]
    assert verl_events_main(["diagnose", str(tmp_path / "run")]) == 1
    out = capsys.readouterr().out
    assert "step 2, actor_update: oom: out of memory (cpu); asked for 4.00 GiB; the process held" in out


def test_the_report_names_a_stage_that_keeps_50_mb_a_step_as_a_leak_and_not_the_others(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from verl_events.apps.cli import main as verl_events_main

    kept = []
    config = {"save_path": str(tmp_path), "observers": [{"name": "timing"}, {"name": "memory"}]}
    with verl_events.install(config):
        for step in range(1, 7):
            with stage("actor_update", role="actor", step=step):
                kept.append(torch.ones(50 * MB // 4))  # kept: 50 MB more at every step
            with stage("ref_compute_log_prob", role="ref", step=step):
                allocate(100)  # a peak, given back
    assert verl_events_main(["report", str(tmp_path), "--json"]) == 0
    rows = {row["stage"]: row for row in json.loads(capsys.readouterr().out)["memory"]}
    update, ref = rows["actor_update"], rows["ref_compute_log_prob"]
    assert update["leak"] and 45 <= update["kept_median_mb"] <= 60, update
    assert not ref["leak"] and abs(ref["kept_median_mb"]) < 10, ref
    assert ref["host_peak_max_mb"] - update["host_peak_max_mb"] >= 40  # ref's 100 MB peak on top of what update kept
    assert rows.keys() == {"actor_update", "ref_compute_log_prob"}
    assert verl_events_main(["report", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "Memory by stage" in out
    assert "leak: actor_update keeps" in out and "leak: ref_compute_log_prob" not in out


@pytest.mark.slow
def test_the_healthy_demo_flags_no_leak(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Six steps of the tiny PPO demo, a run the leak rule was not tuned on: no stage flagged."""
    from verl_events.apps.cli import main as verl_events_main

    config = tmp_path / "memory.yaml"
    config.write_text(
        json.dumps({"save_path": str(tmp_path / "run"), "observers": [{"name": "timing"}, {"name": "memory"}]})
    )
    assert verl_events_main(["demo", "--config", str(config)]) == 0
    capsys.readouterr()
    assert verl_events_main(["report", str(tmp_path / "run"), "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)["memory"]
    assert {row["stage"] for row in rows} >= {"actor_compute_log_prob", "ref_compute_log_prob", "actor_update"}
    assert all(row["steps"] == 6 for row in rows), rows
    assert [row["stage"] for row in rows if row["leak"]] == []


class StandInCudaMemory:
    """torch.cuda.memory's history functions, as the observer calls them (no CUDA here)."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, Any]] = []
        self.metadata = ""

    def _record_memory_history(
        self,
        enabled: Any = "all",
        context: Any = "all",
        stacks: str = "all",
        max_entries: int = 2**63 - 1,
        device: Any = None,
        clear_history: bool = False,
        compile_context: bool = False,
        global_record_annotations: bool = False,
        skip_actions: Any = None,
    ) -> None:
        self.calls.append(("history", (enabled, context, stacks, max_entries)))

    def _set_memory_metadata(self, metadata: str) -> None:
        self.metadata = metadata

    def _dump_snapshot(self, filename: str = "dump_snapshot.pickle", augment_with_fx_traces: bool = False) -> None:
        Path(filename).write_bytes(b"snapshot while " + self.metadata.encode())


def test_the_history_stand_in_has_torchs_own_signatures() -> None:
    """The three history functions exist in CPU builds too (they fail only when called):
    the stand-in's parameters are theirs, and the observer's calls bind to the real ones."""
    memory = StandInCudaMemory()
    for name in ("_record_memory_history", "_set_memory_metadata", "_dump_snapshot"):
        real = inspect.signature(getattr(torch.cuda.memory, name))
        assert list(inspect.signature(getattr(memory, name)).parameters) == list(real.parameters), name
    real = inspect.signature(torch.cuda.memory._record_memory_history)
    real.bind(enabled="all", context="all", stacks="python", max_entries=100_000)
    real.bind(enabled=None)
    inspect.signature(torch.cuda.memory._set_memory_metadata).bind("actor_update step 3 rank 0")
    inspect.signature(torch.cuda.memory._dump_snapshot).bind("/x/oom_rank0_step3_actor_update.pickle")


def test_with_cuda_the_history_is_tagged_by_stage_and_an_oom_leaves_a_snapshot_named_by_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """CUDA stood in for: the allocator's out-of-memory observer is called as the caching
    allocator calls it (device, size asked, total, free), from inside the stage."""
    from verl_events.observers.memory import observer

    memory, attached = StandInCudaMemory(), []
    cuda = StandInCuda()
    cuda.memory = memory  # type: ignore[attr-defined]
    monkeypatch.setattr(observer, "device_module", lambda: ("cuda", cuda))
    monkeypatch.setattr(observer, "cuda_oom_attacher", lambda: attached.append)
    monkeypatch.setattr(torch.cuda, "memory", memory)
    config = {
        "save_path": str(tmp_path),
        "observers": [{"name": "memory", "record_history": True, "history_entries": 5000}],
    }
    with verl_events.install(config):
        assert memory.calls == [("history", ("all", "all", "python", 5000))]
        (on_oom,) = attached
        with stage("actor_update", role="actor", step=3, rank=1):
            with stage("train_batch", step=3, rank=1):
                assert memory.metadata == "train_batch step 3 rank 1"
                on_oom(0, 2**30, 80 * 2**30, 2**20)
            assert memory.metadata == "actor_update step 3 rank 1"
        assert memory.metadata == ""
    assert memory.calls[-1] == ("history", (None, "all", "all", 2**63 - 1))  # turned off at close
    snapshot = tmp_path / "memory/oom_rank1_step3_train_batch.pickle"
    assert snapshot.read_bytes() == b"snapshot while train_batch step 3 rank 1"


def test_record_history_without_cuda_is_one_warning_and_the_figures_are_kept(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    config = {"save_path": str(tmp_path), "observers": [{"name": "memory", "record_history": True}]}
    with caplog.at_level("WARNING", "verl_events.memory"), verl_events.install(config):
        with stage("actor_update", role="actor", step=1):
            pass
    warned = [r.getMessage() for r in caplog.records if "record_history" in r.getMessage()]
    assert warned == [
        "memory: record_history needs CUDA, and this process has no device: the per-stage figures are recorded, "
        "the allocator history and the out-of-memory snapshot are not"
    ]
    assert [r.stage for r in records(tmp_path)] == ["actor_update"]
    with pytest.raises(ConfigError, match="option history_entries: 0 is not allowed"):
        verl_events.install({"save_path": str(tmp_path), "observers": [{"name": "memory", "history_entries": 0}]})
