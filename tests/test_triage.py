"""``verl-events triage`` on real msprobe 26.2 dumps written by the real MsprobeObserver (CPU torch).

The dumps are level ``mix``: it records both torch API calls (the finest op,
``Functional.linear.0.forward``) and modules (``Module.fc1.Linear.forward.0``,
with the module's parameters), construct.json maps each API to its module,
and stack.json holds every forward call's stack.  L0 has modules but no API
ops; L1 has API ops but no modules or parameters.  The anomalies.jsonl lines
are written with the real ``AnomalyRecord.to_json()``, as the sentinel writes them.
"""

from __future__ import annotations

import copy
import inspect
import json
import math
import os
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")  # triage reads real msprobe dumps of a torch model
pytest.importorskip("msprobe")

import verl_events
from verl_events import AnomalyEvent, stage
from verl_events.apps.cli import main
from verl_events.apps.triage import is_library_frame, user_frame
from verl_events.layout import RUN_ID_ENV, owner_of
from verl_events.observers.sentinel.record import AnomalyRecord

from .observers.support import NET_FILE, Net, forward_line, write_msprobe_config

pytestmark = pytest.mark.filterwarnings("ignore:Full backward hook is firing:UserWarning")

STAGE = "actor_update"
REPO = Path(__file__).resolve().parents[1]


@contextmanager
def msprobe_run(save_path: Path, level: str, steps: list[int]) -> Iterator[None]:
    """verl_events installed with the msprobe observer dumping ``steps`` at ``level``, as a fresh run."""
    config = write_msprobe_config(save_path.parent / f"{save_path.name}-msprobe.json", level=level)
    saved = os.environ.pop(RUN_ID_ENV, None)
    try:
        with verl_events.install(
            {
                "save_path": str(save_path),
                "observers": [{"name": "msprobe", "config_path": str(config), "steps": steps}],
            }
        ):
            yield
    finally:
        os.environ.pop(RUN_ID_ENV, None)
        if saved is not None:
            os.environ[RUN_ID_ENV] = saved


def record_run(save_path: Path, level: str, steps: list[int], change: dict[int, str]) -> Path:
    """Run Net for steps 1-3 under the msprobe observer (dumping ``steps``);
    before step s, ``change[s]`` sets fc1's weight[0, 0] to NaN ("nan"),
    scales fc1's weight by 1000 ("scale") or the input by 1000 ("input").
    The input is otherwise the same every step, and no step changes a weight."""
    torch.manual_seed(0)
    model, x = Net(), torch.randn(2, 4, requires_grad=True)
    with msprobe_run(save_path, level, steps):
        for step in (1, 2, 3):
            with torch.no_grad():
                if change.get(step) == "nan":
                    model.fc1.weight[0, 0] = float("nan")
                elif change.get(step) == "scale":
                    model.fc1.weight.mul_(1000)
                elif change.get(step) == "input":
                    x = (x.detach() * 1000).requires_grad_()
            with stage(STAGE, step=step, model=model):
                model(x).sum().backward()
    return save_path


def write_anomalies(run: Path, *events: AnomalyEvent, extra: str = "") -> Path:
    lines = [
        AnomalyRecord.from_event(event, run=owner_of(run), time=1.0 + i).to_json() for i, event in enumerate(events)
    ]
    (run / "anomalies.jsonl").write_text(extra + "".join(line + "\n" for line in lines))
    return run


def loss_nan(step: int = 1, rank: int = 0) -> AnomalyEvent:
    return AnomalyEvent(
        step=step, stage=STAGE, rank=rank, metric="loss", value=math.nan, rule="non_finite", detail="loss is NaN"
    )


def grad_norm_spike(step: int = 2) -> AnomalyEvent:
    return AnomalyEvent(step=step, stage=STAGE, rank=0, metric="grad_norm", value=1e4, rule="spike", baseline=3.0)


@pytest.fixture(scope="module", params=["mix", "L0"])
def nan_run(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path]]:
    """fc1's weight turns NaN before step 2; msprobe dumps steps 1 and 2; the loss anomaly is recorded at step 1."""
    run = record_run(tmp_path_factory.mktemp("nan") / "run", request.param, [1, 2], {2: "nan"})
    yield request.param, write_anomalies(run, loss_nan())


@pytest.fixture(scope="module")
def spike_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A healthy dump at step 1, the anomaly at step 2, fc1's weight x1000 and a dump at step 3."""
    run = record_run(tmp_path_factory.mktemp("spike") / "run", "mix", [1, 3], {3: "scale"})
    return write_anomalies(run, grad_norm_spike())


def copy_run(run: Path, tmp_path: Path) -> Path:
    return Path(shutil.copytree(run, tmp_path / "run"))


def triage_json(run: Path, capsys: pytest.CaptureFixture[str], expect: int = 1) -> dict[str, object]:
    assert main(["triage", str(run), "--json"]) == expect
    result: dict[str, object] = json.loads(capsys.readouterr().out)
    return result


def test_a_nan_weight_is_traced_to_the_first_non_finite_op_with_module_parameter_and_source(
    nan_run: tuple[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    level, run = nan_run
    result = triage_json(run, capsys)
    op = result["op"]
    assert isinstance(op, dict)
    dump = run / "step_2" / STAGE / "step0" / "rank0"
    assert result["dump"] == str(dump)
    # mix names the API call inside fc1, L0 the module itself.
    assert op["op"] == ("Functional.linear.0.forward" if level == "mix" else "Module.fc1.Linear.forward.0")
    assert (op["module"], op["module_entry"], op["parameter"]) == ("fc1", "Module.fc1.Linear.forward.0", "fc1.weight")
    assert (
        op["source"]["file"] == NET_FILE
        and op["source"]["line"] == forward_line()
        and op["source"]["function"] == "forward"
    )
    # It is the first non-finite entry in dump.json's order, and not the only one.
    entries = json.loads((dump / "dump.json").read_text())["data"]
    bad = [name for name, entry in entries.items() if not all(math.isfinite(v) for v in _statistics(entry))]
    assert bad[0] == op["op"] and len(bad) > 2


def _statistics(value: object) -> list[float]:
    """Every Max/Min/Mean/Norm in an entry, however deep."""
    if isinstance(value, dict):
        own = [value[s] for s in ("Max", "Min", "Mean", "Norm") if isinstance(value.get(s), float)]
        return own + [v for item in value.values() for v in _statistics(item)]
    if isinstance(value, list):
        return [v for item in value for v in _statistics(item)]
    return []


def test_mix_names_the_weight_the_linear_read_among_its_non_finite_parts(
    nan_run: tuple[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    level, run = nan_run
    op = triage_json(run, capsys)["op"]
    assert isinstance(op, dict)
    expected = ["input_args.1 = fc1.weight", "output.0"] if level == "mix" else ["output.0", "parameters.weight"]
    assert op["parts"] == expected


def test_triage_prints_the_anomaly_the_op_and_its_source_line(
    nan_run: tuple[str, Path], capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    run = nan_run[1]
    monkeypatch.chdir(REPO)  # the source line shows a file under the current directory relative to it
    assert main(["triage", str(run)]) == 1
    out = capsys.readouterr().out
    assert "anomaly step 1 actor_update rank 0: loss = nan (non_finite): loss is NaN" in out
    assert f"dump    {run / 'step_2/actor_update/step0/rank0'}" in out
    assert "first in execution order with a NaN/Inf" in out
    assert "module  fc1 (Module.fc1.Linear.forward.0)" in out
    assert "param   fc1.weight" in out
    assert (
        f"source  tests/observers/support.py:{forward_line()} in forward: "
        "out: torch.Tensor = self.fc2(torch.relu(self.fc1(x)))" in out
    )
    assert Path(NET_FILE) == REPO / "tests/observers/support.py"  # the JSON keeps the path as recorded


def test_json_has_one_shape_for_every_outcome(
    nan_run: tuple[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    keys = {
        "run",
        "anomalies",
        "anomaly",
        "found",
        "dump",
        "healthy_dump",
        "replay",
        "op",
        "later_op",
        "reason",
        "notes",
        "warnings",
    }
    found = triage_json(nan_run[1], capsys)
    assert set(found) == keys and found["found"] is True and found["anomalies"] == 1 and found["reason"] is None
    assert found["later_op"] is None  # an op is a later one only after a transient replay (test_triage_replay.py)
    assert found["replay"] is None  # a with-stage block is never replayed: no replays.jsonl
    assert isinstance(found["op"], dict) and set(found["op"]) == {
        "op",
        "parts",
        "module",
        "module_entry",
        "no_module",
        "parameter",
        "source",
        "factor",
        "parameter_factor",
        "largest",
    }
    assert found["anomaly"] == dict(
        AnomalyRecord.from_event(loss_nan(), run=owner_of(nan_run[1]), time=1.0).to_data(), line=1
    )
    nothing = triage_json(tmp_path, capsys, expect=0)
    assert set(nothing) == keys and nothing["op"] is None and nothing["anomaly"] is None and nothing["anomalies"] == 0


def test_the_rank_without_dumps_falls_back_to_another_and_says_so(
    nan_run: tuple[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = write_anomalies(copy_run(nan_run[1], tmp_path), loss_nan(rank=3))
    result = triage_json(run, capsys)
    assert result["notes"] == ["rank 3 has no dump after step 1; the dumps of rank(s) 0 are used instead"]
    assert isinstance(result["op"], dict) and result["op"]["module"] == "fc1"


def test_later_anomalies_are_counted_and_the_earliest_is_triaged(
    nan_run: tuple[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = write_anomalies(copy_run(nan_run[1], tmp_path), loss_nan(step=2), loss_nan(step=1))
    assert main(["triage", str(run)]) == 1
    out = capsys.readouterr().out
    assert "anomaly step 1 actor_update" in out and "(1 more recorded, step(s) 2; the first is triaged)" in out


def test_a_spike_names_the_scaled_layer_against_the_last_healthy_dump(
    spike_run: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    result = triage_json(spike_run, capsys)
    assert result["healthy_dump"] == str(spike_run / "step_1" / STAGE / "step0" / "rank0")
    assert result["dump"] == str(spike_run / "step_3" / STAGE / "step0" / "rank0")
    op = result["op"]
    assert isinstance(op, dict)
    assert (op["module"], op["parameter"]) == ("fc1", "fc1.weight")
    assert op["op"] == "Functional.linear.0.forward" and op["parts"] == ["input_args.1 = fc1.weight"]
    assert op["factor"] > 100 and op["parameter_factor"] > 100
    assert op["source"]["file"] == NET_FILE and op["source"]["line"] == forward_line()


class Policy(torch.nn.Module):
    """A tiny actor: the LayerNorm's bias starts at zero, so it is near zero while training."""

    def __init__(self) -> None:
        super().__init__()
        self.first = torch.nn.Identity()  # see observers/support.py's Net
        self.norm = torch.nn.LayerNorm(8)
        self.up = torch.nn.Linear(8, 16)
        self.down = torch.nn.Linear(16, 4)
        self.last = torch.nn.Identity()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.down(torch.relu(self.up(self.norm(x))))
        return out


def policy_line() -> int:
    """The line of Policy.forward that calls up: the user frame of up's ops."""
    lines, first = inspect.getsourcelines(Policy.forward)
    return first + next(i for i, line in enumerate(lines) if "self.up(" in line)


def record_kl_run(save_path: Path, level: str) -> Path:
    """Steps 1-4 of a PPO-like update of Policy, msprobe dumping steps 2 and 4:
    the loss carries 0.01 x a KL against a frozen copy of the initial actor,
    ``(log_prob - ref_log_prob).mean()``, which is near zero (the actor moves
    little) until up's weight is multiplied by 50 before step 4.  Adam moves
    every parameter a little each step; the spike is recorded at step 3."""
    torch.manual_seed(0)
    actor, x, advantages = Policy(), torch.randn(32, 8), torch.randn(32, 4)
    ref = copy.deepcopy(actor)
    optimizer = torch.optim.Adam(actor.parameters(), lr=1e-3)
    with msprobe_run(save_path, level, [2, 4]):
        for step in (1, 2, 3, 4):
            with torch.no_grad():
                ref_log_prob = torch.log_softmax(ref(x), dim=-1)
                if step == 4:
                    actor.up.weight.mul_(50)
            with stage(STAGE, step=step, model=actor):
                log_prob = torch.log_softmax(actor(x), dim=-1)
                kl = (log_prob - ref_log_prob).mean()
                loss = -(log_prob * advantages).mean() + 0.01 * kl
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
    return write_anomalies(save_path, grad_norm_spike(step=3))


@pytest.fixture(scope="module", params=["mix", "L0"])
def kl_run(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> tuple[str, Path]:
    return request.param, record_kl_run(tmp_path_factory.mktemp("kl") / "run", request.param)


def test_a_scaled_weight_is_named_before_a_near_zero_kl_that_moved_by_a_larger_ratio(
    kl_run: tuple[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    """The KL's mean moves x1e5 as a bare ratio, the weight x50 and every other parameter
    about x1.001: the op named is the first to read the weight, with module, parameter, line."""
    level, run = kl_run
    result = triage_json(run, capsys)
    assert result["healthy_dump"] == str(run / "step_2" / STAGE / "step0" / "rank0")
    assert result["dump"] == str(run / "step_4" / STAGE / "step0" / "rank0")
    op = result["op"]
    assert isinstance(op, dict)
    # The first op that reads the weight: the linear inside up (mix), up itself (L0).
    assert op["op"] == ("Functional.linear.0.forward" if level == "mix" else "Module.up.Linear.forward.0")
    assert op["parts"] == (["input_args.1 = up.weight"] if level == "mix" else ["parameters.weight"])
    assert (op["module"], op["module_entry"], op["parameter"]) == ("up", "Module.up.Linear.forward.0", "up.weight")
    assert 49 < op["parameter_factor"] < 51 and op["largest"] is None and op["factor"] > 10
    assert op["source"]["file"] == __file__ and op["source"]["line"] == policy_line()
    assert main(["triage", str(run)]) == 1
    out = capsys.readouterr().out
    assert f"(parameter up.weight moved x{op['parameter_factor']:.3g}, the median parameter x1" in out
    assert "param   up.weight (moved x" in out


def test_at_l1_a_near_zero_kl_does_not_outweigh_the_layer_where_the_jump_entered(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """L1 records no parameters, so the op outputs decide: the KL's difference and mean are
    measured against the log-probs they come from, and the linear that read the weight is named."""
    op = triage_json(record_kl_run(tmp_path / "run", "L1"), capsys)["op"]
    assert isinstance(op, dict)
    assert op["op"] == "Functional.linear.0.forward" and op["parts"] == ["output.0"]
    assert op["module"] is None and op["parameter"] is None and 40 < op["factor"] < 60
    assert op["no_module"] == "none recorded: the dump holds no module entries (level L1 records torch API calls only)"
    assert isinstance(op["largest"], dict) and op["largest"]["factor"] < 10 * op["factor"]
    assert op["source"]["file"] == __file__ and op["source"]["line"] == policy_line()


def test_a_spike_without_a_parameter_jump_names_the_op_whose_output_moved(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = write_anomalies(record_run(tmp_path / "run", "mix", [1, 3], {3: "input"}), grad_norm_spike())
    op = triage_json(run, capsys)["op"]
    assert isinstance(op, dict)
    assert (op["op"], op["parts"], op["module"]) == ("Functional.linear.0.forward", ["output.0"], "fc1")
    assert op["parameter"] is None and op["parameter_factor"] is None and op["factor"] > 100
    assert main(["triage", str(run)]) == 1
    assert "op      Functional.linear.0.forward  (output.0 norm x" in capsys.readouterr().out


def test_a_spike_without_an_earlier_dump_of_its_stage_names_no_op(
    spike_run: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = copy_run(spike_run, tmp_path)
    shutil.rmtree(run / "step_1")
    assert main(["triage", str(run)]) == 1
    out = capsys.readouterr().out
    assert "anomaly step 2 actor_update rank 0: grad_norm = 10000.0 (spike, baseline 3.0)" in out
    assert "no healthy dump to compare with: no dump of actor_update before step 2 (rank 0)" in out
    result = triage_json(run, capsys)
    assert result["op"] is None and result["found"] is False


def test_a_non_finite_anomaly_whose_dumps_hold_no_nan_says_it_did_not_recur(
    spike_run: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = write_anomalies(copy_run(spike_run, tmp_path), loss_nan(step=2))
    result = triage_json(run, capsys)
    assert result["op"] is None
    assert result["reason"] == (
        "none of the 1 dump(s) after step 2 (steps 3) holds a NaN or Inf: "
        "the non-finite value did not recur in the dumped stages"
    )


def test_an_anomaly_without_dumps_after_it_is_printed_with_the_reason(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    write_anomalies(tmp_path, loss_nan(step=4))
    assert main(["triage", str(tmp_path)]) == 1
    out = capsys.readouterr().out
    assert "anomaly step 4 actor_update rank 0: loss = nan (non_finite)" in out
    assert (
        "no msprobe dump after step 4: msprobe was not armed (no msprobe observer with trigger: anomaly), "
        "or the run stopped before step 5" in out
    )


def test_no_anomalies_exits_0_and_says_so(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["triage", str(tmp_path)]) == 0
    assert capsys.readouterr().out.strip() == f"no anomalies recorded in {tmp_path / 'anomalies.jsonl'}"
    (tmp_path / "anomalies.jsonl").write_text("\n")
    assert main(["triage", str(tmp_path)]) == 0


def test_unreadable_lines_are_skipped_with_a_warning(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    write_anomalies(tmp_path, loss_nan(), extra='{"step": 1, "rank\n{"step": 1}\n')
    assert main(["triage", str(tmp_path)]) == 1
    captured = capsys.readouterr()
    assert f"warning: {tmp_path / 'anomalies.jsonl'}:1: not a JSON line (" in captured.err
    assert f"warning: {tmp_path / 'anomalies.jsonl'}:2: not an anomaly record (" in captured.err
    assert "anomaly step 1 actor_update" in captured.out


def test_a_run_that_is_missing_or_not_a_directory_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["triage", str(tmp_path / "nope")]) == 2
    assert f"error: {tmp_path / 'nope'} does not exist; pass the save_path of a run" in capsys.readouterr().err
    (tmp_path / "file").write_text("")
    assert main(["triage", str(tmp_path / "file")]) == 2
    assert "is not a directory" in capsys.readouterr().err


def test_the_user_frame_is_the_first_outside_torch_msprobe_and_the_stdlib() -> None:
    site = "/env/lib/python3.11/site-packages"
    frames = [
        f"File {site}/torch/nn/modules/linear.py, line 134, in forward, "
        "\n return F.linear(input, self.weight, self.bias)",
        "File /usr/lib/python3.11/contextlib.py, line 81, in inner, \n return func(*args, **kwds)",
        f"File {site}/transformers/models/llama/modeling_llama.py, line 200, in forward, \n x = self.up(x)",
        "File /work/train.py, line 9, in main, \n model(x)",
    ]
    assert user_frame(frames) == {
        "file": f"{site}/transformers/models/llama/modeling_llama.py",
        "line": 200,
        "function": "forward",
        "code": "x = self.up(x)",
    }
    assert is_library_frame(f"{site}/msprobe/pytorch/hook.py") and is_library_frame("<frozen runpy>")
    assert not is_library_frame("/home/me/torch/train.py")
    assert user_frame(frames[:2]) is None


class Gained(torch.nn.Module):
    """Linear layers after a gain the root model applies itself, in its own forward.

    Three submodules: with verl imported (as in the whole suite), msprobe leaves the first
    and the last of ``named_modules()`` unhooked, and the dump must still hold a module."""

    def __init__(self) -> None:
        super().__init__()
        self.gain = torch.nn.Parameter(torch.ones(4))
        self.fc1 = torch.nn.Linear(4, 4)
        self.act = torch.nn.Tanh()
        self.fc = torch.nn.Linear(4, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.fc(self.act(self.fc1(x * self.gain)))
        return out


def record_module_less_run(save_path: Path, nan_in: str) -> Path:
    """One healthy step, then step 2 with a NaN where ``nan_in`` says: ``"root"`` puts it in
    Gained's gain (the root model's own op reads it), ``"loss"`` in the weights of the loss,
    computed outside every module; msprobe dumps step 2 at level mix."""
    torch.manual_seed(0)
    model, x = Gained(), torch.randn(2, 4)
    weights = torch.ones(2, 2)
    with msprobe_run(save_path, "mix", [2]):
        for step in (1, 2):
            if step == 2:
                with torch.no_grad():
                    (model.gain if nan_in == "root" else weights)[0] = math.nan
            with stage(STAGE, step=step, model=model):
                (model(x) * weights).sum().backward()
    return write_anomalies(save_path, loss_nan())


@pytest.mark.parametrize(
    ("nan_in", "reason"),
    [
        (
            "root",
            "none: it ran in a module msprobe does not hook "
            "(the root model's own forward, or a model msprobe was not given)",
        ),
        ("loss", "none: it ran outside every module's forward"),
    ],
)
def test_an_op_outside_the_hooked_modules_gets_the_one_reason_that_applies(
    nan_in: str, reason: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = record_module_less_run(tmp_path / "run", nan_in)
    op = triage_json(run, capsys)["op"]
    assert isinstance(op, dict)
    # The gain's product is the run's first, the loss's the second.
    first, function = ("0", "forward") if nan_in == "root" else ("1", "record_module_less_run")
    assert op["op"] == f"Tensor.__mul__.{first}.forward" and op["module"] is None
    assert op["source"]["file"] == __file__ and op["source"]["function"] == function
    assert op["no_module"] == reason
    assert main(["triage", str(run)]) == 1
    assert f"module  {reason}\n" in capsys.readouterr().out


def test_the_source_line_shows_a_file_under_the_current_directory_relative_and_others_from_their_package(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from verl_events.apps.triage.render import shown_path

    package = tmp_path / "code" / "pkg" / "sub"
    package.mkdir(parents=True)
    for folder in (package, package.parent):
        (folder / "__init__.py").write_text("")
    (tmp_path / "code" / "script.py").write_text("")
    monkeypatch.chdir(tmp_path / "code")
    assert shown_path(str(tmp_path / "code" / "pkg" / "sub" / "mod.py")) == "pkg/sub/mod.py"
    elsewhere = tmp_path / "work"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    # The package's files from its top folder, the same on every machine; .../ for what is left out.
    assert shown_path(str(package / "mod.py")) == ".../pkg/sub/mod.py"
    site = "/opt/env/lib/python3.11/site-packages"
    assert shown_path(f"{site}/transformers/models/qwen2/modeling_qwen2.py") == (
        ".../transformers/models/qwen2/modeling_qwen2.py"
    )
    assert shown_path(str(tmp_path / "code" / "script.py")) == str(tmp_path / "code" / "script.py")  # no package
    assert shown_path(str(Path.home() / "train" / "model.py"), cwd=elsewhere) == "~/train/model.py"
    assert shown_path("relative/model.py") == "relative/model.py"
