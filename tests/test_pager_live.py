"""The pager's lifecycle (issue 33), live: a stall that clears pages once when it holds and once when it
resolves (how long it lasted); the run's exit 0 pages ``finished`` (steps, duration, final loss) because its
``[alerts]`` table asks; each page's first line is ``host · run · STATE · step N/M``. The control: a run that
does not ask gets no finished page. System tier: real supervisors and the alert command."""

from __future__ import annotations

import http.server
import json
import re
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from conftest import make_repo, stepwatch, wait_until
from stepwatch.monitors.runfiles import read_json

LOOP_PY = '''\
import time
for i in range(1, 81):
    time.sleep(0.1)
    if i == 40:
        time.sleep(20)  # idle: a stall, paged at the step budget; it clears when step 41 comes
    print(f"step {i}/80 loss {1 / i:.4f}", flush=True)
'''

PAGE_PY = r'''
import json, os, sys
with open(sys.argv[1], "a") as f:
    f.write(json.dumps({"kind": os.environ["STEPWATCH_ALERT_KIND"], "level": os.environ["STEPWATCH_ALERT_LEVEL"],
                        "message": os.environ["STEPWATCH_ALERT_MESSAGE"]}) + "\n")
'''


@pytest.mark.slow
def test_a_stall_that_clears_pages_firing_then_resolved_and_exit_0_pages_finished(tmp_path: Path):
    files = {"loop.py": LOOP_PY, "page.py": PAGE_PY}
    pages = {}
    for name, finished in (("asks", True), ("quiet", False)):
        pages[name] = tmp_path / f"pages-{name}.jsonl"
        command = [sys.executable, str(tmp_path / "repo" / "page.py"), str(pages[name])]
        files[f"{name}.toml"] = (f'name = "{name}"\ncommand = [{json.dumps(sys.executable)}, "loop.py"]\n[alerts]\n'
                                 f"command = {json.dumps(command)}\nfinished = {'true' if finished else 'false'}\n")
    repo = make_repo(tmp_path / "repo", files)
    for name in pages:
        r = stepwatch("launch", "--no-tui", f"{name}.toml", cwd=repo)
        assert r.returncode == 0, r.stderr
    for name in pages:
        ex = wait_until(lambda n=name: read_json(repo / "runs" / n / "exit.json"), 90, interval_s=0.5, what="the end")
        assert ex["returncode"] == 0, ex
    def _pages(p: Path, n: str) -> list[dict] | None:
        lines = [json.loads(x) for x in p.read_text().splitlines()] if p.exists() else []
        return lines if len(lines) >= (3 if n == "asks" else 2) else None

    got = {n: wait_until(lambda p=p, n=n: _pages(p, n), 30, what=f"the {n} run's pages") for n, p in pages.items()}
    for n, lines in got.items():
        print(f"{n}: " + " | ".join(f"{x['kind']}: {x['message']!r}" for x in lines))
    kinds = [x["kind"] for x in got["asks"]]
    assert kinds == ["stall", "resolved", "finished"], got["asks"]
    stall, resolved, finished = got["asks"]
    for page in got["asks"]:  # host · run · STATE · step N/M, then the message
        assert re.fullmatch(r"\S+ · asks · [A-Z]+( \d+| SIG[A-Z]+| \(.+\))? · step (\d+|\?)/(\d+|\?)", page["message"].split("\n")[0]), page
    assert stall["message"].split("\n")[0].endswith(" · RUNNING · step 39/80")
    lasted = re.search(r"resolved after (\d+) s: alive but stuck", resolved["message"])
    assert lasted and 12 <= int(lasted.group(1)) <= 22 and resolved["level"] == stall["level"] == "error", resolved
    assert finished["message"].split("\n")[0].endswith(" · EXITED 0 · step 80/80"), finished
    assert re.search(r"finished: exit 0 after \d+ s, 80 steps; final loss 0\.0125", finished["message"]), finished
    assert [x["kind"] for x in got["quiet"]] == ["stall", "resolved"]  # the control: finished not asked for


HICCUP_PY = '''\
import time
for i in range(1, 201):
    time.sleep(0.02)
    if i == 60:
        time.sleep(3)  # a hiccup: shown (past the 1 s step floor), cleared long before its 10 s window
    if i == 150:  # (past 100 steps: the hiccup is no longer the p99 the step budget stands on)
        time.sleep(20)  # a stall: shown at 1 s, paged once it held 10 s, resolved when step 150 comes
    print(f"step {i}/200 loss {1 / i:.4f}", flush=True)
    if i == 60:  # step 61's line well apart from 60's: read in one chunk, the log timer shares the hiccup between the
        time.sleep(0.5)  # two (1.5 s each, the p99 then: a 15 s budget the 20 s stall outlasts by less than its window)
'''


class _Hook(http.server.BaseHTTPRequestHandler):
    received: dict[str, list[dict]] = {}

    def do_POST(self) -> None:  # noqa: N802 - the stdlib's name
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        _Hook.received.setdefault(self.path, []).append(json.loads(body))
        self.send_response(200)
        self.end_headers()

    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.mark.slow
def test_a_hiccup_is_shown_never_paged_and_a_held_stall_pages_every_channel_once_then_resolves(tmp_path: Path):
    server = http.server.HTTPServer(("127.0.0.1", 0), _Hook)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    _Hook.received = {}
    pages = tmp_path / "pages.jsonl"
    command = [sys.executable, str(tmp_path / "repo" / "page.py"), str(pages)]
    urls = [f"json://127.0.0.1:{server.server_address[1]}/{topic}" for topic in ("a", "b")]
    config = (f'name = "held"\ncommand = [{json.dumps(sys.executable)}, "loop.py"]\n[stall]\nstep_floor_s = 1\n'
              f"[alerts]\ncommand = {json.dumps(command)}\nurls = {json.dumps(urls)}\nfinished = true\n"
              "confirm_s = { stall = 10 }\n")
    repo = make_repo(tmp_path / "repo", {"loop.py": HICCUP_PY, "page.py": PAGE_PY, "held.toml": config})
    try:
        r = stepwatch("launch", "--no-tui", "held.toml", cwd=repo)
        assert r.returncode == 0, r.stderr
        run_dir = repo / "runs" / "held"
        ex = wait_until(lambda: read_json(run_dir / "exit.json"), 90, interval_s=0.5, what="the end")
        assert ex["returncode"] == 0, ex
        def _all() -> dict[str, list[str]] | None:
            cmd = [json.loads(x) for x in pages.read_text().splitlines()] if pages.exists() else []
            got = {"command": [x["kind"] for x in cmd],
                   **{p: [m["title"].rsplit(": ", 1)[-1] for m in ms] for p, ms in _Hook.received.items()}}
            return got if len(got) == 3 and all(len(v) >= 3 for v in got.values()) else None
        got = wait_until(_all, 30, what="every channel's pages")
        assert got == {"command": ["stall", "resolved", "finished"], "/a": ["stall", "resolved", "finished"],
                       "/b": ["stall", "resolved", "finished"]}, got
        stall = json.loads(pages.read_text().splitlines()[0])
        assert stall["message"].split("\n")[0].endswith(" · RUNNING · step 149/200"), stall  # the held stall, not the hiccup
        snap = json.loads(stepwatch("status", "--json", str(run_dir)).stdout)
        hiccup, held = sorted((a for a in snap["alerts"] if a["kind"] == "stall"), key=lambda a: a["at"])
        print({a["id"]: {c: d["outcome"] for c, d in (a["delivered"] or {}).items()} for a in (hiccup, held)})
        assert hiccup["recorded"] and {d["outcome"] for d in hiccup["delivered"].values()} == {"not_confirmed"}
        assert set(hiccup["delivered"]) == {"command", "json://127.0.0.1", "json://127.0.0.1#2"}
        assert {d["outcome"] for d in held["delivered"].values()} == {"delivered"}
        plain = stepwatch("status", str(run_dir)).stdout
        assert "not_confirmed" in plain and "cleared before its confirmation window" in plain, plain
    finally:
        server.shutdown()


DIES_PY = r'''
import sys
print("step 1/10 loss 1.0", flush=True)
print("last words \x1b]52;c;cm0gLXJmIH4=\x07 \x1b[2J evil\u202etxt.exe zero\u200bwidth", flush=True)
sys.exit(3)
'''
RAW = ("\x1b", "\x07", "\u202e", "\u200b")


@pytest.mark.slow
async def test_a_death_quoting_osc52_csi_bidi_and_zero_width_reaches_push_command_and_screen_as_stand_ins(
        tmp_path: Path):
    from stepwatch.tui.app import StepwatchApp

    server = http.server.HTTPServer(("127.0.0.1", 0), _Hook)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    _Hook.received = {}
    pages = tmp_path / "pages.jsonl"
    command = [sys.executable, str(tmp_path / "repo" / "page.py"), str(pages)]
    config = (f'name = "dies"\ncommand = [{json.dumps(sys.executable)}, "dies.py"]\n[alerts]\n'
              f"command = {json.dumps(command)}\nurls = {json.dumps([f'json://127.0.0.1:{server.server_address[1]}/x'])}\n")
    repo = make_repo(tmp_path / "repo", {"dies.py": DIES_PY, "page.py": PAGE_PY, "dies.toml": config})
    try:
        assert stepwatch("launch", "--no-tui", "dies.toml", cwd=repo).returncode == 0
        run_dir = repo / "runs" / "dies"
        wait_until(lambda: pages.exists() and _Hook.received.get("/x"), 30, what="the death page on both channels")
        pushed = _Hook.received["/x"][0]["message"]
        env = json.loads(pages.read_text().splitlines()[0])["message"]
        for got in (pushed, env):
            assert "last words" in got and not any(c in got for c in RAW), repr(got)
            # the log reader drops the escape sequences; the bidi override and the zero-width space show as visible text
            assert re.search(r"evil(\\u202e|\ufffd)txt\.exe zero(\\u200b|\ufffd)width", got), repr(got)
        app = StepwatchApp(run_dir, run_dir.parent)
        async with app.run_test(size=(80, 24)) as pilot:
            screen: Any = app.screen
            deadline = time.monotonic() + 10
            while "watchdog" not in str(screen.query_one("#banner").render()) and time.monotonic() < deadline:
                await pilot.pause(0.1)
            await pilot.press("d")  # the whole text
            await pilot.pause(0.5)
            shown = "".join(str(w.render()) for w in app.screen.query("Static"))
            log = "\n".join(ln.text for ln in screen.query_one("#log").lines)
            for got in (shown, log):
                assert "last words" in got and not any(c in got for c in RAW), repr(got)
    finally:
        server.shutdown()
