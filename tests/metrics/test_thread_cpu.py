"""bench/tools/thread_cpu.py against a real process: a child that keeps one
thread busy for two seconds of CPU beside an idle one has that CPU reported
under the busy thread's own name, not the idle thread's, and the sampler
stops by itself when the child exits."""
import pathlib
import re
import subprocess
import sys

REPO_ROOT = pathlib.Path(__file__).resolve().parents[2]
THREAD_CPU = REPO_ROOT / "bench" / "tools" / "thread_cpu.py"

# Spins until its main thread, named "spinner" (Linux's prctl), has used 2 s
# of CPU (or 20 s have passed), beside a thread named "idler" that sleeps;
# then exits. CPU time rather than wall time: under load (ctest -j2 on two
# cores) the spinner gets less than a core, and spins longer instead.
CHILD = r"""
import ctypes, threading, time
prctl = ctypes.CDLL(None).prctl
def idle():
    prctl(15, b"idler", 0, 0, 0)  # PR_SET_NAME
    time.sleep(60)
threading.Thread(target=idle, daemon=True).start()
prctl(15, b"spinner", 0, 0, 0)
start = time.thread_time()
give_up = time.monotonic() + 20.0
while time.thread_time() - start < 2.0 and time.monotonic() < give_up:
    pass
"""


def test_a_busy_thread_is_reported_by_name_and_the_sampler_stops():
    child = subprocess.Popen([sys.executable, "-c", CHILD])
    try:
        sampled = subprocess.run(
            [sys.executable, str(THREAD_CPU), str(child.pid)],
            capture_output=True, text=True, timeout=60)
    finally:
        child.wait(timeout=60)
    assert sampled.returncode == 0, sampled.stderr
    lines = sampled.stdout.splitlines()
    assert len(lines) >= 2, sampled.stdout
    # Each line's PERCENT is the thread's CPU ticks since the previous
    # sample over a nominal 0.5 s, so PERCENT / 100 * 0.5 summed over the
    # lines is the CPU time the sampler saw each thread use (whatever the
    # load stretched the intervals to).
    seen = {}
    for line in lines:
        assert re.match(r"\s*[0-9.]+s \d+%:\d+:\S", line), line
        for percent, _, name in re.findall(r"(\d+)%:(\d+):(\S+)", line):
            seen[name] = seen.get(name, 0.0) + int(percent) / 100 * 0.5
    assert "spinner" in seen and "idler" in seen, lines
    # The spinner used 2 s of CPU; what fell before the sampler's first
    # sample or after its last (at most an interval of a full core each) is
    # not seen. The idle thread used next to none.
    assert seen["spinner"] >= 0.5, (seen, lines)
    assert seen["idler"] <= 0.1, (seen, lines)
    assert max(seen, key=seen.get) == "spinner", (seen, lines)


def test_without_a_pid_it_prints_its_usage():
    result = subprocess.run([sys.executable, str(THREAD_CPU)],
                            capture_output=True, text=True, timeout=30)
    assert result.returncode != 0
    assert "thread_cpu.py PID" in result.stderr
