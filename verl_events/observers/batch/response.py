"""Which tokens of a stage's tensors are the response tokens, whatever layout carried them.

Shared by the tensor statistics (:mod:`.tensors`) and the mismatch
observer, so both read verl's layouts alike: padded ``[batch, response]``
tensors with ``response_mask`` (or the last columns of ``attention_mask``),
and verl 0.9's no-padding layout, where a model output is nested (one row per
sequence, prompt and response together, shifted by one) and its response
part is picked out as ``verl.workers.utils.padding.no_padding_2_padding``
does.  Verified against verl 0.9.1 (``verl/workers/utils/padding.py``).

Cost: a jagged nested tensor is a Python subclass, so every one of its
attributes and operations is a ``__torch_function__`` round trip (10-90 us
each on a warm CPU core, ten times that just after a model's forward, against
1-3 us for a plain tensor's).  A :class:`ResponseView` therefore reads each
nested tensor's values and offsets once (:func:`nested_parts`) and works on
plain tensors from there.  The gather of the response tokens is planned
once for the nested tensors that share their offsets (the log-probs and the
entropy), and the response part it picks is kept (:data:`_PICKED`, a few
entries) for the next view of the same stage end: the sentinel and the
mismatch observer both align the actor's ``old_log_probs`` and ``entropy``
at ``actor_compute_log_prob``, and the second one finds the first one's.
An entry is reused only while every tensor it was computed from is the same
object at the same version (``_version``, which an in-place write bumps); it
goes when one of them does.  What a view returns may be shared with another
observer: read it, never write to it.

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

__all__ = [
    "ResponseView",
    "Source",
    "as_on",
    "as_padded",
    "computes_reference",
    "first_tensor",
    "nested_parts",
]


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


Picked = tuple["torch.Tensor", "torch.Tensor"]  # a nested tensor's response part, and where its tokens are
Plan = tuple["torch.Tensor", "torch.Tensor"]
Nested = tuple[
    "torch.Tensor", "torch.Tensor", "torch.Tensor"
]  # values detached, offsets, values as kept  # where each response token sits in the values, and where they are


class ResponseView:
    """The response tokens of one stage's tensors, whichever layout carried them.

    Everything it returns is detached from autograd.
    """

    __slots__ = ("_flat", "_lengths", "_masks", "_plans", "batches", "response_mask")

    def __init__(self, out: Source, inputs: Source | None) -> None:
        self.batches = (inputs, out)
        mask = first_tensor("response_mask", inputs, out)
        if mask is not None and mask.is_nested:  # verl's v1 trainer: a row per response (TransferQueue)
            mask = as_padded(mask).bool()  # the padding is zeros: no response token
        self.response_mask = mask if mask is not None and mask.dim() == 2 else None
        self._lengths: Any = False  # the tensors the response lengths come from, or None; False: not looked up yet
        self._masks: dict[tuple[Any, ...], torch.Tensor | None] = {}
        # id(tensor) -> (tensor, its elements detached, its nested parts or None)
        self._flat: dict[int, tuple[torch.Tensor, torch.Tensor, Nested | None]] = {}
        self._plans: list[tuple[torch.Tensor, int, Any, Plan | None]] = []  # (offsets, size, device, plan)

    def elements(self, tensor: torch.Tensor) -> torch.Tensor:
        """Every element of ``tensor`` (a nested tensor's values), detached."""
        return self._looked_up(tensor)[1]

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
            return as_on(mask, padded.device, torch.bool)
        attention = first_tensor("attention_mask", *self.batches)
        if (
            attention is not None
            and not attention.is_nested
            and padded.dim() == 2
            and attention.dim() == 2
            and attention.shape[0] == padded.shape[0]
            and attention.shape[1] >= padded.shape[1]
        ):
            return as_on(attention[:, attention.shape[1] - padded.shape[1] :], padded.device, torch.bool)
        return None

    def aligned(self, tensor: torch.Tensor, like: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None] | None:
        """``tensor`` as ``like``'s padded ``[batch, response]`` and, for a nested one, which
        of its places hold a response token (None: all of them); None when it cannot be."""
        positions: torch.Tensor | None = None
        if self._nested(tensor) is not None:
            picked = self.response_of_nested(tensor)
            if picked is None or picked[0].shape[1] < like.shape[1]:
                return None
            tensor, positions = picked[0][:, : like.shape[1]], picked[1][:, : like.shape[1]]
        else:
            tensor = self.elements(tensor)
        if tuple(tensor.shape) != tuple(like.shape):
            return None
        return tensor, positions

    def of(self, tensor: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The tokens of ``tensor`` to reduce and their mask (None: all)."""
        if self._nested(tensor) is None:
            plain = self.elements(tensor)
            return plain, self.mask_for(plain)
        picked = self.response_of_nested(tensor)
        return picked if picked is not None else (self.elements(tensor), None)

    def response_of_nested(self, tensor: torch.Tensor) -> Picked | None:
        """A nested (no-padding) tensor's response part, padded ``[batch, response]``,
        and which of its positions are response tokens; None when the lengths are unknown."""
        parts = self._nested(tensor)
        if parts is None:
            return None
        if self._lengths is False:
            self._lengths = _length_sources(*self.batches)
        if self._lengths is None:
            return None
        values, offsets, kept = parts
        sources, mask = self._lengths, self.response_mask

        def pick() -> Picked | None:
            plan = self._plan(values, offsets, sources)
            return None if plan is None else (values[plan[0]], plan[1])

        # Found already when another observer's view of this stage end picked it.
        return _PICKED.get((kept, offsets, *sources, mask), pick)

    def _plan(self, values: torch.Tensor, offsets: torch.Tensor, sources: tuple[torch.Tensor, ...]) -> Plan | None:
        """Where each response token sits in ``values``, and which places are response tokens:
        made once for the nested tensors of this view that share their offsets (verl's log-probs
        and entropy do, each with its own copy)."""
        import torch

        size, device = values.shape[0], values.device
        for known, known_size, known_device, plan in self._plans:
            if known_size == size and known_device == device and known.device == offsets.device:
                if known is offsets or (known.shape == offsets.shape and torch.equal(known, offsets)):
                    return plan
        plan = _plan(size, device, offsets, _lengths(sources), self.response_mask)
        self._plans.append((offsets, size, device, plan))
        return plan

    def _nested(self, tensor: torch.Tensor) -> Nested | None:
        """A nested tensor's values (detached: a tensor that requires grad has them with
        history), its offsets, and the values as it keeps them (the same object each time,
        which the picked parts are kept by); None for a plain one. Looked up once per tensor."""
        return self._looked_up(tensor)[2]

    def _looked_up(self, tensor: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, Nested | None]:
        """(tensor, its elements detached, its nested parts or None), made once per tensor."""
        found = self._flat.get(id(tensor))
        if found is None:
            parts = nested_parts(tensor)
            if parts is None:
                found = (tensor, tensor.detach(), None)
            else:
                values = parts[0].detach()
                found = (tensor, values, (values, parts[1], parts[0]))
            self._flat[id(tensor)] = found  # the tensor kept: its id stays its own
        return found


#: torch's jagged NestedTensor class; None: this torch has none; False: not looked up yet.
_JAGGED: Any = False


def nested_parts(tensor: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor] | None:
    """A nested ``[batch, jagged]`` tensor's values and offsets, None for a plain tensor.

    A jagged NestedTensor (verl 0.9's no-padding model outputs) is a Python subclass that
    answers every attribute and method through ``__torch_function__``: 10-90 us each on a
    warm CPU core, and about ten times that just after a model's forward has pushed torch's
    Python code out of the caches.  Its values and offsets are the attributes it keeps them
    in (``_values``, ``_offsets``, torch 2.1 to 2.13 at least, read as plain attributes);
    any other nested tensor, or a torch without them, goes through the public
    ``is_nested``, ``values()`` and ``offsets()``.
    """
    import torch

    kind = type(tensor)
    if kind is torch.Tensor and not tensor.is_nested:
        return None
    jagged = _jagged_class()
    if jagged is not None and kind is jagged and getattr(tensor, "_ragged_idx", None) == 1:
        values, offsets = getattr(tensor, "_values", None), getattr(tensor, "_offsets", None)
        if getattr(tensor, "_lengths", True) is None and isinstance(values, torch.Tensor) and values.dim() == 1:
            if isinstance(offsets, torch.Tensor):
                return values, offsets
    if not tensor.is_nested:
        return None
    return tensor.values(), tensor.offsets()  # type: ignore[attr-defined]  # a jagged NestedTensor's


def as_padded(tensor: torch.Tensor) -> torch.Tensor:
    """``tensor`` itself, or for a nested ``[batch, jagged]`` one a padded ``[batch, longest
    row]`` copy, detached, with zeros past each row's end.  verl's v1 trainer hands response
    tensors so (``rollout_log_probs``, ``response_mask``, ``responses``: one row per response,
    TransferQueue's layout), where its v0 trainer pads them on the right, as this does."""
    import torch

    parts = nested_parts(tensor)
    if parts is None:
        return tensor
    values, offsets = parts[0].detach(), parts[1]
    lengths = as_on(offsets.diff(), values.device, torch.long)
    width = int(lengths.max()) if lengths.numel() else 0
    if values.shape[0] == 0:
        return values.new_zeros((lengths.shape[0], width))
    index, valid = _rows(as_on(offsets[:-1], values.device, torch.long), lengths, width, values.shape[0])
    return torch.where(valid, values[index], values.new_zeros(()))


def _jagged_class() -> Any:
    global _JAGGED
    if _JAGGED is False:
        try:
            from torch.nested._internal.nested_tensor import NestedTensor
        except ImportError:
            _JAGGED = None
        else:
            _JAGGED = NestedTensor
    return _JAGGED


def _plan(
    size: int, device: torch.device, offsets: torch.Tensor, lengths: torch.Tensor, mask: torch.Tensor | None
) -> Plan | None:
    """For values of ``size`` elements on ``device``: the index of each response token, padded
    ``[batch, response]``, and which places hold one; None when the lengths do not fit."""
    import torch

    if lengths.shape[0] != offsets.shape[0] - 1 or lengths.shape[0] == 0:
        return None
    lengths = as_on(lengths, device, torch.long)
    width = int(mask.shape[1]) if mask is not None and mask.shape[0] == lengths.shape[0] else int(lengths.max())
    # As no_padding_2_padding: the output for response token j of a sequence
    # ending at offset e sits at e - length - 1 + j (a model predicts the next token).
    index, valid = _rows(as_on(offsets[1:], device, torch.long) - lengths - 1, lengths, width, size)
    if mask is not None and tuple(mask.shape) == tuple(valid.shape):
        valid = valid & as_on(mask, device, torch.bool)
    return index, valid


def _rows(starts: torch.Tensor, lengths: torch.Tensor, width: int, size: int) -> Plan:
    """Rows of ``lengths`` elements beginning at ``starts`` in values of ``size`` elements,
    as ``[batch, width]``: each place's index in the values (0 where a row has ended, so
    every index is one), and which places are in a row."""
    import torch

    columns = torch.arange(width, device=starts.device)
    valid = columns[None, :] < lengths[:, None]
    index = torch.where(valid, starts[:, None] + columns[None, :], 0).clamp(0, size - 1)
    return index, valid


def as_on(tensor: torch.Tensor, device: torch.device, dtype: torch.dtype | None = None) -> torch.Tensor:
    """``tensor`` on ``device`` (and of ``dtype``): itself when it already is, without a call
    into torch (which costs more than the copy on a small tensor)."""
    if tensor.device == device and (dtype is None or tensor.dtype == dtype):
        return tensor
    return tensor.to(device=device, dtype=dtype)


def _length_sources(*batches: Source | None) -> tuple[torch.Tensor, ...] | None:
    """What each sequence's response length is read from, as no_padding_2_padding reads it:
    the offsets of nested ``responses``, else padded ``prompts`` and ``attention_mask``."""
    responses = first_tensor("responses", *batches)
    parts = None if responses is None else nested_parts(responses)
    if parts is not None:
        return (parts[1],)
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
