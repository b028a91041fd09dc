"""Text from outside never reaches the terminal as control characters: the live app on real sources (a process
with escapes in its argv on a GPU, its real probe file, a dataset and a cache whose names carry them, a byte that
is not UTF-8), every tab, the help screen and a dialog drawn at 80x24, and every character Textual would send
checked. The escapes are shown, made visible ('\\x1b'), not dropped: a person can still see what is there."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator

import pytest
from textual.pilot import Pilot

from dltop.config import Settings
from dltop.fmt import EscapingWriter, printable
from dltop.sampler import Sampler
from dltop.sources.registry import build_sources
from dltop.tui.app import DltopApp
from tests.hostile import HOSTILE, UNSAFE, World, make_world
from tests.probe_helpers import REPO

SHOWN = printable(HOSTILE)  # what the screen holds in its place


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    w = make_world(tmp_path_factory.mktemp("hostile"))
    yield w
    w.close()


def _screen_text(app: DltopApp) -> str:
    """Every character of the screen as Textual would write it (the compositor's strips, toasts included)."""
    strips = app.screen._compositor.render_strips()
    return "\n".join("".join(seg.text for seg in strip) for strip in strips)


async def _settle(pilot: Pilot, app: DltopApp) -> None:
    await pilot.pause(0.3)
    app.show()
    await pilot.pause(0.2)


async def test_every_tab_shows_hostile_text_escaped(world: World, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DLTOP_FAKE_NVML", str(world.scenario))
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(world.runtime))
    settings = Settings(datasets=(str(world.dataset),), caches=(str(world.cache),), refresh_s=0.5,
                        user=os.getuid())  # this test's jobs only: other users' on a shared node are not its
    app = DltopApp(Sampler(build_sources(settings)), settings)
    seen: dict[str, str] = {}
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.pause(4)  # the first scans of the dataset and the cache, the probe's file, NVML
        for i, pane in enumerate(app.panes):
            await pilot.press(str(i + 1))
            await _settle(pilot, app)
            if pane.PANE_ID == "datasets":
                await pilot.press("enter")  # into the dataset: the hostile names are its rows
                await _settle(pilot, app)
            seen[pane.PANE_ID] = text = _screen_text(app)
            assert not UNSAFE.search(text), (pane.PANE_ID, UNSAFE.findall(text))
        await pilot.press("question_mark")  # the help screen lists every hint whole
        await _settle(pilot, app)
        assert not UNSAFE.search(_screen_text(app))
        await pilot.press("escape")
        app.notify(f"a notification naming {world.dataset}")
        await _settle(pilot, app)
        assert not UNSAFE.search(_screen_text(app))
    # the hostile strings are there, escaped, where each tab shows them
    assert "\\x1b]0;pwned" in seen["gpu"]  # the command column and the GPU's name
    # the probe's command line and data_dir (cut in the middle: an escape whole or not at all, never "x1b")
    assert "]0;pwned\\x07" in seen["training"] and "…x1b" not in seen["training"], seen["training"]
    assert "\\x1b" in seen["datasets"] and "\\xff" in seen["datasets"], seen["datasets"]
    assert "\\x1b" in seen["caches"]
    assert SHOWN.startswith("\\x1b]0;pwned\\x07\\x1b[2J\\u202e")


def test_cli_text_is_escaped_and_json_exact(world: World) -> None:
    env = {**os.environ, "DLTOP_FAKE_NVML": str(world.scenario), "XDG_RUNTIME_DIR": str(world.runtime)}
    for argv in (["residency", str(world.dataset)], ["caches", "--cache", str(world.cache)],
                 ["residency", str(world.dataset) + "/nope" + HOSTILE]):
        r = subprocess.run([sys.executable, "-m", "dltop", *argv], env=env, cwd=REPO, capture_output=True,
                           timeout=120)
        out = r.stdout.decode("utf-8", "surrogateescape") + r.stderr.decode("utf-8", "surrogateescape")
        assert out and not UNSAFE.search(out), (argv, out[:2000])
        assert "\\u001b" in out, (argv, out[:2000])
        assert "Traceback" not in out
    r = subprocess.run([sys.executable, "-m", "dltop", "snapshot", "--json"], env=env, cwd=REPO,
                       capture_output=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert not UNSAFE.search(r.stdout.decode())
    snap = json.loads(r.stdout)
    cmds = [p["command"] for g in snap["gpus"] for p in g["processes"] if p["pid"] in world.pids]
    assert any(HOSTILE in c for c in cmds), cmds  # exact: the JSON carries the bytes the process had
    probes = [p for p in snap["probes"]["processes"] if p["pid"] in world.pids]
    assert probes and HOSTILE in probes[0]["data_dir"] and probes[0]["job_id"] == f"job-{os.getpid()}{HOSTILE}"


def test_the_writer_keeps_json_exact_and_text_escaped() -> None:
    import io

    values = ["plain", HOSTILE, "bad-\udcff-byte", "tab\there\nnewline", "\u2066iso\u2069", "日本語"]
    buf = io.StringIO()
    w = EscapingWriter(buf)  # type: ignore[arg-type]
    w.write(json.dumps(values) + "\n")
    w.write(json.dumps(values, ensure_ascii=False) + "\n")
    w.write("text: " + " ".join(values) + "\n")
    lines = buf.getvalue().splitlines()
    assert json.loads(lines[0]) == values and json.loads(lines[1]) == values
    assert not UNSAFE.search(buf.getvalue())
    assert "\\u001b]0;pwned\\u0007" in lines[2] and "日本語" in lines[3]
