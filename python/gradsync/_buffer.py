"""Buffers without copies: a numpy array (or anything with the numpy array
interface) or a torch CPU tensor becomes its data pointer, element count and
gs_dtype. Neither numpy nor torch is imported here: arrays are read through
__array_interface__, tensors through their own methods."""
import enum
import sys


class DType(enum.IntEnum):
    """gs_dtype."""
    F32 = 0
    F64 = 1
    F16 = 2
    BF16 = 3
    I32 = 4
    I64 = 5
    U8 = 6
    I8 = 7
    I16 = 8
    BOOL = 9


_SIZES = {DType.F32: 4, DType.F64: 8, DType.F16: 2, DType.BF16: 2, DType.I32: 4, DType.I64: 8, DType.U8: 1,
          DType.I8: 1, DType.I16: 2, DType.BOOL: 1}

_NATIVE = "<" if sys.byteorder == "little" else ">"
# numpy typestr without its byte-order character -> gs_dtype (bf16 has no numpy type)
_NUMPY = {"f4": DType.F32, "f8": DType.F64, "f2": DType.F16, "i4": DType.I32, "i8": DType.I64,
          "u1": DType.U8, "i1": DType.I8, "i2": DType.I16, "b1": DType.BOOL}
_TORCH = {"torch.float32": DType.F32, "torch.float64": DType.F64, "torch.float16": DType.F16,
          "torch.bfloat16": DType.BF16, "torch.int32": DType.I32, "torch.int64": DType.I64,
          "torch.uint8": DType.U8, "torch.int8": DType.I8, "torch.int16": DType.I16, "torch.bool": DType.BOOL}


class Buffer:
    """What C needs of one buffer; `obj` keeps the array or tensor alive."""
    __slots__ = ("obj", "ptr", "count", "dtype")

    def __init__(self, obj, ptr, count, dtype):
        self.obj, self.ptr, self.count, self.dtype = obj, ptr, count, dtype

    @property
    def nbytes(self):
        return self.count * _SIZES[self.dtype]


def _is_tensor(obj):
    return type(obj).__module__.startswith("torch") and hasattr(obj, "data_ptr")


def _from_tensor(obj, what, writable):
    if obj.device.type != "cpu":
        raise ValueError("%s: a %s tensor; gradsync takes CPU tensors" % (what, obj.device.type))
    if str(obj.layout) != "torch.strided":
        raise ValueError("%s: a %s tensor; gradsync takes dense (strided) tensors" % (what, obj.layout))
    dtype = _TORCH.get(str(obj.dtype))
    if dtype is None:
        raise ValueError("%s: dtype %s has no gradsync type (%s)" % (what, obj.dtype, ", ".join(_TORCH)))
    if not obj.is_contiguous():
        raise ValueError("%s: the tensor is not contiguous (pass .contiguous() and copy back)" % what)
    return Buffer(obj, obj.data_ptr(), obj.numel(), dtype)


def _contiguous(shape, strides, itemsize):
    if strides is None:
        return True
    step = itemsize
    for n, s in zip(reversed(shape), reversed(strides)):
        if n > 1 and s != step:
            return False
        step *= n
    return True


def _from_array(obj, what, writable):
    face = obj.__array_interface__
    typestr = face["typestr"]
    dtype = _NUMPY.get(typestr[1:])
    if dtype is None or typestr[0] not in (_NATIVE, "|", "="):
        raise ValueError("%s: dtype %s has no gradsync type (float32, float64, float16, int32, int64, uint8, "
                         "int8, int16, bool in native byte order; bfloat16 only as a torch tensor)" %
                         (what, getattr(obj, "dtype", typestr)))
    count = 1
    for n in face["shape"]:
        count *= n
    if not _contiguous(face["shape"], face.get("strides"), _SIZES[dtype]):
        raise ValueError("%s: the array is not C-contiguous (pass numpy.ascontiguousarray and copy back)"
                         % what)
    ptr, readonly = face["data"] if face.get("data") is not None else (0, False)
    if writable and readonly:
        raise ValueError("%s: the array is read-only, gradsync writes into it" % what)
    return Buffer(obj, ptr or 0, count, dtype)


def buffer(obj, what, writable=False):
    """The Buffer of a numpy array or torch CPU tensor; ValueError (naming `what`) if it is neither,
    not contiguous, of a type gradsync has no counterpart for, or read-only where written."""
    if isinstance(obj, Buffer):
        return obj
    if _is_tensor(obj):
        return _from_tensor(obj, what, writable)
    if hasattr(obj, "__array_interface__"):
        return _from_array(obj, what, writable)
    raise ValueError("%s: a %s; gradsync takes numpy arrays and torch CPU tensors"
                     % (what, type(obj).__name__))


def same_type(a, b, what):
    if a.dtype != b.dtype:
        raise ValueError("%s: the buffers' types differ (%s, %s)" % (what, a.dtype.name, b.dtype.name))


def want_count(buf, count, what):
    if buf.count != count:
        raise ValueError("%s: %d elements, expected %d" % (what, buf.count, count))
