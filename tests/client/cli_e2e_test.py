"""End-to-end tests of matmul-cli against a real matmul-server (host engine).

Run with /usr/bin/python3 (it has NumPy; the python3 first on PATH may not):

    MATMUL_BIN_DIR=build/bin /usr/bin/python3 -m pytest -q tests/client/cli_e2e_test.py

MATMUL_BIN_DIR names the directory holding matmul-server and matmul-cli
(CTest sets it); it defaults to <repo>/build/bin.
"""

import os
import pathlib
import re
import signal
import subprocess
import threading
import time

import numpy as np
import pytest

REPO = pathlib.Path(__file__).resolve().parents[2]
BIN_DIR = pathlib.Path(os.environ.get("MATMUL_BIN_DIR", REPO / "build" / "bin"))
SERVER = BIN_DIR / "matmul-server"
CLI = BIN_DIR / "matmul-cli"

# Relative Frobenius error allowed per dtype, against a float64 product of
# the very inputs the server saw.
TOLERANCE = {
    "float32": 1e-5,
    "float64": 1e-12,
    "float16": 1e-2,
    "bfloat16": 1e-2,
}


class Server:
    """A matmul-server child process on a free port."""

    def __init__(self, *extra):
        self.proc = subprocess.Popen(
            [str(SERVER), "--port", "0", "--metrics-port", "0", "--engine", "host"]
            + list(extra),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        self.log = []
        self._ready = threading.Event()
        self.port = None
        # Drain stderr for the whole life of the process so that it never
        # blocks on a full pipe.
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        if not self._ready.wait(timeout=60) or self.port is None:
            self.proc.kill()
            self.proc.wait()
            raise RuntimeError(
                "matmul-server did not report 'serving on port N':\n"
                + "".join(self.log))
        self.target = "127.0.0.1:%d" % self.port

    def _read(self):
        for line in self.proc.stderr:
            self.log.append(line)
            match = re.search(r"serving on port (\d+)", line)
            if match and self.port is None:
                self.port = int(match.group(1))
                self._ready.set()
        self._ready.set()  # exited without serving

    def stop(self):
        """SIGTERM, then the exit status."""
        self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            raise
        finally:
            self._reader.join(timeout=5)


@pytest.fixture(scope="module")
def server():
    assert SERVER.exists(), "%s is not built" % SERVER
    assert CLI.exists(), "%s is not built" % CLI
    s = Server()
    yield s
    rc = s.stop()
    assert rc == 0, "matmul-server exited %d on SIGTERM:\n%s" % (rc, "".join(s.log))


def run_cli(*args):
    return subprocess.run([str(CLI)] + [str(a) for a in args],
                          capture_output=True, text=True, timeout=120)


def relative_error(got, want):
    got = np.asarray(got, dtype=np.float64)
    want = np.asarray(want, dtype=np.float64)
    norm = np.linalg.norm(want)
    return np.linalg.norm(got - want) / (norm if norm > 0 else 1.0)


def to_bfloat16_bits(a):
    """float32 -> bfloat16 bits, rounded to nearest even (finite inputs)."""
    u = np.ascontiguousarray(a, dtype="<f4").view("<u4").astype(np.uint64)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype("<u2")


def from_bfloat16_bits(bits):
    return (np.asarray(bits, dtype=np.uint32) << 16).view(np.float32)


def op(x, transpose):
    return np.swapaxes(x, -1, -2) if transpose else x


def multiply(server, tmp_path, a, b, *flags, name="c"):
    """Saves a and b, runs matmul-cli multiply, returns (result, stdout)."""
    a_path, b_path = tmp_path / (name + "_a.npy"), tmp_path / (name + "_b.npy")
    out = tmp_path / (name + ".npy")
    np.save(a_path, a)
    np.save(b_path, b)
    r = run_cli("multiply", "--target", server.target, "--a", a_path,
                "--b", b_path, "--out", out, *flags)
    assert r.returncode == 0, "matmul-cli failed (%d):\n%s%s" % (
        r.returncode, r.stdout, r.stderr)
    return np.load(out), r.stdout


RNG = np.random.default_rng(20261202)

# (a stored shape, b stored shape, transpose_a, transpose_b)
SHAPES = [
    ((17, 33), (33, 9), False, False),
    ((1, 1), (1, 1), False, False),
    ((64, 128), (128, 96), False, False),
    ((33, 17), (33, 9), True, False),
    ((17, 33), (9, 33), False, True),
    ((33, 17), (9, 33), True, True),
    ((4, 8, 16), (4, 16, 5), False, False),
    ((4, 16, 8), (4, 5, 16), True, True),
    ((8, 16), (3, 16, 5), False, False),        # 2-D A broadcast
    ((3, 8, 16), (16, 5), False, False),        # 2-D B broadcast
    ((1, 8, 16), (3, 16, 5), False, False),     # batch-1 A broadcast
    ((3, 8, 16), (1, 5, 16), False, True),      # batch-1 B broadcast
]


@pytest.mark.parametrize("dtype", ["float32", "float64", "float16"])
@pytest.mark.parametrize("a_shape,b_shape,ta,tb", SHAPES)
def test_multiply_matches_numpy(server, tmp_path, dtype, a_shape, b_shape,
                                ta, tb):
    a = RNG.standard_normal(a_shape).astype(dtype)
    b = RNG.standard_normal(b_shape).astype(dtype)
    flags = (["--transpose-a"] if ta else []) + (["--transpose-b"] if tb else [])
    c, stdout = multiply(server, tmp_path, a, b, *flags)
    want = np.matmul(op(a.astype(np.float64), ta), op(b.astype(np.float64), tb))
    assert c.dtype == np.dtype(dtype)
    assert c.shape == want.shape
    assert relative_error(c, want) < TOLERANCE[dtype]
    # One summary line: where it went, its shape, its dtype, where it ran.
    assert stdout.count("\n") == 1
    assert "shape [%s]" % ", ".join(str(d) for d in want.shape) in stdout
    assert dtype in stdout and " ms" in stdout and "host" in stdout


@pytest.mark.parametrize("a_shape,b_shape,ta,tb", [
    ((17, 33), (33, 9), False, False),
    ((4, 16, 8), (4, 5, 16), True, True),
    ((8, 16), (3, 16, 5), False, False),
])
def test_bfloat16_from_float32(server, tmp_path, a_shape, b_shape, ta, tb):
    a = RNG.standard_normal(a_shape).astype(np.float32)
    b = RNG.standard_normal(b_shape).astype(np.float32)
    flags = (["--transpose-a"] if ta else []) + (["--transpose-b"] if tb else [])
    c, stdout = multiply(server, tmp_path, a, b, "--dtype", "bfloat16", *flags)
    # What the server multiplied: the inputs rounded to bfloat16.
    a16 = from_bfloat16_bits(to_bfloat16_bits(a)).astype(np.float64)
    b16 = from_bfloat16_bits(to_bfloat16_bits(b)).astype(np.float64)
    want = np.matmul(op(a16, ta), op(b16, tb))
    assert c.dtype == np.float32  # written as float32 by default
    assert c.shape == want.shape
    assert relative_error(c, want) < TOLERANCE["bfloat16"]
    # Every value is a bfloat16 widened exactly.
    assert not np.any(c.view(np.uint32) & 0xFFFF)
    assert "bfloat16" in stdout

    # --bf16-out bits gives the same values as raw bits.
    bits, _ = multiply(server, tmp_path, a, b, "--dtype=bfloat16",
                       "--bf16-out=bits", *flags, name="bits")
    assert bits.dtype == np.dtype("<u2")
    np.testing.assert_array_equal(from_bfloat16_bits(bits), c)

    # Raw '<u2' inputs are taken as bfloat16 bits: same product.
    raw, _ = multiply(server, tmp_path, to_bfloat16_bits(a), to_bfloat16_bits(b),
                      "--dtype", "bfloat16", *flags, name="raw")
    np.testing.assert_array_equal(raw, c)


def test_explicit_dtype_converts_inputs(server, tmp_path):
    a = RNG.standard_normal((12, 20))
    b = RNG.standard_normal((20, 7))
    c, stdout = multiply(server, tmp_path, a, b, "--dtype", "float32")
    assert c.dtype == np.float32
    want = a.astype(np.float32).astype(np.float64) @ b.astype(np.float32).astype(np.float64)
    assert relative_error(c, want) < TOLERANCE["float32"]
    # Mixed inputs are fine once a dtype is named.
    c, _ = multiply(server, tmp_path, a.astype(np.float32), b, "--dtype=float64",
                    name="mixed")
    assert c.dtype == np.float64
    want = a.astype(np.float32).astype(np.float64) @ b
    assert relative_error(c, want) < TOLERANCE["float64"]
    c, _ = multiply(server, tmp_path, a, b, "--dtype", "float16", name="half")
    assert c.dtype == np.float16
    assert relative_error(c, a @ b) < TOLERANCE["float16"]


def test_fortran_order_and_big_endian_inputs(server, tmp_path):
    a = RNG.standard_normal((3, 9, 14)).astype(np.float32)
    b = RNG.standard_normal((14, 6)).astype(np.float32)
    want = np.matmul(a.astype(np.float64), b.astype(np.float64))
    c, _ = multiply(server, tmp_path, np.asfortranarray(a), b.astype(">f4"))
    assert c.dtype == np.float32
    assert relative_error(c, want) < TOLERANCE["float32"]


def test_tf32_compute_mode(server, tmp_path):
    a = RNG.standard_normal((32, 64)).astype(np.float32)
    b = RNG.standard_normal((64, 16)).astype(np.float32)
    c, _ = multiply(server, tmp_path, a, b, "--compute", "tf32", "--timeout", "60")
    # TF32 keeps 10 mantissa bits of the inputs.
    assert relative_error(c, a.astype(np.float64) @ b) < 1e-2


def test_info(server):
    r = run_cli("info", "--target", server.target, "--timeout=30")
    assert r.returncode == 0, r.stderr
    out = r.stdout
    assert re.search(r"engine:\s+host", out), out
    assert re.search(r"version:\s+\S+", out), out
    assert re.search(r"streams per device:\s+\d+", out), out
    assert re.search(r"dtypes:\s+float32, float64, float16, bfloat16", out), out
    assert re.search(r"devices:\s+1", out), out
    assert "CPU cores" in out
    assert re.search(r"max message:\s+\d+ bytes", out), out
    assert re.search(r"max in flight:\s+\d+ bytes", out), out
    assert re.search(r"stored per client:\s+\d+ bytes .*, \d+ tensors", out), out
    assert re.search(r"stored tensor TTL:\s+default \d+ s, max \d+ s", out), out


def run_multiply_files(server, tmp_path, a, b, *flags):
    a_path, b_path = tmp_path / "a.npy", tmp_path / "b.npy"
    np.save(a_path, a)
    np.save(b_path, b)
    return run_cli("multiply", "--target", server.target, "--a", a_path,
                   "--b", b_path, "--out", tmp_path / "c.npy", *flags)


def test_inner_dimension_mismatch_is_invalid_argument(server, tmp_path):
    r = run_multiply_files(server, tmp_path, np.ones((4, 5), np.float32),
                           np.ones((6, 3), np.float32))
    assert r.returncode == 1
    assert r.stderr.startswith("error: INVALID_ARGUMENT: inner dimensions differ"), r.stderr
    # The server's own message, which names the shapes.
    assert "[4, 5]" in r.stderr and "[6, 3]" in r.stderr
    assert not (tmp_path / "c.npy").exists()


def test_batch_mismatch_is_invalid_argument(server, tmp_path):
    r = run_multiply_files(server, tmp_path, np.ones((2, 4, 5), np.float32),
                           np.ones((3, 5, 3), np.float32))
    assert r.returncode == 1
    assert r.stderr.startswith("error: INVALID_ARGUMENT: batch dimensions differ"), r.stderr


def test_mixed_dtypes_need_an_explicit_dtype(server, tmp_path):
    r = run_multiply_files(server, tmp_path, np.ones((2, 2), np.float32),
                           np.ones((2, 2), np.float64))
    assert r.returncode == 1
    assert "float32" in r.stderr and "float64" in r.stderr
    assert "--dtype" in r.stderr


def test_uint16_needs_dtype_bfloat16(server, tmp_path):
    r = run_multiply_files(server, tmp_path, np.ones((2, 2), np.uint16),
                           np.ones((2, 2), np.uint16))
    assert r.returncode == 1
    assert "--dtype bfloat16" in r.stderr


def test_unsupported_npy_dtype(server, tmp_path):
    # Integers only with a float --dtype to convert them to
    # (test_integer_npy_multiplies_with_a_float_dtype).
    r = run_multiply_files(server, tmp_path, np.ones((2, 2), np.int32),
                           np.ones((2, 2), np.float32))
    assert r.returncode == 1
    assert "dtype '<i4' (int32) is read only when converted" in r.stderr
    r = run_multiply_files(server, tmp_path, np.full((2, 2), "x"),
                           np.ones((2, 2), np.float32))
    assert r.returncode == 1
    assert "unsupported dtype '<U1'" in r.stderr


def test_missing_file(server, tmp_path):
    np.save(tmp_path / "b.npy", np.ones((2, 2), np.float32))
    missing = tmp_path / "nope.npy"
    r = run_cli("multiply", "--target", server.target, "--a", missing,
                "--b", tmp_path / "b.npy", "--out", tmp_path / "c.npy")
    assert r.returncode != 0
    assert str(missing) in r.stderr
    assert "No such file or directory" in r.stderr


def test_not_an_npy_file(server, tmp_path):
    (tmp_path / "a.npy").write_text("hello")
    np.save(tmp_path / "b.npy", np.ones((2, 2), np.float32))
    r = run_cli("multiply", "--target", server.target, "--a", tmp_path / "a.npy",
                "--b", tmp_path / "b.npy", "--out", tmp_path / "c.npy")
    assert r.returncode == 1
    assert "not a .npy file" in r.stderr


def test_unwritable_output(server, tmp_path):
    np.save(tmp_path / "a.npy", np.ones((2, 2), np.float32))
    r = run_cli("multiply", "--target", server.target, "--a", tmp_path / "a.npy",
                "--b", tmp_path / "a.npy", "--out", tmp_path / "no" / "c.npy")
    assert r.returncode == 1
    assert "no/c.npy" in r.stderr


def test_unreachable_server(tmp_path):
    np.save(tmp_path / "a.npy", np.ones((2, 2), np.float32))
    # Port 1 on loopback: nothing listens there.
    r = run_cli("multiply", "--target", "127.0.0.1:1", "--a", tmp_path / "a.npy",
                "--b", tmp_path / "a.npy", "--out", tmp_path / "c.npy",
                "--timeout", "20")
    assert r.returncode == 1
    assert r.stderr.startswith("error: UNAVAILABLE: "), r.stderr
    r = run_cli("info", "--target", "127.0.0.1:1")
    assert r.returncode == 1
    assert r.stderr.startswith("error: UNAVAILABLE: "), r.stderr


@pytest.mark.parametrize("args,message", [
    ([], "no command"),
    (["frobnicate"], "unknown command"),
    (["multiply", "--target", "x:1", "--a", "a", "--b", "b"], "--out is required"),
    (["multiply", "--target", "x:1", "--a", "a", "--b", "b", "--out", "c",
      "--bogus"], "unknown flag --bogus"),
    (["multiply", "--target", "x:1", "--a", "a", "--b", "b", "--out"],
     "--out needs a value"),
    (["multiply", "--target", "x:1", "--a", "a", "--b", "b", "--out", "c",
      "--compute", "fast"], "--compute takes strict or tf32"),
    (["multiply", "--target", "x:1", "--a", "a", "--b", "b", "--out", "c",
      "--dtype=int8"], "--dtype takes"),
    (["multiply", "--target", "x:1", "--a", "a", "--b", "b", "--out", "c",
      "--timeout", "-1"], "--timeout takes a positive number"),
    (["multiply", "--target", "x:1", "--a", "a", "--b", "b", "--out", "c",
      "--bf16-out", "bits"], "--bf16-out applies only with --dtype bfloat16"),
    (["multiply", "--target", "x:1", "--a", "a", "--a", "b", "--b", "b",
      "--out", "c"], "--a is given more than once"),
    (["multiply", "--target", "x:1", "--a", "a", "--b", "b", "--out", "c",
      "stray"], "unexpected argument"),
    (["info"], "--target is required"),
    (["multiply", "--target", "x:1", "--a", "a", "--a-handle", "h", "--b", "b",
      "--out", "c"], "--a and --a-handle exclude each other"),
    (["multiply", "--target", "x:1", "--b", "b", "--out", "c"],
     "--a is required (or --a-handle)"),
    (["multiply", "--target", "x:1", "--a", "a", "--out", "c"],
     "--b is required (or --b-handle)"),
    (["multiply", "--target", "x:1", "--a", "a", "--b", "b", "--out", "c",
      "--keep"], "--out and --keep exclude each other"),
    (["multiply", "--target", "x:1", "--a", "a", "--b", "b"],
     "--out is required (or --keep)"),
    (["multiply", "--target", "x:1", "--a", "a", "--b", "b", "--out", "c",
      "--ttl", "5"], "--ttl applies only with --keep"),
    (["multiply", "--target", "x:1", "--a", "a", "--b", "b", "--keep",
      "--ttl", "0"], "--ttl takes a positive whole number"),
    (["multiply", "--target", "x:1", "--a-handle", "", "--b", "b", "--keep"],
     "--a-handle is empty"),
    (["multiply", "--target", "x:1", "--a", "a", "--b", "b", "--out", "c",
      "--client-id", "caf\u00e9"], "client id"),
    (["multiply", "--target", "x:1", "--a", "a", "--b", "b", "--out", "c",
      "--stripes", "2"], "--stripes applies only with --stream"),
    (["multiply", "--target", "x:1", "--a", "a", "--b", "b", "--out", "c",
      "--stream", "--stripes", "0"], "--stripes takes 1 to 16, got \"0\""),
    (["multiply", "--target", "x:1", "--a", "a", "--b", "b", "--out", "c",
      "--stream", "--stripes", "17"], "--stripes takes 1 to 16, got \"17\""),
    (["upload", "--target", "x:1"], "--a is required"),
    (["upload", "--target", "x:1", "--a", "a", "--device", "gpu0"],
     "--device takes a device index"),
    (["upload", "--target", "x:1", "--a", "a", "--ttl", "1.5"],
     "--ttl takes a positive whole number"),
    (["download", "--target", "x:1", "--out", "c"], "--handle is required"),
    (["download", "--target", "x:1", "--handle", "h"], "--out is required"),
    (["download", "--target", "x:1", "--handle", "h", "--out", "c",
      "--bf16-out", "raw"], "--bf16-out takes float32 or bits"),
    (["delete", "--target", "x:1"], "--handle is required"),
    (["delete", "--target", "x:1", "--handle", "h", "--out", "c"],
     "unknown flag --out"),
])
def test_usage_errors_exit_2(args, message):
    r = run_cli(*args)
    assert r.returncode == 2, r.stderr
    assert message in r.stderr
    # One line, not the whole help.
    assert r.stderr.startswith("matmul-cli: "), r.stderr
    assert r.stderr.endswith("; see --help\n"), r.stderr
    assert len(r.stderr.splitlines()) == 1, r.stderr


def test_flags_take_both_spellings(tmp_path):
    # --flag=value and --flag value, dashes and underscores: the same usage
    # error comes from each spelling of --chunk-mib.
    for args in (["--chunk-mib=0"], ["--chunk-mib", "0"], ["--chunk_mib=0"]):
        r = run_cli("multiply", "--target", "x:1", "--a", "a", "--b", "b",
                    "--out", "c", "--stream", *args)
        assert r.returncode == 2, r.stderr
        assert "--chunk-mib takes 1 to 1024" in r.stderr


def test_help():
    for args in (["--help"], ["help"], ["multiply", "--help"], ["-h"]):
        r = run_cli(*args)
        assert r.returncode == 0, r.stderr
        assert "usage:" in r.stdout
        assert "--a-handle=ID" in r.stdout and "--chunk-mib=N" in r.stdout
        assert "--stripes=K" in r.stdout


def test_sigterm_stops_the_server_cleanly(tmp_path):
    s = Server()
    try:
        r = run_cli("info", "--target", s.target)
        assert r.returncode == 0, r.stderr
    finally:
        rc = s.stop()
    assert rc == 0, "".join(s.log)


# --- stored tensors: upload, download, delete, handles in multiply --------------

STORED_LINE = re.compile(
    r"^(h1\.\S+\.-?\d+\.[0-9a-f]{32}|h-[0-9a-f]+) shape \[([0-9, ]+)\] (\w+), (\d+) bytes, on (host|device \d+), "
    r"expires (\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ)$")


def parse_stored(stdout):
    """(id, shape, dtype, bytes) from upload's or multiply --keep's line."""
    lines = stdout.strip().splitlines()
    assert len(lines) == 1, stdout
    m = STORED_LINE.match(lines[0])
    assert m, stdout
    shape = tuple(int(d) for d in m.group(2).split(", "))
    return m.group(1), shape, m.group(3), int(m.group(4))


def ok(r):
    assert r.returncode == 0, "matmul-cli failed (%d):\n%s%s" % (
        r.returncode, r.stdout, r.stderr)
    return r


def upload(server, path, *flags):
    return parse_stored(ok(run_cli("upload", "--target", server.target,
                                   "--a", path, *flags)).stdout)


def test_upload_download_delete(server, tmp_path):
    a = RNG.standard_normal((2, 5, 7)).astype(np.float32)
    np.save(tmp_path / "a.npy", a)
    handle, shape, dtype, nbytes = upload(server, tmp_path / "a.npy",
                                          "--ttl", "100")
    assert (shape, dtype, nbytes) == ((2, 5, 7), "float32", a.nbytes)
    r = ok(run_cli("download", "--target", server.target, "--handle", handle,
                   "--out", tmp_path / "back.npy"))
    assert "shape [2, 5, 7], float32" in r.stdout
    back = np.load(tmp_path / "back.npy")
    assert back.dtype == np.float32
    np.testing.assert_array_equal(back, a)
    r = ok(run_cli("delete", "--target", server.target, "--handle", handle))
    assert handle in r.stdout
    for args in (["delete", "--handle", handle],
                 ["download", "--handle", handle, "--out", tmp_path / "x.npy"]):
        r = run_cli(args[0], "--target", server.target, *args[1:])
        assert r.returncode == 1
        assert r.stderr.startswith("error: NOT_FOUND: "), r.stderr
        assert handle in r.stderr
    assert not (tmp_path / "x.npy").exists()


def test_upload_download_over_the_message_size(tmp_path):
    # 160,000 bytes against 64 KiB messages: upload and download carry the
    # tensor in chunks.
    s = Server("--max-message-bytes", "65536")
    try:
        a = RNG.standard_normal((200, 100))
        np.save(tmp_path / "a.npy", a)
        handle, shape, dtype, nbytes = upload(s, tmp_path / "a.npy")
        assert (shape, dtype, nbytes) == ((200, 100), "float64", a.nbytes)
        ok(run_cli("download", "--target", s.target, "--handle", handle,
                   "--out", tmp_path / "back.npy"))
        np.testing.assert_array_equal(np.load(tmp_path / "back.npy"), a)
        ok(run_cli("delete", "--target", s.target, "--handle", handle))
    finally:
        assert s.stop() == 0, "".join(s.log)


@pytest.mark.parametrize("dtype", ["float32", "float64", "float16"])
def test_handles_in_multiply_and_keep(server, tmp_path, dtype):
    a = RNG.standard_normal((9, 6)).astype(dtype)
    b = RNG.standard_normal((6, 4)).astype(dtype)
    d = RNG.standard_normal((4, 3)).astype(dtype)
    for name, x in (("a", a), ("b", b), ("d", d)):
        np.save(tmp_path / (name + ".npy"), x)
    ha = upload(server, tmp_path / "a.npy")[0]
    hb = upload(server, tmp_path / "b.npy")[0]
    want = a.astype(np.float64) @ b.astype(np.float64)
    out = tmp_path / "c.npy"
    for operands in (["--a-handle", ha, "--b", tmp_path / "b.npy"],
                     ["--a", tmp_path / "a.npy", "--b-handle", hb],
                     ["--a-handle", ha, "--b-handle", hb]):
        ok(run_cli("multiply", "--target", server.target, *operands,
                   "--out", out))
        c = np.load(out)
        assert c.dtype == np.dtype(dtype)
        assert relative_error(c, want) < TOLERANCE[dtype], operands
    # Kept, then chained.
    r = ok(run_cli("multiply", "--target", server.target, "--a-handle", ha,
                   "--b-handle", hb, "--keep", "--ttl", "60"))
    hab, shape, kept_dtype, nbytes = parse_stored(r.stdout)
    assert (shape, kept_dtype) == ((9, 4), dtype)
    assert nbytes == 9 * 4 * np.dtype(dtype).itemsize
    assert "kept the product" in r.stderr
    ok(run_cli("download", "--target", server.target, "--handle", hab,
               "--out", tmp_path / "ab.npy"))
    ab = np.load(tmp_path / "ab.npy")
    assert relative_error(ab, want) < TOLERANCE[dtype]
    ok(run_cli("multiply", "--target", server.target, "--a-handle", hab,
               "--b", tmp_path / "d.npy", "--out", out))
    assert relative_error(np.load(out), ab.astype(np.float64) @ d) < TOLERANCE[dtype]
    for h in (ha, hb, hab):
        ok(run_cli("delete", "--target", server.target, "--handle", h))


def test_bfloat16_stored(server, tmp_path):
    a = RNG.standard_normal((8, 5)).astype(np.float32)
    b = RNG.standard_normal((5, 3)).astype(np.float32)
    np.save(tmp_path / "a.npy", a)
    np.save(tmp_path / "b.npy", b)
    ha, _, dtype, nbytes = upload(server, tmp_path / "a.npy",
                                  "--dtype", "bfloat16")
    assert dtype == "bfloat16" and nbytes == a.size * 2
    # Downloads widen to float32, or give the raw bits.
    ok(run_cli("download", "--target", server.target, "--handle", ha,
               "--out", tmp_path / "f.npy"))
    ok(run_cli("download", "--target", server.target, "--handle", ha,
               "--out", tmp_path / "bits.npy", "--bf16-out", "bits"))
    bits = np.load(tmp_path / "bits.npy")
    assert bits.dtype == np.dtype("<u2")
    np.testing.assert_array_equal(bits, to_bfloat16_bits(a))
    np.testing.assert_array_equal(np.load(tmp_path / "f.npy"),
                                  from_bfloat16_bits(bits))
    # The inline operand must be brought to bfloat16 too.
    r = run_cli("multiply", "--target", server.target, "--a-handle", ha,
                "--b", tmp_path / "b.npy", "--out", tmp_path / "c.npy")
    assert r.returncode == 1 and "INVALID_ARGUMENT" in r.stderr, r.stderr
    ok(run_cli("multiply", "--target", server.target, "--a-handle", ha,
               "--b", tmp_path / "b.npy", "--dtype", "bfloat16",
               "--out", tmp_path / "c.npy"))
    c = np.load(tmp_path / "c.npy")
    assert c.dtype == np.float32
    want = (from_bfloat16_bits(to_bfloat16_bits(a)).astype(np.float64)
            @ from_bfloat16_bits(to_bfloat16_bits(b)))
    assert relative_error(c, want) < TOLERANCE["bfloat16"]
    # Two stored operands: --bf16-out works without --dtype.
    hb = upload(server, tmp_path / "b.npy", "--dtype", "bfloat16")[0]
    ok(run_cli("multiply", "--target", server.target, "--a-handle", ha,
               "--b-handle", hb, "--bf16-out", "bits",
               "--out", tmp_path / "cbits.npy"))
    cbits = np.load(tmp_path / "cbits.npy")
    assert cbits.dtype == np.dtype("<u2")
    assert relative_error(from_bfloat16_bits(cbits), want) < TOLERANCE["bfloat16"]
    for h in (ha, hb):
        ok(run_cli("delete", "--target", server.target, "--handle", h))


def test_stored_errors(server, tmp_path):
    np.save(tmp_path / "a.npy", np.ones((3, 3), np.float32))
    np.save(tmp_path / "v.npy", np.ones(3, np.float32))
    r = run_cli("upload", "--target", server.target, "--a", tmp_path / "a.npy",
                "--device", "977")
    assert r.returncode == 1
    assert r.stderr.startswith("error: INVALID_ARGUMENT: device"), r.stderr
    r = run_cli("upload", "--target", server.target, "--a", tmp_path / "v.npy")
    assert r.returncode == 1 and "2-D or 3-D" in r.stderr, r.stderr
    r = run_cli("upload", "--target", server.target, "--a", tmp_path / "a.npy",
                "--ttl", "99999999")
    assert r.returncode == 1
    assert r.stderr.startswith("error: INVALID_ARGUMENT: ttl"), r.stderr
    r = run_cli("multiply", "--target", server.target, "--a-handle", "h-nope",
                "--b", tmp_path / "a.npy", "--out", tmp_path / "c.npy")
    assert r.returncode == 1
    assert r.stderr.startswith("error: NOT_FOUND: "), r.stderr
    # Expiry.
    h = upload(server, tmp_path / "a.npy", "--ttl", "1")[0]
    time.sleep(1.3)
    r = run_cli("download", "--target", server.target, "--handle", h,
                "--out", tmp_path / "gone.npy")
    assert r.returncode == 1
    assert r.stderr.startswith("error: NOT_FOUND: "), r.stderr


def test_client_id_quota(tmp_path):
    s = Server("--max-handles-per-client", "1")
    try:
        np.save(tmp_path / "a.npy", np.ones((2, 2), np.float32))
        path = tmp_path / "a.npy"
        h = upload(s, path, "--client-id", "alice")[0]
        r = run_cli("upload", "--target", s.target, "--a", path,
                    "--client-id", "alice")
        assert r.returncode == 1
        assert r.stderr.startswith("error: RESOURCE_EXHAUSTED: "), r.stderr
        assert "alice" in r.stderr
        r = run_cli("multiply", "--target", s.target, "--a-handle", h,
                    "--b", path, "--keep", "--client-id", "alice")
        assert r.returncode == 1 and "RESOURCE_EXHAUSTED" in r.stderr
        hb = parse_stored(ok(run_cli(
            "multiply", "--target", s.target, "--a-handle", h, "--b", path,
            "--keep", "--client-id", "bob")).stdout)[0]
        for handle in (h, hb):
            ok(run_cli("delete", "--target", s.target, "--handle", handle))
        upload(s, path, "--client-id", "alice")
    finally:
        assert s.stop() == 0, "".join(s.log)


# --- integer and other .npy dtypes ----------------------------------------------


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_integer_npy_multiplies_with_a_float_dtype(server, tmp_path, dtype):
    a = np.arange(12).reshape(3, 4)  # int64, what np.arange makes
    b = (np.arange(20).reshape(4, 5) % 7).astype(np.uint8)
    assert a.dtype == np.int64
    c, _ = multiply(server, tmp_path, a, b, "--dtype", dtype)
    assert c.dtype == np.dtype(dtype)
    np.testing.assert_array_equal(c, np.matmul(a.astype(dtype), b.astype(dtype)))


def test_integer_npy_needs_a_dtype(server, tmp_path):
    np.save(tmp_path / "a.npy", np.arange(6).reshape(2, 3))
    np.save(tmp_path / "b.npy", np.ones((3, 2), np.float32))
    r = run_cli("multiply", "--target", server.target, "--a", tmp_path / "a.npy",
                "--b", tmp_path / "b.npy", "--out", tmp_path / "c.npy")
    assert r.returncode == 1
    assert "int64" in r.stderr and "--dtype float32" in r.stderr, r.stderr


@pytest.mark.parametrize("array,kind", [
    (np.ones((3, 2), bool), "(bool)"),
    (np.ones((3, 2), np.complex64), "(complex)"),
])
def test_bool_and_complex_npy_are_refused(server, tmp_path, array, kind):
    np.save(tmp_path / "a.npy", np.ones((2, 3), np.float32))
    np.save(tmp_path / "b.npy", array)
    r = run_cli("multiply", "--target", server.target, "--a", tmp_path / "a.npy",
                "--b", tmp_path / "b.npy", "--out", tmp_path / "c.npy",
                "--dtype", "float32")
    assert r.returncode == 1
    assert r.stderr.startswith("error: reading --b "), r.stderr
    assert "unsupported dtype" in r.stderr and kind in r.stderr, r.stderr
    assert not (tmp_path / "c.npy").exists()


@pytest.mark.parametrize("stripes", [1, 2, 4])
@pytest.mark.parametrize("a_shape,b_shape,ta,tb", [
    ((300, 200), (200, 150), False, False),
    ((120, 90), (70, 120), True, True),
    ((3, 40, 60), (60, 50), False, False),
])
def test_stream_with_stripes_matches_numpy(server, tmp_path, stripes, a_shape,
                                           b_shape, ta, tb):
    # --chunk-mib 1 on operands of 60-240 KB: one chunk each, so every call
    # but the first may carry nothing but its join; the product still
    # comes back whole.
    a = RNG.standard_normal(a_shape).astype(np.float32)
    b = RNG.standard_normal(b_shape).astype(np.float32)
    flags = (["--transpose-a"] if ta else []) + (["--transpose-b"] if tb else [])
    c, stdout = multiply(server, tmp_path, a, b, "--stream", "--chunk-mib", "1",
                         "--stripes", str(stripes), *flags)
    want = np.matmul(op(a.astype(np.float64), ta), op(b.astype(np.float64), tb))
    assert c.dtype == np.float32 and c.shape == want.shape
    assert relative_error(c, want) < TOLERANCE["float32"]
    assert "streamed in 1 MiB chunks" in stdout
    assert ("over %d striped streams" % stripes in stdout) == (stripes > 1), stdout


def test_stream_with_stripes_over_many_chunks(server, tmp_path):
    # 4 MiB operands in 1 MiB chunks: four chunks each, over eight calls.
    a = RNG.standard_normal((1024, 1024)).astype(np.float32)
    b = RNG.standard_normal((1024, 1024)).astype(np.float32)
    c, stdout = multiply(server, tmp_path, a, b, "--stream", "--chunk-mib", "1",
                         "--stripes", "8")
    want = a.astype(np.float64) @ b.astype(np.float64)
    assert relative_error(c, want) < TOLERANCE["float32"]
    assert "over 8 striped streams" in stdout
    # Against the unstriped stream: the same product (not always the same
    # bytes: the server computes row panels as A's rows arrive, and the
    # panels depend on the order they came in).
    single, _ = multiply(server, tmp_path, a, b, "--stream", "--chunk-mib", "1",
                         name="single")
    assert relative_error(c, single) < TOLERANCE["float32"]


def test_unary_request_over_the_message_limit_says_use_stream(tmp_path):
    s = Server("--max-message-bytes", "100000")
    try:
        a = np.ones((200, 200), np.float32)  # 2 x 160 KB operands
        np.save(tmp_path / "a.npy", a)
        r = run_cli("multiply", "--target", s.target, "--a", tmp_path / "a.npy",
                    "--b", tmp_path / "a.npy", "--out", tmp_path / "c.npy")
        assert r.returncode == 1
        assert r.stderr.startswith(
            "error: RESOURCE_EXHAUSTED: request is over 100000 bytes; "
            "use --stream"), r.stderr
        # A product over the limit (small operands): the server's message,
        # and the same advice.
        np.save(tmp_path / "col.npy", np.ones((200, 1), np.float32))
        np.save(tmp_path / "row.npy", np.ones((1, 200), np.float32))
        r = run_cli("multiply", "--target", s.target, "--a", tmp_path / "col.npy",
                    "--b", tmp_path / "row.npy", "--out", tmp_path / "c.npy")
        assert r.returncode == 1
        assert r.stderr.startswith("error: RESOURCE_EXHAUSTED: "), r.stderr
        assert r.stderr.rstrip().endswith("; use --stream"), r.stderr
    finally:
        assert s.stop() == 0, "".join(s.log)


def test_info_reports_the_version_of_the_build(server):
    # GetServerInfo's version is what --version prints (common/build_info).
    first = run_cli("--version").stdout.splitlines()[0]
    assert first.startswith("matmul-cli "), first
    r = ok(run_cli("info", "--target", server.target))
    assert re.search(r"^version: +%s$" % re.escape(first.split()[1]), r.stdout,
                     re.M), r.stdout
