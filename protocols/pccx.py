"""Messages of the pccx v002 machine (tags 500-799).

Tensor payloads (``data``) are numpy arrays in data mode and
:class:`~protocols.codec.TensorDesc` in timing mode; the pccx links are
bandwidth-free (every transfer time is charged as a documented busy span by
the actor that owns the resource, see actors/pccx/), so both modes have the
same virtual timing.
"""
from __future__ import annotations

from protocols.codec import message


@message(tag=500)
class AxiWrite:
    """AXI-Lite write (12-bit address, 64-bit data; reference §2.1)."""
    addr: int
    data: int


@message(tag=501)
class AxiRead:
    """AXI-Lite read request (any address pops the status FIFO, reference §2.1)."""
    addr: int


@message(tag=502)
class AxiReadData:
    data: int


@message(tag=503)
class CmdWord:
    """One entry of the 8-deep command FIFO; ``seq`` numbers instruction pushes (kicks get -1)."""
    word: int
    seq: int


@message(tag=504)
class Uop:
    """A decoded instruction on its way to an engine (``fields`` as protocols.pccx_isa.LAYOUTS)."""
    op: str
    fields: dict
    seq: int


@message(tag=505)
class Status:
    """Engine / front-end -> status block: ``kind`` is ``accept``, ``retire``, ``error`` or ``emax``.

    ``retire`` carries the op, its engine start/end times (ps) and whether it
    raises DONE; ``error`` carries the error class (protocols.pccx_isa.ERR_*).
    """
    kind: str
    op: str
    seq: int
    code: int
    start: int
    end: int
    text: str


@message(tag=506)
class Irq:
    """The error interrupt of the documented machine (seed §5), raised to the host driver."""
    code: int
    seq: int
    text: str


@message(tag=507, version=3)
class DmCmd:
    """A DataMover command (HP or ACP page, reference §2.2): stream ``nbytes`` from DDR ``addr``.

    ``dest`` is the AXI-Stream TDEST the bursts carry: the GEMV lane they are for
    (0 for the GEMM ports), or ``gemv.MULTICAST | lane mask`` for a head-parallel
    GEMV (every lane of the mask takes every burst); a weight switch routes a
    shared FIFO's bursts by it.  ``tag``: the instruction number (push order) of
    the GEMV / GEMM the stream was issued for, -1 if unknown (the DataMover's
    command TAG, reference §2.2, widened by the emulator so that a consumer
    reading another instruction's weights can name it; no RTL unit checks it).
    """
    stream: int
    addr: int
    nbytes: int
    dest: int
    tag: int


@message(tag=508)
class DdrRead:
    req: int
    addr: int
    nbytes: int
    first: bool


@message(tag=509)
class DdrData:
    req: int
    data: object


@message(tag=510)
class DdrWrite:
    req: int
    addr: int
    data: object


@message(tag=511)
class Ack:
    req: int


@message(tag=512, version=3)
class WeightBurst:
    """One burst of a weight stream in a weight FIFO (``beats`` x 128 bit); ``dest`` / ``tag`` = the DataMover
    command's TDEST / TAG (:class:`DmCmd`)."""
    stream: int
    index: int
    beats: int
    data: object
    dest: int
    tag: int


@message(tag=513)
class L2Read:
    """Read ``nelem`` BF16 elements from element address ``elem``; the port is held
    ``cycles_per_word`` cycles per 128-bit word touched (the requester adds its read latency)."""
    req: int
    elem: int
    nelem: int
    cycles_per_word: int


@message(tag=514)
class L2Data:
    req: int
    data: object


@message(tag=515)
class L2Write:
    req: int
    elem: int
    nelem: int
    data: object


@message(tag=516)
class AcpJob:
    """MEMCPY after the dispatcher's transfer-length lookup: ``route`` 0x01 or 0x10 (reference §1.4)."""
    seq: int
    start: int
    route: int
    l2_word: int
    host_addr: int
    words: int


@message(tag=517, version=2)
class EMax:
    """The e_max a GEMV/GEMM with ``findemax`` hands to the CVO unit (as BF16 bits), with the L2 element range
    ``[elem, elem + nelem)`` of the result it was found in (a head-parallel GEMV has one per lane)."""
    bits: int
    elem: int
    nelem: int


@message(tag=518, version=2)
class LaneJob:
    """GEMV front -> lane: compute output rows ``[row0, row0 + rows)`` of GEMV ``seq`` over K inputs.

    ``x`` is the lane's activation (BF16 bits in data mode: the broadcast vector, or the lane's own head in a
    head-parallel GEMV); ``w_scale`` says whether the weight stream ends with ``rows`` BF16 scales;
    ``quota`` = ``[[HP port, bytes], ...]``: what the lane takes from each weight input, in stream order
    (one port for a row-parallel GEMV; the GEMV ports in a head-parallel one, actors/pccx/gemv.py).
    """
    seq: int
    row0: int
    rows: int
    K: int
    w_scale: bool
    x: object
    quota: list


@message(tag=519)
class LaneResult:
    """Lane -> GEMV front: the lane's ``rows`` results (float32 in data mode) and its weight stream id (-1 if none)."""
    seq: int
    lane: int
    stream: int
    y: object


@message(tag=526)
class FifoPiece:
    """GEMV front -> SFU on the direct FIFO link: one piece (a lane's result in a head-parallel GEMV, else the
    whole result) of GEMV ``seq``, ``nelem`` BF16 elements at L2 element ``elem``.

    ``written`` False: a FIFO entry (``data`` = the elements), sent as the piece's L2 write-back starts;
    ``written`` True: a notice that the piece is now in L2 (``data`` None).  ``last``: the GEMV's last piece."""
    seq: int
    elem: int
    nelem: int
    data: object
    written: bool
    last: bool


@message(tag=524)
class FifoClaim:
    """Scheduler -> GEMV front: a CVO was issued that reads GEMV ``seq``'s result (direct GEMV->SFU FIFO)."""
    seq: int


@message(tag=525)
class FifoCredit:
    """SFU -> GEMV front: ``words`` L2 words of the direct FIFO were released (credit return)."""
    words: int
