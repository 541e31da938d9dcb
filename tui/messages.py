"""Messages the app's workers post to the UI thread (workers never touch widgets)."""

from __future__ import annotations

from textual.message import Message

from stepwatch.monitors.snapshot.types import Snapshot


class HomeRow(Snapshot):
    """A run's snapshot as the home screen lists it: with ``_open_alerts``, its alerts not
    acknowledged yet (this view's own key, never in ``status --json``)."""

    _open_alerts: int


class SnapshotReady(Message):
    """A fresh status snapshot of the attached run, plus the log lines that arrived since the last one.

    Built from :class:`~stepwatch.monitors.snapshot.observer.ViewUpdate`. ``log_lines``: complete
    lines, oldest first; ``log_partial``: the current unfinished line (a progress bar), or None;
    ``log_reset``: clear the panel first; ``attempt_changed``: run.json names a new attempt.
    """

    def __init__(self, snapshot: Snapshot, log_lines: list[str], log_partial: str | None, log_reset: bool,
                 attempt_changed: bool = False):
        super().__init__()
        self.attempt_changed = attempt_changed
        self.snapshot = snapshot
        self.log_lines = log_lines
        self.log_partial = log_partial
        self.log_reset = log_reset


class RunsListed(Message):
    """The home screen's rows: one snapshot per run under the runs dir."""

    def __init__(self, rows: list[HomeRow]):
        super().__init__()
        self.rows = rows


class ActionDone(Message):
    """A launch / relaunch / stop finished in a worker: ``ok`` and the text to show."""

    def __init__(self, action: str, ok: bool, text: str, run_dir: str | None = None):
        super().__init__()
        self.action = action
        self.ok = ok
        self.text = text
        self.run_dir = run_dir
