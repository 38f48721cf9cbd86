"""verl's ``@register`` layers, so that a stage goes inside TransferQueue's bridge.

verl 0.9's ``@register`` applies ``tqbridge`` to a worker method before its own
wrapper, so the method a worker class holds is ``register(tqbridge(annotate(f)))``.
On the v1 trainer the driver passes a handle (``KVBatchMeta``): tqbridge fetches the
tensors it names, calls the method, and puts the result back.  A stage wrapped
around the whole would receive and return handles and time the fetch.
:meth:`RegisterLayers.inside_tqbridge` builds the method again as
``register(tqbridge(stage(annotate(f))))``, with the arguments ``@register`` was
given (verl keeps them on the method), so the stage sees the tensors the method
works on.  Where no handle is passed (the v0 trainer) tqbridge calls through.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

__all__ = ["RegisterLayers"]

_REGISTER_ARGUMENTS = frozenset({"dispatch_mode", "execute_mode", "blocking"})


class RegisterLayers:
    """Tells verl's ``register`` and ``tqbridge`` layers by their code objects:
    ``functools.wraps`` copies the method's ``__module__`` and ``__name__`` onto both."""

    def __init__(self, decorator_module: Any) -> None:
        self.register = decorator_module.register
        self.attribute = decorator_module.MAGIC_ATTR  # where @register keeps its arguments
        registered = self.register()(lambda self: None)
        self.register_code = registered.__code__
        self.tqbridge_code = getattr(getattr(registered, "__wrapped__", None), "__code__", None)

    def inside_tqbridge(self, method: Any, wrap: Callable[[Any], Any]) -> Any:
        """``method`` built again with ``wrap`` applied inside tqbridge, or None where
        ``method`` is not ``register(tqbridge(inner))`` (then wrap it whole)."""
        bridge_layer: Any = getattr(method, "__wrapped__", None)
        arguments = getattr(method, self.attribute, None)
        if (
            self.tqbridge_code is None
            or getattr(method, "__code__", None) is not self.register_code
            or getattr(bridge_layer, "__code__", None) is not self.tqbridge_code
            or not isinstance(arguments, dict)
            or not _REGISTER_ARGUMENTS <= arguments.keys()
        ):
            return None
        materialize = inspect.getclosurevars(method).nonlocals.get("materialize_futures", True)
        return self.register(
            dispatch_mode=arguments["dispatch_mode"],
            execute_mode=arguments["execute_mode"],
            blocking=arguments["blocking"],
            materialize_futures=materialize,
        )(wrap(bridge_layer.__wrapped__))
