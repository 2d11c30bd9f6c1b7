"""The AHBM ``microbench`` workload: engine and interconnect times measured vs closed form.

``microbench`` launches, in one run on SIP 0, a set of independent measurements
on separate PEs (so they do not share engines), and the check prints each
measured time next to its closed form, computed here from the profile with the
formulas written out (the same formulas the engines' docstrings cite):

* ``dma_load``/``dma_store`` N bytes, own HBM, 2 KiB-aligned:
  ``setup + access_latency + ceil((N / pcs) / (pc_bw x eff))``;
* ``gemm`` m x k x n on the array: ``fill_drain + ceil(m/R) ceil(n/C) k`` cycles;
* ``math`` op on E elements: ``fixed + ceil(E / lanes) (+ log2 lanes)`` cycles;
* ``composite`` GEMM: the double-buffered tile recurrence (closed_forms.composite_model);
* ``dma_load remote`` N bytes from another CUBE's PE over h hops:
  ``setup + Z(S_req, h) + latency + ceil((N/pcs) / bw_eff) + Z(S_resp, h)``, Z = NOC zero-load below
  with the DMA attach link (``noc.attach_bandwidth``) at the requester's end and the HBM port's
  attach link (``noc.hbm_attach_bandwidth``, ref §1.2 hbm_to_router_bw_gbs 256) at the owner's end;
* ``host load`` N bytes into a PE's HBM over the host interface and NOC (host.py):
  request path + ``latency + ceil((N/pcs) / bw_eff)`` + acknowledgement path, the PE end of
  both paths being the HBM port's attach link;
* ``ipcq`` S bytes to a neighbour: ``S / B_ipcq + overhead`` (ipcq.py; profile ``ipcq.bandwidth``
  85.33 GB/s and ``ipcq.fixed_overhead`` 29.6 ns, fitted to kernbench2's 31.1 ns at 128 B,
  +1.5 ns per 128 B, ref §1.2);
* ``noc`` over h CUBE hops: ``2 (S/B_att + L_att) + (h+1) alpha + h (S/B_cube + L_cube)``
  (store-and-forward) or ``2 L_att + (h+1) alpha + h L_cube + S / B_bottleneck``
  (``noc.switching: cut_through``; closed_forms.path_model, noc.py docstring);
* ``ucie`` one SIP crossing (when the profile has 2+ SIPs): same with the SIP link.

With ``noc.switching: cut_through`` (scenarios/ahbm/microbench-cut-through.yaml)
every routed row (remote DMA, host load, NOC, UCIe) is labelled ``[cut-through]``
and uses the cut-through closed form.

Measured = the host's acknowledgement time for the host load; otherwise the PE CPU log: ``t_done - t_issued`` of the command (messages: the
receiver's ``t_done`` minus the sender's ``t_issued``).  NOC flows are spaced
in time so each runs at zero load.

Data mode adds a table of engine results against numpy (composite C, GEMM,
MATH, DMA store) and ``max_abs_err``.
"""
from __future__ import annotations

import numpy as np

from emulator import numerics
from emulator.errors import BuildError
from emulator.schema import Int, List, Map, Quantity

from actors.ahbm.builder import build_machine
from actors.ahbm.closed_forms import (BF16, composite_model, dma_model, gemm_model, host_load_model, ipcq_model,
                                      math_model, noc_model, remote_dma_model)
from actors.ahbm.params import Params, pe_name
from actors.ahbm.placement import Placement
from actors.ahbm.pipeline import FIDELITY

__all__ = ["MICRO_PARAMS", "build_microbench", "measure", "check_microbench"]

MICRO_PARAMS = Map({
    "dma_sizes": List(Quantity("size"), default=["4KiB", "64KiB", "256KiB"], doc="DMA load sizes (own HBM)"),
    "gemm": List(Int(min=1), min_len=3, max_len=3, default=[32, 64, 32], doc="m, k, n of a direct GEMM command"),
    "math_elements": Int(min=1, default=4096, doc="elements of the MATH exp / rowmax benchmark"),
    "composite": List(Int(min=1), min_len=3, max_len=3, default=[64, 256, 64], doc="M, K, N of the composite GEMM"),
    "ipcq_bytes": List(Quantity("size"), default=["128B", "4KiB"], doc="IPCQ payload sizes"),
    "noc_bytes": Quantity("size", default="4KiB", doc="NOC payload size"),
    "noc_gap": Quantity("time", default="5us", doc="spacing of the NOC flows (zero load)"),
    "remote_bytes": Quantity("size", default="4KiB", doc="remote DMA load from the farthest CUBE of SIP 0"),
    "host_load_bytes": Quantity("size", default="64KiB", doc="timed host load into CUBE 10 (before the launches)"),
    "fidelity": FIDELITY,
})



def _arr(shape, rng) -> np.ndarray:
    return rng.standard_normal(shape).astype(np.float32).astype(np.float16)


def _elems_payload(nbytes: int) -> np.ndarray:
    return np.zeros((max(nbytes // 2, 1),), np.float16)


class _Benches:
    """The measurement scripts being written: per PE its script, the expectations (with their closed forms)
    and the tensors placed before the run ((where, coord, name, array); HBM addresses are patched in after
    building).  One method per group of benches, in the order they draw their inputs from ``rng``."""

    def __init__(self, prm, p: dict, rng):
        self.prm, self.p, self.rng = prm, p, rng
        self.ct = " [cut-through]" if prm.cut_through else ""
        self.scripts: dict[tuple, list] = {}
        self.expect: list[dict] = []
        self.pre: list = []

    def dma(self) -> None:
        """DMA loads and a store on PE (0,0,0)."""
        p, prm, rng, pre, expect = self.p, self.prm, self.rng, self.pre, self.expect
        pe = (0, 0, 0)
        s = []
        for i, n in enumerate(p["dma_sizes"]):
            s.append({"op": "dma", "kind": "load", "addr": None, "tensor": f"t{i}", "rows": 1, "row_bytes": n,
                      "buf": f"x{i}", "shape": [n // 2], "dtype": BF16, "label": f"dma_load {n}B"})
            pre.append(("hbm", pe, f"t{i}", _arr((n // 2,), rng)))
            expect.append({"bench": f"dma_load {n} B", "kind": "cmd", "pe": pe, "label": f"dma_load {n}B",
                           "model": dma_model(n, prm)})
            s.append({"op": "free", "buf": f"x{i}"})
        n = p["dma_sizes"][0]
        pre.append(("hbm", pe, "st", np.zeros((n // 2,), np.float16)))
        pre.append(("tcm", pe, "st_src", _arr((n // 2,), rng)))
        s.append({"op": "dma", "kind": "store", "addr": None, "tensor": "st", "rows": 1, "row_bytes": n,
                  "buf": "st_src", "shape": [n // 2], "dtype": BF16, "label": f"dma_store {n}B"})
        expect.append({"bench": f"dma_store {n} B", "kind": "cmd", "pe": pe, "label": f"dma_store {n}B",
                       "model": dma_model(n, prm)})
        self.scripts[pe] = s

    def engines(self) -> None:
        """GEMM and MATH on PE (0,0,1)."""
        p, prm, rng = self.p, self.prm, self.rng
        pe = (0, 0, 1)
        gm, gk, gn = p["gemm"]
        E = p["math_elements"]
        rows = max(E // 128, 1)
        self.pre += [("tcm", pe, "ga", _arr((gm, gk), rng)), ("tcm", pe, "gb", _arr((gk, gn), rng)),
                     ("tcm", pe, "mx", _arr((rows, E // rows), rng))]
        self.scripts[pe] = [
            {"op": "gemm", "a": "ga", "b": "gb", "acc": "gacc", "m": gm, "k": gk, "n": gn, "label": "gemm"},
            {"op": "math", "fn": "exp", "srcs": ["mx"], "out": "my", "label": "math_exp"},
            {"op": "math", "fn": "rowmax", "srcs": ["mx"], "out": "mz", "label": "math_rowmax"},
        ]
        self.expect += [
            {"bench": f"gemm {gm}x{gk}x{gn}", "kind": "cmd", "pe": pe, "label": "gemm",
             "model": gemm_model(gm, gk, gn, prm)},
            {"bench": f"math exp {rows * (E // rows)}", "kind": "cmd", "pe": pe, "label": "math_exp",
             "model": math_model(rows * (E // rows), False, prm)},
            {"bench": f"math rowmax {rows}x{E // rows}", "kind": "cmd", "pe": pe, "label": "math_rowmax",
             "model": math_model(rows * (E // rows), True, prm)},
        ]

    def composite(self) -> None:
        """A composite GEMM on PE (0,0,2) (its model needs the addresses: patched in after building)."""
        rng = self.rng
        pe = (0, 0, 2)
        M, K, N = self.p["composite"]
        self.pre += [("hbm", pe, "A", _arr((M, K), rng)), ("hbm", pe, "B", _arr((K, N), rng)),
                     ("hbm", pe, "C", np.zeros((M, N), np.float16))]
        self.scripts[pe] = [{"op": "composite", "a_addr": None, "b_addr": None, "c_addr": None,
                             "tensors": ["A", "B", "C"], "m": M, "k": K, "n": N, "dtype": BF16,
                             "epilogue": [["scale", 0.125]], "label": "composite"}]
        self.expect.append({"bench": f"composite {M}x{K}x{N} (+scale)", "kind": "composite", "pe": pe,
                            "label": "composite", "M": M, "K": K, "N": N})

    def ipcq(self) -> None:
        """IPCQ on CUBE 1: PE 2j -> PE 2j+1 (east), one pair per size."""
        for j, nb in enumerate(self.p["ipcq_bytes"]):
            src, dst = (0, 1, 2 * j), (0, 1, 2 * j + 1)
            self.pre.append(("tcm", src, "q", _elems_payload(nb)))
            self.scripts[src] = [{"op": "send", "dir": "E", "buf": "q", "label": "send"}]
            self.scripts[dst] = [{"op": "recv", "dir": "W", "buf": "q", "label": "recv"}]
            self.expect.append({"bench": f"ipcq E {nb} B", "kind": "msg", "src": src, "dst": dst, "slabel": "send",
                                "rlabel": "recv", "model": ipcq_model(nb, self.prm)})

    def noc(self) -> list:
        """NOC: cube 0 (0,0) -> 1..6 hops (XY), spaced in time; across UCIe to SIP 1 when there is one.
        Returns the CUBEs reached (the remote DMA waits until these flows are done)."""
        p, prm, ct = self.p, self.prm, self.ct
        nb = p["noc_bytes"]
        targets = [c for c in (1, 2, 3, 7, 11, 15) if c < prm.cubes]
        src = (0, 0, 4)
        self.pre.append(("tcm", src, "q", _elems_payload(nb)))
        s = []
        for h, cube in enumerate(targets, start=1):
            x, y = prm.cube_xy(cube)
            hops = x + y
            if h > 1:
                s.append({"op": "sleep", "ps": p["noc_gap"]})
            s.append({"op": "noc_send", "to": [0, cube, 4], "buf": "q", "label": f"noc{cube}"})
            self.scripts[(0, cube, 4)] = [{"op": "noc_recv", "buf": "r", "label": "recv"}]
            self.expect.append({"bench": f"noc {hops} hop{'s' * (hops > 1)} {nb} B{ct}", "kind": "msg", "src": src,
                                "dst": (0, cube, 4), "slabel": f"noc{cube}", "rlabel": "recv",
                                "model": noc_model(nb, hops, prm)})
        if prm.sips > 1:
            edge = prm.cx - 1
            s.append({"op": "sleep", "ps": p["noc_gap"]})
            s.append({"op": "noc_send", "to": [1, 0, 5], "buf": "q", "label": "ucie"})
            self.scripts[(1, 0, 5)] = [{"op": "noc_recv", "buf": "r", "label": "recv"}]
            hops = edge + 1
            self.expect.append({"bench": f"ucie sip0->sip1 {hops} hops {nb} B{ct}", "kind": "msg", "src": src,
                                "dst": (1, 0, 5), "slabel": "ucie", "rlabel": "recv",
                                "model": noc_model(nb, hops, prm, sip_hops=1)})
        self.scripts[src] = s
        return targets

    def remote_dma(self, after_flows: int) -> None:
        """CUBE (0,0) PE 6 loads from CUBE (cx-1, cy-1) PE 6 (the SIP's worst case), after the NOC flows."""
        p, prm = self.p, self.prm
        rn = p["remote_bytes"]
        me, owner = (0, 0, 6), (0, prm.cubes - 1, 6)
        rh = (prm.cx - 1) + (prm.cy - 1)
        self.pre.append(("hbm", owner, "remote", _arr((rn // 2,), self.rng)))
        self.scripts[me] = [{"op": "sleep", "ps": (after_flows + 3) * p["noc_gap"]},
                            {"op": "dma", "kind": "load", "target": list(owner), "addr": None,
                             "tensor": ("remote", owner), "rows": 1, "row_bytes": rn, "buf": "rx",
                             "shape": [rn // 2], "dtype": BF16, "label": "remote"}]
        self.expect.append({"bench": f"dma_load remote {rh} hops {rn} B{self.ct}", "kind": "cmd", "pe": me,
                            "label": "remote", "remote": (me, owner, rh, rn)})

    def host_load(self) -> None:
        """A timed host load (the host loads, then launches every script)."""
        prm = self.prm
        hn = self.p["host_load_bytes"]
        hcube = min(10, prm.cubes - 1)
        hdst = (0, hcube, 7)
        hh = (abs(prm.global_x(0, hcube) - prm.global_x(*prm.io_attach))
              + abs(hcube // prm.cx - prm.io_attach[1] // prm.cx))
        self.pre.append(("load", hdst, "hostload", _arr((hn // 2,), self.rng)))
        self.expect.append({"bench": f"host load {hn} B -> cube {hcube} ({hh} hops){self.ct}", "kind": "host",
                            "hops": hh, "dst": hdst, "nbytes": hn})

    def place(self, place: Placement) -> dict:
        """Place the tensors, patch their addresses into the scripts and complete the address-dependent models."""
        prm, expect = self.prm, self.expect
        addrs: dict = {}
        for where, coord, name, arr in self.pre:
            if where == "hbm":
                addrs[(coord, name)] = place.put(coord, arr)
            elif where == "load":
                addrs[(coord, name)] = place.load(coord, arr)
            else:
                place.tcm_put(coord, name, arr)
        for coord, script in self.scripts.items():
            for c in script:
                if "tensor" in c:
                    t = c.pop("tensor")
                    c["addr"] = addrs[(t[1], t[0])] if isinstance(t, tuple) else addrs[(coord, t)]
                    c["pitch"] = c["row_bytes"]
                if "tensors" in c:
                    c["a_addr"], c["b_addr"], c["c_addr"] = (addrs[(coord, t)] for t in c.pop("tensors"))
                    e = next(x for x in expect if x.get("label") == "composite")
                    e["model"] = composite_model(c["m"], c["k"], c["n"], 2, c["epilogue"], prm, c["a_addr"],
                                                 c["b_addr"], c["c_addr"])
                    e["addrs"] = (c["a_addr"], c["b_addr"], c["c_addr"])
        for e in expect:
            if e["kind"] == "host":
                e["model"] = host_load_model(e["nbytes"], e["hops"], addrs[(e["dst"], "hostload")], e["dst"], prm)
            if "remote" in e:
                src_pe, own, hops, nbytes = e["remote"]
                e["model"] = remote_dma_model(nbytes, hops, addrs[(own, "remote")], src_pe, own, prm)
        return addrs


def build_microbench(system, profile: dict, p: dict) -> dict:
    """Build the machine with the measurement scripts; the context (machine, expectations with their
    closed forms, placement, pre-placed arrays and their addresses) goes to :func:`check_microbench`."""
    prm = Params.of(profile)
    if prm.cx < 4 or prm.cy < 4 or prm.P < 8 or prm.gx < 2:
        raise BuildError(f"microbench needs a CUBE mesh of at least 4x4 and >= 8 PEs per CUBE (PE grid x >= 2);"
                         f" found {prm.cx}x{prm.cy} CUBEs, {prm.P} PEs, PE grid {prm.gx}x{prm.gy}")
    b = _Benches(prm, p, system.rng("microbench/data"))
    b.dma()
    b.engines()
    b.composite()
    b.ipcq()
    flows = b.noc()
    b.remote_dma(len(flows))
    b.host_load()
    machine = build_machine(system, profile, scripts=b.scripts, fidelity=p["fidelity"])
    place = Placement(machine, system.mode == "data")
    addrs = b.place(place)
    return {"machine": machine, "expect": b.expect, "placement": place, "pre": b.pre, "addrs": addrs}


def _log(host, coord, label):
    log = host.logs.get(f"{pe_name(*coord)}/cpu")
    if log is None:
        return None
    for row in log:
        if row[0] == label:
            return row
    return None


def measure(info: dict) -> list[dict]:
    """Rows ``bench, measured_ns, model_ns, err_%`` from a finished microbench run (``info``: its build's context)."""
    host = info["machine"].host
    rows = []
    for e in info["expect"]:
        if e["kind"] == "host":
            measured = host.load_done[0] if host.load_done else None
        elif e["kind"] in ("cmd", "composite"):
            r = _log(host, e["pe"], e["label"])
            measured = None if r is None else r[3] - r[2]
        else:
            s, r = _log(host, e["src"], e["slabel"]), _log(host, e["dst"], e["rlabel"])
            measured = None if (s is None or r is None) else r[3] - s[2]
        model = e["model"]
        rows.append({"bench": e["bench"], "measured_ns": None if measured is None else measured / 1000,
                     "model_ns": model / 1000,
                     "err_%": None if measured is None else round(100.0 * (measured - model) / model, 3)})
    return rows


def check_microbench(system, profile: dict, p: dict, result, *, context: dict) -> dict:
    """The measured-vs-closed-form table (and in data mode the results vs numpy)."""
    if result.status != "finished":
        return {}
    rows = measure(context)
    out = {"tables": {"AHBM microbenchmarks: measured vs closed form": rows},
           "max_abs_err_pct": max(abs(r["err_%"]) for r in rows if r["err_%"] is not None)}
    if system.mode == "data":
        extra = _data_checks(context, p)
        out["max_abs_err"] = extra["max_abs_err"]
        out["tables"].update(extra["tables"])
    return out


def _data_checks(info: dict, p) -> dict:
    """Data mode: engine results against numpy (fp32 accumulate of bf16-as-f16 inputs, ref §3.3)."""
    m, place, pre = info["machine"], info["placement"], info["pre"]
    arrays = {(c, n): a for _, c, n, a in pre}
    rows = []

    def row(what: str, got, ref) -> float:
        got, ref = np.asarray(got, np.float64), np.asarray(ref, np.float64)
        err = float(np.max(np.abs(got - ref))) if got.size else 0.0
        rows.append({"result": what, "shape": "x".join(map(str, ref.shape)), "max_abs_err": err,
                     "max_rel_err": float(np.max(np.abs(got - ref) / np.maximum(np.abs(ref), 1e-6)))})
        return err

    pe = (0, 0, 2)
    M, K, N = p["composite"]
    A, B = arrays[(pe, "A")], arrays[(pe, "B")]
    acc = None
    for k0 in range(0, K, m.prm.tile[1]):   # the engine accumulates K tiles in fp32, in order
        acc = numerics.matmul(A[:, k0:k0 + m.prm.tile[1]], B[k0:k0 + m.prm.tile[1]], acc=np.float32, init=acc)
    ref = (acc * np.float32(0.125)).astype(np.float16)
    got = np.frombuffer(place.read(pe, info["addrs"][(pe, "C")], M * N * 2), np.float16).reshape(M, N)
    worst = row("composite C = 0.125 * A @ B", got, ref)
    pe = (0, 0, 1)
    tcm = m.pe(*pe).tcm.bufs
    a, b, x = arrays[(pe, "ga")], arrays[(pe, "gb")], arrays[(pe, "mx")].astype(np.float32)
    worst = max(worst, row("gemm acc = a @ b (fp32)", tcm["gacc"], numerics.matmul(a, b, acc=np.float32)))
    worst = max(worst, row("math exp", tcm["my"], numerics.exp(x).astype(np.float32)))
    worst = max(worst, row("math rowmax", tcm["mz"], x.max(axis=-1, keepdims=True)))
    pe = (0, 0, 0)
    for i, n in enumerate(p["dma_sizes"]):
        got = place.read(pe, info["addrs"][(pe, f"t{i}")], n)
        worst = max(worst, row(f"hbm t{i} intact", np.frombuffer(got, np.float16), arrays[(pe, f"t{i}")]))
    st = np.frombuffer(place.read(pe, info["addrs"][(pe, "st")], p["dma_sizes"][0]), np.float16)
    worst = max(worst, row("dma_store landed", st, arrays[(pe, "st_src")]))
    return {"max_abs_err": worst, "tables": {"data mode: results vs numpy": rows}}
