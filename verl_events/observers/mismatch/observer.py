"""The mismatch observer: how far the trainer's log-probs are from the rollout engine's.

Config::

    - name: mismatch
      top_k: 8                 # the worst tokens kept per step and rank
      prefill_steps: [2]       # optional: run these steps' sequences through the rollout engine
      prefill_replays: false   # true: also each replayed step (the one the sentinel raised an anomaly at)
      prefill_engine: my_pkg.engine:prefill  # what prefills: needed by prefill_steps and prefill_replays

At the end of every ``actor_compute_log_prob`` it selects, it compares the
trainer's recomputed log-probs with the ``rollout_log_probs`` the batch
carries (:mod:`.tokens`) and appends one line per rank to
``mismatch.jsonl`` (:mod:`.record`), with the weight versions of both
sides where verl tagged the batch (:mod:`.versions`: in its asynchronous
modes the rollout may have sampled with older weights).  A batch without
``rollout_log_probs`` gets a line saying so, which ``verl-events mismatch`` turns into the
setting that fills them.  A call that computed the reference's log-probs
(verl 0.9's LoRA reference, ``calculate_entropy=False``) is passed over.

``prefill_steps``: at those steps it also hands the step's sequences (prompt
and response tokens, as sampled, padding dropped) to ``prefill_engine``, a
function ``(sequences, step, rank) -> None`` that runs them through the
rollout engine's model, one forward per sequence in the batch's order,
inside a ``rollout_prefill`` stage for ``rank``.  There is no default: the
observer cannot know the engine, and refuses ``prefill_steps`` or
``prefill_replays`` without one (verl_events' CPU job names its rollout
server's).  An msprobe observer that
selects ``rollout_prefill`` (in the engine's process) and
``actor_compute_log_prob`` (in the trainer's) at those steps then dumps both
sides, and ``verl-events mismatch RUN --layers STEP`` compares them layer by
layer.  The engine's weights are still the step's: they change only at the
next step's weight sync.

``prefill_replays``: when the sentinel raises an anomaly at
``actor_compute_log_prob`` (its ``gap/log_prob_abs_max`` rule, say) and an
armed capture observer makes that stage run again (a replay, see
docs/sentinel.md), the observer hands that step's sequences to the engine
too.  An msprobe observer armed by the anomaly dumps the trainer's replay,
and a second one that selects ``rollout_prefill`` (no trigger: the engine's
process never sees the anomaly) dumps the engine's side: the step that went
wrong, profiled without a re-run.  A replay writes no line: it is the same
step again.

Passive: a stage it watches still counts as unprofiled.  Thread safety: no
shared state but the file, appended to with one ``write`` per line.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from verl_events import ConfigError, InstallContext, Observer, StageEnd, Writes, prepare_output_dir, stage_header
from verl_events.config import check_count, import_target, is_import_path, parse_numbers
from verl_events.layout import run_id

from .._lines import append_line
from ..batch import as_batch
from .record import TRAINER_STAGE, MismatchRecord, mismatch_files, mismatch_log_path
from .tokens import StepTokens, measure, step_tokens
from .versions import weight_versions

__all__ = ["STAGE", "MismatchObserver"]

logger = logging.getLogger("verl_events.mismatch")

#: The stage where verl's trainer recomputes the log-probs of what the rollout sampled.
STAGE = TRAINER_STAGE
_MAX_TOP_K = 1000
_ENGINE_EXAMPLE = "my_pkg.engine:prefill"

Prefill = Callable[[list[list[int]], int, int], None]


class MismatchObserver(Observer):
    """Token-level training-inference mismatch at every selected
    ``actor_compute_log_prob``; optionally an engine prefill for the layer
    profile (see the module docstring)."""

    passive = True
    wants_result = True
    sees_replays = True  # to hand a replayed step to the engine (prefill_replays)
    writes = Writes("mismatch record file(s)", mismatch_files, "mismatch", "verl_events.apps.mismatch.command")

    def __init__(
        self,
        top_k: int = 8,
        prefill_steps: Sequence[int | str] | None = None,
        prefill_engine: str | None = None,
        prefill_replays: bool = False,
    ) -> None:
        self.top_k = check_count(top_k, "option top_k", allowed=f"an integer from 0 to {_MAX_TOP_K}", minimum=0)
        if self.top_k > _MAX_TOP_K:
            raise ConfigError(f"option top_k: {top_k!r} is not allowed; use an integer from 0 to {_MAX_TOP_K}")
        self.prefill_steps = parse_numbers(prefill_steps, "option prefill_steps") if prefill_steps is not None else None
        if prefill_engine is not None and not is_import_path(prefill_engine):
            raise ConfigError(
                f"option prefill_engine: {prefill_engine!r} is not allowed; use an import path like {_ENGINE_EXAMPLE!r}"
            )
        if not isinstance(prefill_replays, bool):
            raise ConfigError(f"option prefill_replays: {prefill_replays!r} is not allowed; use true or false")
        if prefill_engine is None and (self.prefill_steps or prefill_replays):
            asked = "prefill_steps" if self.prefill_steps else "prefill_replays"
            raise ConfigError(
                f"option {asked}: the engine prefill needs option prefill_engine, the import path of a function "
                f"(sequences, step, rank) -> None that runs the sequences through the rollout engine's model, "
                f"like {_ENGINE_EXAMPLE!r}; there is no default (docs/mismatch.md, 'The layer level', names the "
                "engines that can)"
            )
        self.prefill_engine = prefill_engine
        self.prefill_replays = prefill_replays
        self._prefill: Prefill | None = None
        self._root = Path()
        self._run_id: Callable[[], str] = run_id  # until setup hands over the installation's

    def setup(self, context: InstallContext) -> None:
        self._root, self._run_id = Path(context.save_path), context.run_id
        prepare_output_dir(self._root)

    def describe(self) -> str:
        said = f"|Δ log p| of the rollout's tokens at {STAGE}, the {self.top_k} worst kept"
        if self.prefill_steps:
            steps = ", ".join(map(str, sorted(self.prefill_steps)))
            said += f"; engine prefill at step(s) {steps}"
        if self.prefill_replays:
            said += "; engine prefill of each replayed step"
        if self.prefill_steps or self.prefill_replays:
            said += f" through {self.prefill_engine}"
        return said

    def on_stage_end(self, event: StageEnd) -> None:
        if event.stage != STAGE or event.error is not None or event.result is None:
            return
        if event.replay:
            if self.prefill_replays:
                self._ask_engine(event)
            return
        found = step_tokens(event.result, event.inputs)
        if found is None:  # the reference's log-probs, computed by the actor (LoRA)
            return
        weights = weight_versions(event.inputs, event.step)
        if isinstance(found, StepTokens):
            record = self._record(event, stats=measure(found, self.top_k), weights=weights)
        else:
            record = self._record(event, missing=found, weights=weights)
        append_line(mismatch_log_path(self._root), record.to_json())
        if self.prefill_steps and event.step in self.prefill_steps:
            self._ask_engine(event)

    def _record(self, event: StageEnd, **found: Any) -> MismatchRecord:
        return MismatchRecord(**stage_header(event, self._run_id), **found)

    def _ask_engine(self, event: StageEnd) -> None:
        assert event.step is not None
        if self._prefill is None:
            assert self.prefill_engine is not None  # refused at construction otherwise
            # Imported at first use, not at setup: the engine's module may be the one whose
            # import of verl installed the observers (verl_cpu's shim imports hf_rollout).
            self._prefill = import_target(self.prefill_engine, "option prefill_engine")
        sequences = sampled_sequences(event.inputs)
        if not sequences:
            logger.warning(
                "mismatch: step %s: nothing to prefill: the batch has neither padded prompts, responses and "
                "attention_mask nor jagged prompts and responses (as verl's trainers hand them) to rebuild "
                "the sequences from",
                event.step,
            )
            return
        started = time.perf_counter()
        self._prefill(sequences, event.step, event.rank)
        logger.info(
            "mismatch: step %s rank %d: %d sequence(s) prefilled by the engine in %.2f s",
            event.step,
            event.rank,
            len(sequences),
            time.perf_counter() - started,
        )


def sampled_sequences(inputs: Any) -> list[list[int]]:
    """Each row's prompt and response tokens, padding dropped: ``prompts`` and
    ``responses`` side by side, kept where ``attention_mask`` is 1. verl's v1 trainer hands
    them jagged, a row per sample with no padding: there each row is the two rows joined."""
    batch = as_batch(inputs) if inputs is not None else None
    if batch is None:
        return []
    prompts, responses, attention = (batch.tensor(key) for key in ("prompts", "responses", "attention_mask"))
    if prompts is None or responses is None:
        return []
    import torch

    if prompts.is_nested and responses.is_nested:
        pairs = zip(prompts.unbind(), responses.unbind(), strict=True)
        return [torch.cat([prompt, response]).tolist() for prompt, response in pairs]
    if attention is None or any(t.is_nested for t in (prompts, responses, attention)):
        return []
    tokens = torch.cat([prompts, responses], dim=1)
    if tuple(tokens.shape) != tuple(attention.shape):
        return []
    keep = attention.bool()
    return [row[mask].tolist() for row, mask in zip(tokens.cpu(), keep.cpu(), strict=True)]
