"""deploy/: the systemd unit and the Kubernetes DaemonSet run command lines `dltop export` accepts, on the port
they publish."""

from __future__ import annotations

import configparser
import re
import shlex
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from dltop.cli import build_parser

from .conftest import REPO

DEPLOY = REPO / "deploy"


def parse_export(argv: list[str]) -> object:
    _, cmd, _ = build_parser("export")
    args, extra = cmd.parse_known_args(argv)
    assert not extra and args.command == "export", (argv, extra)
    return args


def test_systemd_unit_runs_a_valid_export() -> None:
    unit = configparser.ConfigParser(strict=False, interpolation=None)
    unit.optionxform = str  # type: ignore[assignment,method-assign]
    unit.read(DEPLOY / "systemd" / "dltop-export.service")
    argv = shlex.split(unit["Service"]["ExecStart"])
    assert argv[0].endswith("/dltop")
    args = parse_export(argv[1:])
    assert args.listen.endswith(":19400")  # type: ignore[attr-defined]
    assert unit["Install"]["WantedBy"] == "multi-user.target"


def test_daemonset_runs_a_valid_export_on_its_published_port() -> None:
    ds = yaml.safe_load((DEPLOY / "kubernetes" / "daemonset.yaml").read_text())
    assert ds["kind"] == "DaemonSet" and ds["spec"]["template"]["spec"]["hostPID"] is True
    [c] = ds["spec"]["template"]["spec"]["containers"]
    args = parse_export(c["args"])
    port = int(args.listen.rpartition(":")[2])  # type: ignore[attr-defined]
    assert [p["containerPort"] for p in c["ports"]] == [port]
    assert ds["spec"]["template"]["metadata"]["annotations"]["prometheus.io/port"] == str(port)
    mounts = {m["name"]: m for m in c["volumeMounts"]}
    assert all(m.get("readOnly") for m in mounts.values())  # dltop export only reads


EXPORT_UNIT = DEPLOY / "systemd" / "dltop-export.service"


def unit_directives(path: Path) -> dict[str, list[str]]:
    """Every `Key=value` of a unit file, each key with all its values (systemd repeats keys)."""
    out: dict[str, list[str]] = {}
    for line in path.read_text().splitlines():
        if "=" in line and not line.startswith(("#", "[", " ")):
            k, _, v = line.partition("=")
            out.setdefault(k, []).append(v)
    return out


def test_the_export_unit_listens_on_loopback_and_keeps_tmp_visible() -> None:
    d = unit_directives(EXPORT_UNIT)
    [start] = d["ExecStart"]
    args = parse_export(shlex.split(start)[1:])
    assert args.listen.startswith("127.0.0.1:")  # type: ignore[attr-defined]  # no metrics to the network unasked
    assert "PrivateTmp" not in d  # caches live under /tmp: a private one would show an empty /tmp
    assert d["ProtectHome"] == ["read-only"] and d["ProtectSystem"] == ["strict"]
    assert d["NoNewPrivileges"] == ["yes"]
    caps = set(" ".join(d["CapabilityBoundingSet"]).split())
    assert caps == {"CAP_DAC_READ_SEARCH", "CAP_FOWNER", "CAP_SYS_PTRACE"}
    assert "MemoryDenyWriteExecute" not in d  # the CPU source executes a page it wrote


def test_systemd_analyze_rates_the_export_unit_exposure_at_most_5(tmp_path: Path) -> None:
    analyze = shutil.which("systemd-analyze")
    if analyze is None:
        pytest.skip("systemd-analyze not installed (the static test above checks the directives)")
    probe = subprocess.run([analyze, "security", "--help"], capture_output=True, text=True)
    if "--offline" not in probe.stdout:
        pytest.skip("this systemd-analyze has no --offline (systemd < 250): it can only rate loaded units")
    unit = tmp_path / EXPORT_UNIT.name  # a path of its own: --offline reads the file given, no unit search
    shutil.copy(EXPORT_UNIT, unit)
    r = subprocess.run([analyze, "security", "--offline=yes", "--no-pager", str(unit)],
                       capture_output=True, text=True, timeout=60)
    m = re.search(r"Overall exposure level for dltop-export\.service: ([0-9.]+)", r.stdout + r.stderr)
    assert m, r.stdout + r.stderr
    assert float(m.group(1)) <= 5.0, r.stdout
