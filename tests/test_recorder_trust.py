"""Recordings from elsewhere, and the recorder's own folder, at the trust boundary (docs/recorder.md, "A recording
from elsewhere"): a zstd bomb, a segment that is a symlink, a FIFO, a device or a sparse 2 GB file, read by the
real CLI in a subprocess with its time and memory measured; and the writer's folder swapped for a symlink by
another user mid-recording, and a folder on the way that another user could swap (sshd's StrictModes)."""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import shutil
import stat
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
import zstandard
from hypothesis import given, settings
from hypothesis import strategies as st

from dltop.errors import DltopError
from dltop.recorder import Recorder, Recording, store
from dltop.recorder.segment import (
    MAX_FRAME_BYTES,
    decode_frame,
    decompress_segment,
    frame_size,
    index_times_text,
)
from tests.conftest import REPO
from tests.test_recorder_hostile import dltop, one_line, only, real_snapshots, record, record_crashed

GIB = 1 << 30
MIB = 1 << 20
NOBODY = 65534
MAX_RSS_BYTES = 400 * MIB  # a report of a few samples takes ~100 MiB; the old reader took 5 GB for the bomb
AS_LIMIT_BYTES = 4 * GIB  # address space each command may map: a bomb decoded whole fails under it


@functools.cache
def zeros_frame(size: int = GIB) -> bytes:
    """A real zstd frame of `size` zero bytes, as dltop writes frames (content size and checksum in it): 1 GiB of
    zeros compresses to 32 KiB in about a second, streamed, never held whole."""
    cobj = zstandard.ZstdCompressor(level=9, write_checksum=True, write_content_size=True).compressobj(size=size)
    block = bytes(min(size, 16 * MIB))
    out = [cobj.compress(block[: min(len(block), size - done)]) for done in range(0, size, len(block))]
    return b"".join([*out, cobj.flush()])


def declaring(frame: bytes, size: int) -> bytes:
    """`frame` with its header's content size (a 4-byte field, as zstd writes it for these sizes) set to `size`."""
    fhd = frame[4]
    assert fhd >> 6 == 2 and fhd & 3 == 0  # a 4-byte content size, no dictionary id
    at = 5 if fhd & 0x20 else 6  # a single-segment frame has no window byte
    return frame[:at] + size.to_bytes(4, "little") + frame[at + 4:]


def with_frames(rec_dir: Path, frames: list[bytes], indexed: bool) -> Path:
    """Add `frames` to a real recording: appended to its closed segment with an index entry each (checksums
    right: a reader has only the frames themselves to go by), or as a segment of their own with no index."""
    if not indexed:
        zst = only(rec_dir, store.CLOSED_SUFFIX)
        (rec_dir / zst.name.replace("Z.", "Z-2.")).write_bytes(b"".join(frames))
        return rec_dir
    idx, zst = only(rec_dir, store.INDEX_SUFFIX), only(rec_dir, store.CLOSED_SUFFIX)
    index = json.loads(idx.read_text())
    offset = zst.stat().st_size
    last = index["last_ts"]
    with open(zst, "ab") as f:
        for n, frame in enumerate(frames):
            f.write(frame)
            ts = [last + 1 + n]
            block = {"offset": offset, "size": len(frame), "first_ts": ts[0], "last_ts": ts[0],
                     "ts": index_times_text(ts), "samples": 1}
            block["crc"] = store.entry_crc(list(block.values()))
            index["blocks"].append(block)
            offset += len(frame)
    idx.write_text(json.dumps(index))
    return rec_dir


@dataclass
class Ran:
    code: int
    out: str
    err: str
    seconds: float
    max_rss_bytes: int


# The command runs as a child of this small launcher, a fresh interpreter, which sets the address-space limit and
# reads the child's peak memory from wait4. A child forked from the pytest worker itself (preexec_fn forces a fork)
# would count the worker's own memory as its peak (ru_maxrss keeps the peak from before its exec).
LAUNCH = r"""
import os, resource, subprocess, sys, time
said, limit, timeout_s = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
def cap():
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
p = subprocess.Popen(sys.argv[4:], preexec_fn=cap, stdin=subprocess.DEVNULL)
start = time.monotonic()
while True:
    pid, status, usage = os.wait4(p.pid, os.WNOHANG)
    if pid:
        result = f"{os.waitstatus_to_exitcode(status)} {usage.ru_maxrss}"
        break
    if time.monotonic() - start > timeout_s:
        p.kill()
        p.wait()
        result = "timeout"
        break
    time.sleep(0.02)
with open(said, "w") as f:
    f.write(result)
"""


def run_cli(*args: str, timeout_s: float = 120.0) -> Ran:
    """`python -m dltop ARGS` as a user runs it, under an address-space limit, with its peak memory (its own or
    a worker's, whichever was higher) and its time; killed, and the test failed, past `timeout_s`."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err, \
            tempfile.NamedTemporaryFile("r") as said:
        start = time.monotonic()
        subprocess.run([sys.executable, "-c", LAUNCH, said.name, str(AS_LIMIT_BYTES), str(timeout_s),
                        sys.executable, "-m", "dltop", *args], cwd=REPO, env=env, stdout=out, stderr=err,
                       stdin=subprocess.DEVNULL, check=True)
        seconds = time.monotonic() - start
        result = said.read()
        if result == "timeout":
            pytest.fail(f"dltop {' '.join(args)} still running after {timeout_s:g} s")
        code, maxrss = result.split()
        out.seek(0)
        err.seek(0)
        return Ran(int(code), out.read().decode(), err.read().decode(), seconds, int(maxrss) * 1024)


# -- a zstd bomb ----------------------------------------------------------------------------------------------

BOMBS = {
    "eight 1 GiB frames": lambda: [zeros_frame()] * 8,
    "a frame declaring 4 GiB in its header (forged)": lambda: [declaring(zeros_frame(64 * MIB), (1 << 32) - 1)],
    "a frame holding 1 GiB, its header declaring 64 KiB (forged)": lambda: [declaring(zeros_frame(), 1 << 16)] * 8,
}


@pytest.mark.parametrize("indexed", [True, False], ids=["with its index", "no index: scanned"])
@pytest.mark.parametrize("bomb", list(BOMBS))
def test_a_zstd_bomb_is_refused_in_bounded_time_and_memory_and_the_rest_is_read(tmp_path: Path, bomb: str,
                                                                               indexed: bool) -> None:
    snaps = real_snapshots()
    rec_dir = with_frames(record(tmp_path / "rec", snaps), BOMBS[bomb](), indexed)
    for cmd in (["report"], ["dump", "--format", "jsonl"]):
        r = run_cli(cmd[0], str(rec_dir), *cmd[1:])
        assert r.code == 0, r.err
        line = one_line(r.err, f"dltop {cmd[0]}: skipped", "frame")
        assert "Traceback" not in r.out + r.err and "MemoryError" not in r.err
        assert r.max_rss_bytes < MAX_RSS_BYTES, (r.max_rss_bytes, line)
        assert r.seconds < 60, r.seconds  # ~1 s here; the old reader took 45 s and 5 GB
        if cmd[0] == "dump":  # every real sample, from the frames before the bomb
            assert [json.loads(x)["ts"] for x in r.out.splitlines()] == [s.ts for s in snaps]
        else:
            assert f"{len(snaps)} samples" in r.out


def test_a_frame_is_refused_from_its_header_before_a_byte_is_decoded() -> None:
    big = zeros_frame()
    with pytest.raises(zstandard.ZstdError, match="declares 1.0 GiB: more than a frame dltop writes"):
        frame_size(big)
    # Only the header is needed: the frame's body is never looked at
    with pytest.raises(zstandard.ZstdError, match="declares 1.0 GiB"):
        decode_frame(big[:18] + b"\0" * 100)
    with pytest.raises(zstandard.ZstdError, match="Destination buffer is too small|more than"):
        decode_frame(declaring(big, 1 << 16))
    small = zstandard.ZstdCompressor(write_content_size=False).compress(b"x" * 1000)
    with pytest.raises(zstandard.ZstdError, match="declares no content size"):
        decode_frame(small)
    one = zeros_frame(MIB)
    assert decode_frame(one + b"after") == (bytes(MIB), len(one))
    with pytest.raises(zstandard.ZstdError, match="cut short"):
        decode_frame(one[:-4])  # the checksum cut off: content complete, the frame not


def test_a_segment_holds_at_most_its_bound_once_decompressed() -> None:
    frames = [zeros_frame(MIB)] * 4
    data, damaged, why = decompress_segment(b"".join(frames), max_bytes=2 * MIB + MIB // 2)
    assert data == bytes(2 * MIB) and damaged == 2 and "past the" in why


def test_a_closed_segment_s_frames_hold_at_most_its_bound_together(tmp_path: Path) -> None:
    # Ten frames each declaring 120 MiB (each alone within a frame's bound): their headers, read when the
    # recording opens, take the segment past 1 GiB at the ninth; those two are refused unread, the rest fail
    # when decoded (they hold 1 MiB, not what they declare), and the real samples are read.
    snaps = real_snapshots()
    forged = declaring(zeros_frame(MIB), 120 * MIB)
    rec_dir = with_frames(record(tmp_path / "rec", snaps), [forged] * 10, indexed=True)
    rec = Recording(str(rec_dir))
    assert rec.damage.counts() == {"frame": 2}
    assert "past the 1.0 GiB a segment holds at most" in rec.damage.note()
    assert [s.ts for s in rec.range()] == [s.ts for s in snaps]
    assert rec.damage.counts() == {"frame": 10}


@settings(max_examples=300, derandomize=True, deadline=None)
@given(st.data())
def test_fuzz_a_frame_decodes_within_what_its_header_declares(data: st.DataObject) -> None:
    # Bytes of a real frame changed anywhere (the header's size among them): ZstdError or the content it declared
    frame = zstandard.ZstdCompressor(level=9, write_checksum=True, write_content_size=True).compress(
        b"".join(b'{"ts":%d,"type":"sample"}\n' % i for i in range(2000)))
    raw = bytearray(frame)
    for _ in range(data.draw(st.integers(1, 4))):
        raw[data.draw(st.integers(0, len(raw) - 1))] = data.draw(st.integers(0, 255))
    try:
        content, used = decode_frame(bytes(raw))
    except zstandard.ZstdError:
        return
    assert len(content) == zstandard.frame_content_size(bytes(raw)) <= MAX_FRAME_BYTES and used <= len(raw)


# -- files that are not segments ------------------------------------------------------------------------------


def _open_segment_is(kind: str, rec_dir: Path, outside: Path) -> str:
    """Put a file of `kind` where the recording's open segment (or its lock) goes; its name."""
    name = "20990101T000000Z.jsonl"
    path = rec_dir / name
    if kind == "symlink to /dev/zero":
        path.symlink_to("/dev/zero")
    elif kind == "FIFO":
        os.mkfifo(path, 0o600)
    elif kind == "sparse 2 GB file":
        with open(path, "wb") as f:
            f.truncate(2 * 10**9)
    elif kind == "sparse files under the size cap":
        # four of them, each just under the 1 GiB a segment may be, with nothing on disk: read, 13 s and 1 GB
        for n in range(4):
            with open(rec_dir / f"2099010{n + 1}T000000Z.jsonl", "wb") as f:
                f.truncate(store.MAX_SEGMENT_BYTES - 1)
    elif kind == "character device":
        if os.geteuid() != 0:
            pytest.skip("making a device node needs root")
        os.mknod(path, 0o600 | stat.S_IFCHR, os.makedev(1, 5))  # /dev/zero's
    elif kind == "sealed segment: symlink to one outside":
        # A real recording's segment, elsewhere: followed, its samples would be read as this recording's
        seg = only(outside, store.CLOSED_SUFFIX)
        name = "20990101T000000Z.jsonl.zst"
        (rec_dir / name).symlink_to(seg)
        shutil.copy(only(outside, store.INDEX_SUFFIX), rec_dir / "20990101T000000Z.idx.json")
    elif kind == "index: symlink to one outside":
        idx = only(rec_dir, store.INDEX_SUFFIX)
        idx.unlink()
        idx.symlink_to(only(outside, store.INDEX_SUFFIX))
        name = idx.name
    elif kind == "index: FIFO":
        idx = only(rec_dir, store.INDEX_SUFFIX)
        idx.unlink()
        os.mkfifo(idx, 0o600)
        name = idx.name
    elif kind == "lock: FIFO":
        os.mkfifo(rec_dir / store.LOCK_NAME, 0o600)
        name = store.LOCK_NAME
    return name


NOT_SEGMENTS = {  # what a reader says
    "symlink to /dev/zero": "a symbolic link: not followed",
    "FIFO": "a FIFO: not a regular file",
    "sparse 2 GB file": "1.9 GiB: larger than any segment dltop writes",
    "sparse files under the size cap": "on disk: sparse, not a segment dltop writes",
    "character device": "a character device: not a regular file",
    "sealed segment: symlink to one outside": "a symbolic link: not followed",
    "index: symlink to one outside": "damaged index read around",
    "index: FIFO": "damaged index read around",
    "lock: FIFO": None,  # no note: the lock is not part of what is read
}


@pytest.mark.parametrize("kind", list(NOT_SEGMENTS))
def test_a_file_that_is_not_a_segment_is_refused_in_one_line_and_the_rest_is_read(tmp_path: Path, kind: str) -> None:
    snaps = real_snapshots()
    outside = record(tmp_path / "outside", tuple(dataclasses.replace(s, ts=s.ts + 10**6) for s in snaps))
    rec_dir = record(tmp_path / "rec", snaps) if kind != "lock: FIFO" else record_crashed(tmp_path / "rec", snaps)
    name = _open_segment_is(kind, rec_dir, outside)
    expected = NOT_SEGMENTS[kind]
    for cmd in (["report"], ["dump", "--format", "jsonl"], ["replay"]):
        r = run_cli(cmd[0], str(rec_dir), *cmd[1:], timeout_s=60)  # a FIFO read would wait here for ever
        if cmd[0] == "replay":  # no terminal here: the recording was read, then one line saying so
            assert r.code == 1
            one_line(r.err, "terminal")
            continue
        assert r.code == 0, r.err
        assert r.max_rss_bytes < MAX_RSS_BYTES, r.max_rss_bytes  # the sparse file was not read
        if expected is None:
            assert r.err == ""
        else:
            skipped = (["skipped 4 segment files"] if kind == "sparse files under the size cap"
                       else ["skipped 1 segment file", name] if "damaged index" not in expected else [])
            one_line(r.err, expected, *skipped)
        if cmd[0] == "dump":  # this recording's samples, none from outside it
            assert [json.loads(x)["ts"] for x in r.out.splitlines()] == [s.ts for s in snaps]


@pytest.mark.parametrize("kind", ["symlink to /dev/zero", "FIFO", "sparse 2 GB file"])
def test_a_segment_named_alone_that_is_not_one_is_one_line_and_exit_1(tmp_path: Path, kind: str) -> None:
    rec_dir = tmp_path / "rec"
    rec_dir.mkdir(mode=0o700)
    name = _open_segment_is(kind, rec_dir, tmp_path)
    for path in (rec_dir, rec_dir / name):
        r = run_cli("report", str(path), timeout_s=60)
        assert r.code == 1
        one_line(r.err, "nothing readable", NOT_SEGMENTS[kind])
    with pytest.raises(DltopError, match="nothing readable"):
        Recording(str(rec_dir / name))


# -- the writer's folder --------------------------------------------------------------------------------------


@pytest.fixture
def shared_base(reachable_dir: Path) -> Path:
    """A folder under /tmp that another user can pass through (pytest's own is root's, mode 0700)."""
    return reachable_dir


def _as_nobody(*argv: str) -> None:
    if shutil.which("setpriv") is None:
        pytest.skip("setpriv is not installed")
    subprocess.run(["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups", *argv], check=True,
                   capture_output=True, timeout=30)


def test_a_folder_on_the_way_that_others_can_write_without_the_sticky_bit_is_refused(tmp_path: Path) -> None:
    parent = tmp_path / "open"
    parent.mkdir()
    parent.chmod(0o777)  # anyone may rename what is in it
    r = run_cli("record", "-o", str(parent / "rec"), timeout_s=60)  # not refused: it would record until stopped
    assert r.code == 1
    one_line(r.err, "refusing recording directory", str(parent), "no sticky bit", "mode 777")
    assert not (parent / "rec").exists()  # refused before anything was made in it
    # The same folder reached through a symlink in a folder of our own: refused where it leads
    (tmp_path / "link").symlink_to(parent)
    with pytest.raises(DltopError, match="no sticky bit"):
        Recorder(str(tmp_path / "link" / "rec"))
    # Sticky (as /tmp is): nobody else may rename our folder in it
    parent.chmod(0o1777)
    Recorder(str(parent / "rec"), retain_s=None, max_bytes=None).close()
    assert stat.S_IMODE((parent / "rec").stat().st_mode) == 0o700


def test_a_folder_on_the_way_that_another_user_owns_is_refused(shared_base: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("a folder of another user needs root to make")
    parent = shared_base / "theirs"
    parent.mkdir(mode=0o755)
    os.chown(parent, NOBODY, NOBODY)
    r = run_cli("record", "-o", str(parent / "rec"), timeout_s=60)
    assert r.code == 1
    one_line(r.err, "refusing recording directory", f"{parent} belongs to uid {NOBODY}")
    assert not (parent / "rec").exists()
    code, _, err = dltop("mark", "-o", str(parent / "rec"), "x")
    assert code == 1


def test_the_folder_swapped_for_a_symlink_mid_recording_does_not_move_the_writes(shared_base: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("another user's swap needs root to set up (and setpriv to run as them)")
    snaps = real_snapshots()
    parent = shared_base / "parent"
    parent.mkdir(mode=0o755)
    target = shared_base / "target"  # where the other user would have root write (say /etc/cron.d)
    target.mkdir(mode=0o755)
    warnings: list[str] = []
    rec = Recorder(str(parent / "rec"), segment_s=5, retain_s=None, max_bytes=None, warn=warnings.append)
    try:
        for s in snaps[:3]:
            rec.write(s, wait=True)
        deadline = time.monotonic() + 30
        while rec.samples < 3 and time.monotonic() < deadline:
            time.sleep(0.01)
        # The folder the recording is in becomes another user's (it passed the check at start), who swaps it
        os.chown(parent, NOBODY, NOBODY)
        _as_nobody("sh", "-c", f'mv "{parent}/rec" "{parent}/old" && ln -s "{target}" "{parent}/rec"')
        assert (parent / "rec").is_symlink()
        later = [dataclasses.replace(s, ts=s.ts + 60) for s in snaps[3:]]  # a new segment: a new file made
        for s in later:
            rec.write(s, wait=True)
    finally:
        rec.close()
    assert sorted(os.listdir(target)) == []  # nothing made or written through the symlink
    moved = Recording(str(parent / "old"))  # all of it in the folder that was checked
    assert moved.times() == [s.ts for s in snaps[:3] + tuple(later)]
    assert moved.damage.total == 0
    assert any("was moved or replaced while recording" in w for w in warnings), warnings
