"""Keeping Ctrl-C a Ctrl-C while observers are imported, built and set up.

Setting an observer up imports its tool, and a KeyboardInterrupt that lands
in the middle of an import does not always come out as one: a library that
catches BaseException around an import raises an ImportError instead, a
package left half-initialised fails its next import with a KeyError, and a
bare ``except:`` may swallow the interrupt outright.  The registry's guard
would then report a failed observer (or an optional one would be switched
off) and the run would go on.  Guessing from exception types cannot tell
those apart from a real failure; the SIGINT handler can.  So, for the
duration of :func:`keeping_interrupts`, the current handler is wrapped to
note when it raises KeyboardInterrupt, and the interrupt is raised again
when the block ends, whatever became of it inside.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType
from typing import Any

from verl_events.events.process import PROCESS


class _SigintWatch:
    """Wraps the SIGINT handler that was in place; notes the interrupts it raised."""

    def __init__(self, previous: Any) -> None:
        self.previous = previous
        self.watching = True
        self.interrupted = False

    def __call__(self, signum: int, frame: FrameType | None) -> Any:
        try:
            return self.previous(signum, frame)
        except KeyboardInterrupt:
            # Only while watching: another handler may have chained to this one
            # during set-up (the watchdog does), and then it stays in the chain.
            self.interrupted = self.interrupted or self.watching
            raise


@contextmanager
def keeping_interrupts(what: str) -> Iterator[None]:
    """Run the block; if SIGINT raised KeyboardInterrupt during it, the block
    ends by KeyboardInterrupt, even when the interrupt surfaced inside as
    another exception or was swallowed.  ``what`` says what the block was
    doing ("setting the observers up"), for the interrupt's message.

    The handler in place is put back at the end, unless something installed
    its own handler meanwhile (which may chain to ours: ours then only passes
    the signal on, and :func:`put_back_handlers` puts the original back once
    that handler has put ours back).  Outside the main thread, or when SIGINT is ignored or
    left to the operating system, nothing is wrapped: no KeyboardInterrupt
    can come from it there.
    """
    previous = signal.getsignal(signal.SIGINT)
    if threading.current_thread() is not threading.main_thread() or not callable(previous):
        yield
        return
    watch = _SigintWatch(previous)
    signal.signal(signal.SIGINT, watch)
    try:
        yield
    except KeyboardInterrupt:
        raise
    except BaseException as exc:
        if watch.interrupted:
            raise KeyboardInterrupt(f"interrupted while {what} (it surfaced as {type(exc).__name__}: {exc})") from exc
        raise
    finally:
        watch.watching = False
        if signal.getsignal(signal.SIGINT) is watch:
            signal.signal(signal.SIGINT, previous)
        else:
            # Left in the SIGINT chain: a handler set during set-up chains to it (the
            # watchdog's); put_back_handlers removes it once that handler is gone.
            PROCESS.sigint_watches.append(watch)
    if watch.interrupted:
        raise KeyboardInterrupt(f"interrupted while {what} (the interrupt was caught and dropped there)")


def put_back_handlers() -> None:
    """Where a handler that chained to a watch has since put the watch back
    (the watchdog does when it closes), put back the handler the watch wrapped,
    so that after uninstall the user's own handler is in place again."""
    if threading.current_thread() is not threading.main_thread():
        return
    watch: _SigintWatch
    for watch in reversed(PROCESS.sigint_watches):
        if signal.getsignal(signal.SIGINT) is watch:
            signal.signal(signal.SIGINT, watch.previous)
            PROCESS.sigint_watches.remove(watch)
