"""Per-tensor fingerprints: 64 bits that change whenever a tensor's bytes do.

A fingerprint is computed where the tensor lives (no copy to the host): its
bytes are read as 64-bit words, each word is mixed with its position
(xor with a position key, an odd multiply, an xor-shift: a one-to-one map
for each position) and the mixed words are summed modulo 2**64.  The
trailing bytes of a tensor whose size is not a multiple of 8, and the
tensor's size in bytes, are folded in the same way.

What it promises: equal bytes (same length) give equal fingerprints, on any
device; changing any one 8-byte word always changes the fingerprint, since
only that word's term changes and the mix is one-to-one.  What can collide:
several changed words whose changes cancel modulo 2**64 — about one chance
in 2**64 for unrelated changes, but easy to build on purpose: it is not a
cryptographic hash.  A tensor and the same values in another dtype have
different bytes, hence different fingerprints (fp32 -> bf16 -> fp32 is not
the identity either).

Cost: six torch operations over the tensor's 64-bit words, each reading one
or two words and writing one (about 15 bytes moved per byte fingerprinted),
in chunks of 8 MB; on a GPU they run on the device (benchmarks/weight_sync.py).
"""

from __future__ import annotations

import threading
from typing import Any

import torch

__all__ = ["dtype_name", "fingerprint", "nonfinite_count"]

_CHUNK = 1 << 20  # words per pass: the position keys of one chunk stay cached per device
_POSITION = -7046029254386353131  # 0x9E3779B97F4A7C15 as a signed 64-bit integer
_MIX = -4658895280553007687  # 0xBF58476D1CE4E5B9
_MASK = (1 << 64) - 1
_LENGTH_POSITION = 1 << 62  # a position no tensor reaches: the byte count's own

_keys: dict[torch.device, torch.Tensor] = {}
_keys_lock = threading.Lock()


def _position_keys(device: torch.device) -> torch.Tensor:
    with _keys_lock:
        keys = _keys.get(device)
        if keys is None:
            keys = torch.arange(_CHUNK, dtype=torch.int64, device=device) * _POSITION
            _keys[device] = keys
        return keys


def fingerprint(tensor: Any) -> str:
    """The tensor's fingerprint as 16 hex digits (see the module docstring)."""
    data = tensor.detach()
    if not data.is_contiguous():
        data = data.contiguous()
    raw = data.reshape(-1).view(torch.uint8)
    whole = raw.numel() // 8 * 8
    total = _mix_word(raw.numel(), _LENGTH_POSITION)  # so that zeros of two lengths differ
    if whole:
        words = raw[:whole].view(torch.int64)
        keys = _position_keys(words.device)
        sums = []
        for start in range(0, words.numel(), _CHUNK):
            chunk = words[start : start + _CHUNK]
            mixed = (chunk ^ (keys[: chunk.numel()] + _signed(start * _POSITION))) * _MIX
            mixed ^= torch.bitwise_right_shift(mixed, 31)
            sums.append(mixed.sum())
        # One transfer to the host per tensor, not one per chunk.
        total = int(torch.stack(sums).sum())
    if whole < raw.numel():
        tail = int.from_bytes(bytes(raw[whole:].tolist()), "little")
        total += _mix_word(tail, whole // 8)
    return f"{total & _MASK:016x}"


def _signed(value: int) -> int:
    """``value`` modulo 2**64, as a signed 64-bit integer (what torch's int64 holds)."""
    value &= _MASK
    return value - (1 << 64) if value >> 63 else value


def _mix_word(word: int, position: int) -> int:
    """The mix of one word, in Python, as the tensor code does it (for the trailing bytes)."""
    mixed = _signed((_signed(word) ^ _signed(position * _POSITION)) * _MIX)
    return (mixed ^ (mixed >> 31)) & _MASK


def nonfinite_count(tensor: Any) -> int:
    """How many values are NaN or infinite (0 for integer and boolean tensors).

    A tensor's sum is finite when all its values are (a weight's sum does not overflow):
    one read of the tensor, where counting with ``isfinite`` costs some 40 on a CPU.
    Only a tensor whose sum is not finite is counted."""
    if not (tensor.is_floating_point() or tensor.is_complex()):
        return 0
    data = tensor.detach()
    if bool(torch.isfinite(data.sum()).all()):
        return 0
    return int(data.numel() - torch.isfinite(data).sum())


def dtype_name(dtype: Any) -> str | None:
    """A dtype by meaning: ``float32`` for ``torch.float32``, ``"torch.float32"``, ``"float32"``
    and ``"float"`` alike (``bfloat16``, ``float16`` for ``"half"``, ...); None for anything that
    names no torch dtype.  A manifest and a receipt compare dtypes in this spelling, so bytes are
    compared whenever both sides hold the same dtype, however the engine spells it."""
    if not isinstance(dtype, torch.dtype):
        name = str(dtype).strip().removeprefix("torch.")
        dtype = getattr(torch, name, None) if name.isidentifier() else None
        if not isinstance(dtype, torch.dtype):
            return None
    return str(dtype).removeprefix("torch.")
