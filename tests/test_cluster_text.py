"""The commands the Cluster tab offers for other nodes: a Slurm hostlist that names exactly the cold hosts, quoted
for a shell, one pdsh line instead of an ssh line per host past a few."""

from __future__ import annotations

import re
import shlex

from hypothesis import given, settings
from hypothesis import strategies as st

from dltop.model.cluster import ClusterDataset, ClusterJob, ClusterNode, ClusterPart
from dltop.text.cluster import (
    DATASETS_AT,
    SSH_LINES_UP_TO,
    UNJUDGED_DOWN,
    hostlist,
    judge,
    node_detail,
    node_row,
    residency_cell,
    summary_line,
    warm_commands,
)


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


def _part(names: list[str], cold: set[str], down: frozenset[str] = frozenset()) -> ClusterPart:
    nodes = tuple(ClusterNode(instance=f"{n}:19400", job="dltop", node=n, up=n not in down,
                              datasets=() if n in down else
                              (ClusterDataset("/data/my set", up=True, size_bytes=100, resident_bytes=4096,
                                              resident_ratio=0.1 if n in cold else 1.0),))
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


def test_the_share_is_the_exporters_ratio_never_page_bytes_over_apparent_size() -> None:
    # 1,000 small files, 394 of their pages resident: 1.6 MB of page cache against 0.5 MB of apparent size. The
    # share is the exporter's page-based ratio, never min(1, resident bytes / size) (which said 100%).
    d = ClusterDataset("/data/small", up=True, size_bytes=500_000, resident_bytes=394 * 4096, resident_ratio=0.394)
    node = ClusterNode(instance="n:1", job="dltop", node="n", up=True, datasets=(d,))
    part = ClusterPart(url="http://p", selector="", queried_at=0.0, query_s=0.0, queries=15, nodes=(node,))
    assert d.share == 0.394 and residency_cell(d) == "39%"
    assert "39% of 488 KiB resident (1.5 MiB of page cache)" in "\n".join(node_detail(node))
    cmds, notes = warm_commands(part, "/data/small")
    assert cmds[0].startswith("srun --nodelist=n ") and notes == []
    # no ratio served: unknown (not judged), except an empty dataset, which has nothing to read
    assert ClusterDataset("/d", up=True, size_bytes=10, resident_bytes=4096).share is None
    assert ClusterDataset("/d", up=True, size_bytes=0, resident_bytes=0).share == 1.0


def test_a_down_node_is_never_judged_warm() -> None:
    # 256 nodes, the only cold one down: its numbers are gone, so "warm on every node" is not said, and it is named
    names = [f"gpu-{i:04d}" for i in range(256)]
    part = _part(names, cold={"gpu-0031"}, down=frozenset({"gpu-0031"}))
    cmds, notes = warm_commands(part, "/data/my set")
    assert cmds == []
    assert notes == ["/data/my set is warm on every node that could be judged", "not judged: 1 node down: gpu-0031"]
    assert node_row(part.nodes[31], part.datasets)[DATASETS_AT] == "n/a"  # never "-" (not watched) nor a share
    cold, unjudged = judge(part, "/data/my set")
    assert cold == [] and [n.name for n in unjudged[UNJUDGED_DOWN]] == ["gpu-0031"]
    # one more cold node that is up: its command, and the down one still named
    part = _part(names, cold={"gpu-0031", "gpu-0200"}, down=frozenset({"gpu-0031", "gpu-0032"}))
    cmds, notes = warm_commands(part, "/data/my set")
    assert cmds == ["srun --nodelist=gpu-0200 --ntasks-per-node=1 dltop warm '/data/my set'",
                    "ssh gpu-0200 dltop warm '/data/my set'"]
    assert notes == ["not judged: 2 nodes down: gpu-[0031-0032]"]


def test_the_summary_counts_the_ranks_without_a_job_id_the_jobs_table_lists() -> None:
    # "0 jobs" stood beside a jobs table with a "(no job id)" row of three ranks.
    nodes = _part(["a", "b"], cold=set()).nodes
    loose = ClusterJob(job_id="", rank_count=3, node_count=2)
    part = ClusterPart(url="http://p", selector="", queried_at=0.0, query_s=0.0, queries=14, nodes=nodes, jobs=(loose,))
    assert summary_line(part).startswith("2 nodes, 0 GPUs, 0 jobs + 3 ranks without a job id ·")
    part = ClusterPart(url="http://p", selector="", queried_at=0.0, query_s=0.0, queries=14, nodes=nodes,
                       jobs=(ClusterJob(job_id="run-1", rank_count=2), loose))
    assert ", 1 job + 3 ranks without a job id ·" in summary_line(part)
    part = ClusterPart(url="http://p", selector="", queried_at=0.0, query_s=0.0, queries=14, nodes=nodes)
    assert ", 0 jobs ·" in summary_line(part)
