"""No false page on healthy runs (issue 32), live: real, healthy programs, un-instrumented, launched by
stepwatch as users run them. An un-instrumented plain loop with a 20 s save every 200 steps (announced by a
save line, and once silent with the CPU busy); a tiny HF Trainer run with ``eval_steps=25`` and
``save_steps=50``; a nanoGPT-shaped run with an evaluation and a checkpoint every 500 iterations; a 2-rank
torchrun run whose rank 1 finishes 5 s earlier; a run with a 10 s teardown after its last step. Each must
end with zero alerts delivered (alerts.jsonl), the fallback detector not ``suspected``, and the step-time
p50 of ``status --json`` within 3% of the p50 of the program's own clock of its training steps (each program
writes its training steps' durations to a side file, evaluations and saves left out; nearest-rank
medians). System tier: real supervisors, real processes."""

from __future__ import annotations

import json
import math
import sys
import time
from pathlib import Path

import pytest

from conftest import make_repo, stepwatch
from stepwatch.monitors.runfiles import read_json

TORCHRUN = str(Path(sys.executable).parent / "torchrun")

# --- the programs ------------------------------------------------------------------------------------
#: A plain loop, ~0.1 s a step, printing ``step N loss X``; every 200 steps a 20 s save: announced by a
#: save line then sleeping (``saveline``), or printing nothing with the CPU busy (``busy``). Its clock
#: (argv[2]): ``step seconds`` a line, the time from the previous step's line (or the end of the save)
#: to this step's line.
LOOP_PY = '''\
import sys, time
mode, clock = sys.argv[1], open(sys.argv[2], "w")
STEPS, EVERY, SAVE_S = 420, 200, 20.0
last = time.perf_counter()
for i in range(1, STEPS + 1):
    time.sleep(0.1)
    print(f"step {i} loss {1 / i:.4f}", flush=True)
    now = time.perf_counter()
    clock.write(f"{i} {now - last!r}\\n")
    clock.flush()
    last = now
    if i % EVERY == 0 and i < STEPS:
        if mode == "saveline":  # a checkpoint the loop announces, then 20 s of silence
            print(f"saving checkpoint to ckpt/step_{i}", flush=True)
            time.sleep(SAVE_S)
        else:  # a save that prints nothing, the CPU busy for 20 s
            t = time.monotonic()
            while time.monotonic() - t < SAVE_S:
                sum(range(1000))
        last = time.perf_counter()  # the save is no training step
'''

#: The HF Trainer (its default bar) on a tiny randomly-initialised Llama (no downloads: a config, random
#: token ids), with evaluation every 25 steps and a checkpoint every 50. Its clock (argv[2]): one JSON
#: object a step from a TrainerCallback: ``inner`` (on_step_begin to on_step_end) and ``e2e`` (from the
#: previous on_step_end; null when an evaluation or a save ran in between: on_evaluate / on_save).
HF_PY = '''\
import json, sys, time
import torch
from torch.utils.data import Dataset
from transformers import LlamaConfig, LlamaForCausalLM, Trainer, TrainerCallback, TrainingArguments

out_dir, clock_path = sys.argv[1], sys.argv[2]


class Tokens(Dataset):
    def __init__(self, n, seq_len, vocab, seed):
        g = torch.Generator().manual_seed(seed)
        self.items = [torch.randint(0, vocab, (seq_len,), generator=g) for _ in range(n)]

    def __len__(self):
        return len(self.items)

    def __getitem__(self, i):
        return {"input_ids": self.items[i], "labels": self.items[i].clone()}


class Clock(TrainerCallback):
    def __init__(self, path):
        self.f = open(path, "w")
        self.begin = self.last_end = None
        self.between = False  # an evaluation or a save ran since the last step's end

    def on_step_begin(self, args, state, control, **kw):
        self.begin = time.perf_counter()

    def on_step_end(self, args, state, control, **kw):
        now = time.perf_counter()
        e2e = None if self.last_end is None or self.between else now - self.last_end
        self.f.write(json.dumps({"step": state.global_step, "inner": now - self.begin, "e2e": e2e}) + "\\n")
        self.f.flush()
        self.last_end, self.between = now, False

    def on_evaluate(self, args, state, control, **kw):
        self.between = True

    def on_save(self, args, state, control, **kw):
        self.between = True


torch.manual_seed(0)
cfg = LlamaConfig(hidden_size=128, intermediate_size=256, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=4, vocab_size=256, max_position_embeddings=512)
args = TrainingArguments(output_dir=out_dir, max_steps=150, per_device_train_batch_size=8,
                         per_device_eval_batch_size=8, learning_rate=1e-3, warmup_steps=5, logging_steps=5,
                         eval_strategy="steps", eval_steps=25, save_strategy="steps", save_steps=50,
                         report_to="none", use_cpu=True, dataloader_num_workers=0, seed=0)
trainer = Trainer(model=LlamaForCausalLM(cfg), args=args, train_dataset=Tokens(150 * 8, 512, 256, 0),
                  eval_dataset=Tokens(96, 512, 256, 1), callbacks=[Clock(clock_path)])
print("TrainOutput:", trainer.train(), flush=True)
'''

#: nanoGPT's train.py in shape: an evaluation at every 500th iteration (3 s, CPU busy) printing ``step N:
#: train loss X, val loss Y``, then (past iteration 0) ``saving checkpoint to out`` and a 3 s save; then
#: ``iter N: loss X, time Yms, mfu Z%`` with nanoGPT's own ``time`` (since the previous iteration's, the
#: evaluation and the save included, as train.py prints it). Iterations of ~15 ms. Its clock (argv[1]):
#: ``iter seconds`` for each iteration with no evaluation or save before it.
NANOGPT_PY = '''\
import math, sys, time
clock = open(sys.argv[1], "w")
MAX_ITERS, EVAL_INTERVAL, ITER_S, EVAL_S, SAVE_S = 1200, 500, 0.015, 3.0, 3.0
print("tokens per iteration will be: 512", flush=True)
print("number of parameters: 0.10M", flush=True)


def busy(s):
    t = time.monotonic()
    while time.monotonic() - t < s:
        sum(range(1000))


running_mfu = -1.0
t0 = time.time()
for iter_num in range(MAX_ITERS + 1):
    lossf = 4.2 * math.exp(-iter_num / 800) + 0.1
    evaluated = iter_num % EVAL_INTERVAL == 0
    if evaluated:
        busy(EVAL_S)  # estimate_loss()
        print(f"step {iter_num}: train loss {lossf:.4f}, val loss {lossf + 0.01:.4f}", flush=True)
        if iter_num > 0:
            print("saving checkpoint to out", flush=True)
            time.sleep(SAVE_S)  # torch.save
    time.sleep(ITER_S)  # forward, backward, optimizer step
    t1 = time.time()
    dt, t0 = t1 - t0, t1
    if iter_num >= 5:
        running_mfu = 0.02 if running_mfu == -1.0 else 0.9 * running_mfu + 0.1 * 0.02
    print(f"iter {iter_num}: loss {lossf:.4f}, time {dt * 1000:.2f}ms, mfu {running_mfu * 100:.2f}%", flush=True)
    if not evaluated and iter_num > 0:
        clock.write(f"{iter_num} {dt!r}\\n")
        clock.flush()
'''

#: Two gloo ranks stepping together (an all_reduce a step, ~0.1 s) for 150 steps; rank 0 goes on alone for
#: 50 more (5 s) while rank 1 destroys its process group and exits 0. Each rank prints ``step N loss X``
#: (torchrun --tee 3 puts ``[defaultN]:`` before each line) and writes its own clock to argv[1].rankN.
DDP_PY = '''\
import os, sys, time
import torch, torch.distributed as dist
dist.init_process_group("gloo")
rank = dist.get_rank()
clock = open(f"{sys.argv[1]}.rank{rank}", "w")
SHARED, EXTRA = 150, 50
last = time.perf_counter()
for step in range(1, SHARED + (EXTRA if rank == 0 else 0) + 1):
    if step <= SHARED:
        dist.all_reduce(torch.ones(10))
    time.sleep(0.1)
    print(f"step {step} loss {1 / step:.4f}", flush=True)
    now = time.perf_counter()
    clock.write(f"{step} {now - last!r}\\n")
    clock.flush()
    last = now
print(f"rank {rank} done", flush=True)
dist.destroy_process_group()
'''

#: 100 steps of ~0.1 s, then a 10 s teardown (idle, or CPU busy) after the last step. ``form``: ``total``
#: prints ``step N/100 loss X`` (its total known), ``tqdm`` draws a tqdm bar of 100 with a loss postfix,
#: ``plain`` prints ``step N loss X`` (no total). Clock as LOOP_PY's.
TEARDOWN_PY = '''\
import sys, time
form, teardown, clock = sys.argv[1], sys.argv[2], open(sys.argv[3], "w")
N = 100
last = time.perf_counter()
if form == "tqdm":
    from tqdm import tqdm
    bar = tqdm(range(1, N + 1), desc="train")
    steps = bar
else:
    steps = range(1, N + 1)
for i in steps:
    time.sleep(0.1)
    if form == "tqdm":
        bar.set_postfix(loss=1 / i)
    elif form == "total":
        print(f"step {i}/{N} loss {1 / i:.4f}", flush=True)
    else:
        print(f"step {i} loss {1 / i:.4f}", flush=True)
    now = time.perf_counter()
    clock.write(f"{i} {now - last!r}\\n")
    clock.flush()
    last = now
if form == "tqdm":
    bar.close()
if form == "said":  # no total in the log, but the program says it is done before its idle teardown
    print("Training complete.", flush=True)
if teardown == "idle":  # joining workers, destroy_process_group, a logger's flush: waiting
    time.sleep(10)
else:  # a final save or a summary computed, nothing printed
    t = time.monotonic()
    while time.monotonic() - t < 10:
        sum(range(1000))
'''


# --- helpers ----------------------------------------------------------------------------------------
def _status(run_dir: Path) -> dict:
    r = stepwatch("status", str(run_dir), "--json")
    assert r.stdout, r.stderr
    return json.loads(r.stdout)


def _launch(repo: Path, name: str, argv: list[str], exe: str = sys.executable, env: dict | None = None) -> Path:
    r = stepwatch("launch", "--no-tui", "--name", name, "--", exe, *argv, cwd=repo, env=env)
    assert r.returncode == 0, (r.stdout, r.stderr)
    return repo / "runs" / name


def _median(xs: list[float]) -> float:
    """The nearest-rank median (the 50th percentile as stepwatch defines its percentiles)."""
    s = sorted(xs)
    return s[math.ceil(0.5 * len(s)) - 1]


def _clock(path: Path) -> list[float]:
    """A ``step seconds`` clock file's durations."""
    return [float(ln.split()[1]) for ln in path.read_text().splitlines() if ln.strip()]


def _jsonl(path: Path) -> list[dict]:
    return [json.loads(ln) for ln in path.read_text().splitlines() if ln.strip()] if path.exists() else []


def _alerts(run_dir: Path) -> list[dict]:
    """The alerts the supervisor recorded (and so delivered) for the run."""
    return [r for r in _jsonl(run_dir / "alerts.jsonl") if r.get("kind") == "alert"]


class Watch:
    """Polls each run's ``status --json`` until every run has ended, keeping each change of the stall,
    fallback, phase and frozen verdicts (for the diagnosis), then the end snapshot of each."""

    def __init__(self, runs: dict[str, Path]):
        self.runs = runs
        self.t0 = time.time()
        self.timeline: dict[str, list[str]] = {name: [] for name in runs}
        self._last: dict[str, tuple] = {}

    def _note(self, name: str, s: dict) -> None:
        key = (s["state"], s["phase"]["name"], s["stall"]["state"], s["fallback"]["state"],
               s["liveness"]["frozen"]["state"], s["straggler"].get("state"))
        if key != self._last.get(name):
            self._last[name] = key
            self.timeline[name].append(
                f"+{time.time() - self.t0:6.1f}s step {s['step']['global_step']} state {s['state']} phase "
                f"{s['phase']['name']}; stall {s['stall']['state']} ({s['stall']['reason']}); fallback "
                f"{s['fallback']['state']} ({s['fallback']['reason']}); frozen {s['liveness']['frozen']['state']}; "
                f"straggler {s['straggler'].get('state')} ({s['straggler'].get('reason')})")

    def until_ended(self, timeout_s: float, interval_s: float = 1.5) -> dict[str, dict]:
        deadline = time.monotonic() + timeout_s
        left = dict(self.runs)
        ends: dict[str, dict] = {}
        while left:
            for name, run_dir in list(left.items()):
                ex = read_json(run_dir / "exit.json")
                try:
                    self._note(name, _status(run_dir))
                except (AssertionError, json.JSONDecodeError, KeyError):
                    pass
                if ex is not None:
                    ends[name] = ex
                    del left[name]
            if left and time.monotonic() > deadline:
                pytest.fail(f"timed out after {timeout_s} s waiting for {sorted(left)} to end")
            time.sleep(interval_s)
        return ends


def _judge(name: str, run_dir: Path, own: list[float], ex: dict, watch: Watch, rel: float = 0.03) -> list[str]:
    """The issue's three checks on one ended run (and its exit 0), each failure as a line; the run's
    diagnosis printed."""
    end = _status(run_dir)
    alerts = _alerts(run_dir)
    own_p50 = _median(own)
    ss = end["step_seconds"]
    p50 = ss["p50"]
    problems = []
    if ex.get("returncode") != 0:
        problems.append(f"{name}: exited {ex}")
    if alerts:
        problems.append(f"{name}: {len(alerts)} alert(s) delivered: "
                        + "; ".join(f"[{a.get('alert_kind')}] {a.get('message')}" for a in alerts))
    if end["fallback"]["state"] == "suspected":
        problems.append(f"{name}: fallback suspected at the end: {end['fallback']}")
    off = None if p50 is None else p50 / own_p50 - 1
    if off is None or abs(off) > rel:
        problems.append(f"{name}: status p50 {p50} s vs the program's clock p50 {own_p50:.5f} s "
                        f"({'-' if off is None else f'{100 * off:+.2f}%'}; n={ss['n']} vs {len(own)})")
    records = [r for r in _jsonl(run_dir / "logsteps.jsonl") if r.get("kind") == "step"]
    odd = [r for r in records if r.get("flags") or (r.get("dt") or 0) > 3 * own_p50]
    print(f"\n=== {name}: {'OK' if not problems else 'FAILED'}; exit {ex.get('returncode')} {ex.get('signal')}; "
          f"step {end['step']}; log {end['log'].get('format')}")
    print(f"  step_seconds {ss} vs own p50 {own_p50:.5f} (n={len(own)}, min {min(own):.4f}, max {max(own):.4f})"
          f" -> {'-' if off is None else f'{100 * off:+.2f}%'}")
    print(f"  fallback {end['fallback']}\n  warmup {end['warmup']}\n  stall {end['stall']}\n  phase {end['phase']}")
    print(f"  liveness {end['liveness']}\n  straggler {end['straggler']}")
    for r in end.get("ranks") or []:
        print(f"  rank {r.get('rank')}: pid {r.get('pid')} alive {r.get('alive')} rc {r.get('returncode')} "
              f"signal {r.get('signal')} steps {r.get('steps')}")
    for a in alerts:
        print(f"  alerts.jsonl: +{(a.get('t') or 0) - watch.t0:.1f}s {json.dumps(a)[:1500]}")
    print(f"  status alerts: {[(a['kind'], a['message']) for a in end['alerts']]}")
    print(f"  logsteps.jsonl: {len(records)} step records; flagged or dt > 3x own p50: {len(odd)}")
    for r in odd[:20]:
        print(f"    step {r['step']} dt {r['dt']:.4f} flags {r['flags']} timing {r.get('timing')}"
              + (f" arrival_dt_s {r['arrival_dt_s']}" if "arrival_dt_s" in r else ""))
    for line in watch.timeline[name]:
        print(f"  {line}")
    return problems


# --- 1. a plain loop with a 20 s save every 200 steps ------------------------------------------------
@pytest.mark.slow
def test_a_plain_loop_saving_20_s_every_200_steps_with_a_save_line_or_busy_and_silent_pages_nothing(
        tmp_path: Path):
    repo = make_repo(tmp_path / "repo", {"loop.py": LOOP_PY})
    modes = ("saveline", "busy")
    runs = {m: _launch(repo, m, ["loop.py", m, str(tmp_path / f"clock-{m}.txt")]) for m in modes}
    watch = Watch(runs)
    ends = watch.until_ended(170)
    problems = []
    for m in modes:
        own = _clock(tmp_path / f"clock-{m}.txt")
        assert len(own) == 420, len(own)
        problems += _judge(m, runs[m], own, ends[m], watch)
    assert not problems, "\n".join(problems)


# --- 2. the HF Trainer with eval_steps=25 and save_steps=50 --------------------------------------------
@pytest.mark.slow
def test_a_tiny_hf_trainer_run_evaluating_every_25_steps_and_saving_every_50_pages_nothing(tmp_path: Path):
    repo = make_repo(tmp_path / "repo", {"hf.py": HF_PY})
    clock = tmp_path / "clock-hf.jsonl"
    run_dir = _launch(repo, "hf", ["hf.py", str(tmp_path / "out"), str(clock)], env={"OMP_NUM_THREADS": "1"})
    watch = Watch({"hf": run_dir})
    ends = watch.until_ended(170)
    steps = _jsonl(clock)
    assert len(steps) == 150, (len(steps), (run_dir / "train.log").read_text()[-3000:])
    own = [s["e2e"] for s in steps if s["e2e"] is not None]
    print(f"\nhf: own clock p50 step to step (no eval/save between) {_median(own):.5f} s (n={len(own)}), "
          f"on_step_begin to on_step_end {_median([s['inner'] for s in steps]):.5f} s")
    log = (run_dir / "train.log").read_text()
    assert log.count("Saving model checkpoint") >= 3 or (tmp_path / "out" / "checkpoint-150").exists(), log[-2000:]
    problems = _judge("hf", run_dir, own, ends["hf"], watch)
    assert not problems, "\n".join(problems)


# --- 3. a nanoGPT-shaped run: an evaluation and a checkpoint every 500 iterations ----------------------
@pytest.mark.slow
def test_a_nanogpt_shaped_run_evaluating_and_saving_every_500_iterations_pages_nothing(tmp_path: Path):
    repo = make_repo(tmp_path / "repo", {"train.py": NANOGPT_PY})
    clock = tmp_path / "clock-nanogpt.txt"
    run_dir = _launch(repo, "nanogpt", ["train.py", str(clock)])
    watch = Watch({"nanogpt": run_dir})
    ends = watch.until_ended(150)
    own = _clock(clock)
    assert len(own) == 1200 - 2, len(own)  # every iteration but 0, 500 and 1000
    problems = _judge("nanogpt", run_dir, own, ends["nanogpt"], watch)
    assert not problems, "\n".join(problems)


# --- 4. torchrun, 2 ranks, rank 1 finishing 5 s earlier ------------------------------------------------
@pytest.mark.slow
def test_a_two_rank_torchrun_run_whose_rank_1_finishes_5_s_earlier_pages_nothing(tmp_path: Path):
    repo = make_repo(tmp_path / "repo", {"ddp.py": DDP_PY})
    clock = tmp_path / "clock-ddp"
    run_dir = _launch(repo, "ddp", ["--nproc-per-node", "2", "--tee", "3", "ddp.py", str(clock)], exe=TORCHRUN,
                      env={"OMP_NUM_THREADS": "1"})
    watch = Watch({"ddp": run_dir})
    ends = watch.until_ended(150)
    own0 = _clock(Path(f"{clock}.rank0"))
    own1 = _clock(Path(f"{clock}.rank1"))
    assert (len(own0), len(own1)) == (200, 150), (len(own0), len(own1))
    log = (run_dir / "train.log").read_text()
    assert "[default1]:rank 1 done" in log and "[default0]:rank 0 done" in log, log[-2000:]
    print(f"\nddp: rank 1's own clock p50 {_median(own1):.5f} s")
    problems = _judge("ddp", run_dir, own0, ends["ddp"], watch)
    snap = _status(run_dir)
    bad = [r for r in snap["ranks"] if r["signal"] or (r["returncode"], r["exit_source"]) not in ((0, "kernel"),
                                                                                                 (None, None))]
    if bad:
        problems.append(f"ddp: a rank did not end cleanly: {bad}")
    assert not problems, "\n".join(problems)


# --- 5. a 10 s teardown after the last step -------------------------------------------------------------
#: (name, form, teardown): a total the log gives (``step N/100``, a tqdm bar at 100/100) then 10 s idle;
#: no total (``step N``) then 10 s CPU busy, silent (busy but silent: judged stuck only at the busy budget).
#: No total and idle is left out: nothing tells it from a hang (test_liveness_live's idle control, paged).
TEARDOWNS = [("total-idle", "total", "idle"), ("tqdm-idle", "tqdm", "idle"), ("plain-busy", "plain", "busy"),
             ("said-idle", "said", "idle")]


@pytest.mark.slow
def test_a_run_with_a_10_s_teardown_after_its_last_step_pages_nothing(tmp_path: Path):
    repo = make_repo(tmp_path / "repo", {"td.py": TEARDOWN_PY})
    runs = {name: _launch(repo, name, ["td.py", form, teardown, str(tmp_path / f"clock-{name}.txt")])
            for name, form, teardown in TEARDOWNS}
    watch = Watch(runs)
    ends = watch.until_ended(120, interval_s=1.0)
    problems = []
    for name, _form, _teardown in TEARDOWNS:
        own = _clock(tmp_path / f"clock-{name}.txt")
        assert len(own) == 100, len(own)
        problems += _judge(name, runs[name], own, ends[name], watch)
    assert not problems, "\n".join(problems)
