"""The Grafana dashboard (deploy/grafana/) and every query that names a
matmul metric: the dashboard's structure, its PromQL through
`promtool check rules`, and metric names that the server exports (as listed
in docs/METRICS.md) in the dashboard, the Prometheus rules, the
prometheus-adapter rules and the KEDA triggers."""

from __future__ import annotations

import json
import re
import subprocess

import pytest

from metrics_helpers import REPO_ROOT

DASHBOARD = REPO_ROOT / "deploy" / "grafana" / "dashboards" / "matmul-overview.json"
DOC = REPO_ROOT / "docs" / "METRICS.md"
QUERY_FILES = [
    REPO_ROOT / "deploy" / "prometheus" / "matmul-rules.yml",
    REPO_ROOT / "deploy" / "prometheus-adapter" / "values.yaml",
    REPO_ROOT / "deploy" / "components" / "keda" / "scaledobject.yaml",
    REPO_ROOT / "deploy" / "base" / "prometheusrule.yaml",
]
# Grafana's variables, as concrete values that PromQL accepts.
SUBSTITUTIONS = [
    (r"\$\{?__rate_interval\}?", "1m"),
    (r"\$\{?__interval\}?", "1m"),
    (r"\$\{?__range\}?", "1h"),
    (r"\$\{?pod(:[a-z]+)?\}?", ".*"),
    (r"\$\{?device(:[a-z]+)?\}?", ".*"),
]


def dashboard():
    return json.loads(DASHBOARD.read_text())


def all_panels(panels):
    for p in panels:
        yield p
        yield from all_panels(p.get("panels", []))


def substitute(expr: str) -> str:
    for pattern, value in SUBSTITUTIONS:
        expr = re.sub(pattern, value, expr)
    return expr


def documented_metrics():
    names = set()
    for line in DOC.read_text().splitlines():
        m = re.match(r"\|\s*`(matmul_[a-z_]+)`\s*\|\s*(counter|gauge|histogram)\s*\|", line)
        if m:
            names.add(m.group(1))
    assert len(names) >= 15, "metrics table of docs/METRICS.md not found"
    return names


def metric_names(text: str):
    """matmul_* identifiers in `text`, histogram suffixes removed; recording
    rule names (level:metric:ops) are skipped."""
    names = set()
    for m in re.finditer(r"(?<![:\w])(matmul_[a-z_]+)(?![:\w])", text):
        name = re.sub(r"_(bucket|sum|count)$", "", m.group(1))
        names.add(name)
    return names


def test_dashboard_structure():
    d = dashboard()
    assert d["uid"] == "matmul-overview"
    variables = {v["name"]: v for v in d["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    for name in ("pod", "device"):
        v = variables[name]
        assert v["type"] == "query" and v["multi"] and v["includeAll"]
        assert v["allValue"] == ".*"
        assert v["datasource"]["uid"] == "${datasource}"
    ids = [p["id"] for p in all_panels(d["panels"])]
    assert len(ids) == len(set(ids)), "panel ids must be unique"
    titles = {p["title"] for p in all_panels(d["panels"])}
    for wanted in ("Request rate by code", "Error ratio", "Latency p50 / p99",
                   "Stage breakdown (mean per request)", "Stream utilization",
                   "Device utilization", "Copy/compute overlap", "Transfer rate",
                   "Pinned staging pool", "In-flight requests", "Queued requests"):
        assert wanted in titles, wanted
    for p in all_panels(d["panels"]):
        g = p["gridPos"]
        assert 0 <= g["x"] and g["x"] + g["w"] <= 24, p["title"]
        if p["type"] == "row":
            continue
        assert p["datasource"]["uid"] == "${datasource}", p["title"]
        assert p["targets"], p["title"]
        for t in p["targets"]:
            assert t["datasource"]["uid"] == "${datasource}", p["title"]
            # Every panel follows the pod selector.
            assert 'pod=~"$pod"' in t["expr"], (p["title"], t["expr"])


def dashboard_queries():
    """(record name, PromQL) of every panel target and variable query."""
    d = dashboard()
    out = []
    for p in all_panels(d["panels"]):
        for t in p.get("targets", []):
            out.append((f"dashboard:panel_{p['id']}_{t['refId']}", substitute(t["expr"])))
    for v in d["templating"]["list"]:
        if v["type"] != "query":
            continue
        m = re.fullmatch(r"label_values\((.*),\s*(\w+)\)", v["definition"])
        assert m, v["definition"]
        out.append((f"dashboard:variable_{v['name']}", substitute(m.group(1))))
    return out


def test_every_dashboard_query_is_valid_promql(tmp_path):
    queries = dashboard_queries()
    assert len(queries) >= 25
    for name, expr in queries:
        assert "$" not in expr, f"{name}: unsubstituted variable in {expr}"
    # JSON is YAML: promtool reads this as a rule file.
    rules = {"groups": [{"name": "dashboard",
                         "rules": [{"record": n, "expr": e} for n, e in queries]}]}
    path = tmp_path / "dashboard-rules.yml"
    path.write_text(json.dumps(rules, indent=1))
    result = subprocess.run(["promtool", "check", "rules", str(path)],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"SUCCESS: {len(queries)} rules found" in result.stdout


def yaml_queries(text: str) -> str:
    """The YAML without comments and without prometheus-adapter's published
    names (`as:`), which are not server metrics."""
    kept = []
    for line in text.splitlines():
        if line.lstrip().startswith("#") or re.match(r"\s*as:", line):
            continue
        kept.append(re.sub(r"\s#\s.*$", "", line))
    return "\n".join(kept)


@pytest.mark.parametrize("source", ["dashboard"] + [str(p.relative_to(REPO_ROOT)) for p in QUERY_FILES])
def test_queries_name_only_exported_metrics(source):
    text = (DASHBOARD.read_text() if source == "dashboard"
            else yaml_queries((REPO_ROOT / source).read_text()))
    used = metric_names(text)
    assert used, f"{source} names no matmul metric"
    unknown = sorted(used - documented_metrics())
    assert unknown == [], f"{source} names metrics the server does not export: {unknown}"
