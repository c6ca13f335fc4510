"""GPU arrays through Client.multiply (matmul_client.cuda_memory,
RegisterCudaMemory).

Without a GPU (CI): how GPU arrays are recognized and described (objects
with a made-up ``__cuda_array_interface__``; no pointer is dereferenced),
the arguments refused before anything is sent, and a host-engine server's
FAILED_PRECONDITION for a registration. With PyTorch and a GPU (skipped
otherwise): a server on the CUDA engine multiplies torch tensors in place,
every dtype matching torch.matmul, with no host copy: the product is the
``out`` tensor passed (same data_ptr), and the server's inline payload
counter does not move while its cuda_memory counter does.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
import urllib.request
from typing import Any, Dict, Iterator

import grpc
import numpy as np
import pytest

import matmul_client
from matmul_client._proto.matmul.v1 import matmul_pb2
from matmul_client.cuda_memory import is_gpu_array, view_of

from conftest import ServerProcess


class FakeGpuArray:
    """Describes GPU memory it does not have: for parsing only."""

    def __init__(self, shape, typestr: str = "<f4", strides=None, stream=None) -> None:
        self.__cuda_array_interface__: Dict[str, Any] = {
            "shape": tuple(shape), "typestr": typestr, "data": (0x7f0000000000, False),
            "version": 3, "strides": strides, "stream": stream,
        }


def test_gpu_arrays_are_recognized_without_their_libraries() -> None:
    assert is_gpu_array(FakeGpuArray((2, 3)))
    assert not is_gpu_array(np.zeros((2, 3), np.float32))
    assert not is_gpu_array([[1.0, 2.0]])

    class CpuDlpack:
        def __dlpack__(self, stream=None):  # pragma: no cover - not called
            raise AssertionError

        def __dlpack_device__(self):
            return (1, 0)  # kDLCPU

    assert not is_gpu_array(CpuDlpack())


def test_views_of_gpu_arrays() -> None:
    view = view_of("a", FakeGpuArray((4, 3), stream=7))
    assert (view.shape, view.wire, view.transposed, view.stream) == (
        (4, 3), matmul_pb2.DTYPE_FLOAT32, False, 7)
    assert view.nbytes == 48
    # No stream to wait for; 0 read as the legacy default stream; no key
    # (version 2): the whole context.
    assert view_of("a", FakeGpuArray((4, 3))).stream is None
    assert view_of("a", FakeGpuArray((4, 3), stream=0)).stream == 1
    old = FakeGpuArray((4, 3))
    del old.__cuda_array_interface__["stream"]
    assert view_of("a", old).stream == -1
    # The transpose of a C-contiguous 3 x 4 float64 array: sent as a transpose.
    t = view_of("b", FakeGpuArray((4, 3), "<f8", strides=(8, 32)))
    assert (t.shape, t.transposed, t.wire) == ((3, 4), True, matmul_pb2.DTYPE_FLOAT64)
    assert view_of("a", FakeGpuArray((2, 2), "<f2")).wire == matmul_pb2.DTYPE_FLOAT16
    assert view_of("a", FakeGpuArray((2, 2), "<V2")).wire == matmul_pb2.DTYPE_BFLOAT16
    with pytest.raises(ValueError, match="neither C-contiguous"):
        view_of("a", FakeGpuArray((4, 3), strides=(24, 8)))
    with pytest.raises(ValueError, match="2-D or 3-D"):
        view_of("a", FakeGpuArray((4,)))
    with pytest.raises(TypeError, match="float32, float64"):
        view_of("a", FakeGpuArray((2, 2), "<i4"))


def test_arguments_refused_before_anything_is_sent() -> None:
    # No server behind the target: these fail on the client.
    with matmul_client.Client("unix:/nonexistent/matmul.sock", native=False) as client:
        a, b = FakeGpuArray((2, 3)), FakeGpuArray((3, 4))
        with pytest.raises(ValueError, match="not taken with GPU arrays"):
            client.multiply(a, b, keep=True)
        with pytest.raises(ValueError, match="not taken with GPU arrays"):
            client.multiply(a, b, dtype=np.float64)
        with pytest.raises(TypeError, match="out= is for GPU operands"):
            client.multiply(np.ones((2, 3)), np.ones((3, 4)), out=FakeGpuArray((2, 4)))


@pytest.fixture(scope="module")
def unix_server() -> Iterator[ServerProcess]:
    """A host-engine server on 127.0.0.1 and on a Unix socket."""
    folder = tempfile.mkdtemp(prefix="matmul-cuda-", dir="/tmp")
    socket = os.path.join(folder, "matmul.sock")
    server = ServerProcess("--unix_socket", socket, metrics=True)
    server.socket = socket  # type: ignore[attr-defined]
    yield server
    status = server.stop()
    shutil.rmtree(folder, ignore_errors=True)
    assert status == 0, f"matmul-server exited with {status} after SIGTERM:\n{server.output()}"


def test_the_host_engine_refuses_gpu_memory(unix_server: ServerProcess) -> None:
    with matmul_client.Client("unix:" + unix_server.socket, timeout=60, native=False) as client:
        request = matmul_pb2.RegisterCudaMemoryRequest(
            ipc_handle=bytes(64), bytes=4096, device_uuid=bytes(16))
        call = client._stub.RegisterCudaMemory(request, timeout=30)
        with pytest.raises(grpc.RpcError) as caught:
            next(call)
        assert caught.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert "the host engine has no GPU memory" in caught.value.details()
        # Still serving.
        c = client.multiply(np.eye(3, dtype=np.float32), np.ones((3, 2), np.float32))
        np.testing.assert_array_equal(c, np.ones((3, 2), np.float32))
    assert unix_server.gauge("matmul_shared_memory_regions") == 0


# --- On a GPU host, with PyTorch ---------------------------------------------------------


def _torch_cuda() -> Any:
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device for torch")
    return torch


@pytest.fixture(scope="module")
def cuda_server() -> Iterator[ServerProcess]:
    """A CUDA-engine server on a Unix socket (GPU hosts only)."""
    _torch_cuda()
    folder = tempfile.mkdtemp(prefix="matmul-cuda-", dir="/tmp")
    socket = os.path.join(folder, "matmul.sock")
    server = ServerProcess("--unix_socket", socket, metrics=True, engine="cuda")
    server.socket = socket  # type: ignore[attr-defined]
    yield server
    status = server.stop()
    shutil.rmtree(folder, ignore_errors=True)
    assert status == 0, f"matmul-server exited with {status} after SIGTERM:\n{server.output()}"


def payload_bytes(server: ServerProcess, path: str) -> float:
    """matmul_payload_bytes_total of ``path``, both directions."""
    url = f"http://127.0.0.1:{server.metrics_port}/metrics"
    direct = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    total = 0.0
    with direct.open(url, timeout=5) as reply:
        for line in reply.read().decode().splitlines():
            if line.startswith("matmul_payload_bytes_total{") and f'path="{path}"' in line:
                total += float(line.split()[-1])
    return total


@pytest.mark.parametrize("dtype_name", ["float32", "float64", "float16", "bfloat16"])
def test_torch_tensors_multiply_in_place_with_no_host_copy(
    cuda_server: ServerProcess, dtype_name: str
) -> None:
    torch = _torch_cuda()
    dtype = getattr(torch, dtype_name)
    # Small integers: every dtype's product is exact.
    a = torch.randint(-2, 3, (192, 64), device="cuda").to(dtype)
    b = torch.randint(-2, 3, (64, 160), device="cuda").to(dtype)
    out = torch.empty((192, 160), dtype=dtype, device="cuda")
    inline_before = payload_bytes(cuda_server, "inline")
    gpu_before = payload_bytes(cuda_server, "cuda_memory")
    with matmul_client.Client("unix:" + cuda_server.socket, timeout=60) as client:
        c = client.multiply(a, b, out=out)
        assert c is out
        assert c.data_ptr() == out.data_ptr()
        want = (a.double() @ b.double()).to(dtype)
        assert torch.equal(c, want)
        # Without out: a new torch tensor on a's GPU.
        d = client.multiply(a, b)
        assert isinstance(d, torch.Tensor) and d.device == a.device and d.dtype == dtype
        assert torch.equal(d, want)
        # A transposed view is sent as a transpose, not copied.
        e = client.multiply(b.t(), a.t())
        assert torch.equal(e, want.t())
    # No byte went inline (through host memory); the GPU path carried them.
    assert payload_bytes(cuda_server, "inline") == inline_before
    assert payload_bytes(cuda_server, "cuda_memory") > gpu_before
    # The client closed: its registrations are gone.
    end = time.monotonic() + 30
    while cuda_server.gauge("matmul_shared_memory_regions") != 0:
        assert time.monotonic() < end, "regions stayed registered after close"
        time.sleep(0.05)
