#!/usr/bin/python3
"""Draws one streamed multiply from the server's /timeline capture: bytes on
the GPU (uploads done) and bytes copied back (downloads done) over time, the
GEMM, and the window in which the operand chunks arrived.

    /usr/bin/python3 bench/plot/plot_stream.py TIMELINE.json \\
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
    # Each job has all three stages; those it did not run last next to
    # nothing. A job is what its longest stage says: an upload (h2d), a
    # multiply (gemm: one, or one per row panel) or a download (d2h).
    dur = {j: {k: jobs[j][k]["dur"] for k in ("h2d", "gemm", "d2h")} for j in ids}
    kind = {j: max(dur[j], key=dur[j].get) for j in ids[1:]}
    panels = [j for j in kind if kind[j] == "gemm"]
    uploads = [j for j in kind if kind[j] == "h2d"]
    downloads = [j for j in kind if kind[j] == "d2h"]
    gib = args.chunk_mib / 1024

    def cumulative(kind, selected):
        ends = sorted((jobs[j][kind]["ts"] + jobs[j][kind]["dur"] - t0) / 1e6
                      for j in selected)
        return [0.0] + ends, [0.0] + [gib * (i + 1) for i in range(len(ends))]

    up_t, up_b = cumulative("h2d", uploads)
    down_t, down_b = cumulative("d2h", downloads)

    fig, ax = plt.subplots(figsize=(10, 4.2), dpi=110)
    lo, hi = args.received
    ax.axvspan(lo, hi, color="#dddddd", label=f"operand chunks arriving ({lo:.2f}-{hi:.2f} s)")
    ax.step(up_t, up_b, where="post", color="#1f77b4", lw=2,
            label=f"operands on the GPU (H2D done, {len(up_t) - 1} chunks)")
    total_ms = sum(dur[j]["gemm"] for j in panels) / 1e3
    for i, j in enumerate(panels):
        g0 = (jobs[j]["gemm"]["ts"] - t0) / 1e6
        g1 = g0 + dur[j]["gemm"] / 1e6
        ax.axvspan(g0, g1, color="#2ca02c", alpha=0.5,
                   label=(f"GEMM ({total_ms:.0f} ms" +
                          (f" in {len(panels)} row panels)" if len(panels) > 1 else ")"))
                   if i == 0 else None)
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
