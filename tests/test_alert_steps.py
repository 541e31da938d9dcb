"""One step per alert: the step an alert names is where its condition began, the same for every view however it
reads the files (the supervisor live, a cold `status` of the finished run, a view attached half-way). Found: the
recompile-limit alert named step 18, 19 or 150 depending on the view. In-process, on the real dynamo warning."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

from conftest import REPO_ROOT
from stepwatch.monitors.snapshot.observer import RunObserver

STATIC_RUN = REPO_ROOT / "tests" / "fixtures" / "runs" / "ended-sigkill"  # events.jsonl up to step 100
WARNING = [ln for ln in (REPO_ROOT / "tests" / "fixtures" / "real" / "dynamo_limit_default.log").read_text().splitlines()
           if ln.startswith("W1130")]


def _log(first: int, last: int) -> str:
    return "".join(f"step {k}/200 loss {1 / k:.4f}\n" for k in range(first, last + 1))


def _limit_alert(obs: RunObserver) -> str:
    (al,) = [a for a in obs.refresh()["alerts"] if a["kind"] == "recompile_limit"]
    return al["message"]


def test_the_recompile_limit_alert_names_the_step_the_log_had_reached_in_every_view(tmp_path: Path):
    run_dir = tmp_path / "run"
    shutil.copytree(STATIC_RUN, run_dir)
    before, after = _log(1, 18) + "\n".join(WARNING) + "\n", _log(19, 100)
    (run_dir / "train.log").write_text(before)
    live = RunObserver(run_dir, use_saved_state=False)  # a view that read the log up to the warning, then on
    first = _limit_alert(live)
    with (run_dir / "train.log").open("a") as f:
        f.write(after)
    assert _limit_alert(live) == first
    cold = RunObserver(run_dir, use_saved_state=False)  # a cold status of the whole run: events.jsonl at step 100
    assert cold.refresh()["step"]["global_step"] == 100
    assert _limit_alert(cold) == first
    assert re.search(r"dynamo hit recompile_limit \(4\) for forward near step 18: that frame now runs EAGERLY",
                     first), first
