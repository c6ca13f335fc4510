"""scripts/thread_cpu.py against a real process: a child that keeps one
thread busy for two seconds is reported near a full core under its own name,
and the sampler stops by itself when the child exits."""
import pathlib
import re
import subprocess
import sys

REPO_ROOT = pathlib.Path(__file__).resolve().parents[2]
THREAD_CPU = REPO_ROOT / "scripts" / "thread_cpu.py"

# Spins for 2 s, under the thread name "spinner" (Linux's prctl), then exits.
CHILD = r"""
import ctypes, time
ctypes.CDLL(None).prctl(15, b"spinner", 0, 0, 0)  # PR_SET_NAME
end = time.time() + 2.0
while time.time() < end:
    pass
"""


def test_a_busy_thread_is_reported_by_name_and_the_sampler_stops():
    child = subprocess.Popen([sys.executable, "-c", CHILD])
    try:
        sampled = subprocess.run(
            [sys.executable, str(THREAD_CPU), str(child.pid)],
            capture_output=True, text=True, timeout=30)
    finally:
        child.wait(timeout=30)
    assert sampled.returncode == 0, sampled.stderr
    lines = sampled.stdout.splitlines()
    assert len(lines) >= 2, sampled.stdout
    busiest = []
    for line in lines:
        first = re.match(r"\s*[0-9.]+s (\d+)%:(\d+):(\S+)", line)
        assert first, line
        busiest.append((int(first.group(1)), first.group(3)))
    # Once the name is set and the first interval is whole, the spinner
    # leads; a 2-core CI machine may lend it less than a full core.
    assert max(p for p, name in busiest if name == "spinner") >= 50, lines


def test_without_a_pid_it_prints_its_usage():
    result = subprocess.run([sys.executable, str(THREAD_CPU)],
                            capture_output=True, text=True, timeout=30)
    assert result.returncode != 0
    assert "thread_cpu.py PID" in result.stderr
