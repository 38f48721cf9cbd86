"""How much work a step's batch holds: sequences and tokens.

The memory observer's forecast relates a stage's peak to this
(:mod:`verl_events.observers.memory.forecast`).  Read, in order:

* ``meta_info["global_token_num"]`` of a ``DataProto`` (verl's trainer
  puts each sequence's token count there before it computes anything):
  no tensor is touched;
* a padded ``attention_mask`` ``[batch, prompt + response]``: its ones are
  the tokens, its size the padded tokens (one device-to-host copy);
* a nested ``input_ids`` (verl 0.9's no-padding layout): its values are the
  tokens; there is no padding.

``tokens`` counts prompt and response tokens actually present; verl's
remove-padding workers compute on these, so the forecast uses them.
``padded_tokens`` (batch × padded width) is what a padded worker computes
on; it is recorded for the reader, or None when the layout has none.

Thread safety: no shared state.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from .response import nested_parts
from .view import Batch, as_batch

__all__ = ["TokenCounts", "token_counts"]


@dataclass(frozen=True, slots=True)
class TokenCounts:
    """One batch's size (see the module docstring)."""

    sequences: int
    tokens: int
    padded_tokens: int | None

    def to_dict(self) -> dict[str, int | None]:
        return {"sequences": self.sequences, "tokens": self.tokens, "padded_tokens": self.padded_tokens}


def token_counts(value: Any) -> TokenCounts | None:
    """The sequences and tokens ``value`` (a stage's inputs or result) carries, or None
    when it is not a batch or carries neither token counts nor an attention mask."""
    batch = as_batch(value)
    if batch is None:
        return None
    counted = _from_meta(value)
    if counted is not None:
        return counted
    return _from_tensors(batch)


def _from_meta(value: Any) -> TokenCounts | None:
    info = getattr(value, "meta_info", None)
    counts = info.get("global_token_num") if isinstance(info, Mapping) else None
    if not isinstance(counts, list | tuple) or not counts:
        return None
    if not all(isinstance(n, int) and not isinstance(n, bool) and n >= 0 for n in counts):
        return None
    return TokenCounts(sequences=len(counts), tokens=sum(counts), padded_tokens=None)


def _from_tensors(batch: Batch) -> TokenCounts | None:
    attention = batch.tensor("attention_mask")
    if attention is not None and not attention.is_nested and attention.dim() == 2:
        return TokenCounts(
            sequences=int(attention.shape[0]),
            tokens=int(attention.sum()),
            padded_tokens=int(attention.numel()),
        )
    input_ids = batch.tensor("input_ids")
    parts = None if input_ids is None else nested_parts(input_ids)
    if parts is not None:
        values, offsets = parts
        return TokenCounts(sequences=int(offsets.numel()) - 1, tokens=int(values.numel()), padded_tokens=None)
    return None
