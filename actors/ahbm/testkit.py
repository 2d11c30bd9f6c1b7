"""The one kit for tests and notebooks on the AHBM machine (virtual time only).

Machines
* :func:`load_profile` reads a shipped profile (scenarios/machines/<name>.yaml,
  ``ahbm-1sip`` by default: a whole SIP) with nested overrides merged in, validated;
* :func:`build` makes a :class:`~emulator.system.System` with that machine and the
  given per-PE scripts; :func:`run_scripts` also preloads TCM buffers, runs it and
  insists it finished; :func:`log` reads a PE's per-command timings after the run;
* :data:`SMALL` / :func:`profile` / :func:`params`: the base profile
  (scenarios/machines/ahbm.yaml) on a small mesh (one SIP of 2 x 1 CUBEs, 16 PEs
  rather than 128), where ``tl`` kernels run; :func:`machine` builds it with the host
  launching a kernel, :func:`build_workload` builds a registered workload on it;
  :func:`hbm_place` / :func:`hbm_fetch` write / read a PE's HBM outside the run.

Scripts several tests share
  :func:`hop_ladder_scripts` (one message 1..6 hops), :func:`back_to_back_scripts`
  (two messages one way, one the other), :func:`remote_load_store` (a DMA load and
  store of another PE's HBM).

Closed forms
  Written out from the profile numbers of ahbm-1sip (reference ahbm §2.6 / §1.2),
  independently of actors/ahbm/noc.py and costs.py, so a test that compares the
  model with them checks both the model and the profile: links are ``(GB/s, ps)``
  pairs (:data:`ATT`, :data:`HBM`, :data:`CUBE`, :data:`SIP`, :data:`HOST`),
  :func:`noc_time` is a path's zero-load time under either switching mode,
  :func:`noc_size` / :func:`ipcq_size` / :func:`read_sizes` / :func:`write_sizes` the
  encoded size of a message.
"""
from __future__ import annotations

import numpy as np

from actors.ahbm.builder import build_machine
from actors.ahbm.params import PROFILE_SCHEMA, Params, pe_name
from actors.ahbm.placement import Placement, hbm_read, hbm_write
from actors.ahbm.tl.launcher import kernel_launches
from emulator.scenario import deep_merge
from emulator.scenario import load_profile as emulator_load_profile
from emulator.schema import Doc, validate
from emulator.system import System
from protocols.ahbm import IpcqData, MemReq, MemResp, NocPacket, payload
from protocols.codec import TensorDesc, encode

__all__ = [
    "load_profile", "build", "run_scripts", "log",
    "SMALL", "profile", "params", "machine", "build_workload", "hbm_place", "hbm_fetch",
    "HOP_TARGETS", "hop_ladder_scripts", "back_to_back_scripts", "remote_load_store",
    "NS", "DISPATCH", "ALPHA", "ATT", "HBM", "CUBE", "SIP", "HOST",
    "ceil_div", "ser", "noc_time", "zero_load", "noc_size", "ipcq_size", "ipcq_time", "read_sizes", "write_sizes",
    "buf",
]


# ------------------------------------------------------------------ machines
def load_profile(name: str = "ahbm-1sip", overrides: dict | None = None) -> dict:
    """The validated AHBM profile ``name`` with ``overrides`` merged in."""
    return emulator_load_profile(name, PROFILE_SCHEMA, overrides)


def build(scripts: dict, profile: dict | None = None, *, mode: str = "timing", seed: int = 0, trace=None,
          fidelity: str = "block"):
    """``(system, machine, placement)`` for ``scripts`` = {(sip, cube, pe): [commands]} (``fidelity``: builder.py)."""
    system = System("ahbm-test", seed=seed, mode=mode, trace=trace)
    machine = build_machine(system, profile or load_profile(), scripts=scripts, fidelity=fidelity)
    return system, machine, Placement(machine, mode == "data")


async def run_scripts(scripts: dict, tcm=(), profile: dict | None = None, *, mode: str = "timing", trace=None,
                      setup=None):
    """Build ``scripts``, put ``tcm`` = [(coord, buffer, array)] in the TCMs, call ``setup(placement)``, run.

    Returns ``(system, machine, result)``; a run that did not finish fails the test with its error.
    """
    system, m, place = build(scripts, profile, mode=mode, trace=trace)
    for coord, name, arr in tcm:
        place.tcm_put(coord, name, arr)
    if setup is not None:
        setup(place)
    res = await system.run_async()
    assert res.status == "finished", (res.error, res.deadlock)
    return system, m, res


def log(machine, coord, label: str):
    """``[label, t_start, t_issued, t_done]`` of the command ``label`` on PE ``coord``."""
    for row in machine.host.logs.get(f"{pe_name(*coord)}/cpu", []):
        if row[0] == label:
            return row
    raise KeyError(f"no command {label!r} in the log of PE {list(coord)}")


#: the small test mesh: one SIP of 2 x 1 CUBEs (the IO die attaches to CUBE 0)
SMALL = {"sips": 1, "cubes": {"x": 2, "y": 1}}


def profile(overrides: dict | None = None) -> dict:
    """The validated base profile (ahbm.yaml) on the :data:`SMALL` mesh, with ``overrides`` merged in."""
    return emulator_load_profile("ahbm", PROFILE_SCHEMA, deep_merge(SMALL, overrides or {}))


def params(overrides: dict | None = None) -> Params:
    """The :class:`Params` of :func:`profile` ``(overrides)``."""
    return Params.of(profile(overrides))


def machine(kernel: str, args_of, *, mode: str = "data", overrides: dict | None = None, pes=None, coords=None,
            seed: int = 0, setup=None, fidelity: str = "block"):
    """A System with the small machine; ``kernel`` launched on PEs ``pes`` of CUBE 0 (indices, default [0])
    or on ``coords`` [(sip, cube, pe)], each with program_id ``[pe, cube, sip]``.

    ``args_of(coord)`` gives a PE's kernel arguments; ``setup(cube0_pes, prm)`` runs before the run (e.g.
    hbm_place); ``fidelity`` as the workload's (builder.build_machine).  Returns ``(system, prm, cube0_pes,
    machine)``.
    """
    prm = params(overrides)
    system = System("tl", seed=seed, mode=mode)
    if coords is None:
        coords = [(0, 0, p) for p in (pes if pes is not None else [0])]
    kernels = kernel_launches(kernel, coords, args_of, lambda c: (c[2], c[1], c[0]), (prm.P, prm.cubes, prm.sips))
    m = build_machine(system, profile(overrides), kernels=kernels, fidelity=fidelity)
    cube0 = [m.pe(0, 0, p) for p in range(prm.P)]
    if setup is not None:
        setup(cube0, prm)
    return system, prm, cube0, m


def build_workload(workload, workload_params: dict, *, name: str, mode: str = "data",
                   overrides: dict | None = None, seed: int = 1):
    """``workload`` built on the small machine: ``(system, profile, params, context)``, not yet run.

    ``workload_params`` are validated against the workload's schema as a scenario's would be.
    """
    prof = profile(overrides)
    p = validate(workload.params, Doc(dict(workload_params), {}, "<test>"))
    system = System(name, seed=seed, mode=mode)
    return system, prof, p, workload.build(system, prof, p)


def hbm_place(pe, prm, addr: int, array: np.ndarray) -> None:
    """Initial HBM contents of machine PE ``pe`` (builder.Pe): ``array`` at ``addr``, striped over its PCs."""
    hbm_write(pe, prm, addr, np.ascontiguousarray(array).tobytes())


def hbm_fetch(pe, prm, addr: int, shape, dtype) -> np.ndarray:
    """Read a tensor back from machine PE ``pe``'s HBM after the run (data mode)."""
    n = int(np.prod(shape)) * np.dtype(dtype).itemsize
    return np.frombuffer(hbm_read(pe, prm, addr, n), dtype=np.dtype(dtype)).reshape(shape)


# ------------------------------------------------------------------ scripts several tests share
#: hops -> a CUBE that far (XY distance) from CUBE (0, 0) on the 4 x 4 mesh
HOP_TARGETS = {1: 1, 2: 2, 3: 3, 4: 7, 5: 11, 6: 15}


def hop_ladder_scripts(pe: int) -> dict:
    """PE ``pe`` of CUBE 0 sends ``q`` over the NOC to PE ``pe`` of each :data:`HOP_TARGETS` CUBE in turn
    (labels ``h1`` .. ``h6``, 3 µs apart so they do not meet); each receiver's ``noc_recv`` is labelled ``r``."""
    s, scripts = [], {}
    for h, cube in HOP_TARGETS.items():
        if h > 1:
            s.append({"op": "sleep", "ps": 3000 * NS})
        s.append({"op": "noc_send", "to": [0, cube, pe], "buf": "q", "label": f"h{h}"})
        scripts[(0, cube, pe)] = [{"op": "noc_recv", "buf": "r", "label": "r"}]
    scripts[(0, 0, pe)] = s
    return scripts


def back_to_back_scripts(a: tuple, b: tuple, a2: tuple, b2: tuple) -> dict:
    """PE ``a`` sends ``q`` to ``b`` twice, back to back (``s1``, ``s2``; received as ``r1``, ``r2``), while
    ``a2`` sends once to ``b2`` (``s``; ``r``): FIFO order on a path, independence of the other direction."""
    return {
        a: [{"op": "noc_send", "to": list(b), "buf": "q", "label": "s1"},
            {"op": "noc_send", "to": list(b), "buf": "q", "label": "s2"}],
        b: [{"op": "noc_recv", "buf": "r", "label": "r1"}, {"op": "noc_recv", "buf": "r", "label": "r2"}],
        a2: [{"op": "noc_send", "to": list(b2), "buf": "q", "label": "s"}],
        b2: [{"op": "noc_recv", "buf": "r", "label": "r"}],
    }


def remote_load_store(me: tuple, owner: tuple, data: np.ndarray, profile: dict | None = None, *,
                      mode: str = "timing", fidelity: str = "block"):
    """PE ``me`` DMA-loads ``data`` (bytes, placed in PE ``owner``'s HBM) over the NOC into ``x`` (label
    ``rload``), then stores ``x`` back to a fresh ``owner`` buffer (``rstore``).

    Returns ``(system, machine, placement, data_addr, store_addr)``, not yet run.
    """
    n = data.nbytes
    script = []
    system, m, place = build({me: script}, profile, mode=mode, fidelity=fidelity)
    addr = place.put(owner, data)
    dst = place.alloc(owner, n)
    script += [{"op": "dma", "kind": "load", "target": list(owner), "addr": addr, "row_bytes": n, "buf": "x",
                "shape": [n], "dtype": "|u1", "label": "rload"},
               {"op": "dma", "kind": "store", "target": list(owner), "addr": dst, "row_bytes": n, "buf": "x",
                "shape": [n], "dtype": "|u1", "label": "rstore"}]
    return system, m, place, addr, dst


# ------------------------------------------------------------------ closed forms (ahbm-1sip numbers)
NS = 1000                     # ps; PE / NOC clock 1 GHz: one cycle
DISPATCH = 8 * NS             # PE CPU dispatch of a primitive, 8 cycles
ALPHA = 3 * NS                # one router, 3 cycles
ATT = (128, 1 * NS)           # PE CPU / DMA <-> router attach (ref §1.2 sram_to_router_bw_gbs)
HBM = (256, 1 * NS)           # HBM port <-> router attach (ref §1.2 hbm_to_router_bw_gbs)
CUBE = (128, 17 * NS)         # CUBE <-> CUBE UCIe: 2 x 8 ns ports + 1 ns
SIP = (64, 20 * NS)           # SIP <-> SIP
HOST = (64, 500 * NS)         # IO die host interface -> CUBE 0's router


def ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def ser(nbytes: int, bw_gbs: int) -> int:
    """Serialisation of ``nbytes`` at ``bw_gbs`` GB/s, rounded up to a picosecond."""
    return ceil_div(nbytes * 10**12, bw_gbs * 10**9)


def noc_time(S: int, links, switching: str = "store_and_forward") -> int:
    """Zero-load time of an ``S``-byte message over ``links`` [(GB/s, latency ps)], one router between two links.

    * store-and-forward: ``sum (S/B_i + L_i) + (n - 1) alpha``;
    * cut-through (ref §4.6 R1, alpha h + S/B_bottleneck): ``sum L_i + (n - 1) alpha + max S/B_i``.
    """
    routers = (len(links) - 1) * ALPHA
    if switching == "cut_through":
        return sum(lat for _, lat in links) + routers + max(ser(S, bw) for bw, _ in links)
    return sum(ser(S, bw) + lat for bw, lat in links) + routers


def zero_load(S: int, cube_hops: int, sip_hops: int = 0) -> int:
    """PE to PE, store-and-forward (R1): 2 attach links, ``cube_hops`` CUBE links and ``sip_hops`` SIP links."""
    return noc_time(S, [ATT] + [CUBE] * cube_hops + [SIP] * sip_hops + [ATT])


def _vector(payload_bytes: int, dtype: str) -> TensorDesc:
    return TensorDesc.of((payload_bytes // np.dtype(dtype).itemsize,), dtype)


def noc_size(payload_bytes: int, dtype: str = "<f2") -> int:
    """Encoded bytes of a NOC packet carrying a vector of ``payload_bytes`` (fp16 unless ``dtype``)."""
    return encode(NocPacket(1 << 16, [0, 0, 0], [0, 0, 0], 0, payload(_vector(payload_bytes, dtype))))[1]


def ipcq_size(payload_bytes: int, dtype: str = "<f2") -> int:
    """Encoded bytes of an IPCQ message carrying a vector of ``payload_bytes`` (fp16 unless ``dtype``)."""
    return encode(IpcqData(1, payload(_vector(payload_bytes, dtype))))[1]


def ipcq_time(S: int) -> int:
    """One IPCQ message of S encoded bytes: S / 85.333 GB/s (rounded up to a ps) + 29.6 ns.

    Reference ahbm §1.2 kernbench2: 31.1 ns at 128 B, +1.5 ns per 128 B.
    """
    return ceil_div(S * 10**12, 85_333_000_000) + 29_600


def read_sizes(me, owner, addr: int, n: int, tag: int = 1) -> tuple[int, int]:
    """Encoded bytes of the request and the response of PE ``me``'s read of ``n`` bytes from ``owner``'s HBM."""
    req = encode(MemReq(tag, "read", list(me), list(owner), 0, addr, 1, n, n, None))[1]
    resp = encode(MemResp(tag, list(owner), list(me), 0, payload(TensorDesc.of((n,), "|u1"))))[1]
    return req, resp


def write_sizes(me, owner, addr: int, n: int, tag: int = 1) -> tuple[int, int]:
    """Encoded bytes of the request and the ack of ``me``'s write of ``n`` bytes into ``owner``'s HBM."""
    req = encode(MemReq(tag, "write", list(me), list(owner), 0, addr, 1, n, n, payload(TensorDesc.of((n,), "|u1"))))[1]
    ack = encode(MemResp(tag, list(owner), list(me), 0, None))[1]
    return req, ack


def buf(nbytes: int) -> np.ndarray:
    """An fp16 vector of ``nbytes`` bytes (0, 1, 2, ...)."""
    return np.arange(nbytes // 2, dtype=np.float16)
