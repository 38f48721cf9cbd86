"""Which of verl's trainers the CPU job runs, as Hydra overrides, and how overrides combine.

verl's default trainer is v1 (``trainer.use_v1=True``, with TransferQueue), in one of the
modes of :data:`MODES`; each needs a little on CPU, said here next to the mode.
"""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["MODES", "merge_overrides", "v1_args"]

#: verl's v1 trainer modes (``trainer.v1.trainer_mode``), each of which the CPU job runs.
MODES = ("sync", "colocate_async", "separate_async")


def v1_args(mode: str) -> list[str]:
    """verl's default trainer in ``mode``, said out loud, with what each mode needs on CPU."""
    if mode not in MODES:
        raise ValueError(f"trainer_args: mode {mode!r} is not one of verl's v1 trainer modes ({', '.join(MODES)})")
    args = [
        "trainer.use_v1=True",
        f"trainer.v1.trainer_mode={mode}",
        # TransferQueue starts num_data_storage_units storage units (8 by default), each asking
        # Ray for a CPU: with the job's 8 CPUs the eighth never starts and tq.init waits forever,
        # printing nothing. One unit holds this job.
        "transfer_queue.backend.SimpleStorage.num_data_storage_units=1",
    ]
    if mode == "sync":
        # Batches in draw order, not finishing order, so that two runs compute the same numbers.
        sampler = "trainer.v1.sampler.custom_sampler"
        args += [f"{sampler}.path=pkg://verl_events.apps.verl_cpu.sampler", f"{sampler}.name=DrawOrderReplayBuffer"]
    if mode == "separate_async":
        from .checkpoint_engine import SEPARATE_ASYNC  # imports Ray and verl: only when asked

        args = merge_overrides(args, SEPARATE_ASYNC)
    return args


def _override_key(override: str) -> str:
    return override.split("=", 1)[0].lstrip("+~")


def merge_overrides(defaults: Sequence[str], extra: Sequence[str]) -> list[str]:
    """``defaults`` without the keys ``extra`` sets, then ``extra``.

    The caller's overrides replace the job's: Hydra would apply both in order, and refuses
    a "+key=" append for a key an earlier "+key=" already added.
    """
    replaced = {_override_key(o) for o in extra}
    return [o for o in defaults if _override_key(o) not in replaced] + list(extra)
