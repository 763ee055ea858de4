"""DLPack arrays that claim to live on a CUDA device at a chosen (fake) address, for the host-side
validation tests: the extension checks them exactly as it checks real device arrays, and every test
that uses one must fail validation before anything is launched."""

import ctypes

KDL_CPU, KDL_CUDA = 1, 2
# DLPack dtype codes: int 0, uint 1, float 2, bfloat 4, float8_e4m3fn 10 (DLPack 1.1).
DTYPES = {"int32": (0, 32), "uint8": (1, 8), "float32": (2, 32), "bfloat16": (4, 16), "float8_e4m3fn": (10, 8)}


class _DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class _DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class _DLTensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("device", _DLDevice), ("ndim", ctypes.c_int32),
                ("dtype", _DLDataType), ("shape", ctypes.POINTER(ctypes.c_int64)),
                ("strides", ctypes.POINTER(ctypes.c_int64)), ("byte_offset", ctypes.c_uint64)]


class _DLManagedTensor(ctypes.Structure):
    _fields_ = [("dl_tensor", _DLTensor), ("manager_ctx", ctypes.c_void_p), ("deleter", ctypes.c_void_p)]


_capsule_new = ctypes.pythonapi.PyCapsule_New
_capsule_new.restype = ctypes.py_object
_capsule_new.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]


class FakeArray:
    """shape/dtype/address/device of a DLPack array; no memory behind it."""

    def __init__(self, shape, dtype="bfloat16", address=0x7F0000000000, device_type=KDL_CUDA, device_id=0,
                 strides=None):
        self.shape = tuple(shape)
        self.dtype = dtype
        self.address = address
        self.device_type = device_type
        self.device_id = device_id
        self.strides = strides
        self._keep = []

    @property
    def nbytes(self):
        count = 1
        for extent in self.shape:
            count *= extent
        return count * DTYPES[self.dtype][1] // 8

    def __dlpack_device__(self):
        return (self.device_type, self.device_id)

    def __dlpack__(self, **kwargs):
        if kwargs.get("max_version") is not None:
            raise TypeError("only unversioned capsules")  # nanobind then asks for the unversioned kind
        ndim = len(self.shape)
        shape = (ctypes.c_int64 * max(ndim, 1))(*self.shape)
        strides = None
        if self.strides is not None:
            strides = (ctypes.c_int64 * max(ndim, 1))(*self.strides)
        code, bits = DTYPES[self.dtype]
        managed = _DLManagedTensor()
        managed.dl_tensor.data = self.address
        managed.dl_tensor.device = _DLDevice(self.device_type, self.device_id)
        managed.dl_tensor.ndim = ndim
        managed.dl_tensor.dtype = _DLDataType(code, bits, 1)
        managed.dl_tensor.shape = shape
        managed.dl_tensor.strides = strides
        managed.dl_tensor.byte_offset = 0
        managed.manager_ctx = None
        managed.deleter = None
        self._keep.append((managed, shape, strides))
        return _capsule_new(ctypes.addressof(managed), b"dltensor", None)


class FakeHeap:
    """Hands out disjoint, 256-byte aligned fake device addresses."""

    def __init__(self, start=0x7F0000000000):
        self.next = start

    def array(self, shape, dtype="bfloat16", **kwargs):
        array = FakeArray(shape, dtype, address=self.next, **kwargs)
        self.next += (array.nbytes + 4095) // 4096 * 4096 + 4096
        return array
