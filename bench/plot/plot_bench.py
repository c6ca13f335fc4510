#!/usr/bin/python3
"""Turns matmul-bench JSON reports into PNG charts.

    /usr/bin/python3 bench/plot/plot_bench.py run1.json [run2.json ...] --out DIR

Writes, in DIR:
  throughput.png  successful requests/s and payload GB/s (both directions)
                  against concurrency
  tflops.png      achieved TFLOP/s against concurrency
  latency.png     latency p50, p90, p99 and p99.9 (ms) against concurrency

Every chart has one series per (label, shape, dtype), with the compute mode,
resident operands, the open-loop rate and a streamed load (--stream: its
stripes and chunk size) added to the name where they are not the defaults.
Points of one series measured more than once at the same concurrency are
averaged. Needs Debian's python3-matplotlib (the Agg backend, no display).
Exit status: 0 on success, 1 on unreadable input, 2 on usage errors.
"""

import argparse
import collections
import json
import os
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402  (after choosing the backend)

SCHEMA = "matmul-bench/1"
PERCENTILES = [("p50", "p50"), ("p90", "p90"), ("p99", "p99"),
               ("p99_9", "p99.9")]


def load_points(paths):
    """All points of all files, in file order."""
    points = []
    for path in paths:
        try:
            with open(path, encoding="utf-8") as f:
                doc = json.load(f)
        except (OSError, ValueError) as e:
            raise SystemExit("plot_bench: cannot read %s: %s" % (path, e))
        if not isinstance(doc, dict) or doc.get("schema") != SCHEMA:
            raise SystemExit("plot_bench: %s is not a matmul-bench report "
                             "(schema %s)" % (path, SCHEMA))
        points.extend(doc.get("points", []))
    return points


def series_name(p):
    parts = []
    if p.get("label"):
        parts.append(p["label"])
    parts.append(p.get("shape", "?"))
    parts.append(p.get("dtype", "?"))
    if p.get("compute", "strict") != "strict":
        parts.append(p["compute"])
    if p.get("resident", "none") != "none":
        parts.append("resident=" + p["resident"])
    if p.get("mode") == "open" and p.get("rate"):
        parts.append("@%g/s" % p["rate"])
    stream = p.get("stream") if p.get("streamed") else None
    if stream:
        stripes = int(stream.get("stripes", 1))
        chunk = int(stream.get("chunk_bytes", 0))
        text = "streamed" if stripes <= 1 else "streamed x%d" % stripes
        if chunk >= 1 << 20 and chunk % (1 << 20) == 0:
            text += " (%d MiB chunks)" % (chunk >> 20)
        elif chunk > 0:
            text += " (%d KiB chunks)" % max(1, chunk >> 10)
        parts.append(text)
    return " ".join(parts)


def group(points):
    """{series name: [(concurrency, averaged point fields), ...]}, sorted."""
    by_series = collections.OrderedDict()
    for p in points:
        by_series.setdefault(series_name(p), collections.defaultdict(list))
        by_series[series_name(p)][int(p["concurrency"])].append(p)
    out = collections.OrderedDict()
    for name, by_c in by_series.items():
        rows = []
        for c in sorted(by_c):
            ps = by_c[c]

            def mean(get):
                values = [get(p) for p in ps]
                values = [v for v in values if v is not None]
                return sum(values) / len(values) if values else float("nan")

            rows.append({
                "concurrency": c,
                "requests_per_s": mean(lambda p: p.get("requests_per_s")),
                "request_gb_per_s": mean(lambda p: p.get("request_gb_per_s")),
                "response_gb_per_s":
                    mean(lambda p: p.get("response_gb_per_s")),
                "total_gb_per_s": mean(lambda p: p.get("total_gb_per_s")),
                "tflop_per_s": mean(lambda p: p.get("tflop_per_s")),
                "latency": {
                    key: mean(lambda p, key=key: p["latency_ms"].get(key))
                    for key, _ in PERCENTILES
                },
            })
        out[name] = rows
    return out


def wide_range(values):
    """True when positive values span more than two decades (log axis)."""
    values = [v for v in values if v == v and v > 0]
    return bool(values) and max(values) / min(values) > 100


def setup_axis(ax, title, ylabel, values):
    ax.set_title(title)
    ax.set_xlabel("concurrency (requests in flight)")
    ax.set_ylabel(ylabel)
    ax.set_xscale("log", base=2)
    if wide_range(values):
        ax.set_yscale("log")
    ax.grid(True, which="both", alpha=0.3)


def concurrency_ticks(ax, series):
    cs = sorted({r["concurrency"] for rows in series.values() for r in rows})
    if cs:
        ax.set_xticks(cs)
        ax.set_xticklabels([str(c) for c in cs])


def plot_throughput(series, path):
    fig, (ax_rps, ax_gbs) = plt.subplots(1, 2, figsize=(13, 5))
    all_rps, all_gbs = [], []
    for name, rows in series.items():
        cs = [r["concurrency"] for r in rows]
        rps = [r["requests_per_s"] for r in rows]
        total = [r["total_gb_per_s"] for r in rows]
        sent = [r["request_gb_per_s"] for r in rows]
        received = [r["response_gb_per_s"] for r in rows]
        all_rps += rps
        all_gbs += total + sent + received
        ax_rps.plot(cs, rps, marker="o", label=name)
        line, = ax_gbs.plot(cs, total, marker="o", label=name)
        ax_gbs.plot(cs, sent, marker="^", linestyle="--",
                    color=line.get_color(), alpha=0.6)
        ax_gbs.plot(cs, received, marker="v", linestyle=":",
                    color=line.get_color(), alpha=0.6)
    # One legend entry per series; the line styles are explained once.
    ax_gbs.plot([], [], color="gray", marker="o", label="total (solid)")
    ax_gbs.plot([], [], color="gray", marker="^", linestyle="--",
                label="request A+B (dashed)")
    ax_gbs.plot([], [], color="gray", marker="v", linestyle=":",
                label="response C (dotted)")
    setup_axis(ax_rps, "Throughput", "successful requests/s", all_rps)
    setup_axis(ax_gbs, "Payload on the wire", "GB/s (1e9 B/s)", all_gbs)
    for ax in (ax_rps, ax_gbs):
        concurrency_ticks(ax, series)
        ax.legend(fontsize="small")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_tflops(series, path):
    fig, ax = plt.subplots(figsize=(7, 5))
    values = []
    for name, rows in series.items():
        cs = [r["concurrency"] for r in rows]
        tf = [r["tflop_per_s"] for r in rows]
        values += tf
        ax.plot(cs, tf, marker="o", label=name)
    setup_axis(ax, "Achieved compute", "TFLOP/s", values)
    concurrency_ticks(ax, series)
    ax.legend(fontsize="small")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_latency(series, path):
    fig, axes = plt.subplots(2, 2, figsize=(13, 9))
    for ax, (key, title) in zip(axes.flat, PERCENTILES):
        values = []
        for name, rows in series.items():
            cs = [r["concurrency"] for r in rows]
            ms = [r["latency"][key] for r in rows]
            values += ms
            ax.plot(cs, ms, marker="o", label=name)
        setup_axis(ax, "Latency " + title, "ms", values)
        concurrency_ticks(ax, series)
        ax.legend(fontsize="small")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv):
    parser = argparse.ArgumentParser(
        description="Charts (PNG) from matmul-bench --json reports.")
    parser.add_argument("reports", nargs="+", help="matmul-bench JSON files")
    parser.add_argument("--out", default=".", help="directory for the PNGs")
    args = parser.parse_args(argv)

    points = load_points(args.reports)
    if not points:
        print("plot_bench: the reports hold no points", file=sys.stderr)
        return 1
    series = group(points)
    os.makedirs(args.out, exist_ok=True)
    written = []
    for filename, plot in (("throughput.png", plot_throughput),
                           ("tflops.png", plot_tflops),
                           ("latency.png", plot_latency)):
        path = os.path.join(args.out, filename)
        plot(series, path)
        written.append(path)
    for path in written:
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
