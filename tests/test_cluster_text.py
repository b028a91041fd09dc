"""The commands the Cluster tab offers for other nodes: a Slurm hostlist that names exactly the cold hosts, quoted
for a shell, one pdsh line instead of an ssh line per host past a few."""

from __future__ import annotations

import re
import shlex

from hypothesis import given, settings
from hypothesis import strategies as st

from dltop.model.cluster import ClusterDataset, ClusterNode, ClusterPart
from dltop.text.cluster import SSH_LINES_UP_TO, hostlist, warm_commands


def expand(expr: str) -> list[str]:
    """A hostlist expression back to its host names, as Slurm's `scontrol show hostnames` reads it."""
    out = []
    for prefix, inner, plain in re.findall(r"([^,\[]*)\[([^\]]*)\]|([^,\[\]]+)", expr):
        if plain:
            out.append(plain)
            continue
        for part in inner.split(","):
            a, _, b = part.partition("-")
            width = len(a) if a.startswith("0") and len(a) > 1 else 0
            out.extend(f"{prefix}{n:0{width}d}" for n in range(int(a), int(b or a) + 1))
    return out


def test_hostlists() -> None:
    assert hostlist(["gpu-0001", "gpu-0002", "gpu-0004", "gpu-0003", "gpu-0010"]) == "gpu-[0001-0004,0010]"
    assert hostlist(["node-0"]) == "node-0"
    assert hostlist(["n9", "n10", "n11", "login", "a.b"]) == "n[9-11],login,a.b"
    assert hostlist(["x01", "x1", "x2"]) == "x[1-2],x01"  # a zero-padded name is not its number unpadded


FUZZ = {"tried": 0}


@settings(max_examples=200, derandomize=True, deadline=None)
@given(st.lists(st.builds(lambda p, n, w, pad: f"{p}{n:0{w if pad else 0}d}" if n is not None else p,
                          st.sampled_from(["gpu-", "n", "rack1-node", "login"]),
                          st.none() | st.integers(0, 3000), st.integers(1, 5), st.booleans()), max_size=40))
def test_fuzz_a_hostlist_names_exactly_its_hosts(hosts: list[str]) -> None:
    FUZZ["tried"] += 1
    expr = hostlist(hosts)
    assert sorted(expand(expr)) == sorted(set(hosts)) if hosts else expr == ""


def test_hostlist_fuzz_count() -> None:
    print(f"hostlist fuzz: {FUZZ['tried']} inputs")
    assert FUZZ["tried"] >= 200


def _part(names: list[str], cold: set[str]) -> ClusterPart:
    nodes = tuple(ClusterNode(instance=f"{n}:19400", job="dltop", node=n, up=True,
                              datasets=(ClusterDataset("/data/my set", up=True, size_bytes=100,
                                                       resident_bytes=10 if n in cold else 100),))
                  for n in names)
    return ClusterPart(url="http://p", selector="", queried_at=0.0, query_s=0.0, queries=14, nodes=nodes)


def test_many_cold_nodes_get_one_srun_and_one_pdsh_line() -> None:
    names = [f"gpu-{i:04d}" for i in range(256)]
    cold = {n for i, n in enumerate(names) if i != 30}
    cmds, notes = warm_commands(_part(names, cold), "/data/my set")
    assert notes == [] and len(cmds) == 2
    srun, pdsh = (shlex.split(c) for c in cmds)
    assert srun[1] == "--nodelist=gpu-[0000-0029,0031-0255]" and srun[-3:] == ["dltop", "warm", "/data/my set"]
    assert pdsh[:3] == ["pdsh", "-w", "gpu-[0000-0029,0031-0255]"] and sorted(expand(pdsh[2])) == sorted(cold)
    few = names[:SSH_LINES_UP_TO]
    cmds, _ = warm_commands(_part(few, set(few)), "/data/my set")
    assert cmds[0].startswith("srun --nodelist='gpu-[0000-0007]' ") and len(cmds) == 1 + len(few)
    assert cmds[1] == "ssh gpu-0000 dltop warm '/data/my set'"


def test_a_host_with_a_comma_gets_no_command() -> None:
    cmds, notes = warm_commands(_part(["a,b", "c"], {"a,b", "c"}), "/data/my set")
    assert cmds[0].startswith("srun --nodelist=c ") and "a,b" not in " ".join(cmds)
    assert any("a,b" in n and "no command" in n for n in notes)
