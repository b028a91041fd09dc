"""The command line as a user runs it: a real process, real output, one-line errors and exit codes."""

from __future__ import annotations

import json
import os
import platform
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import REPO, strict_json
from tests.test_pagecache_util import NOBODY, ddir_fixture, make_file, needs_root  # noqa: F401  (the `ddir` fixture)


def dltop(*args: str, env: dict[str, str] | None = None, timeout: float = 30) -> subprocess.CompletedProcess[str]:
    full_env = {**os.environ, **(env or {})}
    return subprocess.run([sys.executable, "-m", "dltop", *args], capture_output=True, text=True, cwd=REPO,
                          env=full_env, timeout=timeout)


def test_snapshot_json_has_memory_in_bytes() -> None:
    r = dltop("snapshot", "--json")
    assert r.returncode == 0, r.stderr
    data = json.loads(r.stdout)
    mem = data["memory"]
    for key in ("total_bytes", "available_bytes", "cached_bytes", "dirty_bytes", "writeback_bytes"):
        assert isinstance(mem[key], int), key
    meminfo = Path("/proc/meminfo").read_text()
    total_kb = int(re.search(r"^MemTotal:\s+(\d+) kB", meminfo, re.M).group(1))  # type: ignore[union-attr]
    assert mem["total_bytes"] == total_kb * 1024
    # Available moves between reads; it must still be within 1% of MemTotal of a fresh reading.
    avail_kb = int(re.search(r"^MemAvailable:\s+(\d+) kB", Path("/proc/meminfo").read_text(), re.M).group(1))  # type: ignore[union-attr]
    assert abs(mem["available_bytes"] - avail_kb * 1024) < total_kb * 1024 // 100
    assert data["schema"] == 1 and data["sources"]["memory"]["error"] is None


def test_snapshot_from_captured_root_without_psi(proc_root: Path) -> None:
    for f in (proc_root / "proc/pressure").iterdir():
        f.unlink()
    r = dltop("snapshot", "--root", str(proc_root))
    assert r.returncode == 0, r.stderr
    data = json.loads(r.stdout)
    assert "PSI" in data["memory"]["pressure_memory"]["unavailable"]


@pytest.mark.parametrize(
    "args, code, pattern",
    [
        (["--bogus"], 2, r"^dltop: error: unrecognized arguments: --bogus \(see dltop --help\)$"),
        (["snapshot", "--bogus"], 2,
         r"^dltop snapshot: error: unrecognized arguments: --bogus \(see dltop snapshot --help\)$"),
        (["residency", "--depth", "-1", "/"], 2,
         r"^dltop residency: error: argument --depth: must be 0 or more: '-1' \(see dltop residency --help\)$"),
        (["residency", "--depth", "one", "/"], 2, r"^dltop residency: error: argument --depth: not a whole number"),
        (["warm", "--fit", "--force", "/no/such/dataset"], 2,
         r"^dltop warm: error: argument --force: not allowed with argument --fit \(see dltop warm --help\)$"),
        (["snapshot", "--indent", "-2"], 2, r"^dltop snapshot: error: argument --indent: must be 0 or more"),
        (["cpu", "--decode", "CTR_EL0=84448004"], 2,
         r"^dltop cpu: error: argument --decode: CTR_EL0=84448004 is ambiguous: write 0x84448004 if it is hex .*"
         r"or 0x5089304 if it is the decimal 84448004 \(see dltop cpu --help\)$"),
        (["cpu", "--decode", "CTR_EL0=banana"], 2, r"^dltop cpu: error: argument --decode: 'banana' is not a number"),
        (["cpu", "--decode", "NOPE=0x1"], 2, r"^dltop cpu: error: argument --decode: unknown register 'NOPE'"),
        (["snapshot", "--timeout", "soon"], 2, r"invalid number of seconds: 'soon'"),
        (["/no/such/dataset"], 1, r"^dltop: no such dataset path: /no/such/dataset$"),
        (["frob"], 2, r"^dltop: error: unknown subcommand 'frob', and no such path \(subcommands: .*snapshot"),
        (["--refresh", "0"], 2, r"^dltop: error: argument -r/--refresh: must be between 0.1 and 60.0 seconds: '0' "
                                r"\(see dltop --help\)$"),
        (["snapshot", "--timeout", "-1"], 2, r"must be more than 0 seconds"),
        (["snapshot", "--dataset", "/no/such/dataset"], 1, r"^dltop: no such dataset path: /no/such/dataset$"),
        (["snapshot", "--root", "/no/such/tree"], 1, r"^dltop: --root /no/such/tree: no proc/ directory under it$"),
        (["snapshot", "--config", "/no/such.toml"], 1, r"^dltop: config file not found: /no/such.toml$"),
    ],
)
def test_bad_input_is_one_line(args: list[str], code: int, pattern: str) -> None:
    r = dltop(*args)
    assert r.returncode == code
    assert r.stdout == ""
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1, r.stderr
    assert re.search(pattern, lines[0]), lines[0]
    assert "Traceback" not in r.stderr


def test_bad_config_toml(tmp_path: Path) -> None:
    cfg = tmp_path / "config.toml"
    cfg.write_text("refresh = [\n")
    r = dltop("snapshot", "--config", str(cfg))
    assert r.returncode == 1 and "is not valid TOML" in r.stderr and len(r.stderr.splitlines()) == 1
    cfg.write_text('datasets = "/data"\n')
    r = dltop("snapshot", "--config", str(cfg))
    assert r.returncode == 1 and "datasets must be a list" in r.stderr


def test_unknown_config_key_is_an_error(tmp_path: Path) -> None:
    cfg = tmp_path / "config.toml"
    cfg.write_text("readonly = true\n")  # the typo must not leave actions enabled without a word
    r = dltop("snapshot", "--config", str(cfg))
    assert r.returncode == 1 and "unknown setting 'readonly'" in r.stderr and "read_only" in r.stderr


def test_shared_options_may_come_before_the_subcommand(proc_root: Path) -> None:
    for f in (proc_root / "proc/pressure").iterdir():
        f.unlink()
    r = dltop("--root", str(proc_root), "snapshot", "--json")
    assert r.returncode == 0, r.stderr
    assert "PSI" in json.loads(r.stdout)["memory"]["pressure_memory"]["unavailable"]


def test_config_from_xdg_dir(tmp_path: Path) -> None:
    from dltop.config import load_config

    (tmp_path / "dltop").mkdir()
    (tmp_path / "dltop" / "config.toml").write_text('refresh = 2.5\nread_only = true\ndatasets = ["~/d"]\n')
    import os

    old = os.environ.get("XDG_CONFIG_HOME")
    os.environ["XDG_CONFIG_HOME"] = str(tmp_path)
    try:
        s = load_config(None)
    finally:
        if old is None:
            del os.environ["XDG_CONFIG_HOME"]
        else:
            os.environ["XDG_CONFIG_HOME"] = old
    assert (s.refresh_s, s.read_only, s.datasets) == (2.5, True, (os.path.expanduser("~/d"),))


def test_broken_pipe_is_quiet() -> None:
    r = subprocess.run(f"{sys.executable} -m dltop snapshot --indent 2 | head -c 10", shell=True, cwd=REPO,
                       capture_output=True, text=True, timeout=30)
    assert r.stderr == "" and r.stdout == '{\n  "ts": '


def test_version_and_help() -> None:
    r = dltop("--version")
    assert r.returncode == 0 and r.stdout.startswith("dltop ")
    r = dltop("--help")
    assert r.returncode == 0 and "snapshot" in r.stdout
    for cmd, option in (("residency", "--depth"), ("warm", "--fit")):  # the help a usage error names
        r = dltop(cmd, "--help")
        assert r.returncode == 0 and option in r.stdout and r.stdout.startswith(f"usage: dltop {cmd} ")


# A count of one followed by a plural noun ("1 files", "1 threads"), in any output a command prints.
ONE_PLURAL = re.compile(r"\b1 (files|threads|pages|ways|sets|CPUs|instances|symlinks|hard links|errors)\b")


def test_counts_of_one_are_singular(ddir: Path) -> None:
    d = ddir
    make_file(d / "only.bin", 8192)
    (d / "alias").symlink_to(d / "only.bin")
    outputs = []
    for args in (["residency", str(d)], ["warm", "--dry-run", str(d)], ["warm", str(d)], ["evict", str(d)],
                 ["cpu"]):
        r = dltop(*args)
        assert r.returncode == 0, r.stderr
        outputs.append(r.stdout + r.stderr)
    text = "\n".join(outputs)
    assert not ONE_PLURAL.findall(text), ONE_PLURAL.findall(text)
    assert "skipped 1 symlink;" in outputs[0]
    assert "would warm 8.0 KiB in 1 file" in outputs[1] and " in 1 of 1 file," in outputs[2]
    (d / "alias2").symlink_to(d / "only.bin")
    assert "skipped 2 symlinks;" in dltop("residency", str(d)).stdout


def _missing_pid() -> int:
    return int(Path("/proc/sys/kernel/pid_max").read_text()) + 1  # above pid_max: no process can have it


@pytest.mark.parametrize("args", [["snapshot", "--pid", "PID"], ["snapshot", "--pid", "0"]])
def test_pid_that_does_not_exist_is_an_error_before_anything_starts(args: list[str]) -> None:
    """`dltop snapshot --pid 999999` printed a Snapshot ("cgroup: no process 999999") and exit 0."""
    pid = str(_missing_pid())
    args = [pid if a == "PID" else a for a in args]
    r = dltop(*args, timeout=20)
    assert (r.returncode, r.stdout) == (1, "")
    assert r.stderr == f"dltop: no such process: {args[-1]}\n"


def test_tui_with_a_pid_that_does_not_exist_never_opens_the_screen() -> None:
    """`dltop --pid 999999` in a real terminal opened the TUI as if all were well."""
    import pty
    import select

    pid = _missing_pid()
    master, slave = pty.openpty()
    p = subprocess.Popen([sys.executable, "-m", "dltop", "--pid", str(pid)], cwd=REPO, stdin=slave, stdout=slave,
                         stderr=slave, close_fds=True)
    os.close(slave)
    out = b""
    deadline = time.monotonic() + 20
    try:
        while time.monotonic() < deadline:
            if select.select([master], [], [], 0.2)[0]:
                try:
                    chunk = os.read(master, 65536)
                except OSError:  # EIO: the child closed the terminal
                    break
                if not chunk:
                    break
                out += chunk
            elif p.poll() is not None:
                break
        else:
            pytest.fail(f"the TUI started for a PID that does not exist: {out[:200]!r}")
    finally:
        if p.poll() is None:
            p.kill()
        p.wait(5)
        os.close(master)
    assert p.returncode == 1 and b"\x1b" not in out  # not one escape sequence: no screen was drawn
    assert out.decode() == f"dltop: no such process: {pid}\r\n"


@needs_root
@pytest.mark.parametrize("hidepid, reason", [
    ("invisible", r"^process 1 runs, but /proc hides it from this user \(mounted with hidepid\)"),
    ("noaccess", r"^permission denied reading /proc/1/cgroup$"),
])
def test_pid_whose_cgroup_cannot_be_read_says_why(hidepid: str, reason: str) -> None:
    """A process that exists but whose /proc entry this user may not read: the cgroup is unavailable with the
    real reason ('no process 1' was said for a hidden PID 1), and the snapshot still runs."""
    if shutil.which("unshare") is None:
        pytest.skip("unshare (util-linux) not installed")
    as_nobody = " ".join([*NOBODY, sys.executable, "-m", "dltop", "snapshot", "--pid", "1"])
    script = f"mount -t proc -o hidepid={hidepid} proc /proc && exec {as_nobody}"
    r = subprocess.run(["unshare", "-m", "sh", "-c", script], capture_output=True, text=True, cwd=REPO, timeout=60,
                       env={**os.environ, "HOME": "/nonexistent", "XDG_CONFIG_HOME": "/nonexistent"})
    if r.returncode != 0 and "mount" in r.stderr:
        pytest.skip(f"cannot mount a private /proc here: {r.stderr.strip()}")
    assert r.returncode == 0, r.stderr
    cgroup = json.loads(r.stdout)["memory"]["cgroup"]
    assert set(cgroup) == {"unavailable"} and re.search(reason, cgroup["unavailable"]), cgroup


@pytest.mark.parametrize("args", [["cpu", "--json"], ["snapshot", "--json"]])
def test_midr_el1_is_a_value_or_unavailable_with_a_reason(args: list[str]) -> None:
    """`midr_el1: {}` on x86: a register this CPU does not have is {"unavailable": reason}, never empty."""
    r = dltop(*args)
    assert r.returncode == 0, r.stderr
    data = json.loads(r.stdout)
    regs = (data if args[0] == "cpu" else data["cpu"])["registers"]
    midr = regs["midr_el1"]
    if platform.machine().lower() in ("aarch64", "arm64"):
        assert midr and all(re.fullmatch(r"0x[0-9a-f]{8}", v) for v in midr.values()), midr
    else:
        assert set(midr) == {"unavailable"}
        assert "Arm register" in midr["unavailable"] and platform.machine() in midr["unavailable"]
    if args[0] == "snapshot":
        from dltop.model import Snapshot

        assert Snapshot.from_dict(data).to_dict() == data


def test_json_of_non_utf8_paths_is_valid_and_lossless(ddir: Path) -> None:
    """Names that are not UTF-8 (b'caf\\xe9', b'\\xff\\xfe.bin') were written as lone surrogates ("caf\\udce9"):
    jq printed U+FFFD and the bytes were lost. Now: a display form plus the exact bytes in `<field>_b64`."""
    import base64

    root = os.path.join(os.fsencode(ddir), b"data\xfe")
    sub = os.path.join(root, b"caf\xe9")
    os.makedirs(sub)
    make_file(Path(os.fsdecode(os.path.join(sub, b"\xff\xfe.bin"))), 8192)
    make_file(Path(os.fsdecode(os.path.join(root, b"plain.bin"))), 4096)
    make_file(Path(os.fsdecode(os.path.join(root, b"ok", b"a.bin"))), 4096)
    top = os.fsdecode(root)

    def run(*args: str) -> Any:
        r = subprocess.run([sys.executable, "-m", "dltop", *args], capture_output=True, cwd=REPO, timeout=60)
        assert r.returncode == 0, r.stderr
        return strict_json(r.stdout.decode("utf-8"))  # the text itself is UTF-8 too

    def unb64(s: str) -> bytes:
        return base64.b64decode(s, validate=True)

    res = run("residency", top, "--json")["paths"][0]
    assert res["path"] == os.fsencode(top).decode("utf-8", "backslashreplace") and unb64(res["path_b64"]) == root
    kids = {unb64(c["path_b64"]): c for c in res["children"]}
    assert set(kids) == {sub, os.path.join(root, b"ok")}  # the real names on disk, byte for byte
    assert kids[sub]["path"].endswith("/data\\xfe/caf\\xe9") and kids[sub]["files"] == 1
    plain = make_file(ddir / "plain" / "x.bin", 4096).parent
    assert "_b64" not in dltop("residency", str(plain), "--json").stdout  # the sibling only where needed

    snap = run("snapshot", "--dataset", top)
    from dltop.model import Snapshot

    back = Snapshot.from_dict(snap)
    assert back.to_dict() == snap and back.datasets.paths[0].path == top  # type: ignore[union-attr]

    for args in (["warm", top, "--json"], ["evict", top, "--json"], ["lock", "--dry-run", top, "--json"]):
        r = run(*args)
        assert r["files"] == 3 and [unb64(p) for p in r["paths_b64"]] == [root], args
        assert r["paths"] == [res["path"]]
