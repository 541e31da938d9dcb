"""Import hygiene and the import graph, over every module of the installed ``stepwatch.*``.

- No ``stepwatch.monitors.*`` or ``stepwatch.launcher.*`` module loads textual (the front door,
  ``stepwatch.tui``, alone draws).
- ``stepwatch.telemetry`` (the emitter, imported into the training job's own process) loads only the
  standard library and stepwatch's own stdlib-only modules at import: no torch, transformers,
  textual, nor any third-party package.
- The old generic top-level names (``monitors``, ``launcher``, ``tui``, ``assets``) are never imported.
- The layers point one way (tui -> launcher -> monitors), and no import cycle exists among the
  project's modules, lazy imports inside functions included.
- No product file cites a file a clone does not have (design notes, the shared folder, an absolute
  path of the machine it was written on); every citation of ARCHITECTURE.md names a rule or a
  section that it has.

The headless modules are imported together in one fresh interpreter (``-P``: the checkout is not on sys.path, so
what is checked is the installed code): what it then holds is the union of what each loads. Only when that union
holds textual or a generic name, and for the few modules a test asks about by name, is a module imported in a fork
of its own of one fresh interpreter, which names the module that loads it.
"""

from __future__ import annotations

import ast
import io
import json
import os
import re
import subprocess
import sys
import tokenize
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
import importlib, json, os, sys
for name in sys.argv[1:]:  # each in a fork of this fresh interpreter: as clean as a new one, ~100x cheaper
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(r)
        before = set(sys.modules)
        try:
            importlib.import_module(name)
            out = {"loaded": sorted(set(sys.modules) - before)}
        except BaseException as e:
            out = {"error": f"{type(e).__name__}: {e}"}
        with os.fdopen(w, "w") as f:
            json.dump(out, f)
        os._exit(0)
    os.close(w)
    with os.fdopen(r) as f:
        got = f.read()
    os.waitpid(pid, 0)
    print(json.dumps([name, json.loads(got) if got else {"error": "the probe died"}]))
"""
_LOADED: dict[str, dict] = {}


#: The modules the tests below ask about one by one: probed together, the first time one is asked.
ASKED = ("stepwatch.tui.app", "stepwatch.telemetry", "stepwatch.monitors.snapshot.observer",
         "stepwatch.monitors.watchdog")


def loaded_by(module: str) -> list[str]:
    """The modules a fresh interpreter loads to import ``module`` (the modules of :data:`ASKED` and ``module`` are
    probed in one interpreter, each in a fork of its own, the first time one is asked)."""
    if module not in _LOADED:
        names = [module, *(m for m in ASKED if m != module and m not in _LOADED)]
        n = max(1, min(4, os.cpu_count() or 1, len(names)))  # one probe per core, each with its share of the names
        probes = [subprocess.Popen([sys.executable, "-P", "-c", _PROBE, *names[i::n]], stdout=subprocess.PIPE,
                                   stderr=subprocess.PIPE, text=True, cwd="/") for i in range(n)]
        for p in probes:
            out, err = p.communicate(timeout=300)
            assert p.returncode == 0, f"the import probe failed:\n{err}"
            _LOADED.update(json.loads(line) for line in out.splitlines())
    got = _LOADED[module]
    assert "error" not in got, f"import {module} failed: {got['error']}"
    return got["loaded"]


def test_the_walk_finds_the_layers():
    """A control for the walk itself: an empty or wrong walk would make every check below pass."""
    for name in ("stepwatch.telemetry", "stepwatch.telemetry.core", "stepwatch.monitors.snapshot.observer",
                 "stepwatch.launcher.supervisor", "stepwatch.tui.app", "stepwatch.tui.cli"):
        assert name in MODULES, name
    assert not any(m.startswith("stepwatch.monitors.telemetry") for m in MODULES)
    assert len(MODULES) > 50


HEADLESS = sorted(m for m in MODULES if m.startswith(("stepwatch.monitors", "stepwatch.launcher")))
_UNION: dict[str, set[str] | str] = {}
_UNION_PROBE = r"""
import importlib, json, sys
for name in sys.argv[1:]:
    importlib.import_module(name)
print(json.dumps(sorted(sys.modules)))
"""


def loaded_by_all_headless() -> set[str] | str:
    """The modules one fresh interpreter has loaded once it imported every headless module (the union of what each
    loads: an import runs a module's top level once, whatever imported it first), or why it could not."""
    if "got" not in _UNION:
        r = subprocess.run([sys.executable, "-P", "-c", _UNION_PROBE, *HEADLESS], capture_output=True, text=True,
                           cwd="/", timeout=300)
        _UNION["got"] = set(json.loads(r.stdout)) if r.returncode == 0 else f"the import probe failed:\n{r.stderr}"
    return _UNION["got"]


def _forbidden(loaded) -> list[str]:
    return [m for m in loaded if m == "textual" or m.startswith("textual.") or m.split(".")[0] in GENERIC]


@pytest.mark.parametrize("module", HEADLESS)
def test_headless_modules_do_not_load_textual(module: str):
    union = loaded_by_all_headless()
    if not isinstance(union, str) and module in union and not _forbidden(union):
        return  # none of them loads textual or a generic name, so neither does this one
    loaded = loaded_by(module)  # something does: the module's own fork says whether it is this one
    assert not [m for m in loaded if m == "textual" or m.startswith("textual.")], f"{module} loads textual"
    assert not [m for m in loaded if m.split(".")[0] in GENERIC], f"{module} loads a generic top-level name"


def test_the_probe_sees_textual_when_it_is_loaded():
    """Positive control: the front door does load textual, and the probe says so."""
    assert "textual" in loaded_by("stepwatch.tui.app")
    assert _forbidden(loaded_by("stepwatch.tui.app"))  # what the union of the headless modules is checked for


def test_the_emitter_loads_only_the_standard_library():
    loaded = loaded_by("stepwatch.telemetry")
    stdlib = sys.stdlib_module_names
    foreign = sorted({m.split(".")[0] for m in loaded} - set(stdlib) - {"stepwatch"})
    assert not foreign, f"stepwatch.telemetry loads non-stdlib packages at import: {foreign}"
    for heavy in ("torch", "transformers", "textual", "psutil", "sortedcontainers"):
        assert heavy not in loaded


def test_numpy_is_loaded_by_a_backlog_only():
    """A view of a short run never pays numpy's import (~0.1 s): the modules that fold, count and judge steps load it
    only when a backlog comes (ARCHITECTURE.md, "Attach: one optimisation")."""
    for module in ("stepwatch.monitors.snapshot.observer", "stepwatch.tui.app"):
        assert "numpy" not in {m.split(".")[0] for m in loaded_by(module)}, module


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


def code_lines(text: str) -> int:
    """The lines of a module that hold code: comments, blank lines and docstrings (a module's, a class's, a
    function's) are reading help, never size."""
    docs: set[int] = set()
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) and isinstance(first.value.value, str):
                docs.update(range(first.lineno, (first.end_lineno or first.lineno) + 1))
    skip = {tokenize.COMMENT, tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT, tokenize.ENCODING,
            tokenize.ENDMARKER}
    lines: set[int] = set()
    for tok in tokenize.generate_tokens(io.StringIO(text).readline):
        if tok.type not in skip:
            lines.update(range(tok.start[0], tok.end[0] + 1))
    return len(lines - docs)


def test_code_lines_counts_code_and_leaves_comments_and_docstrings_out():
    commented = '"""A module.\n\nIts story."""\n' + "# a note\n" * 500 + "\n\nX = 1\n"
    assert code_lines(commented) == 1  # 503 lines of reading help and one of code
    fn = 'def f():\n    """Doc."""\n    return (1,\n            2)  # two lines of one statement\n'
    assert code_lines(fn) == 3
    assert code_lines("x = 1\n" * 401) == 401
    assert code_lines('X = """not a docstring:\na value"""\n') == 2  # a string that is a value is code


def test_no_module_is_over_the_size_a_newcomer_reads():
    """~320 lines of code a module (about 400 with its comments and docstrings); the fallback detector's one class
    and NVML's backend (documented exceptions), the emitter's core, the argument parser (a few lines per subcommand),
    the text log's reader and the snapshot's observer are allowed more."""
    allowed = {"stepwatch.monitors.detectors.fallback": 520, "stepwatch.monitors.gpu.backend": 600,
               "stepwatch.telemetry.core": 450, "stepwatch.tui.cli": 370, "stepwatch.monitors.readers.textlog": 360,
               "stepwatch.monitors.snapshot.observer": 330}
    over = {m: n for m, f in MODULES.items() if (n := code_lines(f.read_text())) > allowed.get(m, 320)}
    assert not over, over


# ----------------------------------------------------------------------------- citations stay in the repository

#: The product's own words: code, docs and configuration under these folders, and the top-level files.
PRODUCT_DIRS = ("launcher", "monitors", "tui", "assets", "tools", "bench")
PRODUCT_SUFFIXES = (".py", ".toml", ".md")
TOP_FILES = ("pyproject.toml", "README.md", "ARCHITECTURE.md")
#: A citation of something a clone does not have: the design notes and the shared folder beside the
#: checkout (its notes, its seeds, the playbook's excerpt), or an absolute path of the machine that wrote it.
OUTSIDE = re.compile(r"DESIGN\.md|\.\./shared|shared/(?:notes|seeds|fixtures)|playbook-excerpt|measured-floors\.md"
                     r"|STYLE\.md|(?<![\w.-])/work\b")


def product_files(root: Path = REPO_ROOT) -> list[Path]:
    files = [root / n for n in TOP_FILES if (root / n).is_file()]
    for d in PRODUCT_DIRS:
        files += sorted(p for p in (root / d).rglob("*")
                        if p.suffix in PRODUCT_SUFFIXES and p.is_file() and "__pycache__" not in p.parts)
    return files


def outside_citations(files: list[Path], root: Path = REPO_ROOT) -> list[str]:
    """``file:line: match`` for each citation of a file outside the repository."""
    hits = []
    for f in files:
        for no, line in enumerate(f.read_text(encoding="utf-8", errors="replace").splitlines(), 1):
            hits += [f"{f.relative_to(root)}:{no}: {m.group(0)}" for m in OUTSIDE.finditer(line)]
    return hits


def test_no_product_file_cites_a_file_outside_the_repository():
    files = product_files()
    names = {str(f.relative_to(REPO_ROOT)) for f in files}
    # a control for the walk: an empty or partial walk would pass anything
    assert {"ARCHITECTURE.md", "README.md", "pyproject.toml", "monitors/detectors/fallback.py", "bench/README.md",
            "tools/mutation/targets.toml", "tui/cli.py"} <= names
    assert len(files) > 100
    assert outside_citations(files) == []


def test_the_citation_check_catches_a_planted_citation(tmp_path: Path):
    """Positive control: each kind of outside citation planted in a product file is found, with its
    place; the same file without it passes (negative control)."""
    (tmp_path / "monitors").mkdir()
    planted = ["(DESIGN.md section 5)", "(playbook: ../shared/seeds/playbook-excerpt.md)",
               "see shared/notes/measured-floors.md", "/work/shared/STYLE.md", "/work"]
    mod = tmp_path / "monitors" / "planted.py"
    mod.write_text('"""A module."""\n' + "".join(f"# {p}\n" for p in planted))
    (tmp_path / "README.md").write_text("Clean: /workspace, network/work, ARCHITECTURE.md R1.\n")
    hits = outside_citations(product_files(tmp_path), tmp_path)
    assert sorted({int(h.split(":")[1]) for h in hits}) == [2, 3, 4, 5, 6], hits  # each planted line, once or more
    assert all(h.startswith("monitors/planted.py:") for h in hits), hits  # nothing in the clean README
    mod.write_text('"""A module."""\n# (ARCHITECTURE.md, "Rules of the code")\n')
    assert outside_citations(product_files(tmp_path), tmp_path) == []


ARCH_RULE = re.compile(r"ARCHITECTURE\.md(?:'s)?(?: rules?)?,? (R\d+(?:(?:-|, | and )R\d+)*)")
ARCH_SECTION = re.compile(r'ARCHITECTURE\.md(?:\'s)?,? \\?"([^"\\]+)\\?"')


def dangling_architecture_citations(files: list[Path], architecture: str, root: Path = REPO_ROOT) -> list[str]:
    """Citations of a rule (``ARCHITECTURE.md R7``, ``R1-R3``) or a section (``ARCHITECTURE.md, "Heading"``)
    that ARCHITECTURE.md does not have. Line breaks and comment markers inside a citation are read as spaces."""
    rules = set(re.findall(r"^- \*\*(R\d+) ", architecture, re.M))
    sections = {h.strip() for h in re.findall(r"^#+ (.+)$", architecture, re.M)}
    bad = []
    for f in files:
        text = re.sub(r"\s*\n\s*(?:#:?\s*)?", " ", f.read_text(encoding="utf-8", errors="replace"))
        for m in ARCH_RULE.finditer(text):
            bad += [f"{f.relative_to(root)}: {r}" for r in re.findall(r"R\d+", m.group(1)) if r not in rules]
        bad += [f"{f.relative_to(root)}: {m.group(1)!r}" for m in ARCH_SECTION.finditer(text)
                if m.group(1) not in sections]
    return bad


def test_citations_of_architecture_name_rules_and_sections_it_has():
    architecture = (REPO_ROOT / "ARCHITECTURE.md").read_text(encoding="utf-8")
    files = product_files()
    cited = sum(len(ARCH_RULE.findall(f.read_text(encoding="utf-8"))) for f in files)
    assert cited > 10  # the code does cite it: a pattern that finds nothing would pass anything
    assert dangling_architecture_citations(files, architecture) == []


def test_the_architecture_check_catches_a_dangling_citation(tmp_path: Path):
    """Positive control: a rule number and a heading ARCHITECTURE.md lacks are found; real ones pass."""
    architecture = "# Arch\n\n## Files are the state\n\n- **R1 Nearest-rank.** ...\n- **R2 First step.** ...\n"
    (tmp_path / "tui").mkdir()
    f = tmp_path / "tui" / "x.py"
    f.write_text('"""Cites ARCHITECTURE.md R1-R2 and ARCHITECTURE.md, "Files are the state"."""\n')
    assert dangling_architecture_citations([f], architecture, tmp_path) == []
    f.write_text('"""Cites ARCHITECTURE.md R1, R9 and ARCHITECTURE.md, "Files are\n    the states"."""\n')
    assert dangling_architecture_citations([f], architecture, tmp_path) == ["tui/x.py: R9", "tui/x.py: 'Files are the states'"]
