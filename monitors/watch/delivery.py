"""Alert delivery, by the supervisor (the run owner's own process): the ``[alerts] command`` and
push notifications through apprise URLs (ntfy, Slack, Discord, e-mail, Telegram, a JSON webhook...).

A view never delivers anything: it would run what it read from a run dir with the viewer's rights.

Each alert goes to every channel at or above ``min_level``, each channel in its own worker, so a
hung or failing delivery never delays the exit record or the next alert. Per alert kind, a channel
delivers at most once per ``rate_limit_s`` (W&B waits a minute between identical alerts; a stall
that comes and goes must not ring every time). A push is retried ``retries`` times with back-off
(1 s, 2 s, 4 s ...). Every outcome is appended to ``alerts.jsonl`` as a ``delivery`` record:
``{"v":1, "kind":"delivery", "alert_id", "channel", "outcome", "detail", "attempts", "t"}`` with
``outcome`` one of ``delivered``, ``failed``, ``rate_limited``, ``below_min_level``, ``quiet_hours``,
``digested`` (folded into the channel's next digest page), ``not_asked`` (a finished page this channel was
not listed for), and from the recorder ``pending``, ``not_confirmed`` (:mod:`.paging`) and ``same_cause`` (shown
as the evidence of another alert that is paged: a stall a frozen process causes, :mod:`.lifecycle`). A channel is
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

from stepwatch.monitors import fdreserve
from stepwatch.monitors.proctree import HELPER_PIDS, HELPERS_LOCK
from stepwatch.monitors.safechars import one_line
from stepwatch.monitors.snapshot.alerts import channel_name, push_channel_names
from stepwatch.monitors.watch.paging import LEVELS, digest_words, finished_channels, highest_level, paging_settings_of

#: The level of each alert kind (stepwatch.monitors.snapshot.alerts): a dead, stuck or silently
#: slowed run is an error; a recompile limit, a storm or an idle tensor core a warning.
KIND_LEVEL = {"watchdog": "error", "stall": "error", "fallback": "error", "recompile_limit": "warning",
              "recompile_storm": "warning", "gpu": "warning", "disk_full": "error", "rank_death": "error", "straggler": "warning", "stuck_rank": "error",
              "nonfinite_loss": "error", "loss_spike": "warning", "loss_rise": "error", "loss_catastrophic": "error",
              "job_end": "error", "time_limit": "warning", "supervisor_lost": "error", "frozen": "error",
              "watchers_lost": "error", "restart_missed": "error"}
#: Pages each of which is an event of its own, never rate-limited nor folded into a digest: a death (the run's, a
#: rank's, the job's), the restart policy's decision and its outcome (a STOP, a restart that did not start), the
#: watchers' loss. They count toward the digest window (other pages fold sooner), and go out even past it.
NEVER_FOLDED = frozenset({"watchdog", "rank_death", "job_end", "restart", "restart_missed", "supervisor_lost",
                          "watchers_lost"})
#: The recorder's outcome for an alert shown as the evidence of another one's page (one cause, one page).
SAME_CAUSE = "same_cause"
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
                 log: Callable[[str], None] = lambda m: None, sleep: Callable[[float], None] = time.sleep,
                 clock: Callable[[], float] = time.monotonic,
                 local_minute: Callable[[], int] = lambda: (lambda t: t.tm_hour * 60 + t.tm_min)(time.localtime())):
        """``record`` appends one record to this attempt's alerts.jsonl (raises OSError); ``clock`` (seconds) times
        rate limits and digest windows, ``local_minute`` (0..1439) places quiet hours."""
        self.run_dir, self._append, self.run_name, self.log, self.sleep = run_dir, record, run_name, log, sleep
        self.clock, self.local_minute = clock, local_minute
        self.paging = paging_settings_of(config)
        self.finished_to = finished_channels(config.get("finished"))
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
        self.targets: dict[str, Callable[[dict[str, Any]], tuple[bool, str, int]]] = {}
        if self.command:
            command = self.command
            self.targets["command"] = lambda a: self._run_command(command, a)
        for name, url in zip(push_channel_names(self.urls), self.urls):  # one rate limit per URL, never per host
            self.targets[name] = lambda a, u=url: self._push(u, a)
        self._sent: dict[str, list[float]] = {}  # per channel: when its pages went, this digest window
        self._folded: dict[str, list[dict[str, Any]]] = {}  # per channel: what waits for its digest page
        self._timers: dict[str, threading.Timer] = {}
        self._digests = 0

    def submit(self, alert: dict[str, Any]) -> None:
        """Deliver ``alert`` ({id, kind, message, ...}) to every channel, each in a worker. Its ``level`` is its
        kind's unless it carries one (a resolution: the level of what it resolves); ``wanted`` (a finished page the
        run's [alerts] table asked for) passes min_level, on the channels ``finished`` names."""
        for name, fn in self.targets.items():
            held = self._gate(alert, name)
            if held is not None:
                self._record(alert, name, *held, 0)
                continue
            self._start(alert, name, fn)

    def _gate(self, alert: dict[str, Any], name: str) -> tuple[str, str] | None:
        """Why ``alert`` does not go to channel ``name`` now (outcome, detail), or None: it goes."""
        level, kind = alert_level(alert), str(alert.get("kind"))
        wanted = bool(alert.get("wanted"))
        if wanted and isinstance(self.finished_to, frozenset) and name not in self.finished_to:
            return "not_asked", f"[alerts] finished lists {', '.join(sorted(self.finished_to)) or 'no channel'}"
        floor = self.paging.channel_min_level.get(name, self.min_level)
        if LEVELS.index(level) < LEVELS.index(floor) and not wanted:
            return "below_min_level", f"{level} < min_level {floor}"
        if self.paging.quiet_at(self.local_minute()) and LEVELS.index(level) < LEVELS.index(self.paging.quiet_min_level):
            return "quiet_hours", f"{level} < quiet_min_level {self.paging.quiet_min_level} in the quiet hours"
        now = self.clock()
        window = self.paging.digest_window_s
        own = kind in NEVER_FOLDED  # its own page, whatever went before it
        with self._lock:
            last = self._last_sent.get((name, kind))
            if not own and last is not None and now - last < self.rate_limit_s:
                self._fold(alert, name, now)
                return "rate_limited", (f"a {kind} alert went to {name} {now - last:.0f} s ago (rate_limit_s "
                                        f"{self.rate_limit_s:g}); counted in its next digest")
            sent = self._sent[name] = [t for t in self._sent.get(name, []) if now - t < window]
            if not own and len(sent) >= self.paging.digest_after:
                self._fold(alert, name, now)
                return "digested", (f"{len(sent)} pages went to {name} in {window:g} s (digest_after "
                                    f"{self.paging.digest_after}); folded into one digest page")
            sent.append(now)
            self._last_sent[(name, kind)] = now
        return None

    def _fold(self, alert: dict[str, Any], name: str, now: float) -> None:
        """Hold ``alert`` for channel ``name``'s digest page, sent when the window ends (the lock is held)."""
        self._folded.setdefault(name, []).append(alert)
        if name not in self._timers:
            first = min(self._sent.get(name) or [now])
            t = threading.Timer(max(0.0, first + self.paging.digest_window_s - now), self.flush_digest, (name,))
            t.daemon = True
            self._timers[name] = t
            t.start()

    def flush_digest(self, name: str) -> None:
        """Send channel ``name`` one digest page of what was folded (its count by kind, naming them), if anything was."""
        with self._lock:
            folded = self._folded.pop(name, [])
            timer = self._timers.pop(name, None)
            self._digests += 1
            n = self._digests
            self._sent[name] = [self.clock()]
        if timer is not None:
            timer.cancel()
        if not folded:
            return
        page = {"id": f"digest-{n}", "kind": "digest", "level": highest_level([alert_level(a) for a in folded]),
                "message": digest_words(folded, self.paging.digest_window_s), "headline": folded[-1].get("headline")}
        self._start(page, name, self.targets[name])

    def _start(self, alert: dict[str, Any], name: str, fn: Callable[[dict[str, Any]], tuple[bool, str, int]]) -> None:
        th = threading.Thread(target=self._deliver, args=(alert, name, fn), name=f"deliver-{name}", daemon=True)
        with self._lock:
            self._threads.append(th)
        th.start()

    def record_outcome(self, alert: dict[str, Any], outcome: str, detail: str) -> None:
        """Record one outcome the recorder decided (``pending``, ``not_confirmed``, ``same_cause``) for every channel."""
        for name in self.targets:
            self._record(alert, name, outcome, detail, 0)

    def _deliver(self, alert: dict[str, Any], name: str, fn: Callable[[dict[str, Any]], tuple[bool, str, int]]) -> None:
        try:
            with fdreserve.room():  # a pipe, a process, a socket: there even with every other descriptor taken
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
        level = alert_level(alert)  # a resolution goes where its alert went (its level) and reads as good news
        ntype = apprise.NotifyType.SUCCESS if alert.get("kind") == "resolved" else {
            "error": apprise.NotifyType.FAILURE, "warning": apprise.NotifyType.WARNING}.get(level, apprise.NotifyType.INFO)
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
        """Send what waits for a digest now, then wait for the deliveries in flight, at most ``timeout_s`` in all;
        True when all finished (the rest are daemon threads: they end with the supervisor)."""
        for name in list(self._folded):
            self.flush_digest(name)
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
