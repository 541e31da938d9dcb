"""The run screen: one attempt's health at a glance, rebuilt from the run dir's files alone.

The screen reads no file itself: its :class:`RunObserver` is the one reader (one descriptor per
file), and a worker thread posts what each refresh brought (the snapshot, new log lines, an
attempt change; acknowledged alerts are marked in the snapshot) as one message per refresh; the screen re-arms its timer only after a refresh was drawn (a slow poll never overlaps
the next one). Widgets update only when their text changed.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from textual import work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.screen import Screen
from textual.widgets import Footer, Static
from textual.worker import Worker, WorkerState

from stepwatch.monitors.readers.loglines import ERROR_RE, literal
from stepwatch.monitors.snapshot.observer import RunObserver
from stepwatch.monitors.snapshot.model import null_snapshot
from stepwatch.monitors.snapshot.types import Alert, Ended, Log, Snapshot
from stepwatch.monitors.states import RUNNING
from stepwatch.tui.messages import SnapshotReady
from stepwatch.tui.safe import safe_text
from stepwatch.tui.widgets.dynamo import DynamoPanel
from stepwatch.tui.widgets.gpu import GpuPanel
from stepwatch.tui.widgets.alertbanner import AlertBanner
from stepwatch.tui.widgets.header import RestartLine, RunHeader, SupervisorGone
from stepwatch.tui.widgets.identity import IdentityPanel
from stepwatch.tui.screens.modals import AlertDetails, Prompt
from stepwatch.tui.widgets.logpanel import WINDOW_LINES, LogPanel
from stepwatch.tui.widgets.steps import StepPanel

if TYPE_CHECKING:
    from stepwatch.tui.appbase import StepwatchAppBase

REFRESH_S = 1.0
#: Lines the panel holds in tail mode (as compose gives it) and refills with when following again.
TAIL_LINES = 1000
#: A terminal shorter than this is short: the panels above the log give up lines so that it keeps 6 (80x24).
SHORT_ROWS = 40
LOW_BANDWIDTH_PANEL_S = 5.0


def _age(seconds: float) -> str:
    """3 s / 4 min / 2.5 h: coarse on purpose, so the title changes rarely (bytes on a slow link)."""
    if seconds < 60:
        return f"{seconds:.0f} s"
    if seconds < 3600:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


def open_alerts(snap: Snapshot) -> list[Alert]:
    """The snapshot's alerts not acknowledged yet, oldest first."""
    alerts: list[Alert] = snap["alerts"]
    return [a for a in alerts if not a["acknowledged"]]


class RunScreen(Screen):
    """The attached run. Keys: r relaunch, x stop, a acknowledge, i identity, b low bandwidth, u update."""

    if TYPE_CHECKING:
        app: StepwatchAppBase  # the App this screen runs in (Textual types it as any App)

    BINDINGS = [
        Binding("r", "app.relaunch", "relaunch"),
        Binding("x", "app.stop_run", "stop"),
        Binding("a", "ack", "ack"),
        Binding("i", "toggle_identity", "ident"),
        Binding("b", "toggle_bandwidth", "low-bw"),
        Binding("u", "update_now", "update", show=False),
        Binding("h", "app.home", "home"),
        Binding("d", "alert_details", "alert details", show=False),
        Binding("slash", "search", "search", show=False),
        Binding("n", "match(True)", "next match", show=False),
        Binding("N", "match(False)", "previous match", show=False),
        Binding("e", "error(True)", "next error", show=False),
        Binding("E", "error(False)", "previous error", show=False),
        Binding("F", "filter", "filter", show=False),
        Binding("f,end", "follow", "follow", show=False, priority=True),
        Binding("z", "zoom", "log full screen", show=False),
        Binding("w", "wrap", "wrap long lines", show=False),
        Binding("g", "loss_scale", "loss plot log scale", show=False),
    ]

    def __init__(self, run_dir: Path):
        super().__init__()
        self.run_dir = Path(run_dir)
        self.observer = RunObserver(self.run_dir)
        #: the latest snapshot (a run with no files until the first refresh)
        self.snap: Snapshot = null_snapshot()
        self.seen_alerts: set[str] = set()  # alerts this screen has rung the bell for
        self._pending_lines: list[str] = []
        self._pending_reset = False
        self._pending_attempt = False  # the reset is a new attempt's (a relaunch), not a burst of lines
        self._last_panel_t = 0.0
        self._closed = False
        self._shown_state: Any = None  # the run state the panels last showed
        self._partial_shown: str | None = None  # the unfinished line last shown
        self._search: Any = None  # the last search's pattern, and its text
        self._search_text = ""
        self._zoomed = False

    def compose(self) -> ComposeResult:
        yield RunHeader(f" {self.run_dir.name}  reading the run's files ...", id="header")
        yield SupervisorGone("", id="supervisor-gone")
        yield RestartLine("", id="restart")
        yield AlertBanner("", id="banner")
        yield StepPanel(id="steps")
        yield DynamoPanel(id="dynamo")
        yield GpuPanel(id="gpu")
        yield IdentityPanel("", id="identity")
        yield LogPanel(max_lines=TAIL_LINES, id="log", wrap=False, auto_scroll=True)
        yield Static("", id="partial")
        yield Footer()

    def apply_bandwidth(self) -> None:
        """Low-bandwidth mode hides the four sparklines (the costliest cells on a slow link)."""
        self._fit()

    def _fit(self) -> None:
        """Keep the log in view on a short terminal (styles.tcss ``RunScreen.short``): under SHORT_ROWS rows the GPU
        and dynamo panels shrink, and while a banner or the supervisor-gone line shows, the step plots give way."""
        short = 0 < self.size.height < SHORT_ROWS
        self.set_class(short, "short")
        told = any(self.query_one(w).display for w in (AlertBanner, SupervisorGone, RestartLine))
        for plots in self.query("StepPanel .plots"):
            plots.display = not self.app.low_bandwidth and not (short and told)

    def on_resize(self) -> None:
        self._fit()

    def on_mount(self) -> None:
        self.apply_bandwidth()
        self.query_one(AlertBanner).display = False
        self.query_one(SupervisorGone).display = False
        self.query_one(RestartLine).display = False
        self._poll_files()

    def on_unmount(self) -> None:
        self._closed = True

    def poll_soon(self) -> None:
        """After an action on this run (a relaunch): refresh now; the observer sees the new
        attempt in run.json and the update says so (the panels start over)."""
        self.set_timer(0.05, self._poll_files)

    @work(thread=True, exclusive=True, exit_on_error=False, group="refresh")
    def _poll_files(self) -> None:
        u = self.observer.view_update()
        self.post_message(SnapshotReady(u.snapshot, u.log_lines, u.log_partial, u.log_reset, u.attempt_changed))

    def on_worker_state_changed(self, event: Worker.StateChanged) -> None:
        """A refresh that raised: say so once on screen and keep polling (the run is untouched)."""
        if event.worker.group == "refresh" and event.state == WorkerState.ERROR:
            self.notify(f"reading the run's files failed: {event.worker.error!r}", severity="error", timeout=10)
            if not self._closed:
                self.set_timer(REFRESH_S, self._poll_files)

    def on_snapshot_ready(self, msg: SnapshotReady) -> None:
        if self._closed:
            return
        if msg.attempt_changed:  # relaunched, here or elsewhere: show only the new attempt
            self._pending_lines = []
            self._pending_attempt = True
            self.seen_alerts.clear()
        self.snap = msg.snapshot
        self._pending_lines.extend(msg.log_lines)
        self._pending_reset = self._pending_reset or msg.log_reset
        low = self.app.low_bandwidth
        now = time.monotonic()
        panels_due = not low or now - self._last_panel_t >= LOW_BANDWIDTH_PANEL_S
        self._show_alerts(msg.snapshot)  # alerts always at once, and a supervisor gone
        self.query_one(SupervisorGone).show(msg.snapshot)
        self.query_one(RestartLine).show(msg.snapshot)
        self._fit()
        state_changed = msg.snapshot["state"] != self._shown_state
        if panels_due or state_changed:
            # In low-bandwidth mode everything but alerts (and a change of state) waits for the
            # 5-second tick; the sparklines are left out there (each bar carries its own colour).
            self._shown_state = msg.snapshot["state"]
            self.query_one(RunHeader).show(msg.snapshot)
            self.query_one(StepPanel).show(msg.snapshot, plots=not low)
            self.query_one(DynamoPanel).show(msg.snapshot)
            self.query_one(GpuPanel).show(msg.snapshot, plots=not low)
            self.query_one(IdentityPanel).show(msg.snapshot)
            self._flush_log(msg.log_partial)
            self._log_title(msg.snapshot)  # after the flush: it counts the lines held while scrolled up
            self._last_panel_t = now
        self.set_timer(REFRESH_S, self._poll_files)

    def _log_title(self, snap: Snapshot) -> None:
        """The log panel's title: which file, and how long ago its last byte arrived."""
        log: Log = snap["log"]
        end: Ended | None
        age, name = log["last_byte_age_s"], log["file"] or "train.log"
        if snap["state"] != RUNNING:
            ended = end["ended_at"] if (end := snap["ended"]) is not None else None
            title = f"{name} · run ended {ended}" if ended else f"{name} · run not running"
        elif age is None:
            title = f"{name} · no bytes yet"
        else:
            title = f"{name} · last byte {_age(age)} ago"
        panel = self.query_one(LogPanel)
        if panel.mode == "browse":
            title = f"{name} · {panel.label} · NOT FOLLOWING (f or End follows)"
        elif not panel.following:
            title += " · NOT FOLLOWING (f or End follows)" + (
                f" · {panel.held_count:,} new line{'s' if panel.held_count != 1 else ''}" if panel.held_count else "")
        if panel.border_title != title:
            panel.border_title = title

    def _flush_log(self, partial: str | None) -> None:
        if self._pending_lines or self._pending_reset:
            self.query_one(LogPanel).add_lines(self._pending_lines, reset=self._pending_reset,
                                               new_attempt=self._pending_attempt)
            self._pending_lines, self._pending_reset, self._pending_attempt = [], False, False
        text = (partial or "")[-200:]
        part = self.query_one("#partial", Static)
        if text != self._partial_shown:
            self._partial_shown = text
            part.update(safe_text(text))

    def _show_alerts(self, snap: Snapshot) -> None:
        alerts = open_alerts(snap)
        self.query_one(AlertBanner).show(alerts)
        new = [a for a in alerts if a["id"] not in self.seen_alerts]
        if not new:
            return
        self.seen_alerts.update(a["id"] for a in new)
        self.app.bell()  # one bell per refresh that brought new alerts, never one per repaint
        newest = new[-1]
        more = f" (+{len(new) - 1} more on the banner)" if len(new) > 1 else ""
        msg = newest["message"] if len(newest["message"]) <= 160 else newest["message"][:157] + "..."
        self.notify(msg + more, title=f"stepwatch: {newest['kind']}", severity="error", timeout=8)

    def action_ack(self) -> None:
        alerts = open_alerts(self.snap)
        if not alerts:
            self.notify("no alert to acknowledge")
            return
        why_session_only = self.observer.acknowledge([a["id"] for a in alerts])
        if why_session_only:  # a read-only run dir
            self.notify(why_session_only, severity="warning")
        for a in alerts:  # as the next snapshot will mark them
            a["acknowledged"] = True
        self.query_one(AlertBanner).show([])
        self._fit()

    def action_alert_details(self) -> None:
        alerts = open_alerts(self.snap)
        if not alerts:
            self.notify("no alert to show")
            return
        self.app.push_screen(AlertDetails(alerts))

    def action_toggle_identity(self) -> None:
        w = self.query_one(IdentityPanel)
        w.display = not w.display

    def action_toggle_bandwidth(self) -> None:
        self.app.low_bandwidth = not self.app.low_bandwidth
        self.apply_bandwidth()
        self.notify(f"low-bandwidth mode {'on: log and plots every 5 s' if self.app.low_bandwidth else 'off'}")

    # --- the log: search, filter, errors, follow, zoom (the whole file, through the observer) ---------
    def action_search(self) -> None:
        def done(text: str | None) -> None:
            if text:
                self._search = literal(text)
                self._search_text = text
                self._find(self._search, f"'{text}'", forward=False, start=None)

        self.app.push_screen(Prompt("search train.log (as typed, any case); n / N: next / previous match"), done)

    def action_match(self, forward: bool) -> None:
        if self._search is None:
            self.notify("no search yet: / searches")
            return
        self._find(self._search, f"'{self._search_text}'", forward, self.query_one(LogPanel).centre)

    def action_error(self, forward: bool) -> None:
        self._find(ERROR_RE, "error", forward, self.query_one(LogPanel).centre)

    def action_filter(self) -> None:
        def done(text: str | None) -> None:
            if text:
                self._filter(literal(text), text)

        self.app.push_screen(Prompt("show only the lines of train.log holding (as typed, any case); f: all again"),
                             done)

    @work(thread=True, exclusive=True, exit_on_error=False, group="logsearch")
    def _find(self, pattern: Any, what: str, forward: bool, start: int | None) -> None:
        ll = self.observer.log_lines
        ll.refresh()
        origin = start if start is not None else ll.last_line + 1
        no = ll.find(pattern, origin, forward)
        if no is None:
            self.app.call_from_thread(self.notify, f"no {what} {'after' if forward else 'before'} line {origin}"
                                      if ll.lines else "the log is empty")
            return
        first, lines = ll.window(no, WINDOW_LINES)
        n_all = ll.count(pattern) if what != "error" else None
        label = (f"{what} at line {no:,} of {ll.last_line:,}" + (f" ({n_all:,} matching lines)" if n_all else ""))
        self.app.call_from_thread(self.query_one(LogPanel).browse, list(enumerate(lines, first)), no, label)
        self.app.call_from_thread(self._log_title, self.snap)

    @work(thread=True, exclusive=True, exit_on_error=False, group="logsearch")
    def _filter(self, pattern: Any, text: str) -> None:
        ll = self.observer.log_lines
        ll.refresh()
        hits = ll.matching(pattern, WINDOW_LINES)
        label = f"filter '{text}': {len(hits):,} line(s)" + (" (the last ones)" if len(hits) == WINDOW_LINES else "")
        self.app.call_from_thread(self.query_one(LogPanel).browse, hits, hits[-1][0] if hits else None, label)
        self.app.call_from_thread(self._log_title, self.snap)

    def action_follow(self) -> None:
        panel = self.query_one(LogPanel)
        if panel.mode == "tail":
            panel.follow_again()
        else:
            self._follow_tail()
        self._log_title(self.snap)

    @work(thread=True, exclusive=True, exit_on_error=False, group="logsearch")
    def _follow_tail(self) -> None:
        ll = self.observer.log_lines
        ll.refresh()
        self.app.call_from_thread(self._refill, ll.lines[-TAIL_LINES:])

    def _refill(self, tail: list[str]) -> None:
        self._pending_lines, self._pending_reset, self._pending_attempt = [], False, False  # the tail holds them
        self.query_one(LogPanel).follow(tail)
        self._log_title(self.snap)

    def action_loss_scale(self) -> None:
        panel = self.query_one(StepPanel)
        panel.log_scale = not panel.log_scale
        panel.show(self.snap, plots=not self.app.low_bandwidth)
        self.notify(f"loss plot: {'log10' if panel.log_scale else 'linear'} scale")

    def action_wrap(self) -> None:
        """``w``: long log lines wrap at the panel's width, or are cut again."""
        self.notify("log: long lines wrap" if self.query_one(LogPanel).toggle_wrap() else "log: long lines cut")

    def action_zoom(self) -> None:
        """The log alone on the screen (and back): the header and the alert banner stay."""
        self._zoomed = not self._zoomed
        for w in self.query("StepPanel, DynamoPanel, GpuPanel"):
            w.display = not self._zoomed

    def action_update_now(self) -> None:
        self._flush_log(None)
        self._last_panel_t = 0.0

