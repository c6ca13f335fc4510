"""docs/METRICS.md and the real /metrics agree: every family a running
server exports is documented with its type and labels, and every documented
family is exported."""

from __future__ import annotations

import re

from metrics_helpers import REPO_ROOT, http_get, parse_scrape

DOC = REPO_ROOT / "docs" / "METRICS.md"


def documented():
    """{name: (type, set of labels)} from the table rows of docs/METRICS.md."""
    out = {}
    for line in DOC.read_text().splitlines():
        m = re.match(r"\|\s*`((?:matmul|process)_[a-z_]+)`\s*\|\s*(\w+)\s*\|\s*([^|]*)\|", line)
        if m:
            labels = set(re.findall(r"`([a-z_]+)`", m.group(3)))
            out[m.group(1)] = (m.group(2), labels)
    return out


def exported(text):
    """{name: (type, set of labels)} of a scrape."""
    out = {}
    for name, family in parse_scrape(text).items():
        labels = set()
        for series in family["samples"]:
            labels |= set(re.findall(r'([a-z_]+)="', series))
        labels.discard("le")
        out[name] = (family["type"], labels)
    return out


def test_every_exported_metric_is_documented_and_vice_versa(server):
    status, _, body = http_get(server.metrics_url + "/metrics")
    assert status == 200
    docs, real = documented(), exported(body)
    assert len(docs) >= 15, "the metrics table in docs/METRICS.md was not found"
    assert sorted(set(real) - set(docs)) == [], "exported but not documented"
    assert sorted(set(docs) - set(real)) == [], "documented but not exported"
    for name, (kind, labels) in real.items():
        assert docs[name] == (kind, labels), f"{name}: docs say {docs[name]}, server {kind, labels}"
