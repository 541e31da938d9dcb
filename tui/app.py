"""The Textual app: home (runs), the run screen, and the launch / relaunch / stop actions.

The app holds no state the files do not: every panel is rebuilt from the run dir. Quitting never
touches the run. Blocking work (file reads, git, the checklist, launching) runs in worker threads.
"""

from __future__ import annotations

import asyncio
import os
import shlex
import signal
import sys
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from textual import work
from textual.binding import Binding

from stepwatch.monitors.runfiles import SECRET_MODE, STATE_DIR_MODE, write_bytes_atomic
from stepwatch.monitors.states import RUNNING
from stepwatch.tui.appbase import StepwatchAppBase
from stepwatch.tui.messages import ActionDone
from stepwatch.tui.safe import visible
from stepwatch.tui.screens.home import HomeScreen
from stepwatch.tui.screens.modals import Choose, Confirm, Help, PreflightScreen, Prompt
from stepwatch.tui.screens.run import RunScreen

if TYPE_CHECKING:
    from stepwatch.monitors.snapshot.types import RestartView


def _tolerate_non_utf8_input() -> None:
    """Make Textual's Linux input thread decode stdin with ``errors="replace"``.

    A terminal rebuilt under the app (tmux reattach, SSH reconnect) can send legacy X10 mouse
    sequences whose coordinate bytes are above 0x7F. Textual 8.2.8 decodes stdin as strict UTF-8 and
    its input thread dies with UnicodeDecodeError, taking the app down (Textualize/textual#6668).
    Replacing the undecodable byte keeps the app alive; the sequence becomes a harmless key/mouse
    event. Patched at the one module global the driver looks the decoder up by.
    """
    import codecs
    import functools

    import textual.drivers.linux_driver as linux_driver

    setattr(linux_driver, "getincrementaldecoder", lambda encoding: functools.partial(  # noqa: B010 (not exported)
        codecs.getincrementaldecoder(encoding), errors="replace"))


DEBOUNCE_S = 1.0  # a key pressed twice within this acts once
STATE_FILE = Path(os.environ.get("XDG_STATE_HOME") or Path.home() / ".local" / "state") / "stepwatch" / "last_config"


class StepwatchApp(StepwatchAppBase):
    """stepwatch's TUI. ``run_dir`` None opens the home screen on ``runs_dir``."""

    CSS_PATH = "styles.tcss"
    TITLE = "stepwatch"
    ENABLE_COMMAND_PALETTE = False  # every action has a key; a stray click must not open a text box
    BINDINGS = [
        Binding("q", "quit_app", "quit"),  # the run keeps going: said in ? and the README
        Binding("l", "launch", "launch"),
        Binding("question_mark", "help", "help"),
    ]

    def action_help_quit(self) -> None:
        """Ctrl-C (Textual's reflex catcher): how to quit, in this app's own keys, as plain text."""
        self.notify("q quits stepwatch (the run keeps going; ctrl+q too)", title="Quit?")

    def notify(self, message: str, *, title: str = "", **kw: Any) -> None:
        """Every toast is plain text: a message may quote a run's log (markup off, controls visible)."""
        kw["markup"] = False
        super().notify(visible(message, newlines=True), title=visible(title), **kw)

    def __init__(self, run_dir: Path | None, runs_dir: Path, low_bandwidth: bool = False):
        super().__init__()
        self.start_run_dir = Path(run_dir) if run_dir else None
        self.runs_dir = Path(runs_dir)
        self.low_bandwidth = low_bandwidth
        self._last_action: dict[str, float] = {}
        self._busy = False
        self.exit_message = ""

    # --- lifecycle ---------------------------------------------------------------------------
    def on_mount(self) -> None:
        if self.start_run_dir is not None:
            self.push_screen(RunScreen(self.start_run_dir))
        else:
            self.push_screen(HomeScreen(self.runs_dir))
        self.set_interval(2.0, self._check_terminal)
        if self.is_headless:
            return  # a test's app: pytest's own signals stay pytest's
        # SIGHUP (the SSH link dropped), SIGTERM, SIGINT: leave cleanly, the terminal restored. A
        # plain signal handler, not the loop's: when the terminal is gone or stops reading, Textual's
        # writes block the loop itself (its output queue fills), so the handler also arms a timer
        # that ends the process if the orderly exit has not within HANGUP_GRACE_S
        loop = asyncio.get_running_loop()
        for sig, why in ((signal.SIGHUP, "terminal hung up"), (signal.SIGTERM, "terminated (SIGTERM)"),
                         (signal.SIGINT, "interrupted (SIGINT)")):
            def handler(signum, frame, why=why) -> None:
                self._leave(f"stepwatch: {why}; the run is untouched", loop)
            try:
                signal.signal(sig, handler)
            except (ValueError, OSError):
                pass  # not the main thread, or no such signal here

    def _leave(self, message: str, loop: asyncio.AbstractEventLoop | None = None) -> None:
        """Exit with ``message``; end the process anyway after HANGUP_GRACE_S (a dead terminal can
        hold Textual's shutdown forever)."""
        leave_later(HANGUP_GRACE_S, message)
        if loop is None:
            self.exit(message=message)
        else:
            loop.call_soon_threadsafe(lambda: self.exit(message=message))

    def _check_terminal(self) -> None:
        """Exit on our own when the terminal went away (SSH dropped) instead of polling as an orphan."""
        if self.is_headless:
            return
        try:
            stdin = sys.__stdin__
            gone = not os.isatty(stdin.fileno()) or os.getppid() == 1  # pyright: ignore[reportOptionalMemberAccess]
        except (ValueError, OSError):
            gone = True
        if gone:
            self._leave("terminal gone; the run is untouched")

    def _debounced(self, action: str) -> bool:
        now = time.monotonic()
        if self._busy or now - self._last_action.get(action, -1e9) < DEBOUNCE_S:
            return True
        self._last_action[action] = now
        return False

    @property
    def run_screen(self) -> RunScreen | None:
        return self.screen if isinstance(self.screen, RunScreen) else None

    def attach(self, run_dir: Path) -> None:
        """Open the run screen on ``run_dir`` (from home)."""
        self.push_screen(RunScreen(run_dir))

    # --- actions -----------------------------------------------------------------------------
    def action_home(self) -> None:
        if isinstance(self.screen, RunScreen):
            if len(self.screen_stack) > 2:
                self.pop_screen()
            else:
                self.switch_screen(HomeScreen(self.runs_dir))

    def action_help(self) -> None:
        self.push_screen(Help())

    def action_quit_app(self) -> None:
        rs = self.run_screen
        if rs is not None and rs.snap["state"] == RUNNING:
            self.exit_message = (f"stepwatch: left {rs.snap['run']} running (pid {rs.snap['pid']}); "
                                 f"reattach with: stepwatch attach {rs.run_dir}")
        else:
            self.exit_message = "stepwatch: closed; quitting the app never stops a run"
        self.exit(message=self.exit_message)  # Textual prints it once the terminal is restored

    def action_launch(self) -> None:
        if self._debounced("launch"):
            return
        last = STATE_FILE.read_text().strip() if STATE_FILE.exists() else ""
        self.push_screen(Prompt("Launch from which run config (TOML)?", last), self._launch_path_given)

    def _launch_path_given(self, path: str | None) -> None:
        if not path:
            return
        from stepwatch.launcher.config import ConfigError, load_config  # noqa: PLC0415

        try:
            cfg = load_config(path)
        except ConfigError as e:
            self.notify(str(e), severity="error", timeout=15)
            return
        try:
            STATE_FILE.parent.mkdir(mode=STATE_DIR_MODE, parents=True, exist_ok=True)
            write_bytes_atomic(STATE_FILE, (str(Path(path).resolve()) + "\n").encode(), mode=SECRET_MODE)
        except OSError:
            pass
        self.push_screen(PreflightScreen(cfg, f"Launch {cfg.name} into {cfg.run_dir}"),
                         lambda res: self._do_launch(cfg, res, "launch"))

    def action_relaunch(self) -> None:
        rs = self.run_screen
        if rs is None or self._debounced("relaunch"):
            return
        if rs.snap["state"] == RUNNING:
            self.notify(f"{rs.run_dir.name} is still running: stop it first (x)", severity="warning")
            return
        question = (f"Relaunch {rs.run_dir.name}? The logs of attempt {rs.snap['attempt']} are rotated (kept under "
                    "stamped names) and a new attempt starts.")
        cp = self._checkpoint_offer(rs.run_dir)
        if cp is None:
            self.push_screen(Confirm(question), lambda yes: self._relaunch_confirmed(rs.run_dir) if yes else None)
            return
        self.push_screen(Choose(f"{question}\nFrom where? The newest complete checkpoint is {cp.path} (step {cp.step}).",
                                [("s", "from scratch"), ("c", f"from {cp.path.name}")]),
                         lambda key: self._relaunch_confirmed(rs.run_dir, cp if key == "c" else None) if key else None)

    @staticmethod
    def _checkpoint_offer(run_dir: Path) -> Any:
        """The newest complete checkpoint ``r`` offers to resume from (the config's ``[restart] resume`` says how), or
        None (none, no rule, or a config that cannot be read: the relaunch then says why)."""
        from stepwatch.launcher.config import ConfigError  # noqa: PLC0415
        from stepwatch.launcher.launch import LaunchRefused  # noqa: PLC0415
        from stepwatch.launcher.relaunch import newest_checkpoint_for, relaunch_config  # noqa: PLC0415

        try:
            return newest_checkpoint_for(relaunch_config(run_dir)[0])
        except (ConfigError, LaunchRefused, OSError):
            return None

    def _relaunch_confirmed(self, run_dir: Path, checkpoint: Any = None) -> None:
        from stepwatch.launcher.config import ConfigError  # noqa: PLC0415
        from stepwatch.launcher.launch import LaunchRefused  # noqa: PLC0415
        from stepwatch.launcher.relaunch import relaunch_config, resume_by_hand  # noqa: PLC0415

        try:
            cfg, changes = relaunch_config(run_dir)
            if checkpoint is not None:  # its whole path judged now (and again at exec): an unsafe one is said here
                resume_by_hand(cfg, run_dir, checkpoint)
        except (ConfigError, LaunchRefused) as e:
            self.notify(str(e), severity="error", timeout=15)
            return
        title = (f"Relaunch {cfg.name}" + (f" from {checkpoint.path} (step {checkpoint.step})" if checkpoint else "")
                 + ": " + ("; ".join(changes) if changes else "config unchanged")
                 + f"\ncommand: {shlex.join(cfg.command)}  (cwd {cfg.cwd})")
        self.push_screen(PreflightScreen(cfg, title), lambda res: self._do_launch(cfg, res, "relaunch"))

    def _do_launch(self, cfg: Any, res: dict | None, action: str) -> None:
        if res is None:
            return
        self._busy = True
        self._launch_worker(cfg, res, action)

    @work(thread=True, exclusive=True, exit_on_error=False, group="action")
    def _launch_worker(self, cfg: Any, res: dict, action: str) -> None:
        from stepwatch.launcher.config import ConfigError  # noqa: PLC0415
        from stepwatch.launcher.launch import LaunchRefused, launch  # noqa: PLC0415

        cl = res["checklist"]
        reason = res["reason"]  # not a snapshot read: the preflight screen's answer
        allow_dirty = reason if "clean_tree" in cl.failed else None
        override = reason if [f for f in cl.failed if f != "clean_tree"] else None
        try:
            out = launch(cfg, allow_dirty=allow_dirty, override=override, checklist=cl)
        except (ConfigError, LaunchRefused, OSError) as e:
            self.post_message(ActionDone(action, False, str(e)))
            return
        self.post_message(ActionDone(action, True, f"{action}ed {cfg.name} attempt {out.attempt}, pid {out.pid}",
                                     str(out.run_dir)))

    def action_stop_run(self) -> None:
        rs = self.run_screen
        if rs is None or self._debounced("stop"):
            return
        from stepwatch.launcher.stop import restart_pending  # noqa: PLC0415

        def stop_if(yes: bool | None) -> None:
            if yes:
                self._stop_worker(rs.run_dir)

        if rs.snap["state"] != RUNNING:
            if not restart_pending(rs.run_dir):  # [restart] enforce, in its back-off: x calls the restart off
                self.notify(f"{rs.run_dir.name} is not running", severity="warning")
                return
            restart: RestartView | None = rs.snap["restart"]
            words = (restart["words"] if restart is not None else None) or "the restart policy's"
            self.push_screen(Confirm(f"Cancel the pending restart of {rs.run_dir.name}? ({words})"), stop_if)
            return
        self.push_screen(Confirm(f"Stop {rs.run_dir.name} (pid {rs.snap['pid']})? SIGINT now, SIGTERM and "
                                 "SIGKILL after 30 s each, carried out by the supervisor."), stop_if)

    @work(thread=True, exclusive=True, exit_on_error=False, group="action")
    def _stop_worker(self, run_dir: Path) -> None:
        from stepwatch.launcher.stop import StopError, request_stop  # noqa: PLC0415

        try:
            out = request_stop(run_dir, grace_s=30.0, reason="stopped from the TUI", wait=False)
        except StopError as e:
            self.post_message(ActionDone("stop", False, str(e)))
            return
        if out.already_ended:
            self.post_message(ActionDone("stop", True, f"{run_dir.name} had already ended; " + (
                "its pending restart is cancelled" if out.restart_cancelled else "nothing to stop")))
            return
        self.post_message(ActionDone("stop", True, "stop requested: the supervisor sends SIGINT, then SIGTERM and "
                                                   "SIGKILL after 30 s each"))

    def on_action_done(self, msg: ActionDone) -> None:
        self._busy = False
        self.notify(msg.text, severity="information" if msg.ok else "error", timeout=10 if msg.ok else 20)
        if msg.ok and msg.run_dir:
            rs = self.run_screen
            if rs is not None and rs.run_dir == Path(msg.run_dir):
                rs.poll_soon()
            else:
                self.push_screen(RunScreen(Path(msg.run_dir)))


def run_app(run_dir: Path | None, runs_dir: Path, low_bandwidth: bool = False) -> int:
    """Run the TUI until the operator quits; returns the CLI exit code (0). The run is never touched.

    SIGHUP (the SSH link dropped), SIGTERM and SIGINT end the app cleanly; Textual restores the
    terminal's modes on every exit path, a crash included; the process then ends at once
    (:func:`leave_now`), whatever a worker thread is still reading. ``NO_COLOR`` is honoured by Rich/Textual themselves.
    """
    _tolerate_non_utf8_input()
    _size_from_the_terminal()
    app = StepwatchApp(run_dir, runs_dir, low_bandwidth)
    # our own loop, never closed: asyncio.run() would join the default executor's threads (a
    # refresh worker inside a long cold read) before returning
    app.run(loop=asyncio.new_event_loop())
    leave_now(0)
    return 0  # pragma: no cover - leave_now does not return


def _size_from_the_terminal() -> None:
    """Drop ``COLUMNS`` / ``LINES`` from the environment when the terminal reports its own size:
    Textual sizes the screen with shutil.get_terminal_size(), which prefers those variables, so an
    exported ``COLUMNS=80`` drew a 160x45 tmux pane at 80x24 and every resize kept the stale size."""
    try:
        os.get_terminal_size(sys.__stdout__.fileno())  # pyright: ignore[reportOptionalMemberAccess]
    except (OSError, ValueError, AttributeError):
        return  # no terminal to ask: the variables are all there is
    for var in ("COLUMNS", "LINES"):
        os.environ.pop(var, None)


#: Seconds an orderly exit may take once the terminal hung up (or a signal asked), before the
#: process ends anyway: Textual's shutdown writes to the terminal, which may be gone.
HANGUP_GRACE_S = 2.0


def leave_later(grace_s: float, message: str) -> None:
    """In ``grace_s`` seconds, end the process (exit code 0: the operator's terminal went, the app
    did nothing wrong) with ``message`` on stderr if it can still be written; a daemon timer."""
    def hard_exit() -> None:
        try:  # never blocking: a terminal that stopped reading would hold this write, and the exit
            os.set_blocking(2, False)
            os.write(2, (visible(message) + "\n").encode("utf-8", "replace"))
        except OSError:
            pass  # the terminal is gone or full: nobody to tell
        os._exit(0)

    t = threading.Timer(grace_s, hard_exit)
    t.daemon = True
    t.start()


def leave_now(code: int) -> None:
    """End the process at once, the terminal already restored and the exit message printed: a
    worker thread still reading a big run (Python would join it at exit, for as long as the read
    takes) must not keep a quit or hung-up app alive, burning a core."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass  # the terminal is gone
    os._exit(code)
