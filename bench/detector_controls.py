"""How the fallback detector fares on every control, and the trip point's margins.

Usage:  python bench/detector_controls.py [--seed 0] [--seeds 20] [--mc-seeds 200] [--json FILE]

Prints one row per control (tests/fixtures/step_controls.py, seed ``--seed``):

  final        the detector's state after the last step
  susp         whether it ever reached ``suspected``
  warm-up      until_step reported / known from the generator
  onset        onset_step reported / the first eager step (positives)
  to_flag      judged steps from the true onset to the flag (full: <= 3; partial: <= 40)
  slow>on      slow steps after the onset when it flagged
  max_ok       highest score (dt / expected) of an accepted steady step
  trip         the trip point at the end, x expected
  margin       negatives: trip / max_ok (how far the jitter stays below the trip);
               positives: min eager-step score / trip (how far the fallback sits above it)

Then the same over ``--seeds`` seeds (worst case per control), and a Monte Carlo of partial
fallbacks at 10/15/20 % over ``--mc-seeds`` seeds: the share flagged within 40 judged steps of
the true onset. Runnable alone from the repository root or anywhere.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from stepwatch.monitors.detectors.fallback import FLAG_WINDOW, FallbackDetector  # noqa: E402


def load_controls():
    name = "stepwatch_test_step_controls"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, ROOT / "tests" / "fixtures" / "step_controls.py")
        if spec is None or spec.loader is None:
            raise ImportError(f"cannot load {spec}")
        mod = importlib.util.module_from_spec(spec)
        sys.modules[name] = mod
        spec.loader.exec_module(mod)
    return sys.modules[name]


def evaluate(control) -> dict:
    """Run one control through a fresh detector and measure it."""
    d = FallbackDetector()
    steps = [r["step"] for r in control.records]
    verdicts = []
    suspected = False
    t0 = time.perf_counter()
    for rec in control.records:
        verdicts.append(d.update(rec))
        suspected |= d.state != "ok"
    us_per_step = (time.perf_counter() - t0) / max(1, len(control.records)) * 1e6
    det = d.details()
    to_flag = None
    min_eager = None
    if control.onset_step is not None:
        i = steps.index(control.onset_step)
        if det["flagged_at_step"] is not None:
            j = steps.index(det["flagged_at_step"])
            to_flag = sum(1 for v in verdicts[i + 1 : j + 1] if v.excused is None)
        eager = [v.score for v in verdicts[i:] if v.slow]
        min_eager = min(eager) if eager else None
    trip = det["trip_ratio"]
    max_ok = det["max_ok_score"]
    if control.polarity == "negative":
        margin = trip / max_ok if max_ok else None
    else:
        margin = min_eager / trip if min_eager else None
    return {
        "control": control.name,
        "polarity": control.polarity,
        "kind": control.kind,
        "steps": len(control.records),
        "final_state": d.state,
        "reached_suspected": suspected,
        "warmup": d.warmup(),
        "warmup_expected": control.warmup_until_step,
        "onset_step": d.onset_step,
        "true_onset_step": control.onset_step,
        "judged_to_flag_from_true_onset": to_flag,
        "slow_after_onset_to_flag": det["slow_after_onset_to_flag"],
        "max_ok_score": max_ok,
        "min_eager_score": min_eager,
        "trip_ratio": trip,
        "spread_sigma": det["spread_sigma"],
        "margin": margin,
        "us_per_step": us_per_step,
        "pass": _passes(control, d.state, to_flag),
    }


def _passes(control, state, to_flag) -> bool:
    if control.polarity == "negative":
        return state != "flagged"
    bound = 3 if control.kind == "full" else FLAG_WINDOW
    return state == "flagged" and to_flag is not None and to_flag <= bound


def _f(v, fmt="{:.2f}"):
    return "-" if v is None else fmt.format(v)


def print_table(rows: list[dict]) -> None:
    hdr = f"{'control':32} {'pol':4} {'final':9} {'susp':5} {'warm-up':>11} {'onset':>11} {'to_flag':>7} " \
          f"{'slow>on':>7} {'max_ok':>6} {'trip':>5} {'margin':>6} {'us/step':>7} ok"
    print(hdr)
    print("-" * len(hdr))
    for r in rows:
        warm = f"{_f(r['warmup']['until_step'], '{}')}/{_f(r['warmup_expected'], '{}')}"
        onset = f"{_f(r['onset_step'], '{}')}/{_f(r['true_onset_step'], '{}')}" if r["polarity"] == "positive" else "-"
        print(
            f"{r['control']:32} {r['polarity'][:3]:4} {r['final_state']:9} {str(r['reached_suspected']):5} "
            f"{warm:>11} {onset:>11} {_f(r['judged_to_flag_from_true_onset'], '{}'):>7} "
            f"{_f(r['slow_after_onset_to_flag'], '{}'):>7} {_f(r['max_ok_score']):>6} {_f(r['trip_ratio']):>5} "
            f"{_f(r['margin']):>6} {r['us_per_step']:7.1f} {'yes' if r['pass'] else 'NO'}"
        )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--seed", type=int, default=0, help="seed of the table (the tests use 0)")
    ap.add_argument("--seeds", type=int, default=20, help="seeds for the worst-case summary (0: skip)")
    ap.add_argument("--mc-seeds", type=int, default=200, help="seeds for the partial-fallback Monte Carlo (0: skip)")
    ap.add_argument("--json", metavar="FILE", help="also write the results as JSON")
    a = ap.parse_args(argv)
    sc = load_controls()

    rows = [evaluate(c) for c in sc.all_controls(a.seed)]
    print(f"fallback detector on the controls, seed {a.seed}")
    print_table(rows)

    worst: dict[str, dict] = {}
    if a.seeds > 0:
        for seed in range(a.seeds):
            for c in sc.all_controls(seed):
                r = evaluate(c)
                w = worst.setdefault(
                    r["control"],
                    {"polarity": r["polarity"], "runs": 0, "flagged": 0, "suspected": 0, "failed": 0,
                     "max_ok_score": 0.0, "min_margin": None, "max_to_flag": None},
                )
                w["runs"] += 1
                w["flagged"] += r["final_state"] == "flagged"
                w["suspected"] += r["reached_suspected"]
                w["failed"] += not r["pass"]
                w["max_ok_score"] = max(w["max_ok_score"], r["max_ok_score"] or 0.0)
                if r["margin"] is not None:
                    w["min_margin"] = r["margin"] if w["min_margin"] is None else min(w["min_margin"], r["margin"])
                if r["judged_to_flag_from_true_onset"] is not None:
                    t = r["judged_to_flag_from_true_onset"]
                    w["max_to_flag"] = t if w["max_to_flag"] is None else max(w["max_to_flag"], t)
        print(f"\nworst case over seeds 0..{a.seeds - 1}")
        print(f"{'control':32} {'pol':4} {'flagged':>8} {'suspected':>9} {'failed':>6} {'max_ok':>6} {'min_margin':>10} {'max_to_flag':>11}")
        for name, w in worst.items():
            print(
                f"{name:32} {w['polarity'][:3]:4} {w['flagged']:>4}/{w['runs']:<3} {w['suspected']:>5}/{w['runs']:<3} "
                f"{w['failed']:>6} {w['max_ok_score']:6.2f} {_f(w['min_margin']):>10} {_f(w['max_to_flag'], '{}'):>11}"
            )

    mc: dict[str, dict] = {}
    if a.mc_seeds > 0:
        print(f"\npartial fallback, flagged within {FLAG_WINDOW} judged steps of the true onset, {a.mc_seeds} seeds")
        for share in (0.10, 0.15, 0.20):
            hits, worst_to_flag = 0, 0
            for seed in range(a.mc_seeds):
                r = evaluate(sc.partial_fallback(seed, n=460, onset_index=350, share=share))
                t = r["judged_to_flag_from_true_onset"]
                if r["final_state"] == "flagged" and t is not None and t <= FLAG_WINDOW:
                    hits += 1
                worst_to_flag = max(worst_to_flag, t if t is not None else 10**9)
            mc[f"{share:.2f}"] = {"within_40": hits, "runs": a.mc_seeds, "rate": hits / a.mc_seeds}
            print(f"  {share:.0%}: {hits}/{a.mc_seeds} = {hits / a.mc_seeds:.3f}")

    if a.json:
        Path(a.json).write_text(json.dumps({"seed": a.seed, "controls": rows, "worst": worst, "partial_mc": mc}, indent=2))
    return 0 if all(r["pass"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
