"""The README's commands on a fresh machine: a clone with no ../shared beside it passes the tests it can run and
skips the rest with the missing path named; where every snapshot test runs, an unused snapshot still fails; the
Quick start's first command installs and starts dltop, on the system's own Python where it has one."""

from __future__ import annotations

import glob
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO

SNAPSHOT_MODULES = ["tests/test_cpu_pane.py", "tests/test_snapshots.py"]


def copy_tree(dest: Path) -> Path:
    """This working tree's files (tracked and untracked, not ignored) copied to `dest`, which has no shared/
    beside it: what `git clone` gives a user, with this checkout's uncommitted changes in it."""
    names = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=REPO,
                           capture_output=True, check=True).stdout.split(b"\0")
    for name in filter(None, names):
        src = REPO / os.fsdecode(name)
        if src.is_file():  # a deleted, not yet committed file is still listed
            (dest / os.fsdecode(name)).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / os.fsdecode(name))
    assert not (dest.parent / "shared").exists()
    return dest


def pytest_in(tree: Path, *args: str) -> subprocess.CompletedProcess[str]:
    # Not as an xdist worker: syrupy takes PYTEST_XDIST_WORKER for one, and a worker leaves unused snapshots to
    # its controller (this run has none)
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_XDIST")}
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-rs", *args],
                          cwd=tree, capture_output=True, text=True, timeout=300, env=env)


@pytest.fixture(scope="module")
def clone(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return copy_tree(tmp_path_factory.mktemp("bare") / "dltop")


def test_snapshot_tests_pass_without_shared_fixtures(clone: Path) -> None:
    r = pytest_in(clone, *SNAPSHOT_MODULES)
    assert r.returncode == 0, r.stdout + r.stderr
    missing = clone.parent / "shared" / "fixtures" / "cpu-dumps"
    assert "SKIPPED [4] tests/test_cpu_pane.py" in r.stdout and f"fixtures not found at {missing}" in r.stdout
    assert "4 snapshot tests skip" in r.stdout
    # syrupy would delete the skipped tests' snapshots on an update: refused, and they stay.
    u = pytest_in(clone, *SNAPSHOT_MODULES, "--snapshot-update")
    assert u.returncode == pytest.ExitCode.USAGE_ERROR and "--snapshot-update refused" in u.stderr
    assert len(list((clone / "tests" / "__snapshots__" / "test_cpu_pane").glob("*.svg"))) == 4


def test_an_unused_snapshot_fails_where_every_snapshot_test_runs(clone: Path) -> None:
    gone = clone / "tests" / "__snapshots__" / "test_snapshots" / "test_removed_pane[80x24].svg"
    shutil.copy(clone / "tests" / "__snapshots__" / "test_snapshots" / "test_help_screen[80x24].svg", gone)
    try:
        r = pytest_in(clone, "tests/test_snapshots.py")
    finally:
        gone.unlink()
    assert r.returncode != 0 and "1 snapshot unused" in r.stdout, r.stdout


def quick_start() -> list[str]:
    block = re.search(r"## Quick start\n.*?```sh\n(.*?)```", (REPO / "README.md").read_text(), re.S)
    assert block, "README has no Quick start block"
    return [line.split("#")[0].strip() for line in block.group(1).splitlines() if line.strip()]


def test_quick_start_is_one_command_to_run_dltop_and_the_one_ci_runs() -> None:
    run, test = quick_start()
    ci = [ln for ln in (REPO / ".ci" / "run").read_text().splitlines() if ln and not ln.startswith(("#", "set ", "cd "))]
    assert ci == [test]
    assert run.split()[0] == "scripts/dltop" and os.access(REPO / "scripts" / "dltop", os.X_OK)


@pytest.mark.slow
def test_quick_start_installs_and_runs_dltop_on_the_system_python(tmp_path: Path) -> None:
    # Debian's and Ubuntu's own Python refuses `pip install .` (PEP 668): the command must work there.
    managed = glob.glob("/usr/lib/python3*/EXTERNALLY-MANAGED")
    py = "/usr/bin/python3" if managed and os.access("/usr/bin/python3", os.X_OK) else sys.executable
    tree = copy_tree(tmp_path / "dltop")
    run = quick_start()[0].split()
    env = {**os.environ, "PY": py, "VENV": str(tmp_path / "venv")}
    r = subprocess.run([*run, "--version"], cwd=tree, env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    version = re.search(r'__version__ = "(.*)"', (REPO / "dltop" / "__init__.py").read_text())
    assert version and version.group(1) in r.stdout
    assert (tmp_path / "venv" / "bin" / "dltop").exists()
    assert "first run: installing" in r.stderr  # not ~20 s of a silent terminal
