"""What a verl stage was given and what it returned, read one way for every observer.

The sentinel (its metrics), the mismatch observer (the log-probs, token by
token) and the memory observer (the step's tokens) all read verl's batches;
this is the one place that knows their shapes:

* :mod:`.view`: :func:`as_batch`, a ``DataProto``, ``TensorDict``, record or
  mapping as one :class:`Batch` (tensors by key, metrics, call flags);
* :mod:`.metrics`: :func:`extract_metrics`, the scalars a stage reports,
  and :mod:`.tensors`, the statistics of the tensors it returns;
* :mod:`.response`: which tokens of a tensor are response tokens, in the
  padded and the no-padding layouts;
* :mod:`.tokens`: :func:`token_counts`, how many sequences and tokens a
  batch holds.

Nothing here keeps a tensor or raises into training; failures to read are
logged on ``verl_events.batch``.
"""

from .metrics import GAP_MAX, GAP_MEAN, STAGE_TENSORS, TENSOR_STATISTICS, extract_metrics
from .response import ResponseView, as_on, as_padded, computes_reference, first_tensor
from .tensors import keys_for
from .tokens import TokenCounts, token_counts
from .view import Batch, as_batch

__all__ = [
    "GAP_MAX",
    "GAP_MEAN",
    "STAGE_TENSORS",
    "TENSOR_STATISTICS",
    "Batch",
    "ResponseView",
    "TokenCounts",
    "as_batch",
    "as_on",
    "as_padded",
    "computes_reference",
    "extract_metrics",
    "first_tensor",
    "keys_for",
    "token_counts",
]
