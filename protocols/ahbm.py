"""Messages of the AHBM machine (tags 200-279; the ``tl`` runtime's are 450-499, protocols/ahbm_tl.py).

Families (tags):

* 200-219  engine commands and completions inside a PE (CPU, scheduler, DMA, GEMM, MATH);
* 220-239  memory: TCM (scratch), HBM pseudo-channel requests, and one PE's HBM stack (``fidelity: pipeline``);
* 240-259  IPCQ (PE<->PE queues with credits) and CUBE NOC packets;
* 260-279  host / IO die: launches and completions.

Tensors that cross a timed link travel inside a :class:`Payload`: a numpy array
in data mode, a :class:`~protocols.codec.TensorDesc` in timing mode.  The two
encodings differ by a few header bytes, so :func:`payload` pads the timing-mode
form to the exact encoded size of the data-mode form: both modes then charge
the same bytes and give the same virtual timing (DESIGN.md §3, issue item 3).
"""
from __future__ import annotations

import functools

import msgpack
import numpy as np

from protocols.codec import TensorDesc, array_ext_len, desc_ext_len, ext_header_len, message

__all__ = [
    "DmaCmd", "DmaGather", "GemmCmd", "MathCmd", "CompositeCmd", "Done", "GemmBatch", "GemmHold", "DmaHold", "HbmHold", "MathBatch", "MathOp",
    "MathRun",
    "TcmReq", "TcmResp", "PcReq", "PcResp", "HbmReq", "HbmResp",
    "IpcqCmd", "IpcqResp", "IpcqData", "IpcqCredit", "NocPacket", "MemReq", "MemResp",
    "Launch", "PeDone", "Payload", "payload", "desc_of",
]


# --------------------------------------------------------------------------- engine commands
@message(tag=200)
class DmaCmd:
    """Move bytes between an HBM and this PE's TCM.

    ``op`` is ``"load"`` (HBM -> TCM buffer ``buf``) or ``"store"`` (TCM -> HBM).
    The HBM side is a 2-D block: ``rows`` rows of ``row_bytes`` bytes, ``pitch``
    bytes apart, from ``addr``.  ``shape``/``dtype`` describe the TCM buffer.
    ``target`` = ``[sip, cube, pe]`` of the HBM's owner; empty = this PE's own HBM.
    A load with ``buf`` empty writes nothing into the TCM (``fidelity: pipeline``: a block of the PE
    scheduler's held GEMM array, which no engine reads; scheduler.PeScheduler._into).
    """

    id: int
    op: str
    addr: int
    rows: int
    row_bytes: int
    pitch: int
    buf: str
    shape: list
    dtype: str
    client: str
    target: list


@message(tag=215)
class DmaGather:
    """One DMA between a contiguous HBM range and several TCM buffers (a scatter-gather descriptor).

    ``parts`` = ``[[buf, shape, dtype], ...]``: the HBM bytes ``[addr, addr + total)`` are the parts'
    bytes back to back in that order (``total`` = the sum of their sizes).  ``"load"`` fills every
    part's buffer from its slice, ``"store"`` writes the buffers' bytes there.  Timed as one
    :class:`DmaCmd` of one ``total``-byte row (one setup, one access per pseudo-channel, dma.py): the
    kernel's spilled Ring state ``[O | m | l]`` is contiguous in HBM, so it moves in one command
    each way instead of three (issue 22).
    """

    id: int
    op: str
    addr: int
    parts: list
    client: str
    target: list


@message(tag=201)
class GemmCmd:
    """``acc = (acc if accumulate else 0) + a @ b`` in fp32; optionally ``out = cast(acc, out_dtype)``."""

    id: int
    a: str
    b: str
    acc: str
    accumulate: bool
    out: str
    out_dtype: str
    m: int
    k: int
    n: int
    client: str


@message(tag=202)
class MathCmd:
    """An element-wise or reduction op on TCM buffers: ``out = op(*srcs, scalar)`` cast to ``out_dtype``."""

    id: int
    op: str
    srcs: list
    out: str
    scalar: float
    out_dtype: str
    client: str


@message(tag=203, version=2)
class CompositeCmd:
    """A GEMM head with epilogue steps, handed to the PE scheduler (seed §0 ``CompositeCmd``).

    ``C[m, n] = epilogue(A[m, k] @ B[k, n])`` with element type ``dtype``.  Each
    operand lives either in this PE's HBM (row-major at ``a_addr`` / ``b_addr`` /
    ``c_addr``, streamed by DMA) or in its TCM (the named buffer ``a_buf`` /
    ``b_buf`` / ``c_buf``, read and written in place by the scheduler without a
    DMA, seed §B.3: composite operands and outputs in the TCM scratch arena); an
    empty buffer name means "in HBM".  ``c_dtype`` is the element type of C
    (empty: ``dtype``).  ``epilogue`` is a list of ``[op, scalar]`` MATH steps
    applied per output tile.
    """

    id: int
    a_addr: int
    b_addr: int
    c_addr: int
    m: int
    k: int
    n: int
    dtype: str
    epilogue: list
    client: str
    a_buf: str = ""
    b_buf: str = ""
    c_buf: str = ""
    c_dtype: str = ""


@message(tag=204)
class Done:
    """Completion of command ``id`` by ``engine`` (busy from ``start`` to ``end`` ps)."""

    id: int
    engine: str
    start: int
    end: int
    info: dict


@message(tag=205)
class GemmBatch:
    """``fidelity: pipeline`` (docs/gqa.md "Fidelity"): all K steps of one TCM-resident composite in one command.

    The PE scheduler hands the GEMM engine the whole tile plan of ``C[m, n] = A[m, k] @ B[k, n]``
    (``tile`` = (TILE_M, TILE_K, TILE_N), tiles.plan) with ``a``/``b`` the TCM buffers of A and B;
    the engine runs the plan's steps back to back with its own cost formulas and the scheduler's
    issue recurrence (actors/ahbm/pipeline.py).  ``epi_ps`` is the epilogue's MATH time per output
    tile (empty: no epilogue), ``sent`` the time the scheduler sent it (its arrival at the engine).
    """

    id: int
    a: str
    b: str
    m: int
    k: int
    n: int
    tile: list
    epi_ps: list
    sent: int
    client: str


@message(tag=209)
class GemmHold:
    """``fidelity: pipeline``, timing mode: the PE scheduler holds the GEMM array for a run of composites that
    read an operand from HBM (scheduler.py ``_block``, pipeline.HeldArray), timing their steps itself.

    Sent twice with the same ``id``: the hold (``release`` false, nothing else), answered by a ``Done`` whose
    ``start`` is when the engine took it (its array free) and ``end`` when its last queued completion leaves;
    then the release, with the run's busy spans ``[[start, end, label], ...]`` (each step's core cycles and
    drain, as the engine would have recorded them), its MACs and core time.  Commands of other clients
    that reach the engine in between are served after the release."""

    id: int
    client: str
    release: bool
    spans: list
    macs: int
    core_ps: int


@message(tag=210)
class DmaHold:
    """``fidelity: stream``, timing mode: the PE scheduler holds its PE's DMA engine (and, through it, the HBM
    stack) for a run of composites that read an operand from HBM, timing their loads and stores itself
    (scheduler.py, pipeline.HeldDma).

    Sent twice with the same ``id``, as :class:`GemmHold`: the hold (``release`` false), answered by a ``Done``
    once the engine has finished the commands before it (``start`` = that time; ``info["pc_free"]`` = when each
    pseudo-channel's last burst ends, from the stack's :class:`HbmHold` answer); then the release with what the
    run did: ``spans`` the engine's setup spans ``[[start, end, label], ...]``, ``loads`` ``[[addr, bytes],
    ...]`` (its per-region load counts), ``moved`` its bytes, and ``stack`` the stack's part (an
    :class:`HbmHold` release's fields: ``[pc_busy, pc_bursts, pc_read, pc_write, free_at, spans]``).
    Commands of other clients that reach the engine in between are served after the release."""

    id: int
    client: str
    release: bool
    spans: list
    loads: list
    moved: int
    stack: list


@message(tag=211)
class HbmHold:
    """``fidelity: stream``: the DMA engine holds its PE's HBM stack for the scheduler (:class:`DmaHold`).

    The hold (``release`` false) is answered with the same message, ``free_at`` = the end of each channel's
    last burst; the release brings the run's per-channel burst time, burst count and bytes read / written,
    the channels' ``free_at`` after it, and one trace span per access (``spans``), as the stack would have
    recorded them.  Requests that reach the stack in between (the HBM port's) are served after the release."""

    id: int
    release: bool
    pc_busy: list
    pc_bursts: list
    pc_read: list
    pc_write: list
    free_at: list
    spans: list


@message(tag=206)
class MathBatch:
    """``fidelity: pipeline``: the epilogue ops of one composite's output tiles, each tile's ops not before its time.

    ``tiles`` = ``[[not_before_ps, elements], ...]`` in tile order; ``ops`` = ``[[op, scalar], ...]`` run
    on each tile back to back (mathunit.py serves them FIFO with the other commands)."""

    id: int
    ops: list
    tiles: list
    client: str


@message(tag=207)
class MathOp:
    """``fidelity: pipeline``, timing mode: a :class:`MathCmd` that carries what the MATH engine would read
    from the TCM's descriptors, ``elements`` (the largest operand) and the result ``shape``, so the engine
    makes no TCM access (the TCM takes no time; in timing mode it holds descriptors only): the tl runtime
    writes the result's descriptor when another engine is to read it (runtime.Tl._tcm)."""

    id: int
    op: str
    srcs: list
    out: str
    scalar: float
    out_dtype: str
    client: str
    elements: int
    shape: list


@message(tag=208)
class MathRun:
    """``fidelity: pipeline``, timing mode: consecutive MATH ops of the PE CPU as one command (the tl runtime
    issues the ops a kernel calls back to back in one message when it next needs a result or another engine:
    runtime.Tl._flush).  Op ``j`` (``[op, elements]``, command id ``id + j``) is the one the CPU would have
    sent ``j * gap`` ps after the first (its dispatch time apart), so it would have arrived that long after
    this message; the MATH engine serves each op at its own arrival, FIFO with its other commands, and
    answers with one ``Done`` (``id``) whose ``info["ops"]`` holds every op's ``[start, end]`` (mathunit.py)."""

    id: int
    ops: list
    gap: int
    client: str


# --------------------------------------------------------------------------- memories
@message(tag=220, version=3)
class TcmReq:
    """One access of ``client`` to its TCM port: the ``writes`` (``[[buf, data], ...]``, data an
    array or TensorDesc) first, then the ``copies`` (block moves inside the TCM), then the
    ``frees`` (buffer names), then the ``reads`` (buffer names).  Answered by one
    :class:`TcmResp` only when it reads: a write, copy or free is posted (the TCM accepts it at
    once; version 2 replaced the one-buffer ``op``/``buf``/``data`` form, which answered every
    access; version 3 added ``copies``).

    A copy ``[src, sr, sc, rows, cols, dst, dr, dc]`` moves the ``[rows, cols]`` block of 2-D
    buffer ``src`` at ``(sr, sc)``: into ``dst`` at ``(dr, dc)`` (cast to ``dst``'s dtype), or,
    with ``dr < 0``, into a new buffer ``dst`` of exactly that block.  (The PE scheduler's
    composite operand and result blocks: before version 3 each was a read answered with the
    whole buffer and a write back, three to five messages for one move the TCM makes itself.)"""

    id: int
    client: str
    writes: list
    copies: list
    frees: list
    reads: list


@message(tag=221, version=2)
class TcmResp:
    """The data of a :class:`TcmReq`'s ``reads``, in their order."""

    id: int
    data: list


@message(tag=222)
class PcReq:
    """A pseudo-channel request: ``nbytes`` charged; ``items`` are ``[addr, length(, bytes)]`` pieces.

    ``client`` names who gets the answer: ``dma`` (the PE's DMA) or ``port`` (its remote HBM port).
    """

    id: int
    op: str
    nbytes: int
    items: list
    client: str


@message(tag=223)
class PcResp:
    id: int
    pc: int
    items: list


@message(tag=224)
class HbmReq:
    """One block access on a PE's HBM stack (memory.HbmStack, ``fidelity: pipeline``, timing mode).

    ``nbytes[pc]`` = the bytes of the block on pseudo-channel ``pc`` (costs.stripe; 0 = not used), the
    same figures the per-channel :class:`PcReq` s of the access would charge.  ``client``: ``dma`` or
    ``port``, who gets the one :class:`HbmResp`.
    """

    id: int
    op: str
    nbytes: list
    client: str


@message(tag=225)
class HbmResp:
    """The answer to :class:`HbmReq` ``id``, sent when the last of its channel bursts ends."""

    id: int


# --------------------------------------------------------------------------- IPCQ and NOC
@message(tag=240)
class IpcqCmd:
    """CPU -> its IPCQ block: ``send`` TCM buffer ``buf`` towards ``dir``, or ``recv`` from ``dir`` into ``buf``."""

    id: int
    op: str
    dir: str
    buf: str


@message(tag=241, version=2)
class IpcqResp:
    """Completion of IPCQ command ``id``.  For a ``recv``, ``desc`` is ``[shape, dtype]`` of the tensor
    the block wrote into the TCM (the receive entry's format field; the CPU checks it against what
    the kernel expected without reading the TCM back); ``[]`` for a ``send`` (version 2 added it)."""

    id: int
    dir: str
    desc: list


@message(tag=242)
class IpcqData:
    """One IPCQ slot's worth of data on the wire between neighbouring PEs."""

    seq: int
    payload: object


@message(tag=243)
class IpcqCredit:
    """Credit return: the receiver freed ``n`` slots."""

    n: int


#: wire note for the ``lag`` field of routed messages (NocPacket, MemReq, MemResp)
LAG_DOC = """``lag`` (ps, a float64 holding an integer so its wire size is a fixed 9 B whatever
    the value; exact below 2**53 ps) is used by cut-through routers only
    (actors/ahbm/noc.py): on a router-to-router hop it is the time from the head's
    arrival (the message's delivery) to its tail's.  Senders leave it at 0.0."""


@message(tag=244, version=2)
class NocPacket:
    """A PE-to-PE message routed over the CUBE NOC (XY) and UCIe.

    ``src``/``dst`` are ``[sip, cube, pe]``; ``hops`` counts routers passed;
    ``lag``: see :data:`LAG_DOC` (version 2 added it).
    """

    id: int
    src: list
    dst: list
    hops: int
    payload: object
    lag: float = 0.0


@message(tag=245, version=2)
class MemReq:
    """A remote HBM access routed over the NOC to the owner PE's HBM port.

    Block as in :class:`DmaCmd`; ``data`` is a Payload (write) or None (read);
    ``lag``: see :data:`LAG_DOC` (version 2 added it).
    """

    id: int
    op: str
    src: list
    dst: list
    hops: int
    addr: int
    rows: int
    row_bytes: int
    pitch: int
    data: object
    lag: float = 0.0


@message(tag=246, version=2)
class MemResp:
    """Answer to a :class:`MemReq`: the bytes read (a Payload of uint8) or None (write ack).

    ``lag``: see :data:`LAG_DOC` (version 2 added it).
    """

    id: int
    src: list
    dst: list
    hops: int
    data: object
    lag: float = 0.0


# --------------------------------------------------------------------------- host / IO die
@message(tag=260)
class Launch:
    """Start a command script on a PE CPU."""

    script: list


@message(tag=261)
class PeDone:
    """A PE CPU finished its script: per-command timings ``[[label, t_start, t_issued, t_done], ...]`` (ps)."""

    pe: str
    t: int
    log: list


# --------------------------------------------------------------------------- payloads
@message(tag=262)
class Payload:
    """A tensor on a timed link: ``t`` is an ndarray (data mode) or TensorDesc (timing mode)."""

    t: object
    pad: bytes


def desc_of(x) -> TensorDesc:
    if isinstance(x, TensorDesc):
        return x
    return TensorDesc.like(np.asarray(x))


def _bin_len(k: int) -> int:
    return (2 if k < 256 else 3 if k < 65536 else 5) + k


def _record_charge(tensor_wire: int, pad: int) -> int:
    """Charged bytes of a Payload nested in another record (ext record: [tag, version, [t, pad]])."""
    inner = 1 + len(msgpack.packb(Payload.TAG)) + len(msgpack.packb(Payload.VERSION)) + 1 + tensor_wire + _bin_len(pad)
    return ext_header_len(inner) + inner


def payload(x) -> Payload:
    """Wrap a tensor so the charged size of its message is the same in data and timing mode.

    Charged size of the data-mode form: ext record around (ndarray ext with the
    raw bytes); of the timing-mode form: ext record around (descriptor ext) +
    nbytes.  The smaller one gets ``pad`` bytes until both are equal (computed
    from the msgpack header rules; checked by tests/test_ahbm_engines.py::test_payload_size_same_in_both_modes).
    """
    d = desc_of(x)
    pd, pt = _pads(tuple(d.shape), d.dtype, d.nbytes)
    return Payload(x, _ZEROS[pt if isinstance(x, TensorDesc) else pd])


@functools.lru_cache(maxsize=4096)
def _pads(shape: tuple, dtype: str, nbytes: int) -> tuple[int, int]:
    """Pad bytes ``(data mode, timing mode)`` of a :func:`payload` of this tensor (a function of its fields only)."""
    d = TensorDesc(shape, dtype, nbytes)
    data_wire, desc_wire = array_ext_len(d), desc_ext_len(d)
    pd = pt = 0
    for _ in range(8):
        cd = _record_charge(data_wire, pd)
        ct = _record_charge(desc_wire, pt) + d.nbytes
        if cd == ct:
            break
        if cd > ct:
            pt += cd - ct
        else:
            pd += ct - cd
    return pd, pt


class _Zeros(dict):
    """``_ZEROS[n]``: ``n`` zero bytes, made once per length."""

    def __missing__(self, n: int) -> bytes:
        z = self[n] = b"\0" * n
        return z


_ZEROS = _Zeros()
