"""The status snapshot: the observer that reads one run dir, alert wording, acknowledgements."""
