"""Readers of a run dir's files: events.jsonl (jsonl), train.log (textlog), rank prefixes."""
