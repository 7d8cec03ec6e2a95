"""Turning numpy arrays and torch tensors into plain values for the native layer.

A buffer crosses as ``(address, element count, dtype name, device index)`` with -1 for host
memory: ``__cuda_array_interface__`` loses bf16 and fails on fp8, so torch tensors give
``data_ptr()``, ``numel()`` and their dtype name directly. Nothing is copied.
"""

from __future__ import annotations

import sys
from types import ModuleType
from typing import Any, Callable, Optional, Sequence

import numpy as np

from ._errors import FerrocommValueError

HOST = -1


def _torch() -> Any:
    """torch if the program has imported it (a tensor cannot exist otherwise)."""
    return sys.modules.get("torch")


def current_stream_handle(torch: Any, device_index: int) -> int:
    """The caller's current CUDA stream on `device_index` as an integer (a ``CUstream``).

    torch's raw-stream accessor (what its compiled code calls) skips building a Stream object,
    a microsecond of the host time of every call; the public spelling is the fallback."""
    global _raw_stream
    if _raw_stream is None:
        _raw_stream = getattr(torch._C, "_cuda_getCurrentRawStream", None) or (
            lambda i: torch.cuda.current_stream(i).cuda_stream)
    return _raw_stream(device_index)


_raw_stream: Optional[Callable[[int], int]] = None


def is_tensor(obj: object) -> bool:
    tensor = _Tensor or _tensor_type()
    return tensor is not None and isinstance(obj, tensor)


def is_buffer(obj: object) -> bool:
    return isinstance(obj, np.ndarray) or is_tensor(obj)


class Buf:
    """One buffer: the object (kept alive while the collective may touch it) and its values."""

    __slots__ = ("obj", "ptr", "count", "dtype", "device", "esize")

    def __init__(self, obj: Any, ptr: int, count: int, dtype: str, device: int,
                 esize: int) -> None:
        self.obj = obj
        self.ptr = ptr
        self.count = count
        self.dtype = dtype
        self.device = device
        self.esize = esize

    @property
    def shape(self) -> tuple[int, ...]:
        # Read where a call needs it (error messages, the fused call's rows), not by every
        # call's description.
        shape: tuple[int, ...] = self.obj.shape
        return shape

    def raw(self) -> tuple[int, int, str, int]:
        return (self.ptr, self.count, self.dtype, self.device)

    @property
    def nbytes(self) -> int:
        return self.count * self.esize

    def overlaps(self, other: Buf) -> bool:
        if self.nbytes == 0 or other.nbytes == 0 or self.device != other.device:
            return False
        return self.ptr < other.ptr + other.nbytes and other.ptr < self.ptr + self.nbytes


_TORCH_DTYPES: dict[Any, tuple[Optional[str], int]] = {}


_Tensor: Optional[type] = None


def _tensor_type() -> Optional[type]:
    """torch.Tensor once the program has imported torch (None before)."""
    global _Tensor
    torch = _torch()
    if torch is not None:
        _Tensor = torch.Tensor
    return _Tensor


def _torch_dtype_name(dtype: Any) -> Optional[str]:
    if dtype.is_complex or str(dtype).replace("torch.", "").startswith(("qint", "quint")):
        return None
    return str(dtype).replace("torch.", "")


# dtype name -> whether the native layer takes it (asked of its parser once per name).
_NATIVE_DTYPES: dict[str, bool] = {}


def native_dtype(name: str) -> bool:
    """Whether the native layer takes element type `name` (numpy's and torch's names)."""
    ok = _NATIVE_DTYPES.get(name)
    if ok is None:
        from . import _native

        try:
            _native.dtype_name(name)
            ok = True
        except ValueError:
            ok = False
        _NATIVE_DTYPES[name] = ok
    return ok


def unsupported_dtype(name: str, coll: str) -> FerrocommValueError:
    """The error for an element type the native layer does not take."""
    return FerrocommValueError(
        f"unsupported dtype {name} for {coll} (ferrocomm takes float32, float64, float16, "
        "bfloat16, float8_e4m3fn, float8_e5m2, int8, uint8, int32, uint32, int64, uint64; "
        "bool, int16 and uint16 are moved, bool reduced too)"
    )


def describe(obj: Any, what: str, coll: str, writable: bool = False) -> Buf:
    """A `Buf` for a numpy array or torch tensor, or FerrocommValueError saying what is wrong."""
    # Tensors first: they are what the hot paths pass (torch.Tensor looked up once torch is
    # imported; a tensor cannot exist before).
    tensor = _Tensor or _tensor_type()
    if tensor is not None and isinstance(obj, tensor):
        obj = tensor_any(obj)
        # The element type's name and size, looked up once per dtype (name None: refused);
        # complex and quantized dtypes are refused by name, sparse layouts by is_sparse below.
        seen = _TORCH_DTYPES.get(obj.dtype)
        if seen is None:
            seen = _TORCH_DTYPES[obj.dtype] = (_torch_dtype_name(obj.dtype), obj.element_size())
        dtype, esize = seen
        try:
            contiguous = obj.is_contiguous()
        except RuntimeError:  # sparse compressed layouts have no strides to ask about
            contiguous = False
        if not contiguous:
            if obj.layout is not _torch().strided:
                raise FerrocommValueError(
                    f"{coll}: {what} is a {obj.layout} tensor; ferrocomm's collectives take "
                    "dense tensors (the torch backend's all_reduce sums sparse COO tensors)")
            raise FerrocommValueError(
                f"{coll}: {what} is not contiguous (strides {tuple(obj.stride())} for shape "
                f"{tuple(obj.shape)}); pass tensor.contiguous()"
            )
        if dtype is None:
            raise unsupported_dtype(str(obj.dtype).replace("torch.", ""), coll)
        if obj.is_sparse:
            raise FerrocommValueError(f"{coll}: {what} has unsupported layout {obj.layout}")
        # is_cuda / is_cpu and get_device() build no torch.device object.
        if obj.is_cuda:
            device = obj.get_device()
        elif obj.is_cpu:
            device = HOST
        else:
            raise FerrocommValueError(
                f"{coll}: {what} is on device {obj.device}, expected cuda or cpu")
        # torch.Size is a tuple already.
        return Buf(obj, obj.data_ptr(), obj.numel(), dtype, device, esize)
    if isinstance(obj, np.ndarray):
        if not obj.flags.c_contiguous:
            raise FerrocommValueError(
                f"{coll}: {what} is not contiguous (strides {obj.strides} for shape "
                f"{obj.shape}); pass np.ascontiguousarray(...)"
            )
        if writable and not obj.flags.writeable:
            raise FerrocommValueError(f"{coll}: {what} is read-only")
        if not obj.dtype.isnative:
            raise FerrocommValueError(f"{coll}: {what} has non-native byte order ({obj.dtype.str})")
        ptr = obj.__array_interface__["data"][0]
        return Buf(obj, ptr, obj.size, obj.dtype.name, HOST, obj.dtype.itemsize)
    raise FerrocommValueError(
        f"{coll}: {what} must be a numpy array or a torch tensor, not {type(obj).__name__}"
    )


def tensor_any(obj: object) -> Any:
    """A torch tensor, typed as any value: torch is optional, its types are not checked here."""
    return obj


def device_name(index: int) -> str:
    return "cpu" if index == HOST else f"cuda:{index}"


def empty_like_flat(buf: Buf, count: int) -> Any:
    """A new contiguous 1-d buffer of `count` elements, same dtype and device as `buf`."""
    obj = buf.obj
    if isinstance(obj, np.ndarray):
        return np.empty(count, dtype=obj.dtype)
    return _torch().empty(count, dtype=obj.dtype, device=obj.device)


def zeros_like_flat(buf: Buf, count: int) -> Any:
    """As `empty_like_flat`, filled with zeros."""
    obj = buf.obj
    if isinstance(obj, np.ndarray):
        return np.zeros(count, dtype=obj.dtype)
    return _torch().zeros(count, dtype=obj.dtype, device=obj.device)


def concat_flat(objs: Sequence[Any], like: Any) -> Any:
    """The elements of `objs`, flattened and concatenated into one new contiguous buffer."""
    if isinstance(like, np.ndarray):
        return np.concatenate([np.ravel(o) for o in objs]) if objs else np.empty(0, like.dtype)
    t = _torch()
    if like.dtype in (getattr(t, "float8_e4m3fn", None), getattr(t, "float8_e5m2", None)):
        # torch.cat lacks fp8 kernels in some versions: concatenate the bytes.
        return t.cat([o.reshape(-1).view(t.uint8) for o in objs]).view(like.dtype)
    return t.cat([o.reshape(-1) for o in objs])


def copy_into(dst: Any, src_flat: Any) -> None:
    """Copies a flat buffer into `dst` (any layout) element by element."""
    if isinstance(dst, np.ndarray):
        dst[...] = src_flat.reshape(dst.shape)
    else:
        dst.copy_(src_flat.view(dst.shape))


def copy_flat_into(flat: Any, start: int, src: Any) -> None:
    """Copies `src` (any layout) into `flat` at element `start`."""
    n = src.size if isinstance(src, np.ndarray) else src.numel()
    flat[start:start + n] = src.reshape(-1)


def flat_slice(flat: Any, start: int, length: int) -> Any:
    return flat[start:start + length]


def fp8_rows_like(obj: Any, shape: tuple[int, ...]) -> tuple[Any, Any]:
    """New (codes, scales) buffers for FP8 rows of `shape` on `obj`'s device: E4M3 codes (numpy:
    their bytes as uint8) of `shape` and f32 scales of `shape[:-1] + (1,)`."""
    rows_shape = tuple(shape[:-1]) + (1,)
    if isinstance(obj, np.ndarray):
        return np.empty(shape, dtype=np.uint8), np.empty(rows_shape, dtype=np.float32)
    torch = _torch()
    return (torch.empty(shape, dtype=torch.float8_e4m3fn, device=obj.device),
            torch.empty(rows_shape, dtype=torch.float32, device=obj.device))


def given_scale_like(obj: Any, scale: Any, coll: str) -> Any:
    """A given FP8 scale as a buffer on `obj`'s device: a number becomes a one-element float32
    array or tensor there; an array or tensor is taken as it is (checked by the caller)."""
    if isinstance(scale, bool) or not (isinstance(scale, (int, float)) or hasattr(scale, "dtype")):
        raise FerrocommValueError(
            f"{coll}: scale must be a number or a one-element float32 tensor, not "
            f"{type(scale).__name__}")
    if not isinstance(scale, (int, float)):
        return scale
    if isinstance(obj, np.ndarray):
        return np.array([scale], dtype=np.float32)
    torch = _torch()
    return torch.tensor([float(scale)], dtype=torch.float32, device=obj.device)


def rows_of(obj: Any, coll: str) -> tuple[int, int]:
    """Leading dimension and elements per row (torch's split sizes count rows)."""
    shape = obj.shape
    if len(shape) == 0:
        raise FerrocommValueError(f"{coll}: counting rows needs tensors of at least 1 dim")
    rows = shape[0]
    per_row = 1
    for d in shape[1:]:
        per_row *= d
    return rows, per_row
