"""One typed run config (monitors/runsettings.py): converted once at load, the same from run.json, each table's keys
declared once."""

from __future__ import annotations

import ast
import dataclasses
import functools
from pathlib import Path

import pytest

from stepwatch.launcher.config import TABLE_KEYS, TOP_KEYS, ConfigError, config_to_json, load_config
from stepwatch.launcher.slurm import SLURM_KEYS
from stepwatch.monitors.runsettings import TABLE_TYPES, RunSettings
from stepwatch.monitors.watch.paging import PagingSettings

REPO_ROOT = Path(__file__).resolve().parents[1]

EVERY_TABLE = r'''name = "every"
command = ["python", "train.py"]
[preflight]
test_command = ["pytest", "-q"]
test_timeout_s = 30
python = "/usr/bin/python3"
min_free_bytes = 1024
[preflight.training_arguments]
learning_rate = 1e-4
[alerts]
command = ["notify-send", "stepwatch"]
urls = ["ntfy://ntfy.sh/my-topic"]
min_level = "info"
rate_limit_s = 5
retries = 2
command_timeout_s = 20
finished = ["command"]
confirm_s = { stall = 120 }
channel_min_level = { command = "error" }
quiet_hours = "23:00-07:00"
quiet_min_level = "warning"
digest_after = 3
digest_window_s = 30
[log]
patterns = ['step (?P<step>\d+) loss (?P<loss>\S+)']
examples = ["step 3 loss 0.5"]
max_steps = 300
epochs = 3
logging_steps = 10
eval_lines = ["running eval"]
save_lines = ['^ckpt -> \S+']
[stall]
step_floor_s = 30
busy_floor_s = 900
phase_floor_s = 1800
[restart]
mode = "enforce"
max_restarts = 2
backoff_s = 5
storm_attempts = 4
storm_window_s = 300
checkpoints = "out/ckpt_*"
complete_marker = "DONE"
resume = ["--from", "{checkpoint}"]
unsafe_checkpoint = "scratch"
[slurm]
partition = "gpu"
nodes = 1
poll_s = 2
[export]
prometheus = "127.0.0.1:9464"
linger_s = 3
'''


def _config(tmp_path: Path, body: str) -> Path:
    path = tmp_path / "run.toml"
    path.write_text(body)
    return path


def test_the_settings_of_run_json_are_those_the_config_was_converted_to(tmp_path: Path):
    cfg = load_config(_config(tmp_path, EVERY_TABLE), runs_dir_override=tmp_path / "runs")
    s = cfg.settings
    # every table is set (none left at its defaults), as the TOML says
    assert s.preflight.test_timeout_s == 30.0 and s.preflight.training_arguments == {"learning_rate": 1e-4}
    assert s.alerts.urls == ("ntfy://ntfy.sh/my-topic",) and s.paging.confirm_window_s("stall") == 120
    assert s.log.max_steps == 300 and len(s.patterns) == 1 and s.stall.step_floor_s == 30.0
    assert s.restart.mode == "enforce" and s.restart.resume == ("--from", "{checkpoint}")
    assert s.slurm == {"partition": "gpu", "nodes": 1, "poll_s": 2} and s.export.prometheus == "127.0.0.1:9464"
    from_run = RunSettings.of_run({"config": config_to_json(cfg)})
    # run.json names the push channels, never their URLs (alerts.urls.json holds them): the one difference
    assert from_run.alerts.urls == ()
    assert from_run == dataclasses.replace(s, alerts=dataclasses.replace(s.alerts, urls=()))


def test_a_table_run_json_holds_invalid_or_not_at_all_reads_as_its_defaults():
    assert RunSettings.of_run({}) == RunSettings() == RunSettings.of_run({"config": "x"})
    got = RunSettings.of_run({"config": {"stall": {"busy_floor_s": -1}, "restart": {"mode": "enforce"},
                                         "alerts": "loud", "log": {"max_steps": 0}}})
    assert got == RunSettings(restart=dataclasses.replace(RunSettings().restart, mode="enforce"))


@pytest.mark.parametrize("table", list(TABLE_KEYS))
def test_an_unknown_key_in_each_table_is_refused_by_name_with_the_accepted_ones(tmp_path: Path, table: str):
    path = _config(tmp_path, f'name = "x"\ncommand = ["python", "t.py"]\n[{table}]\nwarmup_ratio = 0.1\n')
    with pytest.raises(ConfigError) as e:
        load_config(path, runs_dir_override=tmp_path / "runs")
    assert str(e.value) == (f"{path} [{table}]: unknown key 'warmup_ratio'; accepted keys are: "
                            f"{', '.join(TABLE_KEYS[table])}")


def test_each_tables_accepted_keys_are_its_settings_types_own():
    for name, t in TABLE_TYPES.items():
        assert TABLE_KEYS[name] is t.KEYS, name
    assert TABLE_KEYS["slurm"] is SLURM_KEYS
    assert TOP_KEYS == ("name", "command", "cwd", "runs_dir", "env", "shell", *TABLE_KEYS)
    for name in ("restart", "export", "preflight"):  # a table whose fields are its keys: the two agree
        assert [f.name for f in dataclasses.fields(TABLE_TYPES[name])] == list(TABLE_KEYS[name]), name


@functools.cache
def _string_literals() -> list[tuple[str, set[str]]]:
    """Every tuple, list or set literal of the product holding two strings or more: (where, its strings)."""
    out = []
    for folder in ("launcher", "monitors", "tui"):
        for f in sorted((REPO_ROOT / folder).rglob("*.py")):
            for node in ast.walk(ast.parse(f.read_text())):
                if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
                    words = {e.value for e in node.elts if isinstance(e, ast.Constant) and isinstance(e.value, str)}
                    if len(words) >= 2:
                        out.append((f"{f.relative_to(REPO_ROOT)}:{node.lineno}", words))
    return out


def _declarations(keys: tuple[str, ...]) -> list[str]:
    """Every literal of the product that lists a table's keys (all of them, or all but one of a longer table's)."""
    need = len(keys) if len(keys) <= 3 else len(keys) - 1
    return [where for where, words in _string_literals() if len(words & set(keys)) >= need]


def test_each_tables_keys_are_declared_in_exactly_one_place():
    """Adding a key to a table touches its settings type's module (plus its readers), never a second list."""
    tables = {**TABLE_KEYS, "alerts": tuple(k for k in TABLE_KEYS["alerts"] if k not in PagingSettings.KEYS),
              "alerts (paging)": PagingSettings.KEYS}  # [alerts] takes the paging keys from paging.py's own
    for name, keys in tables.items():
        found = _declarations(keys)
        assert len(found) == 1, (name, found)
    assert _declarations(TOP_KEYS) == []  # the top-level keys are composed from the tables', never listed again
