"""`dltop record` and `dltop mark` as a user runs them: real subprocesses, real signals (SIGTERM, SIGKILL), the
lock between two recorders, and a filesystem that fills up under the recorder (a small tmpfs)."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from dltop.errors import DltopError
from dltop.recorder import Recorder, Recording, store
from tests.test_recorder import sampled

SCENARIO = Path(__file__).resolve().parent / "data" / "gpu-scenarios" / "h100-2proc.json"


def env() -> dict[str, str]:
    return {**os.environ, "DLTOP_FAKE_NVML": str(SCENARIO), "PYTHONUNBUFFERED": "1"}


def dltop(*args: str, **kw: object) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "dltop", *args], capture_output=True, text=True, env=env(),
                          timeout=120, **kw)  # type: ignore[call-overload]


@contextlib.contextmanager
def recording(directory: Path, *extra: str) -> Iterator[subprocess.Popen[str]]:
    proc = subprocess.Popen([sys.executable, "-m", "dltop", "record", "-o", str(directory), *extra],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env())
    try:
        yield proc
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(30)


def samples_in(directory: Path) -> int:
    try:
        return len(Recording(str(directory)).times())
    except DltopError:
        return 0


def wait_for(cond: object, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not cond():  # type: ignore[operator]
        if time.monotonic() > deadline:
            raise AssertionError("timed out waiting")
        time.sleep(0.1)


def test_record_mark_and_a_clean_stop_on_sigterm(tmp_path: Path) -> None:
    rec_dir = tmp_path / "rec"
    data = tmp_path / "data"
    data.mkdir()
    (data / "a.bin").write_bytes(os.urandom(1 << 16))
    with recording(rec_dir, "-i", "0.2", "--dataset", str(data)) as proc:
        wait_for(lambda: samples_in(rec_dir) >= 3)
        r = dltop("mark", "-o", str(rec_dir), "restarted", "the", "job")
        assert r.returncode == 0 and "restarted the job" in r.stdout
        wait_for(lambda: any(e.kind == "marker" for e in Recording(str(rec_dir)).events()))
        seen = samples_in(rec_dir)
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    assert err.splitlines()[-1].startswith("dltop record: stopped; ")
    assert [suffix for _, suffix in store.list_segments(str(rec_dir))] == [store.CLOSED_SUFFIX]
    r2 = Recording(str(rec_dir))
    assert len(r2.times()) >= seen and r2.damage.total == 0
    kinds = [e.kind for e in r2.events()]
    assert kinds[0] == "start" and kinds[-1] == "stop" and "marker" in kinds
    marker = next(e for e in r2.events() if e.kind == "marker")
    assert marker.data["text"] == "restarted the job"
    last = r2.at(r2.times()[-1])
    assert last.datasets.paths[0].path == str(data)  # type: ignore[union-attr]
    assert last.gpus[0].uuid == "GPU-5c1f0000-8d2e-4b7a-9f31-a1b2c3d40000"  # type: ignore[index]


def test_sigkill_loses_at_most_the_sample_in_flight(tmp_path: Path) -> None:
    rec_dir = tmp_path / "rec"
    with recording(rec_dir, "-i", "0.1") as proc:
        wait_for(lambda: samples_in(rec_dir) >= 5)
        before = samples_in(rec_dir)  # every one of these was on disk before the kill
        proc.kill()
        proc.wait(30)
    r = Recording(str(rec_dir))
    assert len(r.times()) >= before
    assert r.damage.total <= 1  # a torn last line, at most
    assert [s.ts for s in r.range()] == r.times()  # every sample listed is whole
    # The next recorder closes (compresses) what the killed one left open; nothing is lost doing so.
    kept = r.times()
    with recording(rec_dir, "-i", "0.1") as proc:
        wait_for(lambda: store.CLOSED_SUFFIX in {s for _, s in store.list_segments(str(rec_dir))})
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=60)
    assert Recording(str(rec_dir)).times()[: len(kept)] == kept


def test_a_second_recorder_on_the_same_directory_refuses(tmp_path: Path) -> None:
    rec_dir = tmp_path / "rec"
    with recording(rec_dir, "-i", "0.2") as proc:
        wait_for(lambda: store.lock_held(str(rec_dir)))
        r = dltop("record", "-o", str(rec_dir))
        assert r.returncode == 1
        assert r.stderr.strip() == (f"dltop: another dltop recorder (pid {proc.pid}) is recording into {rec_dir}; "
                                    f"stop it or record into another directory (-o DIR)")
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=60)


def test_mark_without_a_recorder_says_so(tmp_path: Path) -> None:
    r = dltop("mark", "-o", str(tmp_path / "none"), "hello")
    assert r.returncode == 1 and r.stderr.startswith("dltop: no recording directory ")
    (tmp_path / "idle").mkdir(mode=0o700)
    r = dltop("mark", "-o", str(tmp_path / "idle"), "hello")
    assert r.returncode == 1 and "no dltop record is running on" in r.stderr and len(r.stderr.splitlines()) == 1


def test_record_refuses_a_directory_others_can_write(tmp_path: Path) -> None:
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    r = dltop("record", "-o", str(shared))
    assert r.returncode == 1 and "group or others can write it" in r.stderr and len(r.stderr.splitlines()) == 1


def test_record_imports_no_textual(tmp_path: Path) -> None:
    # The whole run of `dltop record`, start to clean stop, as -X importtime lists every module it imported.
    proc = subprocess.Popen([sys.executable, "-X", "importtime", "-m", "dltop", "record", "-o", str(tmp_path / "r"),
                             "-i", "0.2"], stderr=subprocess.PIPE, text=True, env=env())
    wait_for(lambda: samples_in(tmp_path / "r") >= 2)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 0
    imported = {line.split("|")[-1].strip() for line in err.splitlines() if line.startswith("import time:")}
    assert "dltop.recorder.writer" in imported and "dltop.sampler" in imported
    assert not {m for m in imported if m.split(".")[0] in ("textual", "rich")}


@pytest.fixture
def small_fs(tmp_path: Path) -> Iterator[Path]:
    """A 1 MiB tmpfs, mounted for the test (root only)."""
    mnt = tmp_path / "small"
    mnt.mkdir(mode=0o700)
    if os.geteuid() != 0:
        pytest.skip("mounting a small tmpfs needs root")
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m,mode=0700", "tmpfs", str(mnt)], capture_output=True,
                       text=True)
    if r.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {r.stderr.strip()}")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


def test_a_full_filesystem_warns_keeps_going_and_resumes(small_fs: Path, tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    snaps = sampled(tmp_path, monkeypatch, n=6)
    warnings: list[str] = []
    rec = Recorder(str(small_fs / "rec"), warn=warnings.append)
    for s in snaps[:2]:
        rec.write(s)
    wait_for(lambda: rec.samples == 2)
    filler = small_fs / "filler"
    with open(filler, "wb", buffering=0) as f, contextlib.suppress(OSError):
        while True:
            f.write(b"\0" * 4096)
    for s in snaps[2:4]:
        rec.write(s)
    wait_for(lambda: rec.lost >= 2)
    assert rec.samples == 2
    filler.unlink()  # space comes back
    for s in snaps[4:]:
        rec.write(s)
    wait_for(lambda: rec.samples == 4)
    rec.close()
    assert any("No space left on device" in w and "still sampling" in w for w in warnings)
    assert sum("No space left on device" in w for w in warnings) == 1  # warned once, not once per sample
    assert any(w.startswith("writing again") for w in warnings)
    r = Recording(str(small_fs / "rec"))
    assert r.damage.total == 0  # the failed writes left no torn line behind
    assert list(r.range()) == snaps[:2] + snaps[4:]
    # The hole says what it was: how many samples, lost to what, from when to when (the report lists it).
    gaps = [e.data for e in r.events() if e.kind == "gap"]
    assert gaps == [{"cause": "write failed: No space left on device", "samples": 2, "from_ts": snaps[2].ts,
                     "to_ts": snaps[3].ts}]


def test_record_with_export_serves_what_it_records(tmp_path: Path) -> None:
    # `dltop record --export`: one Sampler feeds both; the scrape's GPU memory is the recording's last Snapshot's.
    from tests.test_exporter import free_port, get, series

    rec_dir = tmp_path / "rec"
    port = free_port()
    with recording(rec_dir, "-i", "0.2", "--export", f"127.0.0.1:{port}") as proc:
        wait_for(lambda: samples_in(rec_dir) >= 2)
        status, _, body = get(f"http://127.0.0.1:{port}/metrics")
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    assert status == 200
    used = series(body, "dltop_gpu_memory_used_bytes")
    last = Recording(str(rec_dir)).at(Recording(str(rec_dir)).times()[-1])
    assert sorted(used.values()) == sorted(float(g.memory_used_bytes) for g in last.gpus)  # type: ignore[union-attr]
    with pytest.raises(ConnectionRefusedError):  # stopped means the port is let go too
        socket.create_connection(("127.0.0.1", port), timeout=5).close()


def test_record_export_with_a_web_config_serves_tls_with_basic_auth(tmp_path: Path) -> None:
    # --export-web-config: the same TLS and basic auth as `dltop export --web-config`, beside the recorder.
    import base64
    import ssl

    import bcrypt

    from tests.test_exporter import free_port, get, make_cert

    cert = make_cert(tmp_path)
    hashed = bcrypt.hashpw(b"s3cret", bcrypt.gensalt(rounds=4)).decode()
    web = tmp_path / "web.yml"
    web.write_text(f"tls_server_config:\n  cert_file: cert.pem\n  key_file: key.pem\n"
                   f"basic_auth_users:\n  prom: {hashed}\n")
    rec_dir, port = tmp_path / "rec", free_port()
    auth = {"Authorization": "Basic " + base64.b64encode(b"prom:s3cret").decode()}
    ctx = ssl.create_default_context(cafile=str(cert))
    with recording(rec_dir, "-i", "0.2", "--export", f"127.0.0.1:{port}", "--export-web-config", str(web)) as proc:
        wait_for(lambda: samples_in(rec_dir) >= 2)
        refused = get(f"https://127.0.0.1:{port}/metrics", context=ctx)[0]
        status, _, body = get(f"https://127.0.0.1:{port}/metrics", auth, ctx)
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    assert refused == 401 and status == 200 and "dltop_memory_cached_bytes" in body


def test_export_web_config_without_export_is_one_line(tmp_path: Path) -> None:
    r = dltop("record", "-o", str(tmp_path / "rec"), "--export-web-config", str(tmp_path / "web.yml"))
    assert r.returncode == 1 and r.stderr.strip() == "dltop: --export-web-config needs --export ADDR:PORT", r.stderr
    assert not (tmp_path / "rec").exists()  # refused before anything was made


def test_record_export_on_a_port_in_use_is_one_line_and_leaves_no_lock(tmp_path: Path) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        r = dltop("record", "-o", str(tmp_path / "rec"), "--export", f"127.0.0.1:{busy.getsockname()[1]}")
    assert r.returncode != 0 and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert "Traceback" not in r.stderr
    with Recorder(str(tmp_path / "rec")):  # the failed recorder let go of the directory
        pass
