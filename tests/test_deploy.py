"""deploy/: the systemd unit and the Kubernetes DaemonSet run command lines `dltop export` accepts, on the port
they publish."""

from __future__ import annotations

import configparser
import shlex

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
