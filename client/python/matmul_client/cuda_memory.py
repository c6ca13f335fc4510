"""Operands and products in the caller's GPU memory, for a client on the
server's node (``RegisterCudaMemory``).

:meth:`Client.multiply` takes GPU arrays as they are: any object with
``__cuda_array_interface__`` (PyTorch, CuPy, Numba) or with ``__dlpack__``
on a CUDA device (JAX, PyTorch, CuPy). Nothing here imports any of those
libraries: the array's pointer is resolved to its allocation with the CUDA
driver API (``libcuda.so.1`` through ctypes), the allocation is registered
with the server once (a CUDA IPC handle of its base, its size and its GPU's
UUID) and cached for the client's life, and the multiply names the operands
and the product by their offsets in it. The server's GPU reads the operands
and writes the product in place: no byte crosses the socket or host memory::

    >>> a = torch.randn(4096, 4096, device="cuda")
    >>> b = torch.randn(4096, 4096, device="cuda")
    >>> with Client("unix:/run/matmul.sock") as client:
    ...     c = client.multiply(a, b)          # a torch tensor on a's GPU
    ...     client.multiply(a, b, out=c)       # into the caller's array

Only over the server's Unix socket, with the server on the CUDA engine and
driving the array's GPU (FAILED_PRECONDITION otherwise). Allocations must
be IPC-capable (``cudaMalloc``/``cuMemAlloc``, PyTorch's and CuPy's default
allocators; not stream-ordered pools or PyTorch's expandable segments):
ValueError otherwise.

Ordering: before each multiply the client synchronizes the stream each
array names (``__cuda_array_interface__["stream"]``; the array's whole
context where the interface names none, as PyTorch's version 2 does), so
the operands' writes are complete; when the call returns, the server's product write is
complete too. The caller must not free a registered allocation while the
client lives (the server holds it open); :meth:`Client.close` ends the
registrations.
"""

from __future__ import annotations

import ctypes
import threading
from typing import Any, Dict, List, Optional, Sequence, Tuple

import grpc
import numpy as np

from ._errors import MatmulError
from ._proto.matmul.v1 import matmul_pb2
from .shared_memory import _COMPUTE_MODES, product_shape

# Driver API constants (cuda.h).
_CU_POINTER_ATTRIBUTE_CONTEXT = 1
_CU_POINTER_ATTRIBUTE_MEMORY_TYPE = 2
_CU_POINTER_ATTRIBUTE_BUFFER_ID = 7
_CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL = 9
_CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE = 10
_CU_MEMORYTYPE_DEVICE = 2
_CU_IPC_HANDLE_SIZE = 64
_KDL_CUDA = 2  # DLPack's kDLCUDA
#: An array whose interface names no stream (version 2, as PyTorch's):
#: its producer's pending work is waited for with cuCtxSynchronize.
_WHOLE_CONTEXT = -1

_TYPESTRS = {
    "<f4": (np.dtype(np.float32), matmul_pb2.DTYPE_FLOAT32),
    "<f8": (np.dtype(np.float64), matmul_pb2.DTYPE_FLOAT64),
    "<f2": (np.dtype(np.float16), matmul_pb2.DTYPE_FLOAT16),
    # bfloat16 has no typestr of its own: PyTorch says "<V2" with a descr.
}
_WIRE_SIZES = {
    matmul_pb2.DTYPE_FLOAT32: 4,
    matmul_pb2.DTYPE_FLOAT64: 8,
    matmul_pb2.DTYPE_FLOAT16: 2,
    matmul_pb2.DTYPE_BFLOAT16: 2,
}


def is_gpu_array(x: Any) -> bool:
    """Whether ``x`` is a GPU array this module takes: it has
    ``__cuda_array_interface__``, or ``__dlpack__`` with a CUDA device."""
    if isinstance(x, np.ndarray):
        return False
    # Read on the instance: PyTorch's CPU tensors have the attribute on
    # their type, and raise when it is read.
    if _has_attr(x, "__cuda_array_interface__"):
        return True
    device = getattr(x, "__dlpack_device__", None)
    if device is None or not hasattr(x, "__dlpack__"):
        return False
    try:
        return int(device()[0]) == _KDL_CUDA
    except Exception:  # noqa: BLE001 - not a DLPack producer after all
        return False


def _has_attr(x: Any, name: str) -> bool:
    try:
        getattr(x, name)
        return True
    except Exception:  # noqa: BLE001
        # PyTorch raises for CPU tensors, those needing grad, and dtypes the
        # interface has no typestr for (bfloat16: then __dlpack__ serves).
        return False


class CudaError(OSError):
    """A CUDA driver call failed in the client (before anything was sent)."""


class _Driver:
    """The few driver API calls the client needs, through ctypes."""

    _instance: Optional["_Driver"] = None
    _lock = threading.Lock()

    @classmethod
    def get(cls) -> "_Driver":
        with cls._lock:
            if cls._instance is None:
                cls._instance = _Driver()
            return cls._instance

    def __init__(self) -> None:
        try:
            self.lib = ctypes.CDLL("libcuda.so.1")
        except OSError as error:
            raise CudaError(f"cannot load the CUDA driver (libcuda.so.1): {error}") from None
        self._check(self.lib.cuInit(ctypes.c_uint(0)), "cuInit")
        self._uuid_call = getattr(self.lib, "cuDeviceGetUuid_v2", None) or self.lib.cuDeviceGetUuid

    def _check(self, result: int, call: str) -> None:
        if result != 0:
            name = ctypes.c_char_p()
            self.lib.cuGetErrorName(ctypes.c_int(result), ctypes.byref(name))
            text = name.value.decode() if name.value else str(result)
            raise CudaError(f"{call} failed: {text}")

    def attribute(self, attribute: int, pointer: int, kind: Any = ctypes.c_int) -> Any:
        value = kind()
        self._check(
            self.lib.cuPointerGetAttribute(ctypes.byref(value), ctypes.c_int(attribute),
                                           ctypes.c_uint64(pointer)),
            "cuPointerGetAttribute",
        )
        return value.value

    def push_context_of(self, pointer: int) -> None:
        context = self.attribute(_CU_POINTER_ATTRIBUTE_CONTEXT, pointer, ctypes.c_void_p)
        self._check(self.lib.cuCtxPushCurrent_v2(ctypes.c_void_p(context)), "cuCtxPushCurrent")

    def pop_context(self) -> None:
        popped = ctypes.c_void_p()
        self.lib.cuCtxPopCurrent_v2(ctypes.byref(popped))

    def address_range(self, pointer: int) -> Tuple[int, int]:
        base, size = ctypes.c_uint64(), ctypes.c_size_t()
        self._check(
            self.lib.cuMemGetAddressRange_v2(ctypes.byref(base), ctypes.byref(size),
                                             ctypes.c_uint64(pointer)),
            "cuMemGetAddressRange",
        )
        return base.value, size.value

    def ipc_handle(self, base: int) -> bytes:
        handle = (ctypes.c_char * _CU_IPC_HANDLE_SIZE)()
        self._check(self.lib.cuIpcGetMemHandle(handle, ctypes.c_uint64(base)), "cuIpcGetMemHandle")
        return bytes(handle)

    def device_uuid(self, ordinal: int) -> bytes:
        device = ctypes.c_int()
        self._check(self.lib.cuDeviceGet(ctypes.byref(device), ctypes.c_int(ordinal)), "cuDeviceGet")
        uuid = (ctypes.c_char * 16)()
        self._check(self._uuid_call(uuid, device), "cuDeviceGetUuid")
        return bytes(uuid)

    def synchronize(self, stream: int, pointer: int) -> None:
        """Waits for ``stream`` (the CUDA array interface's number: 1 the
        legacy default stream, 2 the per-thread one, else a CUstream), or
        for the whole context of ``pointer`` (_WHOLE_CONTEXT)."""
        if stream == _WHOLE_CONTEXT:
            self.push_context_of(pointer)
            try:
                self._check(self.lib.cuCtxSynchronize(), "cuCtxSynchronize")
            finally:
                self.pop_context()
            return
        self._check(self.lib.cuStreamSynchronize(ctypes.c_void_p(stream)), "cuStreamSynchronize")

    def alloc(self, nbytes: int) -> int:
        pointer = ctypes.c_uint64()
        self._check(self.lib.cuMemAlloc_v2(ctypes.byref(pointer), ctypes.c_size_t(nbytes)), "cuMemAlloc")
        return pointer.value

    def free(self, pointer: int) -> None:
        self.push_context_of(pointer)
        try:
            self.lib.cuMemFree_v2(ctypes.c_uint64(pointer))
        finally:
            self.pop_context()


class _View:
    """One GPU array as the client sends it: pointer, shape, wire dtype, the
    stream to synchronize, and whether it is a transpose of a C-contiguous
    array (its last two axes swapped)."""

    def __init__(self, name: str, pointer: int, shape: Tuple[int, ...], wire: int,
                 strides: Optional[Tuple[int, ...]], stream: Optional[int],
                 device: Optional[int], keep: Any = None) -> None:
        self.name = name
        self.pointer = pointer
        self.shape = shape
        self.wire = wire
        self.stream = stream
        self.device = device
        self.keep = keep  # what keeps a DLPack capsule's tensor alive
        self.transposed = False
        itemsize = _WIRE_SIZES[wire]
        if len(shape) not in (2, 3):
            raise ValueError(f"{name} has {len(shape)} dimension(s) (shape {shape}); expected 2-D or 3-D")
        if strides is not None and tuple(strides) != _c_strides(shape, itemsize):
            swapped = shape[:-2] + (shape[-1], shape[-2])
            if tuple(strides[:-2]) + (strides[-1], strides[-2]) != _c_strides(swapped, itemsize):
                raise ValueError(
                    f"{name} is neither C-contiguous nor a transpose of a C-contiguous array; "
                    f"make it contiguous first (e.g. .contiguous())"
                )
            self.shape = swapped
            self.transposed = True

    @property
    def nbytes(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64)) * _WIRE_SIZES[self.wire]


def _c_strides(shape: Sequence[int], itemsize: int) -> Tuple[int, ...]:
    strides, step = [], itemsize
    for d in reversed(shape):
        strides.append(step)
        step *= max(int(d), 1)
    return tuple(reversed(strides))


def _wire_of_interface(name: str, interface: Dict[str, Any]) -> int:
    typestr = interface.get("typestr", "")
    if typestr in _TYPESTRS:
        return _TYPESTRS[typestr][1]
    descr = interface.get("descr") or []
    if typestr == "<V2" or any("bfloat16" in str(field) for field in descr):
        return matmul_pb2.DTYPE_BFLOAT16
    raise TypeError(f"{name}: dtype {typestr!r}: expected little-endian float32, float64, float16 "
                    f"or bfloat16")


def view_of(name: str, x: Any) -> _View:
    """The :class:`_View` of a GPU array (``__cuda_array_interface__`` or
    CUDA ``__dlpack__``); TypeError or ValueError if it cannot be sent."""
    interface = None
    if _has_attr(x, "__cuda_array_interface__"):
        interface = x.__cuda_array_interface__
    if interface is not None:
        wire = _wire_of_interface(name, interface)
        # PyTorch describes bfloat16 as "<V2"; its dtype says so too.
        if str(getattr(x, "dtype", "")).endswith("bfloat16"):
            wire = matmul_pb2.DTYPE_BFLOAT16
        pointer, _ = interface["data"]
        # Version 3 names the stream to wait for (None: nothing to wait
        # for; 0, which the protocol disallows, read as the legacy default
        # stream); an interface without the key (PyTorch's, version 2)
        # promises nothing, so the whole context is waited for.
        if "stream" not in interface:
            stream: Optional[int] = _WHOLE_CONTEXT
        else:
            stream = interface["stream"]
            stream = None if stream is None else (int(stream) or 1)
        return _View(name, int(pointer or 0), tuple(int(d) for d in interface["shape"]), wire,
                     interface.get("strides"), stream, None)
    return _dlpack_view(name, x)


class _DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class _DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class _DLTensor(ctypes.Structure):
    _fields_ = [
        ("data", ctypes.c_void_p),
        ("device", _DLDevice),
        ("ndim", ctypes.c_int32),
        ("dtype", _DLDataType),
        ("shape", ctypes.POINTER(ctypes.c_int64)),
        ("strides", ctypes.POINTER(ctypes.c_int64)),
        ("byte_offset", ctypes.c_uint64),
    ]


_DL_FLOAT, _DL_BFLOAT = 2, 4
_DL_WIRE = {
    (_DL_FLOAT, 32): matmul_pb2.DTYPE_FLOAT32,
    (_DL_FLOAT, 64): matmul_pb2.DTYPE_FLOAT64,
    (_DL_FLOAT, 16): matmul_pb2.DTYPE_FLOAT16,
    (_DL_BFLOAT, 16): matmul_pb2.DTYPE_BFLOAT16,
}


def _dlpack_view(name: str, x: Any) -> _View:
    """A CUDA DLPack producer's array: the DLTensor at the start of the
    unversioned "dltensor" capsule's DLManagedTensor, read in place. The
    producer orders its work before the legacy default stream (stream=1),
    which the client then synchronizes."""
    try:
        capsule = x.__dlpack__(stream=1)
    except TypeError:
        capsule = x.__dlpack__()
    get_pointer = ctypes.pythonapi.PyCapsule_GetPointer
    get_pointer.restype = ctypes.c_void_p
    get_pointer.argtypes = [ctypes.py_object, ctypes.c_char_p]
    address = get_pointer(capsule, b"dltensor")
    tensor = _DLTensor.from_address(address)
    if tensor.device.device_type != _KDL_CUDA:
        raise TypeError(f"{name}: a DLPack array on device type {tensor.device.device_type}, not CUDA")
    key = (tensor.dtype.code, tensor.dtype.bits)
    if key not in _DL_WIRE or tensor.dtype.lanes != 1:
        raise TypeError(f"{name}: DLPack dtype code {key[0]} of {key[1]} bits: expected float32, "
                        f"float64, float16 or bfloat16")
    wire = _DL_WIRE[key]
    shape = tuple(int(tensor.shape[i]) for i in range(tensor.ndim))
    strides = None
    if tensor.strides:
        strides = tuple(int(tensor.strides[i]) * _WIRE_SIZES[wire] for i in range(tensor.ndim))
    # The capsule (kept with the view) keeps the producer's memory alive; its
    # destructor calls the deleter, as the capsule was never consumed.
    return _View(name, int(tensor.data or 0) + int(tensor.byte_offset), shape, wire, strides, 1,
                 int(tensor.device.device_id), keep=capsule)


class _Registration:
    """One registered allocation: its base, size and region, and the open
    RegisterCudaMemory call that keeps it."""

    def __init__(self, base: int, size: int, region: matmul_pb2.SharedMemoryRegion, call: Any) -> None:
        self.base = base
        self.size = size
        self.region = region
        self.call = call


class DeviceBuffer:
    """GPU memory the client allocated (cuMemAlloc) for a product: exposes
    ``__cuda_array_interface__`` (version 3, no stream: the product is
    complete when the multiply returns), so ``torch.as_tensor(c,
    device="cuda")`` or ``cupy.asarray(c)`` take it without a copy. Freed
    (and its registration ended) when the last reference goes."""

    def __init__(self, memory: "CudaMemory", pointer: int, shape: Tuple[int, ...], wire: int,
                 device: int) -> None:
        self._memory = memory
        self.pointer = pointer
        self.shape = shape
        self.wire = wire
        self.device = device

    @property
    def __cuda_array_interface__(self) -> Dict[str, Any]:
        typestr = {matmul_pb2.DTYPE_FLOAT32: "<f4", matmul_pb2.DTYPE_FLOAT64: "<f8",
                   matmul_pb2.DTYPE_FLOAT16: "<f2", matmul_pb2.DTYPE_BFLOAT16: "<V2"}[self.wire]
        interface: Dict[str, Any] = {"shape": self.shape, "typestr": typestr,
                                     "data": (self.pointer, False), "version": 3,
                                     "strides": None, "stream": None}
        if self.wire == matmul_pb2.DTYPE_BFLOAT16:
            interface["descr"] = [("", "<V2")]
        return interface

    @property
    def nbytes(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64)) * _WIRE_SIZES[self.wire]

    def __del__(self) -> None:
        try:
            self._memory._release_buffer(self)
        except Exception:  # noqa: BLE001 - interpreter shutdown
            pass


class CudaMemory:
    """A client's GPU-memory registrations, one per allocation (made by
    :class:`Client` on first use; thread-safe)."""

    def __init__(self, client: Any) -> None:
        self._client = client
        self._lock = threading.Lock()
        # By (base, buffer id): a freed and reallocated base is a new entry.
        self._registrations: Dict[Tuple[int, int], _Registration] = {}
        self._closed = False

    # --- Registration -----------------------------------------------------------

    def _region_of(self, pointer: int, nbytes: int, timeout: float = 30.0) -> Tuple[_Registration, int]:
        """The registration holding ``nbytes`` at ``pointer`` and the offset
        there; registers the allocation first if it is new."""
        driver = _Driver.get()
        if driver.attribute(_CU_POINTER_ATTRIBUTE_MEMORY_TYPE, pointer) != _CU_MEMORYTYPE_DEVICE:
            raise ValueError("the array is not in device memory (managed or host memory is not "
                             "registered with the server)")
        buffer_id = driver.attribute(_CU_POINTER_ATTRIBUTE_BUFFER_ID, pointer, ctypes.c_uint64)
        driver.push_context_of(pointer)
        try:
            base, size = driver.address_range(pointer)
            key = (base, buffer_id)
            with self._lock:
                if self._closed:
                    raise ValueError("the client is closed")
                known = self._registrations.get(key)
            if known is None:
                if not driver.attribute(_CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE, pointer):
                    raise ValueError(
                        "the array's allocation cannot be shared through CUDA IPC (a stream-ordered "
                        "pool or virtual-memory allocation, e.g. PyTorch's expandable segments); "
                        "allocate it with cudaMalloc"
                    )
                handle = driver.ipc_handle(base)
                ordinal = driver.attribute(_CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, pointer)
                uuid = driver.device_uuid(ordinal)
            else:
                handle = uuid = b""
        finally:
            driver.pop_context()
        if known is None:
            known = self._register(key, base, size, handle, uuid, timeout)
        if pointer + nbytes > base + size:
            raise ValueError(f"{nbytes} bytes at the array run past its allocation")
        return known, pointer - base

    def _register(self, key: Tuple[int, int], base: int, size: int, handle: bytes, uuid: bytes,
                  timeout: float) -> _Registration:
        client = self._client
        request = matmul_pb2.RegisterCudaMemoryRequest(ipc_handle=handle, bytes=size, device_uuid=uuid)
        # No deadline: the call lasts as long as the registration.
        call = client._stub.RegisterCudaMemory(request, metadata=client._metadata)
        timer = threading.Timer(timeout, call.cancel)
        timer.daemon = True
        timer.start()
        try:
            response = next(call)
        except StopIteration:
            raise MatmulError(grpc.StatusCode.INTERNAL,
                              "the server ended RegisterCudaMemory without describing the region") from None
        except grpc.RpcError as error:
            raise MatmulError.from_call(error) from error
        finally:
            timer.cancel()
        registration = _Registration(base, size, response.region, call)
        with self._lock:
            if self._closed:
                call.cancel()
                raise ValueError("the client is closed")
            raced = self._registrations.get(key)
            if raced is not None:  # another thread registered it first
                call.cancel()
                return raced
            self._registrations[key] = registration
        return registration

    def regions(self) -> List[matmul_pb2.SharedMemoryRegion]:
        """The regions this client registered, as the server described them."""
        with self._lock:
            return [r.region for r in self._registrations.values()]

    def _forget(self, base: int) -> None:
        with self._lock:
            keys = [k for k in self._registrations if k[0] == base]
            gone = [self._registrations.pop(k) for k in keys]
        for registration in gone:
            registration.call.cancel()

    def close(self) -> None:
        """Ends every registration (the server closes the memory once no
        multiply uses it). Idempotent."""
        with self._lock:
            self._closed = True
            gone = list(self._registrations.values())
            self._registrations.clear()
        for registration in gone:
            registration.call.cancel()

    # --- Products the client allocates ------------------------------------------------

    def _allocate(self, shape: Tuple[int, ...], wire: int, device: int, near: int) -> DeviceBuffer:
        driver = _Driver.get()
        nbytes = max(int(np.prod(shape, dtype=np.int64)) * _WIRE_SIZES[wire], 1)
        driver.push_context_of(near)
        try:
            pointer = driver.alloc(nbytes)
        finally:
            driver.pop_context()
        return DeviceBuffer(self, pointer, shape, wire, device)

    def _release_buffer(self, buffer: DeviceBuffer) -> None:
        self._forget(buffer.pointer)
        _Driver.get().free(buffer.pointer)

    # --- Multiplies ---------------------------------------------------------------

    def multiply(self, a: Any, b: Any, *, out: Any = None, transpose_a: bool = False,
                 transpose_b: bool = False, compute: str = "strict",
                 timeout: Optional[float] = None) -> Any:
        """See :meth:`Client.multiply`: a and b GPU arrays (or one of them a
        NumPy array, sent inline), ``out`` a GPU array or None."""
        if compute not in _COMPUTE_MODES:
            raise ValueError(f"compute={compute!r}: expected one of {sorted(_COMPUTE_MODES)}")
        flags = [bool(transpose_a), bool(transpose_b)]
        views: List[Optional[_View]] = []
        for i, (name, x) in enumerate((("a", a), ("b", b))):
            view = view_of(name, x) if is_gpu_array(x) else None
            if view is not None:
                flags[i] ^= view.transposed
            views.append(view)
        gpu = [v for v in views if v is not None]
        if not gpu:
            raise TypeError("neither operand is a GPU array")
        wire = gpu[0].wire
        if any(v.wire != wire for v in gpu):
            raise TypeError("a and b have different dtypes; both must have the same dtype")
        inline = [None if v is not None else _inline_operand(name, x, wire)
                  for v, (name, x) in zip(views, (("a", a), ("b", b)))]
        shapes = [v.shape if v is not None else tuple(t.shape) for v, t in zip(views, inline)]
        shape = product_shape(shapes[0], shapes[1], flags[0], flags[1])
        like = a if views[0] is not None else b
        result, out_view = self._product(out, shape, wire, like, gpu[0])
        # The operands' (and out's) writers are done before the server reads.
        for view in gpu + [out_view]:
            if view.stream is not None:
                _Driver.get().synchronize(view.stream, view.pointer)
        request = matmul_pb2.MultiplyRequest(
            transpose_a=flags[0], transpose_b=flags[1], compute_mode=_COMPUTE_MODES[compute])
        for field, view, tensor in (("a", views[0], inline[0]), ("b", views[1], inline[1])):
            target = getattr(request, field)
            if view is None:
                target.CopyFrom(tensor)
                continue
            registration, offset = self._region_of(view.pointer, view.nbytes)
            target.shape.extend(view.shape)
            target.dtype = view.wire
            target.shared.region_id = registration.region.id
            target.shared.offset = offset
        registration, offset = self._region_of(out_view.pointer, out_view.nbytes)
        request.c_shared.region_id = registration.region.id
        request.c_shared.offset = offset
        client = self._client
        try:
            response = client._stub.Multiply(request, timeout=client._deadline(timeout),
                                             metadata=client._metadata)
        except grpc.RpcError as error:
            raise MatmulError.from_call(error) from error
        if tuple(response.c.shape) != shape or response.c.shared.region_id != request.c_shared.region_id:
            raise MatmulError(grpc.StatusCode.INTERNAL,
                              "the server's answer to a GPU-memory multiply is not the product's place")
        return result

    def _product(self, out: Any, shape: Tuple[int, ...], wire: int, like: Any,
                 first: _View) -> Tuple[Any, _View]:
        """Where C goes: ``out`` (checked), a new array made the way the
        input's library makes them (``like.new_empty``: a PyTorch tensor,
        by duck typing), or a :class:`DeviceBuffer`."""
        if out is None and callable(getattr(like, "new_empty", None)):
            out = like.new_empty(shape)
        if out is None:
            buffer = self._allocate(shape, wire, first.device or 0, first.pointer)
            return buffer, view_of("out", buffer)
        if not is_gpu_array(out):
            raise TypeError(f"out: expected a GPU array (__cuda_array_interface__), got {type(out).__name__}")
        view = view_of("out", out)
        if view.transposed or view.shape != shape or view.wire != wire:
            raise ValueError(f"out must be a C-contiguous {shape} array of the operands' dtype")
        return out, view


def _inline_operand(name: str, x: Any, wire: int) -> matmul_pb2.Tensor:
    """A host operand beside a GPU one: sent inline, in the GPU one's dtype."""
    dtype = {matmul_pb2.DTYPE_FLOAT32: np.float32, matmul_pb2.DTYPE_FLOAT64: np.float64,
             matmul_pb2.DTYPE_FLOAT16: np.float16}.get(wire)
    if dtype is None:
        raise TypeError(f"{name}: a host operand beside a bfloat16 GPU one is not supported; "
                        f"move it to the GPU")
    host = np.ascontiguousarray(np.asarray(x), dtype=np.dtype(dtype).newbyteorder("<"))
    if host.ndim not in (2, 3):
        raise ValueError(f"{name} has {host.ndim} dimension(s); expected 2-D or 3-D")
    return matmul_pb2.Tensor(shape=host.shape, dtype=wire, data=host.tobytes())


def uses_gpu_memory(*arrays: Any) -> bool:
    """Whether any of ``arrays`` is a GPU array (the client then takes the
    GPU-memory path)."""
    return any(x is not None and is_gpu_array(x) for x in arrays)


__all__ = ["CudaMemory", "CudaError", "DeviceBuffer", "is_gpu_array", "uses_gpu_memory"]
