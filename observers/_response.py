"""Which tokens of a stage's tensors are the response tokens, whatever layout carried them.

Shared by the sentinel's metrics (:mod:`._metric_tensors`) and the mismatch
observer, so both read verl's layouts alike: padded ``[batch, response]``
tensors with ``response_mask`` (or the last columns of ``attention_mask``),
and verl 0.9's no-padding layout, where a model output is nested (one row per
sequence, prompt and response together, shifted by one) and its response
part is picked out as ``verl.workers.utils.padding.no_padding_2_padding``
does.  Verified against verl 0.9.1 (``verl/workers/utils/padding.py``).

Thread safety: no shared state.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    import torch

__all__ = ["ResponseView", "Source", "computes_reference", "first_tensor"]


class Source(Protocol):
    """A stage's result or inputs as :mod:`.metrics` sees them (its ``_Batch``)."""

    def tensor(self, key: str) -> torch.Tensor | None: ...

    def flag(self, key: str) -> Any: ...


def computes_reference(inputs: Source | None) -> bool:
    """Whether an ``actor_compute_log_prob`` call computed the reference's log-probs: verl 0.9
    with the reference inside the LoRA actor runs it with ``calculate_entropy=False``."""
    return inputs is not None and inputs.flag("calculate_entropy") is False


def first_tensor(key: str, *batches: Source | None) -> torch.Tensor | None:
    for batch in batches:
        if batch is not None:
            tensor = batch.tensor(key)
            if tensor is not None:
                return tensor
    return None


class ResponseView:
    """The response tokens of one stage's tensors, whichever layout carried them."""

    def __init__(self, out: Source, inputs: Source | None) -> None:
        self.batches = (inputs, out)
        mask = first_tensor("response_mask", inputs, out)
        self.response_mask = mask if mask is not None and not mask.is_nested and mask.dim() == 2 else None
        self._lengths: Any = False  # not looked up yet

    def mask_for(self, padded: torch.Tensor) -> torch.Tensor | None:
        """The response tokens of a padded ``[batch, response]`` tensor: ``response_mask``
        of its shape, else the last columns of ``attention_mask``, else None (all)."""
        import torch

        mask = self.response_mask
        if mask is not None and tuple(mask.shape) == tuple(padded.shape):
            return mask.to(device=padded.device, dtype=torch.bool)
        attention = first_tensor("attention_mask", *self.batches)
        if (
            attention is not None
            and not attention.is_nested
            and padded.dim() == 2
            and attention.dim() == 2
            and attention.shape[0] == padded.shape[0]
            and attention.shape[1] >= padded.shape[1]
        ):
            return attention[:, attention.shape[1] - padded.shape[1] :].to(device=padded.device, dtype=torch.bool)
        return None

    def aligned(self, tensor: torch.Tensor, like: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None] | None:
        """``tensor`` as ``like``'s padded ``[batch, response]`` and, for a nested one, which
        of its places hold a response token (None: all of them); None when it cannot be."""
        positions: torch.Tensor | None = None
        if tensor.is_nested:
            picked = self.response_of_nested(tensor)
            if picked is None or picked[0].shape[1] < like.shape[1]:
                return None
            tensor, positions = picked[0][:, : like.shape[1]], picked[1][:, : like.shape[1]]
        if tuple(tensor.shape) != tuple(like.shape):
            return None
        return tensor, positions

    def of(self, tensor: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The tokens of ``tensor`` to reduce and their mask (None: all)."""
        if not tensor.is_nested:
            return tensor, self.mask_for(tensor)
        picked = self.response_of_nested(tensor)
        return picked if picked is not None else (tensor.values(), None)

    def response_of_nested(self, tensor: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor] | None:
        """A nested (no-padding) tensor's response part, padded ``[batch, response]``,
        and which of its positions are response tokens; None when the lengths are unknown."""
        import torch

        if self._lengths is False:
            self._lengths = _response_lengths(*self.batches)
        lengths: torch.Tensor | None = self._lengths
        offsets: torch.Tensor = tensor.offsets()  # type: ignore[attr-defined]  # a jagged NestedTensor's
        if lengths is None or lengths.shape[0] != offsets.shape[0] - 1 or lengths.shape[0] == 0:
            return None
        values = tensor.values()
        lengths = lengths.to(device=values.device, dtype=torch.long)
        mask = self.response_mask
        width = int(mask.shape[1]) if mask is not None and mask.shape[0] == lengths.shape[0] else int(lengths.max())
        columns = torch.arange(width, device=values.device)
        valid = columns[None, :] < lengths[:, None]
        # As no_padding_2_padding: the output for response token j of a sequence
        # ending at offset e sits at e - length - 1 + j (a model predicts the next token).
        index = (
            offsets[1:].to(device=values.device, dtype=torch.long)[:, None] - lengths[:, None] - 1 + columns[None, :]
        )
        index = torch.where(valid, index, 0).clamp(0, values.shape[0] - 1)
        if mask is not None and tuple(mask.shape) == tuple(valid.shape):
            valid = valid & mask.to(device=values.device, dtype=torch.bool)
        return values[index], valid


def _response_lengths(*batches: Source | None) -> torch.Tensor | None:
    """Each sequence's response length, as no_padding_2_padding finds it."""
    responses = first_tensor("responses", *batches)
    if responses is not None and responses.is_nested:
        offsets: torch.Tensor = responses.offsets()  # type: ignore[attr-defined]  # a jagged NestedTensor's
        return offsets.diff()
    prompts = first_tensor("prompts", *batches)
    attention = first_tensor("attention_mask", *batches)
    if prompts is None or attention is None or prompts.is_nested or attention.is_nested or attention.dim() != 2:
        return None
    return attention[:, prompts.shape[1] :].sum(dim=1)
