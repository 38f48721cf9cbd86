"""What the weight_sync observer costs a sync: fingerprints, the manifest, the canary.

    python benchmarks/weight_sync.py [--repeats 5] [--params 500]

Prints, on this machine's CPU (torch's own threads):

1. the fingerprint's throughput (GB/s) on float32 and bfloat16 tensors of 4 MB to 256 MB;
2. a whole sync's manifest: a decoder-shaped state dict of ``--params`` million float32
   parameters (Qwen2-like layer shapes) passed through the payload tap with the observer
   installed, against the same pass with nothing watching: seconds, and seconds per GB;
3. the canary's forward on a tiny Qwen2 (both sides of it run one such forward);
4. the estimate for a 7B model (7.6 G parameters, 15.2 GB in bfloat16, 30.5 GB in float32)
   from the throughput in 1, next to 1 % of a step of 60 s and of 300 s; and on a GPU, where
   the same torch operations run on the device, as an estimate (no GPU measured it): the bytes
   the manifest's operations move per byte of weights (:data:`TRAFFIC`, counted from the code)
   at the GPU's nominal memory bandwidth.

The share of a step on verl's CPU trainer is read from the ledger's ``seconds`` of a real
run (tests/test_verl_weight_sync.py) and docs/performance.md.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from collections.abc import Callable
from typing import Any

import torch

import verl_events
from verl_events import Payload, stage
from verl_events.bus.weights import passing
from verl_events.observers.weight_sync.canary import canary_ids, forward
from verl_events.observers.weight_sync.fingerprint import fingerprint

SEVEN_B = 7.6e9


def timed(call: Callable[[], Any], repeats: int) -> tuple[float, float]:
    """Median and fastest seconds of ``repeats`` calls, after one warm-up."""
    call()
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        call()
        times.append(time.perf_counter() - started)
    return statistics.median(times), min(times)


def fingerprint_throughput(repeats: int) -> float:
    """The manifest's throughput on 256 MB bfloat16 (GB/s)."""
    from verl_events.observers.weight_sync.fingerprint import nonfinite_count

    print("1. fingerprint throughput")
    best = 0.0
    for dtype in (torch.float32, torch.bfloat16):
        for megabytes in (4, 64, 256):
            tensor = torch.randn(megabytes * 2**20 // torch.finfo(dtype).bits * 8).to(dtype)
            median, fastest = timed(lambda t=tensor: fingerprint(t), repeats)
            rate = tensor.numel() * tensor.element_size() / median / 1e9
            best = max(best, rate) if megabytes == 256 else best
            print(f"   {str(dtype):15s} {megabytes:4d} MB: median {median * 1e3:7.1f} ms  {rate:5.2f} GB/s")
    # One tensor's whole manifest entry (fingerprint and NaN count) against one read of its bytes.
    words = tensor.view(torch.int64)
    one_read, _ = timed(lambda: words.sum(), repeats)
    entry, _ = timed(lambda: (fingerprint(tensor), nonfinite_count(tensor)), repeats)
    rate = tensor.numel() * tensor.element_size() / entry / 1e9
    reads = entry / one_read
    print(f"   a manifest entry, 256 MB bfloat16: {entry * 1e3:.1f} ms, {rate:.2f} GB/s, {reads:.0f} x one read")
    return rate


def decoder_state(params_m: int) -> dict[str, torch.Tensor]:
    """A state dict shaped like a Qwen2 decoder (hidden 1024, 4x MLP) of about ``params_m`` M parameters."""
    hidden, vocab = 1024, 32_000
    state = {"model.embed_tokens.weight": torch.randn(vocab, hidden)}
    per_layer = 4 * hidden * hidden + 3 * hidden * 4 * hidden
    for index in range(max(1, (params_m * 1_000_000 - 2 * vocab * hidden) // per_layer)):
        prefix = f"model.layers.{index}."
        for name in ("q_proj", "k_proj", "v_proj", "o_proj"):
            state[f"{prefix}self_attn.{name}.weight"] = torch.randn(hidden, hidden)
        for name, shape in (("gate_proj", (4 * hidden, hidden)), ("up_proj", (4 * hidden, hidden))):
            state[f"{prefix}mlp.{name}.weight"] = torch.randn(shape)
        state[f"{prefix}mlp.down_proj.weight"] = torch.randn(hidden, 4 * hidden)
        state[f"{prefix}input_layernorm.weight"] = torch.ones(hidden)
    state["lm_head.weight"] = torch.randn(vocab, hidden)
    return state


def manifest_cost(params_m: int, repeats: int) -> None:
    state = decoder_state(params_m)
    size = sum(t.numel() * t.element_size() for t in state.values())
    print(f"2. one sync's manifest: {len(state)} tensors, {size / 1e9:.2f} GB float32")

    def send(step: int = 1) -> None:
        with stage("update_weights", role="actor", step=step):
            for _ in passing(iter(state.items()), Payload(step=step, adapter=False)):
                pass

    bare, _ = timed(send, repeats)
    with tempfile.TemporaryDirectory() as folder:
        config = {"save_path": folder, "observers": [{"name": "weight_sync", "receipt_engine": None}]}
        installed = verl_events.install(config)
        try:
            watched, _ = timed(send, repeats)
        finally:
            installed.close()
    per_gb = (watched - bare) / (size / 1e9)
    print(f"   nothing watching: {bare * 1e3:.1f} ms; weight_sync: {watched:.3f} s ({per_gb:.3f} s per GB)")


def canary_cost(repeats: int) -> None:
    from transformers import Qwen2Config, Qwen2ForCausalLM

    config = Qwen2Config(
        vocab_size=32_000,
        hidden_size=512,
        intermediate_size=2048,
        num_hidden_layers=8,
        num_attention_heads=8,
        num_key_value_heads=4,
        tie_word_embeddings=False,
    )
    model = Qwen2ForCausalLM(config).eval()
    ids = canary_ids(config.vocab_size)
    median, fastest = timed(lambda: forward(model, ids), repeats)
    params = sum(p.numel() for p in model.parameters()) / 1e6
    shape = f"{len(ids)} x {len(ids[0])} tokens"
    print(f"3. canary forward, {shape}, Qwen2 of {params:.0f} M parameters: median {median * 1e3:.1f} ms")


#: Nominal memory bandwidth, TB/s (vendors' figures).
GPUS = {"A100 80GB": 2.0, "H100 SXM": 3.35, "H200": 4.8}
#: Bytes a manifest entry moves per byte of weights, counted from fingerprint.py: key + offset
#: (read 1, write 1), xor (2, 1), multiply (1, 1), shift (1, 1), xor (2, 1), sum (1); then the NaN
#: check's sum (1).  All 8-byte words.
TRAFFIC = 2 + 3 + 2 + 2 + 3 + 1 + 1


def estimate(rate: float) -> None:
    print(f"4. a 7B model's manifest at {rate:.2f} GB/s (this CPU, fingerprint and NaN count):")
    for label, nbytes in (("bfloat16", SEVEN_B * 2), ("float32", SEVEN_B * 4)):
        seconds = nbytes / 1e9 / rate
        print(
            f"   {label}: {nbytes / 1e9:.1f} GB, {seconds:.1f} s per rank and sync "
            f"= {seconds / 60:.1%} of a 60 s step, {seconds / 300:.1%} of a 300 s step"
        )
    print(f"   on a GPU, estimated: {TRAFFIC} bytes moved per byte, at nominal bandwidth:")
    for gpu, bandwidth in GPUS.items():
        for label, nbytes in (("bfloat16", SEVEN_B * 2), ("float32", SEVEN_B * 4)):
            seconds = TRAFFIC * nbytes / (bandwidth * 1e12)
            print(f"   {gpu:10s} {label}: {seconds:.3f} s = {seconds / 60:.2%} of a 60 s step")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--params", type=int, default=500, help="the manifest's model, million parameters")
    args = parser.parse_args()
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads")
    rate = fingerprint_throughput(args.repeats)
    manifest_cost(args.params, args.repeats)
    canary_cost(args.repeats)
    estimate(rate)


if __name__ == "__main__":
    main()
