"""End-to-end tests of the three executables' command lines: --help,
--version, usage errors, and matmul-server --engine=cuda without a GPU.

Run with /usr/bin/python3:

    MATMUL_BIN_DIR=build/bin /usr/bin/python3 -m pytest -q tests/client/tools_e2e_test.py

MATMUL_BIN_DIR names the directory holding matmul-server, matmul-cli and
matmul-bench (CTest sets it); it defaults to <repo>/build/bin.
"""

import os
import pathlib
import re
import shutil
import subprocess

import pytest

REPO = pathlib.Path(__file__).resolve().parents[2]
BIN_DIR = pathlib.Path(os.environ.get("MATMUL_BIN_DIR", REPO / "build" / "bin"))
TOOLS = ["matmul-server", "matmul-cli", "matmul-bench"]


def project_version():
    """The VERSION of project(matmul ...) in the top-level CMakeLists.txt."""
    text = (REPO / "CMakeLists.txt").read_text()
    match = re.search(r"project\(matmul\s+VERSION\s+([0-9.]+)", text)
    assert match, "no project(matmul VERSION ...) in CMakeLists.txt"
    return match.group(1)


def run(tool, *args, timeout=60):
    path = BIN_DIR / tool
    assert path.exists(), "%s is not built" % path
    return subprocess.run([str(path)] + [str(a) for a in args],
                          capture_output=True, text=True, timeout=timeout,
                          stdin=subprocess.DEVNULL)


@pytest.mark.parametrize("tool", TOOLS)
def test_version(tool):
    r = run(tool, "--version")
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0] == "%s %s" % (tool, project_version()), r.stdout
    assert re.fullmatch(r"commit ([0-9a-f]{4,}|unknown)", lines[1]), r.stdout
    assert re.fullmatch(r"CUDA (runtime [0-9.]+, cuBLAS [0-9.a-z]+|none .*)",
                        lines[2]), r.stdout
    assert "Debug build" not in r.stdout


@pytest.mark.parametrize("tool,flag", [
    ("matmul-server", "--max-message-bytes=INT"),
    ("matmul-cli", "--a-handle=ID"),
    ("matmul-bench", "--verify-every"),
])
def test_help_lists_dashed_flags(tool, flag):
    r = run(tool, "--help")
    assert r.returncode == 0, r.stderr
    assert "usage:" in r.stdout
    assert flag in r.stdout


def test_server_help_lists_what_an_operator_sets_and_helpfull_the_rest():
    r = run("matmul-server", "--help")
    assert r.returncode == 0, r.stderr
    # Groups, each a heading.
    for title in ("Listening:", "Engine:", "Request limits:", "Connections:"):
        assert "\n%s\n" % title in r.stdout, r.stdout
    assert "--helpfull" in r.stdout
    listed = re.findall(r"^  --([a-z0-9-]+)", r.stdout, re.M)
    # A list a person can read (issue 53): at most 25 flags.
    assert 15 <= len(listed) <= 25, listed
    assert "batch-window-us" not in listed
    # --helpfull: every flag server/main.cc defines, spelled with dashes.
    full = run("matmul-server", "--helpfull")
    assert full.returncode == 0, full.stderr
    defined = re.findall(r"^ABSL_FLAG\([^,]+,\s*(\w+),",
                         (REPO / "server" / "main.cc").read_text(), re.M)
    assert len(defined) >= 25, defined
    full_listed = re.findall(r"^  --([a-z0-9-]+)", full.stdout, re.M)
    assert sorted(full_listed) == sorted(n.replace("_", "-") for n in defined), full_listed
    assert set(listed) <= set(full_listed)
    assert "\nTuning:\n" in full.stdout, full.stdout


def test_server_takes_a_tuning_flag_that_help_does_not_list():
    r = run("matmul-server", "--host", "127.0.0.1", "--port", "0",
            "--batch-window-us", "x")
    assert r.returncode == 2, r.stderr
    assert "--batch-window-us" in r.stderr or "batch_window_us" in r.stderr, r.stderr


@pytest.mark.parametrize("tool,args", [
    ("matmul-server", ["--bogus"]),
    ("matmul-server", ["--port", "abc"]),
    ("matmul-cli", ["info", "--target", "127.0.0.1:1", "--bogus"]),
    ("matmul-cli", ["frobnicate"]),
    ("matmul-bench", ["--target", "127.0.0.1:1", "--bogus"]),
])
def test_bad_flag_is_one_line_and_exit_2(tool, args):
    r = run(tool, *args)
    assert r.returncode == 2, (r.stdout, r.stderr)
    assert r.stderr.startswith(tool + ": "), r.stderr
    assert r.stderr.endswith("; see --help\n"), r.stderr
    assert len(r.stderr.splitlines()) == 1, r.stderr
    assert "usage:" not in r.stderr


def test_server_takes_underscored_and_environment_flags():
    # A wrong value through each spelling reaches the same check.
    for args in (["--metrics-port=70000"], ["--metrics_port", "70000"]):
        r = run("matmul-server", "--host", "127.0.0.1", "--port", "0", *args)
        assert r.returncode == 2, r.stderr
        assert "--metrics-port must be in [0, 65535]" in r.stderr
    env = dict(os.environ, MATMUL_METRICS_PORT="70000")
    r = subprocess.run([str(BIN_DIR / "matmul-server"), "--host", "127.0.0.1",
                        "--port", "0"], capture_output=True, text=True,
                       timeout=60, env=env, stdin=subprocess.DEVNULL)
    assert r.returncode == 2, r.stderr
    assert "--metrics-port must be in [0, 65535]" in r.stderr


@pytest.mark.parametrize("value", ["0s", "11m"])
def test_server_refuses_a_stripe_join_timeout_out_of_range(value):
    r = run("matmul-server", "--host", "127.0.0.1", "--port", "0",
            "--stripe-join-timeout", value)
    assert r.returncode == 2, r.stderr
    assert "--stripe-join-timeout must be in [1ms, 10m]" in r.stderr


def gpu_visible():
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return False
    try:
        return subprocess.run([smi, "-L"], capture_output=True,
                              timeout=30).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


def test_engine_cuda_without_a_gpu_exits_with_a_message():
    if gpu_visible():
        pytest.skip("nvidia-smi -L lists a GPU: --engine=cuda would start")
    r = run("matmul-server", "--engine=cuda", "--host", "127.0.0.1",
            "--port", "0", "--metrics-port", "0", timeout=120)
    assert r.returncode != 0, r.stderr
    # A build with the CUDA engine looks for a device; one without says so.
    assert ("no CUDA device was found" in r.stderr
            or "this build has no CUDA engine" in r.stderr), r.stderr
    assert "draining" not in r.stderr, r.stderr
    assert "serving on port" not in r.stderr, r.stderr
