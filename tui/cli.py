"""The ``stepwatch`` command line (argparse). Exit codes: 0 ok, 1 the checked thing failed (dirty
tree, failed preflight, run failed), 2 usage error or a RUN that does not exist.

Textual is imported only by the commands that open the app, so ``status``/``watch``/``stop`` start fast.
"""

from __future__ import annotations

import argparse
from importlib import import_module
import json
import math
import shlex
import sys
from pathlib import Path

from stepwatch.tui.safe import SafeWriter, one_line
from stepwatch.monitors.rundirs import (
    RunNotFound, default_runs_dir, list_runs, live_attempt, live_words, owned_by_viewer, resolve_run,
    resolve_runs_dir, shown_path,
)

# launcher/ (GitPython) and stepwatch.monitors.snapshot.observer are imported inside the commands that use them:
# `attach` must paint its first frame fast, and `--help` should not load a git binding.

EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2


def _err(msg: str) -> None:
    print(f"stepwatch: {msg}", file=sys.stderr)


def _runs_dir(args: argparse.Namespace) -> Path:
    """--runs-dir, else $STEPWATCH_RUNS_DIR or ./runs; RunsDirError (a RunNotFound): a symlink loop or to nothing."""
    return _runs_dir_flag(args) or default_runs_dir()


def _runs_dir_flag(args: argparse.Namespace) -> Path | None:
    return resolve_runs_dir(args.runs_dir) if getattr(args, "runs_dir", None) else None


def _print_launch(res, verb: str) -> None:
    from stepwatch.tui.plain import launch_lines  # noqa: PLC0415

    out, warnings = launch_lines(res, verb)
    print("\n".join(out))
    for w in warnings:
        print(w, file=sys.stderr)


def _open_tui(run_dir: Path, args: argparse.Namespace) -> int:
    try:
        from stepwatch.tui.app import run_app  # noqa: PLC0415 - textual only when the app opens
    except ImportError as e:
        _err(f"the TUI is not available ({e}); the run goes on. Follow it with: stepwatch watch {run_dir} --plain")
        return EXIT_OK
    return run_app(run_dir=run_dir, runs_dir=run_dir.parent, low_bandwidth=getattr(args, "low_bandwidth", False))


def _launch_and_follow(args: argparse.Namespace, make_cfg, verb: str, follow_headless: bool = False) -> int:
    """Build the config with ``make_cfg()`` (may print), launch it, then open the TUI, follow it
    headless (``follow_headless``: the demo's --no-tui), or return. Maps refusals to exit codes:
    ConfigError / RunNotFound -> 2, LaunchRefused and a config file others can write -> 1."""
    from stepwatch.launcher.config import ConfigError, UntrustedConfig  # noqa: PLC0415
    from stepwatch.launcher.launch import LaunchRefused, launch  # noqa: PLC0415

    try:
        cfg = make_cfg()
        if cfg is None:
            return EXIT_USAGE
        res = launch(cfg, allow_dirty=getattr(args, "allow_dirty", None), override=getattr(args, "override", None))
    except (ConfigError, RunNotFound) as e:
        _err(str(e))
        return EXIT_FAILED if isinstance(e, UntrustedConfig) else EXIT_USAGE
    except LaunchRefused as e:
        _err(str(e))
        return EXIT_FAILED
    _print_launch(res, verb)
    headless = args.no_tui
    if not headless and not sys.stdout.isatty():
        # a pipe or a file: a TUI would only write escape codes into it
        print("  (stdout is not a terminal: no TUI" + ("; following headless, as --no-tui" if follow_headless else
                                                       "; the run goes on") + ")")
        headless = True
    if headless and follow_headless:
        from stepwatch.tui.plain import watch  # noqa: PLC0415

        return watch(res.run_dir, every_n_steps=10)
    return EXIT_OK if headless else _open_tui(res.run_dir, args)


def cmd_launch(args: argparse.Namespace) -> int:
    from stepwatch.launcher.config import config_from_flags, load_config  # noqa: PLC0415

    def make_cfg():
        cmd = list(getattr(args, "command", None) or [])
        if args.config and cmd:
            _err("give either CONFIG.toml or `-- CMD ARGS...`, not both")
            return None
        if args.config:
            return load_config(args.config, runs_dir_override=_runs_dir_flag(args))
        return config_from_flags(cmd, args.name, args.cwd, args.runs_dir, args.env)

    return _launch_and_follow(args, make_cfg, "launched")


def cmd_relaunch(args: argparse.Namespace) -> int:
    from stepwatch.launcher.relaunch import COMMIT_MOVED, relaunch_config, resume_newest_by_hand  # noqa: PLC0415

    def make_cfg():
        run_dir = resolve_run(args.run, _runs_dir(args))
        live = live_attempt(run_dir)
        if live:
            from stepwatch.launcher.launch import LaunchRefused  # noqa: PLC0415

            raise LaunchRefused(f"REFUSING: {run_dir.name} is still running ({live_words(live)}). "
                                f"Stop it first: stepwatch stop {run_dir}")
        _warn_survivors(run_dir)
        cfg, changes = relaunch_config(run_dir)
        if args.from_checkpoint or args.checkpoint:  # resumed by [restart] resume
            cp = resume_newest_by_hand(cfg, run_dir, args.checkpoint)
            print(f"resuming from {cp.path} (step {cp.step})")
        moved = [c for c in changes if c.startswith(COMMIT_MOVED)]  # the harness's commit, said on its own line
        if config_changes := [c for c in changes if c not in moved]:
            print("config changed since the last attempt:")
            for c in config_changes:
                print(f"  {c}")
        else:
            print("config unchanged since the last attempt")
        for c in moved:
            print(c)
        print(f"command: {shlex.join(cfg.command)}  (cwd {cfg.cwd})")
        return cfg

    return _launch_and_follow(args, make_cfg, "relaunched")


def cmd_stop(args: argparse.Namespace) -> int:
    from stepwatch.tui.plain import describe_end, stop_lines  # noqa: PLC0415
    from stepwatch.launcher.stop import (  # noqa: PLC0415
        StopError, StopInProgress, kill_survivors, refuse_foreign, request_stop,
    )

    if not (args.grace >= 0 and math.isfinite(args.grace)):
        _err(f"--grace must be a finite number of seconds >= 0; got {args.grace:g}")
        return EXIT_USAGE
    try:
        for cand in (Path(args.run).expanduser(), _runs_dir(args) / args.run):
            if cand.is_symlink():
                raise StopError(f"{cand} is a symlink: stop signals only through the run dir itself "
                                f"(give its real path, {shown_path(cand)}, if it is yours)")
        run_dir = resolve_run(args.run, _runs_dir(args))
        if args.survivors:
            refuse_foreign(run_dir)
            if live_attempt(run_dir):
                _err(f"{run_dir.name} is still running; --survivors is for what outlives an ended run. Stop it first.")
                return EXIT_FAILED
            killed = kill_survivors(run_dir)
            print(f"killed {len(killed)} surviving process(es) of {run_dir.name}"
                  + "".join(f"\n  pid {p['pid']} {p['name']}" for p in killed))  # not a snapshot read: kill_survivors'
            return EXIT_OK
        out = request_stop(run_dir, grace_s=args.grace, reason=args.reason, wait=not args.no_wait)
    except RunNotFound as e:
        _err(str(e))
        return EXIT_USAGE
    except StopInProgress as e:
        print(str(e))
        return EXIT_OK
    except StopError as e:
        _err(str(e))
        return EXIT_FAILED
    if out.already_ended:
        print(f"{run_dir.name} already ended: {describe_end(out.exit)}; "
              + ("its pending restart is cancelled" if out.restart_cancelled else "nothing to stop"))
        _warn_survivors(run_dir)
        return EXIT_OK
    if not out.waited:
        print(f"stop requested for {run_dir.name}; the supervisor sends SIGINT, then SIGTERM and SIGKILL "
              f"after {args.grace:g} s each. Follow with: stepwatch watch {run_dir} --plain")
        return EXIT_OK
    lines, failed = stop_lines(run_dir, out)
    print("\n".join(lines[:-1] if failed else lines))
    if failed:
        _err(lines[-1])
    return EXIT_FAILED if failed else EXIT_OK


def cmd_demo(args: argparse.Namespace) -> int:
    from stepwatch.launcher.demo import DemoUnavailable, demo_config, gpu_recording_env  # noqa: PLC0415

    script_args: list[str] = []
    for flag in ("steps", "crash_at", "hang_at", "fallback_at", "hidden", "layers", "seq_len", "save_every"):
        v = getattr(args, flag)
        if v is not None:
            script_args += [f"--{flag.replace('_', '-')}", str(v)]
    if args.compile:
        script_args.append("--compile")

    def make_cfg():
        cfg, where = demo_config(_runs_dir(args), script_args)
        print(where)
        gpu_env, gpu_line = gpu_recording_env(args.gpu_recording, headless=args.no_tui)
        print(gpu_line)
        cfg.env.update(gpu_env)  # in run.json: the supervisor's GPU sampler reads it there, a relaunch keeps it
        return cfg

    try:
        return _launch_and_follow(args, make_cfg, "launched demo:", follow_headless=True)
    except DemoUnavailable as e:
        _err(str(e))
        return EXIT_USAGE


def cmd_preflight(args: argparse.Namespace) -> int:
    from stepwatch.launcher.config import ConfigError, UntrustedConfig, load_config  # noqa: PLC0415
    from stepwatch.launcher.preflight import format_checklist, run_checklist  # noqa: PLC0415

    try:
        cfg = load_config(args.config, runs_dir_override=_runs_dir_flag(args))
    except (ConfigError, RunNotFound) as e:
        _err(str(e))
        return EXIT_FAILED if isinstance(e, UntrustedConfig) else EXIT_USAGE
    cl = run_checklist(cfg)
    if args.json:
        print(json.dumps(cl.to_json(), indent=2))
    else:
        print("\n".join(format_checklist(cl)))
    return EXIT_FAILED if cl.failed else EXIT_OK


def _warn_survivors(run_dir: Path) -> None:
    from stepwatch.launcher.stop import run_survivors  # noqa: PLC0415

    left = run_survivors(run_dir)
    if left:
        who = ", ".join(f"{p['pid']} ({p['name']})" for p in left[:10])  # not a snapshot read: run_survivors'
        _err(f"warning: {len(left)} process(es) of the ended run survive (recorded in its process tree) "
             f"(they may hold GPU memory): " + who + f"\n  kill them with: stepwatch stop {run_dir} --survivors")


def cmd_runs(args: argparse.Namespace) -> int:
    from stepwatch.monitors.snapshot.observer import process_snapshot  # noqa: PLC0415
    from stepwatch.monitors.snapshot.types import Ended  # noqa: PLC0415
    from stepwatch.tui.format import pid_or_job  # noqa: PLC0415

    runs_dir = _runs_dir(args)  # a runs dir that is a symlink loop: RunNotFound, said by main()
    runs = list_runs(runs_dir)
    if not runs:
        print(f"no runs under {runs_dir}")
        return EXIT_OK
    ended: Ended | None
    print(f"{'NAME':24} {'ATT':>3} {'STATE':9} {'PID':>8} {'STARTED':24} EXIT")
    for d in runs:
        s = process_snapshot(d)  # the columns need no events: a long run's events.jsonl is not read
        end = s["signal"] or ("" if s["returncode"] is None else f"code {s['returncode']}")
        if (ended := s["ended"]) is not None and ended["stop_requested"]:
            end = f"stopped ({end})" if end else "stopped"
        print(one_line(f"{one_line(s['run'])[:24]:24} {str(s['attempt'] or '-'):>3} {s['state']:9} {pid_or_job(s):>8} "
                       f"{_launched_at(d) or '-':24} {end}"))  # a run's row is one line, whatever its files hold
    return EXIT_OK


def _launched_at(run_dir: Path) -> str | None:
    from stepwatch.monitors.runfiles import RUN_JSON, read_json  # noqa: PLC0415

    at = (read_json(run_dir / RUN_JSON) or {}).get("launched_at")
    return at if isinstance(at, str) else None  # a value read from a file: a {} would break the column's format


def _pick_run(args: argparse.Namespace) -> Path:
    """RUN (a run dir or a name under --runs-dir), else the newest live run, else the newest;
    RunNotFound (main() says why: a usage error) when there is none."""
    return resolve_run(args.run, _runs_dir(args)) if args.run else _newest(args)


def cmd_status(args: argparse.Namespace) -> int:
    from stepwatch.monitors.snapshot.model import json_safe  # noqa: PLC0415
    from stepwatch.monitors.snapshot.observer import RunObserver  # noqa: PLC0415

    run_dir = _pick_run(args)
    snap = RunObserver(run_dir).refresh()
    if args.json:
        print(json.dumps(json_safe(snap), indent=2, default=str, allow_nan=False))
    else:
        from stepwatch.tui.plain import status_lines  # noqa: PLC0415

        print("\n".join(status_lines(snap)))
    return EXIT_OK


def _newest(args: argparse.Namespace) -> Path:
    """A bare ``attach``'s pick: the viewer's own runs first (a run dir and run.json of the viewer's
    user; on a shared runs dir another user's bait must not be "the newest"), a live one before an
    ended one; another user's run only when the viewer has none, and then it says whose."""
    runs = list_runs(_runs_dir(args))
    if not runs:
        raise RunNotFound(f"no runs under {_runs_dir(args)} yet: start one with `stepwatch launch -- python train.py` "
                          "(or try `stepwatch demo`); --runs-dir names another folder")
    mine = [d for d in runs if owned_by_viewer(d)]
    pool = mine or runs
    pick = next((d for d in pool if live_attempt(d)), pool[0])
    if not mine:
        _err(f"none of the runs under {_runs_dir(args)} is yours; attaching to {pick.name}, "
             f"owned by uid {pick.stat().st_uid} (views only read: nothing of it is run)")
    return pick


def cmd_watch(args: argparse.Namespace) -> int:
    run_dir = resolve_run(args.run, _runs_dir(args))  # RunNotFound: said by main(), exit 2
    from stepwatch.tui.plain import watch  # noqa: PLC0415

    return watch(run_dir, as_json=args.json, every_n_steps=args.every)


def cmd_export(args: argparse.Namespace) -> int:
    from stepwatch.monitors.export.textfile import export  # noqa: PLC0415

    run_dir = _pick_run(args)
    export(run_dir, Path(args.textfile) if args.textfile else None, args.every, sys.stdout.write)
    return EXIT_OK


def cmd_attach(args: argparse.Namespace) -> int:
    run_dir = _pick_run(args)
    return _open_tui(run_dir, args)


def cmd_home(args: argparse.Namespace) -> int:
    try:
        from stepwatch.tui.app import run_app  # noqa: PLC0415
    except ImportError as e:
        _err(f"the TUI is not available ({e}); try: stepwatch runs")
        return EXIT_FAILED
    return run_app(run_dir=None, runs_dir=_runs_dir(args), low_bandwidth=args.low_bandwidth)


def build_parser() -> argparse.ArgumentParser:
    """The argparse tree of every stepwatch command (README.md, "Command line")."""
    p = argparse.ArgumentParser(prog="stepwatch", description="Launch long training runs and watch them honestly.")
    p.add_argument("--runs-dir", help="where runs live (default ./runs, or $STEPWATCH_RUNS_DIR)")
    p.add_argument("--low-bandwidth", action="store_true", help="TUI: slow-link mode")
    p.set_defaults(func=cmd_home)
    sub = p.add_subparsers(dest="cmd")

    def common(sp: argparse.ArgumentParser) -> None:
        sp.add_argument("--runs-dir", default=argparse.SUPPRESS, help="where runs live (default ./runs)")

    sp = sub.add_parser("launch", help="preflight, then start a run (CONFIG.toml or -- CMD ARGS...)")
    common(sp)
    sp.add_argument("config", nargs="?", help="run config (TOML)")
    sp.add_argument("--name", help="run name (flags form; default: the script's name)")
    sp.add_argument("--cwd", help="working directory of the run (flags form; default .)")
    sp.add_argument("--env", action="append", metavar="KEY=VALUE", help="extra environment variable (repeatable)")
    sp.add_argument("--allow-dirty", metavar="REASON", help="launch from a dirty tree; REASON is recorded")
    sp.add_argument("--override", metavar="REASON", help="launch although checklist items failed; REASON is recorded")
    sp.add_argument("--no-tui", action="store_true", help="start and return; do not open the TUI")
    sp.add_argument("--low-bandwidth", action="store_true", default=argparse.SUPPRESS, help=argparse.SUPPRESS)
    sp.set_defaults(func=cmd_launch)

    sp = sub.add_parser("relaunch", help="rotate the logs and start the same config again")
    common(sp)
    sp.add_argument("run", help="run directory or name under --runs-dir")
    sp.add_argument("--allow-dirty", metavar="REASON")
    sp.add_argument("--override", metavar="REASON")
    sp.add_argument("--from-checkpoint", action="store_true",
                    help="resume from this run's newest complete checkpoint ([restart] resume says how)")
    sp.add_argument("--checkpoint", metavar="PATH", help="resume from this complete checkpoint, another run's too "
                    "(recorded as the operator's choice)")
    sp.add_argument("--no-tui", action="store_true")
    sp.add_argument("--low-bandwidth", action="store_true", default=argparse.SUPPRESS, help=argparse.SUPPRESS)
    sp.set_defaults(func=cmd_relaunch)

    sp = sub.add_parser("stop", help="stop a run: SIGINT, then SIGTERM, then SIGKILL (by the supervisor)")
    common(sp)
    sp.add_argument("run")
    sp.add_argument("--grace", type=float, default=30.0, metavar="SECONDS", help="seconds between signals (default 30)")
    sp.add_argument("--reason", help="recorded in stop.json")
    sp.add_argument("--no-wait", action="store_true", help="return once the request is delivered")
    sp.add_argument("--survivors", action="store_true",
                    help="after the run ended: SIGKILL what survives in its process group/session")
    sp.set_defaults(func=cmd_stop)

    sp = sub.add_parser("demo", help="a bundled tiny real training run (transformers Trainer, CPU), launched and watched")
    common(sp)
    sp.add_argument("--no-tui", action="store_true", help="watch headless (watch --plain); exit code = the run's outcome")
    sp.add_argument("--steps", type=int, help="optimizer steps (default 150, about a minute)")
    sp.add_argument("--crash-at", type=int, metavar="STEP", help="the script raises at that step (watchdog alert)")
    sp.add_argument("--hang-at", type=int, metavar="STEP", help="the script stops progressing at that step (stall)")
    sp.add_argument("--fallback-at", type=int, metavar="STEP",
                    help="SIMULATED eager fallback: ~20x the work per step from that step (fallback alert)")
    sp.add_argument("--compile", action="store_true",
                    help="torch.compile(dynamic=False) with a lowered recompile limit: the real recompile-limit warning")
    sp.add_argument("--gpu-recording", default="auto", metavar="auto|none|FILE",
                    help="GPU panel source: auto replays a labelled synthetic recording when NVML is unavailable")
    sp.add_argument("--hidden", type=int, metavar="N", help="the tiny model's hidden size (smaller: faster steps)")
    sp.add_argument("--layers", type=int, metavar="N", help="the tiny model's layer count")
    sp.add_argument("--seq-len", type=int, metavar="N", help="tokens per sequence")
    sp.add_argument("--save-every", type=int, metavar="STEPS", help="a checkpoint save every STEPS steps")
    sp.add_argument("--low-bandwidth", action="store_true", default=argparse.SUPPRESS, help="TUI: slow-link mode")
    sp.set_defaults(func=cmd_demo)

    sp = sub.add_parser("preflight", help="the pre-launch checklist alone (exit 1 when an item fails)")
    common(sp)
    sp.add_argument("config")
    sp.add_argument("--json", action="store_true")
    sp.set_defaults(func=cmd_preflight)

    sp = sub.add_parser("alerts", help="alerts test RUN|CONFIG: send a test page to every channel, print each outcome")
    common(sp)
    sp.add_argument("action", choices=["test"])
    sp.add_argument("target", help="a run (name or dir) or a run config (.toml)")
    sp.set_defaults(func=lambda a: import_module("stepwatch.launcher.alertcheck").alerts_test(a.target, _runs_dir_flag(a)))

    sp = sub.add_parser("runs", help="one line per run under the runs dir")
    common(sp)
    sp.set_defaults(func=cmd_runs)

    sp = sub.add_parser("status", help="one snapshot of a run, from its files")
    common(sp)
    sp.add_argument("run", nargs="?")
    sp.add_argument("--json", action="store_true")
    sp.set_defaults(func=cmd_status)

    sp = sub.add_parser("watch", help="headless: one line per event/alert; exit code = the run's outcome")
    common(sp)
    sp.add_argument("run")
    sp.add_argument("--plain", action="store_true", help="plain lines (the default)")
    sp.add_argument("--json", action="store_true", help="one JSON object per line instead")
    sp.add_argument("--every", type=int, default=10, metavar="N", help="print the summary every N steps")
    sp.set_defaults(func=cmd_watch)

    sp = sub.add_parser("export", help="the run's metrics in Prometheus' text format (stdout, or --textfile)")
    common(sp)
    sp.add_argument("run", nargs="?")
    sp.add_argument("--textfile", metavar="PATH", help="write PATH for node-exporter's textfile collector (atomically)")
    sp.add_argument("--every", type=float, default=0, metavar="S", help="again every S seconds (default: once)")
    sp.set_defaults(func=cmd_export)

    sp = sub.add_parser("attach", help="open the TUI on an existing run (default: the newest live one)")
    common(sp)
    sp.add_argument("run", nargs="?")
    sp.add_argument("--low-bandwidth", action="store_true", default=argparse.SUPPRESS, help=argparse.SUPPRESS)
    sp.set_defaults(func=cmd_attach)
    return p


def main(argv: list[str] | None = None) -> int:
    """Console-script entry point. Returns the exit code."""
    parser = build_parser()
    argv = list(sys.argv[1:] if argv is None else argv)
    command: list[str] = []
    if "--" in argv:  # `stepwatch launch [flags] -- CMD ARGS...`: everything after -- is the run's argv
        i = argv.index("--")
        argv, command = argv[:i], argv[i + 1:]
    args = parser.parse_args(argv)
    if command and args.cmd != "launch":
        parser.error("`-- CMD ARGS...` is only for `stepwatch launch`")
    args.command = command
    # What the headless commands print may quote a run's files: control bytes made visible (the
    # TUI draws through the original stream, sys.__stderr__, never through these)
    if not isinstance(sys.stdout, SafeWriter):
        sys.stdout, sys.stderr = SafeWriter(sys.stdout), SafeWriter(sys.stderr)
    try:
        return args.func(args)
    except RunNotFound as e:  # no such RUN, a runs dir that is a symlink loop or to nothing
        _err(str(e))
        return EXIT_USAGE
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
