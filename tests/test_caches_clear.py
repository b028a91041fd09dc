"""Clearing caches through the one action runner, on real trees: what it removes is what du said, a symlink
never leads it outside, races between listing and deleting cannot either, and every refusal has its reason."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from dltop.actions import caches as clear_mod
from dltop.actions.caches import ClearOptions
from dltop.actions.runner import SPECS, ActionRunner
from dltop.errors import DltopError
from dltop.model.actions import ActionEvent, ActionPlan
from tests.test_caches_util import (
    copy_cache,
    du_bytes,
    find_files,
    inductor_cache_fixture,  # noqa: F401  (the `inductor_cache` fixture)
)
from tests.test_pagecache_util import IS_ROOT, needs_root


@pytest.fixture
def known(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """A folder that is the TorchInductor cache of dltop's own environment."""
    cache = tmp_path / "inductor"
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(cache))
    return cache


def _events(runner: ActionRunner) -> list[ActionEvent]:
    events: list[ActionEvent] = []
    runner.subscribe(events.append)
    return events


def _fill(root: Path, dirs: int = 3, files: int = 20, size: int = 5000) -> None:
    for d in range(dirs):
        (root / f"d{d}").mkdir(parents=True, exist_ok=True)
        for i in range(files):
            (root / f"d{d}" / f"f{i}").write_bytes(os.urandom(size))


def test_the_action_table_keeps_warm_evict_lock_and_adds_clear() -> None:
    assert set(SPECS) == {"warm", "evict", "lock", "clear", "signal"} and all(s.risky for s in SPECS.values())
    assert SPECS["clear"].verb == "Clear"
    run = ActionRunner().plan("frob", ["/x"], wait=True)
    assert isinstance(run.error, DltopError) and "unknown action: frob" in str(run.error)


def test_a_real_inductor_cache_is_cleared_by_exactly_what_du_counted(inductor_cache: Path, known: Path) -> None:
    copy_cache(inductor_cache, known)
    before, files = du_bytes(known), find_files(known)
    runner = ActionRunner()
    events = _events(runner)
    plan = runner.plan("clear", [str(known)], wait=True).result
    assert isinstance(plan, ActionPlan) and plan.allowed and plan.files == files
    assert plan.bytes == before - os.lstat(known).st_blocks * 512  # the folder itself stays
    assert any("folder itself stays" in n for n in plan.notes)
    run = runner.start("clear", [str(known)], wait=True)
    assert run.error is None, run.error
    r = run.result
    assert known.is_dir() and find_files(known) == 0 and list(known.iterdir()) == []
    assert r.done_bytes == before - du_bytes(known) and r.files_done == files and not r.cancelled
    last = events[-1]
    assert last.outcome == "ok" and last.message.startswith("cleared ") and last.done_bytes == r.done_bytes
    progress = [e for e in events if e.step == "run" and e.phase == "progress"]
    assert progress and progress[-1].done_bytes == r.done_bytes and progress[-1].total_bytes == plan.bytes


def test_one_entry_is_cleared_and_the_rest_stays(inductor_cache: Path, known: Path) -> None:
    copy_cache(inductor_cache, known)
    entry = known / "fxgraph"
    gone = du_bytes(entry)
    rest = {p.name for p in known.iterdir()} - {"fxgraph"}
    run = ActionRunner().start("clear", [str(entry)], wait=True)
    assert run.error is None and run.result.done_bytes == gone
    assert {p.name for p in known.iterdir()} == rest


def test_a_symlink_inside_pointing_outside_is_removed_and_its_target_survives(known: Path, tmp_path: Path) -> None:
    outside = tmp_path / "precious"
    (outside / "sub").mkdir(parents=True)
    (outside / "sub" / "data.bin").write_bytes(b"keep me" * 1000)
    (outside / "file.bin").write_bytes(b"and me")
    _fill(known, dirs=1, files=3)
    os.symlink(outside, known / "d0" / "to-dir")
    os.symlink(outside / "file.bin", known / "tmpfile.py")  # named as Inductor names its files
    run = ActionRunner().start("clear", [str(known)], wait=True)
    assert run.error is None
    assert list(known.iterdir()) == []
    assert (outside / "sub" / "data.bin").read_bytes() == b"keep me" * 1000 and (outside / "file.bin").exists()


@pytest.mark.parametrize("what", ["dir", "file"])
def test_a_race_that_swaps_an_entry_for_a_symlink_cannot_delete_outside(
        known: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, what: str) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "victim.bin").write_bytes(b"x" * 4096)
    _fill(known, dirs=2, files=3)
    (known / "memoizer_cache.json").write_bytes(b"y" * 100)
    real = os.scandir
    swapped = []

    def racing(fd):  # list and stat as the clear does, then swap before it deletes
        with real(fd) as it:
            entries = list(it)
        for e in entries:
            e.stat(follow_symlinks=False)
        if not swapped and any(e.name == "d0" for e in entries):
            swapped.append(True)
            if what == "dir":
                os.rename(known / "d0", tmp_path / "d0-moved")
                os.symlink(outside, known / "d0")
            else:
                (known / "memoizer_cache.json").unlink()
                os.symlink(outside / "victim.bin", known / "memoizer_cache.json")
        return _Listing(entries)

    monkeypatch.setattr(clear_mod, "_scandir", racing)
    run = ActionRunner().start("clear", [str(known)], wait=True)
    assert run.error is None and swapped
    assert (outside / "victim.bin").read_bytes() == b"x" * 4096  # never followed
    assert not (known / "d0").is_symlink() and not (known / "memoizer_cache.json").exists()


def test_an_entry_reached_through_a_symlink_in_the_cache_is_refused(known: Path, tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    (outside / "b").mkdir(parents=True)
    (outside / "b" / "victim.bin").write_bytes(b"v" * 1000)
    known.mkdir()
    os.symlink(outside, known / "a")  # known/a/b/victim.bin is lexically inside the cache
    target = known / "a" / "b" / "victim.bin"
    run = ActionRunner().start("clear", [str(target)], wait=True)
    assert isinstance(run.error, DltopError) and "is a symbolic link on the way" in str(run.error)
    plan = ActionRunner().plan("clear", [str(target)], wait=True).result
    assert not plan.allowed and plan.bytes == 0
    # and if the link is swapped in after the checks, the descent by fds with O_NOFOLLOW refuses it too
    with pytest.raises(DltopError, match="a symbolic link on the way"):
        clear_mod.open_parent(str(target), str(known))
    assert (outside / "b" / "victim.bin").read_bytes() == b"v" * 1000


class _Listing(list):
    def __enter__(self):
        return self

    def __exit__(self, *a):
        return False


@needs_root
def test_another_users_cache_is_refused(known: Path) -> None:
    _fill(known, dirs=1, files=2)
    os.chown(known, 65534, 65534)
    runner = ActionRunner()
    plan = runner.plan("clear", [str(known)], wait=True).result
    assert not plan.allowed and "owned by nobody (uid 65534), not by this user" in plan.guard
    run = runner.start("clear", [str(known)], wait=True)
    assert isinstance(run.error, DltopError) and "owned by nobody" in str(run.error)
    assert find_files(known) == 2  # nothing deleted


@pytest.mark.parametrize("target", ["/", "home", "/proc", "unknown", "symlink"])
def test_refusals(target: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    options = ClearOptions()
    if target == "home":
        target = os.path.expanduser("~")
        options = ClearOptions(caches=(target,))  # even added as a cache
    elif target == "/proc":
        options = ClearOptions(caches=("/proc",))
    elif target == "unknown":
        target = str(tmp_path)
    elif target == "symlink":
        (tmp_path / "real").mkdir()
        os.symlink(tmp_path / "real", tmp_path / "link")
        monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "link"))
        target = str(tmp_path / "link")
    with pytest.raises(DltopError) as e:
        clear_mod.check(target, options)
    why = {"/": "/ is a system folder, not a cache", os.path.expanduser("~"): "is a home folder",
           "/proc": "/proc is a system folder",
           str(tmp_path): "is not a cache dltop knows", str(tmp_path / "link"): "is a symbolic link"}[target]
    assert why in str(e.value)


@needs_root
def test_a_mounted_tmpfs_is_refused_and_one_inside_a_cache_is_left_alone(known: Path) -> None:
    _fill(known, dirs=1, files=2)
    mnt = known / "mt"
    mnt.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mnt)], check=True)
    try:
        (mnt / "inside").write_bytes(b"z" * 1000)
        with pytest.raises(DltopError, match="is a mount point"):
            clear_mod.check(str(mnt), ClearOptions(caches=(str(mnt),)))
        r = clear_mod.clear(str(known), ClearOptions())
        assert (mnt / "inside").exists() and r.left == {"other filesystem": 1}
        assert not (known / "d0").exists()
    finally:
        subprocess.run(["umount", str(mnt)], check=True)


def test_a_cancel_mid_clear_reports_what_was_measured(known: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _fill(known, dirs=8, files=30)
    before, files = du_bytes(known), find_files(known)
    runner = ActionRunner()
    events = _events(runner)
    real = os.scandir
    listed = []

    def cancelling(fd):
        listed.append(fd)
        if len(listed) == 4:  # the root and three folders listed: stop
            runner.cancel()
        return real(fd)

    monkeypatch.setattr(clear_mod, "_scandir", cancelling)
    run = runner.start("clear", [str(known)], wait=True)
    r = run.result
    assert r.cancelled and events[-1].outcome == "cancelled" and "(cancelled)" in events[-1].message
    assert 0 < r.files_done < files and r.files_done == files - find_files(known)
    assert r.done_bytes == before - du_bytes(known)  # measured as it deleted, not planned


def test_the_plan_warns_when_a_process_has_files_open_there(known: Path) -> None:
    _fill(known, dirs=1, files=1)
    f = known / "d0" / "f0"
    job = subprocess.Popen([sys.executable, "-c", f"f = open({str(f)!r}); print(flush=True); import time; "
                            "time.sleep(60)"], stdout=subprocess.PIPE)
    try:
        job.stdout.readline()
        plan = ActionRunner().plan("clear", [str(known)], wait=True).result
        assert plan.allowed and any(f"PID {job.pid} (python" in n and "files open there" in n for n in plan.notes)
    finally:
        job.kill()
        job.wait()


def test_the_plan_names_the_tools_own_clear_command(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    hub = tmp_path / "hub"
    hub.mkdir()
    monkeypatch.setenv("HF_HUB_CACHE", str(hub))
    plan = ActionRunner().plan("clear", [str(hub)], wait=True).result
    assert any("its own clear command: hf cache rm" in n for n in plan.notes)


def test_a_dry_run_changes_nothing(known: Path) -> None:
    _fill(known, dirs=2, files=2)
    r = clear_mod.clear(str(known), ClearOptions(), dry_run=True)
    assert r.dry_run and r.files == 4 and find_files(known) == 4 and r.done_bytes == 0


@pytest.mark.skipif(IS_ROOT is False, reason="needs root to chown")
def test_an_entry_of_another_user_inside_ones_own_cache_is_refused(known: Path) -> None:
    _fill(known, dirs=2, files=1)
    os.chown(known / "d1", 65534, 65534)
    with pytest.raises(DltopError, match="owned by nobody"):
        clear_mod.check(str(known / "d1"), ClearOptions())
