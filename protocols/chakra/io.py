"""Read and write Chakra ET files: a GlobalMetadata message, then Node messages, each length-prefixed.

Why this framing: it is what Chakra's own tools read and write (``protolib.encodeMessage`` /
``decodeMessage``: the serialised size as a varint, then the bytes), so ASTRA-sim's feeder and the
Chakra visualiser / jsonizer take these files as they are.  The varints are protobuf's own
(``google.protobuf.internal`` encoder / decoder), the messages the generated classes of
``et_def.proto``.
"""
from __future__ import annotations

from google.protobuf.internal.decoder import _DecodeVarint32
from google.protobuf.internal.encoder import _VarintBytes
from google.protobuf.message import DecodeError

from protocols.chakra import et_def_pb2 as pb

__all__ = ["pb", "EtFileError", "write_et", "read_et", "attr", "attr_value", "attrs_of"]


class EtFileError(ValueError):
    """A Chakra ET file that cannot be read: names the file and the message index."""


def write_et(path: str, metadata: "pb.GlobalMetadata", nodes) -> int:
    """Write one ET file; returns its size in bytes."""
    size = 0
    with open(path, "wb") as f:
        for msg in (metadata, *nodes):
            body = msg.SerializeToString()
            head = _VarintBytes(len(body))
            f.write(head)
            f.write(body)
            size += len(head) + len(body)
    return size


def read_et(path: str) -> tuple["pb.GlobalMetadata", list]:
    """The metadata and the nodes of one ET file (raises :class:`EtFileError` naming what is wrong)."""
    try:
        with open(path, "rb") as f:
            data = f.read()
    except FileNotFoundError:
        raise EtFileError(f"{path}: no such Chakra ET file") from None
    except IsADirectoryError:
        raise EtFileError(f"{path}: is a directory, not a Chakra ET file") from None
    msgs, pos, i = [], 0, 0
    while pos < len(data):
        try:
            size, pos = _DecodeVarint32(data, pos)
        except (DecodeError, IndexError):
            raise EtFileError(f"{path}: message {i}: bad length prefix at byte {pos}") from None
        if pos + size > len(data):
            raise EtFileError(f"{path}: message {i}: truncated ({size} bytes announced, "
                              f"{len(data) - pos} left)")
        msg = pb.GlobalMetadata() if i == 0 else pb.Node()
        try:
            msg.ParseFromString(data[pos:pos + size])
        except DecodeError as e:
            what = "GlobalMetadata" if i == 0 else "Node"
            raise EtFileError(f"{path}: message {i}: not a Chakra {what} ({e})") from None
        msgs.append(msg)
        pos += size
        i += 1
    if not msgs:
        raise EtFileError(f"{path}: empty file (a Chakra ET file starts with a GlobalMetadata message)")
    return msgs[0], msgs[1:]


def attr(name: str, value, kind: str | None = None) -> "pb.AttributeProto":
    """An AttributeProto: ``kind`` names the value field (``int32_val``...); by default bool -> bool_val,
    int -> int64_val, float -> double_val, str -> string_val, a list of ints -> int64_list."""
    a = pb.AttributeProto(name=name)
    if kind is None:
        if isinstance(value, bool):
            kind = "bool_val"
        elif isinstance(value, int):
            kind = "int64_val"
        elif isinstance(value, float):
            kind = "double_val"
        elif isinstance(value, str):
            kind = "string_val"
        elif isinstance(value, (list, tuple)):
            kind = "int64_list"
        else:
            raise TypeError(f"attribute {name}: no Chakra value kind for {type(value).__name__}")
    if kind.endswith("_list"):
        getattr(a, kind).values.extend(value)
    else:
        setattr(a, kind, value)
    return a


def attr_value(a: "pb.AttributeProto"):
    """An attribute's value (a list for the list kinds; ``None`` for one without a declared value)."""
    which = a.WhichOneof("value")
    if which is None:
        return None
    v = getattr(a, which)
    return list(v.values) if which.endswith("_list") else v


def attrs_of(node) -> dict:
    """``{name: value}`` of a node's (or the metadata's) attributes."""
    return {a.name: attr_value(a) for a in node.attr}
