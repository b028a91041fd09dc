"""`dltop export`: the Sampler's latest Snapshot as Prometheus metrics (docs/exporter.md).

`collector.py` turns Snapshots into metric families through `dltop.fields`; `server.py` serves them over HTTP,
with the TLS and basic auth of an exporter-toolkit web config (`webconfig.py`). Nothing here samples: whoever
runs the Sampler (`dltop export`, the TUI with `--export`) hands each Snapshot to `SnapshotCollector.update`.
"""
