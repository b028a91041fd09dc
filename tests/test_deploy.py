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


K8S = DEPLOY / "kubernetes"


def k8s(name: str) -> dict[str, dict]:
    """The documents of a manifest, by kind."""
    docs = [d for d in yaml.safe_load_all((K8S / name).read_text()) if d]
    kinds = {d["kind"]: d for d in docs}
    assert len(kinds) == len(docs)
    return kinds


def test_daemonset_runs_a_valid_export_on_its_published_port() -> None:
    ds = k8s("daemonset.yaml")["DaemonSet"]
    assert ds["kind"] == "DaemonSet" and ds["spec"]["template"]["spec"]["hostPID"] is True
    [c] = ds["spec"]["template"]["spec"]["containers"]
    args = parse_export(c["args"])
    port = int(args.listen.rpartition(":")[2])  # type: ignore[attr-defined]
    assert [p["containerPort"] for p in c["ports"]] == [port]
    mounts = {m["name"]: m for m in c["volumeMounts"]}
    assert all(m.get("readOnly") for m in mounts.values())  # dltop export only reads
    # not on every interface without TLS and auth: its web config comes from the Secret mounted
    assert args.web_config.startswith(mounts["web-config"]["mountPath"] + "/")  # type: ignore[attr-defined]


def containers(manifest: str, kind: str) -> list[dict]:
    spec = k8s(manifest)[kind]["spec"]
    pod = spec["template"]["spec"] if "template" in spec else spec
    return [*pod.get("initContainers", []), *pod["containers"]]


def test_k8s_images_are_pinned_and_capabilities_dropped() -> None:
    for manifest, kind in (("daemonset.yaml", "DaemonSet"), ("training-pod.yaml", "Pod")):
        for c in containers(manifest, kind):
            image = c["image"]
            assert ":" in image.rpartition("/")[2] and not image.endswith(":latest"), image
            sc = c["securityContext"]
            assert sc["allowPrivilegeEscalation"] is False and sc["capabilities"]["drop"] == ["ALL"], c["name"]
            assert not sc.get("privileged")
    [dltop] = k8s("daemonset.yaml")["DaemonSet"]["spec"]["template"]["spec"]["containers"]
    # only what reading needs: any file, cachestat of others' files, a pod's /proc/PID/ns
    assert sorted(dltop["securityContext"]["capabilities"]["add"]) == ["DAC_READ_SEARCH", "FOWNER", "SYS_PTRACE"]
    assert dltop["securityContext"]["readOnlyRootFilesystem"] is True


def test_k8s_probes_point_at_the_health_endpoints() -> None:
    from dltop.exporter.server import PROBE_PATHS

    [c] = k8s("daemonset.yaml")["DaemonSet"]["spec"]["template"]["spec"]["containers"]
    ports = {p["name"]: p["containerPort"] for p in c["ports"]}
    tls = parse_export(c["args"]).web_config is not None  # type: ignore[attr-defined]
    for probe, path in (("readinessProbe", "/-/ready"), ("livenessProbe", "/-/healthy")):
        get = c[probe]["httpGet"]
        assert get["path"] == path and path in PROBE_PATHS and get["port"] in ports
        assert get["scheme"] == ("HTTPS" if tls else "HTTP")


def test_the_service_and_podmonitor_select_the_daemonsets_pods() -> None:
    docs = k8s("daemonset.yaml")
    ds = docs["DaemonSet"]
    labels = ds["spec"]["template"]["metadata"]["labels"]
    assert ds["spec"]["selector"]["matchLabels"].items() <= labels.items()
    [c] = ds["spec"]["template"]["spec"]["containers"]
    port_names = {p["name"] for p in c["ports"]}
    svc, pm = docs["Service"], docs["PodMonitor"]
    assert svc["spec"]["selector"].items() <= labels.items()
    assert {p["targetPort"] for p in svc["spec"]["ports"]} <= port_names
    assert pm["spec"]["selector"]["matchLabels"].items() <= labels.items()
    [ep] = pm["spec"]["podMetricsEndpoints"]
    assert ep["port"] in port_names and ep["path"] == "/metrics"
    assert ep["scheme"] == "https" and ep["basicAuth"]  # as the exporter serves it
    assert svc["metadata"]["namespace"] == pm["metadata"]["namespace"] == ds["metadata"]["namespace"]


def test_the_probe_dir_hostpath_is_mounted_on_both_sides() -> None:
    def side(manifest: str, kind: str) -> tuple[str, str]:
        spec = k8s(manifest)[kind]["spec"]
        pod = spec["template"]["spec"] if "template" in spec else spec
        [c] = pod["containers"]
        env = {e["name"]: e["value"] for e in c["env"]}
        where = env["DLTOP_PROBE_DIR"]
        [mount] = [m for m in c["volumeMounts"] if m["mountPath"] == where]
        [vol] = [v for v in pod["volumes"] if v["name"] == mount["name"]]
        return where, vol["hostPath"]["path"]

    exporter, training = side("daemonset.yaml", "DaemonSet"), side("training-pod.yaml", "Pod")
    assert exporter[1] == training[1]  # the same directory of the node
    # the init container makes it sticky and writable by all, so a pod of any uid can make its own directory in it
    [init] = k8s("daemonset.yaml")["DaemonSet"]["spec"]["template"]["spec"]["initContainers"]
    assert "0o1777" in " ".join(init["command"]) and exporter[0] in " ".join(init["command"])



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


RECORD_UNIT = DEPLOY / "systemd" / "dltop-record.service"


@pytest.mark.parametrize("unit_path", [EXPORT_UNIT, RECORD_UNIT], ids=["export", "record"])
def test_systemd_analyze_rates_each_system_unit_exposure_at_most_3(tmp_path: Path, unit_path: Path) -> None:
    analyze = shutil.which("systemd-analyze")
    if analyze is None:
        pytest.skip("systemd-analyze not installed (the static tests check the directives)")
    probe = subprocess.run([analyze, "security", "--help"], capture_output=True, text=True)
    if "--offline" not in probe.stdout:
        pytest.skip("this systemd-analyze has no --offline (systemd < 250): it can only rate loaded units")
    unit = tmp_path / unit_path.name  # a path of its own: --offline reads the file given, no unit search
    shutil.copy(unit_path, unit)
    r = subprocess.run([analyze, "security", "--offline=yes", "--no-pager", str(unit)],
                       capture_output=True, text=True, timeout=60)
    m = re.search(rf"Overall exposure level for {re.escape(unit.name)}: ([0-9.]+)", r.stdout + r.stderr)
    assert m, r.stdout + r.stderr
    assert float(m.group(1)) <= 3.0, r.stdout


def test_the_record_unit_writes_one_folder_and_keeps_the_kernel_log() -> None:
    from dltop.cli import build_parser

    d = unit_directives(RECORD_UNIT)
    [start] = d["ExecStart"]
    argv = shlex.split(start)
    assert argv[0].endswith("/dltop")
    _, cmd, _ = build_parser("record")
    args, extra = cmd.parse_known_args(argv[1:])
    assert not extra and args.command == "record"
    # the one folder it writes is its StateDirectory, under a read-only system
    assert d["StateDirectory"] == ["dltop"] and args.directory.startswith("/var/lib/dltop/")
    assert d["ProtectSystem"] == ["strict"] and d["ProtectHome"] == ["read-only"]
    assert "ReadWritePaths" not in d and "PrivateTmp" not in d
    caps = set(" ".join(d["CapabilityBoundingSet"]).split())
    assert caps == {"CAP_DAC_READ_SEARCH", "CAP_FOWNER", "CAP_SYS_PTRACE", "CAP_SYSLOG"}
    # the OOM killer's victim: /dev/kmsg readable, the kernel log not taken away
    assert "/dev/kmsg r" in d["DeviceAllow"] and "ProtectKernelLogs" not in d
    assert d["NoNewPrivileges"] == ["yes"] and "MemoryDenyWriteExecute" not in d


def test_the_user_record_unit_bounds_no_capabilities() -> None:
    d = unit_directives(DEPLOY / "systemd" / "user" / "dltop-record.service")
    assert "CapabilityBoundingSet" not in d and "AmbientCapabilities" not in d  # a user unit fails with them (218)
    assert d["ExecStart"][0].split()[-9:][:3] == ["record", "-o", "%S/dltop/recordings"]
