"""Folds of a run's files into state: events.jsonl (events) and the supervisor's saved fold."""
