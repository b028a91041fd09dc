"""`dltop doctor`: the real command, as root, as a second user (setpriv), as root with a capability bounded away
(what a hardened unit does), with a refused config, and its text with hostile input escaped."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from dltop.commands.doctor import DEGRADED, FULL, Layer, render
from dltop.recorder.oom import kmsg_status

from .conftest import REPO

LAYERS = {"config", "GPU/NVML", "page cache", "cachestat", "caches", "CPU topology", "probe", "exporter", "recorder",
          "privileges"}
needs_setpriv = pytest.mark.skipif(os.geteuid() != 0 or shutil.which("setpriv") is None,
                                   reason="needs root and setpriv (to run as a second user, or with fewer caps)")


def doctor(*args: str, prefix: tuple[str, ...] = ()) -> tuple[int, dict]:
    r = subprocess.run([*prefix, sys.executable, "-m", "dltop", "doctor", "--json", *args], capture_output=True,
                       text=True, timeout=120, cwd="/",
                       env={**os.environ, "PYTHONPATH": str(REPO), "HOME": "/nonexistent",
                            "XDG_CONFIG_HOME": "/nonexistent"})
    assert r.returncode in (0, 1), r.stderr
    got = json.loads(r.stdout)
    assert r.returncode == (1 if got["degraded"] else 0)  # the exit status says whether anything is degraded
    return r.returncode, {x["layer"]: x for x in got["layers"]}


def test_as_root_every_layer_is_judged(tmp_path: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("needs root")
    (tmp_path / "ds").mkdir()
    (tmp_path / "ds" / "f").write_bytes(os.urandom(1 << 16))
    _, layers = doctor("--dataset", str(tmp_path / "ds"))
    assert set(layers) >= LAYERS
    assert layers["probe"]["state"] == FULL and "every user's" in layers["probe"]["summary"]
    assert layers["privileges"]["state"] in (FULL, DEGRADED)
    assert layers[f"dataset {tmp_path / 'ds'}"]["state"] == FULL
    assert layers["recorder"]["state"] == (FULL if kmsg_status() is None else DEGRADED)
    for x in layers.values():
        assert x["state"] in ("full", "degraded", "none")
        assert x["state"] != DEGRADED or (x["why"] and x["fix"]), x  # a degraded layer says why and the fix


@needs_setpriv
def test_a_second_user_is_told_what_it_misses_and_the_fix() -> None:
    code, layers = doctor(prefix=("setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"))
    assert code == 1
    assert layers["probe"]["state"] == DEGRADED and "not root" in layers["probe"]["why"]
    assert layers["privileges"]["state"] == DEGRADED and "CAP_SYSLOG" in layers["privileges"]["why"]
    assert "sudo" in layers["privileges"]["fix"]
    if Path("/proc/sys/kernel/dmesg_restrict").read_text().strip() == "1":
        assert layers["recorder"]["state"] == DEGRADED and "CAP_SYSLOG" in layers["recorder"]["why"]
    assert layers["cachestat"]["state"] == layers_as_root_cachestat()  # kernel.have_cachestat asks its own memfd: not another's EPERM


def layers_as_root_cachestat() -> str:
    from dltop.kernel import have_cachestat

    return FULL if have_cachestat() else DEGRADED


@needs_setpriv
def test_a_capability_a_unit_bounded_away_is_named() -> None:
    # What a unit without CAP_SYSLOG in CapabilityBoundingSet= gives root: the kernel log closed.
    code, layers = doctor(prefix=("setpriv", "--bounding-set=-syslog", "--"))
    assert code == 1
    priv = layers["privileges"]
    assert priv["state"] == DEGRADED and "CAP_SYSLOG" in priv["why"] and "CAP_FOWNER" not in priv["why"]
    assert "CapabilityBoundingSet" in priv["fix"]
    if Path("/proc/sys/kernel/dmesg_restrict").read_text().strip() == "1":
        assert layers["recorder"]["state"] == DEGRADED


def test_a_refused_config_is_said_and_the_rest_still_checked(tmp_path: Path) -> None:
    bad = tmp_path / "config.toml"
    bad.write_text("refresh = [\n")
    code, layers = doctor("--config", str(bad))
    assert code == 1
    assert layers["config"]["state"] == DEGRADED and "not valid TOML" in layers["config"]["why"]
    assert set(layers) >= LAYERS


def test_the_text_escapes_what_came_from_outside_and_fits_80_columns() -> None:
    lines = render([Layer("dataset /data/\x1b]52;c;x\x07", DEGRADED, "by mincore: \u202eevil", "why " * 40, "fix"),
                    Layer("exporter", FULL, "ok")])
    text = "\n".join(lines)
    assert "\x1b" not in text and "\u202e" not in text and "\x07" not in text
    assert all(len(ln) <= 80 for ln in lines), lines
    assert "1 degraded" in text and "fix: fix" in text


def test_datasets_found_without_a_flag_are_a_layer_of_their_own() -> None:
    # `dltop doctor` said "datasets: none watched" beside datasets the Datasets tab found training jobs reading.
    from types import SimpleNamespace

    from dltop.commands.doctor import dataset_layers
    from dltop.model.datasets import DatasetsPart, FoundDataset, FoundReader

    reader = FoundReader(pid=4242, uid=1000, user="alice", job="run-7", files_open=3)
    part = DatasetsPart(found=(FoundDataset("/data/a", readers=(reader,)),), discovery="your own jobs only (not root)")
    (layer,) = dataset_layers(SimpleNamespace(datasets=part))
    assert (layer.layer, layer.state) == ("found datasets", FULL)
    assert layer.summary == "1 folder read by training jobs, found without a flag; your own jobs only (not root)"
    (layer,) = dataset_layers(SimpleNamespace(datasets=DatasetsPart()))
    assert layer.layer == "datasets" and layer.summary == "none watched, none found read by a training job"
