"""stepwatch.telemetry: the emitter that runs inside the training process and writes
events.jsonl (one JSON object per line: run_start, step, dynamo, ..., run_end).

Real components throughout: a real ``transformers.Trainer`` run on the CPU, real files, real
ENOSPC (``/dev/full``), a real removed directory, real dynamo compilations (``backend="eager"``, which
runs dynamo's tracing, guards, recompiles and limit without inductor's C++ compile: ~0.2 s instead of
15-26 s per compile) in a subprocess, and dynamo log records rebuilt from the captured
``tests/fixtures/real`` logs.
"""

from __future__ import annotations

import collections
import errno
import importlib.metadata
import importlib.util
import json
import logging
import math
import os
import platform
import random
import re
import shutil
import struct
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from conftest import FIXTURES_REAL
from stepwatch.telemetry import EVENT_KEYS, NESTED_KEYS, StepTelemetry, nearest_rank, step_summary
from stepwatch.telemetry import core as tcore
from stepwatch.telemetry.dynamo import (DynamoObserver, _CountingHandler, counters_snapshot, frame_compile_id,
                                      frames_total)

REPO_ROOT = Path(__file__).resolve().parents[1]
WARN_PREFIX = "stepwatch telemetry:"

# One example line of each kind of events.jsonl record: they are the schema.
DOCUMENTED_EXAMPLE = """
{"v":1,"kind":"run_start","t":1780000000.1,"step":null,"rank":0,"world_size":1,"pid":4242,"max_steps":1312,
 "versions":{"python":"3.11.7","torch":"2.13.0","transformers":"5.24.0"},
 "attn_implementation":{"requested":"flex_attention","resolved":"flex_attention"}}
{"v":1,"kind":"step","t":1780000019.6,"step":612,"rank":0,"dt":19.48,"step_begin":1780000000.2,
 "step_end":1780000019.6,"tokens":26048,"padded_tokens":26112,"flags":["save"],"batch_size":32,"width":816}
{"v":1,"kind":"phase","t":1780000020.0,"step":612,"rank":0,"name":"save","state":"begin"}
{"v":1,"kind":"dynamo","t":1780000021.0,"step":612,"rank":0,"counters":{"stats":{"unique_graphs":4},
 "frames":{"total":5,"ok":4}},"recompiles":3,"recompile_limit_hits":1}
{"v":1,"kind":"log","t":1780000022.0,"step":610,"rank":0,"logs":{"loss":1.93,"learning_rate":2e-05}}
{"v":1,"kind":"run_end","t":1780025000.0,"step":1312,"rank":0,"step_seconds":{"n":1311,"min":11.84,
 "p50":19.48,"p90":24.1,"p99":28.96,"max":45.79},"dynamo":{"recompiles":3,"recompile_limit_hits":1},
 "dropped_events":0}
"""


def design_examples() -> dict[str, dict]:
    """Parse the example block (objects wrapped over several lines) into {kind: event}."""
    out, buf = {}, ""
    for line in DOCUMENTED_EXAMPLE.strip().splitlines():
        buf += line.strip()
        try:
            ev = json.loads(buf)
        except ValueError:
            continue
        out[ev["kind"]] = ev
        buf = ""
    assert not buf
    return out


def read_events(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def assert_schema(ev: dict) -> None:
    """Every key of the event's kind present, in order, nothing else; fixed nested objects complete."""
    kind = ev["kind"]
    assert list(ev) == list(EVENT_KEYS[kind]), (kind, list(ev))
    assert ev["v"] == 1
    for (k, key), nested in NESTED_KEYS.items():
        if k == kind:
            assert list(ev[key]) == list(nested), (kind, key, ev[key])


def stderr_warnings(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.startswith(WARN_PREFIX)]


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch):
    for name in ("STEPWATCH_RUN_DIR", "STEPWATCH_ATTEMPT", "RANK", "LOCAL_RANK", "WORLD_SIZE"):
        monkeypatch.delenv(name, raising=False)


def test_schema_matches_design_examples():
    examples = design_examples()
    assert set(examples) == set(EVENT_KEYS)
    for kind, ev in examples.items():
        assert list(ev) == list(EVENT_KEYS[kind]), kind
        for (k, key), nested in NESTED_KEYS.items():
            if k == kind:
                assert list(ev[key]) == list(nested)


# --------------------------------------------------------------------------------------------------
# A real HF Trainer run
# --------------------------------------------------------------------------------------------------

@pytest.mark.slow  # a real training run / several seconds of a real process
def test_trainer_run_writes_the_protocol(tmp_path, monkeypatch, capsys):
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    from transformers import LlamaConfig, LlamaForCausalLM, Trainer, TrainingArguments

    from stepwatch.telemetry import StepwatchCallback

    run_dir = tmp_path / "run"
    run_dir.mkdir()
    monkeypatch.setenv("STEPWATCH_RUN_DIR", str(run_dir))
    monkeypatch.setenv("STEPWATCH_ATTEMPT", "1")

    torch.manual_seed(0)
    cfg = LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=4, vocab_size=256, max_position_embeddings=256)
    model = LlamaForCausalLM(cfg)
    g = torch.Generator().manual_seed(0)
    items = [torch.randint(0, 256, (int(torch.randint(8, 33, (1,), generator=g)),), generator=g) for _ in range(120)]

    class Synthetic(torch.utils.data.Dataset):
        def __len__(self):
            return len(items)

        def __getitem__(self, i):
            return {"input_ids": items[i]}

    real_tokens: list[int] = []  # attention-mask sum of each batch, in the order the Trainer fetched them

    def collate(batch):
        L = max(b["input_ids"].shape[0] for b in batch)
        ids = torch.zeros(len(batch), L, dtype=torch.long)
        labels = torch.full((len(batch), L), -100, dtype=torch.long)
        att = torch.zeros(len(batch), L, dtype=torch.long)
        for i, b in enumerate(batch):
            n = b["input_ids"].shape[0]
            ids[i, :n] = b["input_ids"]
            labels[i, :n] = b["input_ids"]
            att[i, :n] = 1
        real_tokens.append(int(att.sum()))
        shapes.append((len(batch), L))
        return {"input_ids": ids, "labels": labels, "attention_mask": att}

    shapes: list[tuple[int, int]] = []  # (sequences, padded width) of each batch

    args = TrainingArguments(
        output_dir=str(tmp_path / "out"), max_steps=20, per_device_train_batch_size=4, learning_rate=1e-3,
        logging_steps=5, save_strategy="steps", save_steps=10, report_to="none", disable_tqdm=True,
        use_cpu=True, dataloader_num_workers=0, include_num_input_tokens_seen="non_padding", seed=0,
    )
    cb = StepwatchCallback(attn_implementation_requested="sdpa")
    assert isinstance(cb, transformers.TrainerCallback)
    Trainer(model=model, args=args, train_dataset=Synthetic(), data_collator=collate, callbacks=[cb]).train()

    events = read_events(run_dir / "events.jsonl")
    for ev in events:
        assert_schema(ev)
        assert ev["rank"] == 0

    start = events[0]
    assert start["kind"] == "run_start"
    assert start["versions"] == {"python": platform.python_version(), "torch": torch.__version__,
                                 "transformers": transformers.__version__}
    assert start["attn_implementation"] == {"requested": "sdpa", "resolved": model.config._attn_implementation}
    assert start["attn_implementation"]["resolved"] == "sdpa"
    assert (start["max_steps"], start["world_size"], start["pid"]) == (20, 1, os.getpid())

    steps = [ev for ev in events if ev["kind"] == "step"]
    assert [ev["step"] for ev in steps] == list(range(1, 21))
    assert steps[0]["flags"] == ["first"]
    assert all("first" not in ev["flags"] for ev in steps[1:])
    # saves after step 10 and (final) after step 20; only the step after a save carries "save"
    assert [ev["step"] for ev in steps if "save" in ev["flags"]] == [11]
    assert all(ev["flags"] == [] for ev in steps[1:] if ev["step"] != 11)
    # steps tile: each dt runs from the previous step's end
    for prev, cur in zip(steps, steps[1:]):
        assert cur["step_begin"] == prev["step_end"]
        assert cur["step_end"] - cur["step_begin"] == pytest.approx(cur["dt"], abs=2e-3)
    # tokens: the real (attention-mask) tokens of each optimizer step
    assert [ev["tokens"] for ev in steps] == real_tokens[:20]
    # the batch shape, from the model's forward pre-hook (a tensor's shape: no device sync)
    assert [(ev["batch_size"], ev["width"]) for ev in steps] == shapes[:20]
    assert [ev["padded_tokens"] for ev in steps] == [b * w for b, w in shapes[:20]]

    kinds = [(ev["kind"], ev["step"], ev.get("name"), ev.get("state"))
             for ev in events if ev["kind"] in ("step", "phase")]
    i10 = kinds.index(("step", 10, None, None))
    assert kinds[i10 + 1:i10 + 4] == [("phase", 10, "save", "begin"), ("phase", 10, "save", "end"),
                                      ("step", 11, None, None)]
    assert kinds[-2:] == [("phase", 20, "save", "begin"), ("phase", 20, "save", "end")]
    assert (tmp_path / "out" / "checkpoint-10").is_dir()

    logs = [ev for ev in events if ev["kind"] == "log"]
    assert [ev["step"] for ev in logs][:4] == [5, 10, 15, 20]
    assert isinstance(logs[0]["logs"]["loss"], float)

    end = events[-1]
    assert end["kind"] == "run_end" and end["step"] == 20
    ss = end["step_seconds"]
    assert ss["n"] == 18  # the first step, and step 11 that held the save (R18), are no step time
    counted = sorted(ev["dt"] for ev in steps[1:] if "save" not in ev["flags"])
    assert ss == step_summary(counted)
    assert {ss[k] for k in ("min", "p50", "p90", "p99", "max")} <= set(counted)
    # The step after the checkpoint save carries its cost: the save phase lies inside step 11's
    # end-to-end interval (checked on the recorded times, not on how slow the disk was today).
    save = [ev for ev in events if ev["kind"] == "phase" and ev["name"] == "save" and ev["step"] == 10]
    assert steps[9]["step_end"] <= save[0]["t"] <= save[1]["t"] <= steps[10]["step_end"]
    assert steps[10]["step_begin"] == steps[9]["step_end"]
    assert end["dropped_events"] == 0
    assert end["dynamo"] == {"recompiles": 0, "recompile_limit_hits": 0}  # dynamo loaded, nothing compiled
    assert stderr_warnings(capsys.readouterr().err) == []


@pytest.mark.system
def test_callback_records_resolved_beside_requested(tmp_path):
    """Requested and resolved are different claims (ARCHITECTURE.md R4): a model that resolved to another
    backend than the harness asked for must show both."""
    pytest.importorskip("torch")
    from transformers import LlamaConfig, LlamaForCausalLM, TrainerControl, TrainerState, TrainingArguments

    from stepwatch.telemetry import StepwatchCallback

    model = LlamaForCausalLM(LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=1,
                                         num_attention_heads=4, num_key_value_heads=4, vocab_size=256,
                                         attn_implementation="eager"))
    assert model.config._attn_implementation == "eager"
    cb = StepwatchCallback(attn_implementation_requested="sdpa", run_dir=tmp_path)
    args = TrainingArguments(output_dir=str(tmp_path / "out"), use_cpu=True, report_to="none")
    cb.on_train_begin(args, TrainerState(max_steps=7), TrainerControl(), model=model)
    cb.telemetry.close()
    start = read_events(tmp_path / "events.jsonl")[0]
    assert start["attn_implementation"] == {"requested": "sdpa", "resolved": "eager"}
    assert start["max_steps"] == 7


# --------------------------------------------------------------------------------------------------
# Plain loops
# --------------------------------------------------------------------------------------------------

def test_plain_loop_every_kind_has_every_key(tmp_path):
    tel = StepTelemetry(run_dir=tmp_path, max_steps=3, attn_implementation_requested="eager",
                        attn_implementation_resolved="eager")
    tel.step_begin()
    tel.step_end(tokens=100, padded_tokens=128)
    tel.phase("eval", "begin")
    tel.phase("eval", "end")
    tel.log({"loss": 1.5, "learning_rate": 2e-05})
    tel.step_end(flags=["mine"])
    tel.step_end()
    ret = tel.run_end()
    tel.close()

    events = read_events(tmp_path / "events.jsonl")
    for ev in events:
        assert_schema(ev)
    assert [ev["kind"] for ev in events] == ["run_start", "step", "phase", "phase", "log", "step", "step", "run_end"]
    start, s1, p1, p2, log, s2, s3, end = events
    assert start["step"] is None and start["max_steps"] == 3
    assert start["attn_implementation"] == {"requested": "eager", "resolved": "eager"}
    assert start["versions"]["python"] and start["pid"] == os.getpid()
    assert (s1["tokens"], s1["padded_tokens"], s1["flags"]) == (100, 128, ["first"])
    assert (p1["step"], p1["name"], p1["state"], p2["state"]) == (1, "eval", "begin", "end")
    assert log["logs"] == {"loss": 1.5, "learning_rate": 2e-05} and log["step"] == 1
    assert (s2["step"], s2["flags"], s2["tokens"]) == (2, ["eval", "mine"], None)
    assert (s3["step"], s3["flags"]) == (3, [])
    # 3 steps: the first, and step 2 that held the evaluation (R18), are no step time
    assert end == ret and end["step"] == 3 and end["step_seconds"]["n"] == 1 and end["dropped_events"] == 0


def test_close_writes_run_end_once_and_appends(tmp_path):
    (tmp_path / "events.jsonl").write_text('{"v":1,"kind":"earlier"}\n')
    with StepTelemetry(run_dir=tmp_path) as tel:
        tel.step_end()
    tel.close()
    kinds = [ev["kind"] for ev in read_events(tmp_path / "events.jsonl")]
    assert kinds == ["earlier", "run_start", "step", "run_end"]


def test_nearest_rank_by_hand():
    # Wikipedia's nearest-rank example: 15, 20, 35, 40, 50
    v = [15, 20, 35, 40, 50]
    assert [nearest_rank(v, p) for p in (0, 5, 30, 40, 50, 100)] == [15, 15, 20, 20, 35, 50]
    # rank = ceil(p/100 * n) exactly: p90 of 10 values is the 9th, p99 the 10th
    ten = list(range(1, 11))
    assert (nearest_rank(ten, 90), nearest_rank(ten, 99), nearest_rank(ten, 50)) == (9, 10, 5)
    assert nearest_rank([1.0, 2.0, 3.0, 4.0], 50) == 2.0  # linear interpolation would say 2.5
    assert nearest_rank([], 50) is None
    assert step_summary([]) == {"n": 0, "min": None, "p50": None, "p90": None, "p99": None, "max": None}
    with pytest.raises(ValueError):
        nearest_rank(v, 101)


def test_step_seconds_hand_computed_first_step_excluded(tmp_path, monkeypatch):
    clock = [100.0]
    monkeypatch.setattr(tcore, "time", SimpleNamespace(perf_counter=lambda: clock[0], time=lambda: 1.7e9 + clock[0]))
    tel = StepTelemetry(run_dir=tmp_path, check_interval_s=1e9)
    tel.step_begin()
    # the first step is the FASTEST here, so excluding "the slowest" instead of "the first" is caught
    dts = [0.05, 0.5, 0.1, 0.4, 0.2, 0.3, 10.0, 0.9, 0.8, 0.7, 0.6]
    for dt in dts:
        clock[0] += dt
        tel.step_end()
    end = tel.run_end()
    written = [ev["dt"] for ev in read_events(tmp_path / "events.jsonl") if ev["kind"] == "step"]
    assert written == dts
    # 10 counted values sorted: 0.1 .. 0.9, 10.0 -> ranks ceil(5)=5, ceil(9)=9, ceil(9.9)=10
    assert end["step_seconds"] == {"n": 10, "min": 0.1, "p50": 0.5, "p90": 0.9, "p99": 10.0, "max": 10.0}


def test_unset_run_dir_is_a_noop_with_one_warning(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(tcore, "_warned_unset", False)
    monkeypatch.chdir(tmp_path)
    a = StepTelemetry()
    b = StepTelemetry(max_steps=10)
    for tel in (a, b):
        tel.step_begin()
        tel.step_end(tokens=1)
        tel.phase("save", "begin")
        tel.log({"loss": 1.0})
        assert tel.run_end() is None
        tel.close()
        assert not tel.active
    warnings = stderr_warnings(capsys.readouterr().err)
    assert len(warnings) == 1 and "STEPWATCH_RUN_DIR is not set" in warnings[0]
    assert list(tmp_path.iterdir()) == []


def test_env_run_dir_and_ranks(tmp_path, monkeypatch):
    monkeypatch.setenv("STEPWATCH_RUN_DIR", str(tmp_path))
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    quiet = StepTelemetry()  # rank 1 writes nothing by default
    quiet.step_end()
    quiet.close()
    assert not quiet.active and list(tmp_path.iterdir()) == []
    loud = StepTelemetry(all_ranks=True)
    loud.step_end()
    loud.close()
    events = read_events(tmp_path / "events.rank1.jsonl")
    assert [(ev["kind"], ev["rank"]) for ev in events] == [("run_start", 1), ("step", 1), ("run_end", 1)]
    assert events[0]["world_size"] == 2
    monkeypatch.delenv("RANK")
    monkeypatch.setenv("LOCAL_RANK", "0")
    zero = StepTelemetry()
    zero.close()
    assert read_events(tmp_path / "events.jsonl")[0]["rank"] == 0


# --------------------------------------------------------------------------------------------------
# Failure: never raise into training, count what was dropped, say so once
# --------------------------------------------------------------------------------------------------

def test_run_dir_removed_mid_run(tmp_path, capsys):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    tel = StepTelemetry(run_dir=run_dir, check_interval_s=0.0)
    for i in range(10):
        if i == 3:
            shutil.rmtree(run_dir)  # the open file is now unlinked: writes to it would still "succeed"
        tel.step_end()
    end = tel.run_end()
    tel.close()
    assert tel.disabled and "No such file or directory" in tel.disabled_reason
    assert tel.dropped_events == 7 + 1  # steps 4..10 and run_end itself
    assert end["dropped_events"] == 7
    warnings = stderr_warnings(capsys.readouterr().err)
    assert len(warnings) == 1 and "telemetry disabled" in warnings[0]
    assert not run_dir.exists()


def _full_disk_under(path: Path, monkeypatch) -> dict[str, bool]:
    """Every write to the file at ``path`` fails with ENOSPC while ``["full"]`` is set (the events
    file is a regular file of its own: a symlink to /dev/full is refused, never followed)."""
    real_write, state = os.write, {"full": True}

    def write(fd, data):
        if state["full"]:
            try:
                target = os.readlink(f"/proc/self/fd/{fd}")
            except OSError:
                target = ""
            if target == str(path):
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real_write(fd, data)

    monkeypatch.setattr(os, "write", write)
    return state


def test_enospc_from_the_start(tmp_path, monkeypatch, capsys):
    _full_disk_under(tmp_path / "events.jsonl", monkeypatch)
    tel = StepTelemetry(run_dir=tmp_path)
    for _ in range(5):
        tel.step_end()
    tel.log({"loss": 1.0})
    tel.run_end()
    tel.close()
    assert tel.dropped_events == 1 + 5 + 1 + 1  # run_start, steps, log, run_end
    assert "No space left on device" in tel.disabled_reason
    assert len(stderr_warnings(capsys.readouterr().err)) == 1


def test_enospc_mid_run_then_run_end_carries_the_count(tmp_path, monkeypatch, capsys):
    path = tmp_path / "events.jsonl"
    disk = _full_disk_under(path, monkeypatch)
    disk["full"] = False
    tel = StepTelemetry(run_dir=tmp_path, check_interval_s=0.0)
    for i in range(8):
        if i == 2:
            tel.flush()  # steps 1 and 2 are on disk
            disk["full"] = True
        tel.step_end()
    tel.flush()  # steps 3..8 fail: dropped
    disk["full"] = False  # space is back
    end = tel.run_end()
    assert end["dropped_events"] == 6  # steps 3..8
    events = read_events(path)
    assert [ev["kind"] for ev in events] == ["run_start", "step", "step", "run_end"]
    assert events[-1]["dropped_events"] == 6
    assert len(stderr_warnings(capsys.readouterr().err)) == 1


def test_a_full_disk_pauses_the_events_and_they_resume_when_space_returns(tmp_path, monkeypatch, capsys):
    """ENOSPC pauses writing (tried again every RETRY_FULL_S: 0 here, so at each event); the steps written
    while it was full are dropped and counted, the later ones land, and stderr says both once."""
    from stepwatch.telemetry import writer

    monkeypatch.setattr(writer, "RETRY_FULL_S", 0.0)
    path = tmp_path / "events.jsonl"
    disk = _full_disk_under(path, monkeypatch)
    disk["full"] = False
    tel = StepTelemetry(run_dir=tmp_path, check_interval_s=0.0)
    for i in range(10):
        disk["full"] = 2 <= i < 6  # steps 3..6 meet a full disk
        tel.step_end()
        tel.flush()
    end = tel.run_end()
    tel.close()
    assert [ev["step"] for ev in read_events(path) if ev["kind"] == "step"] == [1, 2, 7, 8, 9, 10]
    assert end is not None and end["dropped_events"] == 4 and not tel.disabled
    warnings = stderr_warnings(capsys.readouterr().err)
    assert len(warnings) == 2, warnings
    assert "No space left on device" in warnings[0] and "written again once there is room" in warnings[0], warnings
    assert f"writing events to {path} again (4 dropped while it was full)" in warnings[1], warnings


def test_a_write_the_disk_cuts_short_counts_as_dropped_only_the_lines_not_written_whole(tmp_path, monkeypatch):
    """The disk fills in the middle of a write of 5 buffered steps: 2 whole lines and half of the third go
    out, then ENOSPC. 3 are dropped (not 5, nor 1), and the next write ends the torn line first."""
    path = tmp_path / "events.jsonl"
    real_write, state = os.write, {"cut": "no"}

    def write(fd, data):
        if state["cut"] != "no" and os.readlink(f"/proc/self/fd/{fd}") == str(path):
            if state["cut"] == "done":
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
            state["cut"] = "done"
            nl = bytes(data).index(b"\n", bytes(data).index(b"\n") + 1)  # 2 whole lines, then half the third
            return real_write(fd, bytes(data)[: nl + 1 + 10])
        return real_write(fd, data)

    monkeypatch.setattr(os, "write", write)
    from stepwatch.telemetry import writer

    monkeypatch.setattr(writer, "FLUSH_EVERY_S", 60.0)  # steps wait in the buffer until flush()
    tel = StepTelemetry(run_dir=tmp_path, check_interval_s=0.0)  # run_start written
    tel.step_end()  # step 1: the first write in a while goes out at once
    state["cut"] = "next write"
    for _ in range(5):
        tel.step_end()  # steps 2..6 wait
    tel.flush()  # one write: steps 2 and 3 whole, half of step 4, then ENOSPC
    assert tel.dropped_events == 3 and tel.disabled
    state["cut"] = "no"
    tel.run_end()
    tel.close()
    lines = path.read_text().splitlines()
    assert [json.loads(ln).get("step") for ln in lines if ln.endswith("}")] == [None, 1, 2, 3, 6], lines
    assert len(lines) == 6 and not lines[4].endswith("}"), lines  # the torn line stands alone


def _refused_once(capsys, path: Path, why: str) -> None:
    """Exactly one stderr line, naming ``path`` and why nothing was written to it."""
    warnings = stderr_warnings(capsys.readouterr().err)
    assert len(warnings) == 1, warnings
    assert f"not writing events to {path}: {why}" in warnings[0] and "training continues" in warnings[0], warnings


def _train_a_little(run_dir: Path, **kw) -> StepTelemetry:
    tel = StepTelemetry(run_dir=run_dir, **kw)
    for _ in range(3):
        tel.step_begin()
        tel.step_end()  # never raises into the loop
    tel.log({"loss": 1.0})
    tel.run_end()
    tel.close()
    return tel


def test_a_symlink_in_place_of_the_events_file_is_never_followed(tmp_path, capsys):
    """A group member's symlink in a group-writable run dir: the job (root's, say) must not append
    to the file it names, nor create one where a dangling link points."""
    run_dir, outside = tmp_path / "run", tmp_path / "outside"
    run_dir.mkdir()
    outside.mkdir()
    precious = outside / "root-only"
    precious.write_text("precious\n")
    os.chmod(precious, 0o600)
    (run_dir / "events.jsonl").symlink_to(precious)
    tel = _train_a_little(run_dir)
    assert precious.read_text() == "precious\n"
    assert tel.disabled and tel.dropped_events == 1 + 3 + 1 + 1  # run_start, steps, log, run_end
    assert tel.disabled_reason is not None and "symlink" in tel.disabled_reason
    _refused_once(capsys, run_dir / "events.jsonl", "it is a symlink (never followed)")
    (run_dir / "events.rank1.jsonl").symlink_to(outside / "created-by-the-job")  # dangling: never created
    tel = _train_a_little(run_dir, rank=1, world_size=2, all_ranks=True)
    assert tel.disabled and not (outside / "created-by-the-job").exists()
    _refused_once(capsys, run_dir / "events.rank1.jsonl", "it is a symlink (never followed)")


def test_a_fifo_in_place_of_the_events_file_is_refused(tmp_path, capsys):
    """A FIFO (here with a reader, so that opening it cannot block even without O_NONBLOCK; with none,
    O_NONBLOCK makes the open fail at once) is no events file: nothing is written into it."""
    os.mkfifo(tmp_path / "events.jsonl")
    reader = os.open(tmp_path / "events.jsonl", os.O_RDONLY | os.O_NONBLOCK)
    try:
        tel = _train_a_little(tmp_path)
        assert os.read(reader, 4096) == b""  # no writer left, nothing written
    finally:
        os.close(reader)
    assert tel.disabled
    _refused_once(capsys, tmp_path / "events.jsonl", "it is not a regular file")


def test_another_users_events_file_is_refused(tmp_path, capsys):
    if os.geteuid() != 0:
        pytest.skip("needs root to give a file to uid 65534 (CI runs as root)")
    path = tmp_path / "events.jsonl"
    path.write_text("theirs\n")
    os.chown(path, 65534, 65534)
    tel = _train_a_little(tmp_path)
    assert path.read_text() == "theirs\n" and tel.disabled
    _refused_once(capsys, path, "it belongs to uid 65534, not to this process's uid 0")


def test_an_events_file_with_another_name_is_refused(tmp_path, capsys):
    """A hard link to a file of this user made under the events file's name (another user cannot
    do it where protected_hardlinks holds; a link to one's own file elsewhere still must not grow)."""
    elsewhere = tmp_path / "elsewhere.txt"
    elsewhere.write_text("mine\n")
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    os.link(elsewhere, run_dir / "events.jsonl")
    tel = _train_a_little(run_dir)
    assert elsewhere.read_text() == "mine\n" and tel.disabled
    _refused_once(capsys, run_dir / "events.jsonl", "it has 2 hard links")


def test_an_existing_events_file_of_this_user_is_appended_to(tmp_path, capsys):
    """The control: a regular file of this user with one name (a resumed run's) is appended to."""
    path = tmp_path / "events.jsonl"
    path.write_text('{"v":1,"kind":"log","t":1.0,"step":null,"rank":0,"logs":{}}\n')
    tel = _train_a_little(tmp_path)
    assert not tel.disabled and tel.dropped_events == 0
    assert [ev["kind"] for ev in read_events(path)] == ["log", "run_start", "step", "step", "step", "log", "run_end"]
    assert stderr_warnings(capsys.readouterr().err) == []


def test_parent_is_a_file(tmp_path, capsys):
    not_a_dir = tmp_path / "file"
    not_a_dir.write_text("x")
    tel = StepTelemetry(run_dir=not_a_dir)
    tel.step_begin()
    tel.step_end()
    tel.phase("save", "begin")
    tel.close()
    assert tel.dropped_events == 4  # run_start, step, phase, run_end
    assert "Not a directory" in tel.disabled_reason
    assert len(stderr_warnings(capsys.readouterr().err)) == 1


def test_unserialisable_log_is_dropped_not_raised(tmp_path, capsys):
    tel = StepTelemetry(run_dir=tmp_path)
    tel.log({("a", "b"): 1.0})  # a tuple key: json cannot write it
    tel.log({"loss": float("nan"), "path": Path("/x")})
    tel.step_end()
    end = tel.run_end()
    kinds = [ev["kind"] for ev in read_events(tmp_path / "events.jsonl")]
    assert kinds == ["run_start", "log", "step", "run_end"]
    log = read_events(tmp_path / "events.jsonl")[1]["logs"]
    assert math.isnan(log["loss"]) and log["path"] == "/x"
    assert end["dropped_events"] == 1 and not tel.disabled
    assert len(stderr_warnings(capsys.readouterr().err)) == 1


# --------------------------------------------------------------------------------------------------
# Import hygiene
# --------------------------------------------------------------------------------------------------

@pytest.mark.system
def test_import_pulls_in_no_framework(tmp_path):
    code = textwrap.dedent(f"""
        import sys
        import stepwatch.telemetry
        from stepwatch.telemetry import StepTelemetry
        tel = StepTelemetry(run_dir={str(tmp_path)!r})
        tel.step_begin(); tel.step_end(); tel.close()
        heavy = [m for m in ("torch", "transformers", "textual", "numpy") if m in sys.modules]
        print("HEAVY", heavy)
    """)
    r = subprocess.run([sys.executable, "-c", code], cwd=REPO_ROOT, capture_output=True, text=True, timeout=60,
                       env={**os.environ, "PYTHONPATH": str(REPO_ROOT)})
    assert r.returncode == 0, r.stderr
    assert "HEAVY []" in r.stdout
    # versions are still found without importing torch: from the installed distribution's metadata
    start = read_events(tmp_path / "events.jsonl")[0]
    assert start["versions"]["python"] == platform.python_version()
    if importlib.util.find_spec("torch") is not None:
        assert start["versions"]["torch"] == importlib.metadata.version("torch")


# --------------------------------------------------------------------------------------------------
# Dynamo: real records from the fixtures, real counters, one real compile run
# --------------------------------------------------------------------------------------------------

_GLOG = re.compile(r"^([VIWE])(\d{4} [\d:.]+ \d+) (\S+?)\.py:\d+\] \[([^\]]+)\] (?:\[__(\w+)\] )?(.*)$")
_LEVELS = {"V": logging.DEBUG, "I": logging.INFO, "W": logging.WARNING, "E": logging.ERROR}


def records_from_glog(path: Path) -> list[logging.LogRecord]:
    """Rebuild the LogRecords behind a captured torch log: consecutive lines with the same prefix
    (level, time, pid, file, compile id, artifact) are one record; the logger name is the module path
    (``torch/_dynamo/guards.py`` -> ``torch._dynamo.guards``) plus ``.__<artifact>``."""
    records, key, lines = [], None, []

    def flush():
        if key is not None:
            level, _, module, _, artifact = key
            name = module.replace("/", ".") + (f".__{artifact}" if artifact else "")
            records.append(logging.LogRecord(name, _LEVELS[level], module + ".py", 0, "\n".join(lines), None, None))

    for raw in path.read_text().splitlines():
        m = _GLOG.match(raw)
        if not m:
            flush()
            key, lines = None, []
            continue
        k = m.groups()[:5]
        if k != key:
            flush()
            key, lines = k, []
        lines.append(m.group(6))
    flush()
    return records


def real_fixture(name: str) -> Path:
    """A kept capture of tests/fixtures/real; a missing one fails the test (it is part of the repo)."""
    p = FIXTURES_REAL / name
    assert p.is_file(), f"real fixture {p} is missing (re-capture: tools/capture_fixtures/capture.sh)"
    return p


def installed_observer(records_on: bool, callback_api: bool = False) -> DynamoObserver:
    obs = DynamoObserver()
    obs.installed, obs.frames_total_at_install = True, 0
    obs.records_observable, obs.limit_observable = records_on, True
    obs._callback_handler = SimpleNamespace(register_start_callback=None, start_callbacks=[]) if callback_api else None
    obs.callback_registered = callback_api
    return obs


def test_observer_counts_real_recompile_records():
    records = records_from_glog(real_fixture("dynamo_recompiles.log"))
    counters = json.loads(real_fixture("dynamo_counters.json").read_text())
    names = collections.Counter(r.name for r in records)
    assert names["torch._dynamo.guards.__recompiles"] == 4
    assert names["torch._dynamo.symbolic_convert.__graph_breaks"] == 1  # must not count
    obs = installed_observer(records_on=True)
    handler = _CountingHandler(obs)
    for r in records:
        handler.handle(r)
    assert (obs.recompile_records, obs.limit_hits) == (4, 1)
    # the attempt that hit the limit logged a "Recompiling" record but compiled nothing:
    # 1 first compile + 3 recompiles = the 4 unique graphs dynamo's own counters report
    assert obs.recompiles() == 3 == counters["after_main_loop"]["stats"]["unique_graphs"] - 1
    limit_texts = [k for k in counters["after_main_loop"]["unimplemented"] if k.startswith("Dynamo recompile limit")]
    assert obs.recompile_limit_hits() == 1 == counters["after_main_loop"]["unimplemented"][limit_texts[0]]
    # the warning exactly as a handler on torch._dynamo.convert_frame captured it counts too
    obs2 = installed_observer(records_on=True)
    for text in counters["captured_convert_frame_warnings"]:
        obs2.on_record(logging.LogRecord("torch._dynamo.convert_frame", logging.WARNING, "", 0, text, None, None))
    assert obs2.limit_hits == 1 and obs2.recompile_records == 0


def test_counting_handler_changes_nothing_the_log_prints(capsys):
    """A warning with no handler anywhere is printed by logging.lastResort; adding the counting
    handler must not silence it, and with another handler present it must not print it twice."""
    lonely = logging.getLogger("stepwatch_test.lonely")
    lonely.propagate = False
    lonely.warning("torch._dynamo hit config.%s (%s)", "recompile_limit", 8)
    before = capsys.readouterr().err
    assert before == "torch._dynamo hit config.recompile_limit (8)\n"
    obs = installed_observer(records_on=False)
    handler = _CountingHandler(obs)
    lonely.addHandler(handler)
    try:
        lonely.warning("torch._dynamo hit config.%s (%s)", "recompile_limit", 8)
        lonely.debug("Recompiling function f")  # below the logger's level: never created
        assert capsys.readouterr().err == before
        assert obs.limit_hits == 1
        seen = []
        other = logging.Handler()
        other.emit = seen.append
        lonely.addHandler(other)
        lonely.warning("torch._dynamo hit config.%s (%s)", "recompile_limit", 8)
        assert capsys.readouterr().err == "" and len(seen) == 1 and obs.limit_hits == 2
    finally:
        lonely.handlers.clear()


def test_observer_without_torch_logs_reports_recompiles_unknown():
    records = records_from_glog(real_fixture("dynamo_limit_default.log"))
    obs = installed_observer(records_on=False)
    for r in records:
        _CountingHandler(obs).handle(r)
    assert (obs.recompile_records, obs.limit_hits) == (0, 1)
    assert obs.recompiles() is None  # no callback API, no records: could not observe
    assert obs.recompile_limit_hits() == 1
    late = installed_observer(records_on=True)
    late.frames_total_at_install = 5  # installed after dynamo had already converted frames
    assert late.recompiles() is None and late.recompile_limit_hits() is None


def test_observer_compile_callbacks():
    obs = installed_observer(records_on=False, callback_api=True)
    dyn = SimpleNamespace(name="DYNAMO")
    for cid in ("0/0", "0/1", "1/0", "!2/0/1", "!2"):
        obs.on_compile_start(SimpleNamespace(callback_trigger=dyn, compile_id=cid))
    obs.on_compile_start(SimpleNamespace(callback_trigger=SimpleNamespace(name="LAZY_BACKWARD"), compile_id="0/1"))
    assert (obs.compiles, obs.recompiles_cb, obs.recompiles()) == (5, 2, 2)
    assert [frame_compile_id(c) for c in ("0/0", "0/3", "!2/0/1", "!2", "")] == [0, 3, 1, None, None]


def test_counters_snapshot_of_real_counters():
    data = json.loads(real_fixture("dynamo_counters.json").read_text())
    for key in ("after_main_loop", "after_graph_break_demo"):
        real = collections.defaultdict(collections.Counter)
        for group, d in data[key].items():
            real[group].update(d)
        snap = counters_snapshot(real)
        assert snap == data[key]
        assert json.loads(json.dumps(snap)) == snap
        assert "recompiles" not in snap
        assert "frames" in real and frames_total(real) == data[key]["frames"]["total"]
    warm = json.loads(real_fixture("dynamo_counters_warmcache.json").read_text())["after_main_loop"]
    assert "graph_break" not in warm  # absent until a real break: readers must use .get
    empty = collections.defaultdict(collections.Counter)
    assert frames_total(empty) == 0 and "frames" not in empty  # reading never creates a group


REAL_COMPILE_SCRIPT = r"""
import json, sys
import torch, torch._dynamo
from stepwatch.telemetry import StepTelemetry

run_dir, gap_dir = sys.argv[1], sys.argv[2]
torch._dynamo.config.recompile_limit = 2

@torch.compile(backend="eager", dynamic=False)
def f(x):
    return x * 2 + 1

tel = StepTelemetry(run_dir=run_dir, check_interval_s=0.0)
for n in [1, 1, 2, 2, 3, 3, 1]:    # compile, -, recompile, -, limit hit (runs eagerly), -, cached
    tel.step_begin()
    f(torch.ones(n))
    tel.step_end()
tel.close()

# torch._dynamo.reset() drops the compile callbacks; a compile before the emitter notices is a gap
tel = StepTelemetry(run_dir=gap_dir, check_interval_s=0.0)
tel.step_end()
torch._dynamo.reset()
f(torch.ones(4))
tel.step_end()
tel.close()
print("DONE")
"""


@pytest.mark.slow  # a real training run / several seconds of a real process
@pytest.mark.parametrize("torch_logs", [None, "recompiles"])
def test_real_dynamo_compile(tmp_path, torch_logs):
    pytest.importorskip("torch")
    run_dir, gap_dir = tmp_path / "run", tmp_path / "gap"
    run_dir.mkdir()
    gap_dir.mkdir()
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    env.pop("TORCH_LOGS", None)
    if torch_logs:
        env["TORCH_LOGS"] = torch_logs
    t0 = time.monotonic()
    r = subprocess.run([sys.executable, "-c", REAL_COMPILE_SCRIPT, str(run_dir), str(gap_dir)], cwd=REPO_ROOT,
                       capture_output=True, text=True, timeout=120, env=env)
    assert r.returncode == 0 and "DONE" in r.stdout, r.stderr[-3000:]
    assert time.monotonic() - t0 < 60

    # what the user's log prints is untouched: dynamo's own warning (and records) still appear
    assert r.stderr.count("torch._dynamo hit config.recompile_limit (2)") == 1
    assert r.stderr.count("Recompiling function f") == (2 if torch_logs else 0)
    assert stderr_warnings(r.stderr) == []

    events = read_events(run_dir / "events.jsonl")
    for ev in events:
        assert_schema(ev)
    steps = [ev for ev in events if ev["kind"] == "step"]
    assert [ev["flags"] for ev in steps] == [["first"], [], ["recompile"], [], [], [], []]
    dyn = [ev for ev in events if ev["kind"] == "dynamo"]
    assert dyn, "no dynamo event"
    for a, b in zip(dyn, dyn[1:]):
        assert (a["counters"], a["recompiles"], a["recompile_limit_hits"]) != \
               (b["counters"], b["recompiles"], b["recompile_limit_hits"])
    last = dyn[-1]
    assert last["counters"]["frames"] == {"total": 3, "ok": 2}
    assert last["counters"]["stats"]["unique_graphs"] == 2
    assert "recompiles" not in last["counters"]
    assert any(k.startswith("Dynamo recompile limit exceeded") for k in last["counters"]["unimplemented"])
    assert (last["recompiles"], last["recompile_limit_hits"]) == (1, 1)
    end = events[-1]
    assert end["dynamo"] == {"recompiles": 1, "recompile_limit_hits": 1}

    gap_end = read_events(gap_dir / "events.jsonl")[-1]
    assert gap_end["kind"] == "run_end"
    assert gap_end["dynamo"]["recompiles"] is None  # a compile happened while no callback listened
    assert gap_end["dynamo"]["recompile_limit_hits"] == 1


def test_a_process_of_the_old_attempt_never_writes_into_the_rotated_in_file(tmp_path, capsys):
    """Relaunch renames events.jsonl; an orphan of attempt 1 must not reopen the path (attempt 2's)."""
    tel = StepTelemetry(run_dir=str(tmp_path), check_interval_s=0.0)
    tel.step_end()
    tel.step_end()
    (tmp_path / "events.jsonl").rename(tmp_path / "events.20260101T000000Z.jsonl")
    (tmp_path / "events.jsonl").write_text('{"v":1,"kind":"run_start","attempt":"2"}\n')
    tel.step_end()
    tel.step_end()
    assert (tmp_path / "events.jsonl").read_text() == '{"v":1,"kind":"run_start","attempt":"2"}\n'
    old = (tmp_path / "events.20260101T000000Z.jsonl").read_text().splitlines()
    assert [json.loads(ln)["step"] for ln in old if json.loads(ln)["kind"] == "step"] == [1, 2]
    assert tel.dropped_events >= 2 and tel.disabled
    assert capsys.readouterr().err.count("rotated or removed") == 1


# ---------------------------------------------------------------- the step line without the encoder


def _random_float(rng):
    r = rng.random()
    if r < 0.25:  # any bit pattern: NaN, infinities, subnormals, huge and tiny
        return struct.unpack("<d", struct.pack("<Q", rng.getrandbits(64)))[0]
    if r < 0.45:
        return rng.choice([0.0, -0.0, math.inf, -math.inf, math.nan, 5e-324, 1e16, 1e-7, 1e22, 0.1, 1780000000.0])
    if r < 0.75:
        return 1_780_000_000 + rng.random() * 1e6  # time.time()
    return round(rng.expovariate(1.0) * 20, 6)  # a dt


def _random_int(rng):
    return rng.choice([0, 1, -1, 612, 2**63, -(2**70), 10**40, rng.randrange(10**6), None, True, False, 3.0, "7",
                       collections.Counter])


def _random_str(rng):
    alphabet = ["a", "Z", '"', "\\", "/", "\n", "\t", "\x00", "\x1f", "\x7f",
                "é", "中", "\ud800", "😀", " ", "\u2028"]
    return "".join(rng.choice(alphabet) for _ in range(rng.randrange(8)))


@pytest.mark.parametrize("plain", [True, False])
def test_step_line_is_what_the_encoder_writes(plain):
    """The template gives the encoder's very bytes, or declines (None) and the encoder is used:
    random floats (every bit pattern), ints of any size, bools, None, other types, and flags with
    quotes, backslashes, control characters, non-ASCII and lone surrogates."""
    rng = random.Random(8 + plain)
    built = 0
    for _ in range(10_000):  # every listed edge value and character comes up hundreds of times
        if plain:  # the types step_end passes: mostly the template's
            t, dt, b = 1_780_000_000 + rng.random() * 1e6, round(rng.expovariate(0.05), 6), 1_780_000_000.5
            step, rank = rng.randrange(10**7), rng.randrange(8)
            tok = rng.choice([None, rng.randrange(10**6)])
            pad = rng.choice([None, rng.randrange(10**6), True])
            bs = rng.choice([None, rng.randrange(64)])
            w = rng.choice([None, rng.randrange(4096), round(rng.random() * 1000, 3), True])
        else:
            t, dt, b = _random_float(rng), _random_float(rng), _random_float(rng)
            step, rank, tok, pad, bs = (_random_int(rng) for _ in range(5))
            w = rng.choice([_random_float(rng), _random_int(rng)])
        flags = [rng.choice(["first", "eval", "save", "recompile", _random_str(rng)]) for _ in range(rng.randrange(4))]
        if rng.random() < 0.03:
            flags.append(rng.choice([1, None, b"x"]))
        line = tcore._step_line(t, step, rank, dt, b, tok, pad, flags, bs, w)
        if line is None:
            continue
        built += 1
        ev = {"v": tcore.SCHEMA_VERSION, "kind": "step", "t": t, "step": step, "rank": rank, "dt": dt,
              "step_begin": b, "step_end": t, "tokens": tok, "padded_tokens": pad, "flags": flags,
              "batch_size": bs, "width": w}
        assert line == tcore._ENCODER.encode(ev)
    assert built > (3_750 if plain else 375)  # the template takes most; the rest went to the encoder


def test_step_events_are_byte_identical_with_and_without_the_template(tmp_path, monkeypatch):
    """The same calls on the same clocks write the same file whether step lines come from the
    template or from the encoder (numpy-like ints and floats, which the template declines, included)."""

    class Int(int):
        pass

    class Float(float):
        pass

    def run(run_dir, template):
        if not template:
            monkeypatch.setattr(tcore, "_step_line", lambda *a: None)
        clock = [100.0]
        fake_time = SimpleNamespace(perf_counter=lambda: clock[0], time=lambda: 1.78e9 + clock[0])
        monkeypatch.setattr(tcore, "time", fake_time)
        tel = StepTelemetry(run_dir=run_dir, check_interval_s=1e9)
        rng = random.Random(5)
        for i in range(300):
            clock[0] += rng.choice([0.001, 0.1234567, 19.5, 1e-7, 3.0])
            if i % 50 == 7:
                tel.phase(rng.choice(["save", "eval"]), "end")
            tokens = rng.choice([None, 26048, Int(26048), 0])
            padded = rng.choice([None, 26112, Float(26112.0)])
            flags = rng.choice([None, (), ["x"], ["first", 'q"\\é'], [7]])
            tel.step_end(tokens, padded, flags, step=rng.choice([None, i, Int(i)]))
        tel.close()
        monkeypatch.undo()
        return (run_dir / "events.jsonl").read_bytes()

    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    with_template = run(tmp_path / "a", True)
    with_encoder = run(tmp_path / "b", False)
    assert with_template.count(b'"kind":"step"') == 300
    assert with_template == with_encoder


def test_short_writes_complete_the_line_and_a_zero_write_disables(tmp_path, monkeypatch, capsys):
    """os.write may write part of a line: the rest follows, one write at a time, and the line is
    whole. A write of 0 bytes stops writing (counted as dropped); run_end's retry first ends the
    half-written line."""
    real_write = os.write
    budget = {"max": 7, "zero_after": None, "calls": 0}

    def short_write(fd, data):
        budget["calls"] += 1
        if budget["zero_after"] is not None and budget["calls"] > budget["zero_after"]:
            budget["zero_after"] = None
            return 0
        return real_write(fd, bytes(data[: budget["max"]]))

    monkeypatch.setattr(tcore.os, "write", short_write)
    tel = StepTelemetry(run_dir=tmp_path, check_interval_s=1e9)
    tel.step_end(26048, 26112)
    tel.step_end(None, None, ["x"])
    tel.flush()  # step lines are written by time: now, for this test of the write itself
    events = read_events(tmp_path / "events.jsonl")
    assert [ev["kind"] for ev in events] == ["run_start", "step", "step"] and not tel.dropped_events
    budget["zero_after"] = budget["calls"] + 2  # the next line stops after 14 bytes
    tel.step_end()
    tel.flush()
    assert tel.disabled and tel.dropped_events == 1
    tel.step_end()
    assert tel.dropped_events == 2
    budget["max"] = 10**6
    tel.run_end()
    lines = (tmp_path / "events.jsonl").read_bytes().split(b"\n")
    assert len(lines[3]) == 14 and json.loads(lines[4])["kind"] == "run_end"
    assert json.loads(lines[4])["dropped_events"] == 2
    assert "short write" in capsys.readouterr().err


# --------------------------------------------------------------------------------------------------
# Step lines written by time, not by step (the emitter's cost at 1 ms steps)
# --------------------------------------------------------------------------------------------------

@pytest.mark.system
def test_fast_steps_share_one_write_and_the_flusher_writes_what_the_last_step_left(tmp_path, monkeypatch):
    from stepwatch.telemetry.writer import FLUSH_EVERY_S  # noqa: F401 - the window these tests are about

    writes = []
    real_write = os.write
    monkeypatch.setattr(tcore.os, "write", lambda fd, data: writes.append(bytes(data)) or real_write(fd, data))
    tel = StepTelemetry(run_dir=tmp_path, check_interval_s=1e9)
    n0 = len(writes)  # run_start
    for _ in range(20):
        tel.step_end()  # 20 steps well within FLUSH_EVERY_S
    assert len(writes) - n0 == 1  # the first step at once (nothing written for an age); the rest wait
    deadline = time.monotonic() + 2.0
    while len(read_events(tmp_path / "events.jsonl")) < 21:  # a hang after the last step still shows it
        assert time.monotonic() < deadline, "the flusher did not write the buffered steps"
        time.sleep(0.01)
    assert len(writes) - n0 == 2 and writes[-1].count(b"\n") == 19  # one write for the nineteen
    tel.step_end()
    tel.log({"loss": 1.0})  # another kind writes the buffer first: the file keeps event order
    kinds = [ev["kind"] for ev in read_events(tmp_path / "events.jsonl")]
    assert kinds[-2:] == ["step", "log"] and len(kinds) == 23


@pytest.mark.system
def test_a_process_that_exits_without_close_or_is_killed_loses_at_most_the_window(tmp_path):
    from stepwatch.telemetry.writer import FLUSH_EVERY_S

    script = ("import sys, time\nfrom stepwatch.telemetry import StepTelemetry\n"
              "tel = StepTelemetry(run_dir=sys.argv[1])\n"
              "for i in range(300):\n    tel.step_end()\n    time.sleep(0.001)\n"
              "print('done', flush=True)\n"
              "if sys.argv[2] == 'hang':\n    time.sleep(60)\n")
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    exits = subprocess.run([sys.executable, "-c", script, str(tmp_path / "a"), "exit"], capture_output=True, text=True,
                           timeout=60)
    assert exits.returncode == 0
    assert sum(ev["kind"] == "step" for ev in read_events(tmp_path / "a" / "events.jsonl")) == 300  # at exit: atexit
    p = subprocess.Popen([sys.executable, "-c", script, str(tmp_path / "b"), "hang"], stdout=subprocess.PIPE, text=True)
    try:
        assert p.stdout.readline().strip() == "done"
        time.sleep(FLUSH_EVERY_S * 4)  # the window the flusher needs, passed
    finally:
        p.kill()
        p.wait()
    assert sum(ev["kind"] == "step" for ev in read_events(tmp_path / "b" / "events.jsonl")) == 300


@pytest.mark.system
def test_a_forked_child_never_writes_the_parents_buffered_steps(tmp_path):
    tel = StepTelemetry(run_dir=tmp_path, check_interval_s=1e9)
    tel.step_end()
    tel.step_end()  # buffered
    pid = os.fork()
    if pid == 0:  # the child (a DataLoader worker forked mid-window): its copy of the buffer is not its own
        tel.flush()
        os._exit(0)
    os.waitpid(pid, 0)
    tel.flush()
    steps = [ev["step"] for ev in read_events(tmp_path / "events.jsonl") if ev["kind"] == "step"]
    assert steps == [1, 2]
