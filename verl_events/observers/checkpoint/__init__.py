"""Checkpoints you can trust: what each rank saved, whether a resume restored it, and
whether the resumed run trained.

* :mod:`.observer`: :class:`CheckpointObserver`;
* :mod:`.taps`: where a save's and a load's state is seen (torch's save and load, a
  module's ``load_state_dict``, an optimizer's ``__setstate__``);
* :mod:`.contents`: a state, tensor by tensor, fingerprinted (torch);
* :mod:`.judge`: the alarms of a save, a load and the trainer loop's end;
* :mod:`.resume`: where a load came from: the save's manifest, a later complete save;
* :mod:`.record`: the ledger's line (:class:`CheckpointRecord`) and the manifest beside a
  checkpoint's files (standard library only, for ``verl-events checkpoints``);
* :mod:`.ledger`: the ledger read back, a save cut short found (standard library only).
"""

from .observer import CheckpointObserver
from .record import ALARM_KINDS, CHECKPOINT_LOG, Alarm, CheckpointRecord, checkpoint_log_path

__all__ = ["ALARM_KINDS", "CHECKPOINT_LOG", "Alarm", "CheckpointObserver", "CheckpointRecord", "checkpoint_log_path"]
