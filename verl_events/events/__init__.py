"""The event vocabulary: the stage records, the bus's signals, anomaly and hang, the errors."""
