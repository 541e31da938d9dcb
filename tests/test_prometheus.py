"""Export to Prometheus: the supervisor's endpoint scraped by a real Prometheus server
(Debian's ``prometheus``, started here on a loopback port), its HTTP API queried for the values; the
rules checked and unit-tested with ``promtool``; names linted with ``promtool check metrics``; every
metric the rules and the Grafana dashboard name is one the exporter serves; the textfile export.
Outside CI, without the prometheus package, the tests needing it skip and say why."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import urllib.parse
import urllib.request
from pathlib import Path
from typing import cast

import pytest

from conftest import REPO_ROOT, make_repo, stepwatch, wait_until
from stepwatch.monitors.export.prometheus import families, text_of
from stepwatch.monitors.snapshot.types import GpuDevice, Snapshot

RULES = REPO_ROOT / "assets" / "prometheus" / "stepwatch-rules.yml"
RULES_TEST = REPO_ROOT / "tests" / "fixtures" / "prometheus" / "stepwatch-rules.test.yml"
DASHBOARD = REPO_ROOT / "assets" / "grafana" / "stepwatch-dashboard.json"
STATIC_RUN = REPO_ROOT / "tests" / "fixtures" / "runs" / "ended-sigkill"
TRAIN_PY = r'''
import time
for step in range(1, 100000):
    time.sleep(0.05)
    print(f"step {step}/100000 loss {1.0 / step:.4f}", flush=True)
'''


def _need(tool: str) -> str:
    path = shutil.which(tool)
    if path is None:
        why = f"{tool} is not installed (Debian: apt-get install prometheus)"
        if os.environ.get("CI"):
            pytest.fail(f"CI must run this against a real {tool}: {why}")
        pytest.skip(why)
    return path


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _rich_snapshot() -> Snapshot:
    """A real snapshot (the fixture run) with every optional part present: GPUs, ranks, a Slurm job."""
    from stepwatch.monitors.gpu.reading import status_row
    from stepwatch.monitors.snapshot.observer import snapshot

    snap = snapshot(STATIC_RUN)
    snap["gpu"] = [cast(GpuDevice, status_row(
        {"index": i, "util_pct": 97.0, "sm_active_pct": 80.0, "tensor_active_pct": 55.0, "power_w": 600.0,
         "power_limit_w": 700.0, "mem_used_bytes": 7e10, "used_by_run": True}, [])) for i in range(2)]
    snap["ranks"] = [{"rank": r, "local_rank": r, "pid": None, "alive": True, "ended_at_unix": None, "returncode": None,
                      "signal": None, "exit_source": None, "root_cause": False, "after_stop": False,
                      "restart_count": None, "max_restarts": None, "started_at_unix": None,
                      "steps": {"n": 10, "p50": 0.25, "p99": 0.25, "last_step": 10, "last_step_end_unix": None,
                                "source": "events", "metrics": {}}} for r in range(2)]
    snap["scheduler"] = {"kind": "slurm", "job_id": "1", "state": "RUNNING", "reason": None, "nodes": None,
                         "exit_code": None, "time_limit_s": 3600.0, "time_left_s": 3000.0, "start_unix": None,
                         "end_unix": None, "source": None, "error": None, "poll_age_s": None, "stale": False,
                         "previous_job_ids": []}
    snap["metrics"] = {name: {"step": 100, "value": value, "finite": True, "nonfinite_count": 0,
                              "first_nonfinite_step": None} for name, value in (("loss", 2.5), ("bad\nname{}", 1.0))}
    snap["throughput"].update(tokens_per_s=1000.0, real_tokens_per_s=900.0)
    snap["eta"]["eta_s"] = 1200.0
    snap["stall"].update(state="stalled", current_step_elapsed_s=40.0)
    snap["returncode"] = 0
    return snap


def _sample_names(text: str) -> set[str]:
    return {ln.split("{")[0].split(" ")[0] for ln in text.splitlines() if ln and not ln.startswith("#")}


def _missing(names: set[str], served: set[str]) -> set[str]:
    """The ``stepwatch_*`` names of ``names`` the exporter does not serve (``up`` is Prometheus' own)."""
    return {n for n in names if n.startswith("stepwatch_") and n not in served}


def test_the_rules_pass_promtool_and_their_unit_tests_and_a_broken_rule_does_not(tmp_path: Path):
    promtool = _need("promtool")
    ok = subprocess.run([promtool, "check", "rules", str(RULES)], capture_output=True, text=True)
    assert ok.returncode == 0 and "SUCCESS: 6 rules found" in ok.stdout, ok.stdout + ok.stderr
    unit = subprocess.run([promtool, "test", "rules", RULES_TEST.name], cwd=RULES_TEST.parent, capture_output=True,
                          text=True)
    assert unit.returncode == 0 and "SUCCESS" in unit.stdout, unit.stdout + unit.stderr
    broken = tmp_path / "broken.yml"  # control: the check can fail
    broken.write_text(RULES.read_text().replace("stepwatch_stalled == 1", "stepwatch_stalled == == 1"))
    bad = subprocess.run([promtool, "check", "rules", str(broken)], capture_output=True, text=True)
    assert bad.returncode != 0 and "StepwatchStalled" in bad.stdout + bad.stderr


def test_every_metric_the_rules_and_the_dashboard_name_is_served_and_names_pass_the_linter():
    text = text_of(_rich_snapshot()).decode()
    served = _sample_names(text)
    rules = set(re.findall(r"stepwatch_[a-z0-9_]+", RULES.read_text()))
    dash = json.loads(DASHBOARD.read_text())
    exprs = [t["expr"] for p in dash["panels"] for t in p.get("targets", [])]
    in_dash = set(re.findall(r"stepwatch_[a-z0-9_]+", " ".join(exprs)))
    assert len(dash["panels"]) >= 10 and len(rules) >= 8 and len(in_dash) >= 15
    assert _missing(rules | in_dash, served) == set()
    assert _missing({"stepwatch_steps_typo"}, served) == {"stepwatch_steps_typo"}  # control: a wrong name is caught
    assert 'name="loss"' in text and "bad" not in text  # a metric name the log made up is no label
    assert 'stepwatch_scheduler_state{attempt="1",run="ended-sigkill",state="RUNNING"} 1.0' in text
    assert 'stepwatch_gpu_utilization_ratio{attempt="1",gpu="1",run="ended-sigkill",source="nvml"} 0.97' in text
    promtool = _need("promtool")
    lint = subprocess.run([promtool, "check", "metrics"], input=text, capture_output=True, text=True)
    assert lint.returncode == 0, lint.stdout + lint.stderr
    bad = subprocess.run([promtool, "check", "metrics"], input=text.replace("stepwatch_steps_total", "stepwatch_steps"),
                         capture_output=True, text=True)
    assert bad.returncode != 0  # control: the linter does object to a counter without _total


def test_an_unknown_value_is_absent_never_zero():
    snap = _rich_snapshot()
    snap["stall"].update(state="not judged", current_step_elapsed_s=None, threshold_s=None)
    snap["dynamo"]["recompiles"] = None
    text = text_of(snap).decode()
    assert not re.search(r"^stepwatch_stalled\{", text, re.M) and not re.search(r"^stepwatch_recompiles_total\{", text, re.M)
    snap["stall"]["state"] = "ok"  # control: a judged stall is there, as 0
    assert re.search(r'^stepwatch_stalled\{attempt="1",run="ended-sigkill"\} 0\.0$', text_of(snap).decode(), re.M)
    assert {f.name for f in families(snap)} >= {"stepwatch_steps", "stepwatch_stalled"}


@pytest.mark.parametrize("backend", ["replay", "nvml"])
def test_every_gpu_and_energy_figure_says_whether_it_was_measured_or_replayed(tmp_path: Path, backend: str):
    """The demo replays a recorded GPU on a machine without one: its watts and joules are labelled
    source="replay" in the export, never passed off as measured. The control: gpu.jsonl as NVML writes it."""
    from stepwatch.monitors.gpu.recorded import RecordedBackend, bundled_recording
    from stepwatch.monitors.gpu.sampler import GpuSampler

    run_dir = tmp_path / "ended-sigkill"
    shutil.copytree(STATIC_RUN, run_dir)
    times = iter(range(1_780_000_000, 1_780_000_030))
    sampler = GpuSampler(run_dir, None, backend=RecordedBackend(
        bundled_recording("synthetic_h100_healthy_compute_bound.jsonl"), loop=False), clock=lambda: float(next(times)))
    for _ in range(30):
        sampler.tick()
    if backend == "nvml":  # the same readings, as the sampler records them from NVML
        recs = [json.loads(ln) for ln in (run_dir / "gpu.jsonl").read_text().splitlines()]
        (run_dir / "gpu.jsonl").write_text("".join(json.dumps({**r, "backend": "nvml"}) + "\n" for r in recs))
    text = stepwatch("export", str(run_dir)).stdout
    gpu = [ln for ln in text.splitlines() if re.match(r"stepwatch_(gpu_|energy_|tokens_per_joule)", ln)]
    assert any(ln.startswith("stepwatch_gpu_power_watts{") for ln in gpu), text
    assert all(f'source="{backend}"' in ln for ln in gpu), [ln for ln in gpu if f'source="{backend}"' not in ln]
    words = stepwatch("status", str(run_dir)).stdout
    assert ("GPU: RECORDED replay" in words) == (backend == "replay"), words


def test_stepwatch_export_writes_the_textfile_atomically(tmp_path: Path):
    out = tmp_path / "prom" / "stepwatch.prom"
    out.parent.mkdir()
    r = stepwatch("export", str(STATIC_RUN), "--textfile", str(out))
    assert r.returncode == 0, r.stderr
    assert 'stepwatch_steps_total{attempt="1",run="ended-sigkill"} 100.0' in out.read_text()
    assert sorted(p.name for p in out.parent.iterdir()) == ["stepwatch.prom"]  # no temp file left behind
    r = stepwatch("export", str(STATIC_RUN))
    assert r.stdout == out.read_text()  # stdout: the same text


def _query(port: int, q: str) -> list[dict]:
    url = f"http://127.0.0.1:{port}/api/v1/query?" + urllib.parse.urlencode({"query": q})
    with urllib.request.urlopen(url, timeout=5) as resp:
        doc = json.load(resp)
    assert doc["status"] == "success", doc
    return doc["data"]["result"]


def _ready(port: int, server: subprocess.Popen) -> bool:
    assert server.poll() is None, "prometheus exited (its log: prometheus.log beside the test's files)"
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/-/ready", timeout=2) as resp:
            return resp.status == 200
    except OSError:
        return False


def _value(port: int, q: str) -> float | None:
    res = _query(port, q)
    return float(res[0]["value"][1]) if res else None


@pytest.mark.slow
def test_a_real_prometheus_scraping_a_live_run_sees_its_steps_step_times_and_a_stall(tmp_path: Path):
    prometheus = _need("prometheus")
    first = _free_port()
    repo = make_repo(tmp_path / "repo", {"train.py": TRAIN_PY})
    (repo / "run.toml").write_text(f'name = "prom"\ncommand = [{json.dumps(sys.executable)}, "train.py"]\n'
                                   f'[export]\nprometheus = "127.0.0.1:{first}-{first + 40}"\nlinger_s = 0\n')
    subprocess.run(["git", "add", "run.toml"], cwd=repo, check=True)
    subprocess.run(["git", "commit", "-qm", "config"], cwd=repo, check=True)
    r = stepwatch("launch", "run.toml", "--no-tui", cwd=repo)
    assert r.returncode == 0, r.stderr
    run_dir = repo / "runs" / "prom"
    addr = wait_until(lambda: (json.loads((run_dir / "run.json").read_text()).get("export") or {}).get("prometheus"),
                      20, what="the endpoint's address in run.json")
    web = _free_port()
    (tmp_path / "prometheus.yml").write_text(
        "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n"
        f"scrape_configs:\n  - job_name: stepwatch\n    static_configs:\n      - targets: ['{addr}']\n")
    server = subprocess.Popen([prometheus, f"--config.file={tmp_path / 'prometheus.yml'}",
                               f"--storage.tsdb.path={tmp_path / 'tsdb'}", f"--web.listen-address=127.0.0.1:{web}"],
                              stdout=subprocess.DEVNULL, stderr=open(tmp_path / "prometheus.log", "wb"))
    pid = read_pid(run_dir)
    try:
        wait_until(lambda: _ready(web, server), 60, interval_s=0.2, what="Prometheus to be ready")
        wait_until(lambda: (_value(web, 'stepwatch_steps_total{run="prom"}') or 0) >= 10, 60,
                   interval_s=0.5, what="Prometheus to hold 10 steps")
        assert _value(web, 'up{job="stepwatch"}') == 1.0
        assert _value(web, 'stepwatch_stalled{run="prom"}') == 0.0  # control: running, not stalled
        before = _status(run_dir)["step"]["global_step"]
        scraped = _value(web, 'stepwatch_steps_total{run="prom"}')
        after = _status(run_dir)["step"]["global_step"]
        # one scrape (1 s) plus the supervisor's refresh (1 s) behind at most: 0.05 s steps
        assert before - 2 / 0.05 - 5 <= scraped <= after, (before, scraped, after)
        os.kill(pid, signal.SIGSTOP)
        wait_until(lambda: _value(web, 'stepwatch_stalled{run="prom"}') == 1.0, 60, interval_s=0.5,
                   what="stepwatch_stalled to go to 1 under SIGSTOP")
        snap = _status(run_dir)  # frozen: the scrape and the view read the same files
        assert _value(web, 'stepwatch_steps_total{run="prom"}') == snap["step"]["global_step"]
        assert _value(web, 'stepwatch_step_time_p50_seconds{run="prom"}') == pytest.approx(snap["step_seconds"]["p50"])
        assert _value(web, 'stepwatch_step_time_observations_total{run="prom"}') == snap["step_seconds"]["n"]
        assert _value(web, 'stepwatch_training_process_up{run="prom"}') == 1.0
    finally:
        os.kill(pid, signal.SIGCONT)
        stepwatch("stop", str(run_dir), "--grace", "1", timeout=30)
        server.terminate()
        server.wait(10)


def _status(run_dir: Path) -> dict:
    return json.loads(stepwatch("status", str(run_dir), "--json").stdout)


def read_pid(run_dir: Path) -> int:
    return json.loads((run_dir / "run.json").read_text())["process"]["pid"]
