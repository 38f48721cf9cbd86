"""verl-events mismatch."""
