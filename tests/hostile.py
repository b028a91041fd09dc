"""A machine where another user is hostile, made for real: a process whose argv carries terminal escapes, a probe
file written by a real probe in such a process (its cmd, data_dir and job id hostile), a dataset tree and a cache
folder whose names carry them (and a byte that is not UTF-8), and an NVML scenario that puts the hostile process
on a GPU. Used by the screen test (Pilot) and the end-to-end test (tmux, a second user)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from tests.probe_helpers import REPO

DATA = Path(__file__).parent / "data"

# Sets the terminal's title, clears the screen, turns the text around, and a C1 CSI and a DEL for good measure.
HOSTILE = "\x1b]0;pwned\x07\x1b[2J\u202eevil\x9b31m\x7f"
# What no screen may hold: a control (but the line break), DEL, C1, a bidi control, a surrogate.
UNSAFE = re.compile("[\x00-\x09\x0b-\x1f\x7f-\x9f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069\u2028\u2029\ud800-\udfff]")

# A real probe in a process whose argv is hostile: it trains on nothing for a while and publishes.
PROBE_JOB = r"""
import os, sys, time, dltop.probe as probe
os.environ.setdefault("TORCHELASTIC_RUN_ID", sys.argv[2])
def loader():
    while True:
        time.sleep(0.01)
        yield 1
probe.start(interval_s=0.2)
n = 0
for _ in probe.track(loader(), data_dir=sys.argv[1]):
    n += 1
    if n % 20 == 0:
        probe.mark_epoch()
    if n > 30000:
        break
"""


@dataclass
class World:
    root: Path
    dataset: Path
    cache: Path
    scenario: Path
    runtime: Path
    procs: list[subprocess.Popen] = field(default_factory=list)

    @property
    def pids(self) -> list[int]:
        return [p.pid for p in self.procs]

    def close(self) -> None:
        for p in self.procs:
            p.kill()
            p.wait()
        if str(self.runtime).startswith("/dev/shm/"):  # the shared place: only this world's files go
            for pid in self.pids:
                Path(self.runtime, f"{pid}.json").unlink(missing_ok=True)


def _demote(user: tuple[int, int] | None) -> list[str]:
    if user is None:
        return []
    return ["setpriv", f"--reuid={user[0]}", f"--regid={user[1]}", "--clear-groups"]


def make_world(root: Path, user: tuple[int, int] | None = None) -> World:
    """The hostile files and processes under `root`; with `user` (uid, gid), the processes run as that user and
    the files are theirs, as on a shared node."""
    root.mkdir(parents=True, exist_ok=True)
    dataset = root / f"data{HOSTILE}"
    (dataset / f"train{HOSTILE}").mkdir(parents=True)
    (dataset / f"train{HOSTILE}" / f"shard{HOSTILE}.bin").write_bytes(os.urandom(256 * 1024))
    os.mkdir(os.fsencode(dataset) + b"/bad-\xff-dir")
    with open(os.fsencode(dataset) + b"/bad-\xff-dir/bad-\xfe-name.bin", "wb") as f:
        f.write(os.urandom(64 * 1024))
    cache = root / f"cache{HOSTILE}"
    (cache / f"entry{HOSTILE}").mkdir(parents=True)
    (cache / f"entry{HOSTILE}" / f"kernel{HOSTILE}.so").write_bytes(os.urandom(32 * 1024))
    env = {k: v for k, v in os.environ.items() if k not in ("DLTOP_PROBE", "XDG_RUNTIME_DIR")}
    env["PYTHONPATH"] = str(REPO)
    if user is None:
        runtime = root / "run"
        runtime.mkdir(mode=0o700)
        env["XDG_RUNTIME_DIR"] = str(runtime)
        probes = runtime / "dltop"
    else:
        # Another user's probe publishes where root's dltop looks for every user's: /dev/shm/dltop-UID.
        runtime = probes = Path(f"/dev/shm/dltop-{user[0]}")
        for path in (root, dataset, cache):
            os.chown(path, *user)
        os.chmod(root, 0o755)
        env["HOME"] = str(root)
    world = World(root, dataset, cache, root / "scenario.json", runtime)
    try:
        sleeper = subprocess.Popen([*_demote(user), sys.executable, "-c", "import time; time.sleep(600)", HOSTILE],
                                   env=env, cwd="/")
        # a job id of its own: on a busy node another job of the same user may be running (one job, not two)
        job = subprocess.Popen([*_demote(user), sys.executable, "-c", PROBE_JOB, str(dataset),
                                f"job-{os.getpid()}{HOSTILE}",
                                HOSTILE], env=env, cwd="/")
        world.procs += [sleeper, job]
        s = json.loads((DATA / "gpu-scenarios" / "two-gpus.json").read_text())
        for g, pid in zip(s["gpus"], (sleeper.pid, job.pid), strict=False):
            for key in ("compute_processes", "process_utilization"):
                for p in g.get(key, []):
                    p["pid"] = pid
            g["name"] = f"NVIDIA L40S{HOSTILE}"
        world.scenario.write_text(json.dumps(s))
        deadline = time.monotonic() + 60
        while not (probes / f"{job.pid}.json").exists():
            assert job.poll() is None, "the probe job died"
            assert time.monotonic() < deadline, "the probe job published nothing in 60 s"
            time.sleep(0.1)
    except BaseException:
        world.close()
        raise
    return world
