"""Import hygiene and the import graph, over every module of the installed ``stepwatch.*``.

- No ``stepwatch.monitors.*`` or ``stepwatch.launcher.*`` module loads textual (the front door,
  ``stepwatch.tui``, alone draws).
- ``stepwatch.telemetry`` (the emitter, imported into the training job's own process) loads only the
  standard library and stepwatch's own stdlib-only modules at import: no torch, transformers,
  textual, nor any third-party package.
- The old generic top-level names (``monitors``, ``launcher``, ``tui``, ``assets``) are never imported.
- The layers point one way (tui -> launcher -> monitors), and no import cycle exists among the
  project's modules, lazy imports inside functions included.

Each module is imported in a fresh interpreter (``-P``: the checkout is not on sys.path, so what is
checked is the installed code).
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[1]
#: The folders the wheel publishes, and their names (pyproject.toml [tool.setuptools.package-dir]).
FOLDERS = {"monitors/telemetry": "stepwatch.telemetry", "monitors": "stepwatch.monitors",
           "launcher": "stepwatch.launcher", "tui": "stepwatch.tui", "assets": "stepwatch.assets"}
GENERIC = ("monitors", "launcher", "tui", "assets")


def module_files() -> dict[str, Path]:
    """Every module of the project, by its installed dotted name."""
    out: dict[str, Path] = {}
    for folder, dotted in sorted(FOLDERS.items(), key=lambda kv: -len(kv[0])):
        base = REPO_ROOT / folder
        for f in sorted(base.rglob("*.py")):
            rel = f.relative_to(base)
            if "__pycache__" in rel.parts:
                continue
            if folder == "monitors" and rel.parts[0] == "telemetry":
                continue  # published as stepwatch.telemetry
            parts = list(rel.with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            out[".".join([dotted, *parts])] = f
    return out


MODULES = module_files()
#: Modules that are scripts run in the training job's process, not imported by stepwatch.
SCRIPTS = {"stepwatch.assets.demo_train"}

_PROBE = r"""
import importlib, json, sys
before = set(sys.modules)
importlib.import_module(sys.argv[1])
print(json.dumps(sorted(set(sys.modules) - before)))
"""


def loaded_by(module: str) -> list[str]:
    """The modules a fresh interpreter loads to import ``module``."""
    p = subprocess.run([sys.executable, "-P", "-c", _PROBE, module], capture_output=True, text=True,
                       timeout=120, cwd="/")
    assert p.returncode == 0, f"import {module} failed:\n{p.stderr}"
    return json.loads(p.stdout)


def test_the_walk_finds_the_layers():
    """A control for the walk itself: an empty or wrong walk would make every check below pass."""
    for name in ("stepwatch.telemetry", "stepwatch.telemetry.core", "stepwatch.monitors.snapshot.observer",
                 "stepwatch.launcher.supervisor", "stepwatch.tui.app", "stepwatch.tui.cli"):
        assert name in MODULES, name
    assert not any(m.startswith("stepwatch.monitors.telemetry") for m in MODULES)
    assert len(MODULES) > 50


HEADLESS = sorted(m for m in MODULES if m.startswith(("stepwatch.monitors", "stepwatch.launcher")))


@pytest.mark.parametrize("module", HEADLESS)
def test_headless_modules_do_not_load_textual(module: str):
    loaded = loaded_by(module)
    assert not [m for m in loaded if m == "textual" or m.startswith("textual.")], f"{module} loads textual"
    assert not [m for m in loaded if m.split(".")[0] in GENERIC], f"{module} loads a generic top-level name"


def test_the_probe_sees_textual_when_it_is_loaded():
    """Positive control: the front door does load textual, and the probe says so."""
    assert "textual" in loaded_by("stepwatch.tui.app")


def test_the_emitter_loads_only_the_standard_library():
    loaded = loaded_by("stepwatch.telemetry")
    stdlib = sys.stdlib_module_names
    foreign = sorted({m.split(".")[0] for m in loaded} - set(stdlib) - {"stepwatch"})
    assert not foreign, f"stepwatch.telemetry loads non-stdlib packages at import: {foreign}"
    for heavy in ("torch", "transformers", "textual", "psutil", "sortedcontainers"):
        assert heavy not in loaded


def test_the_stdlib_check_catches_a_third_party_import():
    """Positive control for the emitter check: a module that loads psutil is caught by it."""
    loaded = loaded_by("stepwatch.monitors.watchdog")
    assert "psutil" in {m.split(".")[0] for m in loaded} - set(sys.stdlib_module_names)


# ----------------------------------------------------------------------------- the import graph


def imports_of(module: str, path: Path) -> set[str]:
    """The project modules ``module`` imports, anywhere in its file (lazy imports included)."""
    tree = ast.parse(path.read_text(), filename=str(path))
    is_pkg = path.name == "__init__.py"
    out: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = module.split(".") if is_pkg else module.split(".")[:-1]
                base = base[: len(base) - (node.level - 1)]
                src = ".".join(base + ([node.module] if node.module else []))
            else:
                src = node.module or ""
            names = [src] + [f"{src}.{a.name}" for a in node.names]
        else:
            continue
        for n in names:
            parts = n.split(".")
            assert parts[0] not in GENERIC, f"{module} imports the generic top-level name {n!r}"
            while parts and ".".join(parts) not in MODULES:
                parts.pop()
            if parts and ".".join(parts) != module:
                out.add(".".join(parts))
    return out


GRAPH = {m: imports_of(m, f) for m, f in MODULES.items()}


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle (a list of modules, first == last), or None."""
    WHITE, GREY, BLACK = 0, 1, 2
    colour = dict.fromkeys(graph, WHITE)
    stack: list[str] = []

    def visit(n: str) -> list[str] | None:
        colour[n] = GREY
        stack.append(n)
        for m in sorted(graph.get(n, ())):
            if colour.get(m) == GREY:
                return stack[stack.index(m):] + [m]
            if colour.get(m) == WHITE:
                found = visit(m)
                if found:
                    return found
        stack.pop()
        colour[n] = BLACK
        return None

    for n in sorted(graph):
        if colour[n] == WHITE:
            found = visit(n)
            if found:
                return found
    return None


def test_no_import_cycle_among_the_projects_modules():
    assert find_cycle(GRAPH) is None, f"import cycle: {' -> '.join(find_cycle(GRAPH) or [])}"


def test_the_cycle_finder_finds_a_cycle():
    """Positive control: the old status <-> narrate cycle, put back into the graph, is found."""
    g = {k: set(v) for k, v in GRAPH.items()}
    g["stepwatch.monitors.snapshot.alerts"].add("stepwatch.tui.plain")
    cycle = find_cycle(g)
    assert cycle is not None and "stepwatch.tui.plain" in cycle


def test_layers_point_one_way():
    """monitors imports neither launcher nor tui; launcher does not import tui; the emitter imports
    only the protocol and the stdlib-only statistics."""
    for m, deps in GRAPH.items():
        if m.startswith("stepwatch.monitors") or m.startswith("stepwatch.telemetry"):
            bad = {d for d in deps if d.startswith(("stepwatch.launcher", "stepwatch.tui"))}
            assert not bad, f"{m} imports {bad}"
        if m.startswith("stepwatch.launcher"):
            bad = {d for d in deps if d.startswith("stepwatch.tui")}
            assert not bad, f"{m} imports {bad}"
        if m.startswith("stepwatch.telemetry"):
            allowed = ("stepwatch.telemetry", "stepwatch.monitors.protocol", "stepwatch.monitors.runfiles",
                       "stepwatch.monitors.stats.nearest_rank", "stepwatch.monitors", "stepwatch.monitors.stats")
            bad = {d for d in deps if not d.startswith(allowed)}
            assert not bad, f"the emitter's {m} imports {bad}"


def test_no_module_is_over_the_size_a_newcomer_reads():
    """~400 lines a module; the fallback detector's one class (a documented exception) is allowed more."""
    allowed = {"stepwatch.monitors.detectors.fallback": 800, "stepwatch.monitors.gpu.backend": 800,
               "stepwatch.telemetry.core": 700, "stepwatch.monitors.stats.stepstats": 500,
               "stepwatch.monitors.readers.textlog": 520, "stepwatch.monitors.parsers.dynamolog": 460,
               "stepwatch.monitors.snapshot.observer": 460, "stepwatch.monitors.fold.savedstate": 460,
               "stepwatch.tui.cli": 460}
    over = {m: n for m, f in MODULES.items() if (n := len(f.read_text().splitlines())) > allowed.get(m, 400)}
    assert not over, over
