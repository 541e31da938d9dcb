"""The TUI in a pseudo-terminal: bytes per second to the terminal, CPU share, time to first frame.

    python bench/tui_pty.py [--quick] [--json FILE] [--no-baseline-app]

The harness is the one the Textual floors were measured with (2-core development VM, 2026-11-30): a pty of 80x24, the app's
stdin/stdout/stderr on the slave, ``setsid`` + ``TIOCSCTTY``, the environment exactly PATH, HOME,
``LANG=C.UTF-8``, ``TERM=xterm-256color`` (COLORTERM unset: 256 colours); the parent reads the master
continuously. Nothing answers the terminal's queries (so frames carry no synchronized-update wrapper).

Against the steady fake run (bench/steady_run.py: 10 step events/s, 100 log lines/s) it runs
``python -m stepwatch.tui.cli attach RUN`` and then ``... attach RUN --low-bandwidth``; for each, after a
``--warmup`` from ``Popen()`` it counts the bytes read in a ``--window`` (and bins them per second,
a gap over 4 ms between reads starting a new frame), and samples the app's CPU time (user + system,
psutil, children included) at both ends. First frame: from just before ``Popen()`` to the first
read whose bytes (with the previous read's tail) contain the run's name, over both sessions and
``--launches`` extra short ones; its baseline is ``python -c "import textual"`` (wall time, the same
number of times). Unless ``--no-baseline-app``, the minimal Textual screen those floors were measured
on (``MINIMAL_APP``, ``logbatch`` case, Log scrollbars off: header, numbers, two 60-point sparklines, a log
batched at 1 Hz; measured 5.9 KB/s there) runs in the same harness as the bytes baseline.
"""

from __future__ import annotations

import argparse
import fcntl
import os
import select
import signal
import statistics
import struct
import subprocess
import sys
import tempfile
import termios
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import ROOT, new_result, spread, write_json  # noqa: E402

ROWS, COLS = 24, 80
TARGETS = {"tui_cpu_share": 0.05, "tui_bytes_per_s": 8000, "tui_bytes_per_s_low": 1000, "tui_first_frame_s": 1.0}
FRAME_GAP_S = 0.004

# The floors' minimal Textual app (2026-11-30), verbatim in behaviour ("logbatch" case; LOG_CSS from the environment)
MINIMAL_APP = r'''
import random, sys, time, os
from textual.app import App, ComposeResult
from textual.widgets import Log, Sparkline, Static

CASE = sys.argv[1] if len(sys.argv) > 1 else "full"
HAS_SPARK = CASE in ("full", "nolog", "logbatch")
HAS_LOG = CASE in ("full", "logbatch")
HEADER_MARK = "TRAINMON"
LOG_CSS = os.environ.get("LOG_CSS", "")

class Monitor(App):
    CSS = """
    Screen { layout: vertical; }
    #hdr { height: 1; background: $primary; color: $text; }
    #nums { height: 1; }
    Sparkline { width: 60; height: 1; margin: 0 0 1 0; }
    Log { height: 1fr; }
    """ + (f"Log {{ {LOG_CSS} }}" if LOG_CSS else "")

    def compose(self) -> ComposeResult:
        self.rng = random.Random(1234); self.t_start = time.monotonic()
        self.step = 10_000; self.seq = 0
        yield Static(self._hdr_text(), id="hdr")
        yield Static(self._nums_text(), id="nums")
        if HAS_SPARK:
            self.d1 = [self.rng.uniform(1.0, 3.0) for _ in range(60)]
            self.d2 = [self.rng.uniform(50.0, 200.0) for _ in range(60)]
            self.sp1 = Sparkline(list(self.d1), id="sp1"); self.sp2 = Sparkline(list(self.d2), id="sp2")
            yield self.sp1; yield self.sp2
        if HAS_LOG:
            self.log_w = Log(max_lines=1000, id="log"); yield self.log_w

    def on_mount(self) -> None:
        if HAS_LOG:
            self.log_w.write_lines([self._log_line() for _ in range(100)])
            if CASE == "logbatch": self.set_interval(1.0, self._tick_log_batch)
            else: self.set_interval(0.1, self._tick_log)
        self.set_interval(1.0, self._tick)

    def _hdr_text(self):
        el = int(time.monotonic() - self.t_start); h, r = divmod(el, 3600); m, s = divmod(r, 60)
        return f"{HEADER_MARK} run=demo-0042  elapsed {h:02d}:{m:02d}:{s:02d}"

    def _nums_text(self):
        r = self.rng
        return (f"step {self.step:>7d}  p50 {r.uniform(10, 20):6.2f}ms  p99 {r.uniform(40, 90):6.2f}ms  "
                f"loss {r.uniform(1, 3):.4f}  lr {3e-4:.1e}  tok/s {r.randint(90000, 130000)}")

    def _log_line(self):
        self.seq += 1
        return f"step {self.step + self.seq:>7d} loss={self.rng.uniform(1, 3):.4f} gn={self.rng.uniform(0.1, 2):.3f}"

    def _tick(self):
        self.step += 10
        self.query_one("#hdr", Static).update(self._hdr_text())
        self.query_one("#nums", Static).update(self._nums_text())
        if HAS_SPARK:
            self.d1 = self.d1[1:] + [self.rng.uniform(1.0, 3.0)]
            self.d2 = self.d2[1:] + [self.rng.uniform(50.0, 200.0)]
            self.sp1.data = list(self.d1); self.sp2.data = list(self.d2)

    def _tick_log(self): self.log_w.write_line(self._log_line())
    def _tick_log_batch(self): self.log_w.write_lines([self._log_line() for _ in range(10)])

if __name__ == "__main__":
    Monitor().run()
'''


def pty_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": os.environ.get("HOME", "/tmp"),
           "LANG": "C.UTF-8", "TERM": "xterm-256color"}
    env.update(extra or {})
    return env


def _cpu_tree(p) -> float | None:
    """user+system seconds of ``p`` and its live children."""
    try:
        t = p.cpu_times()
        total = t.user + t.system
        for c in p.children(recursive=True):
            try:
                ct = c.cpu_times()
                total += ct.user + ct.system
            except Exception:
                pass
        return total
    except Exception:
        return None


def pty_session(argv: list[str], mark: bytes, warmup_s: float, window_s: float, env: dict[str, str],
                cwd: str | None = None) -> dict:
    """Run ``argv`` on a fresh 80x24 pty; return bytes/CPU over the window and the start-up times."""
    import psutil

    master, slave = os.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", ROWS, COLS, 0, 0))

    def child_setup() -> None:
        os.setsid()
        fcntl.ioctl(0, termios.TIOCSCTTY, 0)

    t0 = time.monotonic()
    proc = subprocess.Popen(argv, stdin=slave, stdout=slave, stderr=slave, env=env, cwd=cwd or str(ROOT),
                            preexec_fn=child_setup, close_fds=True)
    os.close(slave)
    ps = psutil.Process(proc.pid)
    t_first = t_mark = None
    tail = b""
    w_start, w_end = t0 + warmup_s, t0 + warmup_s + window_s
    win_bytes = 0
    bins = [0] * max(1, int(round(window_s)))
    frames = 0
    last_read_t = None
    cpu0 = cpu1 = None
    total = 0
    exited = None
    out_tail = b""
    try:
        while True:
            now = time.monotonic()
            if cpu0 is None and now >= w_start:
                cpu0, w_start = _cpu_tree(ps), now
            if now >= w_end:
                cpu1, w_end = _cpu_tree(ps), now
                break
            timeout = min(0.5, (w_start if cpu0 is None else w_end) - now)
            r, _, _ = select.select([master], [], [], max(0.0, timeout))
            if not r:
                if proc.poll() is not None and exited is None:
                    exited = proc.returncode
                continue
            try:
                data = os.read(master, 65536)
            except OSError:  # EIO: the slave side closed (the app exited)
                data = b""
            t = time.monotonic()
            if not data:
                exited = proc.poll() if proc.poll() is not None else "eof"
                break
            total += len(data)
            out_tail = (out_tail + data)[-4096:]
            if t_first is None:
                t_first = t - t0
            if t_mark is None and mark in tail + data:
                t_mark = t - t0
            tail = data[-len(mark):]
            if cpu0 is not None and t < w_end:
                win_bytes += len(data)
                i = int(t - w_start)
                if 0 <= i < len(bins):
                    bins[i] += len(data)
                if last_read_t is None or t - last_read_t > FRAME_GAP_S:
                    frames += 1
                last_read_t = t
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            pass
        os.close(master)
    wall = (w_end - w_start) if cpu0 is not None else None
    res = {
        "argv": argv[1:], "first_byte_s": t_first, "first_frame_s": t_mark, "bytes_total": total,
        "window_s": wall, "window_bytes": win_bytes,
        "bytes_per_s": (win_bytes / wall) if wall and cpu1 is not None else None,
        "per_second_bytes": spread(bins) if cpu1 is not None else None,
        "frames_per_s": (frames / wall) if wall and cpu1 is not None else None,
        "cpu_share": ((cpu1 - cpu0) / wall) if wall and cpu0 is not None and cpu1 is not None else None,
        "exited_early": exited,
    }
    if exited is not None or t_mark is None:
        import re

        text = re.sub(rb"\x1b\[[0-9;?<>=$]*[A-Za-z~]|\x1b[()][A-Z0-9]|\x1b[=>]", b"", out_tail)
        res["output_tail"] = text.decode("utf-8", "replace")[-600:]
    return res


def time_import_textual(n: int) -> list[float]:
    out = []
    for _ in range(n):
        t0 = time.monotonic()
        subprocess.run([sys.executable, "-c", "import textual"], env=pty_env(), stdin=subprocess.DEVNULL,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False, timeout=60)
        out.append(time.monotonic() - t0)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="short windows (8 s / 10 s) and 2 extra launches")
    ap.add_argument("--warmup", type=float, help="seconds from Popen() to the window (default 4, full 5)")
    ap.add_argument("--window", type=float, help="window seconds (default 8 quick / 60 full; low: a multiple of 5)")
    ap.add_argument("--launches", type=int, help="extra short launches for the first frame (default 2 / 8)")
    ap.add_argument("--no-baseline-app", action="store_true", help="skip the minimal Textual app (the bytes baseline)")
    ap.add_argument("--baseline-app", action="store_true", help="run the minimal Textual app even with --quick")
    ap.add_argument("--json", metavar="FILE")
    a = ap.parse_args(argv)
    warm = a.warmup or (4.0 if a.quick else 5.0)
    window = a.window or (8.0 if a.quick else 60.0)
    window_low = max(5.0, 5.0 * round(window / 5.0)) if a.window else (10.0 if a.quick else 60.0)
    launches = a.launches if a.launches is not None else (2 if a.quick else 8)
    do_baseline_app = a.baseline_app or (not a.quick and not a.no_baseline_app)
    res = new_result("tui_pty", a.quick)
    F, N, B, D = res["figures"], res["notes"], res["baselines"], res["details"]
    for k in TARGETS:
        F[k] = None
    firsts: list[float] = []
    env = pty_env()
    cli = [sys.executable, "-m", "stepwatch.tui.cli"]
    try:
        from steady_run import RUN_NAME, steady_run

        mark = RUN_NAME.encode()
        with steady_run(max_s=warm * (3 + launches) + window + window_low + 180) as run_dir:
            for key, extra, win in (("normal", [], window), ("low", ["--low-bandwidth"], window_low)):
                try:
                    r = pty_session(cli + ["attach", str(run_dir)] + extra, mark, warm, win, env)
                except Exception as e:
                    D[key] = {"error": repr(e)}
                    continue
                D[key] = r
                if r["first_frame_s"] is not None:
                    firsts.append(r["first_frame_s"])
                if r["exited_early"] is not None:
                    N["tui_bytes_per_s" if key == "normal" else "tui_bytes_per_s_low"] = (
                        f"the app exited early ({r['exited_early']}): {r.get('output_tail', '')[-300:]!r}")
            for _ in range(launches):
                r = pty_session(cli + ["attach", str(run_dir)], mark, 1.5, 0.5, env)
                D.setdefault("extra_launches", []).append({k: r[k] for k in ("first_byte_s", "first_frame_s")})
                if r["first_frame_s"] is not None:
                    firsts.append(r["first_frame_s"])
        n = D.get("normal") or {}
        lo = D.get("low") or {}
        F["tui_cpu_share"] = n.get("cpu_share")
        F["tui_bytes_per_s"] = n.get("bytes_per_s")
        F["tui_bytes_per_s_low"] = lo.get("bytes_per_s")
        res["details"]["tui_cpu_share_low"] = lo.get("cpu_share")
        if firsts:
            F["tui_first_frame_s"] = statistics.median(firsts)
            res["spreads"]["tui_first_frame_s"] = spread(firsts)
        else:
            N["tui_first_frame_s"] = "the run's name never appeared on the terminal"
        if n.get("per_second_bytes"):
            res["spreads"]["tui_bytes_per_s"] = n["per_second_bytes"]
        if lo.get("per_second_bytes"):
            res["spreads"]["tui_bytes_per_s_low"] = lo["per_second_bytes"]
    except Exception as e:
        for k in TARGETS:
            if F.get(k) is None:
                N.setdefault(k, f"{type(e).__name__}: {e}")
    # baselines: import textual; the minimal Textual screen
    try:
        imp = time_import_textual(max(3, launches))
        B["tui_first_frame_s"] = {"what": "python -c \"import textual\" (wall, median)", "value": statistics.median(imp),
                                  "unit": "s", "spread": spread(imp)}
    except Exception as e:
        N["tui_first_frame_s_baseline"] = f"{type(e).__name__}: {e}"
    if do_baseline_app:
        try:
            with tempfile.TemporaryDirectory(prefix="stepwatch-bench-app-") as d:
                app = Path(d) / "monitor_app.py"
                app.write_text(MINIMAL_APP)
                r = pty_session([sys.executable, str(app), "logbatch"], b"TRAINMON", warm, window,
                                pty_env({"LOG_CSS": "scrollbar-size: 0 0;"}), cwd=d)
            D["minimal_app"] = r
            B["tui_bytes_per_s"] = {"what": "minimal Textual screen, same harness (MINIMAL_APP, "
                                            "logbatch, scrollbars off)", "value": r["bytes_per_s"], "unit": "B/s",
                                    "cpu_share": r["cpu_share"]}
            B["tui_cpu_share"] = {"what": "the same minimal Textual screen's CPU share", "value": r["cpu_share"],
                                  "unit": "s/s"}
        except Exception as e:
            N["tui_bytes_per_s_baseline"] = f"{type(e).__name__}: {e}"
    if "tui_bytes_per_s" not in B:
        B["tui_bytes_per_s"] = {"what": "minimal Textual screen, quoted from the development VM's floors (2026-11-30), "
                                        "not measured in this run", "value": 5869, "unit": "B/s", "quoted": True}
    B["tui_bytes_per_s_low"] = {"what": "numbers-only Textual screen, quoted from the development VM's floors (2026-11-30)", "value": 256,
                                "unit": "B/s", "quoted": True}
    for k, v in F.items():
        print(f"{k}: {v if v is None else round(v, 4)} (target <= {TARGETS[k]})")
    for k, b in B.items():
        print(f"  baseline {k}: {b['value'] if b['value'] is None else round(b['value'], 4)} {b['unit']} -- {b['what']}")
    write_json(a.json, res)
    return 0


if __name__ == "__main__":
    sys.exit(main())
