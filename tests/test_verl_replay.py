"""Replay on verl 0.9.1's real trainer — ``python -m verl.trainer.main_ppo`` under Ray, FSDP2 on
gloo, CPU — with two FSDP ranks on two Ray nodes, each writing to its own folder, gathered with
``verl-events gather`` (issue 18, part 2; issue 29, part 3).

Two ranks, one per node: a Ray cluster of two nodes started beforehand on this machine
(tests/ray_cluster.py; each node one fake GPU and 6 logical CPUs, for a ``{CPU: 3, GPU: 1}`` bundle,
the task runner, the agent loop and the reward worker), the driver connecting to it with
``trainer.nnodes=2 trainer.n_gpus_per_node=1``, as docs/verl.md's multi-node section says.  The
job is verl_events.apps.verl_cpu.job, switched on with ``VERL_EVENTS_CONFIG`` passed to the
workers through ``+ray_kwargs.ray_init.runtime_env.env_vars`` (the nodes' own environment lacks
it): timing, the sentinel with its default rules (NaN/inf), msprobe armed by anomalies, and a
fault that puts a NaN into rank 1's shard of the actor's first Linear weight for step 2's
``actor_compute_log_prob`` and its replay only (``lasts: stage``).  Its save_path is the doc's
node-local one, with ``{node}`` standing the two nodes of one machine apart.  After the run,
docs/verl.md's gather command (twice in a row) collects the small files, ``--all`` everything
(the folder the replay's assertions read), and, with the second node stopped, the first node's
files and the second listed as unreachable.  One trainer run, about a minute of ``main_ppo`` on
2 cores, and the cluster's start and the gathers, about 30 s more.

Is verl's log-prob stage safe to run twice?  ``ActorRolloutRefWorker.compute_log_prob`` and
``compute_ref_log_prob`` (verl/workers/engine_workers.py:696-706) call
``TrainingWorker.infer_batch`` (:398): ``engine.eval_mode()`` (sets and resets ``engine.mode``;
offloads nothing in this job) and ``engine.infer_batch`` under ``torch.no_grad`` — no gradient,
optimizer, RNG or model state changes, and the output is a new TensorDict.  The input TensorDict
is changed in place, but only with keys the replay sets again to the same values
(``tu.assign_non_tensor`` of absent defaults, ``enable_routing_replay``, and in
``FSDPEngine.forward_backward_batch`` (engine/fsdp/transformer_impl.py:724) ``sp_size``,
``batch_num_tokens``, ``dp_size``, computed from the same tensors), with one exception:
``infer_batch`` *pops* ``no_lora_adapter`` (:403).  The trainer sets it only when the
reference model is the LoRA actor with its adapter off (``ref_in_actor``,
trainer/ppo/ray_trainer.py:1273); a replay of that call finds the key gone and runs the actor
with its adapter, so its dump is not of the stage that raised.  This job has a reference model
of its own (no LoRA): the key is never set, and a replay computes exactly what the stage did.
The forward also runs two collectives per call (``all_reduce`` of the token count and of the
loss over the data-parallel group), which is why every rank must replay together.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

torch = pytest.importorskip("torch")  # verl's real trainer
pytest.importorskip("verl")

from verl_events.apps.cli import main as verl_events_main
from verl_events.apps.gather import MANIFEST
from verl_events.apps.verl_cpu import job
from verl_events.observers.sentinel.record import ReplayRecord
from verl_events.observers.timing import timing_log_files

from .ray_cluster import RAY_ENV, LocalRayCluster
from .support import doc_blocks, verl_events_exe

pytestmark = [pytest.mark.filterwarnings("ignore::DeprecationWarning"), pytest.mark.slow]

STAGES = ("actor_compute_log_prob", "ref_compute_log_prob", "actor_update")
FAULT = {
    "_target_": "verl_events.apps.inject:WeightFault",
    "kind": "nan",
    "step": 2,
    "stages": ["actor_compute_log_prob"],
    "lasts": "stage",
    "ranks": [1],
}
CONFIG = {
    "observers": [
        {"name": "timing"},
        {"name": "sentinel"},
        {
            "name": "msprobe",
            "config_path": "statistics_mix",
            "stages": list(STAGES),
            "trigger": "anomaly",
            "capture_steps": 1,
            "max_captures": 2,  # the replay, then the step after the anomaly
        },
        FAULT,
        {"name": "mismatch"},  # with the rollout's log-probs switched off (WITHOUT_ROLLOUT_LOG_PROBS)
    ]
}
#: docs/verl.md's multi-node section: the node-local save_path, and the gather command.
(NODE_LOCAL_CONFIG,) = [b for b in doc_blocks("yaml") if "/local_disk/" in b]
(GATHER,) = [b for b in doc_blocks("bash") if b.startswith("verl-events gather")]
# verl 0.9.1 keeps them by default: off, the mismatch observer has nothing to compare.
WITHOUT_ROLLOUT_LOG_PROBS = "actor_rollout_ref.rollout.calculate_log_probs=False"
# A healthy run takes about a minute; a rank left alone in a collective waits forever.
TIMEOUT_S = 600


@dataclass(frozen=True)
class Gathered:
    code: int
    out: str
    manifest: dict[str, Any]


@dataclass(frozen=True)
class Run:
    save_path: Path  # every file of both nodes, gathered with --all
    code: int
    log: str
    nodes: Path  # the nodes' own folders, {node} filled in: nodes/<Ray node id>/...
    small: list[Gathered]  # the doc's gather command, twice in a row
    one_node: Gathered  # the same with the second node stopped
    damaged: Gathered  # --all of a copy of each node's folder, damaged (see damage_the_copies)


def on_this_machine(root: Path, text: str, address: str = "") -> str:
    """The doc's text on this machine's two nodes: /local_disk/verl_events (one path on every
    node, each node's own disk) is nodes/{node} (one disk: a folder per node), /shared/ is ``root``."""
    text = text.replace("/local_disk/verl_events", f"{root}/nodes/{{node}}").replace("/shared/", f"{root}/")
    return text.replace("10.0.0.1:6379", address)


def on_the_cluster(overrides: list[str], address: str, config: Path) -> list[str]:
    """The job's overrides for a driver that joins the cluster at ``address``: no local cluster of
    its own (no resources given to ray.init), one rank on each of two nodes, and the config for
    the workers through the runtime environment."""
    local = ("+ray_kwargs.ray_init.num_gpus", "+ray_kwargs.ray_init.include_dashboard")
    kept = [o for o in overrides if not o.startswith(local)]
    return job.merge_overrides(
        kept,
        [
            f'+ray_kwargs.ray_init.address="{address}"',
            "ray_kwargs.ray_init.num_cpus=null",
            "trainer.nnodes=2",
            "trainer.n_gpus_per_node=1",
            f"+ray_kwargs.ray_init.runtime_env.env_vars.VERL_EVENTS_CONFIG={config}",
            WITHOUT_ROLLOUT_LOG_PROBS,
        ],
    )


def gather(command: str, env: dict[str, str], source: str | None = None) -> Gathered:
    argv = [verl_events_exe(), *command.split()[1:]]
    if source is not None:
        argv[2] = source  # verl-events gather RUN ...
    result = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=300)
    print(result.stdout, result.stderr[-3000:])
    out = Path(argv[argv.index("--out") + 1])
    manifest = json.loads((out / MANIFEST).read_text()) if (out / MANIFEST).exists() else {}
    return Gathered(result.returncode, result.stdout, manifest)


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Run:
    files = job.prepare(tmp_path_factory.mktemp("replay-job"))
    root = tmp_path_factory.mktemp("replay")
    save_path = yaml.safe_load(on_this_machine(root, NODE_LOCAL_CONFIG))["save_path"]
    # JSON is YAML: the file the workers read is the config above, as written.
    (root / "replay.yaml").write_text(json.dumps({"save_path": save_path, **CONFIG}, indent=1))
    base = {k: v for k, v in os.environ.items() if not k.startswith("VERL_EVENTS_")}
    # The nodes' environment: verl's CPU shim set up, no VERL_EVENTS_CONFIG (it comes with the job).
    env = job.trainer_env(base) | RAY_ENV
    log = root / "trainer.log"
    with LocalRayCluster(2, env) as cluster:
        overrides = on_the_cluster(job.trainer_args(files, steps=3), cluster.address, root / "replay.yaml")
        started = time.monotonic()
        driver = env | {"VERL_EVENTS_CONFIG": str(root / "replay.yaml")}
        code = job.run_trainer(overrides, driver, log=log, timeout=TIMEOUT_S)
        print(f"main_ppo with two FSDP ranks on two nodes: exit {code} after {time.monotonic() - started:.0f} s")
        started = time.monotonic()
        command = on_this_machine(root, GATHER, cluster.address).strip()
        small = [gather(command, env) for _ in range(2)]
        everything = gather(f"{command.replace('/gathered', '/profile')} --all", env)
        assert everything.code == 0, everything.out
        damage_the_copies(root)
        damaged = gather(f"{command.replace('/gathered', '/damaged-out')} --all", env, f"{root}/damaged/{{node}}")
        cluster.stop_node(1)
        one_node = gather(command.replace("/gathered", "/one-node"), env)
        print(f"four gathers and a node stopped: {time.monotonic() - started:.0f} s")
    return Run(root / "profile", code, log.read_text(), root / "nodes", small, one_node, damaged)


#: What damage_the_copies leaves on the first node (A) and the second (B), by node.
DAMAGE_FIFO = "timing/rank7.jsonl"


def damage_the_copies(root: Path) -> None:
    """A copy of each node's own folder of the run (``damaged/<node id>``), then damage that
    gather must survive: on node A a FIFO among its timing logs, a file ``clash`` and a file
    named like node B's copy of ``extra.json`` would be kept (``extra.json.node-<B>``); on node
    B a folder ``clash`` and a differing, older ``extra.json``."""
    import shutil

    nodes = sorted(path.name for path in (root / "nodes").iterdir() if (path / "latest").exists())
    a, b = (root / "damaged" / node for node in nodes)
    for node, copy in zip(nodes, (a, b), strict=True):
        shutil.copytree((root / "nodes" / node / "latest").resolve(), copy, symlinks=True)
    os.mkfifo(a / DAMAGE_FIFO)
    (a / "clash").write_text("node A's file")
    (a / "extra.json").write_text('"node A\'s, the newest"')
    (a / f"extra.json.node-{nodes[1][:8]}").write_text("\"node A's own, named like B's copy\"")
    (b / "clash").mkdir()
    (b / "clash" / "inner.json").write_text('"node B\'s folder"')
    (b / "extra.json").write_text('"node B\'s"')
    os.utime(b / "extra.json", (1, 1))


def dump_files(save_path: Path) -> list[str]:
    return sorted(str(p.relative_to(save_path)) for p in save_path.rglob("dump.json"))


def replay_records(save_path: Path) -> dict[int, ReplayRecord]:
    lines = (save_path / "replays.jsonl").read_text().splitlines()
    records = [ReplayRecord.from_json(line) for line in lines]
    assert len({r.rank for r in records}) == len(records), lines  # one replay per rank
    return {r.rank: r for r in records}


def test_the_trainer_trains_all_three_steps_and_exits_0(run: Run) -> None:
    # The gloo abort at interpreter exit (verl-cpu-notes.md) can only hit the ranks, Ray
    # workers that Ray ends after the driver has its results: main_ppo's own exit is clean.
    assert run.code == 0, run.log[-6000:]
    assert re.search(r"\bstep:3 - ", run.log), run.log[-6000:]  # verl's console logger, step 3
    assert "'Final validation metrics: None'" in run.log


def test_both_ranks_replay_step_2s_log_probs_and_healthy_step_1_is_not_dumped(run: Run) -> None:
    replay = [f"step_2/actor_compute_log_prob.replay/step0/rank{rank}/dump.json" for rank in (0, 1)]
    # The anomaly arms the next step as before: step 3, every stage, both ranks.
    after = [f"step_3/{stage}/step0/rank{rank}/dump.json" for stage in STAGES for rank in (0, 1)]
    assert dump_files(run.save_path) == sorted(replay + after)
    assert not (run.save_path / "step_1").exists()
    assert "replay of stage" not in run.log  # no replay raised


def test_rank_1s_replay_is_reproducible_and_its_inputs_are_kept(run: Run) -> None:
    records = replay_records(run.save_path)
    assert sorted(records) == [0, 1]
    faulty = records[1]
    assert (faulty.step, faulty.stage, faulty.verdict) == (2, "actor_compute_log_prob", "reproducible"), faulty
    assert "old_log_probs/nonfinite_count" in faulty.again, faulty
    # FSDP2 all-gathers rank 1's shard into rank 0's forward too: rank 0 raised and reproduced it.
    assert records[0].verdict == "reproducible", records[0]
    for rank, record in records.items():
        assert record.inputs == f"step_2/actor_compute_log_prob.replay/inputs_rank{rank}.pt", record
        kept = torch.load(run.save_path / record.inputs, weights_only=True)
        assert "input_ids" in kept and "responses" in kept, sorted(kept)


def test_the_one_off_fault_is_undone_after_the_replay_and_step_3_is_healthy(run: Run) -> None:
    anomalies = [json.loads(line) for line in (run.save_path / "anomalies.jsonl").read_text().splitlines()]
    first = [(a["step"], a["stage"]) for a in anomalies if a["rank"] == 1][0]
    assert first == (2, "actor_compute_log_prob"), anomalies
    # Step 2's update got NaN old log-probs, and verl skips an update whose gradient norm is
    # not finite (engine/fsdp/transformer_impl.py:823); with the weight restored, step 3 is clean.
    assert {a["step"] for a in anomalies} == {2}, anomalies
    assert "the injected fault is undone" in run.log


def test_triage_names_q_proj_in_qwen2s_modeling_file_from_the_replay_dump(
    run: Run, capsys: pytest.CaptureFixture[str]
) -> None:
    assert verl_events_main(["triage", str(run.save_path), "--json"]) == 1
    result = json.loads(capsys.readouterr().out)
    # The first anomaly on file is either rank's (both raise it, and append at once): its replay dump.
    assert result["found"], result
    assert re.search(r"/step_2/actor_compute_log_prob\.replay/step0/rank[01]$", result["dump"]), result
    assert result["replay"]["verdict"] == "reproducible", result
    op = result["op"]
    # The first op reading the NaN is the first Linear's (FSDP's all-gather copies come before
    # the model's own ops and are not the answer).
    assert op["parameter"] == "model.layers.0.self_attn.q_proj.weight", op
    assert op["op"].startswith("Functional.linear."), op
    source = op["source"]
    assert source["file"].endswith("transformers/models/qwen2/modeling_qwen2.py"), op
    assert "q_proj" in source["code"], op


def test_without_the_rollouts_log_probs_mismatch_names_the_setting_for_both_ranks(
    run: Run, capsys: pytest.CaptureFixture[str]
) -> None:
    lines = [json.loads(line) for line in (run.save_path / "mismatch.jsonl").read_text().splitlines()]
    assert sorted((line["step"], line["rank"]) for line in lines) == [(s, r) for s in (1, 2, 3) for r in (0, 1)]
    assert {line["missing"] for line in lines} == {"the batch carries no rollout_log_probs"}
    assert verl_events_main(["mismatch", str(run.save_path)]) == 2
    error = capsys.readouterr().err
    assert "at step(s) 1, 2, 3" in error and "actor_rollout_ref.rollout.calculate_log_probs=True" in error


def node_folders(run: Run) -> dict[str, Path]:
    """Each node's own folder of the run (``latest`` followed), by node id."""
    return {path.name: (path / "latest").resolve() for path in run.nodes.iterdir() if (path / "latest").exists()}


def test_each_node_keeps_its_own_ranks_files_in_its_own_folder(run: Run) -> None:
    assert run.code == 0, run.log[-6000:]
    folders = node_folders(run)
    assert len(folders) == 2, sorted(p.name for p in run.nodes.iterdir())
    stems = [[path.stem for path in timing_log_files(folder)] for folder in folders.values()]
    # Each node keeps one trainer rank's log; verl's driver (rank -1, its wait for generation)
    # keeps its own on whichever node Ray placed it.
    assert sorted([stem for stem in node if stem != "rank-1"] for node in stems) == [["rank0"], ["rank1"]], stems
    assert sum(node.count("rank-1") for node in stems) == 1, stems
    assert len({folder.name for folder in folders.values()}) == 1  # one run id on both nodes


def test_the_docs_gather_brings_both_ranks_small_files_twice_in_a_row_and_leaves_the_dumps(run: Run) -> None:
    assert [gathered.code for gathered in run.small] == [0, 0], run.small[-1].out
    manifest = run.small[-1].manifest
    folders = node_folders(run)
    assert sorted(node["node"] for node in manifest["nodes"]) == sorted(folders)
    for node in manifest["nodes"]:
        assert node["state"] == "gathered" and node["folder"] == str(folders[node["node"]]), node
        assert node["skipped"]["the step tree (msprobe dumps, profiler traces)"]["files"] > 0, node
    out = run.save_path.with_name("gathered")
    assert [path.stem for path in timing_log_files(out)] == ["rank-1", "rank0", "rank1"]
    assert not list(out.glob("step_*")) and not list(out.rglob("dump.json"))
    # Both ranks append to these: merged, every line kept.
    assert {"replays.jsonl", "mismatch.jsonl"} <= set(manifest["merged"]), manifest["merged"]
    assert sorted(r.rank for r in replay_records(out).values()) == [0, 1]
    assert manifest["unreachable"] == [] and manifest["renamed"] == []
    assert "from 2 of 2 node(s)" in run.small[-1].out


def test_report_and_diagnose_read_the_gathered_folder(run: Run, capsys: pytest.CaptureFixture[str]) -> None:
    out = run.save_path.with_name("gathered")
    assert verl_events_main(["report", str(out), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    # The driver's records are there too (-1); the headline counts the two ranks and the 3
    # training steps (step 0 is the starting sync).
    headline = report["headline"]
    assert report["ranks"] == [-1, 0, 1] and (headline["ranks"], headline["driver"], headline["steps"]) == (2, True, 3)
    assert verl_events_main(["diagnose", str(out), "--json"]) == 1
    diagnosis = json.loads(capsys.readouterr().out)
    first = diagnosis["first"]
    assert diagnosis["verdict"] == "anomalous", diagnosis
    # Both ranks see the NaN at once (FSDP all-gathers rank 1's shard): either is first.
    assert (first["step"], first["stage"], first["kind"]) == (2, "actor_compute_log_prob", "anomaly"), first
    assert first["rank"] in (0, 1) and first["source"] == "anomalies.jsonl", first


def test_a_stopped_node_is_listed_unreachable_and_the_other_nodes_files_are_gathered(run: Run) -> None:
    gathered = run.one_node
    assert gathered.code == 1, gathered.out
    (stopped,) = gathered.manifest["unreachable"]
    states = {node["node"]: node["state"] for node in gathered.manifest["nodes"]}
    assert states.pop(stopped) == "unreachable" and list(states.values()) == ["gathered"]
    assert "UNREACHABLE, Ray lists the node as dead" in gathered.out
    assert "1 node(s) could not be reached" in gathered.out
    out = run.save_path.with_name("one-node")
    kept = [path.stem for path in timing_log_files(out)]
    assert kept == [path.stem for path in timing_log_files(node_folders(run)[next(iter(states))])]


def test_gather_loses_nothing_of_damaged_node_folders_on_two_real_nodes(run: Run) -> None:
    """A FIFO on node A is named not readable and node A's other files still come; a file named
    like another node's copy, and a path that is a file on one node and a folder on the other,
    are kept under free names and listed: every file of both copies is in the gathered folder."""
    gathered = run.damaged
    assert gathered.code == 0 and gathered.manifest["unreachable"] == [], gathered.out
    nodes = sorted(node["node"] for node in gathered.manifest["nodes"])
    by_node = {node["node"]: node for node in gathered.manifest["nodes"]}
    a, b = nodes
    assert by_node[a]["unreadable"] == [
        {"path": DAMAGE_FIFO, "error": "it is a FIFO, not a regular file (readers open regular files only)"}
    ], by_node[a]
    assert f"not readable: {DAMAGE_FIFO}: it is a FIFO" in gathered.out
    out = run.save_path.with_name("damaged-out")
    gathered_bytes = sorted(p.read_bytes() for p in out.rglob("*") if p.is_file() and p.name != MANIFEST)
    copies = run.nodes.with_name("damaged")
    sent = [
        p
        for node in (a, b)
        for p in (copies / node).rglob("*")
        if p.is_file() and not p.is_symlink() and not p.name.startswith(".")  # what a node reads (node.py)
    ]
    # Every file of both nodes' copies is there (same-bytes copies once; the .jsonl both append to, merged).
    merged = set(gathered.manifest["merged"])
    for path in sent:
        relative = path.relative_to(copies / path.relative_to(copies).parts[0]).as_posix()
        if relative not in merged:
            assert path.read_bytes() in gathered_bytes, relative
    whys = {item["path"]: item["why"] for item in gathered.manifest["renamed"]}
    assert whys.get("clash") == "a file on one node, a folder on another" or (
        whys.get("clash/inner.json") == "a file on one node, a folder on another"
    ), whys
    assert "extra.json" in whys, whys
    assert (out / "extra.json").read_text() == '"node A\'s, the newest"'


def test_a_hung_trainer_is_killed_whole_at_the_timeout(tmp_path: Path) -> None:
    """The timeout the run above relies on: run_trainer's session, a parent and its child, all
    killed by PID (the same code path; a real hang cannot be made on purpose)."""
    pid_file = tmp_path / "child.pid"
    script = (
        "import subprocess, sys, time\n"
        f"child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(300)'])\n"
        f"open({str(pid_file)!r}, 'w').write(str(child.pid))\n"
        "time.sleep(300)\n"
    )
    with pytest.raises(subprocess.TimeoutExpired):
        job._run_in_own_session([sys.executable, "-c", script], dict(os.environ), timeout=5)
    child = int(pid_file.read_text())
    assert not Path(f"/proc/{child}").exists() or "Z" in Path(f"/proc/{child}/stat").read_text().split()[2]
