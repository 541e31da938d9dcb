"""The pre-launch checklist: each gate fires on bad input and passes good input."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from conftest import git, make_repo, stepwatch
from stepwatch.launcher.config import load_config
from stepwatch.launcher.preflight import (
    check_config, check_provenance, check_test_suite, check_training_arguments, check_watchdog, run_checklist,
)


def write_cfg(repo: Path, body: str, command: str = '"train.py"') -> Path:
    cfg = repo / "run.toml"
    cfg.write_text(f'name = "pf"\ncommand = ["{sys.executable}", {command}]\n{body}')
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", "config")
    return cfg


@pytest.fixture
def harness(tmp_path: Path) -> Path:
    return make_repo(tmp_path / "h", {"train.py": "from stepwatch.telemetry import StepTelemetry\nprint('train')\n"})


@pytest.mark.system
def test_test_command_that_runs_no_tests_fails(harness: Path):
    cfg = load_config(write_cfg(harness, f'[preflight]\ntest_command = ["{sys.executable}", "-m", "pytest", "-q", "tests_none"]\n'))
    (harness / "tests_none").mkdir()
    item = check_test_suite(cfg)
    assert item.status == "fail"
    assert "ran no tests" in item.reason and item.detail["returncode"] == 5


@pytest.mark.system
def test_green_test_suite_passes_and_red_one_fails(harness: Path):
    (harness / "test_ok.py").write_text("def test_one():\n    assert 1 + 1 == 2\n")
    cfg = load_config(write_cfg(harness, f'[preflight]\ntest_command = ["{sys.executable}", "-m", "pytest", "-q", "test_ok.py"]\n'))
    item = check_test_suite(cfg)
    assert item.status == "pass", item.reason
    assert "1 passed" in item.reason
    (harness / "test_ok.py").write_text("def test_one():\n    assert 1 + 1 == 3\n")
    item = check_test_suite(cfg)
    assert item.status == "fail" and "1 failed" in item.reason and item.detail["returncode"] == 1


def test_missing_test_runner_fails(harness: Path):
    cfg = load_config(write_cfg(harness, '[preflight]\ntest_command = ["no-such-test-runner"]\n'))
    assert check_test_suite(cfg).status == "fail"


@pytest.mark.system
def test_training_argument_unknown_to_the_installed_library_fails_by_name(harness: Path):
    cfg = load_config(write_cfg(harness, '[preflight.training_arguments]\nlearning_rate = 2e-5\nwarmup_ratio = 0.03\n'))
    item = check_training_arguments(cfg)
    assert item.status == "fail"
    assert "warmup_ratio" in item.reason and "learning_rate" not in item.detail["unknown"]
    assert "warmup_steps" in item.detail["unknown"]["warmup_ratio"]  # the closest accepted name


@pytest.mark.system
def test_correct_training_arguments_pass(harness: Path):
    cfg = load_config(write_cfg(harness, '[preflight.training_arguments]\nlearning_rate = 2e-5\nwarmup_steps = 10\n'
                                         'per_device_train_batch_size = 4\n'))
    item = check_training_arguments(cfg)
    assert item.status == "pass", item.reason
    assert item.detail["python"] == sys.executable


def test_training_arguments_checked_in_the_jobs_own_interpreter(harness: Path, tmp_path: Path):
    # An interpreter without transformers: the check must say so, not read our own environment.
    fake = tmp_path / "python3"
    fake.write_text("#!/bin/sh\nexec " + sys.executable + " -S -c 'import json; print(json.dumps({\"error\": \"ModuleNotFoundError: transformers\"}))'\n")
    fake.chmod(0o755)
    cfg = load_config(write_cfg(harness, f'[preflight]\npython = "{fake}"\n[preflight.training_arguments]\nlearning_rate = 1e-4\n'))
    item = check_training_arguments(cfg)
    assert item.status == "fail" and "cannot import transformers" in item.reason


def test_config_check_fails_on_missing_command_and_tiny_disk(harness: Path):
    cfg = load_config(write_cfg(harness, "[preflight]\nmin_free_bytes = 1\n"))
    assert check_config(cfg).status == "pass"
    cfg = load_config(write_cfg(harness, f"[preflight]\nmin_free_bytes = {1 << 60}\n"))
    item = check_config(cfg)
    assert item.status == "fail" and "GiB free" in item.reason
    cfg = load_config(write_cfg(harness, "[preflight]\nmin_free_bytes = 1\n"))
    cfg.command = ["definitely-not-a-program"]
    assert "command not found" in check_config(cfg).reason


def test_provenance_heuristic_warns_without_the_emitter(harness: Path):
    cfg = load_config(write_cfg(harness, ""))
    assert check_provenance(cfg).status == "pass"
    (harness / "plain.py").write_text("print('no telemetry here')\n")
    cfg.command = [sys.executable, "plain.py"]
    item = check_provenance(cfg)
    assert item.status == "warn" and "heuristic" in item.reason


@pytest.mark.system
def test_watchdog_item_passes_on_a_working_watchdog(monkeypatch):
    assert check_watchdog().status == "pass"
    import stepwatch.monitors.watchdog as wd

    monkeypatch.setattr(wd, "probe", lambda ref: "alive")  # a watchdog that can only say "alive"
    item = check_watchdog()
    assert item.status == "fail"


@pytest.mark.system
def test_the_watchdog_item_warns_when_py_spy_is_missing_as_a_stall_page_would_carry_no_stacks(monkeypatch):
    """py-spy was only in the test extra: a plain install paged stalls without stacks and the checklist did not say
    so (issue 44). It is a dependency now, and the checklist says when it cannot be found."""
    import stepwatch.launcher.preflight as pf

    assert check_watchdog().status == "pass"  # the control: installed (a dependency)
    monkeypatch.setattr(pf, "py_spy", lambda: None)
    item = check_watchdog()
    assert item.status == "warn" and "py-spy not found: a stall's page will carry no stacks" in item.reason, item


@pytest.mark.system
def test_preflight_cli_exit_codes_and_launch_refusal(harness: Path):
    cfg = write_cfg(harness, '[preflight.training_arguments]\nwarmup_ratio = 0.1\n')
    r = stepwatch("preflight", str(cfg), cwd=harness)
    assert r.returncode == 1 and "[FAIL] arguments checked by name" in r.stdout and "warmup_ratio" in r.stdout
    r = stepwatch("launch", "--no-tui", str(cfg), cwd=harness)
    assert r.returncode == 1 and "--override" in r.stderr
    assert not (harness / "runs" / "pf" / "run.json").exists()
    r = stepwatch("launch", "--no-tui", str(cfg), "--override", "converting the ratio at the call site", cwd=harness)
    assert r.returncode == 0, r.stderr
    rec = json.loads((harness / "runs" / "pf" / "run.json").read_text())["preflight"]
    assert rec["failed"] == ["training_arguments"] and rec["override_reason"] == "converting the ratio at the call site"
    item = next(i for i in rec["items"] if i["id"] == "training_arguments")
    assert item["overridden"] is True
    assert {i["id"] for i in rec["items"]} == {"clean_tree", "test_suite", "training_arguments", "config", "watchdog",
                                                 "log_rotation", "provenance", "log_format", "alert_channels"}


@pytest.mark.system
def test_good_checklist_passes_with_exit_0(harness: Path):
    cfg = write_cfg(harness, '[preflight.training_arguments]\nwarmup_steps = 5\n')
    r = stepwatch("preflight", str(cfg), cwd=harness)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "[FAIL]" not in r.stdout
    cl = run_checklist(load_config(cfg))
    assert cl.failed == []


@pytest.mark.parametrize("body", [
    "x = " + "[" * 100_000 + "]" * 100_000,  # tomllib recurses per level: a RecursionError before
    "x = " + "{ a = " * 100_000 + "1" + " }" * 100_000,
], ids=["array", "inline-table"])
def test_a_config_nested_too_deeply_is_one_line_not_a_traceback(tmp_path: Path, monkeypatch, capsys, body: str):
    """``stepwatch preflight`` / ``launch`` with a hostile config: exit 2 and one line on stderr that says
    why, never a RecursionError's traceback (the CLI's own entry point, in process)."""
    from stepwatch.tui.cli import main

    monkeypatch.setattr(sys, "stdout", sys.stdout)  # main() wraps both streams: put back what capsys set
    monkeypatch.setattr(sys, "stderr", sys.stderr)
    cfg = tmp_path / "deep.toml"
    cfg.write_text(f'name = "deep"\ncommand = ["python3", "ok.py"]\n{body}\n')
    for argv in (["preflight", str(cfg)], ["launch", "--no-tui", "--runs-dir", str(tmp_path / "runs"), str(cfg)]):
        assert main(argv) == 2, argv
        out, err = capsys.readouterr()
        assert out == "" and err.splitlines() == [f"stepwatch: {cfg}: not valid TOML: nested too deeply to read"], (argv, err)
    assert not (tmp_path / "runs").exists()


def test_an_unreadable_config_path_is_one_line_not_a_traceback(tmp_path: Path, monkeypatch, capsys):
    from stepwatch.tui.cli import main

    monkeypatch.setattr(sys, "stdout", sys.stdout)
    monkeypatch.setattr(sys, "stderr", sys.stderr)
    (tmp_path / "file").write_text("x")
    cfg = tmp_path / "file" / "run.toml"  # ENOTDIR: neither missing nor a directory
    assert main(["preflight", str(cfg)]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.splitlines() == [f"stepwatch: cannot read config file {cfg}: Not a directory"], err


def test_a_repository_others_can_write_is_a_warning_naming_who_and_a_private_one_passes(harness: Path):
    """Issue 30: a member of a group that may write the repository can commit the code the next relaunch runs
    as you. The checklist says so (a warning: a team's shared repository is a choice, not an attack)."""
    from stepwatch.launcher.identity import read_tree
    from stepwatch.launcher.preflight import check_clean_tree

    harness.chmod(0o755)
    (harness / ".git").chmod(0o755)
    item = check_clean_tree(read_tree(harness, harness / "runs"))
    assert item.status == "pass", item  # the control: the owner's alone
    (harness / ".git").chmod(0o775)
    item = check_clean_tree(read_tree(harness, harness / "runs"))
    assert item.status == "warn" and f"{harness / '.git'} is writable by group " in item.reason, item
    assert "they can change the code that runs as you on the next launch or relaunch" in item.reason, item
    harness.chmod(0o757)
    item = check_clean_tree(read_tree(harness, harness / "runs"))
    assert item.status == "warn" and f"{harness} is writable by everyone" in item.reason, item
