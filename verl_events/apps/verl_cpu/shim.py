"""CPU shim for verl 0.9.1, loaded by verl in every process it starts.

verl imports each module named in ``VERL_USE_EXTERNAL_MODULES`` (comma separated) at the
end of ``import verl`` (``verl/__init__.py:49-52``), in the driver, the TaskRunner and every
Ray worker, so importing this module is enough to patch each process before verl uses it.
The patches apply only when ``VERL_PLATFORM=cpu`` selects the platform registered here;
the registrations themselves are inert on other platforms.

What it does, each tied to the verl 0.9.1 line it gets past:

- registers a ``cpu`` platform: device ``"cpu"``, backend gloo, a device module that stands
  in for ``torch.cuda``, and Ray resource ``GPU`` (Ray is started with a fake ``num_gpus``);
- registers an ``hf`` rollout (replica + worker-side adapter, see :mod:`.hf_rollout`);
- makes the worker process group gloo-only and FSDP2's CPU offload unpinned.

The FSDP engine itself is selected with ``VERL_ENGINE_DEVICE=cuda`` (``workers/engine/base.py:405``);
see :func:`verl_events.apps.verl_cpu.job.trainer_env`.
"""

from __future__ import annotations

import contextlib
import inspect
import os
import types
from collections.abc import Iterator
from typing import Any

import torch
from verl.plugin.platform import PlatformBase, PlatformRegistry

__all__ = ["CPU_PLATFORM", "HF_ROLLOUT", "CPUDeviceModule", "PlatformCPU"]

#: Value of ``VERL_PLATFORM`` that selects :class:`PlatformCPU`.
CPU_PLATFORM = "cpu"
#: Value of ``actor_rollout_ref.rollout.name`` that selects the HF rollout.
HF_ROLLOUT = "hf"


class CPUDeviceModule(types.ModuleType):
    """What ``get_torch_device()`` returns on CPU: the subset of ``torch.cuda`` verl calls.

    Memory queries report 0 and cache/stream management is a no-op: host memory has none
    of that. Streams and events come from ``torch.cpu``, which provides no-op versions.
    """

    Stream = torch.cpu.Stream
    Event = torch.cpu.Event

    def __init__(self) -> None:
        super().__init__("verl_events.apps.verl_cpu.device")

    def is_available(self) -> bool:
        return True

    def device_count(self) -> int:
        return 1

    def current_device(self) -> str:
        # verl passes this to tensor.to(...) / torch.device(...); an int would mean cuda:N.
        return "cpu"

    def set_device(self, device: Any) -> None:
        pass

    def synchronize(self, device: Any = None) -> None:
        pass

    def current_stream(self, device: Any = None) -> Any:
        return torch.cpu.current_stream(device)

    def stream(self, stream: Any) -> Any:
        return torch.cpu.stream(stream)

    def get_device_name(self, device: Any = None) -> str:
        # utils/flops_counter.py:85 does `key in device_name`: it must be a string.
        return "CPU"

    def empty_cache(self) -> None:
        pass

    def ipc_collect(self) -> None:
        pass

    def memory_allocated(self, device: Any = None) -> int:
        return 0

    def memory_reserved(self, device: Any = None) -> int:
        return 0

    def max_memory_allocated(self, device: Any = None) -> int:
        return 0

    def max_memory_reserved(self, device: Any = None) -> int:
        return 0

    def mem_get_info(self, device: Any = None) -> tuple[int, int]:
        return 0, 0

    def reset_peak_memory_stats(self, device: Any = None) -> None:
        pass

    def reset_accumulated_memory_stats(self, device: Any = None) -> None:
        pass

    def set_per_process_memory_fraction(self, fraction: float, device: Any = None) -> None:
        pass

    def manual_seed(self, seed: int) -> None:
        torch.manual_seed(seed)

    def manual_seed_all(self, seed: int) -> None:
        torch.manual_seed(seed)

    def get_rng_state(self, device: Any = None) -> torch.Tensor:
        return torch.get_rng_state()

    def set_rng_state(self, new_state: torch.Tensor, device: Any = None) -> None:
        torch.set_rng_state(new_state)


_DEVICE_MODULE = CPUDeviceModule()


# plugin/platform/platform_manager.py:117 falls back to "nvidia" (cuda, nccl) without a GPU.
@PlatformRegistry.register(platform=CPU_PLATFORM)
class PlatformCPU(PlatformBase):
    """verl platform for a host without accelerator; selected with ``VERL_PLATFORM=cpu``."""

    @property
    def device_name(self) -> str:
        return "cpu"

    @property
    def vendor_name(self) -> str:
        return "cpu"

    @property
    def device_module(self) -> CPUDeviceModule:
        return _DEVICE_MODULE

    def is_available(self) -> bool:
        return True

    def is_platform_available(self, use_smi_check: bool = False) -> bool:
        # Never auto-detected: only VERL_PLATFORM=cpu selects it.
        return False

    def current_device(self) -> str:  # type: ignore[override]
        # get_device_id() (utils/device.py:114) feeds tensor.to(): "cpu", not an index.
        return "cpu"

    def device_count(self) -> int:
        return 1

    def set_device(self, device_index: int) -> None:
        pass

    def synchronize(self, device_index: int | None = None) -> None:
        pass

    def manual_seed(self, seed: int) -> None:
        torch.manual_seed(seed)

    def manual_seed_all(self, seed: int) -> None:
        torch.manual_seed(seed)

    def set_allocator_settings(self, settings: str) -> None:
        pass

    def empty_cache(self) -> None:
        pass

    def get_device_capability(self, device_index: int = 0) -> tuple[int | None, int | None]:
        return None, None

    def communication_backend_name(self) -> str:
        return "gloo"

    def visible_devices_envvar(self) -> str:
        # Ray sets it for the fake GPUs; verl reads it (single_controller/base/worker.py:178).
        return "CUDA_VISIBLE_DEVICES"

    @contextlib.contextmanager
    def nvtx_range(self, msg: str) -> Iterator[None]:
        yield

    def profiler_start(self) -> None:
        pass

    def profiler_stop(self) -> None:
        pass

    def ray_resource_name(self) -> str:
        # Placement groups ask for this resource (single_controller/ray/base.py:144-148);
        # Ray is started with a fake num_gpus so that they resolve.
        return "GPU"

    def ray_noset_envvars(self) -> list[str]:
        return []

    def is_ipc_supported(self) -> bool:
        return False

    def cudart(self) -> None:
        return None


def _patch_gloo_backend() -> None:
    """Make ``initialize_global_process_group_ray`` default to a gloo-only backend.

    ``utils/distributed.py:89`` builds ``f"cpu:gloo,{device}:{backend}"``, i.e.
    ``"cpu:gloo,cpu:gloo"`` on CPU, which torch refuses ("Duplicate device type cpu").
    ``workers/engine_workers.py:38`` imports the function by name, so the function object's
    defaults are changed rather than the module attribute.
    """
    from verl.utils import distributed

    func = distributed.initialize_global_process_group_ray
    params = list(inspect.signature(func).parameters)
    if params != ["timeout_second", "backend"]:
        raise RuntimeError(f"unexpected signature of initialize_global_process_group_ray: {params}")
    func.__defaults__ = (None, "cpu:gloo")


def _patch_cpu_offload_pin_memory() -> None:
    """Force FSDP2 ``CPUOffloadPolicy(pin_memory=False)``.

    ``workers/engine/fsdp/transformer_impl.py:462`` gives the forward-only (ref) model
    ``CPUOffloadPolicy(pin_memory=True)``; pinning needs an accelerator ("Cannot access
    accelerator device when none is available"). This process never has one.
    """
    from torch.distributed.fsdp import CPUOffloadPolicy

    original_init = CPUOffloadPolicy.__init__
    if getattr(original_init, "_verl_cpu_unpinned", False):
        return

    def init_unpinned(self: Any, pin_memory: bool = True) -> None:
        original_init(self, pin_memory=False)

    init_unpinned._verl_cpu_unpinned = True  # type: ignore[attr-defined]
    CPUOffloadPolicy.__init__ = init_unpinned  # type: ignore[method-assign]


def _load_hf_replica() -> type:
    from .hf_rollout import HFReplica

    return HFReplica


def _register_hf_rollout() -> None:
    """Register the ``hf`` rollout with verl's two rollout registries.

    Only vllm/sglang/trtllm are known to ``workers/rollout/base.py:89`` (worker-side adapter,
    looked up by ``engine_workers.py:667``) and ``workers/rollout/replica.py:388`` (server
    replica, looked up by ``llm_server.py:393``). Both entries load lazily.
    """
    from verl.workers.rollout import base as rollout_base
    from verl.workers.rollout.replica import RolloutReplicaRegistry

    rollout_base._ROLLOUT_REGISTRY[(HF_ROLLOUT, "async")] = "verl_events.apps.verl_cpu.hf_rollout.HFServerAdapter"
    RolloutReplicaRegistry.register(HF_ROLLOUT, _load_hf_replica)


def _install() -> None:
    _register_hf_rollout()
    # The patches change process-wide defaults: apply them only where the cpu platform is
    # selected (same test as plugin/platform/platform_manager.py:92).
    if os.environ.get("VERL_PLATFORM", "").strip().lower() == CPU_PLATFORM:
        _patch_gloo_backend()
        _patch_cpu_offload_pin_memory()


_install()
