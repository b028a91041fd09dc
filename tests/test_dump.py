"""`dltop dump`: jsonl as `dltop snapshot --json` writes it, csv for pandas and DuckDB, openmetrics that the real
promtool turns into TSDB blocks; names from dltop.fields."""

from __future__ import annotations

import csv
import io
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from dltop import fields
from dltop.model import Snapshot
from dltop.recorder import Recorder
from tests.test_recorder import sampled

SCENARIO = Path(__file__).resolve().parent / "data" / "gpu-scenarios" / "h100-2proc.json"


@pytest.fixture
def recorded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, list[Snapshot]]:
    snaps = sampled(tmp_path, monkeypatch, n=5)
    rec_dir = tmp_path / "rec"
    with Recorder(str(rec_dir), block_samples=2) as rec:
        for i, s in enumerate(snaps):
            rec.write(s)
            if i == 2:  # a hint as the recorder logs one: fired with this sample
                rec.event("hint", {"id": "memory.dirty", "state": "fired", "severity": "warn", "numbers": {}},
                          ts=s.ts)
    return rec_dir, snaps


def dump(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "dltop", "dump", *args], capture_output=True, text=True,
                          timeout=120, env={"DLTOP_FAKE_NVML": str(SCENARIO), "PATH": "/usr/bin:/bin"})


def test_jsonl_is_one_snapshot_per_line_as_snapshot_json(recorded: tuple[Path, list[Snapshot]]) -> None:
    rec_dir, snaps = recorded
    r = dump(str(rec_dir), "--format", "jsonl")
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert [Snapshot.from_json(line) for line in lines] == snaps
    live = subprocess.run([sys.executable, "-m", "dltop", "snapshot", "--json"], capture_output=True, text=True,
                          timeout=120, env={"DLTOP_FAKE_NVML": str(SCENARIO), "PATH": "/usr/bin:/bin"})
    assert list(json.loads(lines[0])) == list(json.loads(live.stdout))  # the same structure, key for key
    parts = dump(str(rec_dir), "--format", "jsonl", "--fields", "memory,gpus")
    assert set(json.loads(parts.stdout.splitlines()[0])) == {"ts", "host", "schema", "memory", "gpus"}


def test_csv_columns_are_the_fields_and_values_the_snapshots(recorded: tuple[Path, list[Snapshot]]) -> None:
    rec_dir, snaps = recorded
    r = dump(str(rec_dir), "--format", "csv")
    assert r.returncode == 0, r.stderr
    rows = list(csv.DictReader(io.StringIO(r.stdout)))
    assert len(rows) == len(snaps)
    for row, s in zip(rows, snaps, strict=True):
        assert float(row["ts"]) == s.ts
        assert int(row["memory_cached_bytes"]) == s.memory.cached_bytes  # type: ignore[union-attr]
        g = s.gpus[0]  # type: ignore[index]
        assert int(row[f'gpu_memory_used_bytes{{gpu="0",uuid="{g.uuid}"}}']) == g.memory_used_bytes
    # Every column is a field's name (with its labels); info fields (text in labels) are left out of CSV.
    names = {c.split("{")[0] for c in rows[0] if c != "ts"}
    assert names <= {f.name for f in fields.FIELDS if f.kind != "info"}
    # The hint fired with the third sample: empty before (not 0: it was not firing), 1 from then on.
    col = 'hint_active{id="memory.dirty",severity="warn"}'
    assert [row[col] for row in rows] == ["", "", "1", "1", "1"]


def test_fields_and_time_range(recorded: tuple[Path, list[Snapshot]]) -> None:
    rec_dir, snaps = recorded
    r = dump(str(rec_dir), "--format", "csv", "--fields", "memory_cached_bytes,gpu_temperature*",
             "--from", repr(snaps[1].ts), "--to", repr(snaps[3].ts))
    assert r.returncode == 0, r.stderr
    rows = list(csv.DictReader(io.StringIO(r.stdout)))
    assert [float(row["ts"]) for row in rows] == [s.ts for s in snaps[1:4]]
    assert {c.split("{")[0] for c in rows[0]} == {"ts", "memory_cached_bytes", "gpu_temperature_celsius"}
    bad = dump(str(rec_dir), "--format", "csv", "--fields", "no_such_field")
    assert bad.returncode == 1 and bad.stderr.startswith("dltop: --fields: no field matches 'no_such_field'")
    bad = dump(str(rec_dir), "--from", "next tuesday")
    assert bad.returncode == 1 and len(bad.stderr.splitlines()) == 1 and "not a time" in bad.stderr


@pytest.mark.skipif(shutil.which("promtool") is None,
                    reason="promtool not installed (Debian package prometheus; scripts/install-test-deps)")
def test_promtool_makes_tsdb_blocks_from_the_openmetrics_dump(recorded: tuple[Path, list[Snapshot]],
                                                             tmp_path: Path) -> None:
    rec_dir, snaps = recorded
    r = dump(str(rec_dir), "--format", "openmetrics")
    assert r.returncode == 0, r.stderr
    assert r.stdout.endswith("# EOF\n")
    om = tmp_path / "dump.om"
    om.write_text(r.stdout)
    blocks = tmp_path / "tsdb"
    made = subprocess.run(["promtool", "tsdb", "create-blocks-from", "openmetrics", str(om), str(blocks)],
                          capture_output=True, text=True, timeout=120)
    assert made.returncode == 0, made.stderr + made.stdout
    # Read the blocks back: the page cache series holds each Snapshot's value at its time (ms).
    (blocks / "wal").mkdir()  # promtool 2.42's dump opens a WAL, which made blocks do not have
    out = subprocess.run(["promtool", "tsdb", "dump", "--min-time=0", str(blocks)], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    cached = sorted((int(ts), float(v)) for line in out.stdout.splitlines()
                    if line.startswith('{__name__="dltop_memory_cached_bytes"}')
                    for v, ts in [line.split()[1:3]])
    assert [v for _, v in cached] == [float(s.memory.cached_bytes) for s in snaps]  # type: ignore[union-attr]
    assert all(abs(ts - s.ts * 1000) <= 1 for (ts, _), s in zip(cached, snaps, strict=True))


@pytest.mark.parametrize("fmt", ["csv", "openmetrics"])
def test_a_dump_read_in_pieces_is_the_dump_read_whole(recorded: tuple[Path, list[Snapshot]], fmt: str,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    # A day is read in one process per CPU; the pieces joined are byte for byte the dump read in one go
    # (columns in the same order, the hint that fired in the middle, each piece's first sample included).
    from dltop.recorder import Recording
    from dltop.recorder import dump as dumping

    rec_dir, _ = recorded
    monkeypatch.setattr(dumping, "MIN_PER_WORKER", 1)
    whole, pieces = io.StringIO(), io.StringIO()
    dumping.dump(Recording(str(rec_dir)), fmt, whole, workers=1)
    dumping.dump(Recording(str(rec_dir)), fmt, pieces, workers=3)
    assert len(dumping._pieces(Recording(str(rec_dir)), None, None, 3)) == 3
    assert pieces.getvalue() == whole.getvalue()


def test_pieces_that_saw_different_series_line_up_under_one_header(recorded: tuple[Path, list[Snapshot]],
                                                                   tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    # A GPU process that exits mid-recording: the later pieces lack its columns, which sit between columns they
    # share; every row still has one cell per header column, the process's empty (not 0) once it is gone.
    import dataclasses

    from dltop.recorder import Recorder, Recording
    from dltop.recorder import dump as dumping

    _, snaps = recorded
    g = snaps[0].gpus[0]  # type: ignore[index]
    gone = g.processes[0]
    later = [dataclasses.replace(s, gpus=(dataclasses.replace(s.gpus[0], processes=s.gpus[0].processes[1:]),  # type: ignore[index]
                                          *s.gpus[1:]))  # type: ignore[index]
             for s in snaps[2:]]
    rec_dir = tmp_path / "exits"
    with Recorder(str(rec_dir), block_samples=2) as rec:
        for s in [*snaps[:2], *later]:
            rec.write(s)
    monkeypatch.setattr(dumping, "MIN_PER_WORKER", 1)
    whole, pieces = io.StringIO(), io.StringIO()
    dumping.dump(Recording(str(rec_dir)), "csv", whole, workers=1)
    dumping.dump(Recording(str(rec_dir)), "csv", pieces, workers=3)
    assert pieces.getvalue() == whole.getvalue()
    rows = list(csv.reader(io.StringIO(whole.getvalue())))
    header, body = rows[0], rows[1:]
    assert all(len(r) == len(header) for r in body)
    col = header.index(f'gpu_process_memory_bytes{{gpu="0",uuid="{g.uuid}",pid="{gone.pid}"}}')
    assert [r[col] for r in body] == [str(gone.used_bytes)] * 2 + [""] * 3
    kept = g.processes[1]
    col = header.index(f'gpu_process_memory_bytes{{gpu="0",uuid="{g.uuid}",pid="{kept.pid}"}}')
    assert [int(r[col]) for r in body] == [s.gpus[0].processes[1].used_bytes for s in snaps]  # type: ignore[index]


def test_openmetrics_writes_no_limit_as_plus_inf(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A memory cgroup without a limit is `+Inf` in the OpenMetrics dump (it was left out), as the exporter serves
    it: read back by prometheus_client's OpenMetrics parser and, where it is installed, by promtool."""
    import dataclasses

    from prometheus_client.openmetrics.parser import text_string_to_metric_families

    from dltop.model.memory import CgroupMemory

    snaps = sampled(tmp_path, monkeypatch, n=3)
    cg = CgroupMemory("/job", current_bytes=1 << 30, no_limit=True, file_bytes=1 << 20, file_dirty_bytes=0,
                      oom_kill=0)
    snaps = [dataclasses.replace(s, memory=dataclasses.replace(s.memory, cgroup=cg)) for s in snaps]  # type: ignore[type-var]
    rec_dir = tmp_path / "rec"
    with Recorder(str(rec_dir), block_samples=2) as rec:
        for s in snaps:
            rec.write(s, wait=True)
    r = dump(str(rec_dir), "--format", "openmetrics", "--fields", "cgroup_memory_*")
    assert r.returncode == 0, r.stderr
    families = {f.name: f for f in text_string_to_metric_families(r.stdout)}
    limit = [(s.value, s.timestamp) for s in families["dltop_cgroup_memory_max_bytes"].samples]
    assert [v for v, _ in limit] == [float("inf")] * 3
    assert [float(ts) for _, ts in limit] == [s.ts for s in snaps]
    assert [s.value for s in families["dltop_cgroup_memory_current_bytes"].samples] == [float(1 << 30)] * 3
    csv_out = dump(str(rec_dir), "--format", "csv", "--fields", "cgroup_memory_max_bytes")
    assert [row[1] for row in csv.reader(io.StringIO(csv_out.stdout))][1:] == ["inf"] * 3  # pandas reads inf
    if shutil.which("promtool") is None:
        return
    om = tmp_path / "dump.om"
    om.write_text(r.stdout)
    blocks = tmp_path / "tsdb"
    made = subprocess.run(["promtool", "tsdb", "create-blocks-from", "openmetrics", str(om), str(blocks)],
                          capture_output=True, text=True, timeout=120)
    assert made.returncode == 0, made.stderr + made.stdout
    (blocks / "wal").mkdir()
    out = subprocess.run(["promtool", "tsdb", "dump", "--min-time=0", str(blocks)], capture_output=True, text=True,
                         timeout=120)
    got = [line.rsplit(" ", 2)[1] for line in out.stdout.splitlines() if "dltop_cgroup_memory_max_bytes" in line]
    assert got == ["+Inf"] * 3, out.stdout[:2000]


def test_a_dump_decodes_only_the_parts_its_fields_come_from(recorded: tuple[Path, list[Snapshot]]) -> None:
    from dltop.recorder import Recording
    from dltop.recorder import dump as dumping
    from dltop.recorder.reuse import PartMemo

    rec_dir, snaps = recorded
    assert dumping.parts_of({"memory_cached_bytes", "gpu_temperature_celsius", "hint_active"}) == {"memory", "gpus"}
    assert dumping.parts_of({"memory_cached_bytes", "source_up"}) is None  # a source's state needs every part
    memo = PartMemo(parts=frozenset({"memory"}))
    got = list(Recording(str(rec_dir)).range(memo=memo))
    assert [s.memory for s in got] == [s.memory for s in snaps]
    assert all(s.gpus is None and s.cpu is None and s.datasets is None and not s.sources for s in got)
    assert memo.gave_up == 0 and memo.parsed + memo.reused == 5 * len(snaps)  # ts, host, uptime, schema, memory
    # The narrow dump's columns are the whole dump's, cell for cell.
    whole, narrow = io.StringIO(), io.StringIO()
    dumping.dump(Recording(str(rec_dir)), "csv", whole)
    dumping.dump(Recording(str(rec_dir)), "csv", narrow, names=["memory_*", "gpu_temperature_celsius"])
    full = list(csv.DictReader(io.StringIO(whole.getvalue())))
    part = list(csv.DictReader(io.StringIO(narrow.getvalue())))
    assert len(part) == len(snaps) and set(part[0]) < set(full[0]) and len(part[0]) > 10
    assert all(row == {k: f[k] for k in row} for row, f in zip(part, full, strict=True))


def test_openmetrics_on_stdout_is_escaped_as_every_cli_text(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The CLI copies a day's OpenMetrics to stdout as bytes where the escaping writer would change nothing: a
    process's command with an escape sequence and text that is not ASCII comes out as the writer escapes it."""
    import dataclasses

    from dltop.fmt import EscapingWriter
    from dltop.recorder import Recording
    from dltop.recorder import dump as dumping

    snaps = sampled(tmp_path, monkeypatch, n=3)
    g = snaps[0].gpus[0]  # type: ignore[index]
    proc = dataclasses.replace(g.processes[0], command="evil \x1b[31mred\x1b[0m café")
    bad = dataclasses.replace(g, processes=(proc, *g.processes[1:]))
    snaps = [dataclasses.replace(s, gpus=(bad, *s.gpus[1:])) for s in snaps]  # type: ignore[misc]
    rec_dir = tmp_path / "rec"
    with Recorder(str(rec_dir), block_samples=2) as rec:
        for s in snaps:
            rec.write(s, wait=True)
    r = dump(str(rec_dir), "--format", "openmetrics")
    assert r.returncode == 0, r.stderr
    assert "\x1b" not in r.stdout and "\\u001b[31mred" in r.stdout and "café" in r.stdout
    expected = io.StringIO()
    dumping.dump(Recording(str(rec_dir)), "openmetrics", EscapingWriter(expected))
    assert r.stdout == expected.getvalue()
