"""Armed capture and replay: what observers capture after an anomaly."""
