"""The supervisor's alert delivery, one Deliverer at a time: its
settings and their bounds, levels and min_level, the rate
limit per channel and kind, the [alerts] command's environment, exit code, stderr and timeout (real
processes), a push to a real local HTTP endpoint with its retries and back-off, the outcome records."""

from __future__ import annotations

import http.server
import json
import sys
import subprocess
import threading
import time
from pathlib import Path

import psutil
import pytest

from conftest import wait_until
from stepwatch.monitors.watch.delivery import (COMMAND_TIMEOUT_S, DEFAULT_MIN_LEVEL, DEFAULT_RATE_LIMIT_S,
                                               DEFAULT_RETRIES, Deliverer, level_of)


class Recorder:
    def __init__(self) -> None:
        self.records: list[dict] = []
        self.logged: list[str] = []
        self.slept: list[float] = []

    def deliverer(self, run_dir: Path, **config) -> Deliverer:
        return Deliverer(run_dir, self.records.append, config, "myrun", log=self.logged.append, sleep=self.slept.append)

    def outcomes(self) -> list[tuple[str, str]]:
        return [(r["channel"], r["outcome"]) for r in self.records]


def alert(kind: str = "stall", n: int = 1, message: str = "no optimizer step for 60 s") -> dict:
    return {"id": f"{kind}-{n}", "kind": kind, "message": message}


def test_the_settings_and_their_bounds(tmp_path: Path):
    r = Recorder()
    d = r.deliverer(tmp_path)
    assert (d.min_level, d.rate_limit_s, d.retries, d.command_timeout_s, d.command, d.urls) == (
        "warning", 60.0, 3, 30.0, None, []) == (DEFAULT_MIN_LEVEL, DEFAULT_RATE_LIMIT_S, DEFAULT_RETRIES,
                                                COMMAND_TIMEOUT_S, None, [])
    d = r.deliverer(tmp_path, min_level="error", rate_limit_s=0, retries=0, command_timeout_s=600, command=["true"],
                    urls=["json://h", "", 5, None])
    assert (d.min_level, d.rate_limit_s, d.retries, d.command_timeout_s, d.command, d.urls) == (
        "error", 0.0, 0, 600.0, ["true"], ["json://h"])
    d = r.deliverer(tmp_path, retries=10, command_timeout_s=0.5, rate_limit_s=2.5, min_level="info")
    assert (d.retries, d.command_timeout_s, d.rate_limit_s, d.min_level) == (10, 0.5, 2.5, "info")
    for bad in ({"min_level": "loud"}, {"rate_limit_s": -1}, {"rate_limit_s": "9"}, {"retries": 11}, {"retries": -1},
                {"retries": 2.0}, {"command_timeout_s": 0}, {"command_timeout_s": 601}, {"command_timeout_s": "5"},
                {"command": []}, {"command": "echo hi"}, {"urls": "json://h"}):
        d = r.deliverer(tmp_path, **bad)
        assert (d.min_level, d.rate_limit_s, d.retries, d.command_timeout_s, d.command, d.urls) == (
            "warning", 60.0, 3, 30.0, None, []), bad


def test_levels_and_min_level(tmp_path: Path):
    assert (level_of("stall"), level_of("recompile_limit"), level_of("something new")) == ("error", "warning", "warning")
    for min_level, kind, outcome in (("error", "recompile_limit", "below_min_level"), ("error", "stall", "delivered"),
                                     ("warning", "recompile_limit", "delivered"), ("info", "gpu", "delivered")):
        r = Recorder()
        d = r.deliverer(tmp_path, command=["true"], min_level=min_level)
        d.submit(alert(kind))
        assert d.wait(10) and r.outcomes() == [("command", outcome)], (min_level, kind, r.records)
    r = Recorder()
    d = r.deliverer(tmp_path, command=["true"], min_level="error")
    d.submit(alert("gpu"))
    assert r.records[0]["detail"] == "warning < min_level error" and r.records[0]["attempts"] == 0


def test_the_rate_limit_is_per_channel_and_kind(tmp_path: Path):
    r = Recorder()
    d = r.deliverer(tmp_path, command=["true"], rate_limit_s=30)
    d.submit(alert("stall", 1))
    d.submit(alert("stall", 2))  # the same kind at once: rate limited
    d.submit(alert("fallback", 3))  # another kind: its own limit
    limited = next(x for x in r.records if x["outcome"] == "rate_limited")
    assert limited["detail"].startswith("a stall alert went to command 0 s ago (rate_limit_s 30)"), limited
    assert d.wait(10)  # the end of the attempt: what the limit held back goes as one digest page
    got = sorted((x["alert_id"], x["outcome"]) for x in r.records)
    assert got == [("digest-1", "delivered"), ("fallback-3", "delivered"), ("stall-1", "delivered"),
                   ("stall-2", "rate_limited")]
    r = Recorder()
    d = r.deliverer(tmp_path, command=["true"], rate_limit_s=0)  # 0: every alert goes
    for n in range(3):
        d.submit(alert("stall", n))
    assert d.wait(10) and [o for _, o in r.outcomes()] == ["delivered"] * 3


def test_the_command_gets_the_alert_in_its_environment(tmp_path: Path):
    out = tmp_path / "env.json"
    script = ("import json, os, sys; json.dump({k: v for k, v in os.environ.items() if k.startswith('STEPWATCH_')},"
              f" open({str(out)!r}, 'w'))")
    r = Recorder()
    d = r.deliverer(tmp_path, command=[sys.executable, "-c", script])
    d.submit(alert("stall", 7, "alive but stuck"))
    assert d.wait(20)
    env = json.loads(out.read_text())
    assert {k: env[k] for k in ("STEPWATCH_ALERT_ID", "STEPWATCH_ALERT_KIND", "STEPWATCH_ALERT_LEVEL",
                                "STEPWATCH_ALERT_MESSAGE", "STEPWATCH_RUN", "STEPWATCH_RUN_DIR")} == {
        "STEPWATCH_ALERT_ID": "stall-7", "STEPWATCH_ALERT_KIND": "stall", "STEPWATCH_ALERT_LEVEL": "error",
        "STEPWATCH_ALERT_MESSAGE": "alive but stuck", "STEPWATCH_RUN": "myrun", "STEPWATCH_RUN_DIR": str(tmp_path)}
    rec = r.records[0]
    assert (rec["v"], rec["kind"], rec["alert_id"], rec["channel"], rec["outcome"], rec["detail"], rec["attempts"]) == (
        1, "delivery", "stall-7", "command", "delivered", "exit code 0", 1) and abs(rec["t"] - time.time()) < 30


@pytest.mark.system
def test_a_failing_missing_or_hung_command_is_a_recorded_failure(tmp_path: Path):
    r = Recorder()
    d = r.deliverer(tmp_path, command=[sys.executable, "-c", "import sys; print('first'); sys.stderr.write('a\\nboom\\n'); sys.exit(3)"])
    d.submit(alert())
    assert d.wait(20) and r.records[0]["outcome"] == "failed" and r.records[0]["detail"] == "exit code 3: boom"
    assert r.logged == ["alert stall-1 not delivered to command: exit code 3: boom"]
    r = Recorder()
    d = r.deliverer(tmp_path, command=[sys.executable, "-c", "import sys; sys.exit(4)"])
    d.submit(alert())
    assert d.wait(20) and r.records[0]["detail"] == "exit code 4"
    r = Recorder()
    d = r.deliverer(tmp_path, command=[str(tmp_path / "no-such-notifier")])
    d.submit(alert())
    assert d.wait(20) and r.records[0]["outcome"] == "failed"
    assert r.records[0]["detail"].startswith(f"could not run {str(tmp_path / 'no-such-notifier')!r}: ")
    pidfile = tmp_path / "child.pid"
    hang = f"import os, subprocess, time; p = subprocess.Popen(['sleep', '60']); open({str(pidfile)!r}, 'w').write(str(p.pid)); time.sleep(60)"
    r = Recorder()
    d = r.deliverer(tmp_path, command=[sys.executable, "-c", hang], command_timeout_s=1.5)
    t0 = time.monotonic()
    d.submit(alert())
    assert d.wait(20) and time.monotonic() - t0 < 10
    assert r.records[0]["detail"] == "the command ran over 1.5 s: its session was killed" and r.records[0]["attempts"] == 1
    child = int(pidfile.read_text())
    wait_until(lambda: not psutil.pid_exists(child) or psutil.Process(child).status() == psutil.STATUS_ZOMBIE, 10,
               what="the notifier's own child killed with its session")


@pytest.mark.system
def test_waiting_is_bounded(tmp_path: Path):
    r = Recorder()
    d = r.deliverer(tmp_path, command=[sys.executable, "-c", "import time; time.sleep(3)"])
    d.submit(alert())
    t0 = time.monotonic()
    assert d.wait(0.3) is False and time.monotonic() - t0 < 1.5  # still in flight: said so, not waited for
    assert d.wait(20) is True and r.outcomes() == [("command", "delivered")]
    assert Recorder().deliverer(tmp_path).wait(0) is True  # nothing in flight


def test_a_record_that_cannot_be_written_is_logged_and_delivery_goes_on(tmp_path: Path):
    logged: list[str] = []

    def full(rec):
        raise OSError(28, "No space left on device")

    d = Deliverer(tmp_path, full, {"command": ["true"]}, "myrun", log=logged.append)
    d.submit(alert())
    assert d.wait(10)
    assert logged == ["could not record the delivery of stall-1 to command: [Errno 28] No space left on device"]


class _Endpoint(http.server.BaseHTTPRequestHandler):
    received: list[dict] = []
    status = 200

    def do_POST(self) -> None:  # noqa: N802 - the stdlib's name
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        type(self).received.append(json.loads(body))
        self.send_response(type(self).status)
        self.end_headers()

    def log_message(self, *args) -> None:
        pass


@pytest.fixture
def endpoint():
    _Endpoint.received, _Endpoint.status = [], 200
    server = http.server.HTTPServer(("127.0.0.1", 0), _Endpoint)
    threading.Thread(target=server.serve_forever, args=(0.02,), daemon=True).start()  # shutdown() waits one poll
    yield server.server_address[1]
    server.shutdown()


def test_a_push_arrives_with_the_alerts_title_text_and_type(tmp_path: Path, endpoint: int):
    r = Recorder()
    d = r.deliverer(tmp_path, urls=[f"json://127.0.0.1:{endpoint}/hook"], min_level="info")
    d.submit(alert("stall", 1, "alive but stuck"))
    d.submit(alert("gpu", 2, "idle tensor cores"))
    d.submit({"id": "stall-1-resolved", "kind": "resolved", "level": "error", "message": "resolved after 40 s"})
    d.submit({"id": "a1-finished", "kind": "finished", "level": "info", "wanted": True, "message": "finished: exit 0"})
    assert d.wait(30)
    got = {x["title"]: (x["message"], x["type"]) for x in _Endpoint.received}
    assert got == {"stepwatch myrun: stall": ("alive but stuck", "failure"),
                   "stepwatch myrun: gpu": ("idle tensor cores", "warning"),
                   "stepwatch myrun: resolved": ("resolved after 40 s", "success"),  # at the stall's level, good news
                   "stepwatch myrun: finished": ("finished: exit 0", "info")}, _Endpoint.received
    assert sorted(r.outcomes()) == [("json://127.0.0.1", "delivered")] * 4
    assert {x["attempts"] for x in r.records} == {1} and {x["detail"] for x in r.records} == {"accepted by the endpoint"}
    assert r.slept == []


def test_two_urls_on_one_host_are_two_channels_each_sent_every_alert_and_named_apart(tmp_path: Path, endpoint: int):
    """Two ntfy topics or two webhooks on one host: each gets every alert (its own rate limit), and each
    outcome is its own; the names keep the paths (topics, tokens) out of files."""
    from stepwatch.monitors.snapshot.alerts import channel_names, push_channel_names

    r = Recorder()
    urls = [f"json://127.0.0.1:{endpoint}/a", f"json://127.0.0.1:{endpoint}/b"]
    d = r.deliverer(tmp_path, urls=urls, rate_limit_s=60)
    d.submit(alert("stall", 1, "alive but stuck"))
    assert d.wait(30)
    assert len(_Endpoint.received) == 2, _Endpoint.received  # the control before the fix: 1, the second rate-limited
    assert sorted(r.outcomes()) == [("json://127.0.0.1", "delivered"), ("json://127.0.0.1#2", "delivered")]
    assert push_channel_names(urls) == ["json://127.0.0.1", "json://127.0.0.1#2"]
    assert channel_names({"command": ["true"], "urls": urls}) == ["command", "json://127.0.0.1", "json://127.0.0.1#2"]
    assert channel_names({"channels": ["ntfy://ntfy.sh", "ntfy://ntfy.sh#2"]}) == ["ntfy://ntfy.sh", "ntfy://ntfy.sh#2"]


HOSTILE = "died: last line \x1b]52;c;cm0gLXJmIH4=\x07 \x1b[2J evil\u202etxt.exe zero\u200bwidth\nALERT fake"


def test_a_page_carries_no_control_bidi_or_zero_width_character_a_log_line_held(tmp_path: Path, endpoint: int):
    """A death alert quoting a log line with OSC 52 (a clipboard write), CSI 2J, U+202E and U+200B: none reaches
    the push body nor the command's environment; the visible stand-ins do, and the message stays one line."""
    out = tmp_path / "env.json"
    r = Recorder()
    d = r.deliverer(tmp_path, urls=[f"json://127.0.0.1:{endpoint}/hook"], command=_py(
        f"import json, os; json.dump(os.environ['STEPWATCH_ALERT_MESSAGE'], open({str(out)!r}, 'w'))"))
    d.submit(alert("watchdog", 1, HOSTILE))
    assert d.wait(30) and sorted(o for _, o in r.outcomes()) == ["delivered", "delivered"], r.records
    for got in (_Endpoint.received[0]["message"], json.loads(out.read_text())):
        assert not {"\x1b", "\x07", "\u202e", "\u200b", "\n"} & set(got), repr(got)
        assert got == "died: last line \u241b]52;c;cm0gLXJmIH4=\u2407 \u241b[2J evil\ufffdtxt.exe zero\ufffdwidth\u240aALERT fake"


def test_a_pages_first_line_is_host_run_state_and_step_and_its_second_the_message(tmp_path: Path, endpoint: int):
    import re

    from stepwatch.monitors.snapshot.alerts import headline_of
    from stepwatch.monitors.snapshot.model import null_snapshot

    snap = null_snapshot()
    snap["run"], snap["state"] = "big\x1b[2Jrun", "running"
    snap["step"] = {**snap["step"], "global_step": 40, "max_steps": 100}
    out = tmp_path / "env.txt"
    r = Recorder()
    d = r.deliverer(tmp_path, urls=[f"json://127.0.0.1:{endpoint}/hook"], command=_py(
        f"import os; open({str(out)!r}, 'w').write(os.environ['STEPWATCH_ALERT_MESSAGE'])"))
    d.submit({**alert("stall", 1, "alive but stuck"), "headline": headline_of(snap, "gpu-node-7")})
    assert d.wait(30)
    for got in (_Endpoint.received[0]["message"], out.read_text()):
        first, second = got.split("\n")
        assert re.fullmatch(r"[^ ]+ · .+ · [A-Z]+ · step (\d+|\?)/(\d+|\?)", first), first
        assert (first, second) == ("gpu-node-7 · big\u241b[2Jrun · RUNNING · step 40/100", "alive but stuck")
    snap["step"] = {**snap["step"], "global_step": None, "max_steps": None}
    assert headline_of(snap, "h").endswith(" · RUNNING · step ?/?")  # unknown is said, never a made-up 0


def test_a_pages_state_word_is_the_screens():
    """The death page said EXITED where the screen said KILLED SIGKILL (issue 44): one word, from one function."""
    from stepwatch.monitors.snapshot.alerts import headline_of
    from stepwatch.monitors.snapshot.model import null_snapshot
    from stepwatch.tui.format import state_word

    snap = null_snapshot()
    snap["run"], snap["state"] = "r", "exited"
    for rc, sig, stop, want in ((None, "SIGKILL", False, "KILLED SIGKILL"), (3, None, False, "EXITED 3"),
                                (0, None, False, "EXITED 0"), (None, "SIGTERM", True, "STOPPED (SIGTERM)")):
        snap["returncode"], snap["signal"] = rc, sig
        snap["ended"] = {"ended_at": None, "ended_at_unix": None, "duration_s": None, "stop_requested": stop,
                         "error": None, "write_errors": None, "log_lost_bytes": None, "log_lost_reason": None}
        assert state_word(snap) == want
        assert headline_of(snap, "h") == f"h · r · {want} · step ?/?"


def test_a_refused_push_is_retried_with_back_off_then_failed(tmp_path: Path, endpoint: int):
    _Endpoint.status = 500
    r = Recorder()
    d = r.deliverer(tmp_path, urls=[f"json://127.0.0.1:{endpoint}/hook"], retries=3)
    d.submit(alert())
    assert d.wait(60)
    assert len(_Endpoint.received) == 4 and r.slept == [1.0, 2.0, 4.0]  # 1 s, 2 s, 4 s between the 4 attempts
    rec = r.records[0]
    assert (rec["outcome"], rec["attempts"], rec["detail"]) == ("failed", 4, "the endpoint refused or did not answer, 4 attempts")
    _Endpoint.received = []
    r = Recorder()
    d = r.deliverer(tmp_path, urls=[f"json://127.0.0.1:{endpoint}/hook"], retries=0)
    d.submit(alert())
    assert d.wait(60) and len(_Endpoint.received) == 1 and r.slept == [] and r.records[0]["attempts"] == 1


def test_a_url_apprise_does_not_know_is_a_failure_without_an_attempt(tmp_path: Path):
    r = Recorder()
    d = r.deliverer(tmp_path, urls=["nosuchscheme://example.invalid/x"])
    d.submit(alert())
    assert d.wait(30)
    rec = r.records[0]
    assert (rec["outcome"], rec["attempts"]) == ("failed", 0) and rec["detail"].startswith("apprise does not understand the URL")


def test_every_channel_gets_its_own_outcome_when_one_is_refused(tmp_path: Path):
    r = Recorder()
    d = r.deliverer(tmp_path, command=["true"], urls=["nosuchscheme://a/x"], min_level="error")
    d.submit(alert("gpu"))  # a warning under min_level error: refused on each channel, each recorded
    assert sorted(r.outcomes()) == [("command", "below_min_level"), ("nosuchscheme://a", "below_min_level")]
    r = Recorder()
    d = r.deliverer(tmp_path, command=["true"], urls=["nosuchscheme://a/x"], rate_limit_s=60)
    d.submit(alert("stall", 1))
    d.submit(alert("stall", 2))
    assert d.wait(30)
    second = sorted(o for x, o in zip(r.records, r.outcomes()) if x["alert_id"] == "stall-2")
    assert second == [("command", "rate_limited"), ("nosuchscheme://a", "rate_limited")]


# ------------------------------------------------- the edges: each setting, bound and outcome on either side


def _py(code: str) -> list[str]:
    return [sys.executable, "-c", code]


def test_a_negative_command_timeout_is_refused_for_the_default(tmp_path: Path):
    for bad in (-5, -0.5, float("nan")):
        assert Recorder().deliverer(tmp_path, command_timeout_s=bad).command_timeout_s == COMMAND_TIMEOUT_S, bad


def test_a_rate_limited_alert_is_recorded_without_an_attempt_and_not_logged_as_lost(tmp_path: Path):
    r = Recorder()
    d = r.deliverer(tmp_path, command=["true"], rate_limit_s=30)
    d.submit(alert("stall", 1))
    d.submit(alert("stall", 2))
    assert d.wait(10)
    limited = [x for x in r.records if x["outcome"] == "rate_limited"]
    assert len(limited) == 1 and limited[0]["attempts"] == 0
    assert r.logged == []  # only a failed delivery is logged as "not delivered"


@pytest.mark.system
def test_the_same_kind_rings_again_once_its_rate_limit_has_passed(tmp_path: Path):
    """A stall that comes back after rate_limit_s rings again; one within it does not."""
    r = Recorder()
    d = r.deliverer(tmp_path, command=["true"], rate_limit_s=1.5)
    t0 = time.monotonic()
    d.submit(alert("stall", 1))
    d.submit(alert("stall", 2))
    wait_until(lambda: time.monotonic() - t0 > 1.6, 5, interval_s=0.05, what="the rate limit to pass")
    d.submit(alert("stall", 3))
    assert d.wait(10)  # the one the limit held back goes in the attempt's last digest
    assert sorted((x["alert_id"], x["outcome"]) for x in r.records) == [
        ("digest-1", "delivered"), ("stall-1", "delivered"), ("stall-2", "rate_limited"), ("stall-3", "delivered")]


def test_a_channel_that_raises_is_a_recorded_failure(tmp_path: Path):
    """A command Popen refuses with something other than OSError (a NUL byte in an argument: ValueError)
    is a failed delivery with the error's words, never a dead worker that records nothing."""
    r = Recorder()
    d = r.deliverer(tmp_path, command=["echo", "a\x00b"])
    d.submit(alert())
    assert d.wait(10)
    assert [(x["outcome"], x["detail"], x["attempts"]) for x in r.records] == [
        ("failed", "ValueError: embedded null byte", 1)]
    assert r.logged == ["alert stall-1 not delivered to command: ValueError: embedded null byte"]


def test_a_missing_command_is_named_by_its_program_and_a_long_detail_is_cut_at_500(tmp_path: Path):
    r = Recorder()
    missing = str(tmp_path / "no-such-notifier")
    d = r.deliverer(tmp_path, command=[missing, "--to", "phone"])
    d.submit(alert())
    assert d.wait(10)
    rec = r.records[0]
    assert rec["detail"].startswith(f"could not run {missing!r}: ") and rec["attempts"] == 1
    r = Recorder()
    long_name = str(tmp_path / ("n" * 400))  # a name over NAME_MAX: the error repeats it, well past 500
    d = r.deliverer(tmp_path, command=[long_name])
    d.submit(alert())
    assert d.wait(10)
    detail = r.records[0]["detail"]
    assert len(detail) == 500 and detail.startswith(f"could not run {long_name!r}: ")


def test_a_command_killed_by_a_signal_failed_and_the_last_stderr_line_is_named(tmp_path: Path):
    r = Recorder()
    d = r.deliverer(tmp_path, command=_py("import os, signal; os.kill(os.getpid(), signal.SIGTERM)"))
    d.submit(alert())
    assert d.wait(10)
    assert [(x["outcome"], x["detail"], x["attempts"]) for x in r.records] == [("failed", "exit code -15", 1)]
    r = Recorder()
    last = "".join(f"{i:04d}" for i in range(75))  # 300 characters, each position tells where it was cut
    d = r.deliverer(tmp_path, command=_py(f"import sys; sys.stderr.write('first\\nsecond\\n{last}\\n'); sys.exit(2)"))
    d.submit(alert())
    assert d.wait(10)
    assert [(x["outcome"], x["detail"], x["attempts"]) for x in r.records] == [
        ("failed", f"exit code 2: {last[:200]}", 1)]


def test_only_the_last_4_kib_of_a_chatty_notifiers_stderr_are_kept(tmp_path: Path):
    """A last line longer than the tail (STDERR_TAIL_BYTES, 4096) is read from exactly 4096 bytes
    before the end: the detail starts where the tail starts."""
    from stepwatch.monitors.watch.delivery import STDERR_TAIL_BYTES

    text = "".join(f"{i:05d}" for i in range(2000))  # 10,000 characters on one line, no newline
    r = Recorder()
    d = r.deliverer(tmp_path, command=_py(f"import sys; sys.stderr.write({text!r}); sys.exit(1)"))
    d.submit(alert())
    assert d.wait(10)
    assert STDERR_TAIL_BYTES == 4096
    assert r.records[0]["detail"] == f"exit code 1: {text[-4096:][:200]}"


@pytest.mark.system
def test_a_timed_out_command_is_a_failure_whatever_it_printed(tmp_path: Path):
    r = Recorder()
    d = r.deliverer(tmp_path, command=_py("import time; time.sleep(30)"), command_timeout_s=0.5)
    d.submit(alert())
    assert d.wait(20)
    assert [(x["outcome"], x["attempts"]) for x in r.records] == [("failed", 1)]
    assert r.records[0]["detail"] == "the command ran over 0.5 s: its session was killed"


def test_a_short_timeout_still_reads_what_the_command_wrote(tmp_path: Path):
    """Under a timeout of 0.8 s, a command that fails at once is read to its end: its stderr named."""
    r = Recorder()
    d = r.deliverer(tmp_path, command=["sh", "-c", "echo boom >&2; exit 3"], command_timeout_s=0.8)
    d.submit(alert())
    assert d.wait(10)
    assert [(x["outcome"], x["detail"]) for x in r.records] == [("failed", "exit code 3: boom")]


@pytest.mark.system
def test_a_command_that_closes_its_stderr_is_waited_for_up_to_its_timeout_and_no_longer(tmp_path: Path):
    """Once stderr is closed, the wait for the exit is bounded by what is left of command_timeout_s:
    an exit 1.5 s later under 5 s is delivered; an exit 0.8 s later under 0.4 s is a timeout."""
    quiet_then_exit = "import os, time; os.close(2); time.sleep({}); os._exit(0)"
    r = Recorder()
    d = r.deliverer(tmp_path, command=_py(quiet_then_exit.format(1.5)), command_timeout_s=5)
    d.submit(alert())
    assert d.wait(20)
    assert [(x["outcome"], x["detail"]) for x in r.records] == [("delivered", "exit code 0")]
    r = Recorder()
    d = r.deliverer(tmp_path, command=_py(quiet_then_exit.format(0.8)), command_timeout_s=0.4)
    d.submit(alert())
    assert d.wait(20)
    assert [(x["outcome"], x["detail"]) for x in r.records] == [
        ("failed", "the command ran over 0.4 s: its session was killed")]


@pytest.mark.system
def test_waiting_on_hung_deliveries_takes_the_timeout_given_in_all(tmp_path: Path):
    """wait(t) is bounded by t over every delivery in flight (not t each, not until they end)."""
    # two channels, both in flight for each of two alerts: the command sleeps, the refused push backs off
    d = Deliverer(tmp_path, lambda rec: None, {"command": _py("import time; time.sleep(30)"), "command_timeout_s": 600,
                                               "urls": ["json://127.0.0.1:9/x"], "retries": 10},
                  "myrun", sleep=lambda s: time.sleep(30))
    d.submit(alert("stall", 1))
    d.submit(alert("fallback", 2))
    t0 = time.monotonic()
    assert d.wait(0.3) is False
    assert time.monotonic() - t0 < 1.5
    t0 = time.monotonic()
    assert d.wait(1.2) is False
    assert 1.1 < time.monotonic() - t0 < 4


@pytest.mark.system
def test_a_hung_delivery_never_keeps_the_supervisor_alive(tmp_path: Path):
    """The process that delivers (the supervisor) ends when its work ends, a hung notifier or not:
    the deliveries are daemon threads, the notifier's session its own."""
    script = tmp_path / "owner.py"
    script.write_text(
        "from pathlib import Path\n"
        "from stepwatch.monitors.watch.delivery import Deliverer\n"
        f"d = Deliverer(Path({str(tmp_path)!r}), lambda r: None, {{'command': ['sleep', '20'], 'command_timeout_s': 600}}, 'r')\n"
        "d.submit({'id': 'stall-1', 'kind': 'stall', 'message': 'm'})\n"
        "print(d.wait(0.2), flush=True)\n")
    t0 = time.monotonic()
    p = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=30)
    assert (p.returncode, p.stdout.strip()) == (0, "False") and time.monotonic() - t0 < 15, p.stderr
