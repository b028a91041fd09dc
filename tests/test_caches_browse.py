"""The Caches tab for ncdu and `hf cache` users: deeper folders, apparent sizes, last access, a hub cache by
repo and revision (one revision deleted as huggingface_hub plans it), and where the tools really put things
(`~` literal, a symlinked cache folder, Inductor's precompiled headers, a --pid process that exited)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from textual.widgets import DataTable

from dltop.actions import caches as clear_mod
from dltop.actions.caches import ClearOptions
from dltop.fmt import human_bytes
from dltop.hints.caches import warnings_for
from dltop.model import Snapshot
from dltop.model.caches import CacheInfo, folder_of
from dltop.sampler import ListFeed
from dltop.sources import caches as src
from dltop.tui.app import DltopApp
from tests.test_caches_util import clean_env, du_bytes, find_files


def env_of(home: Path, cwd: str = "/", **variables: str) -> src.Environment:
    return src.environment_of({"HOME": str(home), **variables}, os.getuid(), "the test's environment", cwd=cwd)


def du_apparent(path: Path) -> int:
    out = subprocess.run(["du", "--apparent-size", "-B1", "-s", str(path)], capture_output=True, check=True).stdout
    return int(out.split()[0])


def make_hub(hub: Path) -> tuple[Path, str, str]:
    """A hub cache as huggingface_hub lays it out, without network: one model, two revisions sharing a blob."""
    repo = hub / "models--org--tiny"
    (repo / "blobs").mkdir(parents=True)
    (repo / "refs").mkdir()
    old, new = "a" * 40, "b" * 40
    blobs = {"shared": os.urandom(100_000), "old-weights": os.urandom(300_000), "new-weights": os.urandom(200_000)}
    for name, data in blobs.items():
        (repo / "blobs" / name).write_bytes(data)
    for rev, weights in ((old, "old-weights"), (new, "new-weights")):
        (repo / "snapshots" / rev).mkdir(parents=True)
        os.symlink("../../blobs/shared", repo / "snapshots" / rev / "config.json")
        os.symlink(f"../../blobs/{weights}", repo / "snapshots" / rev / "model.safetensors")
    (repo / "refs" / "main").write_text(new)  # the old revision is detached
    return repo, old, new


def test_a_deep_tree_keeps_folders_more_than_one_level_down_with_apparent_sizes_and_n_more(tmp_path: Path) -> None:
    cache = tmp_path / "c"
    deep = cache / "a" / "b" / "c"
    deep.mkdir(parents=True)
    for i in range(130):  # more than the 100 kept right below the cache
        (cache / f"f{i:03d}").write_bytes(b"x" * (i + 1) * 100)
    for i in range(60):  # more than the 50 kept per deeper folder
        (deep / f"g{i}").write_bytes(b"y" * 5000)
    os.utime(deep / "g0", (1_000_000.0, 2_000_000.0))
    info = src.read_caches(env_of(tmp_path / "home", TORCHINDUCTOR_CACHE_DIR=str(cache))).get("torchinductor")
    assert info is not None and info.size_bytes == du_bytes(cache) and info.files == find_files(cache) == 190
    assert info.apparent_bytes == du_apparent(cache)
    assert len(info.entries) == 100 and info.more_entries == 31  # 130 files and a/, 100 shown
    assert info.more_bytes == info.size_bytes - os.lstat(cache).st_blocks * 512 - sum(e.size_bytes
                                                                                        for e in info.entries)
    c_folder = folder_of(info, str(deep))
    assert c_folder is not None and len(c_folder.entries) == 50 and c_folder.more == 10
    assert folder_of(info, str(cache / "a" / "b")) is not None  # each level on the way
    a = next(e for e in info.entries if e.name == "a")
    assert a.is_dir and a.size_bytes == du_bytes(cache / "a") and a.apparent_bytes == du_apparent(cache / "a")
    newest_atime = max(p.stat().st_atime for p in (cache / "a").rglob("*") if p.is_file())
    assert a.newest_atime == newest_atime


def test_a_hub_cache_lists_repos_by_id_and_revisions_by_hash_with_their_refs(tmp_path: Path) -> None:
    hub = tmp_path / "hub"
    repo, old, new = make_hub(hub)
    info = src.read_caches(env_of(tmp_path / "home", HF_HUB_CACHE=str(hub))).get("hf_hub")
    assert info is not None and info.size_bytes == du_bytes(hub)
    entry = info.entries[0]
    assert (entry.label, entry.detail) == ("org/tiny", "2 revisions, 1 detached")
    revs = folder_of(info, str(repo))
    assert revs is not None
    by_hash = {e.name: e for e in revs.entries}
    assert by_hash[new].detail == "refs: main" and by_hash[old].detail.startswith("detached")
    # a revision's size is the blobs it links to, as du -L counts the snapshot (each blob once)
    out = subprocess.run(["du", "-L", "-B1", "-s", str(repo / "snapshots" / old)], capture_output=True,
                         check=True).stdout
    assert by_hash[old].size_bytes == int(out.split()[0]) - os.lstat(repo / "snapshots" / old).st_blocks * 512


def test_one_revision_is_deleted_as_huggingface_hub_plans_it_and_a_shared_blob_stays(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from huggingface_hub import scan_cache_dir

    hub = tmp_path / "hub"
    repo, old, new = make_hub(hub)
    monkeypatch.setenv("HF_HUB_CACHE", str(hub))
    target = str(repo / "snapshots" / old)
    expected = scan_cache_dir(hub).delete_revisions(old).expected_freed_size
    only_old = os.lstat(repo / "blobs" / "old-weights").st_blocks * 512
    plan = clear_mod.plan(target, ClearOptions())
    assert plan.allowed, plan.guard
    # the blob only it links, its snapshot folder, its two links: not the shared blob
    snap_blocks = sum(os.lstat(p).st_blocks * 512 for p in (repo / "snapshots" / old,
                                                             *(repo / "snapshots" / old).iterdir()))
    assert plan.bytes == only_old + snap_blocks and plan.files == 1
    assert any(f"{expected:,}" in n or "expects to free" in n for n in plan.notes)
    r = clear_mod.clear(target, ClearOptions())
    assert r.done_bytes == plan.bytes and not r.left_behind
    after = scan_cache_dir(hub)
    (left,) = after.repos
    assert {rv.commit_hash for rv in left.revisions} == {new}
    assert (repo / "blobs" / "shared").exists() and not (repo / "blobs" / "old-weights").exists()
    assert (repo / "snapshots" / new / "config.json").read_bytes()  # the other revision still resolves


def test_the_last_revision_takes_its_repo_and_a_bad_revision_is_one_line(tmp_path: Path,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    hub = tmp_path / "hub"
    repo, old, new = make_hub(hub)
    monkeypatch.setenv("HF_HUB_CACHE", str(hub))
    clear_mod.clear(str(repo / "snapshots" / old), ClearOptions())
    plan = clear_mod.plan(str(repo / "snapshots" / new), ClearOptions())
    assert plan.allowed and any("whole repo folder goes" in n for n in plan.notes)
    bad = clear_mod.plan(str(repo / "snapshots" / old), ClearOptions())  # gone already
    assert not bad.allowed and "\n" not in bad.guard and "nothing to clear" in bad.guard


def test_tilde_in_a_variable_is_literal_where_the_tool_takes_it_so(tmp_path: Path) -> None:
    e = env_of(tmp_path / "home", cwd=str(tmp_path), TORCHINDUCTOR_CACHE_DIR="~/ind", TRITON_CACHE_DIR="~/tr",
               TORCH_HOME="~/th", HF_HOME="~/hf")
    got = {loc.name: loc.path for loc in src.resolve(e)}
    assert got["torchinductor"] == str(tmp_path / "~/ind")  # torch: os.environ.get, as written
    assert got["triton"] == str(tmp_path / "~/tr")
    assert got["torch_hub"] == str(tmp_path / "home/th/hub")  # torch.hub expands it
    assert got["hf_hub"] == str(tmp_path / "home/hf/hub")  # huggingface_hub expands it


def test_a_cache_folder_that_is_a_symlink_is_followed_and_said(tmp_path: Path) -> None:
    real = tmp_path / "real"
    (real / "fxgraph").mkdir(parents=True)
    (real / "fxgraph" / "k").write_bytes(os.urandom(50_000))
    os.symlink(real, tmp_path / "link")
    info = src.read_caches(env_of(tmp_path / "home", TORCHINDUCTOR_CACHE_DIR=str(tmp_path / "link"))).get(
        "torchinductor")
    assert info is not None and info.via_symlink == str(real)
    assert info.size_bytes == du_bytes(real) and info.files == 1
    assert info.entries[0].path == str(tmp_path / "link" / "fxgraph")  # named as the tool names it


@pytest.mark.slow  # imports torch._inductor (5 s on an idle node)
def test_inductors_precompiled_headers_stay_in_the_tempdir_when_the_cache_is_elsewhere(tmp_path: Path) -> None:
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    env = clean_env(tmp_path / "home", TMPDIR=str(tmp), TORCHINDUCTOR_CACHE_DIR=str(tmp_path / "ind"), USER="u1")
    code = "from torch._inductor import codecache; print(codecache._HEADER_DIR)"
    torch_says = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    e = src.environment_of(env, os.getuid(), "t", cwd="/")
    got = {loc.name: loc.path for loc in src.resolve(e)}
    assert got["torchinductor_headers"] == torch_says.stdout.strip() == str(tmp / "torchinductor_u1/precompiled_headers")
    assert got["torchinductor"] == str(tmp_path / "ind")


def test_a_pid_that_exited_is_said_and_its_last_environment_kept(tmp_path: Path) -> None:
    env = clean_env(tmp_path / "jobhome", TORCHINDUCTOR_CACHE_DIR=str(tmp_path / "job-ind"))
    job = subprocess.Popen([sys.executable, "-c", "import time; print(flush=True); time.sleep(60)"], env=env,
                           stdout=subprocess.PIPE)
    try:
        job.stdout.readline()
        reader = src.CachesReader(lambda: src.process_environment(job.pid), (), "/")
        first = reader.read()
    finally:
        job.kill()
        job.wait()
    after = reader.read()
    assert not isinstance(first, src.Unavailable) and not isinstance(after, src.Unavailable), after
    assert after.exited == f"process {job.pid} exited" and not first.exited
    assert after.get("torchinductor").path == str(tmp_path / "job-ind")  # type: ignore[union-attr]


def test_the_most_severe_warning_comes_first() -> None:
    c = CacheInfo(name="torchinductor", label="TorchInductor", path="/tmp/x", source="s", exists=True,
                  under_tempdir="/tmp", fs_free_bytes=1 << 20, fs_total_bytes=100 << 30, files=1)
    got = warnings_for(c, 0.0)
    assert len(got) == 2 and got[0].startswith("its filesystem is nearly full")


async def test_the_pane_drills_down_sorts_toggles_apparent_and_goes_back_up(tmp_path: Path) -> None:
    cache = tmp_path / "ind"
    (cache / "fxgraph" / "zz" / "deeper").mkdir(parents=True)
    (cache / "fxgraph" / "zz" / "deeper" / "big").write_bytes(b"\1" * 300_000)
    (cache / "fxgraph" / "aa").write_bytes(b"\1" * 10)
    (cache / "ab").mkdir()
    (cache / "ab" / "k").write_bytes(b"\1" * 100_000)
    e = env_of(tmp_path / "home", TORCHINDUCTOR_CACHE_DIR=str(cache))
    app = DltopApp(ListFeed([Snapshot(ts=1000.0, host="t", caches=src.read_caches(e))]))
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.press(str([p.PANE_ID for p in app.panes].index("caches") + 1))
        await pilot.pause()
        table = app.query_one("#cc-table", DataTable)

        def rows() -> list[str]:
            return [str(table.get_row_at(i)[0]) for i in range(table.row_count)]

        table.move_cursor(row=rows().index("TorchInductor"))
        await pilot.press("enter")
        await pilot.pause()
        assert rows() == ["fxgraph/", "ab/"]  # biggest first
        await pilot.press("s")  # by name (entries start by size)
        await pilot.pause()
        assert rows() == ["ab/", "fxgraph/"]
        table.move_cursor(row=1)
        await pilot.press("enter")
        await pilot.pause()
        assert rows() == ["aa", "zz/"]  # by name, one level down
        table.move_cursor(row=1)
        await pilot.press("enter")
        await pilot.pause()
        assert rows() == ["deeper/"]  # two levels down
        await pilot.press("a")
        await pilot.pause()
        assert str(table.ordered_columns[1].label) == "Apparent"
        assert str(table.get_row_at(0)[1]) == human_bytes(du_apparent(cache / "fxgraph" / "zz" / "deeper"))
        await pilot.press("backspace", "backspace")
        await pilot.pause()
        assert rows() == ["ab/", "fxgraph/"] and table.cursor_row == 1  # back on the folder it left
        await pilot.press("backspace")
        await pilot.pause()
        assert "TorchInductor" in rows()
