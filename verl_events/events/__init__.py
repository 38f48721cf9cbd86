"""The event vocabulary: the stage records, the bus's signals, anomaly and hang, the
Observer contract and its Writes declaration, the errors; and what this process remembers
between calls (:mod:`.process`)."""
