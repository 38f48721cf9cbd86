"""The read side's shared reading: a run folder read once into one :class:`~.record.Evidence`
(:func:`~.evidence.gather`: every failure, whichever tool wrote it), and the readers every
command shares (JSON-lines logs, liveness, ranks, stalls).  No command module is imported here."""
