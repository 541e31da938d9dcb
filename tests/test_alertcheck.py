"""The alert channels checked before they are needed (launcher/alertcheck.py, issue 33): the checklist fails on
a URL apprise cannot parse and on a command that would not start where the supervisor runs it (the run dir),
naming the channel, never the URL's path; ``stepwatch alerts test`` sends one page to every channel and prints
each outcome. Unit tier (in-process) and, marked, the command against a real local HTTP endpoint."""

from __future__ import annotations

import http.server
import json
import sys
import threading
from pathlib import Path

import pytest

from conftest import make_repo, stepwatch
from stepwatch.launcher.config import load_config
from stepwatch.launcher.preflight import check_alert_channels


def _cfg(tmp_path: Path, alerts: str):
    repo = make_repo(tmp_path / "repo", {})
    (repo / "run.toml").write_text(f'name = "r"\ncommand = ["true"]\n[alerts]\n{alerts}\n')
    return load_config(repo / "run.toml")


@pytest.mark.parametrize("alerts, words", [
    ('urls = ["foo://x/secret-topic"]', "apprise does not understand the URL of channel foo://x"),
    ('command = ["no-such-notifier-xyz"]', "the alert command 'no-such-notifier-xyz' is not on PATH"),
    ('command = ["./alert_cmd.sh"]', "the alert command './alert_cmd.sh' is not there: it runs in the run dir "),
])
def test_a_channel_that_could_never_deliver_fails_the_checklist_naming_it(tmp_path: Path, alerts: str, words: str):
    item = check_alert_channels(_cfg(tmp_path, alerts))
    assert item.status == "fail" and words in item.reason, item
    assert "secret-topic" not in item.reason and "secret-topic" not in json.dumps(item.detail)


def test_channels_that_can_deliver_pass_and_say_where_the_command_runs(tmp_path: Path):
    cfg = _cfg(tmp_path, f'command = ["{sys.executable}", "-c", "pass"]\n'
                         'urls = ["json://127.0.0.1:9/a", "json://127.0.0.1:9/b"]')
    item = check_alert_channels(cfg)
    assert item.status == "pass", item
    assert item.reason.startswith(f"command, json://127.0.0.1, json://127.0.0.1#2 (the command runs in {cfg.run_dir})")
    assert check_alert_channels(_cfg(tmp_path / "none", 'min_level = "info"')).status == "skipped"  # no channel


class _Hook(http.server.BaseHTTPRequestHandler):
    got: list[tuple[str, dict]] = []

    def do_POST(self) -> None:  # noqa: N802 - the stdlib's name
        type(self).got.append((self.path, json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)))))
        self.send_response(200)
        self.end_headers()

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002 - the stdlib's name
        pass


@pytest.mark.system
def test_alerts_test_reaches_every_channel_and_prints_each_outcome(tmp_path: Path):
    _Hook.got = []
    server = http.server.HTTPServer(("127.0.0.1", 0), _Hook)
    threading.Thread(target=server.serve_forever, args=(0.02,), daemon=True).start()
    try:
        port = server.server_address[1]
        out = tmp_path / "paged.txt"
        cfg = _cfg(tmp_path, f'command = ["{sys.executable}", "-c", "import os; open({str(out)!r}, \'w\').write(os.environ[\'STEPWATCH_ALERT_MESSAGE\'])"]\n'
                             f'urls = ["json://127.0.0.1:{port}/a", "json://127.0.0.1:{port}/b"]')
        r = stepwatch("alerts", "test", str(cfg.config_path))
        assert r.returncode == 0, (r.stdout, r.stderr)
        assert sorted(p for p, _ in _Hook.got) == ["/a", "/b"], _Hook.got  # each URL on the one host
        assert out.read_text() == "stepwatch test page for r: this channel works"
        lines = r.stdout.splitlines()
        assert {"command: delivered (exit code 0)", "json://127.0.0.1: delivered (accepted by the endpoint)",
                "json://127.0.0.1#2: delivered (accepted by the endpoint)"} <= set(lines), r.stdout
        bad = _cfg(tmp_path / "bad", 'urls = ["foo://x/y"]')
        r = stepwatch("preflight", str(bad.config_path))
        assert r.returncode == 1 and "[FAIL] alert channels checked: apprise does not understand the URL of channel " \
            "foo://x" in r.stdout, r.stdout
        r = stepwatch("alerts", "test", str(bad.config_path))
        assert r.returncode == 1 and "foo://x: failed (apprise does not understand the URL (foo://x))" in r.stdout, r.stdout
    finally:
        server.shutdown()
