"""Which failure came first, and why the others count as its cascade.

When one rank dies, its peers fail after it in ways that only say a peer is
gone: a collective raises (gloo's "Connection closed by peer", an NCCL
error, a timeout), a stage waits in a collective past its deadline, a
launcher (torchrun, Ray) sends the survivors SIGTERM and then SIGKILL.
So:

* **consequences** by their kind: an exception whose type or message has one
  of :data:`PEER_WORDS`, a hang waiting in a ``torch.distributed`` call;
* **consequences** by their order too: a launcher's SIGTERM (SIGINT,
  SIGHUP), or the driver's error, after another failure; a process with no
  stage open past its deadline (``stall``) after another failure: it waited
  for work the failure stopped;
* **consequences** by their kind: a process with no stage open waiting in
  ``ray.get`` or ``ray.wait`` (a stall), for another process's task; a killed
  process whose task had raised a dead actor's error, or passed on another
  process's exception (it outlived that failure);
* **the first failure** is the earliest one that is not a consequence (a
  rank SIGKILLed first counts from its last heartbeat, which is before its
  death and so before anything its death caused; but a failure of another
  kind within one beat after that heartbeat may have come first, and is
  preferred); when every failure is a consequence, the earliest; but when
  every one is a stall waiting on a Ray task, the process that went idle last:
  ``main_ppo`` waits on the driver, which waits on the tasks it started, so
  the last to go idle is the deepest in that chain;
* **the cascade** is every other failure of the run, each with why.

Anomalies are findings, not deaths: the first of them is "first" only in a
run where nothing failed.  So is a stage that passed its deadline and then
ended after all (``slow``): the watchdog was right to report it, but it held
nothing up for good.  The verdict is the causes': ``failed`` (one of them an
exception, a signal, a rank killed), ``hung`` (a deadline passed and the
stage never ended; what died after it follows from it: the rank the watchdog
ended with ``action: abort``, whose heartbeat says so, and those a launcher
then stopped; or no process had a stage open past its deadline and none
began one again: a ``stall``), ``anomalous`` (anomalies or slow stages only),
``running`` (nothing went wrong yet, and a rank still beats), ``healthy``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from ..read.evidence import LAUNCHER_SIGNALS, Failure
from ..read.ranks import DRIVER_RANK
from ..read.record import NO_RANK

__all__ = ["PEER_WORDS", "Verdict", "judge"]

#: Words of an exception raised because a peer went away (type and message, case-insensitive),
#: each with what it is, in the order they are looked for.
PEER_WORDS = (
    (
        re.compile(r"connection closed|connection reset|broken pipe|closed by (peer|remote)", re.I),
        "a closed connection",
    ),
    (re.compile(r"timed out|timeout|watchdog caught", re.I), "a collective timeout"),
    (re.compile(r"nccl|gloo|hccl|distbackenderror|process ?group|collective|rendezvous", re.I), "a gloo/NCCL error"),
    (re.compile(r"ActorDiedError|RayActorError|WorkerCrashedError|actor died", re.I), "a dead Ray actor"),
)
_DEATHS = ("exception", "oom", "signal", "killed")
#: Failures that are findings: they never make a run failed or hung (see the module docstring).
FINDINGS = ("anomaly", "slow")
_FINDING = {"anomaly": "anomaly", "slow": "slow stage"}


@dataclass(slots=True)
class Verdict:
    """The verdict, the first failure and the cascade (each with why it follows)."""

    verdict: str
    first: Failure | None
    cascade: list[tuple[Failure, str]] = field(default_factory=list)
    #: The last finding (anomaly, slow stage) on the first failure's rank before it: what
    #: may have foretold it (a NaN a step before a crash).
    before: Failure | None = None


def _peer_words(failure: Failure) -> str | None:
    """What makes ``failure`` a consequence by its kind, or None."""
    if failure.kind == "exception":
        for words, what in PEER_WORDS:
            if words.search(failure.detail):
                return f"{what}, an error that follows a peer's death"
    if failure.kind == "hang" and failure.waiting_in:
        return f"waiting for its peers in {failure.waiting_in}"
    if failure.kind == "stall" and failure.waiting_in:
        on = "its peers" if failure.waiting_in.startswith("torch") else "another process's task"
        return f"waiting for {on} in {failure.waiting_in}"
    return None


def _follows(failure: Failure, fatal: list[Failure]) -> bool:
    """Whether ``failure`` is a consequence: by its words, or a launcher's signal or the driver's
    error that came after another failure (a launcher stops the survivors; the driver reports)."""
    if _peer_words(failure) is not None or failure.outlived:
        return True
    if failure.kind == "stall" and any(other.time < failure.time for other in fatal if other.kind != "stall"):
        return True
    reporter = (failure.kind == "signal" and failure.detail in LAUNCHER_SIGNALS) or failure.rank < 0
    return reporter and any(other.time < failure.time for other in fatal if other is not failure)


def judge(failures: list[Failure], running: bool = False) -> Verdict:
    """The verdict over ``failures`` (see the module docstring); ``running``: some rank's
    heartbeat is alive and not closed, so a run with no failure yet is ``running``."""
    fatal = sorted((f for f in failures if f.kind not in FINDINGS), key=lambda f: (f.time, f.rank))
    anomalies = sorted((f for f in failures if f.kind in FINDINGS), key=lambda f: (f.time, f.rank))
    if not fatal:
        if not anomalies:
            return Verdict("running" if running else "healthy", None)
        return Verdict("anomalous", anomalies[0], [(a, f"a later {_FINDING[a.kind]}") for a in anomalies[1:]])
    causes = [f for f in fatal if not _follows(f, fatal)]
    first = causes[0] if causes else fatal[0]
    if not causes and all(f.kind == "stall" and f.since is not None for f in fatal):
        first = max(fatal, key=lambda f: f.since or 0.0)  # the deepest in a chain of Ray calls
    if first.kind == "killed" and first.window:
        # A killed rank died within ``window`` after its last beat: a failure of another kind in
        # that window may have come first, and it says more than a silent death.
        rival = next((f for f in causes if f.kind != "killed" and f.time <= first.time + first.window), None)
        first = rival or first
    # What the causes were, not what followed: a rank the watchdog ended after its hang
    # (``action: abort``), and the launcher's signals to the others, make a hung run.
    verdict = "failed" if any(f.kind in _DEATHS for f in causes or [first]) else "hung"
    cascade = [(f, _why(f, first)) for f in fatal if f is not first]
    before = [a for a in anomalies if a.rank == first.rank and a.time <= first.time]
    return Verdict(verdict, first, cascade, before[-1] if before else None)


_NOUNS = {
    "exception": "exception",
    "oom": "out-of-memory error",
    "signal": "signal",
    "killed": "death",
    "hang": "hang",
    "stall": "stall",
}


def _owner(rank: int, pid: int | None = None) -> str:
    if rank >= 0:
        return f"rank {rank}'s"
    if rank == DRIVER_RANK:
        return "the driver's"
    return f"process {pid}'s" if pid is not None else "main_ppo's"


def _why(failure: Failure, first: Failure) -> str:
    who = _owner(first.rank, first.pid if first.kind == "stall" else None)
    after = f"{who} {_NOUNS.get(first.kind, first.kind)}"
    later = failure.time >= first.time
    if failure.outlived:
        return f"killed after {after}: it was alive to raise {failure.outlived}"
    if failure.kind == "killed" and failure.window and failure.time <= first.time <= failure.time + failure.window:
        return f"killed within {failure.window:g} s of {after}: which came first cannot be told"
    if failure.rank == first.rank and failure.rank != NO_RANK:
        same = "the same rank" if failure.rank >= 0 else "the same process"
        return f"{same}, {'after' if later else 'before'} its {first.kind}"
    words = _peer_words(failure)
    if words:
        return f"{words}, {'after' if later else 'around'} {after}"
    if failure.kind == "stall" and later:
        return f"no stage open after {after}: waiting for work that never came"
    if failure.kind == "signal" and failure.detail in LAUNCHER_SIGNALS:
        return f"a launcher stopping the survivors ({failure.detail}) after {after}"
    if failure.rank < 0:
        return f"{_owner(failure.rank)} error, after {after}: what the ranks' records explain"
    if failure.kind == "killed":
        return f"killed after {after}: a launcher ending the job, or the same cause"
    return f"later than {after}" if later else f"about when {after} happened"
