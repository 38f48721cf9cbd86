"""The ``hf`` rollout for verl 0.9.1: HF ``generate`` on CPU behind verl's server-mode interface.

verl 0.9.1 only generates through inference servers (vLLM, SGLang, TensorRT-LLM), none of
which runs here. This module provides the three pieces verl's hybrid rollout expects,
mirroring the vLLM ones (``workers/rollout/vllm_rollout/``):

- :class:`HFRolloutServer`, a Ray actor serving token-in/token-out ``generate`` requests
  from the agent loop (``workers/rollout/llm_server.py:150``);
- :class:`HFReplica`, the :class:`RolloutReplica` that launches it (``llm_server.py:473``);
- :class:`HFServerAdapter`, the worker-side :class:`BaseRollout` through which the trainer
  pushes the FSDP actor's weights to the server (the "naive" checkpoint path,
  ``workers/engine_workers.py:728``).

Sampling is seeded per request from (rollout seed, weight version, prompt tokens), so the
output does not depend on the order in which concurrent requests reach the server.  With
LoRA (``actor_rollout_ref.model.lora_rank`` > 0) the server's model becomes a peft model at
the first sync that carries verl's ``peft_config``, and takes that sync's two payloads: the
base weights, then the adapter.
"""

from __future__ import annotations

import copy
import os
import zlib
from array import array
from collections.abc import Iterable
from typing import Any, cast

import ray
import torch
from transformers import AutoModelForCausalLM, GenerationConfig
from verl.utils.config import omega_conf_to_dataclass
from verl.utils.torch_dtypes import PrecisionType
from verl.workers.config import HFModelConfig
from verl.workers.rollout.base import BaseRollout
from verl.workers.rollout.replica import RolloutReplica, TokenOutput

from verl_events import stage
from verl_events.observers.mismatch import record as mismatch_record

__all__ = [
    "PREFILL_STAGE",
    "HFReplica",
    "HFRolloutServer",
    "HFServerAdapter",
    "request_canary",
    "request_prefill",
    "request_receipt",
    "run_on_server",
    "server_name",
]

#: The stage the server runs a trainer's sequences in, for the layer profile (docs/mismatch.md).
PREFILL_STAGE = mismatch_record.ENGINE_STAGE


def server_name(replica_rank: int) -> str:
    """Ray actor name of a replica's server; the adapter finds the server by this name."""
    return f"hf_server_{replica_rank}"


def _request_seed(base_seed: int, weight_version: int | None, prompt_ids: list[int]) -> int:
    # zlib.crc32, not hash(): str/bytes hashing is salted per process.
    prompt_crc = zlib.crc32(array("q", prompt_ids).tobytes())
    return (base_seed * 1_000_003 + (weight_version or 0) * 7_919 + prompt_crc) % (2**63)


def _sampled_log_probs(scores: Iterable[torch.Tensor], token_ids: list[int]) -> list[float]:
    """Each generated token's log-prob from the scores after temperature, top-k and top-p,
    like vLLM's default ``processed_logprobs``."""
    return [
        float(torch.log_softmax(step_scores[0].float(), dim=-1)[token])
        for step_scores, token in zip(scores, token_ids, strict=True)
    ]


class HFRolloutServer:
    """Token-in/token-out generation server (one per replica) running HF ``generate``.

    Every method is ``async`` so Ray runs the actor on a single event loop: requests are
    served one at a time, which keeps the process-wide torch RNG seeding per request sound.
    Memory management calls (sleep/wake-up, KV cache) are no-ops: there is no device
    memory to give back.
    """

    def __init__(self, config: Any, model_config: Any, replica_rank: int) -> None:
        self.config = omega_conf_to_dataclass(config)
        self.model_config: HFModelConfig = omega_conf_to_dataclass(model_config, dataclass_type=HFModelConfig)
        self.replica_rank = replica_rank
        # Version of the weights being served: the trainer's global step at the last sync
        # (what vLLM reports as extra_fields["global_steps"], vllm_async_server.py:689).
        self.global_steps: int | None = None
        # rollout.dtype, as vLLM's dtype: the CPU job sets float32 (bf16 matmuls are slow on
        # CPU); a bfloat16 rollout against a float32 trainer is the mismatch docs/mismatch.md shows.
        # Any: transformers' annotations do not cover the generate() call below.
        self.model: Any = cast(
            Any,
            AutoModelForCausalLM.from_pretrained(
                self.model_config.local_path,
                dtype=PrecisionType.to_dtype(self.config.dtype),  # type: ignore[no-untyped-call]
                attn_implementation="sdpa",
            ),
        )
        self.model.eval()
        tokenizer = self.model_config.tokenizer
        eos = self.model_config.generation_config.eos_token_id if self.model_config.generation_config else None
        if eos is None:
            eos = tokenizer.eos_token_id
        self.eos_token_ids: list[int] = list(eos) if isinstance(eos, list | tuple) else [int(eos)]
        pad = tokenizer.pad_token_id
        self.pad_token_id: int = int(pad) if pad is not None else self.eos_token_ids[0]

    async def ready(self) -> bool:
        return True

    async def generate(
        self,
        prompt_ids: list[int],
        sampling_params: dict[str, Any],
        request_id: str,
        image_data: Any = None,
        video_data: Any = None,
        **kwargs: Any,
    ) -> TokenOutput:
        """Generate one response; same contract as ``vLLMHttpServer.generate``."""
        if image_data is not None or video_data is not None:
            raise NotImplementedError("the hf rollout is text-only")
        prompt_ids = [int(t) for t in prompt_ids]
        params = dict(sampling_params)
        generation_config = self._generation_config(params, len(prompt_ids))
        torch.manual_seed(_request_seed(self.config.seed, self.global_steps, prompt_ids))
        input_ids = torch.tensor([prompt_ids], dtype=torch.long)
        with torch.no_grad():
            out: Any = self.model.generate(
                input_ids=input_ids,
                attention_mask=torch.ones_like(input_ids),
                generation_config=generation_config,
            )
        token_ids: list[int] = out.sequences[0, len(prompt_ids) :].tolist()
        return TokenOutput(
            token_ids=token_ids,
            log_probs=_sampled_log_probs(out.scores, token_ids) if params.get("logprobs") else None,
            stop_reason="completed",
            extra_fields={"global_steps": self.global_steps},
        )

    def _generation_config(self, params: dict[str, Any], prompt_length: int) -> Any:
        """HF's ``GenerationConfig`` for a request's vLLM-style sampling ``params``."""
        max_tokens = params.pop("max_tokens", None) or params.pop("max_new_tokens", None)
        if max_tokens is None:
            # Same default as vllm_async_server.py:611-613.
            max_tokens = min(
                self.config.response_length,
                self.config.prompt_length + self.config.response_length - prompt_length,
            )
        temperature = float(params.get("temperature", 1.0))
        do_sample = temperature > 0
        top_k = int(params.get("top_k", -1))
        return GenerationConfig(  # type: ignore[no-untyped-call]
            max_new_tokens=max(1, int(max_tokens)),
            do_sample=do_sample,
            temperature=temperature if do_sample else None,
            # verl's "no limit" is top_k=-1, HF's is 0 (None would mean HF's default, 50).
            top_k=max(top_k, 0) if do_sample else None,
            top_p=float(params.get("top_p", 1.0)) if do_sample else None,
            repetition_penalty=float(params.get("repetition_penalty", 1.0)),
            eos_token_id=self.eos_token_ids,
            pad_token_id=self.pad_token_id,
            output_scores=True,
            return_dict_in_generate=True,
            # A broken model (NaN weights) keeps generating, as vLLM does, instead of failing
            # in sampling: the steps after an anomaly must still run to be captured.
            remove_invalid_values=True,
        )

    async def prefill(self, sequences: list[list[int]], step: int, rank: int) -> None:
        """Run ``sequences`` through the served model, one forward each, in order, inside
        the ``rollout_prefill`` stage for trainer ``rank`` at ``step``: what an msprobe
        observer selecting that stage dumps, to compare with the trainer's own forward."""
        with torch.no_grad(), stage(PREFILL_STAGE, role="rollout", step=step, model=self.model, rank=rank):
            for ids in sequences:
                self.model(input_ids=torch.tensor([ids], dtype=torch.long), use_cache=False)

    async def update_weights(
        self,
        state_dict: dict[str, torch.Tensor],
        global_steps: int | None,
        peft_config: dict[str, Any] | None = None,
        base_sync_done: bool = True,
    ) -> None:
        """Load the actor's full (unsharded) weights, keyed by HF parameter names.  With LoRA
        (``peft_config``, as verl sends it: a dict), the model becomes a peft model at the
        first such sync; a payload with ``base_sync_done=False`` is the base weights (under
        peft's ``base_layer`` names), any other the adapter (as ``get_peft_model_state_dict``
        names it): verl's first LoRA sync sends both, one after the other."""
        if peft_config is None:
            self.model.load_state_dict(state_dict, strict=True)
        else:
            self._load_lora(state_dict, peft_config, base_sync_done)
        self.global_steps = global_steps

    def _load_lora(self, state_dict: dict[str, torch.Tensor], peft_config: dict[str, Any], base: bool) -> None:
        from peft import PeftModel, get_peft_config, get_peft_model, set_peft_model_state_dict

        if not isinstance(self.model, PeftModel):
            self.model = get_peft_model(self.model, get_peft_config(copy.deepcopy(peft_config)))
            self.model.eval()
        model: Any = self.model  # peft's annotations do not cover these calls
        if not base:
            missing, unexpected = model.base_model.model.load_state_dict(state_dict, strict=False)
            missing = [name for name in missing if "lora_" not in name]
            if missing or unexpected:
                raise RuntimeError(f"LoRA base weights: missing {missing[:5]}, unexpected {unexpected[:5]}")
        else:
            loaded: Any = set_peft_model_state_dict(model, state_dict)
            if loaded.unexpected_keys:
                raise RuntimeError(f"LoRA adapter: unexpected {loaded.unexpected_keys[:5]}")

    async def weight_fingerprints(self) -> dict[str, tuple[str, str]]:
        """``{name: (dtype, fingerprint)}`` of the weights this server holds, taken here, in
        the server's own process: the weight_sync observer's receipt (docs/weight-sync.md)."""
        # Under two names for mypy's sake: see verl_events.apps.formats.
        from verl_events.observers.weight_sync.fingerprint import fingerprint

        return {
            _as_sent(name): (str(tensor.dtype).removeprefix("torch."), fingerprint(tensor))
            for name, tensor in self.model.state_dict().items()
        }

    async def canary(self, ids: list[list[int]]) -> Any:
        """The weight_sync observer's canary on this server's model, in its process: each next
        token's log-prob and each decoder layer's output (a ``canary.Side``)."""
        # Under two names for mypy's sake: see verl_events.apps.formats.
        from verl_events.observers.weight_sync.canary import forward

        return forward(self.model, ids)

    async def set_global_steps(self, global_steps: int) -> None:
        self.global_steps = global_steps

    async def wake_up(self, tags: list[str] | None = None) -> None:
        pass

    async def sleep(self) -> None:
        pass

    async def clear_kv_cache(self) -> None:
        pass

    async def release_kv_cache(self) -> None:
        pass

    async def resume_kv_cache(self) -> None:
        pass

    async def wait_for_requests_to_drain(self) -> None:
        pass

    async def abort_all_requests(self, reset_prefix_cache: bool = True, reject_request: bool = False) -> dict[str, Any]:
        # Requests run to completion one at a time: there is never anything to abort.
        return {"aborted_count": 0, "request_ids": []}

    async def resume_generation(self) -> None:
        pass

    async def start_profile(self, **kwargs: Any) -> None:
        pass

    async def stop_profile(self) -> None:
        pass


class HFReplica(RolloutReplica):
    """Rollout replica hosting one :class:`HFRolloutServer` (hybrid mode only)."""

    async def launch_servers(self) -> None:
        if self.is_reward_model or self.is_teacher_model:
            raise NotImplementedError("the hf rollout only serves the policy")
        name = server_name(self.replica_rank)
        # num_cpus=0: the actor must not compete with verl's placement groups for the
        # (few) CPUs Ray advertises.
        server: Any = (
            ray.remote(HFRolloutServer)
            .options(name=name, num_cpus=0, max_concurrency=self.max_concurrency)
            .remote(config=self.config, model_config=self.model_config, replica_rank=self.replica_rank)
        )
        await server.ready.remote()
        self.servers = [server]
        self._server_handle = server
        # Only used as the server's id by verl's load balancer (no HTTP endpoint).
        self._server_address = name


class HFServerAdapter(BaseRollout):
    """Worker-side end of the ``hf`` rollout: forwards weight syncs to the replica's server."""

    def __init__(self, config: Any, model_config: Any, device_mesh: Any, replica_rank: int = -1) -> None:
        super().__init__(config, model_config, device_mesh)
        rank = int(os.environ["RANK"])
        rollout_world_size = (
            self.config.tensor_model_parallel_size
            * self.config.data_parallel_size
            * self.config.pipeline_model_parallel_size
        )
        self.replica_rank = rank // rollout_world_size if replica_rank == -1 else replica_rank
        # One rank per replica talks to the server (as vllm_rollout.py:123 does).
        self._has_server = rank % rollout_world_size == 0
        self._server: Any = None

    def _server_handle(self) -> Any:
        # Looked up lazily: the server is launched after the workers are built.
        if self._server is None:
            self._server = ray.get_actor(server_name(self.replica_rank))
        return self._server

    async def resume(self, tags: list[str]) -> None:
        pass

    async def release(self) -> None:
        pass

    async def update_weights(
        self,
        weights: Iterable[tuple[str, torch.Tensor]],
        wire_format: str = "named_tensors",
        *,
        global_steps: int | None = None,
        peft_config: dict[str, Any] | None = None,
        base_sync_done: bool = True,
        **kwargs: Any,
    ) -> None:
        if wire_format != "named_tensors":
            raise NotImplementedError(f"the hf rollout only takes named tensors, not {wire_format!r}")
        # Every rank drains the generator: unsharding a DTensor (full_tensor) is a collective.
        # copy=True: plain CPU tensors alias the live parameters.
        state_dict = {name: tensor.detach().to("cpu", copy=True) for name, tensor in weights}
        if self._has_server:
            server = self._server_handle()
            await server.update_weights.remote(state_dict, global_steps, peft_config, base_sync_done)


def _as_sent(name: str) -> str:
    """A served tensor's name as verl's sync names it: a peft model's adapter tensors without
    peft's adapter name (``.default.``), its base tensors without its wrapper's prefix."""
    if not name.startswith("base_model.model."):
        return name
    return name.replace(".default.", ".") if "lora_" in name else name.removeprefix("base_model.model.")


def _server_for(rank: int) -> Any:
    """The replica numbered like the rank when there is one (one replica per trainer rank, as
    with ``tensor_model_parallel_size=1``), else replica 0."""
    try:
        return ray.get_actor(server_name(rank))
    except ValueError:  # Ray's answer for a name no actor has
        return ray.get_actor(server_name(0))


def request_receipt(rank: int) -> dict[str, tuple[str, str]]:
    """The weight_sync observer's ``receipt_engine`` for this rollout: the fingerprints of the
    weights that trainer ``rank``'s server holds, computed in the server's process."""
    held: dict[str, tuple[str, str]] = ray.get(_server_for(rank).weight_fingerprints.remote())
    return held


def request_canary(rank: int, ids: list[list[int]]) -> Any:
    """The weight_sync observer's ``canary_engine`` for this rollout: ``ids`` through trainer
    ``rank``'s server, teacher-forced, in the server's process."""
    return ray.get(_server_for(rank).canary.remote(ids))


def run_on_server(rank: int, function: Any, *args: Any) -> Any:
    """``function(server, *args)`` run in trainer ``rank``'s server process, on the
    :class:`HFRolloutServer` itself (Ray's ``__ray_call__``); its result."""
    return ray.get(_server_for(rank).__ray_call__.remote(function, *args))


def request_prefill(sequences: list[list[int]], step: int, rank: int) -> None:
    """The mismatch observer's ``prefill_engine`` for this rollout: trainer ``rank``'s
    sequences go to a server, which runs them (:meth:`HFRolloutServer.prefill`).

    The replica is :func:`_server_for`'s: every replica serves the same weights, synced at the
    start of the step."""
    ray.get(_server_for(rank).prefill.remote(sequences, step, rank))
