"""`dltop cpu`: JSON shape, the human table, --decode, and one-line errors instead of tracebacks."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from dltop.cli import main
from dltop.config import Settings
from dltop.model import Snapshot
from dltop.model.cpu import CpuPart
from dltop.sources.registry import build_sources
from tests.test_cpu_dumps import DUMPS, dump_root, parts  # noqa: F401  (session fixtures)

pytestmark = pytest.mark.skipif(not DUMPS.is_dir(), reason=f"fixtures not found at {DUMPS}")


def run_cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(["cpu", *argv])
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.parametrize("name", ["arm-A510-A710-A715-X3", "128arm-2pa2n8cluster4co", "2arm-2c"])
def test_json_has_the_documented_fields(capsys, dump_root, parts, name: str) -> None:  # noqa: F811
    code, out, _ = run_cli(capsys, "--sysroot", str(dump_root(name)), "--json")
    assert code == 0
    data = json.loads(out)
    part = parts(name)
    assert len(data["caches"]) == len(part.caches)
    for c in data["caches"]:
        assert isinstance(c["level"], int)
        assert c["type"] in ("Data", "Instruction", "Unified")
        for k in ("size_bytes", "line_bytes", "ways", "sets"):
            assert c[k] is None or (isinstance(c[k], int) and c[k] > 0)
        assert isinstance(c["cpus"], list) and all(isinstance(x, int) for x in c["cpus"])
    for k in data["core_kinds"]:
        assert {"name", "implementer", "part", "cpus"} <= set(k)
    assert data["arrangement"] == part.arrangement
    assert {"ctr_el0", "clidr_el1", "ccsidr_el1"} <= set(data["registers"])
    assert isinstance(data["notes"], list)


def test_text_shows_per_kind_rows_and_flags(capsys, dump_root) -> None:  # noqa: F811
    code, out, _ = run_cli(capsys, "--sysroot", str(dump_root("arm-A510-A710-A715-X3")))
    assert code == 0
    for kind in ("Cortex-A510", "Cortex-A710", "Cortex-A715", "Cortex-X3"):
        assert kind in out
    assert "Arrangement: DynamIQ" in out
    assert "no_cache_geometry" in out


def test_text_folds_the_tree(capsys, dump_root) -> None:  # noqa: F811
    code, out, _ = run_cli(capsys, "--sysroot", str(dump_root("128arm-2pa2n8cluster4co")))
    assert code == 0
    assert "8 × Cluster" in out and "4 × L2 512 KiB" in out
    assert len(out.splitlines()) < 80
    code, full, _ = run_cli(capsys, "--sysroot", str(dump_root("128arm-2pa2n8cluster4co")), "--full-tree")
    assert full.count("Core (CPU ") == 128


def test_decode_text_and_json(capsys) -> None:
    code, out, _ = run_cli(capsys, "--decode", "CTR_EL0=0x84448004")
    assert code == 0 and "DminLine_bytes" in out and "VIPT" in out
    code, out, _ = run_cli(capsys, "--decode", "MIDR_EL1=0x411fd461", "--json")
    data = json.loads(out)
    assert (data["name"], data["revision"]) == ("Cortex-A510", "r1p1")


@pytest.mark.parametrize("argv", [["--sysroot", "/nonexistent/dir"]])  # --decode's usage errors: test_cli.py
def test_bad_input_is_one_line(capsys, argv: list[str]) -> None:
    code, out, err = run_cli(capsys, *argv)
    assert code != 0
    assert out == ""
    assert len(err.strip().splitlines()) == 1 and err.startswith("dltop: ")


def test_bad_sysroot_no_traceback_in_a_real_process(tmp_path: Path) -> None:
    r = subprocess.run([sys.executable, "-m", "dltop", "cpu", "--sysroot", str(tmp_path / "missing")],
                       capture_output=True, text=True)
    assert r.returncode != 0 and "Traceback" not in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1


def test_empty_dir_is_a_one_line_error(capsys, tmp_path: Path) -> None:
    code, _, err = run_cli(capsys, "--sysroot", str(tmp_path))
    assert code == 1 and "no CPU information" in err


def test_snapshot_gains_cpu(dump_root, parts) -> None:  # noqa: F811
    root = dump_root("arm-A510-A710-A715-X3")
    (src,) = [s for s in build_sources(Settings(root=str(root))) if s.name == "cpu"]
    part = src.read()
    assert isinstance(part, CpuPart) and part == parts("arm-A510-A710-A715-X3")
    snap = Snapshot(ts=1.0, host="h", cpu=part)
    back = Snapshot.from_json(snap.to_json())
    assert back == snap
    assert json.loads(snap.to_json())["cpu"]["arrangement"] == "DynamIQ"
