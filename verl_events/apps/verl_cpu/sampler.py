"""verl's v1 replay buffer, handing each batch's rows in the order their prompts were drawn.

verl 0.9.1's default trainer keeps trajectories in TransferQueue and builds a batch from them
in the order they *finished* (``ReplayBuffer._materialize_batch`` walks TransferQueue's key
listing, and the rollout puts each trajectory in as its generation and reward complete). So
two runs with the same seeds train on the same samples in a different order, their
mini-batches differ, and from step 2 their weights do (measured on the CPU job: the same
step-1 metrics, a different step-2 ``actor/grad_norm``). The CPU job's promise is that two
runs with the same overrides compute the same numbers (``verl-events compare`` of two runs
says MATCH), so it plugs this buffer in through verl's own
``trainer.v1.sampler.custom_sampler`` (:func:`verl_events.apps.verl_cpu.job.trainer_args`).

Only the order changes: which trajectories a batch holds is still verl's choice. verl writes
each prompt's key ``{uid}`` when the dataloader draws it, before generation, so TransferQueue
lists the prompts in draw order; a trajectory's key is ``{uid}_{session}_{index}``.

It also looks for finished trajectories every :data:`POLL_INTERVAL_S` instead of verl's 2 s
(``ReplayBuffer(poll_interval=2.0)``): this job generates a batch in a fraction of a second,
so verl's first look always came too early and its 2 s wait was most of every step (measured:
2.4 s a step, of which 0.4 s in the stages).
"""

from __future__ import annotations

from typing import Any

from verl.trainer.ppo.v1.replay_buffer import ReplayBuffer

__all__ = ["POLL_INTERVAL_S", "DrawOrderReplayBuffer"]

#: How often the buffer looks for finished trajectories while a batch is not complete.
POLL_INTERVAL_S = 0.1


class DrawOrderReplayBuffer(ReplayBuffer):
    """verl's synchronous replay buffer; a batch's rows by their prompt's draw order, then session and index."""

    def __init__(self, *, poll_interval: float = POLL_INTERVAL_S, **kwargs: Any) -> None:
        # verl builds its sampler with keywords only (``sampler_cls(**replay_buffer_kwargs)``).
        super().__init__(poll_interval=poll_interval, **kwargs)

    def _materialize_batch(
        self, partition_id: str, selected_prompt_uids: list[str], partition_snapshot: dict[str, dict[str, Any]]
    ) -> Any:
        drawn = {uid: position for position, uid in enumerate(self.prompt_global_steps[partition_id])}

        def place(key: str) -> tuple[int, tuple[int, ...], str]:
            uid, *rest = key.split("_")
            # A key of another shape (a later verl) keeps its place after the known ones, by name.
            numbers = tuple(int(part) for part in rest) if all(part.isdigit() for part in rest) else ()
            return drawn.get(uid, len(drawn)), numbers, key

        in_order = {key: partition_snapshot[key] for key in sorted(partition_snapshot, key=place)}
        return super()._materialize_batch(partition_id, selected_prompt_uids, in_order)
