"""Packaging, as a user sees it: the wheel publishes one top-level package, ``stepwatch``.

The repository's folders ``assets/ launcher/ monitors/ tui/`` are published as ``stepwatch.*`` and
``monitors/telemetry/`` as ``stepwatch.telemetry`` (pyproject.toml ``[tool.setuptools]``). Before,
the wheel installed generic top-level packages: another distribution shipping a top-level
``monitors`` overwrote stepwatch's files, and uninstalling it deleted them.

The fast test reads pyproject.toml. The slow tests build a real wheel from a copy of this checkout,
install it NON-editable into a fresh venv beside a distribution that ships top-level ``monitors``,
``tui`` and ``launcher``, and run the real CLI, a training-job script and the demo in subprocesses
from a directory outside the checkout. The fresh venv borrows the dependencies (textual, torch, ...)
from the venv running the tests through a ``.pth`` line; the outer venv's editable stepwatch is not
visible through it (``.pth`` files in a directory added by a ``.pth`` line are not processed), and
the fixture checks that.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import shutil
import subprocess
import sys
import sysconfig
import textwrap
import tomllib
from importlib import metadata
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[1]
PYPROJECT = REPO_ROOT / "pyproject.toml"
#: The repository's top-level folders the wheel publishes under ``stepwatch.``.
SOURCE_FOLDERS = ("assets", "launcher", "monitors", "tui")
CLASH_DIST = "clashing-generic-names"
CLASH_PACKAGES = ("monitors", "tui", "launcher")


def _setuptools_cfg() -> dict:
    return tomllib.loads(PYPROJECT.read_text())["tool"]["setuptools"]


def _version() -> str:
    return tomllib.loads(PYPROJECT.read_text())["project"]["version"]


def _package_name(folder: Path, package_dir: dict[str, str]) -> str | None:
    """The import name of repo folder ``folder`` (relative path) under ``package_dir``: the longest
    mapped folder that contains it, plus the remaining path components; None when none contains it."""
    best: tuple[int, str] | None = None
    for name, src in package_dir.items():
        src_parts = Path(src).parts
        if folder.parts[: len(src_parts)] == src_parts and (best is None or len(src_parts) > best[0]):
            best = (len(src_parts), ".".join((name, *folder.parts[len(src_parts):])))
    return best[1] if best else None


def _package_folders() -> list[Path]:
    """Folders under SOURCE_FOLDERS that hold an ``__init__.py`` (relative to the repo root)."""
    found = []
    for top in SOURCE_FOLDERS:
        for init in sorted((REPO_ROOT / top).rglob("__init__.py")):
            if "__pycache__" not in init.parts:
                found.append(init.parent.relative_to(REPO_ROOT))
    return found


# --------------------------------------------------------------------------------------------------
# Fast: pyproject.toml lists exactly the package folders, under their stepwatch.* names.


def test_pyproject_lists_every_package_folder_under_stepwatch_and_nothing_else():
    cfg = _setuptools_cfg()
    packages = cfg["packages"]
    package_dir = cfg["package-dir"]
    assert len(packages) == len(set(packages)), f"duplicates in [tool.setuptools] packages: {packages}"
    assert all(p.startswith("stepwatch.") for p in packages), (
        f"a package outside the stepwatch namespace: {[p for p in packages if not p.startswith('stepwatch.')]}")
    assert "stepwatch" not in packages and "stepwatch" not in package_dir  # a PEP 420 namespace

    # package-dir: each of the repo's source folders is mapped, the emitter separately
    assert {package_dir[f"stepwatch.{top}"] for top in SOURCE_FOLDERS} == set(SOURCE_FOLDERS), package_dir
    assert package_dir.get("stepwatch.telemetry") == "monitors/telemetry", package_dir
    for name, src in package_dir.items():
        assert (REPO_ROOT / src / "__init__.py").is_file(), f"package-dir {name!r} -> {src!r}: no __init__.py there"

    folders = _package_folders()
    expected = {str(f): _package_name(f, package_dir) for f in folders}
    unmapped = [f for f, name in expected.items() if name is None]
    assert not unmapped, f"package folders no package-dir entry covers: {unmapped}"
    missing = {f: n for f, n in expected.items() if n not in packages}
    assert not missing, f"package folders not in [tool.setuptools] packages (folder -> name): {missing}"
    extra = sorted(set(packages) - set(expected.values()))
    assert not extra, f"[tool.setuptools] packages without a package folder: {extra}"
    assert expected["monitors/telemetry"] == "stepwatch.telemetry"
    assert "stepwatch.monitors.telemetry" not in packages  # published once, as stepwatch.telemetry


def test_no_stepwatch_init_in_the_repo_root():
    # `stepwatch` is a namespace package: a regular stepwatch/ package in a checkout's root would
    # shadow the installed one for anything run from there.
    assert not (REPO_ROOT / "stepwatch" / "__init__.py").exists(), "stepwatch/__init__.py must not exist"
    assert not (REPO_ROOT / "stepwatch.py").exists()


# --------------------------------------------------------------------------------------------------
# Slow: a real wheel in a fresh venv beside a distribution with clashing top-level packages.


def _run(argv: list[str], *, cwd: Path, env: dict[str, str], timeout: float = 120, check: bool = True,
         ) -> subprocess.CompletedProcess[str]:
    p = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    if check and p.returncode != 0:
        pytest.fail(f"{argv} in {cwd} exited {p.returncode}\n--- stdout:\n{p.stdout[-4000:]}\n"
                    f"--- stderr:\n{p.stderr[-4000:]}")
    return p


def _no_isolation_ok() -> bool:
    """setuptools>=77 (build-system requires) importable here, so wheels build without PyPI."""
    try:
        v = metadata.version("setuptools")
    except metadata.PackageNotFoundError:
        return False
    try:
        return int(v.split(".")[0]) >= 77
    except ValueError:
        return False


def _build_wheel(src: Path, out: Path, env: dict[str, str]) -> Path:
    argv = [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(out)]
    if _no_isolation_ok():
        argv.append("--no-build-isolation")
    before = set(out.glob("*.whl"))
    _run([*argv, str(src)], cwd=src, env=env, timeout=300)
    (whl,) = set(out.glob("*.whl")) - before
    return whl


def _copy_checkout(dst: Path) -> Path:
    """The files the build reads, copied (a build in the checkout would leave build/ and *.egg-info)."""
    dst.mkdir()
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info", "build", "dist")
    for top in SOURCE_FOLDERS:
        shutil.copytree(REPO_ROOT / top, dst / top, ignore=ignore)
    for f in REPO_ROOT.iterdir():
        if f.is_file() and (f.name == "pyproject.toml" or f.name.upper().startswith(("README", "LICENSE"))):
            shutil.copy2(f, dst / f.name)
    return dst


def _write_clash_project(root: Path) -> Path:
    """A distribution that ships top-level ``monitors``, ``tui`` and ``launcher`` packages, with a
    file name stepwatch's folders also have (``__init__.py``)."""
    root.mkdir()
    (root / "pyproject.toml").write_text(textwrap.dedent(f"""\
        [build-system]
        requires = ["setuptools>=61"]
        build-backend = "setuptools.build_meta"

        [project]
        name = "{CLASH_DIST}"
        version = "1.0"

        [tool.setuptools]
        packages = {json.dumps(list(CLASH_PACKAGES))}
        """))
    for pkg in CLASH_PACKAGES:
        (root / pkg).mkdir()
        (root / pkg / "__init__.py").write_text(f'CLASH = "{CLASH_DIST}:{pkg}"\n')
    return root


def _record_ok(site: Path, dist_info: Path) -> list[str]:
    """Problems with the installed files per RECORD: missing files and files whose hash changed."""
    problems = []
    for line in (dist_info / "RECORD").read_text().splitlines():
        path, _, rest = line.partition(",")
        digest = rest.partition(",")[0]
        f = (site / path).resolve()
        if not f.is_file():
            problems.append(f"missing: {path}")
        elif digest:
            algo, _, want = digest.partition("=")
            got = base64.urlsafe_b64encode(hashlib.new(algo, f.read_bytes()).digest()).rstrip(b"=").decode()
            if got != want:
                problems.append(f"changed: {path}")
    return problems


def _pip_show_files(venv_python: Path, cwd: Path, env: dict[str, str]) -> tuple[Path, list[str]]:
    out = _run([str(venv_python), "-m", "pip", "show", "-f", "stepwatch"], cwd=cwd, env=env).stdout
    location, files, in_files = None, [], False
    for line in out.splitlines():
        if line.startswith("Location:"):
            location = Path(line.partition(":")[2].strip())
        elif line.startswith("Files:"):
            in_files = True
        elif in_files and line.startswith("  "):
            files.append(line.strip())
        elif in_files:
            in_files = False
    assert location is not None and files, f"pip show -f stepwatch gave no Location/Files:\n{out}"
    return location, files


class Venv:
    def __init__(self, root: Path, python: Path, site: Path, bin: Path, wheel: Path, work: Path, env: dict[str, str]):
        self.root, self.python, self.site, self.bin, self.wheel, self.work, self.env = (
            root, python, site, bin, wheel, work, env)

    @property
    def stepwatch(self) -> str:
        return str(self.bin / "stepwatch")

    def py(self, code: str, *, cwd: Path | None = None, check: bool = True) -> subprocess.CompletedProcess[str]:
        script = (cwd or self.work) / "job.py"
        script.write_text(textwrap.dedent(code))
        return _run([str(self.python), str(script)], cwd=cwd or self.work, env=self.env, check=check)


@pytest.fixture(scope="module")
def venv(tmp_path_factory) -> Venv:
    tmp = tmp_path_factory.mktemp("packaging")
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "PYTHONHOME", "PYTHONSTARTUP", "VIRTUAL_ENV", "STEPWATCH_RUNS_DIR",
                        "STEPWATCH_RUN_DIR", "PIP_REQUIRE_VIRTUALENV")}
    env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
    env["PYTHONDONTWRITEBYTECODE"] = "1"

    wheels = tmp / "wheels"
    wheels.mkdir()
    stepwatch_whl = _build_wheel(_copy_checkout(tmp / "src-stepwatch"), wheels, env)
    clash_whl = _build_wheel(_write_clash_project(tmp / "src-clash"), wheels, env)

    root = tmp / "venv"
    _run([sys.executable, "-m", "venv", str(root)], cwd=tmp, env=env, timeout=180)
    python = root / "bin" / "python"
    site = Path(_run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                     cwd=tmp, env=env).stdout.strip())
    # The dependencies (textual, psutil, torch, transformers, ...) come from the venv running the tests.
    outer_site = sysconfig.get_paths()["purelib"]
    (site / "zz_outer_deps.pth").write_text(outer_site + "\n")
    env = dict(env, VIRTUAL_ENV=str(root), PATH=f"{root / 'bin'}{os.pathsep}{env.get('PATH', '')}")

    # stepwatch first, then the clashing distribution: that is the order that overwrote files before.
    for whl in (stepwatch_whl, clash_whl):
        _run([str(python), "-m", "pip", "install", "--no-deps", "-q", str(whl)], cwd=tmp, env=env, timeout=180)

    work = tmp / "elsewhere"  # a directory unrelated to the checkout
    work.mkdir()
    v = Venv(root, python, site, root / "bin", stepwatch_whl, work, env)
    p = v.py("""\
        import sys, stepwatch.monitors, stepwatch.tui.cli, importlib.metadata as md
        print(stepwatch.monitors.__file__)
        print(stepwatch.tui.cli.__file__)
        print(list(stepwatch.__path__))
        print(md.distribution("stepwatch").locate_file(""))
        print("\\n".join(sys.path))
        """)
    mon_file, cli_file, ns_path, dist_loc, *sys_path = p.stdout.splitlines()
    # the outer venv's editable finder is not active here: stepwatch is the installed wheel
    assert Path(mon_file).is_relative_to(site), f"stepwatch.monitors from {mon_file}, not from {site}"
    assert Path(cli_file).is_relative_to(site), cli_file
    assert ns_path == str([str(site / "stepwatch")]), f"stepwatch.__path__ = {ns_path}"
    assert Path(dist_loc) == site, f"importlib.metadata finds stepwatch at {dist_loc}"
    assert outer_site in sys_path and str(REPO_ROOT) not in sys_path, sys_path
    return v


@pytest.mark.slow
def test_wheel_holds_exactly_the_source_files_under_stepwatch(venv):
    """Every file of the package folders (data included) is in the wheel, at its stepwatch.* place,
    once; nothing else but the dist-info."""
    import zipfile

    package_dir = _setuptools_cfg()["package-dir"]
    expected = set()
    for folder in _package_folders():
        name = _package_name(folder, package_dir)
        for f in (REPO_ROOT / folder).iterdir():
            if f.is_file() and f.suffix != ".pyc":
                expected.add("/".join((*name.split("."), f.name)))
    # data folders inside a package (assets/gpu_recordings/)
    for folder in _package_folders():
        for sub in (REPO_ROOT / folder).iterdir():
            if sub.is_dir() and sub.name != "__pycache__" and not (sub / "__init__.py").exists():
                name = _package_name(folder, package_dir)
                for f in sub.rglob("*"):
                    if f.is_file() and "__pycache__" not in f.parts:
                        expected.add("/".join((*name.split("."), *f.relative_to(REPO_ROOT / folder).parts)))
    with zipfile.ZipFile(venv.wheel) as z:
        names = [n for n in z.namelist() if not n.endswith("/")]
    dist_info = [n for n in names if n.split("/")[0].endswith(".dist-info")]
    files = {n for n in names if n not in dist_info}
    assert all(n.split("/")[0] == "stepwatch" for n in files), sorted(n for n in files if not n.startswith("stepwatch/"))
    assert {n.split("/")[0] for n in dist_info} == {f"stepwatch-{_version()}.dist-info"}, dist_info
    assert not sorted(expected - files), f"source files missing from the wheel: {sorted(expected - files)}"
    assert not sorted(files - expected), f"files in the wheel that no package folder holds: {sorted(files - expected)}"
    assert "stepwatch/__init__.py" not in files
    # PEP 561: each top package says it is typed, so a checker reads the installed copy's annotations
    typed = {f"stepwatch/{p}/py.typed" for p in ("assets", "launcher", "monitors", "telemetry", "tui")}
    assert typed <= files, f"py.typed missing from the wheel: {sorted(typed - files)}"


@pytest.mark.slow
def test_cli_help(venv):
    p = _run([venv.stepwatch, "--help"], cwd=venv.work, env=venv.env)
    assert "usage: stepwatch" in p.stdout and "demo" in p.stdout, p.stdout


@pytest.mark.slow
def test_training_job_imports_the_emitter_and_the_clashing_monitors_coexist(venv):
    run_dir = venv.work / "job-run"
    run_dir.mkdir()
    p = venv.py(f"""\
        import json, os
        from stepwatch.telemetry import StepTelemetry
        tel = StepTelemetry(run_dir={str(run_dir)!r}, max_steps=3)
        for _ in range(3):
            tel.step_begin()
            tel.step_end(tokens=8, padded_tokens=8)
        tel.close()
        kinds = [json.loads(l)["kind"] for l in open(os.path.join({str(run_dir)!r}, "events.jsonl"))]
        import monitors, tui, launcher
        import stepwatch.monitors, stepwatch.tui, stepwatch.launcher, stepwatch.telemetry
        print(json.dumps({{
            "kinds": kinds,
            "clash": [monitors.CLASH, tui.CLASH, launcher.CLASH],
            "clash_files": [monitors.__file__, tui.__file__, launcher.__file__],
            "ours": [stepwatch.monitors.__file__, stepwatch.tui.__file__, stepwatch.launcher.__file__,
                     stepwatch.telemetry.__file__],
            "ours_have_clash": [hasattr(m, "CLASH") for m in
                                (stepwatch.monitors, stepwatch.tui, stepwatch.launcher, stepwatch.telemetry)],
        }}))
        """)
    r = json.loads(p.stdout.splitlines()[-1])
    assert r["kinds"][0] == "run_start" and r["kinds"].count("step") == 3 and r["kinds"][-1] == "run_end", r["kinds"]
    assert r["clash"] == [f"{CLASH_DIST}:{pkg}" for pkg in ("monitors", "tui", "launcher")], r
    assert r["clash_files"] == [str(venv.site / pkg / "__init__.py") for pkg in ("monitors", "tui", "launcher")], r
    assert r["ours"] == [str(venv.site / "stepwatch" / pkg / "__init__.py")
                         for pkg in ("monitors", "tui", "launcher", "telemetry")], r
    assert r["ours_have_clash"] == [False] * 4, r


@pytest.mark.slow
def test_demo_runs_headless_from_an_unrelated_directory(venv):
    cwd = venv.work / "demo-cwd"
    cwd.mkdir()
    p = _run([venv.stepwatch, "demo", "--no-tui", "--steps", "6", "--hidden", "32", "--layers", "1",
              "--seq-len", "32"], cwd=cwd, env=venv.env, timeout=240, check=False)
    assert p.returncode == 0, f"demo exited {p.returncode}\n--- stdout:\n{p.stdout[-4000:]}\n--- stderr:\n{p.stderr[-4000:]}"
    # the run used this venv's interpreter and the installed package, not the checkout
    run = json.loads((cwd / "runs" / "demo" / "run.json").read_text())
    assert run["argv"][0] == str(venv.python), run["argv"]
    s = json.loads(_run([venv.stepwatch, "status", "demo", "--json"], cwd=cwd, env=venv.env).stdout)
    assert s["state"] == "exited" and s["returncode"] == 0, {k: s.get(k) for k in ("state", "returncode")}
    assert s["step_seconds"]["n"] == 5, s["step_seconds"]  # 6 steps, the first (compile) left out


@pytest.mark.slow
def test_pip_show_lists_only_the_stepwatch_package(venv):
    location, files = _pip_show_files(venv.python, venv.work, venv.env)
    assert location == venv.site, location
    version = _version()
    bad = []
    for f in files:
        top = Path(f).parts[0]
        if top in ("stepwatch", f"stepwatch-{version}.dist-info"):
            continue
        if top == ".." and (location / f).resolve() == (venv.bin / "stepwatch").resolve():
            continue  # the console script
        bad.append(f)
    assert not bad, f"pip show -f stepwatch lists files outside stepwatch/ and its dist-info: {bad}"
    assert "stepwatch/__init__.py" not in files
    assert any(f.startswith("stepwatch/telemetry/") for f in files)


@pytest.mark.slow
def test_uninstalling_the_clashing_distribution_leaves_stepwatch_whole(venv):
    # runs last: it changes the venv
    _run([str(venv.python), "-m", "pip", "uninstall", "-y", CLASH_DIST], cwd=venv.work, env=venv.env)
    for pkg in CLASH_PACKAGES:
        assert not (venv.site / pkg).exists(), f"{pkg}/ left after uninstalling {CLASH_DIST}"

    location, files = _pip_show_files(venv.python, venv.work, venv.env)
    missing = [f for f in files if not (location / f).exists()]
    assert not missing, f"files pip show -f stepwatch lists that are gone: {missing}"
    version = _version()
    problems = _record_ok(location, location / f"stepwatch-{version}.dist-info")
    assert not problems, f"stepwatch's installed files differ from its RECORD: {problems}"

    p = _run([venv.stepwatch, "--help"], cwd=venv.work, env=venv.env)
    assert "usage: stepwatch" in p.stdout
    p = venv.py("""\
        from stepwatch.telemetry import StepTelemetry
        import stepwatch.tui.cli, stepwatch.launcher.launch, stepwatch.monitors.snapshot.observer
        try:
            import monitors
        except ModuleNotFoundError:
            print("no top-level monitors")
        else:
            print("monitors from", monitors.__file__)
        print(StepTelemetry.__module__)
        """)
    assert p.stdout.splitlines() == ["no top-level monitors", "stepwatch.telemetry.core"], p.stdout
    demo_cwd = venv.work / "demo-cwd"
    if (demo_cwd / "runs" / "demo").is_dir():  # the demo test ran: the observer still reads it
        s = json.loads(_run([venv.stepwatch, "status", "demo", "--json"], cwd=demo_cwd, env=venv.env).stdout)
        assert s["state"] == "exited" and s["returncode"] == 0, s["state"]
