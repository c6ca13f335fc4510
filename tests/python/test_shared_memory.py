"""matmul_client.shared_memory against a real matmul-server on a Unix socket.

Products computed from and into a registered region are checked against
NumPy; bad inputs must give the right MatmulError codes; a client killed with
SIGKILL must leave no region behind (ListSharedMemory of another connection
with the same client id, the server's region gauge, /dev/shm); a TCP client
is refused.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
from typing import Iterator

import grpc
import numpy as np
import pytest

import matmul_client
from matmul_client import MatmulError
from matmul_client._proto.matmul.v1 import matmul_pb2
from matmul_client.shared_memory import ALIGNMENT, SharedMemory, list_regions, product_shape, unregister

from conftest import ServerProcess

#: The server's gauge of registered regions.
REGIONS_GAUGE = "matmul_shared_memory_regions"
#: Stored-bytes quota of the test server, per client.
QUOTA_BYTES = 16 << 20
TOLERANCE = {np.float32: 1e-5, np.float64: 1e-12, np.float16: 1e-2}


@pytest.fixture(scope="module")
def shm_server() -> Iterator[ServerProcess]:
    """A server on 127.0.0.1 and on a Unix socket in a fresh folder."""
    folder = tempfile.mkdtemp(prefix="matmul-shm-", dir="/tmp")
    socket = os.path.join(folder, "matmul.sock")
    server = ServerProcess(
        "--unix_socket", socket, "--max-stored-bytes-per-client", str(QUOTA_BYTES), metrics=True
    )
    server.socket = socket  # type: ignore[attr-defined]
    yield server
    status = server.stop()
    shutil.rmtree(folder, ignore_errors=True)
    assert status == 0, f"matmul-server exited with {status} after SIGTERM:\n{server.output()}"


def unix_client(server: ServerProcess, client_id: str) -> matmul_client.Client:
    return matmul_client.Client("unix:" + server.socket, timeout=60, client_id=client_id)


def shm_exists(name: str) -> bool:
    return os.path.exists("/dev/shm/" + name.lstrip("/"))


def relative_error(got: np.ndarray, want: np.ndarray) -> float:
    got = np.asarray(got, dtype=np.float64)
    want = np.asarray(want, dtype=np.float64)
    norm = np.linalg.norm(want)
    return float(np.linalg.norm(got - want) / (norm if norm > 0 else 1.0))


def wait_until(condition, what: str, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def test_product_shape() -> None:
    assert product_shape((2, 3), (3, 4)) == (2, 4)
    assert product_shape((3, 2), (4, 3), True, True) == (2, 4)
    assert product_shape((5, 2, 3), (1, 3, 4)) == (5, 2, 4)
    with pytest.raises(ValueError):
        product_shape((2, 3), (4, 5))
    with pytest.raises(ValueError):
        product_shape((2, 2, 3), (5, 3, 4))


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.float16])
def test_multiply_in_place_matches_numpy(shm_server: ServerProcess, dtype) -> None:
    rng = np.random.default_rng(21)
    with unix_client(shm_server, "shm-multiply") as client:
        with client.shared_memory(1 << 20) as shm:
            a = shm.empty((33, 17), dtype)
            b = shm.empty((17, 9), dtype)
            a[...] = rng.uniform(-1, 1, a.shape)
            b[...] = rng.uniform(-1, 1, b.shape)
            for x in (a, b):
                assert shm.offset_of(x) % ALIGNMENT == 0
            c = shm.multiply(a, b)
            assert c.shape == (33, 9) and c.dtype == np.dtype(dtype)
            assert 0 <= shm.offset_of(c) < shm.nbytes  # in the region
            want = a.astype(np.float64) @ b.astype(np.float64)
            assert relative_error(c, want) < TOLERANCE[dtype]


def test_batches_transposes_and_out(shm_server: ServerProcess) -> None:
    rng = np.random.default_rng(7)
    with unix_client(shm_server, "shm-batches") as client:
        with client.shared_memory(1 << 20) as shm:
            a = shm.array(rng.standard_normal((4, 6, 5)), np.float32)
            b = shm.array(rng.standard_normal((5, 3)), np.float32)
            c = shm.multiply(a, b)
            assert c.shape == (4, 6, 3)
            assert relative_error(c, a.astype(np.float64) @ b) < 1e-5
            # A transposed view goes as a transpose flag, not a copy.
            bt = shm.array(rng.standard_normal((3, 5)), np.float32)
            out = shm.empty((4, 6, 3), np.float32)
            got = shm.multiply(a, bt.T, out=out)
            assert got is out
            assert relative_error(out, a.astype(np.float64) @ bt.T.astype(np.float64)) < 1e-5
            c2 = shm.multiply(b, a[0], transpose_a=True, transpose_b=True)
            assert relative_error(c2, b.T.astype(np.float64) @ a[0].T) < 1e-5
            # Refilled in place, multiplied again into the same out.
            a[...] = 1.0
            shm.multiply(a, bt.T, out=out)
            assert relative_error(out, np.ones((4, 6, 5)) @ bt.T.astype(np.float64)) < 1e-5


def test_region_is_listed_then_gone_when_closed(shm_server: ServerProcess) -> None:
    with unix_client(shm_server, "shm-list") as client:
        shm = client.shared_memory(64 << 10)
        regions = list_regions(client)
        assert [r.id for r in regions] == [shm.region_id]
        assert regions[0].name == shm.name and regions[0].bytes == 64 << 10
        assert not regions[0].pinned  # host engine
        # Unlinked once registered: nothing in /dev/shm even now.
        assert not shm_exists(shm.name)
        shm.close()
        wait_until(lambda: not list_regions(client), "the region to go after close")


def test_name_kept_until_close_when_asked(shm_server: ServerProcess) -> None:
    with unix_client(shm_server, "shm-keepname") as client:
        with client.shared_memory(4096, unlink_when_registered=False) as shm:
            assert shm_exists(shm.name)
            assert os.stat("/dev/shm/" + shm.name[1:]).st_mode & 0o777 == 0o600
        assert not shm_exists(shm.name)


def test_unregister(shm_server: ServerProcess) -> None:
    with unix_client(shm_server, "shm-unregister") as client:
        with client.shared_memory(64 << 10) as shm:
            a = shm.array(np.ones((4, 4), np.float32))
            shm.unregister()
            assert list_regions(client) == []
            with pytest.raises(MatmulError) as error:
                shm.multiply(a, a)
            assert error.value.code() == grpc.StatusCode.NOT_FOUND
            with pytest.raises(MatmulError) as error:
                shm.unregister()
            assert error.value.code() == grpc.StatusCode.NOT_FOUND


def test_another_client_cannot_use_or_unregister_the_region(shm_server: ServerProcess) -> None:
    with unix_client(shm_server, "shm-owner") as owner, unix_client(shm_server, "shm-other") as other:
        with owner.shared_memory(64 << 10) as shm:
            assert list_regions(other) == []
            with pytest.raises(MatmulError) as error:
                unregister(other, shm.region_id)
            assert error.value.code() == grpc.StatusCode.NOT_FOUND
            a = shm.array(np.ones((4, 4), np.float32))
            ref = matmul_pb2.SharedMemoryRef(region_id=shm.region_id, offset=shm.offset_of(a))
            request = matmul_pb2.MultiplyRequest(
                a=matmul_pb2.Tensor(shape=[4, 4], dtype=matmul_pb2.DTYPE_FLOAT32, shared=ref),
                b=matmul_pb2.Tensor(shape=[4, 4], dtype=matmul_pb2.DTYPE_FLOAT32, shared=ref),
            )
            with pytest.raises(grpc.RpcError) as rpc:
                other._stub.Multiply(request, timeout=30, metadata=other._metadata)
            assert rpc.value.code() == grpc.StatusCode.NOT_FOUND
            assert [r.id for r in list_regions(owner)] == [shm.region_id]


def _raw_multiply(client, shm: SharedMemory, a_offset: int, shape_a, b_offset: int, shape_b, c_offset: int):
    def tensor(shape, offset):
        return matmul_pb2.Tensor(
            shape=shape,
            dtype=matmul_pb2.DTYPE_FLOAT32,
            shared=matmul_pb2.SharedMemoryRef(region_id=shm.region_id, offset=offset),
        )

    request = matmul_pb2.MultiplyRequest(
        a=tensor(shape_a, a_offset),
        b=tensor(shape_b, b_offset),
        c_shared=matmul_pb2.SharedMemoryRef(region_id=shm.region_id, offset=c_offset),
    )
    with pytest.raises(grpc.RpcError) as rpc:
        client._stub.Multiply(request, timeout=30, metadata=client._metadata)
    return rpc.value.code(), rpc.value.details()


def test_bad_places_are_invalid_argument(shm_server: ServerProcess) -> None:
    with unix_client(shm_server, "shm-bad") as client:
        with client.shared_memory(4096) as shm:
            # An offset past the end.
            code, _ = _raw_multiply(client, shm, 8192, [2, 2], 0, [2, 2], 1024)
            assert code == grpc.StatusCode.INVALID_ARGUMENT
            # A region too small for the shape (64 x 64 float32 = 16 KiB).
            code, _ = _raw_multiply(client, shm, 0, [64, 64], 0, [64, 64], 0)
            assert code == grpc.StatusCode.INVALID_ARGUMENT
            # A product that would run past the end.
            code, _ = _raw_multiply(client, shm, 0, [8, 8], 256, [8, 8], 4000)
            assert code == grpc.StatusCode.INVALID_ARGUMENT
            # A negative offset.
            code, _ = _raw_multiply(client, shm, -4, [2, 2], 0, [2, 2], 1024)
            assert code == grpc.StatusCode.INVALID_ARGUMENT
            # Mismatched inner dimensions.
            code, _ = _raw_multiply(client, shm, 0, [2, 3], 256, [4, 2], 1024)
            assert code == grpc.StatusCode.INVALID_ARGUMENT
            # An unknown region.
            a = shm.array(np.ones((2, 2), np.float32))
            request = matmul_pb2.MultiplyRequest(
                a=matmul_pb2.Tensor(shape=[2, 2], dtype=matmul_pb2.DTYPE_FLOAT32,
                                    shared=matmul_pb2.SharedMemoryRef(region_id="no-such-region")),
                b=matmul_pb2.Tensor(shape=[2, 2], dtype=matmul_pb2.DTYPE_FLOAT32,
                                    shared=matmul_pb2.SharedMemoryRef(region_id=shm.region_id,
                                                                      offset=shm.offset_of(a))),
            )
            with pytest.raises(grpc.RpcError) as rpc:
                client._stub.Multiply(request, timeout=30, metadata=client._metadata)
            assert rpc.value.code() == grpc.StatusCode.NOT_FOUND
            # Still registered and working after all that.
            c = shm.multiply(a, a)
            np.testing.assert_array_equal(c, np.full((2, 2), 2.0, np.float32))


def test_client_side_errors(shm_server: ServerProcess) -> None:
    with unix_client(shm_server, "shm-client-errors") as client:
        with client.shared_memory(4096) as shm:
            inside = shm.array(np.ones((2, 2), np.float32))
            with pytest.raises(ValueError, match="not inside"):
                shm.multiply(np.ones((2, 2), np.float32), inside)
            with pytest.raises(TypeError):
                shm.multiply(inside, shm.array(np.ones((2, 2), np.float64)))
            with pytest.raises(MemoryError):
                shm.empty((1024, 1024), np.float32)
            with pytest.raises(ValueError):
                shm.multiply(inside, shm.empty((3, 3), np.float32))
        with pytest.raises(ValueError, match="closed"):
            shm.empty((2, 2))
    with pytest.raises(ValueError):
        SharedMemory(client, 0)


def test_registration_errors(shm_server: ServerProcess) -> None:
    with unix_client(shm_server, "shm-register-errors") as client:
        # Over the quota of stored bytes.
        with pytest.raises(MatmulError) as error:
            client.shared_memory(QUOTA_BYTES + 4096)
        assert error.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        # A name that does not exist, or one that is not a shm_open name.
        for name in ("/matmul-no-such-object", "no-slash", "/a/b"):
            request = matmul_pb2.RegisterSharedMemoryRequest(name=name, bytes=4096)
            with pytest.raises(grpc.RpcError) as rpc:
                next(client._stub.RegisterSharedMemory(request, timeout=30, metadata=client._metadata))
            assert rpc.value.code() in (grpc.StatusCode.NOT_FOUND, grpc.StatusCode.INVALID_ARGUMENT), name
        assert list_regions(client) == []


def test_tcp_client_is_refused(shm_server: ServerProcess) -> None:
    before = set(os.listdir("/dev/shm"))
    with matmul_client.Client(shm_server.target, timeout=60, client_id="shm-tcp") as client:
        with pytest.raises(MatmulError) as error:
            client.shared_memory(4096)
        assert error.value.code() == grpc.StatusCode.PERMISSION_DENIED
        with pytest.raises(MatmulError) as error:
            list_regions(client)
        assert error.value.code() == grpc.StatusCode.PERMISSION_DENIED
    # The refused session removed its object.
    assert not {n for n in set(os.listdir("/dev/shm")) - before if n.startswith(f"matmul-{os.getpid()}-")}


_CHILD = textwrap.dedent(
    """
    import sys, time
    import numpy as np
    import matmul_client
    client = matmul_client.Client("unix:" + sys.argv[1], client_id=sys.argv[2], timeout=60)
    shm = client.shared_memory(1 << 20)
    a = shm.array(np.eye(8, dtype=np.float32))
    c = shm.multiply(a, a)
    assert (c == np.eye(8, dtype=np.float32)).all()
    print(shm.region_id, shm.name, flush=True)
    time.sleep(600)
    """
)


def test_killed_client_leaves_no_region(shm_server: ServerProcess) -> None:
    client_id = "shm-killed"
    # Sessions of earlier tests are closed; their regions go asynchronously.
    wait_until(lambda: shm_server.gauge(REGIONS_GAUGE) == 0, "no region registered")
    baseline = 0
    child = subprocess.Popen(
        [sys.executable, "-c", _CHILD, shm_server.socket, client_id],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    try:
        line = child.stdout.readline()
        assert line, f"the child registered nothing:\n{child.stderr.read()}"
        region_id, name = line.split()
        with unix_client(shm_server, client_id) as watcher:
            assert [r.id for r in list_regions(watcher)] == [region_id]
            assert shm_server.gauge(REGIONS_GAUGE) == baseline + 1
            child.send_signal(signal.SIGKILL)
            child.wait(30)
            wait_until(lambda: not list_regions(watcher), "the killed client's region to go")
        wait_until(lambda: shm_server.gauge(REGIONS_GAUGE) == baseline, "the region gauge to drop")
        assert not shm_exists(name)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
