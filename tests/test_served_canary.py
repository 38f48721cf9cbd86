"""The weight_sync canary's calls into verl's vLLM and SGLang servers, checked against verl
0.9.1's own source of both (issue 27, part 3).

Neither engine runs here (no GPU; importing either server module fails without its engine), so
the servers' modules are read as source, with ``ast``, from the installed verl: the canary's
``generate`` call must bind to each server's ``generate`` signature, and each server must turn
the ``prompt_logprobs`` key the canary sends into prompt log-probs in ``extra_fields``.  The
replies are verl's real ``TokenOutput``, shaped as verl's extraction functions shape them (read
from the same source); what a running engine returns was not checked.
"""

from __future__ import annotations

import ast
import importlib
import inspect
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
verl = pytest.importorskip("verl")

from verl_events.observers.weight_sync import served
from verl_events.observers.weight_sync.canary import canary_ids, compare, forward
from verl_events.observers.weight_sync.served import SAMPLING, canary_request, side_from_outputs

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")  # Ray's, when verl's replica module imports

ROLLOUT = Path(verl.__file__).parent / "workers/rollout"
SERVERS = {
    "vllm": (ROLLOUT / "vllm_rollout/vllm_async_server.py", "vLLMHttpServer"),
    "sglang": (ROLLOUT / "sglang_rollout/async_sglang_server.py", "SGLangHttpServer"),
}


def method(path: Path, cls: str, name: str) -> ast.AsyncFunctionDef:
    tree = ast.parse(path.read_text())
    (found,) = [n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == cls]
    (function,) = [n for n in found.body if isinstance(n, ast.AsyncFunctionDef) and n.name == name]
    return function


def signature_of(function: ast.AsyncFunctionDef) -> inspect.Signature:
    """The method's signature, ``self`` dropped, defaults as placeholders."""
    args = function.args
    positional = args.posonlyargs + args.args
    defaults = [None] * (len(positional) - len(args.defaults)) + list(args.defaults)
    parameters = [
        inspect.Parameter(
            a.arg, inspect.Parameter.POSITIONAL_OR_KEYWORD, default=inspect.Parameter.empty if d is None else None
        )
        for a, d in zip(positional, defaults, strict=True)
    ][1:]
    for a, d in zip(args.kwonlyargs, args.kw_defaults, strict=True):
        default = inspect.Parameter.empty if d is None else None
        parameters.append(inspect.Parameter(a.arg, inspect.Parameter.KEYWORD_ONLY, default=default))
    return inspect.Signature(parameters)


@pytest.mark.parametrize("engine", SERVERS)
def test_the_canarys_request_binds_to_the_servers_generate(engine: str) -> None:
    path, cls = SERVERS[engine]
    signature = signature_of(method(path, cls, "generate"))
    assert list(signature.parameters)[:3] == ["prompt_ids", "sampling_params", "request_id"]
    signature.bind(**canary_request([1, 2, 3]))  # raises TypeError when the call does not fit


@pytest.mark.parametrize("engine", SERVERS)
def test_each_server_turns_prompt_logprobs_into_extra_fields(engine: str) -> None:
    path, cls = SERVERS[engine]
    source = ast.get_source_segment(path.read_text(), method(path, cls, "generate")) or ""
    if engine == "vllm":
        # SamplingParams(max_tokens=..., **sampling_params), then extract_prompt_logprobs(...) into extra_fields.
        assert "SamplingParams(max_tokens=max_tokens, **sampling_params)" in source
        assert "num_prompt_logprobs=sampling_params.prompt_logprobs" in source
        assert 'max_tokens = sampling_params.pop("max_tokens")' in source
    else:
        assert 'prompt_logprobs = sampling_params.pop("prompt_logprobs", None)' in source
        assert 'request["logprob_start_len"] = 0' in source
    assert set(SAMPLING) == {"max_tokens", "temperature", "prompt_logprobs"}


def test_verls_extraction_gives_one_row_per_prompt_token_with_a_padding_row_last() -> None:
    """verl's two extraction functions, read as source: the contract side_from_outputs reads."""
    vllm_source = (ROLLOUT / "vllm_rollout/utils.py").read_text()
    assert "for logprobs_dict in output.prompt_logprobs[1:]:" in vllm_source  # the first token has none
    assert "prompt_logprobs_ls.append([0.0] * max(num_prompt_logprobs, 1))" in vllm_source  # padding, last
    assert 'result_dict["prompt_logprobs"] = prompt_logprobs_ls' in vllm_source
    sglang_source = (ROLLOUT / "sglang_rollout/async_sglang_server.py").read_text()
    assert "Shape SGLang input-logprobs into the vLLM ``extract_prompt_logprobs`` contract." in sglang_source


def test_the_servers_replies_make_the_engines_side_and_a_healthy_one_compares_clean() -> None:
    """Replies shaped as verl's extraction shapes them, made from a real model's log-probs:
    the same model on both sides gives a gap of 0, and a server gives no layers."""
    transformers = pytest.importorskip("transformers")
    from verl.workers.rollout.replica import TokenOutput

    config = transformers.Qwen2Config(
        vocab_size=200, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=False,
    )  # fmt: skip
    torch.manual_seed(0)
    model = transformers.Qwen2ForCausalLM(config).eval()
    ids = canary_ids(config.vocab_size)
    trainer = forward(model, ids)
    replies = [
        TokenOutput(
            token_ids=[0],
            extra_fields={"prompt_logprobs": [[float(v)] for v in row] + [[0.0]], "prompt_ids": [[t] for t in seq]},
        )
        for row, seq in zip(trainer.log_probs.tolist(), ids, strict=True)
    ]
    engine = side_from_outputs(replies, ids)
    assert engine.layers == [] and engine.log_probs.shape == trainer.log_probs.shape
    baseline = compare(trainer, engine, None, 1e-3)
    later = compare(trainer, engine, baseline, 1e-3)
    assert (later.max, later.past, later.first_layer) == (0.0, False, None)
    with pytest.raises(ValueError, match="returned none of prompt_logprobs for a 32-token canary sequence"):
        side_from_outputs([TokenOutput(token_ids=[0], extra_fields={})] * len(ids), ids)


def test_the_old_module_still_gives_the_engine_sides_with_a_deprecation_warning(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """docs/weight-sync.md showed ``canary_engine: verl_events.apps.served_canary:vllm_canary``."""
    monkeypatch.delitem(sys.modules, "verl_events.apps.served_canary", raising=False)
    moved = "verl_events.apps.served_canary moved to verl_events.observers.weight_sync.served"
    with pytest.warns(DeprecationWarning, match=moved):
        old = importlib.import_module("verl_events.apps.served_canary")
    assert (old.vllm_canary, old.sglang_canary, old.SAMPLING) == (served.vllm_canary, served.sglang_canary, SAMPLING)
