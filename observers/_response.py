"""Which tokens of a stage's tensors are the response tokens, whatever layout carried them.

Shared by the sentinel's metrics (:mod:`._metric_tensors`) and the mismatch
observer, so both read verl's layouts alike: padded ``[batch, response]``
tensors with ``response_mask`` (or the last columns of ``attention_mask``),
and verl 0.9's no-padding layout, where a model output is nested (one row per
sequence, prompt and response together, shifted by one) and its response
part is picked out as ``verl.workers.utils.padding.no_padding_2_padding``
does.  Verified against verl 0.9.1 (``verl/workers/utils/padding.py``).

Cost: a nested tensor is a Python subclass, so every one of its attributes
and operations is a ``__torch_function__`` round trip (10-90 us each on a
CPU core, against 1-3 us for a plain tensor's).  A :class:`ResponseView`
therefore touches each nested tensor once (its ``values()`` and
``offsets()``) and works on plain tensors from there; and the response part
it picks is kept (:data:`_PICKED`, a few entries) for the next view of the
same stage end: the sentinel and the mismatch observer both align the
actor's ``old_log_probs`` at ``actor_compute_log_prob``, and the second one
finds the first one's.  An entry is reused only while every tensor it was
computed from is the same object at the same version (``_version``, which
an in-place write bumps); it goes when the nested tensor does.  What a view
returns may be shared with another observer: read it, never write to it.

Thread safety: the kept entries are guarded by a lock; a view is used by
one thread (it is made per call).
"""

from __future__ import annotations

import functools
import threading
import weakref
from collections.abc import Callable
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


Picked = tuple["torch.Tensor", "torch.Tensor"]


class ResponseView:
    """The response tokens of one stage's tensors, whichever layout carried them.

    Everything it returns is detached from autograd.
    """

    __slots__ = ("_flat", "_lengths", "_masks", "batches", "response_mask")

    def __init__(self, out: Source, inputs: Source | None) -> None:
        self.batches = (inputs, out)
        mask = first_tensor("response_mask", inputs, out)
        self.response_mask = mask if mask is not None and not mask.is_nested and mask.dim() == 2 else None
        self._lengths: Any = False  # the tensors the response lengths come from, or None; False: not looked up yet
        self._masks: dict[tuple[Any, ...], torch.Tensor | None] = {}
        # id(tensor) -> [tensor, its offsets (None: not nested), its values (None: not asked yet)]
        self._flat: dict[int, list[Any]] = {}

    def elements(self, tensor: torch.Tensor) -> torch.Tensor:
        """Every element of ``tensor`` (a nested tensor's values), detached."""
        return tensor.detach() if self._offsets(tensor) is None else self._values(tensor)

    def mask_for(self, padded: torch.Tensor) -> torch.Tensor | None:
        """The response tokens of a padded ``[batch, response]`` tensor: ``response_mask``
        of its shape, else the last columns of ``attention_mask``, else None (all)."""
        key = (tuple(padded.shape), padded.device)
        if key not in self._masks:
            self._masks[key] = self._mask_for(padded)
        return self._masks[key]

    def _mask_for(self, padded: torch.Tensor) -> torch.Tensor | None:
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
        if self._offsets(tensor) is not None:
            picked = self.response_of_nested(tensor)
            if picked is None or picked[0].shape[1] < like.shape[1]:
                return None
            tensor, positions = picked[0][:, : like.shape[1]], picked[1][:, : like.shape[1]]
        else:
            tensor = tensor.detach()
        if tuple(tensor.shape) != tuple(like.shape):
            return None
        return tensor, positions

    def of(self, tensor: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The tokens of ``tensor`` to reduce and their mask (None: all)."""
        if self._offsets(tensor) is None:
            plain = tensor.detach()
            return plain, self.mask_for(plain)
        picked = self.response_of_nested(tensor)
        return picked if picked is not None else (self._values(tensor), None)

    def response_of_nested(self, tensor: torch.Tensor) -> Picked | None:
        """A nested (no-padding) tensor's response part, padded ``[batch, response]``,
        and which of its positions are response tokens; None when the lengths are unknown."""
        offsets = self._offsets(tensor)
        if offsets is None:
            return None
        if self._lengths is False:
            self._lengths = _length_sources(*self.batches)
        if self._lengths is None:
            return None
        sources, mask = self._lengths, self.response_mask
        # Found already when another observer's view of this stage end picked it: values() not asked again.
        return _PICKED.get(
            (tensor, offsets, *sources, mask), lambda: _pick(self._values(tensor), offsets, _lengths(sources), mask)
        )

    def _offsets(self, tensor: torch.Tensor) -> torch.Tensor | None:
        """A nested tensor's offsets, None for a plain tensor; asked of the tensor once."""
        found = self._flat.get(id(tensor))
        if found is None:
            offsets = tensor.offsets() if tensor.is_nested else None  # type: ignore[attr-defined]  # jagged's
            found = self._flat[id(tensor)] = [tensor, offsets, None]  # the tensor kept: its id stays its own
        offsets_found: torch.Tensor | None = found[1]
        return offsets_found

    def _values(self, tensor: torch.Tensor) -> torch.Tensor:
        """A nested tensor's values, detached (those of a tensor that requires grad are a view with
        history); asked of the tensor once."""
        found = self._flat[id(tensor)]
        if found[2] is None:
            found[2] = tensor.values().detach()
        values: torch.Tensor = found[2]
        return values


def _pick(
    values: torch.Tensor, offsets: torch.Tensor, lengths: torch.Tensor, mask: torch.Tensor | None
) -> Picked | None:
    import torch

    if lengths.shape[0] != offsets.shape[0] - 1 or lengths.shape[0] == 0:
        return None
    lengths = lengths.to(device=values.device, dtype=torch.long)
    width = int(mask.shape[1]) if mask is not None and mask.shape[0] == lengths.shape[0] else int(lengths.max())
    columns = torch.arange(width, device=values.device)
    valid = columns[None, :] < lengths[:, None]
    # As no_padding_2_padding: the output for response token j of a sequence
    # ending at offset e sits at e - length - 1 + j (a model predicts the next token).
    index = offsets[1:].to(device=values.device, dtype=torch.long)[:, None] - lengths[:, None] - 1 + columns[None, :]
    index = torch.where(valid, index, 0).clamp(0, values.shape[0] - 1)
    if mask is not None and tuple(mask.shape) == tuple(valid.shape):
        valid = valid & mask.to(device=values.device, dtype=torch.bool)
    return values[index], valid


def _length_sources(*batches: Source | None) -> tuple[torch.Tensor, ...] | None:
    """What each sequence's response length is read from, as no_padding_2_padding reads it:
    the offsets of nested ``responses``, else padded ``prompts`` and ``attention_mask``."""
    responses = first_tensor("responses", *batches)
    if responses is not None and responses.is_nested:
        offsets: torch.Tensor = responses.offsets()  # type: ignore[attr-defined]  # a jagged NestedTensor's
        return (offsets,)
    prompts = first_tensor("prompts", *batches)
    attention = first_tensor("attention_mask", *batches)
    if prompts is None or attention is None or prompts.is_nested or attention.is_nested or attention.dim() != 2:
        return None
    return prompts, attention


def _lengths(sources: tuple[torch.Tensor, ...]) -> torch.Tensor:
    if len(sources) == 1:  # nested responses' offsets
        return sources[0].diff()
    prompts, attention = sources
    return attention[:, prompts.shape[1] :].sum(dim=1)


class _PickedKeeper:
    """The last few response parts picked, each kept while every tensor it came from lives
    unchanged (same object, same ``_version``); see the module docstring."""

    def __init__(self, size: int) -> None:
        self._size = size
        self._lock = threading.RLock()  # a weakref callback may run inside a locked section (GC)
        self._entries: dict[tuple[tuple[int, int], ...], tuple[list[weakref.ref[Any]], Picked | None]] = {}

    def get(self, sources: tuple[torch.Tensor | None, ...], compute: Callable[[], Picked | None]) -> Picked | None:
        present = [t for t in sources if t is not None]
        key = tuple((id(t), t._version) for t in present)
        with self._lock:
            entry = self._entries.get(key)
        # While its sources live, their ids are theirs: the same ids and versions are the same tensors, unchanged.
        if entry is not None and all(ref() is not None for ref in entry[0]):
            return entry[1]
        picked = compute()
        refs = [weakref.ref(t, functools.partial(self._drop, key)) for t in present]
        with self._lock:
            while len(self._entries) >= self._size:
                self._entries.pop(next(iter(self._entries)))
            self._entries[key] = (refs, picked)
        return picked

    def _drop(self, key: tuple[tuple[int, int], ...], _: weakref.ref[Any]) -> None:
        with self._lock:
            self._entries.pop(key, None)

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()


#: The response parts the views of recent stage ends picked (a stage end aligns at most two nested tensors).
_PICKED = _PickedKeeper(size=4)
