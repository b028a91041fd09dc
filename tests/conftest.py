"""Shared test helpers: the shared fixtures folder, a capture of this machine's /proc, the recorded session."""

from __future__ import annotations

import inspect
import json
import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import hypothesis
import pytest
from _pytest.skipping import evaluate_skip_marks

from dltop.model import Snapshot

REPO = Path(__file__).resolve().parents[1]
SHARED_FIXTURES = REPO.parent / "shared" / "fixtures"
DATA = Path(__file__).resolve().parent / "data"

# Property tests check what comes out, not how fast: Hypothesis's 200 ms deadline per example is a timing
# assert, and on a loaded 2-core CI machine an example that takes 250 ms failed a run that was correct.
hypothesis.settings.register_profile("dltop", deadline=None, derandomize=True)  # CI runs what ran here
hypothesis.settings.load_profile("dltop")

# Snapshot tests print wall-clock times: render them in one zone everywhere.
os.environ["TZ"] = "UTC"
time.tzset()


@pytest.fixture(autouse=True)
def _private_action_journal(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each test's runners journal their actions, and its recorders tail, a root journal of its own: a recorder
    in one test would otherwise log the warm another test (or another user's suite) ran at the same moment.
    The tests of the journal itself that use /run/dltop take this off."""
    monkeypatch.setenv("DLTOP_ROOT_JOURNAL_DIR", str(tmp_path_factory.mktemp("journal") / "run-dltop"))


@pytest.fixture(autouse=True)
def _no_silent_reclaim(monkeypatch: pytest.MonkeyPatch) -> None:
    """A watched dataset's counts stay exact between measures in the tests: on a machine where DAMON's pageout
    runs (these VMs), every count would be an estimate. tests/test_datasets_silent.py takes this off."""
    monkeypatch.setenv("DLTOP_SILENT_RECLAIM", "off")


_SNAPSHOTS_SKIPPED = pytest.StashKey[str]()


# `make check`, the inner loop's tier, runs the tests not marked slow: parsers, sources on real files, model,
# hints, text. Slow are the Pilot tests (a Textual app each), the SVG pictures, and these files, which start
# processes, servers, tmux, torch.compile or a real training run (docs/development.md).
SLOW_FILES = frozenset({
    "test_alert_rules", "test_caches_browse", "test_caches_clear", "test_caches_confine", "test_caches_source",
    "test_capture_fuzz", "test_cli", "test_cluster", "test_datasets_files", "test_datasets_watch", "test_deploy",
    "test_exporter", "test_fresh_clone", "test_gpu_check", "test_gpu_signal", "test_hostile_screen",
    "test_hostile_user", "test_pagecache", "test_probe", "test_probe_frameworks", "test_prometheus",
    "test_record_cli", "test_recorder_hostile", "test_replay_cli", "test_report_fast", "test_terminal",
    "test_train_tiny", "test_training_hints", "test_kv", "test_probes_source", "test_recorder_ops",
    "test_cpu_dumps", "test_cpu_cli",  # every captured machine of ../shared/fixtures, lscpu beside each
    "test_gpu_cli",  # dltop gpu as a process, each twice
    "test_dump_template",  # a busy machine's recording made, and differential fuzzes of the dump's templates
    "test_probe_epochs", "test_training_ranks",  # real DataLoaders with workers; ranks stopped, killed, signalled
})
# and these tests of files that are otherwise quick: fuzzers of thousands of inputs, a walk of /proc
SLOW_TESTS = frozenset({
    "test_fuzz_generated_payloads_never_raise", "test_fuzz_mutated_real_payloads_never_raise",
    "test_residency_of_proc_as_root_skips_what_it_cannot_list", "test_cpuinfo_never_raises",
    "test_fuzz_generated_configs_never_raise", "test_ccsidr_plausibility_holds_for_every_captured_machine",
    "test_the_progress_line_and_an_interrupted_dump",  # dltop dump on a pty, Ctrl-C twice
    "test_the_kv_pool_in_bytes_comes_from_the_model_s_config_in_the_hub_cache",
    "test_generated_trees_walk_the_same_in_c_and_python",  # 150 trees made, walked twice, du and find on each
    "test_scan_leaks_nothing_on_any_path",  # every error path of the C walk, 300 times each
    "test_an_evict_drops_the_same_pages_both_ways",  # two trees made, warmed and evicted, fincore on each
})


def _mark_slow(items: list[pytest.Item]) -> None:
    for item in items:
        fn = getattr(item, "function", None)
        if (item.path.stem in SLOW_FILES or getattr(fn, "__name__", "") in SLOW_TESTS
                or "snap_compare" in getattr(item, "fixturenames", ())
                or inspect.iscoroutinefunction(fn)):
            item.add_marker(pytest.mark.slow)


def pytest_configure(config: pytest.Config) -> None:
    # The optional C modules are built from their sources before the tests (the controller only, not each xdist
    # worker): a .c edited since the install is never tested through a stale .so. Without a compiler nothing is
    # built and the tests of the C side skip, saying why (dltop.native.status()).
    if os.environ.get("PYTEST_XDIST_WORKER") is None:
        import importlib.util

        spec = importlib.util.spec_from_file_location(
            "dltop_build_native", Path(__file__).resolve().parent.parent / "scripts" / "build_native.py")
        assert spec is not None and spec.loader is not None
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        mod.build(log=lambda _m: None)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Marks the slow tests (see SLOW_FILES). SVG snapshot tests that will skip (their fixtures are in ../shared,
    which a user's clone lacks): unused snapshots warn instead of failing the run, and --snapshot-update is refused.

    syrupy 4.8.0, which pytest-textual-snapshot 1.1.0 pins, takes the files of a module whose snapshot tests all
    skipped for an "unused unknown snapshot collection": it fails the run, and --snapshot-update deletes them
    (fixed upstream in syrupy PR #1161, out of reach behind the pin). Where every snapshot test runs, as in CI,
    an unused snapshot still fails.
    """
    _mark_slow(items)
    skips = [s for i in items if "snap_compare" in getattr(i, "fixturenames", ()) and (s := evaluate_skip_marks(i))]
    if not skips:
        return
    what = f"{len(skips)} snapshot tests skip ({skips[0].reason})"
    if config.option.update_snapshots:
        raise pytest.UsageError(f"--snapshot-update refused: {what}, and their snapshots would be deleted")
    config.option.warn_unused_snapshots = True
    config.stash[_SNAPSHOTS_SKIPPED] = f"{what}: their snapshots are reported unused, not failed"


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter, config: pytest.Config) -> None:
    if _SNAPSHOTS_SKIPPED in config.stash:
        terminalreporter.write_line(config.stash[_SNAPSHOTS_SKIPPED])


def locked_dataset(path: Path, files: int, file_bytes: int, warm: int) -> list[Any]:
    """`files` files of `file_bytes` made cold, then the first `warm` of them read and mlocked (dltop.kernel's
    LockedMapping, kept alive by the caller): on a machine busy with other work the kernel may evict any page, and
    a test compares readings taken seconds apart."""
    from dltop.kernel import LockedMapping

    path.mkdir(parents=True)
    for i in range(files):
        (path / f"shard-{i}.bin").write_bytes(os.urandom(file_bytes))
    os.sync()
    locks = []
    for i in range(files):
        fd = os.open(path / f"shard-{i}.bin", os.O_RDONLY)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        if i < warm:
            locks.append(LockedMapping(fd, file_bytes))
        os.close(fd)
    return locks


def load_session(name: str = "pagecache-session.jsonl") -> list[Snapshot]:
    """Snapshots recorded from a real run by scripts/capture_session.py."""
    return [Snapshot.from_json(line) for line in (DATA / name).read_text().splitlines() if line.strip()]


@pytest.fixture
def session() -> list[Snapshot]:
    return load_session()


def capture_proc(dest: Path) -> Path:
    """Copy this machine's memory-related /proc and /sys files into dest (a root for the sources)."""
    (dest / "proc" / "pressure").mkdir(parents=True)
    for name in ("meminfo", "vmstat", "diskstats", "uptime"):
        shutil.copyfile(f"/proc/{name}", dest / "proc" / name)
    for res in ("memory", "io"):
        src = Path("/proc/pressure") / res
        if src.exists():
            shutil.copyfile(src, dest / "proc" / "pressure" / res)
    (dest / "sys" / "block").mkdir(parents=True)
    for dev in os.listdir("/sys/block"):
        (dest / "sys" / "block" / dev).mkdir()
    return dest


def write_cgroup_tree(dest: Path, proc_cgroup: str, mountinfo: str | None, files: dict[str, str]) -> Path:
    """A memory cgroup laid out as the kernel shows it, under `dest` (a root for the sources):
    proc/self/cgroup, proc/self/mountinfo (left out when None) and files named by their path under dest."""
    (dest / "proc/self").mkdir(parents=True, exist_ok=True)
    (dest / "proc/self/cgroup").write_text(proc_cgroup)
    if mountinfo is not None:
        (dest / "proc/self/mountinfo").write_text(mountinfo)
    for rel, text in files.items():
        (dest / rel).parent.mkdir(parents=True, exist_ok=True)
        (dest / rel).write_text(text)
    return dest


@pytest.fixture
def proc_root(tmp_path: Path) -> Path:
    return capture_proc(tmp_path / "root")


def strict_json(text: str) -> Any:
    """Parse JSON the way jq and strict parsers read it: every string must be valid Unicode (no lone surrogates
    such as "\\udcfe", which jq turns into U+FFFD); and jq, where installed, must read the same."""

    def walk(v: Any) -> None:
        if isinstance(v, str):
            v.encode("utf-8")  # raises on a lone surrogate
        elif isinstance(v, list):
            for x in v:
                walk(x)
        elif isinstance(v, dict):
            for k, x in v.items():
                walk(k)
                walk(x)

    data = json.loads(text)
    walk(data)
    if shutil.which("jq"):
        jq = subprocess.run(["jq", "-c", "."], input=text, capture_output=True, text=True, check=True)
        assert json.loads(jq.stdout) == data
    return data


@pytest.fixture
def reachable_dir() -> Iterator[Path]:
    """A folder under /tmp that a second user (setpriv) can pass through and read: pytest's own are root's, 0700."""
    d = Path(tempfile.mkdtemp(prefix="dltop-test-", dir="/tmp"))
    d.chmod(0o755)
    try:
        yield d
    finally:
        shutil.rmtree(d, ignore_errors=True)
