"""The run outlives its watchers (issue 43, finding 4). A run's output goes through a pipe the supervisor pumps into
train.log; its warden and keeper (monitors/watch/warden.py, started by launcher/wardens.py) hold the pipe's read end
too. Real runs of root's, launched with umask 002, paging through an ``[alerts] command`` into a file:

- ``kill -9`` of the supervisor and the warden: the job prints for 60 s more and exits 0 (its own marker), train.log
  keeps growing, the keeper pages the loss of both and ``status`` says who is left;
- ``kill -STOP`` of the supervisor: paged ``frozen`` within 10 s, the job's output (more than a pipe's 64 KiB) keeps
  arriving in train.log; SIGCONT: the page is resolved, the run ends recorded, no watcher is left;
- the supervisor killed during the restart's back-off: the restart it paged as coming is paged as not happening
  (the control: no kill, the restart's outcome is recorded and nothing says it did not happen);
- ``supervisor_lost`` is never followed by a ``resolved`` page (the stop's resolution above is the positive control);
- a view of a run whose process lives and whose supervisor and wardens are all gone says UNWATCHED (unit: identities
  of the test's own process, one of them made stale).
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from pathlib import Path

import psutil
import pytest

from conftest import git, make_repo, stepwatch, wait_exit, wait_until
from stepwatch.monitors.runfiles import read_json, write_json_atomic
from stepwatch.monitors.snapshot.observer import RunObserver
from stepwatch.monitors.states import UNWATCHED, WATCHED
from stepwatch.monitors.watchdog import ProcessRef, is_alive
from stepwatch.tui.plain import status_lines

system = pytest.mark.system

#: prints one numbered line of WIDTH bytes every EVERY s for SECONDS s, then writes its marker: a print that met a
#: reader-less pipe (SIGPIPE, or BrokenPipeError) never gets there
PRINTS_PY = r"""
import sys, time
seconds, every, width, marker = float(sys.argv[1]), float(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
t0, i = time.monotonic(), 0
while time.monotonic() - t0 < seconds:
    i += 1
    print(f"step {i}/100000 loss 0.5 " + "x" * width, flush=True)
    time.sleep(every)
open(marker, "w").write(f"exit 0 after {i} lines\n")
"""
#: a few steps, a complete checkpoint, then a SIGKILL: the restart policy restarts it (from ckpt_5)
DIES_PY = r"""
import os, signal, sys, time
for i in range(1, 11):
    print(f"step {i}/100 loss {1 / i:.4f}", flush=True)
    if i == 5:
        os.makedirs("ckpt_5", mode=0o755, exist_ok=True)
        os.chmod("ckpt_5", 0o755)
        with open("ckpt_5/DONE", "w") as f:
            f.write("ok")
        os.chmod("ckpt_5/DONE", 0o644)  # the policy resumes from no checkpoint others can write
    time.sleep(0.05)
os.kill(os.getpid(), signal.SIGKILL)
"""
PING_PY = r"""
import json, os, sys
with open(sys.argv[1], "a") as f:
    f.write(json.dumps({"kind": os.environ["STEPWATCH_ALERT_KIND"], "message": os.environ["STEPWATCH_ALERT_MESSAGE"]}) + "\n")
"""


def _launch(tmp_path: Path, name: str, command: list[str], extra: str = "") -> tuple[Path, Path, Path]:
    """A run of root's launched with umask 002, paging into a file; (repo, run dir, pings)."""
    pings = tmp_path / f"{name}.pings.jsonl"
    repo = tmp_path / "repo"
    if not repo.exists():
        make_repo(repo, {"prints.py": PRINTS_PY, "dies.py": DIES_PY, "ping.py": PING_PY, ".gitignore": "ckpt_*\n"})
    config = repo / f"{name}.toml"
    config.write_text(f'name = "{name}"\ncommand = {json.dumps([sys.executable, *command])}\n[alerts]\n'
                      f'command = {json.dumps([sys.executable, str(repo / "ping.py"), str(pings)])}\n{extra}')
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", name)
    r = stepwatch("launch", "--no-tui", "--runs-dir", str(tmp_path / "runs"), config.name, cwd=repo, umask=0o002)
    assert r.returncode == 0, r.stderr
    run_dir = tmp_path / "runs" / name
    wait_until(lambda: b"step 3/" in (run_dir / "train.log").read_bytes(), 30, what="a few steps")
    return repo, run_dir, pings


def _pages(pings: Path, kind: str | None = None) -> list[dict]:
    got = [json.loads(ln) for ln in pings.read_text().splitlines()] if pings.exists() else []
    return [p for p in got if kind is None or p["kind"] == kind]


def _refs(run_dir: Path) -> tuple[ProcessRef, ProcessRef, ProcessRef, ProcessRef]:
    """The supervisor, the run's process, the warden and the keeper, as run.json names them."""
    run = read_json(run_dir / "run.json")
    assert run is not None
    wardens = {w["role"]: ProcessRef.from_json(w) for w in run["wardens"]}
    refs = (ProcessRef.from_json(run["supervisor"]), ProcessRef.from_json(run["process"]), wardens.get("warden"),
            wardens.get("keeper"))
    assert all(refs), run
    return refs  # type: ignore[return-value]


def _size(run_dir: Path) -> int:
    return (run_dir / "train.log").stat().st_size


@system
def test_the_job_outlives_its_supervisor_and_warden_killed_and_the_keeper_pages_and_status_says_so(tmp_path: Path):
    marker = tmp_path / "finished"
    _repo, run_dir, pings = _launch(tmp_path, "outlives", ["prints.py", "66", "0.06", "100", str(marker)])
    sup, job, warden, keeper = _refs(run_dir)
    os.kill(sup.pid, signal.SIGKILL)
    os.kill(warden.pid, signal.SIGKILL)
    t_kill, size_at_kill = time.monotonic(), _size(run_dir)

    lost = wait_until(lambda: _pages(pings, "watchers_lost"), 10, what="the loss of both paged by the keeper")
    assert f"supervisor (pid {sup.pid})" in lost[0]["message"] and f"keeper (pid {keeper.pid})" in lost[0]["message"]
    st = stepwatch("status", str(run_dir))
    assert st.returncode == 0, st.stderr
    assert (f"WARNING: the supervisor (pid {sup.pid}) and its warden (pid {warden.pid}) are gone: its keeper "
            f"(pid {keeper.pid}) pumps the run's output") in st.stdout, st.stdout
    wait_until(lambda: _size(run_dir) > size_at_kill + 20_000, 30, what="train.log growing after the kill")

    wait_until(lambda: marker.exists(), 90, interval_s=0.5, what="the job's own end")
    assert marker.read_text().startswith("exit 0")
    assert time.monotonic() - t_kill >= 55  # it printed on for a minute, with nobody but the keeper reading
    log = (run_dir / "train.log").read_text()
    assert log.rstrip().endswith("x" * 100) and _size(run_dir) > size_at_kill + 60_000
    wait_until(lambda: not is_alive(job) and not is_alive(keeper), 30, what="the job and the keeper ended")
    assert _pages(pings, "watchdog") and not _pages(pings, "resolved"), _pages(pings)


@system
def test_a_stopped_supervisor_is_paged_frozen_its_output_keeps_flowing_and_sigcont_resolves_it(tmp_path: Path):
    marker = tmp_path / "finished"
    _repo, run_dir, pings = _launch(tmp_path, "stopped", ["prints.py", "30", "0.02", "1000", str(marker)])
    sup, _job, warden, keeper = _refs(run_dir)
    os.kill(sup.pid, signal.SIGSTOP)
    try:
        t_stop, size_at_stop = time.monotonic(), _size(run_dir)
        frozen = wait_until(lambda: _pages(pings, "frozen"), 10, what="the stopped supervisor paged")
        assert time.monotonic() - t_stop <= 10
        assert f"stepwatch's supervisor (pid {sup.pid}) is held stopped" in frozen[0]["message"], frozen
        wait_until(lambda: _size(run_dir) > size_at_stop + 3 * 65536, 20, what="train.log past three pipes' worth")
        assert psutil.Process(sup.pid).status() == psutil.STATUS_STOPPED  # still stopped: the warden pumped it
        st = stepwatch("status", str(run_dir))
        assert f"WARNING: the supervisor (pid {sup.pid}) is held stopped" in st.stdout, st.stdout
    finally:
        os.kill(sup.pid, signal.SIGCONT)
    resolved = wait_until(lambda: _pages(pings, "resolved"), 10, what="the freeze resolved")
    assert "frozen: stepwatch's supervisor" in resolved[0]["message"], resolved

    assert wait_exit(run_dir, 60)["returncode"] == 0 and marker.exists()
    lines = (run_dir / "train.log").read_text().splitlines()
    numbers = {int(ln.split()[1].split("/")[0]) for ln in lines if ln.startswith("step ") and ln.endswith("x" * 1000)}
    n = int(marker.read_text().split()[3])
    assert len(numbers) >= n - 2 and max(numbers) == n, (n, len(numbers))  # every line there, whole (one chunk may
    # have been reordered at the stop or the resume: monitors/watch/held.py)
    wait_until(lambda: not any(is_alive(r) for r in (sup, warden, keeper)), 30, what="no watcher left")
    assert len(_pages(pings, "frozen")) == 1


@system
def test_a_supervisor_killed_during_the_back_off_has_its_promised_restart_paged_as_not_happening(tmp_path: Path):
    restart = '[restart]\nmode = "enforce"\nmax_restarts = 1\nbackoff_s = 12\ncheckpoints = "ckpt_*"\n' \
              'complete_marker = "DONE"\nresume = ["--resume", "{checkpoint}"]\n'
    results = {}
    for name, kill in (("killed", True), ("control", False)):
        _repo, run_dir, pings = _launch(tmp_path, name, ["dies.py"], restart)
        sup, _job, warden, keeper = _refs(run_dir)
        promised = wait_until(lambda: _pages(pings, "restart"), 40, what="the restart paged")  # noqa: B023
        assert "restarting in 12 s" in promised[0]["message"], promised
        if kill:
            os.kill(sup.pid, signal.SIGKILL)
            missed = wait_until(lambda: _pages(pings, "restart_missed"), 10, what="the broken promise paged")  # noqa: B023
            assert "did not happen" in missed[0]["message"] and f"supervisor (pid {sup.pid})" in missed[0]["message"]
            assert (read_json(run_dir / "run.json") or {}).get("attempt") == 1  # nothing started
        else:  # the back-off runs out: the outcome (a next attempt, or the reason there is none) is recorded
            wait_until(lambda: not is_alive(sup), 60, what="the first supervisor's end after its back-off")  # noqa: B023
            d = (read_json(run_dir / "restart.json") or {}).get("decision") or {}
            assert d.get("attempt", 0) >= 2 or "started" in d or "not_started" in d, d
        wait_until(lambda: not is_alive(warden) and not is_alive(keeper), 60, what="the first attempt's watchers ended")  # noqa: B023
        results[name] = _pages(pings, "restart_missed")
    assert len(results["killed"]) == 1 and results["control"] == [], results


@system
def test_supervisor_lost_is_never_followed_by_a_resolved_page(tmp_path: Path):
    _repo, run_dir, pings = _launch(tmp_path, "lost", ["prints.py", "120", "0.06", "100", str(tmp_path / "m")])
    sup, job, warden, keeper = _refs(run_dir)
    os.kill(sup.pid, signal.SIGKILL)
    wait_until(lambda: _pages(pings, "supervisor_lost"), 10, what="the loss paged by the warden")
    wait_until(lambda: _size(run_dir) > 0 and is_alive(job), 5)
    size = _size(run_dir)
    wait_until(lambda: _size(run_dir) > size + 5_000, 20, what="the warden pumping the output")
    os.killpg(job.pid, signal.SIGKILL)
    wait_until(lambda: _pages(pings, "watchdog"), 15, what="the run's death paged")  # the warden looked many times
    wait_until(lambda: not is_alive(warden) and not is_alive(keeper), 60, what="the warden and the keeper ended")
    assert _pages(pings, "resolved") == [] and _pages(pings, "watchers_lost") == [], _pages(pings)


# --- unit: what a view says of a run nobody watches (in-process, no run started) ----------------------------------

def _view(tmp_path: Path, watched: bool) -> list[str]:
    """A run dir whose process is this test's own; its supervisor (and, with ``watched`` false, its warden and keeper)
    named by a stale identity (this pid, another create time: not alive)."""
    me = psutil.Process()
    live = {"pid": me.pid, "create_time": me.create_time()}
    stale = {"pid": me.pid, "create_time": me.create_time() - 1000}
    write_json_atomic(tmp_path / "run.json", {
        "v": 1, "name": "r", "attempt": 1, "launched_at_unix": time.time(), "argv": ["x"], "cwd": str(tmp_path),
        "process": live, "supervisor": live if watched else stale,
        "wardens": [{"role": "warden", **stale}, {"role": "keeper", **stale}]})
    snap = RunObserver(tmp_path).refresh()
    assert snap["watch"]["state"] == (WATCHED if watched else UNWATCHED), snap["watch"]
    return status_lines(snap)


def test_a_view_says_unwatched_when_the_runs_process_lives_and_none_of_its_watchers_does(tmp_path: Path):
    lines = _view(tmp_path, watched=False)
    warning = [ln for ln in lines if "UNWATCHED" in ln]
    assert warning and warning[0].strip().startswith("WARNING: UNWATCHED: the supervisor") and "SIGPIPE" in warning[0]
    assert "its warden (pid" in warning[0] and "its keeper (pid" in warning[0], warning


def test_a_view_of_a_watched_run_says_nothing_of_its_watchers(tmp_path: Path):
    assert not [ln for ln in _view(tmp_path, watched=True) if "UNWATCHED" in ln or "WARNING" in ln]


def test_a_promised_restart_is_read_only_from_the_owners_own_restart_json_and_only_while_it_has_no_outcome(
        tmp_path: Path):
    from stepwatch.monitors.watch.warden import promised_restart

    decision = {"attempt": 1, "mode": "enforce", "verdict": "RESTART", "words": "restarting in 20 s from scratch",
                "decided_at_unix": time.time(), "backoff_s": 20}
    path = tmp_path / "restart.json"
    run = {"attempt": 1}
    write_json_atomic(path, {"v": 1, "attempts": [], "decision": decision}, mode=0o644)
    assert promised_restart(tmp_path, run) == decision  # positive control: the owner's, promised, no outcome
    path.chmod(0o664)  # a team's member could have written it: neither believed to page nor to silence
    assert promised_restart(tmp_path, run) is None
    for other in ({"started": {"attempt": 2}}, {"not_started": "the operator stopped the run"}, {"mode": "observe"},
                  {"verdict": "STOP"}, {"attempt": 2}):
        write_json_atomic(path, {"v": 1, "attempts": [], "decision": {**decision, **other}}, mode=0o644)
        assert promised_restart(tmp_path, run) is None, other
