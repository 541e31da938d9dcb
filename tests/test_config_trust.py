"""One trust rule for every config a command runs (issue 43, finding 3): ``launch``, ``preflight``, ``alerts test``
and ``relaunch`` refuse a config file another user owns or others can write, with the same words and exit 1, and
run nothing of it; each accepts the same config once it is the owner's alone (the positive control). The rule
itself, unit by unit: tests/test_trust.py."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

from conftest import as_member, make_repo, stepwatch, wait_exit
from stepwatch.launcher.trust import CONFIG_REFUSAL
from stepwatch.monitors.runfiles import read_json

pytestmark = pytest.mark.system


def _config_text(name: str, mark: Path, repo: Path) -> str:
    """A run (in ``repo``, a clean tree) whose command and alert command each leave a mark: anything of it that
    runs shows."""
    touch = [sys.executable, "-c", f"open({str(mark)!r}, 'a').write('ran\\n')"]
    return (f'name = "{name}"\ncwd = {json.dumps(str(repo))}\ncommand = {json.dumps(touch)}\n'
            f'[alerts]\ncommand = {json.dumps(touch)}\n')


def _commands(cfg: Path, runs: Path) -> dict[str, tuple[str, ...]]:
    return {"launch": ("launch", "--no-tui", "--runs-dir", str(runs), str(cfg)),
            "preflight": ("preflight", "--runs-dir", str(runs), str(cfg)),
            "alerts test": ("alerts", "test", str(cfg))}


@pytest.mark.parametrize("command", ["launch", "preflight", "alerts test"])
def test_a_config_a_member_owns_or_the_group_can_write_is_refused_alike_and_runs_nothing(
        command: str, shared: Path, member: tuple[int, int], tmp_path: Path):
    repo = make_repo(tmp_path / "harness", {"ok.py": "print('ok')\n"})
    mark = tmp_path / "ran"
    runs = tmp_path / "runs"
    theirs = shared / "theirs.toml"  # the member's own file in the team's dir
    as_member(member, f"open({str(theirs)!r}, 'w').write({_config_text('t', mark, repo)!r})")
    mine = tmp_path / "configs" / "mine.toml"
    mine.parent.mkdir(mode=0o755)
    mine.write_text(_config_text("m", mark, repo))
    mine.chmod(0o664)  # the owner's, written under umask 002: the group may rewrite it

    for cfg, why in ((theirs, f"the file belongs to uid {member[0]}, not to you"),
                     (mine, "the file is writable by group")):
        r = stepwatch(*_commands(cfg, runs)[command], cwd=repo)
        said = r.stdout + r.stderr
        assert r.returncode == 1, (command, said)
        assert f"REFUSING the config file {cfg}: {why}" in said and CONFIG_REFUSAL in said, (command, said)
        assert "Traceback" not in said and not mark.exists() and not (runs / cfg.stem[0]).exists(), said

    mine.chmod(0o644)  # the positive control: the owner's alone, the same command reads and runs it
    r = stepwatch(*_commands(mine, runs)[command], cwd=repo)
    assert "REFUSING" not in r.stdout + r.stderr, r.stdout + r.stderr
    if command == "launch":
        assert r.returncode == 0 and wait_exit(runs / "m")["returncode"] == 0, r.stderr
        assert mark.read_text() == "ran\n"
    elif command == "alerts test":
        assert r.returncode == 0 and mark.read_text() == "ran\n", r.stdout + r.stderr
    else:
        assert r.returncode == 0 and "[PASS] config validated" in r.stdout, r.stdout + r.stderr


def test_relaunch_refuses_its_config_once_the_group_can_write_it_in_the_words_launch_uses(tmp_path: Path):
    repo = make_repo(tmp_path / "harness", {"ok.py": "print('ok')\n"})
    mark, runs = tmp_path / "ran", tmp_path / "runs"
    cfg = tmp_path / "configs" / "r.toml"
    cfg.parent.mkdir(mode=0o755)
    cfg.write_text(_config_text("r", mark, repo))
    cfg.chmod(0o644)
    assert stepwatch("launch", "--no-tui", "--runs-dir", str(runs), str(cfg), cwd=repo).returncode == 0
    wait_exit(runs / "r")
    cfg.chmod(0o664)
    r = stepwatch("relaunch", "--no-tui", str(runs / "r"), cwd=repo)
    assert r.returncode == 1, r.stdout + r.stderr
    assert f"REFUSING to relaunch r: REFUSING the config file {cfg}: the file is writable by group" in r.stderr
    assert CONFIG_REFUSAL in r.stderr and read_json(runs / "r" / "run.json")["attempt"] == 1  # type: ignore[index]
    cfg.chmod(0o644)
    r = stepwatch("relaunch", "--no-tui", str(runs / "r"), cwd=repo)
    assert r.returncode == 0, r.stderr
    assert wait_exit(runs / "r") and read_json(runs / "r" / "run.json")["attempt"] == 2  # type: ignore[index]
    assert mark.read_text() == "ran\nran\n" and os.stat(cfg).st_mode & 0o777 == 0o644


def test_alerts_test_never_runs_the_alert_command_in_a_run_dir_a_member_made(
        shared: Path, member: tuple[int, int], tmp_path: Path):
    """`alerts test CONFIG` runs the command where the supervisor would, the run dir: one a member made under the
    run's name, with a module of theirs in it, is refused with the reason and nothing of theirs runs as the owner;
    the control (no such dir) delivers the test page."""
    imported, delivered = tmp_path / "imported", tmp_path / "delivered"
    module = f"open({str(imported)!r}, 'w').write('x')\n"
    as_member(member, f"import os\nd = {str(shared / 'z2')!r}\nos.mkdir(d, 0o2775)\n"
                      f"open(d + '/json.py', 'w').write({module!r})\n")
    page = [sys.executable, "-c", f"import json; open({str(delivered)!r}, 'w').write('page')"]
    cfgs = tmp_path / "configs"
    cfgs.mkdir(mode=0o755)
    for name in ("z2", "z3"):
        (cfgs / f"{name}.toml").write_text(f'name = "{name}"\nruns_dir = {json.dumps(str(shared))}\ncommand = ["true"]\n'
                                           f'[alerts]\ncommand = {json.dumps(page)}\n')
        (cfgs / f"{name}.toml").chmod(0o644)
    r = stepwatch("alerts", "test", str(cfgs / "z2.toml"), cwd=tmp_path)
    assert r.returncode == 1, r.stdout + r.stderr
    assert f"REFUSING to run the alert command in {shared / 'z2'}: {shared / 'z2'} belongs to uid {member[0]}" in r.stderr
    assert not imported.exists() and not delivered.exists()
    r = stepwatch("alerts", "test", str(cfgs / "z3.toml"), cwd=tmp_path)  # the control
    assert r.returncode == 0 and delivered.read_text() == "page" and not imported.exists(), r.stdout + r.stderr
