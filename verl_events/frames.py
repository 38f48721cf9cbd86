"""The one rule for "the user's frame" in a stack, shared by every reader.

A frame is **library** when it only carries the call: the standard library,
``torch``, ``torch_npu``, ``msprobe``, ``ray`` (its worker loop runs verl's
workers), ``blinker``, and ``verl_events`` itself (the bus and the observers
wrap every stage); a pseudo-file (``<frozen ...>``, ``<string>``) too.
Everything else is the user's: the training script, verl, transformers (a
model's modeling file is where a layer is written), and this package's CPU
demo (``verl_events.apps.demo``: its model and loop stand for the user's).  **The user frame** of
a stack is its innermost user frame.

Two spellings of one rule: by module name (a live frame's ``__name__``: the
watchdog's stacks, an exception's traceback) and by file path (a stack
written as text: msprobe's ``stack.json``, faulthandler's dump), where a
library is a package folder directly under ``site-packages`` /
``dist-packages``, the standard library's ``lib/python3.N/`` folder, or
this package's own folders.  Standard library only.
"""

from __future__ import annotations

import importlib.util
import re
import sys
from collections.abc import Iterable
from functools import cache
from pathlib import Path, PurePosixPath
from typing import Any

__all__ = [
    "LIBRARY_PACKAGES",
    "USER_INSIDE",
    "is_library_file",
    "is_library_frame",
    "is_library_module",
    "user_frame_of_traceback",
]

LIBRARY_PACKAGES = frozenset({"torch", "torch_npu", "msprobe", "ray", "blinker", "verl_events"})
_STDLIB = frozenset(getattr(sys, "stdlib_module_names", ()))
_INSTALLED = frozenset({"site-packages", "dist-packages"})
_PYTHON_LIB = re.compile(r"python3\.\d+")


#: This package's own code that stands for the user's: the demo's model and training loop.
USER_INSIDE = "verl_events.apps.demo"


def is_library_module(module: str) -> bool:
    """Whether a frame of module ``module`` only carries the call."""
    if module == USER_INSIDE or module.startswith(USER_INSIDE + "."):
        return False
    top = module.partition(".")[0]
    return top in LIBRARY_PACKAGES or top in _STDLIB


def is_library_file(file: str) -> bool:
    """Whether a frame in ``file`` only carries the call (the path spelling of the rule)."""
    if file.startswith("<"):
        return True
    posix = file.replace("\\", "/")
    parts = PurePosixPath(posix).parts
    if "/" + USER_INSIDE.replace(".", "/") + "/" in posix:
        return False
    for index, part in enumerate(parts[:-1]):
        if part in _INSTALLED:
            return parts[index + 1].removesuffix(".py") in LIBRARY_PACKAGES
    if any(part == "lib" and _PYTHON_LIB.fullmatch(parts[i + 1]) for i, part in enumerate(parts[:-1])):
        return True  # the standard library: lib/python3.N/ outside site-packages
    return any(posix.startswith(own) for own in _own_folders())


@cache
def _own_folders() -> tuple[str, ...]:
    """This package's folders as path prefixes (a source checkout keeps its observers beside it)."""
    folders = {Path(__file__).resolve().parent}
    spec = importlib.util.find_spec("verl_events.observers")
    for location in (spec.submodule_search_locations or []) if spec is not None else []:
        folders.add(Path(location).resolve())
    return tuple(str(folder).replace("\\", "/") + "/" for folder in folders)


def is_library_frame(module: str, file: str) -> bool:
    """Both spellings at once, for a live frame: by its module, except a script run as
    ``__main__`` (Ray's ``default_worker.py``), whose module says nothing: by its file."""
    return is_library_file(file) if module == "__main__" else is_library_module(module)


def user_frame_of_traceback(frames: Iterable[tuple[str, str, int, str, str]]) -> dict[str, Any] | None:
    """The innermost user frame of ``frames`` (module, file, line, function, code;
    outermost first) as ``{"file", "line", "function", "code"}``, or None."""
    found = None
    for module, file, line, function, code in frames:
        if not is_library_frame(module, file):
            found = {"file": file, "line": line, "function": function, "code": code}
    return found
