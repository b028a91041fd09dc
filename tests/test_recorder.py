"""The flight recorder's writer and reader: real Snapshots from the real Sampler, written and read back equal;
segments, the index, damage, the lock, the directory's safety, retention, events."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import stat
import time
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dltop.config import Settings
from dltop.errors import DltopError
from dltop.model import Snapshot
from dltop.recorder import Recorder, Recording, parse_duration, parse_size, parse_time, store
from dltop.recorder.segment import decompress_segment
from dltop.sampler import Sampler
from dltop.sources.registry import build_sources

SCENARIOS = Path(__file__).resolve().parent / "data" / "gpu-scenarios"


def sampled(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, n: int = 6,
            scenario: str = "h100-2proc") -> list[Snapshot]:
    """Snapshots of this machine from the real Sampler: /proc, the CPU's sysfs, a dataset the test writes (its
    files change between reads, so the datasets part changes and repeats), GPUs from an NVML scenario."""
    monkeypatch.setenv("DLTOP_FAKE_NVML", str(SCENARIOS / f"{scenario}.json"))
    data = tmp_path / "dataset"
    data.mkdir(exist_ok=True)
    sampler = Sampler(build_sources(Settings(datasets=(str(data),))))
    out = []
    try:
        for i in range(n):
            if i % 3 == 0:
                (data / f"f{i}").write_bytes(os.urandom(8192 * (i + 1)))
            out.append(sampler.read_once())
    finally:
        sampler.close()
    return out


def lines_of(directory: Path) -> list[dict]:
    """Every line of every segment, decompressed and parsed."""
    out = []
    for stem, suffix in store.list_segments(str(directory)):
        raw = (directory / (stem + suffix)).read_bytes()
        if suffix == store.CLOSED_SUFFIX:
            raw, damaged, _ = decompress_segment(raw)
            assert not damaged
        out += [json.loads(line) for line in raw.splitlines()]
    return out


def test_real_snapshots_read_back_equal(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    snaps = sampled(tmp_path, monkeypatch)
    rec_dir = tmp_path / "rec"
    with Recorder(str(rec_dir), block_samples=2) as rec:
        for s in snaps:
            rec.write(s)
    r = Recording(str(rec_dir))
    assert r.damage.total == 0
    assert r.times() == [s.ts for s in snaps]
    assert list(r.range()) == snaps
    for s in snaps:
        assert r.at(s.ts) == s
        assert r.at(s.ts + 1e-3) == s  # at or before
    assert r.at(snaps[0].ts - 100) == snaps[0]
    assert list(r.range(snaps[1].ts, snaps[3].ts)) == snaps[1:4]
    assert r.meta["host"] == snaps[0].host and r.meta["format"] == store.FORMAT_VERSION
    assert [g["uuid"] for g in r.meta["gpus"]] == [g.uuid for g in snaps[0].gpus]  # type: ignore[union-attr]
    # The Snapshots were sampled before the recorder started, so a hint they fire is logged at its sample's
    # time, before "start"; the recorder's own start and stop bracket what it wrote.
    kinds = [e.kind for e in r.events()]
    assert kinds.count("start") == 1 and kinds[-1] == "stop"


def test_rarely_changing_parts_are_written_when_they_change(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    snaps = sampled(tmp_path, monkeypatch, n=6)
    rec_dir = tmp_path / "rec"
    with Recorder(str(rec_dir), block_samples=100) as rec:
        for s in snaps:
            rec.write(s)
    lines = lines_of(rec_dir)
    parts = [ln for ln in lines if ln["type"] == "part"]
    samples = [ln for ln in lines if ln["type"] == "sample"]
    assert len(samples) == 6
    assert all("cpu" not in ln["snap"] and "datasets" not in ln["snap"] for ln in samples)
    # The CPU topology once; the datasets part each time the scan's result changed (the test wrote a file, or
    # the scan's time moved), never more often than that.
    assert [p["name"] for p in parts].count("cpu") == 1
    changes = 1 + sum(a.datasets != b.datasets for a, b in zip(snaps, snaps[1:], strict=False))
    assert [p["name"] for p in parts].count("datasets") == changes
    assert list(Recording(str(rec_dir)).range()) == snaps


def test_segments_rotate_compress_and_index(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    snaps = sampled(tmp_path, monkeypatch, n=4)
    # Spread them over three hours of Snapshot time: one segment per hour.
    spread = [dataclasses.replace(s, ts=snaps[0].ts + i * 1800.0) for i, s in enumerate(snaps)]
    rec_dir = tmp_path / "rec"
    with Recorder(str(rec_dir), block_samples=1) as rec:
        for s in spread:
            rec.write(s)
    segments = store.list_segments(str(rec_dir))
    assert [suffix for _, suffix in segments] == [store.CLOSED_SUFFIX] * 2
    for stem, _ in segments:
        index = json.loads((rec_dir / (stem + store.INDEX_SUFFIX)).read_text())
        assert index["samples"] == 2 == sum(b["samples"] for b in index["blocks"])
        assert all(b["samples"] <= 1 for b in index["blocks"])  # one sample per frame, as asked
        assert index["first_ts"] <= index["last_ts"]
    r = Recording(str(rec_dir))
    assert list(r.range()) == spread
    assert r.at(spread[2].ts + 60) == spread[2]
    # One segment file alone reads as a recording of its own samples.
    alone = Recording(str(rec_dir / (segments[1][0] + store.CLOSED_SUFFIX)))
    assert list(alone.range()) == spread[2:]


def test_reading_while_recording_sees_the_open_segment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    snaps = sampled(tmp_path, monkeypatch, n=3)
    rec_dir = tmp_path / "rec"
    with Recorder(str(rec_dir)) as rec:
        for s in snaps:
            rec.write(s)
        deadline = time.time() + 10
        while time.time() < deadline and rec.samples < 3:
            time.sleep(0.02)
        assert [suffix for _, suffix in store.list_segments(str(rec_dir))] == [store.OPEN_SUFFIX]
        assert list(Recording(str(rec_dir)).range()) == snaps


def test_files_are_private_and_the_directory_too(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    snaps = sampled(tmp_path, monkeypatch, n=2)
    rec_dir = tmp_path / "new" / "rec"
    os.umask(0o022)
    with Recorder(str(rec_dir)) as rec:
        for s in snaps:
            rec.write(s)
    assert stat.S_IMODE(rec_dir.stat().st_mode) == 0o700
    modes = {p.name: stat.S_IMODE(p.stat().st_mode) for p in rec_dir.iterdir()}
    assert modes and set(modes.values()) == {0o600}, modes


def test_a_second_recorder_on_the_directory_refuses(tmp_path: Path) -> None:
    with Recorder(str(tmp_path / "rec")):
        with pytest.raises(DltopError, match=f"another dltop recorder \\(pid {os.getpid()}\\) is recording"):
            Recorder(str(tmp_path / "rec"))
        assert store.lock_held(str(tmp_path / "rec"))
    assert not store.lock_held(str(tmp_path / "rec"))
    Recorder(str(tmp_path / "rec")).close()  # free again once the first has stopped


def test_a_directory_others_can_write_is_refused(tmp_path: Path) -> None:
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    with pytest.raises(DltopError, match="group or others can write it"):
        Recorder(str(shared))
    assert list(shared.iterdir()) == []  # refused before anything was written
    if os.geteuid() == 0:
        theirs = tmp_path / "theirs"
        theirs.mkdir(mode=0o700)
        os.chown(theirs, 65534, 65534)
        with pytest.raises(DltopError, match="belongs to uid 65534"):
            Recorder(str(theirs))
    afile = tmp_path / "afile"
    afile.write_text("x")
    with pytest.raises(DltopError):
        Recorder(str(afile))


def test_torn_and_corrupt_lines_are_skipped_and_counted(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    snaps = sampled(tmp_path, monkeypatch, n=4)
    rec_dir = tmp_path / "rec"
    rec = Recorder(str(rec_dir))
    for s in snaps:
        rec.write(s)
    deadline = time.time() + 10
    while time.time() < deadline and rec.samples < 4:
        time.sleep(0.02)
    (stem, suffix), = store.list_segments(str(rec_dir))
    path = rec_dir / (stem + suffix)
    lines = path.read_bytes().splitlines(keepends=True)
    sample_at = [i for i, ln in enumerate(lines) if b'"type":"sample"' in ln]
    # Damage as a crash and a bad disk do it: a bit flipped inside the second sample, the last one torn.
    second = bytearray(lines[sample_at[1]])
    second[len(second) // 2] = ord("\x00")
    lines[sample_at[1]] = bytes(second)
    lines[sample_at[3]] = lines[sample_at[3]][: len(lines[sample_at[3]]) // 3]
    path.write_bytes(b"".join(lines))
    r = Recording(str(rec_dir))
    got = list(r.range())
    assert got == [snaps[0], snaps[2]]
    assert r.damage.total == 2  # the torn line when scanned, the corrupt one when decoded
    assert r.at(snaps[1].ts) == snaps[0]  # a damaged sample: the one before it
    rec._fd = None  # the segment was rewritten under it; let it go without touching the file
    rec.close()


def test_a_truncated_compressed_segment_reads_up_to_the_damage(tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    snaps = sampled(tmp_path, monkeypatch, n=6)
    rec_dir = tmp_path / "rec"
    with Recorder(str(rec_dir), block_samples=2) as rec:
        for s in snaps:
            rec.write(s)
    (stem, _), = store.list_segments(str(rec_dir))
    zst = rec_dir / (stem + store.CLOSED_SUFFIX)
    index = json.loads((rec_dir / (stem + store.INDEX_SUFFIX)).read_text())
    cut = index["blocks"][2]["offset"] + 10  # into the third frame
    zst.write_bytes(zst.read_bytes()[:cut])
    r = Recording(str(rec_dir))
    assert list(r.range()) == snaps[:4]
    assert r.damage.total == len(index["blocks"]) - 2  # each frame lost is counted (the last holds the stop event)
    # Without its index, the segment is read across frames up to the damage.
    (rec_dir / (stem + store.INDEX_SUFFIX)).unlink()
    r = Recording(str(rec_dir))
    assert list(r.range()) == snaps[:4] and r.damage.total >= 1


def test_an_older_schema_recording_still_reads(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Fields added since (probes, servers, the holes-aware dataset counts) are absent from an older recording:
    # their defaults fill in, as they did for that dltop.
    snaps = sampled(tmp_path, monkeypatch, n=2)
    rec_dir = tmp_path / "rec"
    with Recorder(str(rec_dir)) as rec:
        for s in snaps:
            rec.write(s)
    (stem, _), = store.list_segments(str(rec_dir))
    raw, *_ = decompress_segment((rec_dir / (stem + store.CLOSED_SUFFIX)).read_bytes())
    old = []
    for line in raw.splitlines():
        d = json.loads(line)
        if d["type"] == "sample":
            for k in ("probes", "servers"):
                d["snap"].pop(k, None)
        if d["type"] == "part" and d["name"] == "datasets":
            for ds in d["value"]["paths"]:
                for k in ("data_pages", "data_resident_pages", "data_unknown_pages"):
                    ds.pop(k, None)
        old.append(store.encode_line(d.pop("ts"), d.pop("type"), d))
    old_dir = tmp_path / "old"
    old_dir.mkdir(mode=0o700)
    (old_dir / (stem + store.OPEN_SUFFIX)).write_bytes(b"".join(old))
    r = Recording(str(old_dir))
    back = list(r.range())
    assert r.damage.total == 0 and len(back) == 2
    assert back[0].probes is None and back[0].memory == snaps[0].memory
    ds = back[0].datasets.paths[0]  # type: ignore[union-attr]
    assert ds.data_pages == ds.pages  # the default of a recording made before holes were counted


def test_a_newer_format_is_refused_clearly(tmp_path: Path) -> None:
    d = tmp_path / "rec"
    d.mkdir(mode=0o700)
    (d / "20260101T000000Z.jsonl").write_bytes(store.encode_line(1.0, "meta", {"format": 99}))
    with pytest.raises(DltopError, match="newer dltop"):
        Recording(str(d))


def test_not_a_recording(tmp_path: Path) -> None:
    with pytest.raises(DltopError, match="no such recording"):
        Recording(str(tmp_path / "missing"))
    with pytest.raises(DltopError, match="no recording in"):
        Recording(str(tmp_path))
    junk = tmp_path / "x.jsonl"
    junk.write_text("hello\nworld\n")
    with pytest.raises(DltopError, match="not a dltop recording"):
        Recording(str(junk))


def test_retention_and_size_cap_remove_whole_old_segments(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    snaps = sampled(tmp_path, monkeypatch, n=2)
    now = time.time()
    rec_dir = tmp_path / "rec"
    # Five hours of samples, two per hour, written as if long ago; retention of 2.5 h keeps the last ones.
    with Recorder(str(rec_dir), retain_s=None, max_bytes=None) as rec:
        for h in range(5):
            for k in range(2):
                rec.write(dataclasses.replace(snaps[k], ts=now - (5 - h) * 3600 + k))
    assert len(with_samples(rec_dir)) == 5
    Recorder(str(rec_dir), retain_s=2.5 * 3600, max_bytes=None).close()
    assert len(with_samples(rec_dir)) == 2
    assert Recording(str(rec_dir)).first_ts == pytest.approx(now - 2 * 3600)
    # A size cap below two segments leaves one: whole segments go, oldest first.
    last = with_samples(rec_dir)[-1]
    one = sum(os.path.getsize(rec_dir / (last + s)) for s in (store.CLOSED_SUFFIX, store.INDEX_SUFFIX))
    Recorder(str(rec_dir), retain_s=None, max_bytes=one + 4096).close()
    assert with_samples(rec_dir) == [last]
    assert Recording(str(rec_dir)).first_ts == pytest.approx(now - 3600)


def with_samples(directory: Path) -> list[str]:
    """The closed segments that hold samples (a recorder that only started and stopped leaves its events)."""
    return [stem for stem, suffix in store.list_segments(str(directory)) if suffix == store.CLOSED_SUFFIX
            and json.loads((directory / (stem + store.INDEX_SUFFIX)).read_text())["samples"]]


def test_events_gpu_processes_oom_kills_hints_markers(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    a, b = sampled(tmp_path, monkeypatch, n=2)
    assert a.gpus and not isinstance(a.gpus, Exception)
    g0 = a.gpus[0]  # type: ignore[index]
    gone = g0.processes[0]  # type: ignore[index]
    b2 = dataclasses.replace(b, gpus=(dataclasses.replace(g0, processes=g0.processes[1:]),  # type: ignore[index]
                                      *a.gpus[1:]))  # type: ignore[index]
    vm = b.memory.vmstat  # type: ignore[union-attr]
    b3 = dataclasses.replace(b2, ts=b.ts + 1, memory=dataclasses.replace(
        b.memory, vmstat=dataclasses.replace(vm, oom_kill=(vm.oom_kill or 0) + 2)))  # type: ignore[arg-type]
    rec_dir = tmp_path / "rec"
    with Recorder(str(rec_dir), kmsg=None) as rec:  # the machine's own kernel log left out: hermetic
        rec.write(a)
        rec.write(b2)
        deadline = time.time() + 10
        while time.time() < deadline and rec.samples < 2:
            time.sleep(0.02)
        with open(rec_dir / store.MARKS_NAME, "a") as f:  # what `dltop mark` does, after a line that is not
            f.write('not a mark\n{"ts": "soon"}\n')
            f.write(json.dumps({"ts": b2.ts + 0.5, "text": "loss spiked"}) + "\n")
        rec.write(b3)
        rec.event("marker", {"text": "from the TUI"}, ts=b3.ts)
    events = Recording(str(rec_dir)).events()
    kinds = [e.kind for e in events]
    assert kinds.count("start") == kinds.count("stop") == 1
    exited = [e.data for e in events if e.kind == "gpu_process"]
    assert exited == [{"state": "exited", "gpu": g0.index, "mig": None, "pid": gone.pid, "command": gone.command,
                       "user": gone.user, "used_bytes": gone.used_bytes}]
    ooms = [e.data for e in events if e.kind == "oom_kill"]
    assert ooms == [{"source": "vmstat", "kills": 2, "total": (vm.oom_kill or 0) + 2, "victims": [],
                     "victims_from": "last sample", "kmsg_status": "not read"}]
    assert [e.data["text"] for e in events if e.kind == "marker"] == ["loss spiked", "from the TUI"]


def test_action_events_from_the_real_runner(tmp_path: Path) -> None:
    from dltop.actions.runner import ActionRunner

    f = tmp_path / "data.bin"
    f.write_bytes(os.urandom(1 << 20))
    runner = ActionRunner()
    with Recorder(str(tmp_path / "rec")) as rec:
        runner.subscribe(rec.action_listener)
        run = runner.start("evict", [str(f)])
        assert run.done.wait(30)
    runner.close()
    acts = [e.data for e in Recording(str(tmp_path / "rec")).events() if e.kind == "action"]
    assert [(a["step"], a["phase"]) for a in acts] == [("run", "started"), ("run", "finished")]
    assert acts[-1]["outcome"] == "ok" and acts[-1]["target"] == str(f) and acts[-1]["action"] == "evict"


# -- times, durations, sizes as typed -------------------------------------------------------------------------

def test_parse_time() -> None:
    now = 1_800_000_000.0
    assert parse_time("10m ago", now) == now - 600
    assert parse_time("1h30m ago", now) == now - 5400
    assert parse_time("1800000000", now) == 1_800_000_000
    # 1.8e9 is 2027-01-15T08:00:00Z; TZ is UTC in the tests (conftest), and a time without a zone is local.
    assert parse_time("2027-01-15T08:00:00Z", now) == now
    assert parse_time("2027-01-15T10:00:00+02:00", now) == now
    assert parse_time("2027-01-15 07:00", now) == now - 3600
    # A clock time is the last such time at or before now (or the recording's end).
    assert parse_time("08:00", now) == now
    assert parse_time("07:59:30", now) == now - 30
    assert parse_time("09:00", now) == now - 23 * 3600  # 09:00 today is still to come
    for junk in ("yesterday-ish", "25:00", "10 parsecs ago", "", "-5"):
        with pytest.raises(DltopError):
            parse_time(junk, now)


def test_parse_duration_and_size() -> None:
    assert parse_duration("7d") == 7 * 86400 and parse_duration("90s") == 90 and parse_duration("1.5h") == 5400
    assert parse_size("2G") == 2 << 30 and parse_size("500M") == 500 << 20 and parse_size("2GiB") == 2 << 30
    for junk in ("7x", "d7", "", "-1"):
        with pytest.raises(DltopError):
            parse_duration(junk)
    with pytest.raises(DltopError):
        parse_size("lots")


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=30))
def test_typed_times_either_parse_or_say_why(text: str) -> None:
    # Whatever a user types is a time or a DltopError (one line), never a traceback.
    for parse in (lambda t: parse_time(t, 1_800_000_000.0), parse_duration, parse_size):
        with contextlib.suppress(DltopError):
            parse(text)


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=400))
def test_any_bytes_in_a_segment_are_read_or_skipped(data: bytes) -> None:
    # A segment someone else's disk damaged: lines are read or counted, never an exception other than
    # "not a recording".
    import tempfile

    with tempfile.TemporaryDirectory() as d:
        p = Path(d) / "20260101T000000Z.jsonl"
        p.write_bytes(store.encode_line(1.0, "meta", {"format": 1}) + data)
        r = Recording(str(p))
        assert len(list(r.range())) + r.damage.total <= data.count(b"\n") + 1
        r.events()


def test_the_recording_gives_the_numbers_live_gave(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # The rates and hints a viewer derives from the recording are those it derived live (the same derive and
    # hints code over Snapshots equal to the live ones, floats included).
    from dltop import derive, hints

    live = sampled(tmp_path, monkeypatch, n=5, scenario="8gpu-20proc")
    with Recorder(str(tmp_path / "rec")) as rec:
        for s in live:
            rec.write(s)
    replayed = list(Recording(str(tmp_path / "rec")).range())

    def numbers(snaps: list[Snapshot]) -> list[object]:
        out: list[object] = []
        for a, b in zip(snaps, snaps[1:], strict=False):
            out += [derive.memory_rates(a, b), derive.gpu_rates(a, b), derive.server_rates(a, b)]
        out.append([(h.id, dict(h.numbers)) for h in hints.hints(snaps)])
        return out

    assert numbers(replayed) == numbers(live)
