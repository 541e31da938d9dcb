"""The step's scaling curve from the run itself (ARCHITECTURE.md, "Reference runs"): t = A·Σb·w + B·Σb·w² + C
over the optimizer steps' batch shapes, and the padding's cost measured apart. Standard library only.

Each step with a known shape gives one point: x1 = Σ b·w (the padded tokens: sequences b of padded width
w, summed over the step's micro-batches), x2 = Σ b·w² (= padded tokens × the step event's ``width``,
the token-weighted width), y = the step's seconds. :class:`ScalingFit` keeps the running sums of the
normal equations (XᵀX, Xᵀy, yᵀy: a refit costs the same at step 10 and step 1,000,000), solves them by
Gaussian elimination, and reports the parameters with their standard errors, the residuals, and the
verdict, weighted by the run's own width distribution (E[w], E[w²] per sequence: E[w²] is not E[w]²):

- ``undetermined``: fewer than MIN_WIDTHS distinct widths (two points over three terms are
  undetermined), widths spread less than MIN_SPREAD (max / min), fewer than MIN_POINTS
  steps, or residuals that do not close (RMS above MAX_REL_RESIDUAL of the mean step); the reason says which;
- ``launch-bound``: the constant term (a fixed cost per step: launches, the optimizer, the host) is
  at least LAUNCH_SHARE of the mean step;
- ``quadratic``: the w² term (attention) is at least QUADRATIC_SHARE of the mean step;
- ``linear``: otherwise (per-token work dominates).

Steps carrying a flag (the first step, a recompile, a save or an evaluation) and the first
SKIP_STEPS steps with a shape (warm-up) are left out.
"""

from __future__ import annotations

import math
from typing import Any

MIN_WIDTHS = 3
MIN_SPREAD = 1.5
MIN_POINTS = 12
#: The residuals close when their RMS is at most this share of the mean step (R² is reported too: a
#: launch-bound run's step times hardly vary, so R² says little there).
MAX_REL_RESIDUAL = 0.1
LAUNCH_SHARE = 0.5
QUADRATIC_SHARE = 0.25
SKIP_STEPS = 5
#: distinct widths remembered (for the count and the padded-vs-unpadded comparison)
MAX_WIDTHS = 4096


def _solve3(m: list[list[float]], v: list[float]) -> list[float] | None:
    """``m`` x = ``v`` for a 3x3 ``m`` (Gaussian elimination, partial pivoting); None when singular."""
    a = [row[:] + [v[i]] for i, row in enumerate(m)]
    for col in range(3):
        piv = max(range(col, 3), key=lambda r: abs(a[r][col]))
        if abs(a[piv][col]) < 1e-300:
            return None
        a[col], a[piv] = a[piv], a[col]
        for r in range(3):
            if r != col:
                f = a[r][col] / a[col][col]
                for c in range(col, 4):
                    a[r][c] -= f * a[col][c]
    return [a[i][3] / a[i][i] for i in range(3)]


def _inverse3(m: list[list[float]]) -> list[list[float]] | None:
    cols = [_solve3(m, [1.0 if i == j else 0.0 for i in range(3)]) for j in range(3)]
    if any(c is None for c in cols):
        return None
    return [[cols[j][i] for j in range(3)] for i in range(3)]  # type: ignore[index]


class ScalingFit:
    """Running least squares of step seconds on (Σb·w, Σb·w², 1), plus the padding figures.

    :meth:`add` one step; :meth:`scaling` and :meth:`padding` give the snapshot's parts."""

    def __init__(self) -> None:
        self.xtx = [[0.0] * 3 for _ in range(3)]
        self.xty = [0.0] * 3
        self.yty = 0.0
        self.sum_y = 0.0
        self.n = 0
        self.skipped = 0
        self.sequences = 0.0  # Σ b over the fitted steps
        self.sum_bw = 0.0  # Σ b·w
        self.sum_bw2 = 0.0  # Σ b·w²
        self.widths: dict[int, list[float]] = {}  # width -> [n padded, Σdt padded, n unpadded, Σdt unpadded]
        self.fit_widths: dict[int, int] = {}  # width -> steps fitted
        self.steps_with_tokens = 0
        self.steps_unpadded = 0
        self.tokens = 0
        self.padded_tokens = 0

    def add(self, dt_s: float, padded_tokens: int, width: float, batch_size: int | None, tokens: int | None,
            flagged: bool) -> None:
        """One optimizer step: its seconds, padded tokens (Σ b·w), token-weighted width, sequences, real
        tokens (None: unknown) and whether it carries a flag (left out of the fit)."""
        if not (type(width) in (int, float) and 0 < width < 1e9 and 0 < padded_tokens < 1e15 and 0 <= dt_s < 1e7):
            return
        if tokens is not None and 0 <= tokens <= padded_tokens:
            self.steps_with_tokens += 1
            self.tokens += tokens
            self.padded_tokens += padded_tokens
            unpadded = tokens == padded_tokens
            self.steps_unpadded += unpadded
            w = round(width)
            if w in self.widths or len(self.widths) < MAX_WIDTHS:
                cell = self.widths.setdefault(w, [0.0, 0.0, 0.0, 0.0])
                cell[2 if unpadded else 0] += 1
                cell[3 if unpadded else 1] += dt_s
        if flagged or self.skipped < SKIP_STEPS:
            self.skipped += 0 if flagged else 1
            return
        x = (float(padded_tokens), float(padded_tokens) * width, 1.0)
        for i in range(3):
            self.xty[i] += x[i] * dt_s
            for j in range(3):
                self.xtx[i][j] += x[i] * x[j]
        self.yty += dt_s * dt_s
        self.sum_y += dt_s
        self.n += 1
        if batch_size is not None and 0 < batch_size < 1e9:
            self.sequences += batch_size
            self.sum_bw += padded_tokens
            self.sum_bw2 += padded_tokens * width
        w = round(width)
        if w in self.fit_widths or len(self.fit_widths) < MAX_WIDTHS:
            self.fit_widths[w] = self.fit_widths.get(w, 0) + 1

    def scaling(self) -> dict[str, Any]:
        """The snapshot's ``scaling``: ``{verdict, reason, steps, distinct_widths, a_s_per_token,
        b_s_per_token_width, c_s, a_se, b_se, c_se, r2, residual_s, shares: {linear, quadratic,
        constant}, e_w, e_w2, e_w2_over_e_w_sq}`` (seconds; shares of the mean step at the run's own
        shapes; null where not computed)."""
        out: dict[str, Any] = {"verdict": "undetermined", "reason": None, "steps": self.n,
                               "distinct_widths": len(self.fit_widths), "a_s_per_token": None,
                               "b_s_per_token_width": None, "c_s": None, "a_se": None, "b_se": None, "c_se": None,
                               "r2": None, "residual_s": None, "residual_share": None, "shares": None, "e_w": None, "e_w2": None,
                               "e_w2_over_e_w_sq": None}
        if self.sequences > 0:
            e_w, e_w2 = self.sum_bw / self.sequences, self.sum_bw2 / self.sequences
            out.update(e_w=round(e_w, 3), e_w2=round(e_w2, 3), e_w2_over_e_w_sq=round(e_w2 / (e_w * e_w), 4))
        widths = list(self.fit_widths)
        if self.n == 0:
            out["reason"] = "no step records the batch shape (step_end(batch_size=, width=), or the Trainer callback)"
            return out
        if len(widths) < MIN_WIDTHS:
            out["reason"] = (f"{len(widths)} distinct width(s): three terms need at least {MIN_WIDTHS} "
                             "(two points over three terms are undetermined)")
            return out
        if max(widths) < MIN_SPREAD * min(widths):
            out["reason"] = f"widths {min(widths)}..{max(widths)} spread less than {MIN_SPREAD}x: the terms cannot be told apart"
            return out
        if self.n < MIN_POINTS:
            out["reason"] = f"{self.n} steps fitted: at least {MIN_POINTS} needed"
            return out
        beta = _solve3(self.xtx, self.xty)
        inv = _inverse3(self.xtx)
        if beta is None or inv is None:
            out["reason"] = "the shapes are collinear (every step has the same width mix): the fit is singular"
            return out
        a, b, c = beta
        rss = max(0.0, self.yty - 2 * sum(beta[i] * self.xty[i] for i in range(3))
                  + sum(beta[i] * beta[j] * self.xtx[i][j] for i in range(3) for j in range(3)))
        tss = self.yty - self.sum_y * self.sum_y / self.n
        r2 = 1.0 - rss / tss if tss > 0 else 1.0
        sigma2 = rss / (self.n - 3)  # n >= MIN_POINTS > 3
        se = [math.sqrt(max(0.0, sigma2 * inv[i][i])) for i in range(3)]
        mean_x1, mean_x2 = self.xtx[0][2] / self.n, self.xtx[1][2] / self.n
        parts = {"linear": a * mean_x1, "quadratic": b * mean_x2, "constant": c}
        total = sum(max(0.0, v) for v in parts.values())
        shares = {k: round(max(0.0, v) / total, 4) if total > 0 else None for k, v in parts.items()}
        out.update(a_s_per_token=a, b_s_per_token_width=b, c_s=c, a_se=se[0], b_se=se[1], c_se=se[2], r2=round(r2, 5),
                   residual_s=round(math.sqrt(rss / self.n), 6), shares=shares)
        rel = math.sqrt(rss / self.n) / (self.sum_y / self.n) if self.sum_y > 0 else math.inf
        out["residual_share"] = round(rel, 4) if math.isfinite(rel) else None
        if rel > MAX_REL_RESIDUAL:
            out["reason"] = (f"the residuals do not close: their RMS is {100 * rel:.0f}% of the mean step (at most "
                             f"{100 * MAX_REL_RESIDUAL:.0f}%; R² {r2:.2f}): the step time depends on more than the batch shape")
            return out
        if total <= 0:
            out["reason"] = "every term fitted at or below zero"
            return out
        if shares["constant"] >= LAUNCH_SHARE:
            out["verdict"] = "launch-bound"
        elif shares["quadratic"] >= QUADRATIC_SHARE:
            out["verdict"] = "quadratic"
        else:
            out["verdict"] = "linear"
        return out

    def padding(self) -> dict[str, Any]:
        """The snapshot's ``padding``: ``{share, steps, unpadded_steps, unpadded_share, same_width}``
        (share: 1 - real/padded tokens over the steps with both counts; same_width: per width with
        padded and unpadded steps, their mean seconds and the padded ones' excess)."""
        out: dict[str, Any] = {"share": None, "steps": self.steps_with_tokens, "unpadded_steps": self.steps_unpadded,
                               "unpadded_share": None, "same_width": []}
        if self.steps_with_tokens:
            out["share"] = round(1.0 - self.tokens / self.padded_tokens, 4) if self.padded_tokens else None
            out["unpadded_share"] = round(self.steps_unpadded / self.steps_with_tokens, 4)
        for w in sorted(self.widths):
            n_p, s_p, n_u, s_u = self.widths[w]
            if n_p and n_u:
                mp, mu = s_p / n_p, s_u / n_u
                out["same_width"].append({"width": w, "padded_s": round(mp, 6), "unpadded_s": round(mu, 6),
                                          "padded_steps": int(n_p), "unpadded_steps": int(n_u),
                                          "padded_excess": round(mp / mu - 1.0, 4) if mu > 0 else None})
        out["same_width"] = out["same_width"][:16]
        return out
