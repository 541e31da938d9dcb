"""The supervisor's log timer: it follows ``train.log`` from its first byte (change notice plus the follower's poll) and
appends log-derived step records to ``logsteps.jsonl`` (and each other rank's to ``logsteps.rank<N>.jsonl``) as the
bytes arrive (:mod:`.logsteps`); the step that ends a stretch the detector loop saw stopped, stalled, busy but silent,
saving or evaluating carries its flag (:class:`LivenessFlags`)."""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from stepwatch.monitors.parsers.logtracker import LogTracker
from stepwatch.monitors.protocol import FLAG_EVAL, FLAG_IDLE, FLAG_SAVE, FLAG_SILENT, FLAG_STOPPED
from stepwatch.monitors.readers.changes import ChangeNotifier
from stepwatch.monitors.readers.textlog import LogFollower
from stepwatch.monitors.runfiles import LOG_STEPS_JSONL, TRAIN_LOG, rank_log_steps_name
from stepwatch.monitors.runsettings import RunSettings
from stepwatch.monitors.snapshot.types import Snapshot
from stepwatch.monitors.states import EVALUATING, FLAGGED, SAVING, STALLED, SUSPECTED
from stepwatch.monitors.watch.attemptfile import AttemptFile
from stepwatch.monitors.watch.logsteps import TIMING_REPORTED, LogStepTimer, RankLogTimers, encode_records


class LivenessFlags:
    """What the detector loop saw of the run's liveness since the log timer's last step record: the flags of
    the interval the next record closes (``stopped``, ``idle``, ``silent``, and ``save`` or ``eval`` for a phase the
    stacks showed: monitors/protocol.py)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._flags: set[str] = set()

    def note(self, snap: Snapshot) -> None:
        stall = snap["stall"].get("state")
        frozen = ((snap.get("liveness") or {}).get("frozen") or {}).get("state")
        seen = {FLAG_SILENT} if stall == SUSPECTED else {FLAG_IDLE} if stall == STALLED else set()
        seen |= {FLAG_STOPPED} if frozen == FLAGGED else set()
        phase = (snap.get("phase") or {}).get("name")  # a save or evaluation the stacks showed: booked as one
        seen |= {FLAG_SAVE} if phase == SAVING else {FLAG_EVAL} if phase == EVALUATING else set()
        if seen:
            with self._lock:
                self._flags |= seen

    def take(self) -> list[str]:
        with self._lock:
            flags, self._flags = sorted(self._flags), set()
        return flags


class LogTimerThread(threading.Thread):
    """Follows train.log and writes logsteps.jsonl until ``stop`` is set (then reads to the end once); the
    step that ends a stretch the detector loop saw stopped, stalled or busy but silent carries its flag."""

    def __init__(self, run_dir: Path, stop: threading.Event, log: Callable[[str], None], run: dict[str, Any],
                 liveness: LivenessFlags | None = None):
        super().__init__(name="log-step-timer", daemon=True)
        self.run_dir, self.stop, self.log = run_dir, stop, log
        self.liveness = liveness or LivenessFlags()
        self.out = AttemptFile(run_dir / LOG_STEPS_JSONL, log)
        self.follower = LogFollower(run_dir / TRAIN_LOG, keep_lines=1, from_start=True)
        own = RunSettings.of_run(run)  # the supervisor's own record, never run.json re-read
        patterns, settings = list(own.patterns), own.log  # [log] patterns; max_steps, epochs, logging_steps
        resumed = run.get("resumed_from")  # the restart policy resumed this attempt from a checkpoint of that step
        resume_step = resumed.get("step") if isinstance(resumed, dict) and type(resumed.get("step")) is int else None
        self.timer = LogStepTimer(LogTracker(patterns, settings), resume_step=resume_step)
        self.rank_timers = RankLogTimers(patterns, settings)  # each other rank's prefixed lines: logsteps.rank<N>.jsonl
        self.rank_out: dict[int, AttemptFile] = {}
        self.records = 0

    def _poll(self) -> None:
        while True:
            segs = self.follower.poll()
            partial = self.follower.partial_segment
            recs = self.timer.feed_poll(segs, partial)
            if recs and (held := self.liveness.take()):  # the interval these steps close held it
                for i, r in enumerate(recs):
                    if i == 0 or r["timing"] != TIMING_REPORTED:  # a step with its own time: the first alone
                        r["flags"] = [*r["flags"], *held]
            self._append(self.out, recs)
            for rank, rank_recs in self.rank_timers.feed_poll(segs, partial).items():
                if rank not in self.rank_out:
                    self.rank_out[rank] = AttemptFile(self.run_dir / rank_log_steps_name(rank), self.log)
                self._append(self.rank_out[rank], rank_recs)
            if not self.follower.behind:
                return

    def _append(self, out: AttemptFile, recs: list[dict[str, Any]]) -> None:
        if not recs:
            return
        try:
            out.append(encode_records(recs))
            self.records += len(recs)
        except OSError as e:
            self.log(f"log steps not recorded: {e}")

    def run(self) -> None:
        try:
            notifier = ChangeNotifier(self.run_dir, names={TRAIN_LOG}, stop_event=self.stop, tick_s=1.0,
                                      on_notice=self.log)
            self._poll()
            for _ in notifier:
                self._poll()
                if self.stop.is_set():
                    break
            self._poll()  # the child has ended: its last bytes
        except Exception as e:  # noqa: BLE001 - never take the supervisor down
            self.log(f"log step timer stopped: {type(e).__name__}: {e}")
        finally:
            self.follower.close()
            for out in (self.out, *self.rank_out.values()):
                out.close()
