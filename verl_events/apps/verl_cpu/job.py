"""A tiny, offline, repeatable verl 0.9.1 PPO job that runs on CPU.

:func:`prepare` builds everything the job reads into a work directory (no network):
a random 2-layer Qwen2 model, a byte-level BPE tokenizer with a Qwen-style chat template,
a 32-row parquet in verl's RL format. :func:`trainer_args` and :func:`trainer_env` give the
Hydra overrides and environment that run verl's own default trainer (v1) on it with the CPU shim
(:mod:`verl_events.apps.verl_cpu.shim`)::

    python -m verl_events.apps.verl_cpu.job WORKDIR [hydra overrides...]

Two runs with the same overrides compute the same numbers: the model init, the data
order (``data.seed``), the rollout sampling (seeded per request) and the mini-batch
order (``actor.data_loader_seed``) are all seeded, each prompt gets one response
(``rollout.n=1``), and a batch's rows come in the order their prompts were drawn
(:mod:`.sampler`), so no result depends on the order of concurrent requests. That holds for
the ``sync`` mode and the legacy trainer; the asynchronous modes train on whatever rollouts
have finished, as they do for every verl user.
"""

from __future__ import annotations

import json
import os
import random
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .modes import MODES, merge_overrides, v1_args
from .session import run_in_own_session as _run_in_own_session
from .trainer_log import LogFollower

__all__ = ["MODES", "JobFiles", "main", "merge_overrides", "prepare", "run_trainer", "trainer_args", "trainer_env"]

#: Module verl must import in each process (``VERL_USE_EXTERNAL_MODULES``).
SHIM_MODULE = "verl_events.apps.verl_cpu.shim"

_SEED = 42
_NUM_ROWS = 32
_MAX_PROMPT_LENGTH = 16
_MAX_RESPONSE_LENGTH = 8
_DATA_SOURCE = "verl_cpu/echo"
# Bump when what prepare() writes changes, so that stale work directories are rebuilt.
_FORMAT_VERSION = 1

_PAD, _IM_START, _IM_END = "<|endoftext|>", "<|im_start|>", "<|im_end|>"
# Qwen2's template, minus system prompt and tools: verl picks its Qwen token builder for a
# qwen2 model (utils/tokenizer/continuous_token.py:540), which assumes this turn layout.
_CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)

_WORDS = """
apple river stone cloud green house light table water music paper garden
window silver horse bread candle forest mountain ocean summer winter spring
autumn yellow orange purple little yellow happy quiet bright gentle simple
number letter circle square bottle pocket basket rabbit turtle falcon spider
dragon castle bridge market school doctor farmer sailor singer writer teacher
morning evening minute second planet rocket engine wheel motor pencil button
ticket mirror ladder hammer needle thread jacket pillow blanket kettle spoon
coffee butter cheese honey lemon cherry tomato potato carrot pepper salad
""".split()
_TASK_WORDS = ["say", "repeat", "echo", "write"]


@dataclass(frozen=True)
class JobFiles:
    """Paths of a prepared job (all inside :attr:`root`)."""

    root: Path
    model: Path
    train_files: Path
    val_files: Path
    reward_function_path: Path
    reward_function_name: str


def _job_files(workdir: Path) -> JobFiles:
    root = workdir.resolve()
    data = root / "data.parquet"
    return JobFiles(
        root=root,
        model=root / "model",
        train_files=data,
        val_files=data,
        reward_function_path=Path(__file__).resolve().with_name("reward.py"),
        reward_function_name="compute_score",
    )


def _rows() -> list[dict[str, Any]]:
    rng = random.Random(_SEED)
    rows = []
    for index in range(_NUM_ROWS):
        word = rng.choice(_WORDS)
        task = rng.choice(_TASK_WORDS)
        rows.append(
            {
                "data_source": _DATA_SOURCE,
                "prompt": [{"role": "user", "content": f"{task} {word}"}],
                "ability": "echo",
                "reward_model": {"style": "rule", "ground_truth": word},
                "extra_info": {"split": "train", "index": index},
            }
        )
    return rows


def _training_text(rows: Sequence[dict[str, Any]]) -> list[str]:
    # The chat markup and the prompts appear often enough for BPE to merge them into
    # single tokens, which keeps each rendered prompt within max_prompt_length.
    turns = [f"user\n{row['prompt'][0]['content']}\nassistant\n{row['reward_model']['ground_truth']}\n" for row in rows]
    sentences = [" ".join(_WORDS[i : i + 8]) for i in range(0, len(_WORDS), 8)]
    return turns * 4 + [" ".join(_TASK_WORDS)] * 8 + sentences * 2


def _build_tokenizer(out_dir: Path, rows: Sequence[dict[str, Any]]) -> Any:
    """Train a byte-level BPE tokenizer and save it next to the model.

    Byte-level, not word-level: transformers 5 loads a qwen2 model directory with its
    byte-level Qwen2 tokenizer, and verl's Qwen token builder needs ``"\\n"`` to be exactly
    one token (``continuous_token.py:556-558``).
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers  # type: ignore[import-untyped]
    from transformers import PreTrainedTokenizerFast

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=384,
        special_tokens=[_PAD, _IM_START, _IM_END],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(_training_text(rows), trainer=trainer)
    hf_tokenizer = PreTrainedTokenizerFast(  # type: ignore[no-untyped-call]
        tokenizer_object=tokenizer,
        eos_token=_IM_END,
        pad_token=_PAD,
        chat_template=_CHAT_TEMPLATE,
    )
    hf_tokenizer.save_pretrained(out_dir)
    return hf_tokenizer


def _build_model(out_dir: Path, tokenizer: Any) -> None:
    import torch
    from transformers import GenerationConfig, Qwen2Config, Qwen2ForCausalLM

    eos_id = tokenizer.convert_tokens_to_ids(_IM_END)
    pad_id = tokenizer.convert_tokens_to_ids(_PAD)
    config = Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=128,
        tie_word_embeddings=False,
        bos_token_id=None,
        eos_token_id=eos_id,
        pad_token_id=pad_id,
        dtype="float32",
    )
    torch.manual_seed(_SEED)
    model = Qwen2ForCausalLM(config)  # type: ignore[no-untyped-call]
    model.generation_config = GenerationConfig(eos_token_id=eos_id, pad_token_id=pad_id)  # type: ignore[no-untyped-call]
    from transformers.utils import logging as hf_logging

    # A one-shard "Writing model shards" bar would be the demo's first output line.
    shown = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()  # type: ignore[no-untyped-call]
    try:
        model.save_pretrained(out_dir)
    finally:
        if shown:
            hf_logging.enable_progress_bar()  # type: ignore[no-untyped-call]


def _write_parquet(path: Path, rows: Sequence[dict[str, Any]]) -> None:
    import pandas as pd  # type: ignore[import-untyped]

    pd.DataFrame(list(rows)).to_parquet(path, index=False)


def _check_prompt_lengths(tokenizer: Any, rows: Sequence[dict[str, Any]]) -> None:
    for row in rows:
        ids = tokenizer.apply_chat_template(row["prompt"], add_generation_prompt=True, tokenize=True)
        ids = ids["input_ids"] if isinstance(ids, Mapping) else ids
        if len(ids) > _MAX_PROMPT_LENGTH:
            raise RuntimeError(f"prompt {row['prompt']!r} is {len(ids)} tokens, over {_MAX_PROMPT_LENGTH}")


def prepare(workdir: Path) -> JobFiles:
    """Build the job's model, tokenizer and data under ``workdir`` and return their paths.

    Deterministic (seeded model init, fixed data) and cheap when already built: a stamp
    written last marks a complete build, so an interrupted build is redone.
    """
    files = _job_files(Path(workdir))
    stamp = files.root / "job.json"
    expected = {"format": _FORMAT_VERSION, "seed": _SEED, "rows": _NUM_ROWS}
    if stamp.is_file() and json.loads(stamp.read_text()) == expected and files.model.is_dir():
        return files
    files.root.mkdir(parents=True, exist_ok=True)
    files.model.mkdir(exist_ok=True)
    rows = _rows()
    tokenizer = _build_tokenizer(files.model, rows)
    _check_prompt_lengths(tokenizer, rows)
    _build_model(files.model, tokenizer)
    _write_parquet(files.train_files, rows)
    stamp.write_text(json.dumps(expected))
    return files


def trainer_args(
    files: JobFiles,
    *,
    steps: int = 3,
    save_path: Path | None = None,
    mode: str = "sync",
    legacy: bool = False,
) -> list[str]:
    """Hydra overrides for ``python -m verl.trainer.main_ppo`` running the prepared job.

    verl's default trainer runs it (v1, with TransferQueue) in ``mode``, one of :data:`MODES`
    (``separate_async`` with the CPU checkpoint engine of :mod:`.checkpoint_engine`);
    ``legacy`` runs the deprecated v0 trainer instead. ``save_path`` is where verl's profilers
    write (``global_profiler.save_path``), by default ``files.root / "profile"``.
    """
    if legacy and mode != "sync":
        raise ValueError(
            f"trainer_args: mode {mode!r} is a mode of verl's v1 trainer; legacy=True runs v0, which has none"
        )
    profile_dir = Path(save_path) if save_path is not None else files.root / "profile"
    trainer = ["trainer.use_v1=False"] if legacy else v1_args(mode)
    job = [
        *_trainer_overrides(files, steps, profile_dir),
        *_task_overrides(files),
        *_actor_overrides(files),
        *_rollout_overrides(),
        *_cluster_overrides(files),
    ]
    return merge_overrides(job, trainer)


def _trainer_overrides(files: JobFiles, steps: int, profile_dir: Path) -> list[str]:
    """How long verl's trainer runs, on what, and where it writes."""
    return [
        "trainer.device=cpu",
        "trainer.nnodes=1",
        "trainer.n_gpus_per_node=1",
        f"trainer.total_training_steps={steps}",
        "trainer.logger=[console]",
        "trainer.test_freq=-1",
        "trainer.save_freq=-1",
        "trainer.val_before_train=False",
        "trainer.project_name=verl_cpu",
        "trainer.experiment_name=tiny",
        f"trainer.default_local_dir={files.root / 'checkpoints'}",
        f"global_profiler.save_path={profile_dir}",
    ]


def _task_overrides(files: JobFiles) -> list[str]:
    """The job's data, its reward and the advantage estimator, all repeatable."""
    return [
        # Repeatable: one response per prompt, advantages without group statistics.
        "algorithm.adv_estimator=reinforce_plus_plus",
        f"data.train_files={files.train_files}",
        f"data.val_files={files.val_files}",
        "data.train_batch_size=4",
        f"data.max_prompt_length={_MAX_PROMPT_LENGTH}",
        f"data.max_response_length={_MAX_RESPONSE_LENGTH}",
        f"data.seed={_SEED}",
        "data.dataloader_num_workers=0",
        "reward.num_workers=1",
        f"reward.custom_reward_function.path={files.reward_function_path}",
        f"reward.custom_reward_function.name={files.reward_function_name}",
    ]


def _actor_overrides(files: JobFiles) -> list[str]:
    """The model, the FSDP2 actor and the reference, on CPU."""
    actor = "actor_rollout_ref.actor"
    return [
        f"actor_rollout_ref.model.path={files.model}",
        # flash_attention_2 is the default (workers/config/model.py:185) and needs CUDA.
        "+actor_rollout_ref.model.override_config.attn_implementation=sdpa",
        # Padding-free packing targets flash-attention varlen kernels
        # (workers/engine/fsdp/transformer_impl.py:1254).
        "actor_rollout_ref.model.use_remove_padding=False",
        "actor_rollout_ref.model.enable_gradient_checkpointing=False",
        f"{actor}.strategy=fsdp2",
        f"{actor}.ppo_mini_batch_size=2",
        f"{actor}.ppo_micro_batch_size_per_gpu=1",
        f"{actor}.use_kl_loss=True",  # so the reference model (and its stage) runs
        f"{actor}.use_torch_compile=False",
        f"{actor}.fsdp_config.use_torch_compile=False",
        f"{actor}.data_loader_seed={_SEED}",
        "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=1",
        "actor_rollout_ref.ref.fsdp_config.use_torch_compile=False",
    ]


def _rollout_overrides() -> list[str]:
    """The ``hf`` rollout (:mod:`.hf_rollout`): one seeded response per prompt, in float32."""
    rollout = "actor_rollout_ref.rollout"
    return [
        f"{rollout}.name=hf",
        f"{rollout}.n=1",
        f"{rollout}.seed={_SEED}",
        # verl's default is bfloat16; the hf rollout honours it (docs/mismatch.md), and float32
        # keeps generation fast on CPU and equal to the float32 weights the actor syncs.
        f"{rollout}.dtype=float32",
        f"{rollout}.tensor_model_parallel_size=1",
        f"{rollout}.log_prob_micro_batch_size_per_gpu=1",
        f"{rollout}.agent.num_workers=1",
    ]


def _cluster_overrides(files: JobFiles) -> list[str]:
    """Ray: a private local cluster (never one someone else started), fake GPUs for verl's
    placement groups, enough (virtual) CPUs for its actors, no dashboard; Hydra's folder."""
    return [
        "+ray_kwargs.ray_init.address=local",
        "ray_kwargs.ray_init.num_cpus=8",
        "+ray_kwargs.ray_init.num_gpus=1",
        "+ray_kwargs.ray_init.include_dashboard=False",
        f"hydra.run.dir={files.root / 'hydra'}",
    ]


def trainer_env(base: Mapping[str, str] | None = None) -> dict[str, str]:
    """Environment for the trainer: ``base`` (default ``os.environ``) plus what the job needs.

    Ray workers inherit it from the driver, which starts the local Ray cluster.
    """
    env = dict(os.environ if base is None else base)
    # verl splits the value on "," without stripping (verl/__init__.py:49-52).
    modules = [m for m in env.get("VERL_USE_EXTERNAL_MODULES", "").split(",") if m]
    if SHIM_MODULE not in modules:
        modules.append(SHIM_MODULE)
    env["VERL_USE_EXTERNAL_MODULES"] = ",".join(modules)
    env["VERL_PLATFORM"] = "cpu"
    # The FSDP engine is registered for cuda/npu only (workers/engine/fsdp/transformer_impl.py:1143).
    env["VERL_ENGINE_DEVICE"] = "cuda"
    env["RAY_USAGE_STATS_ENABLED"] = "0"
    env["TOKENIZERS_PARALLELISM"] = "false"
    env["PYTHONHASHSEED"] = "0"
    env["HYDRA_FULL_ERROR"] = "1"
    return env


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m verl_events.apps.verl_cpu.job WORKDIR [hydra overrides...]``: prepare and train."""
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] in {"-h", "--help"}:
        print(__doc__)
        return 0 if args else 2
    workdir, extra = Path(args[0]), args[1:]
    files = prepare(workdir)
    overrides = merge_overrides(trainer_args(files), extra)
    return run_trainer(overrides, trainer_env())


def run_trainer(
    overrides: Sequence[str],
    env: Mapping[str, str],
    *,
    log: Path | None = None,
    timeout: float | None = None,
    on_line: Callable[[str], None] | None = None,
) -> int:
    """Run ``python -m verl.trainer.main_ppo OVERRIDES`` with ``env``; return its exit code.

    Its output goes to ``log`` when given (each line also to ``on_line`` as it is
    written, about twice a second), else to this process's stdout and stderr.
    No Ray process of the run is left behind: past ``timeout`` seconds (a hang) all of
    them are killed and :class:`subprocess.TimeoutExpired` is raised.
    """
    cmd = [sys.executable, "-m", "verl.trainer.main_ppo", *overrides]
    if log is None:
        return _run_in_own_session(cmd, env, timeout=timeout)
    follower = LogFollower(log, on_line) if on_line is not None else None
    with log.open("w") as out:
        return _run_in_own_session(cmd, env, out, timeout=timeout, follower=follower)


if __name__ == "__main__":
    sys.exit(main())
