"""Label values from outside in /metrics (a server's model name, a probe's job id) carry no control character: ESC,
BEL, a C1 control, a bidi override or a line separator is written as the visible escape `fmt.printable` shows
(`\\x1b`, the four characters), so `curl` of a scrape in a terminal runs nothing, while the exposition stays valid
(prometheus_client's parsers and promtool read it) and parses back to the escaped text."""

from __future__ import annotations

import re
import shutil
import subprocess
import time

import pytest

from dltop.exporter.collector import SnapshotCollector, families
from dltop.fmt import printable
from dltop.model import Snapshot
from dltop.model.probes import ProbesPart, ProcessProbe
from dltop.model.servers import ModelStats, ServerStats

OSC52 = "\x1b]52;c;cHduZWQ=\x07"  # sets the clipboard of the terminal that shows it
HOSTILE = f"llama{OSC52}\u202eevil\u2066\x9b31m\x7f\u2028\x85\nend"
# Every byte a terminal acts on, or a bidi or line control: what no scrape may hold (but the line breaks it ends
# its lines with).
RAW = re.compile("[\x00-\x09\x0b-\x1f\x7f-\x9f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069\u2028\u2029]")


def _snapshot() -> Snapshot:
    server = ServerStats(url="http://127.0.0.1:8000/metrics", state="ok", engine="vllm",
                         models=(ModelStats(model_name=HOSTILE, kv_usage=0.25, running_requests=3),))
    probe = ProcessProbe(pid=4242, path="/run/user/0/dltop/4242.json", uid=0, start_time_ticks=1, cmd="python t.py",
                         published_at=time.time(), rank=0, job_id=f"job{OSC52}\u202e", data_wait_fraction=0.5)
    return Snapshot(ts=time.time(), host="h", servers=(server,), probes=ProbesPart(processes=(probe,)))


def _scrape(openmetrics: bool) -> str:
    c = SnapshotCollector()
    c.update(_snapshot())
    body, _ = c.render("application/openmetrics-text; version=1.0.0" if openmetrics else "text/plain")
    return body.decode("utf-8")


@pytest.mark.parametrize("openmetrics", [False, True], ids=["text", "openmetrics"])
def test_a_scrape_holds_no_control_character_and_parses_back_to_the_escaped_value(openmetrics: bool) -> None:
    if openmetrics:
        from prometheus_client.openmetrics.parser import text_string_to_metric_families
    else:
        from prometheus_client.parser import text_string_to_metric_families
    text = _scrape(openmetrics)
    assert not RAW.search(text), RAW.findall(text)
    model = printable(HOSTILE)
    assert model == "llama\\x1b]52;c;cHduZWQ=\\x07\\u202eevil\\u2066\\x9b31m\\x7f\\u2028\\x85\\x0aend"
    labels = [s.labels for f in text_string_to_metric_families(text) for s in f.samples]
    assert {"server": "http://127.0.0.1:8000/metrics", "engine": "vllm", "model": model, "replica": ""} in labels
    assert any(x.get("job_id") == "job\\x1b]52;c;cHduZWQ=\\x07\\u202e" and x.get("pid") == "4242" for x in labels)
    # on the wire each escape's backslash is the exposition's '\\': a parser gives back one, never a control
    assert 'model="llama\\\\x1b]52;c;cHduZWQ=\\\\x07\\\\u202eevil' in text


def test_prometheus_clients_own_encoding_is_escaped_too() -> None:
    from prometheus_client import generate_latest
    from prometheus_client.registry import CollectorRegistry

    c = SnapshotCollector()
    c.update(_snapshot())
    registry = CollectorRegistry(auto_describe=False)

    class Fixed:
        def collect(self):  # type: ignore[no-untyped-def]
            return iter(families(c._build()))

    registry.register(Fixed())  # type: ignore[arg-type]
    text = generate_latest(registry).decode()
    assert printable(HOSTILE).replace("\\", "\\\\") in text and not RAW.search(text)


@pytest.mark.parametrize("openmetrics", [False, True], ids=["text", "openmetrics"])
def test_promtool_checks_the_escaped_scrape(openmetrics: bool) -> None:
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("promtool not installed (Debian package prometheus; make test installs it)")
    text = _scrape(openmetrics)
    r = subprocess.run([promtool, "check", "metrics"], input=text, capture_output=True, text=True)
    assert r.returncode == 0 and r.stdout + r.stderr == "", r.stdout + r.stderr
