"""One user-frame rule: the module spelling (live frames, tracebacks) and the path spelling
(stacks written as text) pick the same frame of one real stack."""

from __future__ import annotations

import traceback

import pytest

import verl_events
from verl_events.frames import is_library_file, is_library_module, user_frame_of_traceback


def call_a_linear_layer_with_the_wrong_width() -> None:
    import torch

    torch.nn.Linear(4, 2)(torch.ones(3, 5))


def test_the_module_rule_and_the_path_rule_pick_the_same_user_frame() -> None:
    pytest.importorskip("torch")
    with pytest.raises(RuntimeError) as raised, verl_events.stage("actor_update", step=1):
        call_a_linear_layer_with_the_wrong_width()
    walked = list(traceback.walk_tb(raised.value.__traceback__))
    frames = [
        (str(f.f_globals.get("__name__", "")), f.f_code.co_filename, line, f.f_code.co_name, "") for f, line in walked
    ]
    assert any(module.startswith("torch.") for module, *_ in frames)  # torch's own frames are in the stack
    by_module = user_frame_of_traceback(frames)
    by_path = next(
        {"file": file, "line": line, "function": function, "code": ""}
        for _, file, line, function, _ in reversed(frames)
        if not is_library_file(file)
    )
    assert by_module == by_path
    assert by_module is not None and by_module["function"] == "call_a_linear_layer_with_the_wrong_width"
    for module, file, *_ in frames:
        assert is_library_module(module) == is_library_file(file), (module, file)


def test_the_path_rule_knows_installed_libraries_the_standard_library_and_pseudo_files() -> None:
    site = "/opt/venv/lib/python3.11/site-packages"
    assert is_library_file(f"{site}/torch/nn/modules/module.py")
    assert is_library_file(f"{site}/ray/_private/worker.py")
    assert is_library_file("/usr/lib/python3.11/contextlib.py") and is_library_file("<frozen runpy>")
    assert not is_library_file(f"{site}/verl/workers/fsdp_workers.py")  # verl is the user's side
    assert not is_library_file(f"{site}/transformers/models/qwen2/modeling_qwen2.py")
    assert not is_library_file("/home/me/torch/train.py")  # a user's folder named torch
    assert is_library_file(verl_events.__file__)
    # the CPU demo's model and loop stand for the user's code, though they ship in this package
    demo = verl_events.__file__.replace("__init__.py", "apps/demo/model.py")
    assert not is_library_file(demo) and not is_library_module("verl_events.apps.demo.model")
    assert is_library_module("verl_events.bus.dispatch") and is_library_module("verl_events.apps.report.summary")
