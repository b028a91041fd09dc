"""`dltop cluster --prometheus URL`: every node's dltop exporter, read back from Prometheus, once (docs/cluster.md)."""

from __future__ import annotations

import argparse
import json


def add_prometheus_options(p: argparse.ArgumentParser, required: bool = False) -> None:
    """--prometheus URL, --selector and the credentials, as Prometheus' own clients take them."""
    p.add_argument("--prometheus", metavar="URL", required=required,
                   help="the Prometheus that scrapes every node's dltop export (http[s]://host:9090)")
    p.add_argument("--selector", dest="prometheus_selector", metavar="MATCHERS",
                   help='label matchers added to every query, e.g. \'job="dltop",cluster="a"\'')
    p.add_argument("--prometheus-user", dest="prometheus_username", metavar="NAME", help="basic auth user name")
    p.add_argument("--prometheus-password-file", metavar="FILE", help="basic auth password, read from FILE")
    p.add_argument("--prometheus-bearer-token-file", metavar="FILE", help="bearer token, read from FILE")
    p.add_argument("--prometheus-ca-file", metavar="FILE", help="CA certificate(s) to check Prometheus' TLS with")
    p.add_argument("--prometheus-insecure", action="store_true", help="do not check Prometheus' TLS certificate")
    p.add_argument("--prometheus-timeout", type=float, metavar="SECONDS",
                   help="for all the queries of a refresh together, answers read in full (default 10)")


def register(sub: argparse._SubParsersAction) -> None:
    """Add `dltop cluster`."""
    p = sub.add_parser("cluster", help="read every node from Prometheus once and print it", description=__doc__)
    add_prometheus_options(p)
    p.add_argument("--json", action="store_true", help="print JSON: every value from Prometheus, or why not")
    p.add_argument("--config", metavar="FILE", help="TOML config file (its prometheus = \"URL\" is the default)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """One refresh of the cluster queries, printed as text or JSON."""
    from dltop.config import load_config, prometheus_options
    from dltop.errors import DltopError
    from dltop.sources.cluster import ClusterError, PrometheusClient, parse_selector, read_cluster
    from dltop.text.cluster import cluster_json, cluster_text

    opts = prometheus_options(args, load_config(args.config).prometheus)
    if opts is None:
        raise DltopError("no Prometheus: give --prometheus URL (or prometheus = \"URL\" in the config)")
    try:
        parse_selector(opts.selector)
    except ValueError as e:
        raise DltopError(f"--selector: {e}") from None
    try:
        # --json: every node's GPUs and ranks too (three more queries, each a series per GPU or rank)
        part = read_cluster(PrometheusClient(opts), opts.selector, detail=bool(args.json))
    except ClusterError as e:
        raise DltopError(str(e)) from None
    if args.json:
        print(json.dumps(cluster_json(part), indent=1))
    else:
        print("\n".join(cluster_text(part)))
    return 0
