#!/usr/bin/python3
"""Draws one streamed multiply from the server's /timeline capture: bytes on
the GPU (uploads done) and bytes copied back (downloads done) over time, the
GEMM, and the window in which the operand chunks arrived.

    /usr/bin/python3 scripts/plot_stream.py TIMELINE.json \\
        --received 0.017 1.319 --chunk-mib 4 -o stream.png

TIMELINE.json is GET /timeline?seconds=N captured after the multiply, with
nothing else running; it must start with the multiply's allocation job.
--received is the receipt window the server logs for the multiply ("received
A-B s", seconds from its start message). Every upload and download job moved
--chunk-mib MiB. Needs python3-matplotlib.
"""

import argparse
import collections
import json

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("timeline")
    parser.add_argument("--received", nargs=2, type=float, required=True)
    parser.add_argument("--chunk-mib", type=float, default=4)
    parser.add_argument("--title", default="")
    parser.add_argument("-o", "--output", required=True)
    args = parser.parse_args()

    with open(args.timeline) as f:
        trace = json.load(f)
    spans = [e for e in trace["traceEvents"] if e.get("ph") == "X"]
    jobs = collections.defaultdict(dict)
    for e in spans:
        jobs[e["args"]["job"]][e["name"]] = e
    ids = sorted(jobs)
    t0 = jobs[ids[0]]["h2d"]["ts"]  # the allocation job's start
    gemm_job = max(ids, key=lambda j: jobs[j]["gemm"]["dur"])
    gemm = jobs[gemm_job]["gemm"]
    gib = args.chunk_mib / 1024

    def cumulative(kind, selected):
        ends = sorted((jobs[j][kind]["ts"] + jobs[j][kind]["dur"] - t0) / 1e6
                      for j in selected)
        return [0.0] + ends, [0.0] + [gib * (i + 1) for i in range(len(ends))]

    up_t, up_b = cumulative("h2d", [j for j in ids if ids[0] < j < gemm_job])
    down_t, down_b = cumulative("d2h", [j for j in ids if j > gemm_job])

    fig, ax = plt.subplots(figsize=(10, 4.2), dpi=110)
    lo, hi = args.received
    ax.axvspan(lo, hi, color="#dddddd", label=f"operand chunks arriving ({lo:.2f}-{hi:.2f} s)")
    ax.step(up_t, up_b, where="post", color="#1f77b4", lw=2,
            label=f"operands on the GPU (H2D done, {len(up_t) - 1} chunks)")
    g0 = (gemm["ts"] - t0) / 1e6
    g1 = g0 + gemm["dur"] / 1e6
    ax.axvspan(g0, g1, color="#2ca02c", alpha=0.5,
               label=f"GEMM ({gemm['dur'] / 1e3:.0f} ms)")
    ax.step(down_t, down_b, where="post", color="#ff7f0e", lw=2,
            label=f"product copied back (D2H done, {len(down_t) - 1} chunks)")
    ax.set_xlabel("seconds since the multiply's start message")
    ax.set_ylabel("GiB")
    ax.set_xlim(0, max(down_t[-1], hi) * 1.02)
    ax.set_ylim(0, max(up_b[-1], down_b[-1]) * 1.08)
    ax.grid(True, ls=":", lw=0.5)
    ax.legend(loc="upper left", fontsize=8)
    ax.set_title(args.title or "one streamed multiply", fontsize=10)
    fig.tight_layout()
    fig.savefig(args.output)
    print(f"plot_stream: wrote {args.output}")


if __name__ == "__main__":
    main()
