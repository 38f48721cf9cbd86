"""``verl-events gather``: a node's files, the merge of several nodes' copies, bad input; and
``{node}`` in save_path.

What runs on a node (verl_events.apps.gather.node) and how the gathered folder is built
(verl_events.apps.gather.folder) are tested here on real folders, in this process; Ray does not
take part.  Through Ray, on two Ray nodes of this machine with verl's real trainer writing into a
save_path of its own on each: tests/test_verl_replay.py.
"""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from verl_events import ConfigError
from verl_events.apps.cli import main as verl_events_main
from verl_events.apps.gather.folder import MANIFEST, GatheredFolder, GatherInputError, check_out
from verl_events.apps.gather.node import SKIPPED_LARGE, SKIPPED_OTHER, SKIPPED_STEPS, NodeFolder, read_node_folder
from verl_events.config import load_config
from verl_events.layout import NODE_ENV, node_name

NODE_A = "a" * 56  # Ray's node ids: 56 hex characters
NODE_B = "b" * 56


@pytest.fixture(autouse=True)
def _no_node_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(NODE_ENV, raising=False)


def write(path: Path, text: str, mtime: float | None = None) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    if mtime is not None:
        os.utime(path, (mtime, mtime))
    return path


def a_node_folder(root: Path) -> Path:
    """A run folder as a node leaves it, ``latest`` beside it."""
    run = root / "run-1"
    write(run / "run.json", '{"run_id": "run-1"}')
    write(run / "timing/rank0.jsonl", '{"rank": 0}\n')
    write(run / "heartbeats/rank0.json", '{"rank": 0}')
    write(run / "hangs/step_2_actor_update_rank0.txt", "stack")
    write(run / "step_2/actor_update/step0/rank0/dump.json", "{}" * 100)
    write(run / "memory/oom_rank0_step2_actor_update.pickle", "snapshot")
    write(run / "heartbeats/.rank0.json.1.2.tmp", "half a heartbeat")
    (run / "elsewhere").symlink_to(root)
    (root / "latest").symlink_to("run-1")
    return run


# -- {node} in save_path --------------------------------------------------------------


def test_node_is_the_host_name_outside_ray_and_the_inherited_node_inside_a_child(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert node_name() == socket.gethostname()
    monkeypatch.setenv(NODE_ENV, NODE_A)  # set by a Ray worker for the processes it starts
    assert node_name() == NODE_A


def test_node_in_save_path_is_filled_with_the_nodes_name(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(NODE_ENV, NODE_A)
    config = load_config({"save_path": f"{tmp_path}/{{node}}/{{run}}"})
    assert config.save_path.parent == tmp_path / NODE_A
    assert config.latest == tmp_path / NODE_A / "latest"


def test_another_placeholder_in_save_path_names_both_that_exist() -> None:
    with pytest.raises(ConfigError, match=r"holds '\{host\}', which is not a placeholder; use \{run\} .* or \{node\}"):
        load_config({"save_path": "/x/{host}/{run}"})


def test_neither_the_package_nor_gather_imports_ray_until_gather_runs() -> None:
    script = (
        "import sys, verl_events.config, verl_events.apps.gather, verl_events.apps.cli; "
        "verl_events.config.load_config({'save_path': '/tmp/{node}/{run}'}); print('ray' in sys.modules)"
    )
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "False"


# -- what a node sends ----------------------------------------------------------------


def test_a_node_sends_its_records_and_counts_what_it_leaves(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(NODE_ENV, NODE_A)
    a_node_folder(tmp_path / NODE_A)
    found = read_node_folder(f"{tmp_path}/{{node}}/latest")
    assert (found.node, found.folder) == (NODE_A, str(tmp_path / NODE_A / "run-1"))
    sent = sorted(file.path for file in found.files)
    assert sent == ["hangs/step_2_actor_update_rank0.txt", "heartbeats/rank0.json", "run.json", "timing/rank0.jsonl"]
    assert (found.sent_files, found.sent_bytes) == (4, sum(len(file.data) for file in found.files))
    assert found.skipped == {SKIPPED_STEPS: (1, 200), SKIPPED_OTHER: (1, 8)}


def test_a_node_keeps_files_over_the_limit_and_names_them(tmp_path: Path) -> None:
    write(tmp_path / "run/mismatch.jsonl", "x" * 100)
    found = read_node_folder(str(tmp_path / "run"), max_bytes=99)
    assert found.files == [] and found.skipped == {SKIPPED_LARGE: (1, 100)}
    assert found.large == [("mismatch.jsonl", 100)]


def test_all_sends_every_file_but_temporaries_and_links(tmp_path: Path) -> None:
    a_node_folder(tmp_path)
    found = read_node_folder(str(tmp_path / "latest"), everything=True)
    assert len(found.files) == 6 and found.skipped == {}
    assert ".rank0.json.1.2.tmp" not in {Path(file.path).name for file in found.files}


def test_a_node_without_the_folder_says_so(tmp_path: Path) -> None:
    found = read_node_folder(f"{tmp_path}/{{node}}/latest")
    assert found.folder is None and found.files == []


# -- several nodes into one folder ----------------------------------------------------


def gathered(tmp_path: Path, *nodes: tuple[str, Path], everything: bool = False) -> tuple[Path, dict[str, object]]:
    out = tmp_path / "out"
    folder = GatheredFolder(out)
    for node, root in nodes:
        folder.add(node, read_node_folder(str(root), everything=everything))
    manifest = {"source": "test", "merged": sorted(folder.merged), "renamed": folder.renamed}
    folder.finish(manifest)
    return out, manifest


def test_per_rank_files_meet_nowhere_and_the_same_copy_is_kept_once(tmp_path: Path) -> None:
    for node, rank in ((NODE_A, 0), (NODE_B, 1)):
        write(tmp_path / node / "timing" / f"rank{rank}.jsonl", f'{{"rank": {rank}}}\n', mtime=1000 + rank)
        write(tmp_path / node / "run.json", '{"run_id": "run-1"}', mtime=1000 + rank)
    out, manifest = gathered(tmp_path, (NODE_A, tmp_path / NODE_A), (NODE_B, tmp_path / NODE_B))
    assert sorted(p.relative_to(out).as_posix() for p in out.rglob("*") if p.is_file()) == [
        MANIFEST,
        "run.json",
        "timing/rank0.jsonl",
        "timing/rank1.jsonl",
    ]
    assert (out / "timing/rank1.jsonl").stat().st_mtime == 1001  # modification times kept
    assert (out / "run.json").stat().st_mtime == 1001
    assert manifest["merged"] == [] and manifest["renamed"] == []


def test_json_lines_of_several_nodes_are_merged_a_cut_line_on_its_own(tmp_path: Path) -> None:
    write(tmp_path / NODE_A / "crashes/ends.jsonl", '{"pid": 1}\n{"pid": 2, "cut')
    write(tmp_path / NODE_B / "crashes/ends.jsonl", '{"pid": 3}\n')
    out, manifest = gathered(tmp_path, (NODE_A, tmp_path / NODE_A), (NODE_B, tmp_path / NODE_B))
    assert (out / "crashes/ends.jsonl").read_text().splitlines() == ['{"pid": 1}', '{"pid": 2, "cut', '{"pid": 3}']
    assert manifest["merged"] == ["crashes/ends.jsonl"]


def test_differing_copies_keep_the_newest_under_the_name_and_the_other_beside_it(tmp_path: Path) -> None:
    write(tmp_path / NODE_A / "heartbeats/rank0.json", '{"from": "a"}', mtime=2000)
    write(tmp_path / NODE_B / "heartbeats/rank0.json", '{"from": "b"}', mtime=1000)
    out, manifest = gathered(tmp_path, (NODE_B, tmp_path / NODE_B), (NODE_A, tmp_path / NODE_A))
    assert (out / "heartbeats/rank0.json").read_text() == '{"from": "a"}'
    assert (out / "heartbeats/rank0.json.node-bbbbbbbb").read_text() == '{"from": "b"}'
    assert manifest["renamed"] == [
        {
            "path": "heartbeats/rank0.json",
            "kept_as": "heartbeats/rank0.json.node-bbbbbbbb",
            "node": NODE_B,
            "named": NODE_A,
            "why": "differing copies",
        }
    ]


def files_of(out: Path) -> dict[str, str]:
    return {p.relative_to(out).as_posix(): p.read_text() for p in out.rglob("*") if p.is_file() and p.name != MANIFEST}


@pytest.mark.parametrize("order", ["a-first", "b-first"])
def test_a_nodes_own_file_named_like_anothers_copy_is_never_written_over(tmp_path: Path, order: str) -> None:
    """With ``--all``: node A's own ``extra.json.node-bbbbbbbb``, and node B's differing
    ``extra.json`` that would be kept under that very name: all three contents survive, each listed."""
    write(tmp_path / NODE_A / "extra.json", '"a"', mtime=2000)
    write(tmp_path / NODE_A / "extra.json.node-bbbbbbbb", '"a\'s own"', mtime=2000)
    write(tmp_path / NODE_B / "extra.json", '"b"', mtime=1000)
    nodes = [(NODE_A, tmp_path / NODE_A), (NODE_B, tmp_path / NODE_B)]
    out, manifest = gathered(tmp_path, *(nodes if order == "a-first" else nodes[::-1]), everything=True)
    files = files_of(out)
    assert sorted(files.values()) == sorted(['"a"', '"a\'s own"', '"b"']), files
    assert files["extra.json"] == '"a"'  # the newest keeps the name
    for item in manifest["renamed"]:  # each entry names where that node's copy is
        assert files[item["kept_as"]] == (tmp_path / item["node"] / item["path"]).read_text()
    assert {item["why"] for item in manifest["renamed"]} <= {"differing copies", "its name was another node's copy's"}


@pytest.mark.parametrize("order", ["file-first", "folder-first"])
def test_a_path_that_is_a_file_on_one_node_and_a_folder_on_another_keeps_both(tmp_path: Path, order: str) -> None:
    write(tmp_path / NODE_A / "clash", "a file")
    write(tmp_path / NODE_B / "clash" / "one.json", "1")
    write(tmp_path / NODE_B / "clash" / "two.json", "2")
    write(tmp_path / NODE_B / "run.json", "{}")
    nodes = [(NODE_A, tmp_path / NODE_A), (NODE_B, tmp_path / NODE_B)]
    out, manifest = gathered(tmp_path, *(nodes if order == "file-first" else nodes[::-1]), everything=True)
    files = files_of(out)
    assert sorted(files.values()) == ["1", "2", "a file", "{}"], files
    renamed = manifest["renamed"]
    assert {item["why"] for item in renamed} == {"a file on one node, a folder on another"}, renamed
    if order == "file-first":  # the folder's files move together, under one new name
        assert {item["kept_as"] for item in renamed} == {"clash.node-bbbbbbbb/one.json", "clash.node-bbbbbbbb/two.json"}
    else:
        assert [item["kept_as"] for item in renamed] == ["clash.node-aaaaaaaa"]


def test_a_fifo_on_a_node_is_named_not_readable_and_its_other_files_still_come(tmp_path: Path) -> None:
    import threading

    root = a_node_folder(tmp_path)
    os.mkfifo(root / "timing" / "rank9.jsonl")
    found: list[NodeFolder] = []
    reader = threading.Thread(target=lambda: found.append(read_node_folder(str(root))), daemon=True)
    reader.start()
    reader.join(timeout=20)
    if not found:  # blocked on the FIFO: release it, then fail
        with open(root / "timing" / "rank9.jsonl", "wb"):
            pass
        pytest.fail("read_node_folder blocked on a FIFO")
    (node,) = found
    assert [(path, "FIFO" in error) for path, error in node.unreadable] == [("timing/rank9.jsonl", True)]
    assert "timing/rank0.jsonl" in [file.path for file in node.files]


def test_an_earlier_gather_of_the_same_source_is_replaced_anything_else_refused(tmp_path: Path) -> None:
    out = tmp_path / "out"
    check_out(out, "/runs/{node}/latest")  # missing: fine
    write(out / MANIFEST, json.dumps({"source": "/runs/{node}/latest"}))
    check_out(out, "/runs/{node}/latest")
    with pytest.raises(GatherInputError, match=r"already holds a gather of /runs/\{node\}/latest; give an empty"):
        check_out(out, "/other/latest")
    write(tmp_path / "mine/notes.txt", "")
    with pytest.raises(GatherInputError, match="already holds files of its own"):
        check_out(tmp_path / "mine", "/runs/latest")
    folder = GatheredFolder(out)
    folder.add(NODE_A, NodeFolder(NODE_A, "host", "/x"))
    folder.finish({"source": "/runs/{node}/latest"})
    assert sorted(p.name for p in out.iterdir()) == [MANIFEST]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["mine", "out"]  # nothing left aside


# -- the command's bad input: exit 2 before any node is asked -------------------------


@pytest.mark.parametrize(
    ("run", "message"),
    [
        ("/runs/{run}", r"RUN '/runs/\{run\}' holds '\{run\}'; the only placeholder is \{node\}"),
        ("runs/latest", r"RUN 'runs/latest' is read on every node: give an absolute path"),
    ],
)
def test_a_run_no_node_can_resolve_exits_2(
    run: str, message: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert verl_events_main(["gather", run, "--ray", "127.0.0.1:1", "--out", str(tmp_path / "out")]) == 2
    assert re.search(message, capsys.readouterr().err)


def test_an_address_where_no_cluster_listens_exits_2_at_once(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pytest.importorskip("ray")
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # bound, never listening
        code = verl_events_main(["gather", "/runs/latest", "--ray", f"127.0.0.1:{port}", "--out", str(tmp_path / "o")])
    assert code == 2
    assert f"--ray 127.0.0.1:{port}: no Ray cluster answers there" in capsys.readouterr().err
    assert not (tmp_path / "o").exists()


@pytest.mark.slow
def test_a_cluster_with_token_authentication_is_named_quietly_and_gathered_with_its_token(tmp_path: Path) -> None:
    """Ray 2.60's ``ray start`` turns token authentication on.  gather without the token says
    authentication (Ray's twenty retry lines kept off the console); with the token, as a driver
    of that cluster has it, it gathers, the driver's trainer.log among the small files."""
    import subprocess

    pytest.importorskip("ray")  # the cluster, and gather's way to it
    from .ray_cluster import RAY_ENV, LocalRayCluster
    from .support import verl_events_exe

    run = a_node_folder(tmp_path / "node")
    write(run / "trainer.log", "step:1 - ...\n")
    bare = {k: v for k, v in os.environ.items() if not k.startswith("RAY_AUTH")} | {
        k: v for k, v in RAY_ENV.items() if k != "RAY_AUTH_MODE"
    }
    with LocalRayCluster(1, bare, num_cpus=1, num_gpus=0, token=True) as cluster:
        argv = [verl_events_exe(), "gather", str(tmp_path / "node/latest"), "--ray", cluster.address]
        refused = subprocess.run([*argv, "--out", str(tmp_path / "refused")], env=bare, capture_output=True, text=True)
        assert refused.returncode == 2, refused.stderr
        assert "refused gather's authentication token" in refused.stderr and "RAY_AUTH_MODE=token" in refused.stderr
        assert len(refused.stderr.splitlines()) <= 3, refused.stderr  # no retry lines
        driver = bare | {k: v for k, v in cluster.env.items() if k.startswith("RAY_AUTH")}
        gathered = subprocess.run([*argv, "--out", str(tmp_path / "out")], env=driver, capture_output=True, text=True)
    assert gathered.returncode == 0, gathered.stderr
    assert (tmp_path / "out/trainer.log").read_text() == "step:1 - ...\n"
    assert (tmp_path / "out/timing/rank0.jsonl").is_file()
