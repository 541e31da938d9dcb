"""What a restored saved state must hold before it is used (:mod:`.savedstate` calls these on each
object it makes): the invariants the code indexing those objects relies on, so a crafted or damaged
``events.state.json`` is refused (StateError) rather than slowing or crashing a view."""

from __future__ import annotations

import math
from collections import Counter
from typing import Any
from collections.abc import Callable

from stepwatch.monitors.detectors.baseline import _Baseline
from stepwatch.monitors.detectors.scaling import ScalingFit


class StateError(ValueError):
    """A saved state that cannot be read back: malformed, an unknown class, attributes that are
    not the class's own, a value of the wrong type, a container held twice."""


def _check_baseline(b: _Baseline) -> None:
    """The invariants a detector window keeps (its width groups index its steps), so a state cannot
    make a lookup scan the window at every step. Raises StateError."""
    widths = Counter(e[1] for e in b._q if type(e) is tuple and len(e) == 3 and e[1] is not None)
    if (len(b._q) > b.maxlen or b._n_width != sum(widths.values()) or widths.keys() != b._groups.keys()
            or any(len(b._groups[w]) != n for w, n in widths.items())):
        raise StateError("a saved detector window does not match its width groups")
    lw_ws = b._lw_ws
    if (b._lws != sorted(lw_ws) or sorted(w for ws in lw_ws.values() for w in ws) != sorted(b._groups)
            or any(math.log(w) != lw for lw, ws in lw_ws.items() for w in ws)
            or b._shared != {lw for lw, ws in lw_ws.items() if len(ws) > 1}):
        raise StateError("a saved detector window's width index is not its widths'")


def _check_scaling(f: ScalingFit) -> None:
    """A fit's sums have the shapes its code indexes (3x3, 3, four numbers per width). Raises StateError."""
    num = (int, float)
    ok = (len(f.xtx) == 3 and all(type(r) is list and len(r) == 3 and all(type(x) in num for x in r) for r in f.xtx)
          and len(f.xty) == 3 and all(type(x) in num for x in f.xty)
          and all(type(k) is int and type(v) is list and len(v) == 4 and all(type(x) in num for x in v)
                  for k, v in f.widths.items())
          and all(type(k) is int and type(v) is int for k, v in f.fit_widths.items()))
    if not ok:
        raise StateError("a saved ScalingFit has sums of the wrong shape")


#: class name -> the check run on each restored instance
RESTORED_CHECKS: dict[str, Callable[[Any], None]] = {"_Baseline": _check_baseline, "ScalingFit": _check_scaling}
