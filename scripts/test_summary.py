#!/usr/bin/env python3
"""Counts for scripts/test.sh's closing table.

  test_summary.py count JUNIT... [--pytest-dir DIR] [--since EPOCH]
      Prints "RUN FAILED SKIPPED" summed over JUnit files: CTest's (--output-junit)
      or gtest's (--gtest_output=xml). A CTest entry that ran pytest counts
      the cases of the pytest JUnit file it wrote (DIR/pytest-NAME.xml, only
      if written after EPOCH), not one per file.
  test_summary.py fuzz LOG
      Prints the inputs libFuzzer executed (its final stats in LOG).
  test_summary.py table TSV [--gpu-visible 0|1]
      Prints the table of rows "suite run failed skipped seconds note" and
      exits 1 when a suite failed or ran nothing. The gpu suite may run
      nothing (its tests skip) only where no GPU is visible.

Standard library only: it runs under any python3.
"""
import argparse
import os
import re
import sys
import xml.etree.ElementTree as ET


def _case_outcome(case):
    """'failed', 'skipped' or 'run' for one <testcase>."""
    if case.find("failure") is not None or case.find("error") is not None:
        return "failed"
    status = case.get("status", "")
    if status == "fail":
        return "failed"
    if case.find("skipped") is not None or status in ("notrun", "disabled"):
        return "skipped"
    # gtest writes result="skipped" for GTEST_SKIP.
    if case.get("result") == "skipped":
        return "skipped"
    return "run"


def _cases(path):
    root = ET.parse(path).getroot()
    return list(root.iter("testcase"))


def count(path, pytest_dir=None, since=0.0):
    run = failed = skipped = 0
    for case in _cases(path):
        outcome = _case_outcome(case)
        inner = None
        if pytest_dir:
            candidate = os.path.join(pytest_dir, f"pytest-{case.get('name')}.xml")
            if os.path.exists(candidate) and os.path.getmtime(candidate) >= since:
                inner = candidate
        if inner is None:
            run += outcome != "skipped"
            failed += outcome == "failed"
            skipped += outcome == "skipped"
            continue
        r = f = s = 0
        for sub in _cases(inner):
            o = _case_outcome(sub)
            r += o != "skipped"
            f += o == "failed"
            s += o == "skipped"
        # A pytest run that crashed or timed out may leave a file with no
        # failure in it: the CTest verdict still counts.
        if outcome == "failed" and f == 0:
            f, r = 1, max(r, 1)
        run, failed, skipped = run + r, failed + f, skipped + s
    return run, failed, skipped


def fuzz_runs(path):
    with open(path, errors="replace") as f:
        text = f.read()
    m = re.findall(r"stat::number_of_executed_units:\s*(\d+)", text)
    if m:
        return int(m[-1])
    m = re.findall(r"Done (\d+) runs", text)
    return int(m[-1]) if m else 0


def table(path, gpu_visible):
    rows = []
    with open(path) as f:
        for line in f:
            if line.strip():
                suite, run, failed, skipped, seconds, note = (line.rstrip("\n").split("\t") + [""])[:6]
                rows.append((suite, int(run), int(failed), int(skipped), int(seconds), note))
    bad = []
    width = max([len("suite")] + [len(r[0]) for r in rows])
    print(f"{'suite':<{width}}  {'run':>7}  {'failed':>6}  {'skipped':>7}  {'seconds':>7}  note")
    total_s = 0
    for suite, run, failed, skipped, seconds, note in rows:
        total_s += seconds
        verdict = ""
        if failed:
            verdict = "FAILED"
        elif run == 0 and not (suite == "gpu" and not gpu_visible):
            verdict = "RAN NOTHING"
        if verdict:
            bad.append(f"{suite}: {verdict}")
        text = " ".join(x for x in (verdict, note) if x)
        print(f"{suite:<{width}}  {run:>7}  {failed:>6}  {skipped:>7}  {seconds:>7}  {text}")
    print(f"{'total':<{width}}  {sum(r[1] for r in rows):>7}  {sum(r[2] for r in rows):>6}  "
          f"{sum(r[3] for r in rows):>7}  {total_s:>7}")
    if bad:
        print("not passed: " + "; ".join(bad))
        return 1
    return 0


def main():
    parser = argparse.ArgumentParser()
    sub = parser.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("count")
    c.add_argument("junit", nargs="+")
    c.add_argument("--pytest-dir")
    c.add_argument("--since", type=float, default=0.0)
    z = sub.add_parser("fuzz")
    z.add_argument("log")
    t = sub.add_parser("table")
    t.add_argument("tsv")
    t.add_argument("--gpu-visible", type=int, default=0)
    args = parser.parse_args()
    if args.cmd == "count":
        totals = [0, 0, 0]
        for path in args.junit:
            if os.path.exists(path):
                totals = [a + b for a, b in zip(totals, count(path, args.pytest_dir, args.since))]
        print(*totals)
    elif args.cmd == "fuzz":
        print(fuzz_runs(args.log))
    else:
        return table(args.tsv, bool(args.gpu_visible))
    return 0


if __name__ == "__main__":
    sys.exit(main())
