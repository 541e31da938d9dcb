"""launcher/trust.py: what may say what runs as the owner (unit tier; the second user's attacks on
a shared runs dir are in test_shared_dir.py)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from stepwatch.launcher.trust import (
    launch_digest, owner_copy_path, private_problem, read_owner_copy, read_private_json, save_owner_copy,
    shared_dir_problem,
)
from stepwatch.monitors.runfiles import read_push_urls, write_json_atomic

NOBODY = 65534
RUN = {"name": "r", "attempt": 1, "argv": ["python", "train.py"], "executable": "/usr/bin/python", "shell": False,
       "cwd": "/tmp", "env": {"LR": "1e-4"}, "config": {"command": ["python", "train.py"]}, "config_path": None,
       "config_sha256": None, "launched_at_unix": 1.5, "process": {"pid": 12}}


# --- the digest --------------------------------------------------------------------------------

def test_the_launch_digest_covers_what_runs_and_nothing_the_supervisor_adds_later():
    d = launch_digest(RUN)
    assert d == launch_digest({**RUN, "process": {"pid": 99}, "supervisor": {"pid": 7}})  # completed later
    for key, value in (("argv", ["sh", "-c", "evil"]), ("env", {"LD_PRELOAD": "x"}), ("cwd", "/"),
                       ("config", {"alerts": {"command": "evil"}}), ("config_path", "/tmp/theirs.toml")):
        assert launch_digest({**RUN, key: value}) != d, key


# --- private files ----------------------------------------------------------------------------

def test_a_private_file_is_the_readers_own_with_no_group_or_other_write_and_one_link(tmp_path: Path):
    f = tmp_path / "f.json"
    f.write_text(json.dumps({"a": 1}))
    f.chmod(0o644)
    assert private_problem(f.stat(), "f") is None and read_private_json(f, "f") == ({"a": 1}, None)
    f.chmod(0o664)
    assert "writable by group" in (private_problem(f.stat(), "f") or "")
    f.chmod(0o646)
    assert "writable by every user" in (private_problem(f.stat(), "f") or "")
    f.chmod(0o644)
    os.link(f, tmp_path / "other-name")
    assert "2 hard links" in (private_problem(f.stat(), "f") or "")
    (tmp_path / "other-name").unlink()
    os.chown(f, NOBODY, -1)
    obj, why = read_private_json(f, "f")
    assert obj is None and f"belongs to uid {NOBODY}" in (why or "")


def test_a_symlink_is_never_followed_to_a_private_file(tmp_path: Path):
    target = tmp_path / "target.json"
    target.write_text("{}")
    (tmp_path / "link.json").symlink_to(target)
    obj, why = read_private_json(tmp_path / "link.json", "link")
    assert obj is None and "symlink is never followed" in (why or "")


def test_a_group_writable_dir_is_shared_and_an_owner_only_one_is_not(tmp_path: Path):
    d = tmp_path / "d"
    d.mkdir(mode=0o755)
    assert shared_dir_problem(d) is None
    d.chmod(0o2775)
    assert "writable by group" in (shared_dir_problem(d) or "")
    d.chmod(0o1777)
    assert "writable by every user" in (shared_dir_problem(d) or "")


# --- the owner's copy -------------------------------------------------------------------------

def test_the_owners_copy_round_trips_owner_only_and_refuses_a_copy_of_another_run_dir(tmp_path: Path):
    run_dir = tmp_path / "runs" / "r"
    run_dir.mkdir(parents=True)
    assert save_owner_copy(run_dir, RUN) is None
    path = owner_copy_path(run_dir)
    assert path.stat().st_mode & 0o777 == 0o600 and path.parent.stat().st_mode & 0o777 == 0o700
    copy, why = read_owner_copy(run_dir)
    assert why is None and copy is not None and copy["argv"] == RUN["argv"] and copy["digest"] == launch_digest(RUN)
    other = tmp_path / "runs" / "s"
    other.mkdir()
    assert read_owner_copy(other)[0] is None  # no copy: never another run dir's
    doc = json.loads(path.read_text())
    doc["argv"] = ["sh", "-c", "evil"]  # edited without its digest
    write_json_atomic(path, doc, mode=0o600)
    assert "does not describe" in (read_owner_copy(run_dir)[1] or "")


def test_a_state_dir_others_can_write_keeps_no_copy_and_says_so(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    state = tmp_path / "state"
    (state / "launches").mkdir(parents=True)
    (state / "launches").chmod(0o777)
    monkeypatch.setenv("STEPWATCH_STATE_DIR", str(state))
    warning = save_owner_copy(tmp_path, RUN)
    assert warning and "not kept where only you can write" in warning
    assert read_owner_copy(tmp_path)[0] is None


# --- push URLs --------------------------------------------------------------------------------

def test_push_urls_are_read_only_from_the_owners_own_file(tmp_path: Path):
    write_json_atomic(tmp_path / "alerts.urls.json", {"v": 1, "urls": ["json://127.0.0.1:9/a"]}, mode=0o600)
    assert read_push_urls(tmp_path) == ["json://127.0.0.1:9/a"]
    os.chown(tmp_path / "alerts.urls.json", NOBODY, -1)  # a member's file renamed into the owner's place
    assert read_push_urls(tmp_path) == []


# --- a config file a command runs ----------------------------------------------------------------

def _config_problem(path: Path) -> str | None:
    from stepwatch.launcher.trust import config_file_problem

    return config_file_problem(path, path.stat())


def test_a_config_file_says_what_runs_only_when_it_and_its_directory_are_the_readers_alone(tmp_path: Path):
    d = tmp_path / "proj"
    d.mkdir(mode=0o755)
    d.chmod(0o755)
    cfg = d / "run.toml"
    cfg.write_text('name = "r"\ncommand = ["true"]\n')
    cfg.chmod(0o644)
    assert _config_problem(cfg) is None  # the positive control: the owner's alone
    cfg.chmod(0o664)
    assert "the file is writable by group" in (_config_problem(cfg) or "")
    cfg.chmod(0o644)
    os.link(cfg, d / "alias.toml")
    assert "2 hard links" in (_config_problem(cfg) or "")
    (d / "alias.toml").unlink()
    d.chmod(0o775)
    assert f"its directory {d} is writable by others (mode 0775): the file can be replaced" == _config_problem(cfg)
    d.chmod(0o1777)  # sticky, as /tmp: only the file's owner may replace it
    assert _config_problem(cfg) is None
    d.chmod(0o755)
    os.chown(d, NOBODY, -1)
    assert f"its directory {d} belongs to uid {NOBODY}" in (_config_problem(cfg) or "")
    os.chown(d, os.geteuid(), -1)
    os.chown(cfg, NOBODY, -1)
    assert f"the file belongs to uid {NOBODY}" in (_config_problem(cfg) or "")


def test_load_config_refuses_a_config_others_can_write_with_the_one_sentence_and_reads_it_once_it_is_private(
        tmp_path: Path):
    from stepwatch.launcher.config import UntrustedConfig, load_config
    from stepwatch.launcher.trust import CONFIG_REFUSAL

    cfg = tmp_path / "run.toml"
    cfg.write_text('name = "r"\ncommand = ["true"]\n')
    cfg.chmod(0o666)
    with pytest.raises(UntrustedConfig) as e:
        load_config(cfg, runs_dir_override=tmp_path / "runs")
    assert str(e.value) == (f"REFUSING the config file {cfg}: the file is writable by every user (mode 0666). "
                            f"{CONFIG_REFUSAL}")
    cfg.chmod(0o644)
    assert load_config(cfg, runs_dir_override=tmp_path / "runs").name == "r"
