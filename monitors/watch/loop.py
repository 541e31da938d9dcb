"""The supervisor's monitoring: it watches the run whether or not any screen is open.

Run by :mod:`stepwatch.launcher.supervisor` for one attempt, in two threads of its own:

- **the log timer** follows ``train.log`` from its first byte (change notice plus the follower's
  poll) and appends log-derived step records to ``logsteps.jsonl`` as the bytes arrive
  (:mod:`stepwatch.monitors.watch.logsteps`);
- **the detector loop** refreshes a :class:`RunObserver` of the run dir about once a second, the
  same code every view runs (death, fallback, stall, recompile limit and storm, GPU), appends each
  new alert once to ``alerts.jsonl`` and hands it to the :class:`Deliverer` (the ``[alerts]``
  command and push URLs, as the run's owner).

``alerts.jsonl`` (per attempt, rotated with the other files): one ``alert`` record per alert,
``{"v":1, "kind":"alert", "id", "alert_kind", "level", "message", "at", "t", "evidence"}``, and
the ``delivery`` records of :mod:`.delivery`. A view reads it (alerts stay until acknowledged, with
what became of each delivery) and adds only what it alone can see.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any, Callable

from stepwatch.monitors.readers.changes import ChangeNotifier
from stepwatch.monitors.readers.textlog import LogFollower
from stepwatch.monitors.runfiles import ALERTS_JSONL, LOG_STEPS_JSONL, TRAIN_LOG, append_jsonl
from stepwatch.monitors.snapshot.model import json_safe
from stepwatch.monitors.snapshot.observer import RunObserver
from stepwatch.monitors.watch.delivery import Deliverer, level_of
from stepwatch.monitors.watch.logsteps import LogStepTimer, append_records

#: The detector loop's period, seconds (alerts reach alerts.jsonl within about this, plus a refresh).
DETECT_EVERY_S = 1.0
#: After the child ended: how long deliveries in flight are waited for before the supervisor exits.
FINAL_DELIVERY_WAIT_S = 40.0


def evidence_of(snap: dict[str, Any], kind: str) -> dict[str, Any]:
    """What the files said when an alert was raised: the step, the step-time summary and the part
    of the snapshot the alert's detector read."""
    ev: dict[str, Any] = {"global_step": (snap.get("step") or {}).get("global_step"),
                          "step_timing": (snap.get("step") or {}).get("timing"),
                          "step_seconds": snap.get("step_seconds")}
    part = {"fallback": "fallback", "stall": "stall", "recompile_limit": "dynamo", "recompile_storm": "dynamo",
            "gpu": "gpu"}.get(kind)
    if part:
        ev[part] = snap.get(part)
    if kind == "watchdog":
        ev.update(returncode=snap.get("returncode"), signal=snap.get("signal"),
                  traceback_last_line=(snap.get("log") or {}).get("traceback_last_line"))
    return json_safe(ev)


class LogTimerThread(threading.Thread):
    """Follows train.log and writes logsteps.jsonl until ``stop`` is set (then reads to the end once)."""

    def __init__(self, run_dir: Path, stop: threading.Event, log: Callable[[str], None]):
        super().__init__(name="log-step-timer", daemon=True)
        self.run_dir, self.stop, self.log = run_dir, stop, log
        self.follower = LogFollower(run_dir / TRAIN_LOG, keep_lines=1, from_start=True)
        self.timer = LogStepTimer()
        self.records = 0

    def _poll(self) -> None:
        while True:
            segs = self.follower.poll()
            recs = self.timer.feed_poll(segs, self.follower.partial_segment)
            if recs:
                append_records(self.run_dir / LOG_STEPS_JSONL, recs)
                self.records += len(recs)
            if not self.follower.behind:
                return

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


def watch_attempt(run_dir: Path, run: dict[str, Any], child_done: threading.Event,
                  log: Callable[[str], None] = lambda m: None) -> None:
    """Watch one attempt until ``child_done`` is set, then record its last alerts and wait (bounded)
    for their delivery. Never raises."""
    stop_log = threading.Event()
    timer = LogTimerThread(run_dir, stop_log, log)
    timer.start()
    config = (run.get("config") or {}).get("alerts") or {}
    deliverer = Deliverer(run_dir, run_dir / ALERTS_JSONL, config if isinstance(config, dict) else {},
                          str(run.get("name") or run_dir.name), log=log)
    observer = RunObserver(run_dir, use_saved_state=False)
    recorded: set[str] = set()

    def detect() -> None:
        snap = observer.refresh()
        for al in snap.get("alerts") or []:
            if al["id"] in recorded or al.get("recorded"):
                recorded.add(al["id"])
                continue
            recorded.add(al["id"])
            rec = {"v": 1, "kind": "alert", "id": al["id"], "alert_kind": al["kind"], "level": level_of(al["kind"]),
                   "message": al["message"], "at": al["at"], "t": time.time(), "evidence": evidence_of(snap, al["kind"])}
            try:
                append_jsonl(run_dir / ALERTS_JSONL, rec)
            except (OSError, ValueError) as e:
                log(f"could not record alert {al['id']}: {e}")
            deliverer.submit(al)

    try:
        while not child_done.is_set():
            try:
                detect()
            except Exception as e:  # noqa: BLE001 - a detector bug must not end the watching
                log(f"detector loop: {type(e).__name__}: {e}")
            child_done.wait(DETECT_EVERY_S)
        stop_log.set()
        timer.join(10.0)
        try:
            detect()  # the end: the watchdog's verdict, the log's last steps
        except Exception as e:  # noqa: BLE001
            log(f"detector loop (final): {type(e).__name__}: {e}")
        if not deliverer.wait(FINAL_DELIVERY_WAIT_S):
            log(f"deliveries still in flight after {FINAL_DELIVERY_WAIT_S:g} s; leaving them")
    except Exception as e:  # noqa: BLE001
        log(f"watching stopped: {type(e).__name__}: {e}")
