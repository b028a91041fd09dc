"""Helpers for the page-cache tests (real files on a disk filesystem, fincore and vmtouch as referees)."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from dltop import kernel

PS = kernel.PAGE_SIZE
IS_ROOT = os.geteuid() == 0
NOBODY = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]
REPO = Path(__file__).resolve().parents[1]
needs_root = pytest.mark.skipif(not IS_ROOT, reason="needs root (mount, setpriv, mknod)")
needs_fincore = pytest.mark.skipif(shutil.which("fincore") is None, reason="fincore (util-linux) not installed")
needs_vmtouch = pytest.mark.skipif(shutil.which("vmtouch") is None, reason="vmtouch not installed")


def disk_dir(tmp_path: Path) -> Path:
    """A fresh folder on a real disk filesystem (tmpfs pages cannot be evicted) that `nobody` can traverse."""
    for base in ("/var/tmp", str(tmp_path)):
        if os.path.isdir(base) and kernel.statfs_type(base) not in (kernel.TMPFS_MAGIC, kernel.RAMFS_MAGIC):
            break
    else:
        pytest.skip("no disk-backed temporary folder")
    d = Path(tempfile.mkdtemp(dir=base, prefix="dltop-test-"))
    os.chmod(d, 0o755)
    return d


@pytest.fixture(name="ddir")
def ddir_fixture(tmp_path: Path) -> Iterator[Path]:
    d = disk_dir(tmp_path)
    yield d
    shutil.rmtree(d, ignore_errors=True)


def make_file(path: Path, nbytes: int, mode: int = 0o644) -> Path:
    """A file of random bytes, written, synced and evicted: 0 pages in the page cache."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "wb") as f:
        f.write(os.urandom(nbytes))
        f.flush()
        os.fsync(f.fileno())
    os.chmod(path, mode)
    evict_file(path)
    return path


def evict_file(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fdatasync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def read_file(path: Path) -> None:
    with open(path, "rb") as f:
        while f.read(1 << 20):
            pass


def resident(path: Path | str) -> int:
    fd = os.open(path, os.O_RDONLY)
    try:
        return kernel.cachestat(fd).cache
    finally:
        os.close(fd)


def fincore_resident_pages(*paths: Path | str) -> dict[str, int]:
    """Resident pages per file, as `fincore -J` reports them."""
    out = subprocess.run(["fincore", "-J", "-b", "-o", "PAGES,SIZE,FILE", *map(str, paths)],
                         capture_output=True, text=True, check=True).stdout
    return parse_fincore_json(out)


def parse_fincore_json(text: str) -> dict[str, int]:
    rows = json.loads(text)["fincore"]
    return {r["file"]: int(r["pages"]) for r in rows}


_VMTOUCH_RE = re.compile(r"Resident Pages:\s+(\d+)/(\d+)")


def parse_vmtouch(text: str) -> tuple[int, int]:
    """(resident, total) pages from vmtouch's summary."""
    m = _VMTOUCH_RE.search(text)
    if m is None:
        raise ValueError("no 'Resident Pages' line")
    return int(m.group(1)), int(m.group(2))


def vmtouch_pages(path: Path | str, *flags: str) -> tuple[int, int]:
    out = subprocess.run(["vmtouch", *flags, str(path)], capture_output=True, text=True, check=True).stdout
    return parse_vmtouch(out)


def run_as_nobody(code: str, *args: str, timeout: float = 30) -> subprocess.CompletedProcess[str]:
    """Run Python code as user `nobody` (no capabilities) with this repository importable."""
    env = {"PYTHONPATH": str(REPO), "PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": "/"}
    return subprocess.run([*NOBODY, sys.executable, "-c", code, *args], capture_output=True, text=True,
                          env=env, timeout=timeout, cwd="/")


def walk_files(root: Path) -> Iterator[Path]:
    for dirpath, _dirs, files in os.walk(root):
        for f in files:
            yield Path(dirpath) / f


@given(st.integers(0, 10**9), st.integers(0, 10**9), st.text(max_size=40))
def test_parse_vmtouch_reads_the_summary_anywhere(res: int, total: int, noise: str) -> None:
    text = f"{noise}\n           Files: 3\n  Resident Pages: {res}/{total}  1M/2M  50%\n{noise}"
    assert parse_vmtouch(text) == (res, total)


@given(st.lists(st.tuples(st.text(min_size=1, max_size=30), st.integers(0, 2**40)), max_size=5))
def test_parse_fincore_json(rows: list[tuple[str, int]]) -> None:
    data = {"fincore": [{"pages": p, "size": p * PS, "file": f} for f, p in rows]}
    assert parse_fincore_json(json.dumps(data)) == {f: p for f, p in rows}


# The kernel may free shadow entries itself (its shrinker of xarray nodes that hold only shadows), so the count
# of reclaimed pages can fall a few short: seen 1 or 2 pages in a few runs.
SHADOW_SLACK = 16


def reclaimed_pages(files: list[Path]) -> int:
    """Pages of `files` reclaimed and not read again since: the shadow entries cachestat counts (DONTNEED, as
    evict uses it, leaves none)."""
    from dltop import kernel

    total = 0
    for f in files:
        fd = os.open(f, os.O_RDONLY)
        try:
            total += kernel.cachestat(fd).evicted
        finally:
            os.close(fd)
    return total
