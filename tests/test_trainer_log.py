"""Reading verl's trainer output as it is written (verl_events.apps.verl_cpu.trainer_log)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from verl_events.apps.verl_cpu.job import _run_in_own_session
from verl_events.apps.verl_cpu.trainer_log import FinishedStep, LogFollower, finished_step, tail

# A line as verl 0.9.1's console logger prints it from the TaskRunner, Ray's prefix in colour.
STEP_LINE = (
    "\x1b[36m(TaskRunner pid=6340)\x1b[0m step:2 - global_seqlen/min:75 - actor/pg_loss:-0.013"
    " - timing_s/step:0.912 - timing_s/gen:0.31 - perf/total_num_tokens:75"
)


def test_verls_step_line_gives_the_step_and_its_seconds() -> None:
    assert finished_step(STEP_LINE) == FinishedStep(2, 0.912)
    assert finished_step("step:1 - actor/pg_loss:0.5") == FinishedStep(1, None)


def test_other_lines_are_no_step() -> None:
    for line in (
        "\x1b[36m(TaskRunner pid=1)\x1b[0m Training Progress:  33%|███▎      | 1/3 [00:18<00:36, 18.05s/it]",
        "data.max_prompt_length: 16",
        "total_training_steps:3 - other",
        "",
    ):
        assert finished_step(line) is None, line


def test_the_follower_hands_on_complete_lines_as_a_real_process_writes_them(tmp_path: Path) -> None:
    log = tmp_path / "trainer.log"
    seen: list[str] = []
    follower = LogFollower(log, seen.append)
    follower.poll()  # not written yet: nothing, no error
    script = "import sys, time\nfor i in range(3):\n    print(f'step:{i + 1} - x:1', flush=True)\n    time.sleep(0.3)\n"
    script += "sys.stdout.write('last, unterminated')"
    with log.open("w") as out:
        code = _run_in_own_session([sys.executable, "-c", script], {}, out, timeout=60, follower=follower)
    assert code == 0
    assert seen == ["step:1 - x:1", "step:2 - x:1", "step:3 - x:1", "last, unterminated"]


def test_tail_gives_the_last_lines(tmp_path: Path) -> None:
    log = tmp_path / "trainer.log"
    log.write_text("".join(f"line {i}\n" for i in range(100)))
    assert tail(log, 3) == ["line 97", "line 98", "line 99"]
    assert tail(log, 500)[0] == "line 0"


def test_a_run_past_its_timeout_raises_after_handing_on_what_it_wrote(tmp_path: Path) -> None:
    log = tmp_path / "trainer.log"
    seen: list[str] = []
    script = "import time\nprint('started', flush=True)\ntime.sleep(60)"
    with log.open("w") as out, pytest.raises(subprocess.TimeoutExpired):
        _run_in_own_session([sys.executable, "-c", script], {}, out, timeout=10, follower=LogFollower(log, seen.append))
    assert seen == ["started"]
