#!/usr/bin/python3
"""Draws a matmul-server pipeline timeline as a PNG swimlane chart.

    /usr/bin/python3 bench/tools/render_timeline.py INPUT -o timeline.png

INPUT is Chrome trace JSON as served by the metrics port,
GET /timeline?seconds=N (default 2, at most 60): a file, "-" for stdin, or
the URL itself, e.g. http://127.0.0.1:9464/timeline?seconds=2. The same JSON
opens in https://ui.perfetto.dev or chrome://tracing.

One lane per (device, stream), top to bottom; each span is a bar colored by
kind: h2d (host to device copy), gemm, d2h (device to host copy). The
subtitle gives, per device, how much of the shown time it was busy and how
much of its copy time overlapped a GEMM. Needs Debian's python3-matplotlib
(the Agg backend, no display). Exit status: 0 on success, 1 on unreadable
input, 2 on usage errors.
"""

import argparse
import collections
import json
import sys
import urllib.request

import matplotlib

matplotlib.use("Agg")
import matplotlib.patches as mpatches  # noqa: E402  (after the backend)
import matplotlib.pyplot as plt  # noqa: E402

COLORS = {"h2d": "#1f77b4", "gemm": "#2ca02c", "d2h": "#ff7f0e"}
OTHER_COLOR = "#7f7f7f"


def load(source):
    """The parsed trace from a path, "-" or an http(s) URL."""
    if source == "-":
        return json.load(sys.stdin)
    if source.startswith(("http://", "https://")):
        with urllib.request.urlopen(source, timeout=30) as response:
            return json.load(response)
    with open(source, encoding="utf-8") as f:
        return json.load(f)


def parse(trace):
    """(spans, lane names, process names) of a trace.

    spans: list of (pid, tid, name, start_us, dur_us); lane names keyed by
    (pid, tid), process names by pid.
    """
    events = trace["traceEvents"] if isinstance(trace, dict) else trace
    spans, lanes, processes = [], {}, {}
    for e in events:
        ph = e.get("ph")
        if ph == "X":
            spans.append((int(e["pid"]), int(e["tid"]), str(e["name"]),
                          float(e["ts"]), float(e.get("dur", 0.0))))
            lanes.setdefault((int(e["pid"]), int(e["tid"])), None)
        elif ph == "M" and e.get("name") == "process_name":
            processes[int(e["pid"])] = e["args"]["name"]
        elif ph == "M" and e.get("name") == "thread_name":
            lanes[(int(e["pid"]), int(e["tid"]))] = e["args"]["name"]
    return spans, lanes, processes


def union_length(intervals):
    """Total length covered by (start, end) intervals."""
    total, end = 0.0, None
    for s, e in sorted(intervals):
        if end is None or s > end:
            total += e - s
            end = e
        elif e > end:
            total += e - end
            end = e
    return total


def intersection_length(a, b):
    """Length covered by both interval sets (each merged first)."""
    def merged(intervals):
        out = []
        for s, e in sorted(intervals):
            if out and s <= out[-1][1]:
                out[-1][1] = max(out[-1][1], e)
            else:
                out.append([s, e])
        return out

    a, b = merged(a), merged(b)
    i = j = 0
    total = 0.0
    while i < len(a) and j < len(b):
        lo, hi = max(a[i][0], b[j][0]), min(a[i][1], b[j][1])
        if hi > lo:
            total += hi - lo
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return total


def device_name(processes, pid):
    """"GPU 0" or "host": the process name up to its colon."""
    return processes.get(pid, f"device {pid}").split(":")[0]


def device_summary(spans, processes, extent_us):
    """One line per device: busy share of the extent, copy/GEMM overlap."""
    by_pid = collections.defaultdict(lambda: {"all": [], "copy": [], "gemm": []})
    for pid, _, name, ts, dur in spans:
        d = by_pid[pid]
        d["all"].append((ts, ts + dur))
        (d["gemm"] if name == "gemm" else d["copy"]).append((ts, ts + dur))
    parts = []
    for pid in sorted(by_pid):
        d = by_pid[pid]
        busy = union_length(d["all"]) / extent_us if extent_us > 0 else 0.0
        text = f"{device_name(processes, pid)}: busy {busy:.0%}"
        copy = union_length(d["copy"])
        if copy > 0 and d["gemm"]:
            overlap = intersection_length(d["copy"], d["gemm"]) / copy
            text += f", copies overlapped with GEMM {overlap:.0%}"
        parts.append(text)
    return "; ".join(parts)


def render(trace, output, title=None, width=12.0):
    spans, lanes, processes = parse(trace)
    keys = sorted(lanes)
    if not keys:
        raise ValueError("the trace has no lanes (no spans and no thread names)")
    row = {key: i for i, key in enumerate(keys)}
    start = min((s[3] for s in spans), default=0.0)
    end = max((s[3] + s[4] for s in spans), default=start + 1.0)
    extent_us = max(end - start, 1e-3)
    min_width_ms = extent_us / 1e3 / 2000  # keep very short spans visible

    height = 1.4 + 0.32 * len(keys)
    fig, ax = plt.subplots(figsize=(width, height), dpi=120)
    bars = collections.defaultdict(list)
    for pid, tid, name, ts, dur in spans:
        bars[(row[(pid, tid)], name)].append(
            ((ts - start) / 1e3, max(dur / 1e3, min_width_ms)))
    for (r, name), xranges in bars.items():
        ax.broken_barh(xranges, (r - 0.4, 0.8),
                       facecolors=COLORS.get(name, OTHER_COLOR),
                       edgecolor="white", linewidth=0.3)

    def lane_label(key):
        pid, tid = key
        return f"{device_name(processes, pid)} / {lanes[key] or f'stream {tid}'}"

    ax.set_yticks(range(len(keys)))
    ax.set_yticklabels([lane_label(k) for k in keys], fontsize=8)
    ax.set_ylim(len(keys) - 0.5, -0.5)
    ax.set_xlim(0, extent_us / 1e3)
    ax.set_xlabel("time (ms)")
    ax.grid(axis="x", linestyle=":", linewidth=0.5)
    other = trace.get("otherData", {}) if isinstance(trace, dict) else {}
    heading = title or (
        f"matmul pipeline timeline ({other.get('engine', '?')} engine, "
        f"{len(spans)} spans)")
    summary = device_summary(spans, processes, extent_us)
    ax.set_title(heading + ("\n" + summary if summary else ""), fontsize=9,
                 loc="left")
    # Pipeline order first, then any other kinds.
    used = list(COLORS) + sorted({s[2] for s in spans} - set(COLORS))
    ax.legend(handles=[mpatches.Patch(color=COLORS.get(n, OTHER_COLOR), label=n)
                       for n in used],
              loc="lower right", bbox_to_anchor=(1.0, 1.0), fontsize=8,
              ncol=len(used), frameon=False)
    fig.tight_layout()
    fig.savefig(output, format="png")
    plt.close(fig)


def main(argv=None):
    parser = argparse.ArgumentParser(
        description="Render /timeline Chrome trace JSON as a PNG swimlane chart.")
    parser.add_argument("input", help="trace file, - for stdin, or a /timeline URL")
    parser.add_argument("-o", "--output", default="timeline.png",
                        help="PNG to write (default: timeline.png)")
    parser.add_argument("--title", help="chart title")
    parser.add_argument("--width", type=float, default=12.0,
                        help="figure width in inches (default 12)")
    args = parser.parse_args(argv)
    try:
        trace = load(args.input)
        render(trace, args.output, args.title, args.width)
    except (OSError, ValueError, KeyError, TypeError) as error:
        print(f"render_timeline: {args.input}: {error}", file=sys.stderr)
        return 1
    print(f"render_timeline: wrote {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
