"""Write the metrics table of docs/exporter.md from dltop.fields.FIELDS (between its two marker lines), or with
--check say whether it is current (exit 1 if not): the doc lists exactly the metrics dltop export serves.

usage: python scripts/exporter_doc.py [--check]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from dltop.fields import FIELDS, PREFIX  # noqa: E402

DOC = Path(__file__).resolve().parents[1] / "docs" / "exporter.md"
BEGIN = "<!-- metrics: written by scripts/exporter_doc.py from dltop/fields.py; do not edit by hand -->"
END = "<!-- end of metrics -->"
PARTS = {"sources": "Sources", "memory": "Memory and the page cache", "datasets": "Datasets",
         "gpus": "GPUs", "servers": "Inference servers", "probes": "Training and serving processes (the probe)",
         "hints": "Hints"}


def table() -> str:
    """The Markdown of every field, grouped by the part it comes from."""
    out = []
    for part, title in PARTS.items():
        out += [f"### {title}", "", "| metric | type | labels | meaning |", "| --- | --- | --- | --- |"]
        for f in FIELDS:
            if f.part == part:
                labels = ", ".join(f"`{x}`" for x in f.labels) or "-"
                help_text = f.help.replace("|", "\\|")
                out.append(f"| `{PREFIX}{f.name}` | {f.kind} | {labels} | {help_text} |")
        out.append("")
    return "\n".join(out)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="only check that the doc is current")
    args = ap.parse_args()
    text = DOC.read_text()
    head, sep1, rest = text.partition(BEGIN + "\n")
    _, sep2, tail = rest.partition(END)
    if not (sep1 and sep2):
        print(f"{DOC}: the marker lines are missing", file=sys.stderr)
        return 1
    new = head + BEGIN + "\n\n" + table() + "\n" + END + tail
    if args.check:
        if new != text:
            print(f"{DOC} is out of date: run python scripts/exporter_doc.py", file=sys.stderr)
            return 1
        return 0
    DOC.write_text(new)
    return 0


if __name__ == "__main__":
    sys.exit(main())
