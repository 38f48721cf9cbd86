"""Patching a module right after it is imported, for the verl bridge.

The bridge wraps classes of verl modules that most processes never import
(the rollout adapters' base, the driver's checkpoint engine); importing them
itself would cost every process seconds.  :class:`PatchOnImport` sits first
on ``sys.meta_path`` and, for the module names it was given only, hands the
import to the path finder and runs the patch once the module has executed.
A patch that raises is logged: the import itself always succeeds.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import logging
from collections.abc import Callable, Sequence
from types import ModuleType
from typing import Any

__all__ = ["PatchOnImport"]

logger = logging.getLogger("verl_events.verl")


class PatchOnImport(importlib.abc.MetaPathFinder):
    """Runs ``patches[name](module)`` right after verl imports module ``name``."""

    def __init__(self, patches: dict[str, Callable[[ModuleType], None]]) -> None:
        self.patches = patches

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        patch = self.patches.get(fullname)
        if patch is None:
            return None
        spec = importlib.machinery.PathFinder.find_spec(fullname, path, target)
        if spec is None or spec.loader is None:
            return None
        spec.loader = PatchingLoader(spec.loader, patch)
        return spec


class PatchingLoader(importlib.abc.Loader):
    def __init__(self, loader: Any, patch: Callable[[ModuleType], None]) -> None:
        self.loader, self.patch = loader, patch

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        module: ModuleType | None = self.loader.create_module(spec)
        return module

    def exec_module(self, module: ModuleType) -> None:
        self.loader.exec_module(module)
        try:
            self.patch(module)
        except Exception:  # training goes on without the transition stages
            logger.exception("verl_events bridge: patching %s failed", module.__name__)

    def __getattr__(self, name: str) -> Any:  # get_source and the like, for tracebacks
        return getattr(self.loader, name)
