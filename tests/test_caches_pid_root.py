"""A cache path learned from another process's environment (--pid) is walked only where a clear could go
(actions/confine.py's root rules): a process started with TORCHINDUCTOR_CACHE_DIR=/ gets its cache listed as
refused, with the rule, at once; / is not walked. A real process, a real `dltop caches --pid`."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


@contextmanager
def _sleeper(*user: str, **env: str) -> Iterator[int]:
    proc = subprocess.Popen([*user, "sleep", "60"], env={**os.environ, **env})
    try:
        yield proc.pid
    finally:
        proc.kill()
        proc.wait()


def _caches(pid: int) -> tuple[dict[str, dict], float]:
    t0 = time.monotonic()
    r = subprocess.run([sys.executable, "-m", "dltop", "caches", "--pid", str(pid), "--json"], capture_output=True,
                       text=True, cwd=REPO, timeout=60, env={**os.environ, "XDG_CONFIG_HOME": "/nonexistent"})
    took = time.monotonic() - t0
    assert r.returncode == 0, r.stderr
    return {c["name"]: c for c in json.loads(r.stdout)["caches"]}, took


# As root, the process is a second, unprivileged user's (the finding: root's dltop walked / for it); else the suite's
AS_OTHER = (["setpriv", "--reuid=65533", "--regid=65533", "--clear-groups"]
            if os.geteuid() == 0 and shutil.which("setpriv") else [])


def test_a_cache_dir_of_slash_is_refused_not_walked() -> None:
    with _sleeper(*AS_OTHER, TORCHINDUCTOR_CACHE_DIR="/", TRITON_CACHE_DIR="/usr", CUDA_CACHE_PATH="/etc/ssl") as pid:
        caches, took = _caches(pid)
    assert took < 5, f"took {took:.1f} s: / walked?"
    for name, path, why in (("torchinductor", "/", "/ is a system folder"), ("triton", "/usr", "/usr is a system folder"),
                            ("cuda", "/etc/ssl", "inside /etc, a system folder")):
        c = caches[name]
        assert c["path"] == path
        reason = c["size_bytes"]["unavailable"]
        assert reason.startswith("refused (system folder): ") and why in reason and "not walked" in reason, reason
        assert c["files"] == {"unavailable": reason} and c["entries"] == []


def test_a_home_or_a_prefix_is_refused_and_a_real_cache_still_walked(tmp_path: Path) -> None:
    real = tmp_path / "inductor"
    (real / "fxgraph").mkdir(parents=True)
    (real / "fxgraph" / "entry").write_bytes(b"x" * 10_000)
    venv = tmp_path / "venv"
    venv.mkdir()
    (venv / "pyvenv.cfg").write_text("home = /usr/bin\n")
    home = os.path.expanduser("~")
    with _sleeper(TORCHINDUCTOR_CACHE_DIR=str(real), TRITON_CACHE_DIR=home, HF_HUB_CACHE=str(venv)) as pid:
        caches, _ = _caches(pid)
    assert caches["torchinductor"]["files"] == 1 and caches["torchinductor"]["size_bytes"] >= 10_000
    assert caches["triton"]["size_bytes"]["unavailable"].startswith("refused (home): ")
    assert caches["hf_hub"]["size_bytes"]["unavailable"].startswith("refused (python prefix): ")
    # an ancestor of the prefix that the process's own environment names (VIRTUAL_ENV) is refused too
    with _sleeper(VIRTUAL_ENV=str(venv), VLLM_CACHE_ROOT=str(tmp_path)) as pid:
        caches, _ = _caches(pid)
    assert caches["vllm"]["size_bytes"]["unavailable"].startswith("refused (ancestor): ")
