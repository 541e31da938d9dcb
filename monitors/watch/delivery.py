"""Alert delivery, by the supervisor (the run owner's own process): the ``[alerts] command`` and
push notifications through apprise URLs (ntfy, Slack, Discord, e-mail, Telegram, a JSON webhook...).

A view never delivers anything: it would run what it read from a run dir with the viewer's rights.

Each alert goes to every channel at or above ``min_level``, each channel in its own worker, so a
hung or failing delivery never delays the exit record or the next alert. Per alert kind, a channel
delivers at most once per ``rate_limit_s`` (W&B waits a minute between identical alerts; a stall
that comes and goes must not ring every time). A push is retried ``retries`` times with back-off
(1 s, 2 s, 4 s ...). Every outcome is appended to ``alerts.jsonl`` as a ``delivery`` record:
``{"v":1, "kind":"delivery", "alert_id", "channel", "outcome", "detail", "attempts", "t"}`` with
``outcome`` one of ``delivered``, ``failed``, ``rate_limited``, ``below_min_level``. A channel is
named without its secrets: ``command``, or the URL's scheme and host (``ntfy://ntfy.sh``).
"""

from __future__ import annotations

import os
import subprocess
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any, Callable

from stepwatch.monitors.runfiles import append_jsonl
from stepwatch.monitors.snapshot.alerts import channel_name

LEVELS = ("info", "warning", "error")
#: The level of each alert kind (stepwatch.monitors.snapshot.alerts): a dead, stuck or silently
#: slowed run is an error; a recompile limit, a storm or an idle tensor core a warning.
KIND_LEVEL = {"watchdog": "error", "stall": "error", "fallback": "error", "recompile_limit": "warning",
              "recompile_storm": "warning", "gpu": "warning"}
DEFAULT_MIN_LEVEL = "warning"
DEFAULT_RATE_LIMIT_S = 60.0
DEFAULT_RETRIES = 3
#: The ``[alerts] command`` is given this long, then killed (a hung notifier never piles up).
COMMAND_TIMEOUT_S = 30.0


def level_of(kind: str) -> str:
    """An alert kind's level (``warning`` for a kind this table does not know)."""
    return KIND_LEVEL.get(kind, "warning")


class Deliverer:
    """Delivers alerts for one attempt. ``submit(alert)`` returns at once; :meth:`wait` (at the
    end of the attempt) waits for what is in flight, bounded."""

    def __init__(self, run_dir: Path, alerts_path: Path, config: dict[str, Any], run_name: str,
                 log: Callable[[str], None] = lambda m: None, sleep: Callable[[float], None] = time.sleep):
        self.run_dir, self.path, self.run_name, self.log, self.sleep = run_dir, alerts_path, run_name, log, sleep
        cmd = config.get("command")
        self.command = list(cmd) if isinstance(cmd, list) and cmd else None
        urls = config.get("urls")
        self.urls = [u for u in urls if isinstance(u, str) and u] if isinstance(urls, list) else []
        lvl = config.get("min_level", DEFAULT_MIN_LEVEL)
        self.min_level = lvl if lvl in LEVELS else DEFAULT_MIN_LEVEL
        rl = config.get("rate_limit_s", DEFAULT_RATE_LIMIT_S)
        self.rate_limit_s = float(rl) if isinstance(rl, (int, float)) and rl >= 0 else DEFAULT_RATE_LIMIT_S
        rt = config.get("retries", DEFAULT_RETRIES)
        self.retries = int(rt) if isinstance(rt, int) and 0 <= rt <= 10 else DEFAULT_RETRIES
        self._last_sent: dict[tuple[str, str], float] = {}
        self._lock = threading.Lock()
        self._pool = ThreadPoolExecutor(max_workers=4, thread_name_prefix="alert-delivery")
        self._futures: list[Future] = []

    def submit(self, alert: dict[str, Any]) -> None:
        """Deliver ``alert`` ({id, kind, message, ...}) to every channel, each in a worker."""
        level = level_of(str(alert.get("kind")))
        targets: list[tuple[str, Callable[[dict[str, Any]], tuple[bool, str, int]]]] = []
        if self.command:
            targets.append(("command", self._run_command))
        for url in self.urls:
            targets.append((channel_name(url), lambda a, u=url: self._push(u, a)))
        for name, fn in targets:
            if LEVELS.index(level) < LEVELS.index(self.min_level):
                self._record(alert, name, "below_min_level", f"{level} < min_level {self.min_level}", 0)
                continue
            key = (name, str(alert.get("kind")))
            now = time.monotonic()
            with self._lock:
                last = self._last_sent.get(key)
                if last is not None and now - last < self.rate_limit_s:
                    self._record(alert, name, "rate_limited",
                                 f"a {alert.get('kind')} alert went to {name} {now - last:.0f} s ago "
                                 f"(rate_limit_s {self.rate_limit_s:g})", 0)
                    continue
                self._last_sent[key] = now
            self._futures.append(self._pool.submit(self._deliver, alert, name, fn))

    def _deliver(self, alert: dict[str, Any], name: str, fn: Callable[[dict[str, Any]], tuple[bool, str, int]]) -> None:
        try:
            ok, detail, attempts = fn(alert)
        except Exception as e:  # noqa: BLE001 - a broken channel is an outcome, never a crash
            ok, detail, attempts = False, f"{type(e).__name__}: {e}", 1
        self._record(alert, name, "delivered" if ok else "failed", detail, attempts)

    def _record(self, alert: dict[str, Any], channel: str, outcome: str, detail: str, attempts: int) -> None:
        try:
            append_jsonl(self.path, {"v": 1, "kind": "delivery", "alert_id": alert.get("id"), "channel": channel,
                                     "outcome": outcome, "detail": detail[:500], "attempts": attempts,
                                     "t": time.time()})
        except OSError as e:
            self.log(f"could not record the delivery of {alert.get('id')} to {channel}: {e}")
        if outcome == "failed":
            self.log(f"alert {alert.get('id')} not delivered to {channel}: {detail}")

    def _run_command(self, alert: dict[str, Any]) -> tuple[bool, str, int]:
        env = dict(os.environ, STEPWATCH_ALERT_ID=str(alert.get("id")), STEPWATCH_ALERT_KIND=str(alert.get("kind")),
                   STEPWATCH_ALERT_LEVEL=level_of(str(alert.get("kind"))),
                   STEPWATCH_ALERT_MESSAGE=str(alert.get("message")), STEPWATCH_RUN=self.run_name,
                   STEPWATCH_RUN_DIR=str(self.run_dir))
        try:
            p = subprocess.run(self.command, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                               stderr=subprocess.PIPE, timeout=COMMAND_TIMEOUT_S, start_new_session=True)
        except subprocess.TimeoutExpired:
            return False, f"the command ran over {COMMAND_TIMEOUT_S:g} s and was killed", 1
        except OSError as e:
            return False, f"could not run {self.command[0]!r}: {e}", 1
        if p.returncode == 0:
            return True, "exit code 0", 1
        err = p.stderr.decode("utf-8", "replace").strip().splitlines()
        return False, f"exit code {p.returncode}" + (f": {err[-1][:200]}" if err else ""), 1

    def _push(self, url: str, alert: dict[str, Any]) -> tuple[bool, str, int]:
        import apprise  # noqa: PLC0415 - only a run with push URLs pays for it

        ap = apprise.Apprise()
        if not ap.add(url):
            return False, f"apprise does not understand the URL ({channel_name(url)})", 0
        level = level_of(str(alert.get("kind")))
        ntype = {"error": apprise.NotifyType.FAILURE, "warning": apprise.NotifyType.WARNING}.get(
            level, apprise.NotifyType.INFO)
        title = f"stepwatch {self.run_name}: {alert.get('kind')}"
        delay = 1.0
        for attempt in range(1, self.retries + 2):
            if ap.notify(body=str(alert.get("message")), title=title, notify_type=ntype):
                return True, "accepted by the endpoint", attempt
            if attempt <= self.retries:
                self.sleep(delay)
                delay *= 2
        return False, f"the endpoint refused or did not answer, {self.retries + 1} attempts", self.retries + 1

    def wait(self, timeout_s: float) -> bool:
        """Wait for the deliveries in flight, at most ``timeout_s``; True when all finished."""
        deadline = time.monotonic() + timeout_s
        for f in list(self._futures):
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            try:
                f.result(timeout=left)
            except Exception:  # noqa: BLE001 - recorded by _deliver
                pass
        self._pool.shutdown(wait=False, cancel_futures=False)
        return all(f.done() for f in self._futures)
