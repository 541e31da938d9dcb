"""The alert channels, checked before they are needed: the pre-launch checklist's ``alert_channels`` item (each
push URL parsed by apprise, the command found where it will run: the supervisor runs it in the run dir), and
``stepwatch alerts test RUN|CONFIG``, which sends one test page to every channel through the same
:class:`~stepwatch.monitors.watch.delivery.Deliverer` the supervisor uses and prints each outcome.

What runs comes from the user's own config, or their own copy of a launch (ARCHITECTURE.md R17); a URL is
named by its channel (scheme and host), never printed whole: its path holds a topic or a token.
"""

from __future__ import annotations

import os
import sys
import shutil
from pathlib import Path
from typing import Any

from stepwatch.launcher.config import ConfigError, RunConfig, UntrustedConfig, load_config
from stepwatch.launcher.trust import read_owner_copy, shared_dir_problem
from stepwatch.monitors.rundirs import resolve_run
from stepwatch.monitors.runfiles import read_push_urls
from stepwatch.monitors.snapshot.alerts import push_channel_names

#: How long ``alerts test`` waits for every channel (the delivery's own retries and timeouts are inside).
TEST_WAIT_S = 120.0


def command_problem(command: list[str], runs_in: Path) -> str | None:
    """Why the alert command would not start where the supervisor runs it (``runs_in``: the run dir), or None."""
    prog = command[0]
    if "/" in prog:
        path = Path(prog) if os.path.isabs(prog) else runs_in / prog
        if not path.is_file():
            return f"the alert command {prog!r} is not there: it runs in the run dir {runs_in} (give an absolute path)"
        return None if os.access(path, os.X_OK) else f"the alert command {prog!r} is not executable"
    return None if shutil.which(prog) else f"the alert command {prog!r} is not on PATH"


def url_problems(urls: list[str]) -> list[str]:
    """A problem per push URL apprise cannot parse, each named by its channel (the URL itself never shows)."""
    import apprise  # noqa: PLC0415 - only a run with push URLs pays for it

    return [f"apprise does not understand the URL of channel {name}" for name, url in zip(push_channel_names(urls), urls)
            if not apprise.Apprise().add(url)]


def alert_channels_verdict(cfg: RunConfig) -> tuple[str, str, dict[str, Any]]:
    """The checklist's ``alert_channels`` item as (status, reason, detail): fail when a channel could never
    deliver; skipped when the run names none."""
    command, urls = cfg.alerts.get("command"), [u for u in cfg.alerts.get("urls") or [] if isinstance(u, str) and u]
    if not command and not urls:
        return "skipped", "no [alerts] command or urls: alerts show on screen only", {}
    problems = ([p] if command and (p := command_problem(list(command), cfg.run_dir)) else []) + (
        url_problems(urls) if urls else [])
    names = (["command"] if command else []) + push_channel_names(urls)
    detail = {"channels": names, "command_runs_in": str(cfg.run_dir) if command else None}
    if problems:
        return "fail", "; ".join(problems), detail
    where = f" (the command runs in {cfg.run_dir})" if command else ""
    return "pass", f"{', '.join(names)}{where}; `stepwatch alerts test` sends a test page", detail


def _channels(target: str, runs_dir: Path | None) -> tuple[dict[str, Any], list[str], Path, str]:
    """(the [alerts] settings, the push URLs, where the command runs, the run's name) of a CONFIG or a RUN."""
    if target.endswith(".toml") and Path(target).is_file():
        cfg = load_config(target, runs_dir_override=runs_dir)
        return dict(cfg.alerts), [u for u in cfg.alerts.get("urls") or [] if isinstance(u, str)], cfg.run_dir, cfg.name
    from stepwatch.monitors.rundirs import default_runs_dir  # noqa: PLC0415

    run_dir = resolve_run(target, runs_dir or default_runs_dir())
    launch, why = read_owner_copy(run_dir)  # what runs: your own copy of the launch, never run.json
    if launch is None:
        raise ConfigError(f"{run_dir}: no launch of yours to take the alert command from ({why}); test its config")
    config: Any = launch.get("config")
    alerts: Any = config.get("alerts") if isinstance(config, dict) else None
    return (dict(alerts) if isinstance(alerts, dict) else {}), read_push_urls(run_dir), run_dir, str(
        launch.get("name") or run_dir.name)


def alerts_test(target: str, runs_dir: Path | None) -> int:
    """``stepwatch alerts test``: one test page to every channel; each outcome printed. 0 when all delivered."""
    from stepwatch.monitors.watch.delivery import Deliverer  # noqa: PLC0415

    try:
        alerts, urls, runs_in, name = _channels(target, runs_dir)
    except UntrustedConfig as e:  # refused as launch, preflight and relaunch refuse it: nothing is run
        print(f"stepwatch alerts test: {e}", file=sys.stderr)
        return 1
    except (ConfigError, OSError, ValueError) as e:
        print(f"stepwatch alerts test: {e}")
        return 2
    if not alerts.get("command") and not urls:
        print("no [alerts] command or urls: nothing to test")
        return 1
    outcomes: list[dict[str, Any]] = []
    config = {**{k: v for k, v in alerts.items() if k not in ("channel_min_level", "quiet_hours")}, "urls": urls,
              "min_level": "info", "rate_limit_s": 0}  # a test page goes to every channel, whatever the hour
    if alerts.get("command"):
        unsafe = shared_dir_problem(runs_in) if os.path.lexists(runs_in) else None
        if unsafe:  # a dir another user made or may write: what lies in it (a module, a script) would run as you
            print(f"stepwatch alerts test: REFUSING to run the alert command in {runs_in}: {unsafe}", file=sys.stderr)
            return 1
        print(f"the command runs where the supervisor runs it: {runs_in}" + ("" if runs_in.is_dir() else
              " (not made yet: run from here instead)"))
    here = os.getcwd()
    try:
        if runs_in.is_dir():
            os.chdir(runs_in)
        d = Deliverer(runs_in, outcomes.append, config, name)
        d.submit({"id": "test", "kind": "test", "message": f"stepwatch test page for {name}: this channel works"})
        d.wait(TEST_WAIT_S)
    finally:
        os.chdir(here)
    for rec in outcomes:
        print(f"{rec['channel']}: {rec['outcome']} ({rec['detail']})")
    return 0 if outcomes and all(r["outcome"] == "delivered" for r in outcomes) else 1
