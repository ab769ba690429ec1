"""From Python objects to what the native module takes: an address, a
length in bytes, an element type, and where the memory is.

Nothing is copied. Accepted, in this order: torch tensors (CPU, or CUDA
through the device path), objects with ``__cuda_array_interface__``
(CuPy, Numba), ``__array_interface__`` (numpy), the buffer protocol
(``array.array``, ``bytearray``, ``memoryview``, ``bytes`` as a send
buffer), and DLPack (``__dlpack__``). Every buffer must be C-contiguous.
A :class:`View` keeps what pins the memory until it is released.
"""

import ctypes
import struct

from .errors import InvalidArgument

# oxccl's element types: name -> size in bytes.
SIZES = {
    "int8": 1,
    "uint8": 1,
    "int32": 4,
    "uint32": 4,
    "int64": 8,
    "uint64": 8,
    "float16": 2,
    "float32": 4,
    "float64": 8,
    "bfloat16": 2,
    "f8e4m3": 1,
    "f8e5m2": 1,
}

# numpy typestr kind + size -> oxccl's name (bfloat16 has no numpy code).
_TYPESTR = {
    ("i", 1): "int8",
    ("u", 1): "uint8",
    ("i", 4): "int32",
    ("u", 4): "uint32",
    ("i", 8): "int64",
    ("u", 8): "uint64",
    ("f", 2): "float16",
    ("f", 4): "float32",
    ("f", 8): "float64",
    ("b", 1): "uint8",
}

# struct-module format characters (native sizes on this machine).
_FORMATS = {
    "b": "int8",
    "B": "uint8",
    "?": "uint8",
    "e": "float16",
    "f": "float32",
    "d": "float64",
}
for _c in "hHiIlLqQnN":
    if struct.calcsize(_c) in (4, 8):
        _FORMATS[_c] = ("uint" if _c.isupper() else "int") + str(8 * struct.calcsize(_c))

# DLPack type codes (kDLInt, kDLUInt, kDLFloat, kDLBfloat, kDLBool).
_DLPACK = {(0, 8): "int8", (0, 32): "int32", (0, 64): "int64", (1, 8): "uint8", (1, 32): "uint32",
           (1, 64): "uint64", (2, 16): "float16", (2, 32): "float32", (2, 64): "float64", (4, 16): "bfloat16",
           (6, 8): "uint8"}


def normalize_dtype(dtype):
    """oxccl's name for ``dtype``: a name (``"float32"``, ``"bf16"``), a
    numpy dtype or a torch dtype."""
    if dtype is None:
        return None
    name = getattr(dtype, "name", None) or str(dtype)
    name = name.replace("torch.", "").lower()
    aliases = {"float": "float32", "double": "float64", "half": "float16", "bf16": "bfloat16", "fp16": "float16",
               "f16": "float16", "f32": "float32", "f64": "float64", "int": "int32", "long": "int64",
               "bool": "uint8", "float8_e4m3fn": "f8e4m3", "float8_e5m2": "f8e5m2"}
    name = aliases.get(name, name)
    if name not in SIZES:
        raise InvalidArgument(f"data type {dtype!r} is not one oxccl has ({', '.join(SIZES)})")
    return name


class View:
    """A buffer as the native module takes it. ``device`` is ``None`` for
    host memory, else the CUDA stream to enqueue on."""

    __slots__ = ("addr", "nbytes", "dtype", "device", "stream", "boolean", "_keep", "_release")

    def __init__(self, addr, nbytes, dtype, device=False, stream=0, keep=None, release=None, boolean=False):
        self.addr, self.nbytes, self.dtype = addr, nbytes, dtype
        self.device, self.stream = device, stream
        # Booleans travel as uint8; a reduction of them is logical (see Communicator._coll).
        self.boolean = boolean
        self._keep, self._release = keep, release

    @property
    def count(self):
        """Elements of its type."""
        return self.nbytes // SIZES[self.dtype]

    @property
    def span(self):
        """``(address, bytes, on a device)``, as the native module takes a
        buffer."""
        return (self.addr, self.nbytes, bool(self.device))

    def release(self):
        """Lets go of the memory (a buffer-protocol export, a DLPack
        capsule); the view must not be used after."""
        r, self._release, self._keep = self._release, None, None
        if r is not None:
            r()


def _typed(name, what, itemsize, dtype):
    """The element type: the caller's ``dtype`` when given (it must fit the
    item size), else the object's."""
    if dtype is not None:
        if itemsize not in (0, 1) and SIZES[dtype] != itemsize and name is not None:
            raise InvalidArgument(f"{what}: its elements are {itemsize} bytes, not a {dtype}")
        return dtype
    if name is None:
        raise InvalidArgument(f"{what}: oxccl has no type for its elements; pass dtype=")
    return name


# torch dtype -> (oxccl's name, boolean, element size), filled as they come.
_TORCH_DTYPES = {}


def _torch_view(t, what, dtype, writable):
    if not t.is_contiguous():
        raise InvalidArgument(f"{what}: the tensor is not contiguous (call .contiguous() first)")
    known = _TORCH_DTYPES.get(t.dtype)
    if known is None:
        boolean = str(t.dtype) == "torch.bool"
        known = ("uint8" if boolean else normalize_dtype(t.dtype), boolean, t.element_size())
        _TORCH_DTYPES[t.dtype] = known
    name, boolean, size = known
    if dtype is not None:
        name = _typed(name, what, size, dtype)
    nbytes = t.numel() * size
    if t.is_cuda:
        import torch

        stream = torch.cuda.current_stream(t.device).cuda_stream
        return View(t.data_ptr(), nbytes, name, device=True, stream=stream, keep=t, boolean=boolean)
    if t.is_cpu:
        return View(t.data_ptr(), nbytes, name, keep=t, boolean=boolean)
    raise InvalidArgument(f"{what}: tensors on {t.device} are not supported (cpu or cuda)")


# numpy dtype -> (oxccl's name or None, boolean, item size), filled as they come.
_NUMPY_DTYPES = {}


def _numpy_view(a, what, dtype, writable):
    """A numpy array's view without building its ``__array_interface__``
    twice over: the same checks, fewer lookups (small calls are
    latency-bound)."""
    flags = a.flags
    if not flags.c_contiguous:
        raise InvalidArgument(f"{what}: the array is not C-contiguous (numpy.ascontiguousarray first)")
    if writable and not flags.writeable:
        raise InvalidArgument(f"{what}: the array is read-only but this buffer is written")
    known = _NUMPY_DTYPES.get(a.dtype)
    if known is None:
        typestr = a.dtype.str
        if typestr[1] in "OUSMmV" or not typestr[2:].isdigit():
            return _interface_view(a, a.__array_interface__, what, dtype, writable, device=False)
        size = int(typestr[2:])
        known = _NUMPY_DTYPES[a.dtype] = (_TYPESTR.get((typestr[1], size)), typestr[1] == "b", size)
    name, boolean, size = known
    name = _typed(name, what, size, dtype)
    return View(a.ctypes.data, a.nbytes, name, keep=a, boolean=boolean)


def _contiguous(shape, strides, itemsize):
    if strides is None:
        return True
    expect = itemsize
    for n, s in zip(reversed(shape), reversed(strides)):
        if n != 1 and s != expect:
            return False
        expect *= n
    return True


def _interface_view(obj, d, what, dtype, writable, device):
    addr, readonly = d["data"]
    typestr, shape = d["typestr"], tuple(d["shape"])
    if len(typestr) < 3 or not typestr[2:].isdigit() or typestr[1] in "OUSMm":
        kinds = {"O": "Python object", "U": "unicode string", "S": "byte string", "M": "datetime",
                 "m": "timedelta"}
        raise InvalidArgument(f"{what}: arrays of {kinds.get(typestr[1:2], 'such')} elements ({typestr!r}) are not "
                              f"supported; oxccl moves numbers: {', '.join(SIZES)}")
    itemsize = int(typestr[2:])
    if not _contiguous(shape, d.get("strides"), itemsize):
        raise InvalidArgument(f"{what}: the array is not C-contiguous (numpy.ascontiguousarray first)")
    if writable and readonly:
        raise InvalidArgument(f"{what}: the array is read-only but this buffer is written")
    n = 1
    for s in shape:
        n *= s
    name = _typed(_TYPESTR.get((typestr[1], itemsize)), what, itemsize, dtype)
    stream = (d.get("stream") or 0) if device else 0
    if stream == 1:  # the legacy default stream, by the interface's convention
        stream = 0
    return View(addr or 0, n * itemsize, name, device=device, stream=stream, keep=obj, boolean=typestr[1] == "b")


class _PyBuffer(ctypes.Structure):
    _fields_ = [("buf", ctypes.c_void_p), ("obj", ctypes.py_object), ("len", ctypes.c_ssize_t),
                ("itemsize", ctypes.c_ssize_t), ("readonly", ctypes.c_int), ("ndim", ctypes.c_int),
                ("format", ctypes.c_char_p), ("shape", ctypes.c_void_p), ("strides", ctypes.c_void_p),
                ("suboffsets", ctypes.c_void_p), ("internal", ctypes.c_void_p)]


_PyBUF_WRITABLE, _PyBUF_FORMAT, _PyBUF_C_CONTIGUOUS = 0x1, 0x4, 0x38
_get_buffer = ctypes.pythonapi.PyObject_GetBuffer
_get_buffer.argtypes = [ctypes.py_object, ctypes.POINTER(_PyBuffer), ctypes.c_int]
_release_buffer = ctypes.pythonapi.PyBuffer_Release
_release_buffer.argtypes = [ctypes.POINTER(_PyBuffer)]
_release_buffer.restype = None


def _buffer_view(obj, what, dtype, writable):
    b = _PyBuffer()
    flags = _PyBUF_FORMAT | _PyBUF_C_CONTIGUOUS | (_PyBUF_WRITABLE if writable else 0)
    try:
        _get_buffer(obj, ctypes.byref(b), flags)
    except BufferError as e:
        raise InvalidArgument(f"{what}: {e}") from None
    fmt = (b.format or b"B").decode().lstrip("@=<")
    name = _FORMATS.get(fmt)
    try:
        name = _typed(name, what, b.itemsize, dtype)
    except Exception:
        _release_buffer(ctypes.byref(b))
        raise
    return View(b.buf or 0, b.len, name, keep=obj, release=lambda: _release_buffer(ctypes.byref(b)),
                boolean=fmt == "?")


class _DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class _DLTensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("device", _DLDevice), ("ndim", ctypes.c_int32),
                ("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16),
                ("shape", ctypes.POINTER(ctypes.c_int64)), ("strides", ctypes.POINTER(ctypes.c_int64)),
                ("byte_offset", ctypes.c_uint64)]


class _DLManaged(ctypes.Structure):
    pass


_DLManaged._fields_ = [("dl_tensor", _DLTensor), ("manager_ctx", ctypes.c_void_p),
                       ("deleter", ctypes.CFUNCTYPE(None, ctypes.POINTER(_DLManaged)))]
_capsule_pointer = ctypes.pythonapi.PyCapsule_GetPointer
_capsule_pointer.argtypes = [ctypes.py_object, ctypes.c_char_p]
_capsule_pointer.restype = ctypes.c_void_p
_capsule_rename = ctypes.pythonapi.PyCapsule_SetName
_capsule_rename.argtypes = [ctypes.py_object, ctypes.c_char_p]


def _dlpack_view(obj, what, dtype):
    capsule = obj.__dlpack__()
    ptr = _capsule_pointer(capsule, b"dltensor")
    _capsule_rename(capsule, b"used_dltensor")  # ours now: we call its deleter
    m = ctypes.cast(ptr, ctypes.POINTER(_DLManaged))
    t = m.contents.dl_tensor
    shape = [t.shape[i] for i in range(t.ndim)]
    itemsize = t.bits // 8
    strides = None if not t.strides else [t.strides[i] * itemsize for i in range(t.ndim)]

    def release():
        if m.contents.deleter:
            m.contents.deleter(m)

    if t.lanes != 1 or not _contiguous(shape, strides, itemsize):
        release()
        raise InvalidArgument(f"{what}: the DLPack tensor is not C-contiguous with one lane")
    n = 1
    for s in shape:
        n *= s
    try:
        name = _typed(_DLPACK.get((t.code, t.bits)), what, itemsize, dtype)
    except Exception:
        release()
        raise
    device = t.device.device_type in (2, 13)  # kDLCUDA, kDLCUDAManaged
    if t.device.device_type not in (1, 2, 3, 13):
        release()
        raise InvalidArgument(f"{what}: DLPack device type {t.device.device_type} is not cpu or cuda")
    return View((t.data or 0) + t.byte_offset, n * itemsize, name, device=device, keep=(obj, capsule),
                release=release, boolean=t.code == 6)


def view(obj, what, dtype=None, writable=False):
    """A :class:`View` of ``obj`` (``what`` names it in errors, e.g. "the
    send buffer"); ``writable`` when the call writes it. ``dtype`` reads
    its memory as that type (bytes as anything; else the sizes must
    match)."""
    v = _view(obj, what, None if dtype is None else normalize_dtype(dtype), writable)
    if v.nbytes % SIZES[v.dtype]:
        v.release()
        raise InvalidArgument(f"{what}: {v.nbytes} bytes are not whole {v.dtype} elements")
    return v


# Exact types whose view is known by type alone: torch.Tensor and its
# subclasses (nn.Parameter), numpy.ndarray.
_BY_TYPE = {}


def _view(obj, what, dtype, writable):
    tp = type(obj)
    fast = _BY_TYPE.get(tp)
    if fast is not None:
        return fast(obj, what, dtype, writable)
    mod = tp.__module__ or ""
    if mod.startswith("torch") and hasattr(obj, "data_ptr"):
        _BY_TYPE[tp] = _torch_view
        return _torch_view(obj, what, dtype, writable)
    if mod == "numpy" and tp.__name__ == "ndarray":
        _BY_TYPE[tp] = _numpy_view
        return _numpy_view(obj, what, dtype, writable)
    d = getattr(obj, "__cuda_array_interface__", None)
    if d is not None:
        return _interface_view(obj, d, what, dtype, writable, device=True)
    d = getattr(obj, "__array_interface__", None)
    if d is not None:
        return _interface_view(obj, d, what, dtype, writable, device=False)
    try:
        memoryview(obj).release()
        has_buffer = True
    except TypeError:
        has_buffer = False
    if has_buffer:
        return _buffer_view(obj, what, dtype, writable)
    if hasattr(obj, "__dlpack__"):
        return _dlpack_view(obj, what, dtype)
    raise InvalidArgument(
        f"{what}: a {type(obj).__name__} is not a buffer (numpy array, torch tensor, array.array, "
        "bytearray, memoryview, __cuda_array_interface__ or __dlpack__)")
