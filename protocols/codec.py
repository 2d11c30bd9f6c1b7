"""The wire codec: typed message records, msgpack encoding, ndarray and tensor-descriptor ext types.

Every message that crosses a modelled physical link is a *record*: a slotted
dataclass registered with a stable integer type tag and a version
(:func:`message`).  On the wire a record is the msgpack array
``[tag, version, [field values in declaration order]]`` (schema-based: field
names never travel, see reference/engine-perf.md §7, which measured this at
0.5 µs for a control message against 1.1-1.9 µs for a dict).

Field values may be msgpack primitives, lists, dicts, nested records and:

* ``numpy.ndarray`` -> ext type 1: ``[dtype.str, shape, raw bytes]`` (data mode);
* :class:`TensorDesc` -> ext type 2: ``[shape, dtype, nbytes]`` (timing mode).  A
  descriptor carries no data but the link charges its full ``nbytes`` on top of
  the encoded size, so timing-mode runs see the same bandwidth occupancy as
  data-mode runs (DESIGN.md §3 "Links").  The two ext encodings differ by a few
  header bytes; a record registered with ``descs_as_arrays=True`` is charged,
  for each descriptor among its fields, exactly the bytes of the ndarray ext
  it stands for (:func:`array_ext_len`), so its timing-mode and data-mode forms
  charge the same bytes.  (AHBM records pad instead, see protocols/ahbm.py.)

Decoding is strict: an unknown tag, a version mismatch, a wrong field count or
malformed bytes raise :class:`ProtocolError`, which names the link and the message
when the caller (a link) supplies them.  Decoded arrays are read-only views
(``np.frombuffer``); receivers must not modify them in place.
"""
from __future__ import annotations

import dataclasses
import functools
import operator
import struct
from typing import Any, Callable

import msgpack
import numpy as np

__all__ = [
    "ProtocolError",
    "TensorDesc",
    "message",
    "encode",
    "decode",
    "registered",
    "type_name",
    "handover",
    "receiver_copy",
]

EXT_NDARRAY = 1
EXT_TENSOR_DESC = 2
EXT_RECORD = 3


class ProtocolError(Exception):
    """A message could not be encoded or decoded.

    ``link`` and ``msg`` name where it happened (filled in by the link that
    encodes or decodes); ``reason`` says what was wrong.
    """

    def __init__(self, reason: str, *, link: str | None = None, msg: str | None = None):
        self.reason = reason
        self.link = link
        self.msg = msg
        super().__init__(self._text())

    def _text(self) -> str:
        where = []
        if self.link:
            where.append(f"link {self.link}")
        if self.msg:
            where.append(f"message {self.msg}")
        return f"protocol error{' on ' + ', '.join(where) if where else ''}: {self.reason}"

    def at(self, *, link: str | None = None, msg: str | None = None) -> "ProtocolError":
        """The same error, annotated with the link and message it concerns."""
        return ProtocolError(self.reason, link=link or self.link, msg=msg or self.msg)


@dataclasses.dataclass(frozen=True, slots=True)
class TensorDesc:
    """A tensor without its data: what timing-mode runs move instead of arrays.

    ``nbytes`` is charged in full by the link that carries it.
    """

    shape: tuple
    dtype: str
    nbytes: int

    @classmethod
    def of(cls, shape, dtype) -> "TensorDesc":
        """The descriptor of a ``shape`` tensor of ``dtype``; one shared (frozen) object per pair asked for."""
        shape = tuple(shape)
        try:
            key = (shape, dtype)
            desc = _DESCS_OF.get(key)
        except TypeError:          # an unhashable dtype spec: not remembered
            key = desc = None
        if desc is None:
            dt = np.dtype(dtype)
            dims = tuple(int(s) for s in shape)
            n = 1
            for s in dims:
                n *= s
            desc = cls(dims, dt.str, n * dt.itemsize)
            if key is not None and len(_DESCS_OF) < 4096:
                _DESCS_OF[key] = desc
        return desc

    @classmethod
    def like(cls, array: np.ndarray) -> "TensorDesc":
        return cls(tuple(array.shape), array.dtype.str, int(array.nbytes))


#: (shape, dtype) -> TensorDesc.of(shape, dtype): a run asks for few distinct ones, each many times
_DESCS_OF: dict = {}


def ext_header_len(n: int) -> int:
    """Bytes of the msgpack ext header (type and length) around an ``n``-byte ext body."""
    if n in (1, 2, 4, 8, 16):
        return 2
    if n < 256:
        return 3
    if n < 65536:
        return 4
    return 6


def array_ext_len(d: TensorDesc) -> int:
    """Wire bytes of the ndarray ext of the data-mode tensor ``d`` describes (:func:`_pack_array`)."""
    head = 1 + len(d.dtype.encode()) + 1 + 8 * len(d.shape)
    return ext_header_len(head + d.nbytes) + head + d.nbytes


def desc_ext_len(d: TensorDesc) -> int:
    """Wire bytes of the TensorDesc ext itself (its ``nbytes`` are charged on top)."""
    body = len(msgpack.packb([list(d.shape), d.dtype, d.nbytes], use_bin_type=True))
    return ext_header_len(body) + body


@functools.lru_cache(maxsize=4096)
def _desc_ext(shape: tuple, dtype: str, nbytes: int):
    """The ext of a TensorDesc with these fields; it depends on nothing else, so it is packed once."""
    return msgpack.ExtType(EXT_TENSOR_DESC, msgpack.packb([list(shape), dtype, nbytes], use_bin_type=True))


@functools.lru_cache(maxsize=4096)
def _desc_as_array_extra(shape: tuple, dtype: str, nbytes: int) -> int:
    """Charge added to a ``descs_as_arrays`` record's descriptor (besides its ``nbytes``): the data-mode ext's length minus its own."""
    d = TensorDesc(shape, dtype, nbytes)
    return array_ext_len(d) - desc_ext_len(d) - nbytes


#: field annotations naming an immutable scalar type (:func:`receiver_copy`'s fresh-shell path)
_SCALAR_ANNOTATIONS = frozenset(("int", "float", "str", "bool", "bytes", "None", int, float, str, bool, bytes))


class _RecordInfo:
    __slots__ = ("cls", "tag", "version", "fields", "getter", "name", "descs_as_arrays", "scalar_fields")

    def __init__(self, cls, tag, version, fields, descs_as_arrays=False):
        self.cls = cls
        self.tag = tag
        self.version = version
        self.fields = fields
        self.descs_as_arrays = descs_as_arrays
        self.name = cls.__qualname__
        #: every field is annotated as a scalar (a hint only: :func:`receiver_copy` checks the values)
        self.scalar_fields = all(f.type in _SCALAR_ANNOTATIONS for f in dataclasses.fields(cls))
        if len(fields) == 1:
            one = operator.attrgetter(fields[0])
            self.getter = lambda obj: (one(obj),)
        elif fields:
            self.getter = operator.attrgetter(*fields)
        else:
            self.getter = lambda obj: ()


_BY_TAG: dict[int, _RecordInfo] = {}
_BY_CLASS: dict[type, _RecordInfo] = {}


def message(tag: int, version: int = 1, *, descs_as_arrays: bool = False) -> Callable[[type], type]:
    """Class decorator: make ``cls`` a slotted dataclass and register it as a wire record.

    ``tag`` is the stable type tag (unique across the project; ranges in
    ``protocols/__init__.py``), ``version`` the record layout version.  Adding,
    removing or reordering fields requires a new version.  ``descs_as_arrays``:
    a :class:`TensorDesc` field is charged exactly the wire bytes of the array
    it stands for (module docstring), not its own encoding plus ``nbytes``.
    """

    def wrap(cls: type) -> type:
        if not dataclasses.is_dataclass(cls):
            cls = dataclasses.dataclass(slots=True)(cls)
        if tag in _BY_TAG and _BY_TAG[tag].cls.__qualname__ != cls.__qualname__:
            raise ValueError(f"message tag {tag} already used by {_BY_TAG[tag].name}")
        info = _RecordInfo(cls, tag, version, tuple(f.name for f in dataclasses.fields(cls)), descs_as_arrays)
        _BY_TAG[tag] = info
        _BY_CLASS[cls] = info
        cls.TAG = tag
        cls.VERSION = version
        return cls

    return wrap


def registered() -> dict[int, type]:
    """Tag -> record class, for every record imported so far."""
    return {tag: info.cls for tag, info in sorted(_BY_TAG.items())}


def type_name(obj: Any) -> str:
    info = _BY_CLASS.get(type(obj))
    return info.name if info else type(obj).__name__


class _Encoder:
    """Reusable msgpack packer that also sums descriptor bytes to charge."""

    def __init__(self):
        self.extra = 0
        self.arrays = False   # whether the record encoded last carried an ndarray (:func:`receiver_copy`)
        self._packer = msgpack.Packer(default=self._default, use_bin_type=True, autoreset=True)
        self._nested: list = []   # one packer per depth of records nested in records
        self._depth = 0

    def _default(self, obj):
        t = type(obj)
        if t is TensorDesc:
            self.extra += obj.nbytes
            return _desc_ext(tuple(obj.shape), obj.dtype, obj.nbytes)   # (a tuple already: the same object)
        if t is np.ndarray or isinstance(obj, np.ndarray):
            self.arrays = True
            return _ext_type(msgpack.ExtType, (EXT_NDARRAY, _pack_array(obj)))   # checked: int code, bytes
        if isinstance(obj, TensorDesc):
            self.extra += obj.nbytes
            return _desc_ext(tuple(obj.shape), obj.dtype, obj.nbytes)
        if isinstance(obj, np.generic):
            return obj.item()
        info = _BY_CLASS.get(t)
        if info is not None:
            depth = self._depth
            if depth == len(self._nested):
                self._nested.append(msgpack.Packer(default=self._default, use_bin_type=True, autoreset=True))
            packer = self._nested[depth]
            self._depth = depth + 1
            try:
                body = packer.pack([info.tag, info.version, list(info.getter(obj))])
            except BaseException:
                packer.reset()
                raise
            finally:
                self._depth = depth
            return _ext_type(msgpack.ExtType, (EXT_RECORD, body))
        raise ProtocolError(f"cannot encode a value of type {type(obj).__name__}")

    def encode(self, record) -> tuple[bytes, int]:
        """Encode a record; returns ``(wire bytes, bytes to charge)``.

        The charge is the encoded length plus the full size of every
        :class:`TensorDesc` inside the record.
        """
        info = _BY_CLASS.get(type(record))
        if info is None:
            raise ProtocolError(f"not a registered message record: {type(record).__name__}")
        self.extra = 0
        self.arrays = False
        try:
            values = info.getter(record)
            data = self._packer.pack((info.tag, info.version, values))
            if info.descs_as_arrays:
                for v in values:
                    if type(v) is TensorDesc:
                        self.extra += _desc_as_array_extra(tuple(v.shape), v.dtype, v.nbytes)
        except ProtocolError as e:
            self._packer.reset()
            raise e.at(msg=info.name) from None
        except (TypeError, ValueError, OverflowError) as e:
            self._packer.reset()
            raise ProtocolError(f"cannot encode: {e}", msg=info.name) from None
        return data, len(data) + self.extra


_ENCODER = _Encoder()


#: ``encode(record) -> (wire bytes, bytes to charge)`` (:meth:`_Encoder.encode`; the bound
#: method itself, a call layer fewer on every message)
encode = _ENCODER.encode


#: ``tuple.__new__``: builds a ``msgpack.ExtType`` without its Python-level argument checks
_ext_type = tuple.__new__

#: (dtype, shape) -> the array ext header (:func:`_pack_array`); a run sends few distinct ones
_ARRAY_HEADS: dict = {}


def _pack_array(obj: np.ndarray) -> bytes:
    """ndarray ext payload: ``u8 len(dtype.str) | dtype.str | u8 ndim | ndim x u64 shape | raw bytes``.

    A fixed binary header instead of a nested msgpack document: one copy of the
    data, and decoding is a ``struct`` unpack plus a zero-copy ``np.frombuffer``
    (engine-perf.md §7: generic ext hooks cost 7-10 µs on a 4 KB partial).  The
    header depends only on the dtype and shape, so it is built once per pair.
    """
    arr = obj if obj.flags.c_contiguous else obj.copy(order="C")  # (ascontiguousarray turns 0-d into 1-d)
    key = (arr.dtype, arr.shape)
    head = _ARRAY_HEADS.get(key)
    if head is None:
        dt = arr.dtype
        if dt.hasobject:
            raise ProtocolError(f"object arrays cannot travel ({dt})")
        code = dt.str.encode()
        head = struct.pack(f"<B{len(code)}sB{arr.ndim}Q", len(code), code, arr.ndim, *arr.shape)
        if len(_ARRAY_HEADS) < 4096:
            _ARRAY_HEADS[key] = head
    return b"".join((head, arr.tobytes() if arr.ndim == 0 else memoryview(arr).cast("B") if arr.size else b""))


def _unpack_array(data: bytes) -> np.ndarray:
    try:
        n = data[0]
        dt = np.dtype(data[1:1 + n].decode())
        ndim = data[1 + n]
        off = 2 + n
        shape = struct.unpack_from(f"<{ndim}Q", data, off)
        off += 8 * ndim
    except (IndexError, struct.error, TypeError, ValueError, UnicodeDecodeError) as e:
        raise ProtocolError(f"malformed ndarray header ({e})") from None
    if dt.hasobject:
        raise ProtocolError("object arrays cannot travel")
    count = 1
    for s in shape:
        count *= s
    if len(data) - off != count * dt.itemsize:
        raise ProtocolError(f"ndarray of shape {tuple(shape)} {dt} needs {count * dt.itemsize} bytes, "
                            f"found {len(data) - off}")
    return np.frombuffer(data, dtype=dt, count=count, offset=off).reshape(shape)


#: descriptor ext body -> the TensorDesc it decodes to (frozen, so one object serves every decode)
_DESCS_DECODED: dict = {}


def _ext_hook(code: int, data: bytes):
    if code == EXT_TENSOR_DESC:
        desc = _DESCS_DECODED.get(data)
        if desc is None:
            shape, dtype, nbytes = msgpack.unpackb(data, raw=False)
            desc = TensorDesc(tuple(shape), dtype, int(nbytes))
            if len(_DESCS_DECODED) < 4096:
                _DESCS_DECODED[data] = desc
        return desc
    if code == EXT_NDARRAY:
        return _unpack_array(data)
    if code == EXT_RECORD:
        return _build(msgpack.unpackb(data, raw=False, ext_hook=_ext_hook, strict_map_key=False))
    raise ProtocolError(f"unknown ext type {code}")


def _build(obj):
    if type(obj) is not list or len(obj) != 3 or type(obj[2]) is not list:
        raise ProtocolError("not a record: expected [tag, version, fields]")
    tag, version, values = obj
    info = _BY_TAG.get(tag)
    if info is None:
        raise ProtocolError(f"unknown message tag {tag!r}")
    if version != info.version:
        raise ProtocolError(f"version {version!r} of {info.name} not supported (expected {info.version})", msg=info.name)
    if len(values) != len(info.fields):
        raise ProtocolError(
            f"{info.name} needs {len(info.fields)} fields {list(info.fields)}, found {len(values)}", msg=info.name
        )
    return info.cls(*values)


def peek_name(data: bytes) -> str | None:
    """Best-effort name of the record in ``data`` (for error messages on malformed payloads)."""
    try:
        unpacker = msgpack.Unpacker(raw=False)
        unpacker.feed(data[:16])
        head = unpacker.read_array_header()
        if head != 3:
            return None
        tag = unpacker.unpack()
        info = _BY_TAG.get(tag)
        return info.name if info else f"tag {tag}"
    except Exception:
        return None


def decode(data: bytes):
    """Decode wire bytes into a record, or raise :class:`ProtocolError`."""
    try:
        obj = msgpack.unpackb(data, raw=False, ext_hook=_ext_hook, strict_map_key=False)
    except ProtocolError as e:
        raise e.at(msg=peek_name(data)) from None
    except Exception as e:  # msgpack raises several unrelated types for bad bytes
        raise ProtocolError(f"malformed payload ({type(e).__name__}: {e})", msg=peek_name(data)) from None
    try:
        return _build(obj)
    except ProtocolError:
        raise
    except Exception as e:
        raise ProtocolError(f"cannot build record: {type(e).__name__}: {e}", msg=peek_name(data)) from None


# --------------------------------------------------------------------------- hand-over
_SCALARS = frozenset((int, float, str, bool, type(None), bytes))
_IS_SCALAR = _SCALARS.__contains__
_NUMERIC_KINDS = frozenset("biufc")


class _Undecided(Exception):
    """A value :func:`handover` does not rebuild itself: the receiver decodes the bytes instead."""


def _freeze_array(arr: np.ndarray) -> np.ndarray:
    flags = arr.flags                      # (one flags object: each ``arr.flags`` makes a new one)
    if arr.dtype.kind not in _NUMERIC_KINDS or not flags.c_contiguous:
        raise _Undecided
    base = arr.base
    if base is None:
        if flags.writeable:
            arr.setflags(write=False)      # a write by the sender after the send is an error
        return arr                         # (setflags: half the cost of ``flags.writeable = False``)
    if not flags.writeable and type(base) is bytes:
        return arr                         # a decoded array: its bytes are immutable
    copy = arr.copy()                      # a view of writable memory: the receiver gets its own bytes
    copy.flags.writeable = False
    return copy


def _rebuild(v):
    t = type(v)
    if t in _SCALARS:
        return v
    if t is np.ndarray:
        return _freeze_array(v)
    if t is list or t is tuple:
        for x in v:
            if type(x) not in _SCALARS:
                return [_rebuild(x) for x in v]
        return list(v)                     # scalars only (the common case): one C-level copy
    if t is dict:
        out = {}
        for k, x in v.items():
            if type(k) not in _SCALARS:
                raise _Undecided
            out[k] = _rebuild(x)
        return out
    if t is TensorDesc:
        if type(v.shape) is not tuple or type(v.nbytes) is not int or type(v.dtype) is not str:
            raise _Undecided
        for s in v.shape:
            if type(s) is not int:
                raise _Undecided
        return v                           # frozen, all fields immutable
    info = _BY_CLASS.get(t)
    if info is not None:
        return info.cls(*[_rebuild(x) for x in info.getter(v)]) if info.fields else info.cls()
    if isinstance(v, np.generic) and not isinstance(v, (np.void, np.object_)):
        return _rebuild(v.item())
    raise _Undecided


def receiver_copy(record, data: bytes):
    """What a link hands the receiver of ``record``, whose wire bytes are ``data`` (just encoded): a record
    equal to ``decode(data)``, made the cheapest way, or None (the link then decodes at delivery).

    * the record carried an ndarray (the :func:`encode` that produced ``data`` noted it; a link calls
      this right after that encode): :func:`handover`, which shares the arrays read-only instead of
      copying their bytes (a 4 KiB ``Partial``: 1.9 µs against 6.7 µs to decode);
    * a record class whose fields are all annotated as scalars, and whose values are indeed all
      scalars (int, float, str, bool, None, bytes: immutable): a fresh record shell of the same values
      (a write to the sender's record after the send cannot reach the receiver; a ``Token``: 0.5 µs
      against 1.1 µs to decode);
    * anything else (lists, dicts, descriptors, nested records, arrays :func:`handover` leaves to the
      decoder): ``decode(data)`` itself -- for such
      control messages decoding in C costs less than rebuilding them in Python (issue #13, valgrind
      instruction counts per message: a ``TcmReq`` 11 k to decode against 22 k to rebuild, a ``Done``
      9.4 k against 15.3 k).

    Each case is equal to ``decode(data)`` for any record (tests/test_codec.py, every registered record
    type), so which one is taken decides only the cost; None only when the bytes do not decode (the
    link's task then decodes them and reports the error).
    """
    info = _BY_CLASS.get(type(record))
    if info is None:
        return None
    if _ENCODER.arrays:
        handed = handover(record)
        if handed is not None:
            return handed
    elif info.scalar_fields:
        values = info.getter(record)
        if all(map(_IS_SCALAR, map(type, values))):   # (checked in C: no bytecode per field)
            return info.cls(*values)
    try:
        return decode(data)
    except ProtocolError:
        return None


def handover(record):
    """What the receiver of ``record`` gets, built without decoding its wire bytes, or None.

    The result equals ``decode(encode(record)[0])`` (tests/test_codec.py checks it
    for every registered record type with generated field values): a new record
    whose lists, tuples and dicts are rebuilt as decoding rebuilds them (tuples
    become lists), numpy scalars become Python scalars, and numeric C-contiguous
    arrays are shared **read-only** -- the sender's own array is made read-only
    (a write after the send raises), a view of writable memory is copied.  A
    fresh record shell means a write to the sender's record after the send
    cannot reach the receiver.  Values it does not rebuild itself (structured or
    non-contiguous arrays, odd dict keys, subclasses) return None: the link then
    decodes the bytes, so the receiver sees exactly what the wire carries.
    """
    info = _BY_CLASS.get(type(record))
    if info is None:
        return None
    try:
        values = info.getter(record)
        for v in values:
            if type(v) not in _SCALARS:
                break
        else:
            return info.cls(*values) if info.fields else info.cls()
        return info.cls(*[v if type(v) in _SCALARS else _rebuild(v) for v in values])
    except _Undecided:
        return None
