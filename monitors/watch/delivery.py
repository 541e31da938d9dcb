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
import select
import signal
import subprocess
import threading
import time
from pathlib import Path
from typing import Any
from collections.abc import Callable

from stepwatch.monitors.proctree import HELPER_PIDS, HELPERS_LOCK
from stepwatch.monitors.safechars import one_line
from stepwatch.monitors.snapshot.alerts import channel_name, push_channel_names

LEVELS = ("info", "warning", "error")
#: The level of each alert kind (stepwatch.monitors.snapshot.alerts): a dead, stuck or silently
#: slowed run is an error; a recompile limit, a storm or an idle tensor core a warning.
KIND_LEVEL = {"watchdog": "error", "stall": "error", "fallback": "error", "recompile_limit": "warning",
              "recompile_storm": "warning", "gpu": "warning", "disk_full": "error", "rank_death": "error", "straggler": "warning", "stuck_rank": "error",
              "nonfinite_loss": "error", "job_end": "error", "time_limit": "warning", "supervisor_lost": "error", "frozen": "error"}
DEFAULT_MIN_LEVEL = "warning"
DEFAULT_RATE_LIMIT_S = 60.0
DEFAULT_RETRIES = 3
#: The ``[alerts] command`` is given this long (``command_timeout_s``), then its session is killed
#: (a hung notifier never piles up).
COMMAND_TIMEOUT_S = 30.0


def level_of(kind: str) -> str:
    """An alert kind's level (``warning`` for a kind this table does not know)."""
    return KIND_LEVEL.get(kind, "warning")


def alert_level(alert: dict[str, Any]) -> str:
    """The level a page goes out at: the one it carries when it is one of LEVELS, else its kind's."""
    return alert["level"] if alert.get("level") in LEVELS else level_of(str(alert.get("kind")))


def page_text(alert: dict[str, Any]) -> str:
    """What a page says: its headline (``host · run · STATE · step N/M``, when the supervisor gave one) on the
    first line, the alert's message on the second; each one line of visible characters."""
    headline = alert.get("headline")
    return (f"{one_line(headline)}\n" if headline else "") + one_line(alert.get("message"))


class Deliverer:
    """Delivers alerts for one attempt. ``submit(alert)`` returns at once; :meth:`wait` (at the
    end of the attempt) waits for what is in flight, bounded."""

    def __init__(self, run_dir: Path, record: Callable[[dict[str, Any]], None], config: dict[str, Any], run_name: str,
                 log: Callable[[str], None] = lambda m: None, sleep: Callable[[float], None] = time.sleep):
        """``record`` appends one record to this attempt's alerts.jsonl (raises OSError)."""
        self.run_dir, self._append, self.run_name, self.log, self.sleep = run_dir, record, run_name, log, sleep
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
        ct = config.get("command_timeout_s", COMMAND_TIMEOUT_S)
        self.command_timeout_s = float(ct) if isinstance(ct, (int, float)) and 0 < ct <= 600 else COMMAND_TIMEOUT_S
        self._last_sent: dict[tuple[str, str], float] = {}
        self._lock = threading.Lock()
        # daemon threads, one per delivery: a hung one never keeps the supervisor alive past wait()
        self._threads: list[threading.Thread] = []

    def submit(self, alert: dict[str, Any]) -> None:
        """Deliver ``alert`` ({id, kind, message, ...}) to every channel, each in a worker. Its ``level`` is its
        kind's unless it carries one (a resolution: the level of what it resolves); ``wanted`` (a finished page the
        run's [alerts] table asked for) passes min_level."""
        level = alert_level(alert)
        targets: list[tuple[str, Callable[[dict[str, Any]], tuple[bool, str, int]]]] = []
        if self.command:
            command = self.command
            targets.append(("command", lambda a: self._run_command(command, a)))
        for name, url in zip(push_channel_names(self.urls), self.urls):  # one rate limit per URL, never per host
            targets.append((name, lambda a, u=url: self._push(u, a)))
        for name, fn in targets:
            if LEVELS.index(level) < LEVELS.index(self.min_level) and not alert.get("wanted"):
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
            th = threading.Thread(target=self._deliver, args=(alert, name, fn), name=f"deliver-{name}", daemon=True)
            self._threads.append(th)
            th.start()

    def _deliver(self, alert: dict[str, Any], name: str, fn: Callable[[dict[str, Any]], tuple[bool, str, int]]) -> None:
        try:
            ok, detail, attempts = fn(alert)
        except Exception as e:  # noqa: BLE001 - a broken channel is an outcome, never a crash
            ok, detail, attempts = False, f"{type(e).__name__}: {e}", 1
        self._record(alert, name, "delivered" if ok else "failed", detail, attempts)

    def _record(self, alert: dict[str, Any], channel: str, outcome: str, detail: str, attempts: int) -> None:
        try:
            self._append({"v": 1, "kind": "delivery", "alert_id": alert.get("id"), "channel": channel,
                                     "outcome": outcome, "detail": detail[:500], "attempts": attempts,
                                     "t": time.time()})
        except OSError as e:
            self.log(f"could not record the delivery of {alert.get('id')} to {channel}: {e}")
        if outcome == "failed":
            self.log(f"alert {alert.get('id')} not delivered to {channel}: {detail}")

    def _run_command(self, command: list[str], alert: dict[str, Any]) -> tuple[bool, str, int]:
        env = dict(os.environ, STEPWATCH_ALERT_ID=str(alert.get("id")), STEPWATCH_ALERT_KIND=str(alert.get("kind")),
                   STEPWATCH_ALERT_LEVEL=alert_level(alert),
                   STEPWATCH_ALERT_MESSAGE=page_text(alert),
                   STEPWATCH_ALERT_HEADLINE=one_line(alert.get("headline") or ""), STEPWATCH_RUN=one_line(self.run_name),
                   STEPWATCH_RUN_DIR=str(self.run_dir))
        try:
            with HELPERS_LOCK:  # the supervisor's own helper, never a process of the run's tree
                p = subprocess.Popen(command, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                     stderr=subprocess.PIPE, start_new_session=True)
                HELPER_PIDS.add(p.pid)
        except OSError as e:
            return False, f"could not run {command[0]!r}: {e}", 1
        try:
            rc, tail = _wait_bounded(p, self.command_timeout_s)
        finally:
            with HELPERS_LOCK:
                HELPER_PIDS.discard(p.pid)
        if rc is None:
            return False, f"the command ran over {self.command_timeout_s:g} s: its session was killed", 1
        if rc == 0:
            return True, "exit code 0", 1
        err = tail.decode("utf-8", "replace").strip().splitlines()
        return False, f"exit code {rc}" + (f": {err[-1][:200]}" if err else ""), 1

    def _push(self, url: str, alert: dict[str, Any]) -> tuple[bool, str, int]:
        import apprise  # noqa: PLC0415 - only a run with push URLs pays for it

        ap = apprise.Apprise()
        if not ap.add(url):
            return False, f"apprise does not understand the URL ({channel_name(url)})", 0
        level = alert_level(alert)
        ntype = {"error": apprise.NotifyType.FAILURE, "warning": apprise.NotifyType.WARNING}.get(
            level, apprise.NotifyType.INFO)
        title = one_line(f"stepwatch {self.run_name}: {alert.get('kind')}")  # a phone shows no control, bidi or
        # zero-width character a run dir held: each is a visible stand-in (monitors/safechars.py)
        delay = 1.0
        for attempt in range(1, self.retries + 2):
            if ap.notify(body=page_text(alert), title=title, notify_type=ntype):
                return True, "accepted by the endpoint", attempt
            if attempt <= self.retries:
                self.sleep(delay)
                delay *= 2
        return False, f"the endpoint refused or did not answer, {self.retries + 1} attempts", self.retries + 1

    def wait(self, timeout_s: float) -> bool:
        """Wait for the deliveries in flight, at most ``timeout_s`` in all; True when all finished
        (the rest are daemon threads: they end with the supervisor)."""
        deadline = time.monotonic() + timeout_s
        for th in list(self._threads):
            th.join(max(0.0, deadline - time.monotonic()))
        return not any(th.is_alive() for th in self._threads)


#: Of a command's stderr, only this much of the end is kept (a chatty notifier costs no memory).
STDERR_TAIL_BYTES = 4096


def _wait_bounded(p: subprocess.Popen, timeout_s: float) -> tuple[int | None, bytes]:
    """Wait for ``p`` at most ``timeout_s``, reading its stderr as it comes and keeping only the
    last STDERR_TAIL_BYTES. On timeout its whole session is SIGKILLed (a notifier's own children
    included) and the return code is None."""
    deadline = time.monotonic() + timeout_s
    tail = b""
    fd = p.stderr.fileno() if p.stderr is not None else None
    while fd is not None:
        left = deadline - time.monotonic()
        if left <= 0:
            break
        r, _, _ = select.select([fd], [], [], min(left, 0.5))
        if r:
            chunk = os.read(fd, 65536)
            if not chunk:
                break  # EOF: the command (and everything holding its stderr) is done writing
            tail = (tail + chunk)[-STDERR_TAIL_BYTES:]
    try:
        rc = p.wait(timeout=max(0.0, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
        rc = None
    if rc is None:
        try:
            os.killpg(p.pid, signal.SIGKILL)
        except OSError:
            pass
        p.wait()
    if p.stderr is not None:
        p.stderr.close()
    return rc, tail
