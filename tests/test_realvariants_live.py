"""Issue 31's variants live: the real capture programs (tools/capture_fixtures/, unmodified) launched by
stepwatch with no instrumentation, each compared with its own clock (``--clock FILE``: the program's
``time.time()`` after each step, one a line). A plain loop's ``tqdm(desc="train")`` bar and its postfix
loss (and the 80x24 screen), Lightning's Rich bar with ``max_steps`` only, the HF Trainer with no bar,
Lightning's TQDM bar over epochs with and without ``[log] epochs``, a run SIGKILLed mid-bar, and the HF
Trainer under ``torchrun --tee 3``. System tier: every test launches real runs."""

from __future__ import annotations

import json
import math
import os
import re
import signal
import sys
import time
from pathlib import Path

import pytest

from conftest import REPO_ROOT, make_repo, stepwatch, wait_until
from test_tmux import TmuxPane  # the operator's terminal: stepwatch attach in a real tmux
from stepwatch.monitors.runfiles import read_json

CAPTURE = REPO_ROOT / "tools" / "capture_fixtures"
TQDM_LOOP_PY = (CAPTURE / "tqdm_loop.py").read_text()
LIGHTNING_PY = (CAPTURE / "lightning_run.py").read_text()
HF_PY = (CAPTURE / "hf_trainer_run.py").read_text()
TORCHRUN = str(Path(sys.executable).parent / "torchrun")


# --- helpers ----------------------------------------------------------------------------------------
def _launch(tmp_path: Path, name: str, files: dict[str, str], argv: list[str], env: dict | None = None,
            exe: str = sys.executable) -> Path:
    """``stepwatch launch --no-tui --name NAME -- python ARGV`` (``exe`` for python) from a fresh repo
    holding ``files``."""
    repo = make_repo(tmp_path / "repo", files)
    r = stepwatch("launch", "--no-tui", "--name", name, "--", exe, *argv, cwd=repo, env=env)
    assert r.returncode == 0, (r.stdout, r.stderr)
    return repo / "runs" / name


def _launch_config(tmp_path: Path, name: str, files: dict[str, str], argv: list[str], log_table: str,
                   exe: str = sys.executable) -> Path:
    """The same through a run config (``run.toml``, committed with ``files``) holding ``log_table``."""
    command = ", ".join(json.dumps(a) for a in [exe, *argv])
    toml = f'name = "{name}"\ncommand = [{command}]\n{log_table}'
    repo = make_repo(tmp_path / "repo", {**files, "run.toml": toml})
    r = stepwatch("launch", "--no-tui", "run.toml", cwd=repo)
    assert r.returncode == 0, (r.stdout, r.stderr)
    return repo / "runs" / name


def _status(run_dir: Path) -> dict:
    r = stepwatch("status", str(run_dir), "--json")
    assert r.stdout, r.stderr
    return json.loads(r.stdout)


def _pid(run_dir: Path) -> int:
    run = read_json(run_dir / "run.json")
    assert run is not None, run_dir
    return run["process"]["pid"]


def _ended(run_dir: Path, timeout_s: float, what: str) -> dict:
    return wait_until(lambda: read_json(run_dir / "exit.json"), timeout_s, interval_s=0.2, what=what)


def _raw_log(run_dir: Path) -> str:
    return (run_dir / "train.log").read_bytes().decode("utf-8", "replace")  # \r kept (read_text makes it \n)


def _plain(text: str) -> str:
    from stepwatch.monitors.parsers.logformats import strip_escapes

    return strip_escapes(text)


def _median(xs: list[float]) -> float:
    """The nearest-rank median (the 50th percentile as stepwatch defines its percentiles)."""
    s = sorted(xs)
    return s[math.ceil(0.5 * len(s)) - 1]


def _clock(path: Path, from_step: int = 2) -> tuple[list[float], float]:
    """The program's own step-end times, and the nearest-rank median of the differences of consecutive
    ones: step k took t[k-1] - t[k-2] (1-based steps), counted from ``from_step`` (the first step, which
    has no step end before it, is never one)."""
    t = [float(x) for x in path.read_text().split()]
    assert len(t) >= from_step + 1, t
    return t, _median([t[k - 1] - t[k - 2] for k in range(max(from_step, 2), len(t) + 1)])


def _p50_report(snap: dict, own_p50: float) -> str:
    ours = snap["step_seconds"]["p50"]
    return (f"status p50 {ours} s vs the program's clock p50 {own_p50:.5f} s "
            f"({'-' if ours is None else f'{100 * (ours / own_p50 - 1):+.2f}%'}; n={snap['step_seconds']['n']})")


def _on_80x24(tmp_path: Path, run_dir: Path, *shown: str) -> str:
    """The run's screen in a real 80x24 tmux pane (``stepwatch attach``): it shows every text in ``shown``
    and no row is wider than the pane."""
    pane = TmuxPane(tmp_path, run_dir, 80, 24)
    try:
        screen = pane.wait_for(lambda s: all(t in s for t in shown), 30, f"{shown} on the 80x24 screen")
    finally:
        pane.close()
    assert all(len(ln) <= 80 for ln in screen.splitlines()), screen
    return screen


def _stall_alerts(snap: dict) -> list[dict]:
    return [a for a in snap["alerts"] if a["kind"] == "stall"]


# --- 1. a plain loop: tqdm(desc="train") with set_postfix(loss=...) -----------------------------------
@pytest.mark.slow
def test_a_plain_loops_train_bar_gives_its_steps_postfix_loss_and_own_step_time_on_json_and_80x24(tmp_path: Path):
    clock = tmp_path / "clock.txt"
    run_dir = _launch(tmp_path, "loop", {"loop.py": TQDM_LOOP_PY},
                      ["loop.py", "--steps", "60", "--sleep", "0.1", "--desc", "train", "--clock", str(clock)])
    wait_until(lambda: (_status(run_dir)["step"]["global_step"] or 0) >= 3, 60, interval_s=0.2,
               what="the loop's first steps")
    pane = TmuxPane(tmp_path, run_dir, 80, 24)
    try:  # the operator's 80x24 terminal, attached while the loop runs: the step N/60 in its header
        live = pane.wait_for(lambda s: re.search(r"step ([1-9]\d*)/60\b", s), 30, "step N/60 on the 80x24 screen")
        n_live = int(re.findall(r"step ([1-9]\d*)/60\b", live)[0])
        ex = _ended(run_dir, 60, "the loop to end")
        assert ex["returncode"] == 0, ex
        end_screen = pane.wait_for(lambda s: "step 60/60" in s, 20, "step 60/60 on the 80x24 screen")
    finally:
        pane.close()
    assert all(len(ln) <= 80 for ln in end_screen.splitlines()), end_screen
    own_t, own_p50 = _clock(clock)
    snap = _status(run_dir)
    raw = _raw_log(run_dir)
    bars = re.findall(r"train: +\d+%\|[^|]*\| (\d+)/60 \[[^\]]*loss=([\d.]+)\]", raw)
    print(f"loop: {_p50_report(snap, own_p50)}; live screen showed step {n_live}/60")
    assert len(own_t) == 60 and int(bars[-1][0]) == 60
    assert (snap["log"]["format"], snap["step"]["global_step"], snap["step"]["max_steps"]) == ("tqdm", 60, 60), \
        (snap["log"], snap["step"])
    assert snap["metrics"]["loss"]["value"] == pytest.approx(float(bars[-1][1]), rel=1e-6), snap["metrics"]
    assert snap["metrics"]["loss"]["step"] == 60
    assert snap["step_seconds"]["n"] >= 50, snap["step_seconds"]
    assert snap["step_seconds"]["p50"] == pytest.approx(own_p50, rel=0.03), _p50_report(snap, own_p50)


# --- 2. Lightning, max_steps only, its default (Rich) bar drawn into the file ---------------------------
#: lightning_run.py's options for 300 steps over epochs of 120 batches (120 + 120 + 60), ~0.1 s a step (the
#: log's arrival times are read on a ~10 ms notice: a 0.05 s step's median came out 3% low, quantized):
#: Rich's header says ``Epoch N/-2`` and its bar's total is the steps left in the last epoch, so 300 is
#: known from the last epoch on. No progress-bar callback: Lightning's default (RichProgressBar, rich is
#: installed), which draws into the file because stepwatch sets TTY_INTERACTIVE/TTY_COMPATIBLE.
RICH_300 = ["lt.py", "--max-steps", "300", "--default-bar", "--sleep", "0.1", "--samples", "960"]
#: A Rich frame in plain text: epoch, the counter in the epoch and the epoch's length (the bar glyphs between).
RICH_FRAME = re.compile(r"Epoch (\d+)/-2 [^\d\n]*?(\d+)/(\d+) ")


def _rich_frames(run_dir: Path) -> tuple[list[tuple[int, int, int]], int]:
    """Every Rich frame in train.log as (epoch, counter, length), and the global step of the last."""
    frames = [(int(e), int(n), int(length)) for e, n, length in RICH_FRAME.findall(_plain(_raw_log(run_dir)))]
    lengths = {e: length for e, _n, length in frames}
    epoch, n, _ = frames[-1]
    return frames, sum(lengths[e] for e in range(epoch)) + n


@pytest.mark.slow
def test_lightnings_default_rich_bar_with_max_steps_only_ends_at_step_300_of_300_at_its_own_step_time(tmp_path: Path):
    clock = tmp_path / "clock.txt"
    run_dir = _launch(tmp_path, "lt-rich", {"lt.py": LIGHTNING_PY}, [*RICH_300, "--clock", str(clock)])
    ex = _ended(run_dir, 120, "the Lightning run to end")
    assert ex["returncode"] == 0, ex
    own_t, own_p50 = _clock(clock)
    end = _status(run_dir)
    text = _plain(_raw_log(run_dir))
    print(f"lightning rich: {_p50_report(end, own_p50)}")
    assert len(own_t) == 300 and "Epoch 2/-2" in text and "`max_steps=300` reached" in text
    assert end["log"]["format"] == "lightning_rich", end["log"]
    assert (end["step"]["global_step"], end["step"]["max_steps"]) == (300, 300), end["step"]
    loss = float(re.findall(r"(?<!_)loss: ([\d.]+)", text)[-1])
    assert end["metrics"]["loss"]["value"] == pytest.approx(loss, abs=1e-3), end["metrics"]
    assert end["step_seconds"]["p50"] == pytest.approx(own_p50, rel=0.03), _p50_report(end, own_p50)
    _on_80x24(tmp_path, run_dir, "step 300/300", "EXITED 0")


@pytest.mark.slow
def test_a_frozen_lightning_rich_run_is_a_stall_at_the_last_step_its_bar_shows_past_100_of_an_epoch(tmp_path: Path):
    """Frozen by SIGSTOP in the second epoch, past its 100th batch (the frames there carry val_loss and a
    three-digit counter): a stall, at the last step the bar shows."""
    clock = tmp_path / "clock.txt"
    run_dir = _launch(tmp_path, "lt-stop", {"lt.py": LIGHTNING_PY}, [*RICH_300, "--clock", str(clock)])
    wait_until(lambda: clock.exists() and len(clock.read_text().split()) >= 120 + 105, 90, interval_s=0.05,
               what="the program's own step 225 (epoch 1, batch 105)")
    pid = _pid(run_dir)
    os.kill(pid, signal.SIGSTOP)
    try:
        frozen = wait_until(lambda: (s := _status(run_dir))["stall"]["state"] == "stalled" and s, 60,
                            interval_s=0.2, what="the stall")
        frames, shown = _rich_frames(run_dir)
        done = len(clock.read_text().split())
        print(f"lightning rich frozen: the bar shows step {shown} (frame {frames[-1]}), the program finished "
              f"{done}; status says {frozen['step']['global_step']}")
        # the bar may be a frame behind the program's own clock (Rich redraws after the step's end)
        assert frames[-1][0] == 1 and frames[-1][1] >= 100 and shown in (done - 1, done, done + 1), (frames[-3:], done)
        assert frozen["log"]["format"] == "lightning_rich", frozen["log"]
        assert frozen["step"]["global_step"] == shown, (frozen["step"], frames[-3:])
        kinds = [a["kind"] for a in frozen["alerts"]]  # held stopped: the frozen detector's alert may come too
        assert "stall" in kinds and set(kinds) <= {"stall", "frozen"}, frozen["alerts"]
        assert f"after step {shown}" in _stall_alerts(frozen)[0]["message"], frozen["alerts"]
    finally:
        os.kill(pid, signal.SIGKILL)
        os.kill(pid, signal.SIGCONT)


# --- 3. the HF Trainer with no bar: its log dicts are the steps ----------------------------------------
@pytest.mark.slow
def test_the_hf_trainer_with_no_bar_gives_a_step_per_log_dict_its_own_step_time_and_a_stall(tmp_path: Path):
    """``disable_tqdm=True, logging_steps=1``: PrinterCallback prints one dict per optimizer step, and
    nothing else moves. A bigger model than the default makes each step ~0.15 s on 2 cores (the log is timed on a ~10 ms notice)."""
    clock = tmp_path / "clock.txt"
    run_dir = _launch(tmp_path, "hf", {"hf.py": HF_PY},
                      ["hf.py", "--out-dir", "out", "--steps", "50", "--disable-tqdm", "--logging-steps", "1",
                       "--hidden", "128", "--layers", "2", "--seq-len", "512", "--clock", str(clock)])

    def judged() -> dict | None:
        s = _status(run_dir)
        assert s["ended"] is None, _raw_log(run_dir)[-2000:]  # the Trainer still runs
        return s if s["stall"]["state"] == "ok" and (s["step_seconds"]["n"] or 0) >= 5 else None

    snap = wait_until(judged, 90, interval_s=0.2, what="the stall detector to judge the Trainer's dicts")
    assert snap["log"]["format"] == "hf_logdict", snap["log"]
    pid = _pid(run_dir)
    os.kill(pid, signal.SIGSTOP)
    try:
        frozen = wait_until(lambda: (s := _status(run_dir))["stall"]["state"] == "stalled" and s, 60,
                            interval_s=0.2, what="the stall")
        dicts = re.findall(r"\{'loss': '?([\d.]+)'?, 'grad_norm'", _raw_log(run_dir))
        assert frozen["step"]["global_step"] == len(dicts), (frozen["step"], len(dicts))
        assert frozen["metrics"]["loss"]["value"] == pytest.approx(float(dicts[-1]), abs=1e-4)
        kinds = [a["kind"] for a in frozen["alerts"]]
        assert "stall" in kinds and set(kinds) <= {"stall", "frozen"}, frozen["alerts"]
        assert f"after step {len(dicts)}" in _stall_alerts(frozen)[0]["message"], frozen["alerts"]
    finally:
        os.kill(pid, signal.SIGCONT)
    ex = _ended(run_dir, 90, "the Trainer to end")
    assert ex["returncode"] == 0, ex
    # the dicts carry no step: the shape is taken at the second, so step 3 is the first timed one (start-up,
    # flagged "first", left out as ever): the program's clock over the same steps, from step 4
    timed = [json.loads(ln) for ln in (run_dir / "logsteps.jsonl").read_text().splitlines()]
    counted = [r["step"] for r in timed if "first" not in r["flags"]]
    assert counted == list(range(4, 51)), counted
    own_t, own_p50 = _clock(clock, from_step=4)
    print(f"hf no bar: the clock's p50 from step 2 {_clock(clock)[1]:.5f} s, from step 4 {own_p50:.5f} s")
    end = _status(run_dir)
    raw = _raw_log(run_dir)
    dicts = re.findall(r"\{'loss': '?([\d.]+)'?, 'grad_norm'", raw)
    print(f"hf no bar: {_p50_report(end, own_p50)}; frozen at step {frozen['step']['global_step']}")
    assert len(own_t) == 50 and len(dicts) == 50 and "'train_loss'" in raw and "it/s]" not in raw
    assert (end["log"]["format"], end["step"]["global_step"]) == ("hf_logdict", 50), (end["log"], end["step"])
    assert end["metrics"]["loss"]["value"] == pytest.approx(float(dicts[-1]), abs=1e-4) and \
        end["metrics"]["loss"]["step"] == 50, end["metrics"]["loss"]
    assert "train_loss" not in end["metrics"]
    assert end["step_seconds"]["p50"] == pytest.approx(own_p50, rel=0.05), _p50_report(end, own_p50)
    _on_80x24(tmp_path, run_dir, "step 50/?", "EXITED 0")


# --- 4. Lightning's TQDM bar over 3 epochs: the total from [log] epochs, never a per-epoch figure -------
@pytest.mark.slow
def test_lightnings_tqdm_bar_over_3_epochs_with_log_epochs_gives_the_total_and_an_eta_near_the_truth(tmp_path: Path):
    clock = tmp_path / "clock.txt"
    per_epoch = 80  # --samples 640, batch 8
    run_dir = _launch_config(tmp_path, "lt-epochs", {"lt.py": LIGHTNING_PY},
                             ["lt.py", "--sleep", "0.05", "--samples", "640", "--clock", str(clock)],
                             "[log]\nepochs = 3\n")
    total = 3 * per_epoch
    samples: list[tuple[int, float, float | None, str]] = []  # (step, when, eta_s, eta state) while it runs

    def past_the_middle():
        s = _status(run_dir)
        gs = s["step"]["global_step"]
        if s["ended"] is None and gs is not None:
            samples.append((gs, time.time(), s["eta"]["eta_s"], s["eta"]["state"]))
        return s if s["ended"] is None and gs is not None and gs >= total // 2 and s["eta"]["state"] == "ok" else None

    mid = wait_until(past_the_middle, 90, interval_s=0.2, what="the run past its middle, an ETA judged")
    assert mid["log"]["format"] == "lightning_tqdm", mid["log"]
    assert mid["step"]["max_steps"] == total, mid["step"]
    ex = _ended(run_dir, 120, "the Lightning run to end")
    assert ex["returncode"] == 0, ex
    own_t, own_p50 = _clock(clock)
    gs, eta_s = mid["step"]["global_step"], mid["eta"]["eta_s"]
    truth = (total - gs) * own_p50
    at = next(t for g, t, _e, _s in reversed(samples) if g == gs)
    really_left = own_t[-1] - at  # what the run in fact still took (validation passes included)
    end = _status(run_dir)
    print(f"lightning tqdm [log] epochs=3: at step {gs}/{total} ETA {eta_s:.2f} s vs truth {truth:.2f} s "
          f"({100 * (eta_s / truth - 1):+.1f}%; the run in fact took {really_left:.2f} s more); "
          f"{_p50_report(end, own_p50)}")
    assert len(own_t) == total
    assert (end["step"]["global_step"], end["step"]["max_steps"]) == (total, total), end["step"]
    assert mid["eta"]["remaining_steps"] == total - gs, mid["eta"]
    assert eta_s == pytest.approx(truth, rel=0.10), (mid["eta"], truth)
    loss = float(re.findall(r"Epoch 2: 100%.*?(?<!_)loss=([\d.]+)", _plain(_raw_log(run_dir)))[-1])
    assert end["metrics"]["loss"]["value"] == pytest.approx(loss, rel=1e-3, abs=1e-6), end["metrics"]
    _on_80x24(tmp_path, run_dir, f"step {total}/{total}", "EXITED 0")  # the header (the step line is cut at 80)


@pytest.mark.slow
def test_lightnings_tqdm_bar_without_log_epochs_has_no_total_and_no_eta_never_a_per_epoch_one(tmp_path: Path):
    per_epoch = 40  # --samples 320, batch 8; 3 epochs (lightning_run.py's max_epochs)
    run_dir = _launch(tmp_path, "lt-noepochs", {"lt.py": LIGHTNING_PY},
                      ["lt.py", "--sleep", "0.05", "--samples", "320"])
    seen: list[tuple[int, int | None, float | None, str]] = []

    def record():
        s = _status(run_dir)
        gs = s["step"]["global_step"]
        if s["ended"] is None and gs is not None:
            seen.append((gs, s["step"]["max_steps"], s["eta"]["eta_s"], s["eta"]["state"]))
        return s if s["ended"] is None and gs is not None and gs > per_epoch + 5 else None

    snap = wait_until(record, 90, interval_s=0.2, what="the run into its second epoch")
    assert snap["log"]["format"] == "lightning_tqdm", snap["log"]
    assert snap["step"]["max_steps"] is None, snap["step"]  # never the epoch's 40, nor 40 x anything
    assert snap["eta"]["eta_s"] is None and snap["eta"]["state"] == "not judged", snap["eta"]
    assert "planned number of steps is unknown" in (snap["eta"]["basis"] or ""), snap["eta"]
    ex = _ended(run_dir, 120, "the Lightning run to end")
    assert ex["returncode"] == 0, ex
    end = _status(run_dir)
    assert (end["step"]["global_step"], end["step"]["max_steps"]) == (3 * per_epoch, None), end["step"]
    assert all(m is None and e is None for _g, m, e, _s in seen), seen  # at no point a total or an ETA
    assert any(g <= per_epoch for g, *_ in seen), seen  # it was read in the first epoch too


# --- 5. a run SIGKILLed with a \r bar as its last output -----------------------------------------------
@pytest.mark.slow
def test_a_run_killed_mid_bar_has_an_end_alert_naming_the_step_reached_and_its_bar_without_control_codes(
        tmp_path: Path):
    run_dir = _launch(tmp_path, "killed", {"loop.py": TQDM_LOOP_PY},
                      ["loop.py", "--steps", "100", "--sleep", "0.05", "--kill-at", "60"])
    ex = _ended(run_dir, 60, "the loop to kill itself")
    assert ex["signal"] in ("SIGKILL", 9) or ex.get("returncode") == -9, ex
    raw = _raw_log(run_dir)
    assert raw and not raw.endswith("\n")  # the bar never ended its line
    bar = raw.rsplit("\r", 1)[-1].strip()
    counted = re.findall(r"^train: +\d+%\|[^|]*\| (\d+)/100 \[", bar)
    assert counted, bar
    n = int(counted[0])
    snap = _status(run_dir)
    assert snap["step"]["global_step"] == n, (snap["step"], bar)
    (end,) = [a for a in snap["alerts"] if a["kind"] == "watchdog"]
    msg = end["message"]
    print(f"killed: the end alert says {msg!r}")
    assert f"the run reached step {n} of 100; " in msg, msg
    assert f"last log line: {bar!r}" in msg, (msg, bar)
    assert "\x1b" not in msg and "\r" not in msg and "\\r" not in msg and "\\x1b" not in msg, msg
    text = stepwatch("status", str(run_dir)).stdout
    assert f"the run reached step {n} of 100" in text and bar in text, text
    assert "\x1b" not in text and "\r" not in text, repr(text)
    _on_80x24(tmp_path, run_dir, f"step {n}/100", "KILLED")


# --- 6. the HF Trainer under torchrun --tee 3 ----------------------------------------------------------
@pytest.mark.slow
def test_the_hf_trainer_under_torchrun_tee_gives_rank_0s_loss_and_learning_rate_at_their_step(tmp_path: Path):
    """torchrun tails a rank's stdout and stderr apart: a dict line lands glued to a bar frame, and the bar may be
    a few steps off when it arrives. Every dict is read, and with ``[log] logging_steps`` each is at its step."""
    run_dir = _launch_config(tmp_path, "tee", {"hf.py": HF_PY},
                             ["--nproc_per_node", "2", "--tee", "3", "hf.py", "--out-dir", "out", "--steps", "30",
                              "--logging-steps", "3"], "[log]\nlogging_steps = 3\n", exe=TORCHRUN)
    ex = _ended(run_dir, 120, "torchrun to end")
    raw = _raw_log(run_dir)
    dicts = re.findall(r"\[default0\]:\{'loss': '?([\d.]+)'?, 'grad_norm': '?[\d.e-]+'?, "
                       r"'learning_rate': '?([\d.e-]+)'?", raw)
    assert len(dicts) == 10, raw[-3000:]  # rank 0 printed a dict every 3 of its 30 steps
    snap = _status(run_dir)
    print(f"torchrun tee: exit {ex.get('returncode')} {ex.get('signal')}; step {snap['step']}; "
          f"loss {snap['metrics'].get('loss')}; learning_rate {snap['metrics'].get('learning_rate')}")
    assert snap["log"]["format"] == "tqdm" and snap["step"]["global_step"] == 30, (snap["log"], snap["step"])
    for name, printed in (("loss", dicts[-1][0]), ("learning_rate", dicts[-1][1])):
        m = snap["metrics"].get(name)
        assert m is not None and m["step"] == 30, (name, snap["metrics"])  # the last dict's own step
        assert m["value"] == pytest.approx(float(printed), rel=1e-3), (name, m, printed)


# --- 4b. timm's per-epoch counter through a user pattern with an epoch group ------------------------------
TIMM_PATTERN = r"Train: (?P<epoch>\d+) \[\s*(?P<step>\d+)/(?P<steps_per_epoch>\d+) .*Loss: (?P<loss>[\d.]+)"


@pytest.mark.slow
def test_a_timm_shaped_counter_through_a_pattern_with_epoch_gives_the_global_step_total_and_eta(tmp_path: Path):
    """timm's ``Train: 1 [  16/40 ( 43%)]`` (tools/capture_fixtures/timm_shaped.py prints timm's own format
    strings: timm itself is not installed here): its counter restarts every epoch; with the pattern's
    ``epoch``/``steps_per_epoch`` groups and ``[log] epochs`` the step is global, the total known, the ETA
    near the truth, and its ``Test:`` passes are evaluations (no step time)."""
    clock = tmp_path / "clock.txt"
    per_epoch, epochs = 40, 3
    run_dir = _launch_config(tmp_path, "timm", {"timm_shaped.py": (CAPTURE / "timm_shaped.py").read_text()},
                             ["timm_shaped.py", "--epochs", str(epochs), "--batches", str(per_epoch),
                              "--log-interval", "1", "--sleep", "0.1", "--clock", str(clock)],
                             f"[log]\npatterns = [{json.dumps(TIMM_PATTERN)}]\nepochs = {epochs}\n")
    total = per_epoch * epochs
    samples: list[tuple[int, float]] = []

    def in_the_second_epoch():
        s = _status(run_dir)
        gs = s["step"]["global_step"]
        if s["ended"] is None and gs is not None:
            samples.append((gs, time.time()))
        return s if s["ended"] is None and gs is not None and gs >= per_epoch + 10 and s["eta"]["state"] == "ok" else None

    mid = wait_until(in_the_second_epoch, 90, interval_s=0.2, what="the run in its second epoch, an ETA judged")
    ex = _ended(run_dir, 120, "the timm-shaped run to end")
    assert ex["returncode"] == 0, ex
    own_t, own_p50 = _clock(clock)
    gs, eta_s = mid["step"]["global_step"], mid["eta"]["eta_s"]
    truth = (total - gs) * own_p50
    end = _status(run_dir)
    print(f"timm pattern: at step {gs}/{total} ETA {eta_s:.2f} s vs truth {truth:.2f} s "
          f"({100 * (eta_s / truth - 1):+.1f}%); {_p50_report(end, own_p50)}; phase counts {end['phase']}")
    assert mid["log"]["format"] == "pattern 1" and mid["step"]["max_steps"] == total, (mid["log"], mid["step"])
    last = re.findall(r"^Train: (\d+) \[\s*(\d+)/(\d+)", _raw_log(run_dir), re.M)[-1]
    assert end["step"]["global_step"] == int(last[0]) * per_epoch + int(last[1]), (end["step"], last)
    assert eta_s == pytest.approx(truth, rel=0.10), (mid["eta"], truth)
    records = [json.loads(ln) for ln in (run_dir / "logsteps.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records if "eval" in r["flags"]] == [per_epoch, 2 * per_epoch], \
        [(r["step"], r["flags"]) for r in records if r["flags"]]  # the Test: pass after epochs 0 and 1
    assert end["step_seconds"]["p50"] == pytest.approx(own_p50, rel=0.05), _p50_report(end, own_p50)
    _on_80x24(tmp_path, run_dir, f"step {end['step']['global_step']}/{total}", "EXITED 0")
