"""Operands and products in shared memory, for a client on the server's host.

A :class:`SharedMemory` session creates a POSIX shared-memory object, maps
it, and registers it with the server (``RegisterSharedMemory``), which maps
it too (and, on the CUDA engine, pins it so that the GPU copies straight
from and into it). Arrays made by the session live in the region: fill A
and B in place, and :meth:`SharedMemory.multiply` sends only where they are;
the server writes C into the region and the call returns C as an array
view of it. No operand or product byte crosses the socket::

    >>> with Client("unix:/run/matmul.sock") as client:
    ...     with client.shared_memory(64 << 20) as shm:
    ...         a = shm.empty((m, k), np.float32); a[...] = ...
    ...         b = shm.array(b_values)          # a copy of b_values, in the region
    ...         c = shm.multiply(a, b)           # a view into the region

Only over the server's Unix socket (``unix:PATH`` targets): over TCP the
server answers PERMISSION_DENIED. The region counts against the client's
stored-bytes quota (RESOURCE_EXHAUSTED beyond it). The object is created
with mode 0600, so the server must run as the same user unless ``mode``
widens it (e.g. 0o660 with a group both share).

The registration is a call the session keeps open; the server keeps the
region while it lives. Closing the session (or leaving its ``with`` block)
cancels it, and so does the end of the process however it ends (killed
included), after which the server drops the region once no multiply uses
it. By default the object's name is unlinked as soon as the server has
mapped it, so nothing is left in /dev/shm either. Arrays made by the session
stay valid after it is closed (the mapping goes with the last of them), but
the server no longer sees them.
"""

from __future__ import annotations

import itertools
import mmap
import os
import threading
from typing import Any, List, Optional, Sequence, Tuple

import grpc
import numpy as np
import numpy.typing as npt

from ._errors import MatmulError
from ._proto.matmul.v1 import matmul_pb2
from ._tensors import BFLOAT16_DTYPE

#: Offsets of the arrays :meth:`SharedMemory.empty` places are multiples of this.
ALIGNMENT = 256

_SHM_DIR = "/dev/shm"
_names = itertools.count()

_COMPUTE_MODES = {
    "strict": matmul_pb2.COMPUTE_MODE_STRICT,
    "tf32": matmul_pb2.COMPUTE_MODE_TF32,
}


def _wire_dtype(dtype: np.dtype) -> Optional[int]:
    """The matmul.v1.Dtype of an array's dtype as it lies in memory, or None."""
    if dtype.byteorder == ">" or (dtype.byteorder == "=" and not np.little_endian):
        return None
    base = dtype.newbyteorder("=")
    if base == np.float32:
        return matmul_pb2.DTYPE_FLOAT32
    if base == np.float64:
        return matmul_pb2.DTYPE_FLOAT64
    if base == np.float16:
        return matmul_pb2.DTYPE_FLOAT16
    if BFLOAT16_DTYPE is not None and base == BFLOAT16_DTYPE:
        return matmul_pb2.DTYPE_BFLOAT16
    return None


def product_shape(
    a: Sequence[int], b: Sequence[int], transpose_a: bool = False, transpose_b: bool = False
) -> Tuple[int, ...]:
    """The shape of ``matmul(op(a), op(b))`` for 2-D or 3-D shapes (a batch
    of 1 broadcasts); ValueError when they do not fit together."""
    if len(a) not in (2, 3) or len(b) not in (2, 3):
        raise ValueError(f"shapes {tuple(a)} and {tuple(b)}: operands are 2-D or 3-D")
    m, ka = (a[-1], a[-2]) if transpose_a else (a[-2], a[-1])
    kb, n = (b[-1], b[-2]) if transpose_b else (b[-2], b[-1])
    if ka != kb:
        raise ValueError(f"inner dimensions differ: op(a) is {m} x {ka}, op(b) is {kb} x {n}")
    if len(a) == 2 and len(b) == 2:
        return (m, n)
    ba = a[0] if len(a) == 3 else 1
    bb = b[0] if len(b) == 3 else 1
    if ba != bb and 1 not in (ba, bb):
        raise ValueError(f"batches differ: a has {ba}, b has {bb} (and neither is 1)")
    return (max(ba, bb), m, n)


def _create_object(nbytes: int, mode: int) -> Tuple[str, int]:
    """A new shared-memory object of ``nbytes``: its shm_open name and an fd.

    Created exclusively (a name that exists is skipped, never reused), with
    exactly ``mode`` (the umask does not apply). On Linux shm_open(name) is
    open(/dev/shm/name); elsewhere CPython's own shm_open is used.
    """
    for _ in range(64):
        name = f"/matmul-{os.getpid()}-py{next(_names)}"
        try:
            if os.path.isdir(_SHM_DIR):
                fd = os.open(
                    os.path.join(_SHM_DIR, name[1:]),
                    os.O_RDWR | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0),
                    mode,
                )
            else:  # pragma: no cover - not Linux
                import _posixshmem

                fd = _posixshmem.shm_open(name, os.O_RDWR | os.O_CREAT | os.O_EXCL, mode)
        except FileExistsError:
            continue
        try:
            os.fchmod(fd, mode)
            os.ftruncate(fd, nbytes)
        except BaseException:
            os.close(fd)
            _unlink(name)
            raise
        return name, fd
    raise FileExistsError("shared memory: 64 names in a row exist already")


def _unlink(name: str) -> None:
    try:
        if os.path.isdir(_SHM_DIR):
            os.unlink(os.path.join(_SHM_DIR, name[1:]))
        else:  # pragma: no cover - not Linux
            import _posixshmem

            _posixshmem.shm_unlink(name)
    except FileNotFoundError:
        pass


class SharedMemory:
    """A shared-memory region registered with a matmul server; see the
    module's docstring. Made by :meth:`Client.shared_memory`.

    Thread-safe: :meth:`empty`, :meth:`array` and :meth:`multiply` may be
    called from several threads (the arrays' contents are the caller's to
    synchronize: two multiplies writing to the same ``out`` race).

    Args:
        client: The :class:`Client` (of a ``unix:`` target) to register over.
        nbytes: Size of the region, in bytes (more than zero).
        mode: Permission bits of the object (0o600: the server must run as
            the same user).
        unlink_when_registered: Remove the object's name as soon as the
            server has mapped it (False keeps it until :meth:`close`).
        timeout: How long to wait for the server to register it, in seconds.

    Raises:
        ValueError: nbytes is not positive.
        OSError: The object cannot be created or mapped (/dev/shm is full).
        MatmulError: The server refused it: PERMISSION_DENIED (not over its
            Unix socket, or it cannot open the object), RESOURCE_EXHAUSTED
            (over the client's quota), UNIMPLEMENTED (a server without
            shared memory), DEADLINE_EXCEEDED (no answer within timeout).
    """

    def __init__(
        self,
        client: Any,
        nbytes: int,
        *,
        mode: int = 0o600,
        unlink_when_registered: bool = True,
        timeout: float = 30.0,
    ) -> None:
        if isinstance(nbytes, bool) or not isinstance(nbytes, (int, np.integer)) or nbytes <= 0:
            raise ValueError(f"nbytes={nbytes!r}: expected a positive number of bytes")
        self._client = client
        self._lock = threading.Lock()
        self._next = 0
        self._closed = False
        self._call: Any = None
        self._linked = False
        self._fd = -1
        self._name, self._fd = _create_object(int(nbytes), mode)
        self._linked = True
        self._nbytes = int(nbytes)
        try:
            self._mmap = mmap.mmap(self._fd, self._nbytes, mmap.MAP_SHARED,
                                   mmap.PROT_READ | mmap.PROT_WRITE)
            self._bytes = np.frombuffer(self._mmap, dtype=np.uint8)
            self._base = self._bytes.ctypes.data
            self._region = self._register(timeout)
            if unlink_when_registered:
                self._unlink()
        except BaseException:
            self.close()
            raise

    def _register(self, timeout: float) -> matmul_pb2.SharedMemoryRegion:
        request = matmul_pb2.RegisterSharedMemoryRequest(name=self._name, bytes=self._nbytes)
        # No deadline on the call: it lasts as long as the registration.
        call = self._client._stub.RegisterSharedMemory(request, metadata=self._client._metadata)
        self._call = call
        timed_out = threading.Event()

        def expire() -> None:
            timed_out.set()
            call.cancel()

        timer = threading.Timer(timeout, expire)
        timer.daemon = True
        timer.start()
        try:
            response = next(call)
        except StopIteration:
            raise MatmulError(
                grpc.StatusCode.INTERNAL,
                "the server ended RegisterSharedMemory without describing the region",
            ) from None
        except grpc.RpcError as error:
            if timed_out.is_set():
                raise MatmulError(
                    grpc.StatusCode.DEADLINE_EXCEEDED,
                    f"the server did not answer RegisterSharedMemory within {timeout} s",
                ) from None
            raise MatmulError.from_call(error) from error
        finally:
            timer.cancel()
        if not response.region.id:
            raise MatmulError(grpc.StatusCode.INTERNAL, "the server's region has no id")
        return response.region

    # --- The region ---------------------------------------------------------

    @property
    def region_id(self) -> str:
        """The server's id of the region (``SharedMemoryRef.region_id``)."""
        return self._region.id

    @property
    def name(self) -> str:
        """The object's shm_open name ("/matmul-4711-py0")."""
        return self._name

    @property
    def nbytes(self) -> int:
        """The region's size in bytes."""
        return self._nbytes

    @property
    def info(self) -> matmul_pb2.SharedMemoryRegion:
        """The region as the server described it when registering it."""
        return self._region

    @property
    def closed(self) -> bool:
        return self._closed

    def empty(self, shape: Sequence[int] | int, dtype: npt.DTypeLike = np.float32) -> np.ndarray:
        """A new C-contiguous array in the region, after the ones made
        before (at a multiple of :data:`ALIGNMENT`). Its contents are
        whatever the region holds there (zeros in a fresh region).

        Raises:
            MemoryError: It does not fit in what is left of the region.
        """
        self._check_open()
        shape = (shape,) if isinstance(shape, (int, np.integer)) else tuple(int(d) for d in shape)
        dtype = np.dtype(dtype)
        nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
        with self._lock:
            at = -(-self._next // ALIGNMENT) * ALIGNMENT
            if at + nbytes > self._nbytes:
                raise MemoryError(
                    f"shared memory: a {shape} {dtype} array ({nbytes} bytes) does not fit at "
                    f"offset {at} of the {self._nbytes}-byte region"
                )
            self._next = at + nbytes
        return np.ndarray(shape, dtype=dtype, buffer=self._mmap, offset=at)

    def array(self, values: npt.ArrayLike, dtype: npt.DTypeLike = None) -> np.ndarray:
        """A copy of ``values`` (converted to ``dtype`` if given) in the region."""
        x = np.asarray(values, dtype=dtype)
        out = self.empty(x.shape, x.dtype)
        out[...] = x
        return out

    def reset(self) -> None:
        """Forgets every placement: the next :meth:`empty` starts at offset 0
        (arrays made before still point at their bytes, which new ones reuse)."""
        with self._lock:
            self._next = 0

    def offset_of(self, x: np.ndarray) -> int:
        """Where a C-contiguous array's first byte is in the region.

        Raises:
            ValueError: ``x`` is not C-contiguous or not inside the region.
        """
        self._check_open()
        if not isinstance(x, np.ndarray) or not x.flags.c_contiguous:
            raise ValueError("expected a C-contiguous numpy array in the region")
        at = x.ctypes.data - self._base
        if at < 0 or at + x.nbytes > self._nbytes:
            raise ValueError(
                f"the array ({x.nbytes} bytes) is not inside the shared-memory region; make it "
                f"with shm.empty() or shm.array()"
            )
        return at

    # --- Multiplies ---------------------------------------------------------

    def multiply(
        self,
        a: np.ndarray,
        b: np.ndarray,
        *,
        out: Optional[np.ndarray] = None,
        transpose_a: bool = False,
        transpose_b: bool = False,
        compute: str = "strict",
        timeout: Optional[float] = None,
    ) -> np.ndarray:
        """``matmul(op(a), op(b))`` computed by the server from the region
        and written into it; returns C, a view into the region.

        a and b must be arrays in the region (made by :meth:`empty` or
        :meth:`array`, or views of those), C-contiguous or C-contiguous
        with their last two axes swapped (``x.T`` of a 2-D one: it is sent
        as a transpose), 2-D or 3-D, of the same dtype: float32, float64,
        float16 or ml_dtypes.bfloat16, little-endian. The product has their
        dtype. ``out``: where C goes (an array in the region of C's shape
        and dtype); None: a new array in the region (:meth:`empty`).

        Raises:
            ValueError, TypeError: Operands or out that cannot be sent.
            MatmulError: The server refused the request: INVALID_ARGUMENT
                (e.g. shapes that do not fit, bytes outside the region),
                NOT_FOUND (the region is no longer registered),
                PERMISSION_DENIED (not over the Unix socket).
        """
        self._check_open()
        if compute not in _COMPUTE_MODES:
            raise ValueError(f"compute={compute!r}: expected one of {sorted(_COMPUTE_MODES)}")
        refs = []
        for name, x, transpose in (("a", a, transpose_a), ("b", b, transpose_b)):
            if not isinstance(x, np.ndarray):
                raise TypeError(f"{name}: expected a numpy array in the region, got {type(x).__name__}")
            if x.ndim not in (2, 3):
                raise ValueError(f"{name} has {x.ndim} dimension(s) (shape {x.shape}); expected 2-D or 3-D")
            if not x.flags.c_contiguous:
                swapped = np.swapaxes(x, -1, -2)
                if not swapped.flags.c_contiguous:
                    raise ValueError(
                        f"{name} is neither C-contiguous nor a transpose of a C-contiguous array; "
                        f"copy it into the region with shm.array({name})"
                    )
                x, transpose = swapped, not transpose
            refs.append((name, x, bool(transpose)))
        (_, a_x, transpose_a), (_, b_x, transpose_b) = refs
        if a_x.dtype != b_x.dtype:
            raise TypeError(f"a is {a_x.dtype} and b is {b_x.dtype}; both must have the same dtype")
        wire = _wire_dtype(a_x.dtype)
        if wire is None:
            raise TypeError(
                f"{a_x.dtype}: expected little-endian float32, float64, float16 or bfloat16"
            )
        shape = product_shape(a_x.shape, b_x.shape, transpose_a, transpose_b)
        if out is None:
            out = self.empty(shape, a_x.dtype)
        elif not isinstance(out, np.ndarray) or out.shape != shape or out.dtype != a_x.dtype:
            raise ValueError(f"out must be a {shape} {a_x.dtype} array in the region")
        request = matmul_pb2.MultiplyRequest(
            a=self._ref(a_x, wire),
            b=self._ref(b_x, wire),
            transpose_a=transpose_a,
            transpose_b=transpose_b,
            compute_mode=_COMPUTE_MODES[compute],
            c_shared=matmul_pb2.SharedMemoryRef(region_id=self.region_id, offset=self.offset_of(out)),
        )
        client = self._client
        try:
            response = client._stub.Multiply(
                request, timeout=client._deadline(timeout), metadata=client._metadata
            )
        except grpc.RpcError as error:
            raise MatmulError.from_call(error) from error
        c = response.c
        if c.data or c.shared.region_id != self.region_id or c.shared.offset != request.c_shared.offset:
            raise MatmulError(
                grpc.StatusCode.INTERNAL,
                "the server's answer to a shared-memory multiply is not the product's place",
            )
        if tuple(c.shape) != shape:
            raise MatmulError(
                grpc.StatusCode.INTERNAL,
                f"the server's product has shape {tuple(c.shape)}, expected {shape}",
            )
        return out

    def _ref(self, x: np.ndarray, wire: int) -> matmul_pb2.Tensor:
        return matmul_pb2.Tensor(
            shape=x.shape,
            dtype=wire,
            shared=matmul_pb2.SharedMemoryRef(region_id=self.region_id, offset=self.offset_of(x)),
        )

    # --- Lifetime -------------------------------------------------------------

    def unregister(self, *, timeout: Optional[float] = None) -> None:
        """Ends the registration with UnregisterSharedMemory (the server
        finishes multiplies already using the region first). The local
        mapping stays until :meth:`close`."""
        self._check_open()
        unregister(self._client, self.region_id, timeout=timeout)

    def close(self) -> None:
        """Cancels the registration (if the server still holds it), unlinks
        the name and closes the mapping (it stays while arrays made from it
        are alive). Idempotent."""
        if self._closed:
            return
        self._closed = True
        if self._call is not None:
            self._call.cancel()
        self._unlink()
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
        self._bytes = None
        mm = getattr(self, "_mmap", None)
        if mm is not None:
            try:
                mm.close()
            except BufferError:
                pass  # arrays made from it are alive: it goes with the last one

    def _unlink(self) -> None:
        if self._linked:
            self._linked = False
            _unlink(self._name)

    def _check_open(self) -> None:
        if self._closed:
            raise ValueError("the shared-memory session is closed")

    def __enter__(self) -> "SharedMemory":
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # noqa: BLE001 - interpreter shutdown
            pass


def list_regions(client: Any, *, timeout: Optional[float] = None) -> List[matmul_pb2.SharedMemoryRegion]:
    """The client's registered regions (ListSharedMemory), oldest first."""
    try:
        response = client._stub.ListSharedMemory(
            matmul_pb2.ListSharedMemoryRequest(),
            timeout=client._deadline(timeout),
            metadata=client._metadata,
        )
    except grpc.RpcError as error:
        raise MatmulError.from_call(error) from error
    return list(response.regions)


def unregister(client: Any, region_id: str, *, timeout: Optional[float] = None) -> None:
    """UnregisterSharedMemory: NOT_FOUND if ``region_id`` is not one of the client's."""
    try:
        client._stub.UnregisterSharedMemory(
            matmul_pb2.UnregisterSharedMemoryRequest(region_id=region_id),
            timeout=client._deadline(timeout),
            metadata=client._metadata,
        )
    except grpc.RpcError as error:
        raise MatmulError.from_call(error) from error
