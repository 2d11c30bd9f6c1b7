"""The direct GEMV->SFU FIFO (overlap rule 2, profile ``cvo.gemv_fifo_words``) on hand-written programs:
claimed results enter it, the credits back-pressure the GEMV when the SFU is behind, a result deeper than
the FIFO goes through L2, and the data are the same in every case; in the reverse direction a GEMV
waits for the CVO that writes its activation."""
from __future__ import annotations

import textwrap

import numpy as np
import pytest

from actors import registry
from actors.pccx.numerics import from_bf16
from emulator.scenario import load_scenario

# Three slow untagged REDUCE_SUMs (issued before any GEMV) keep the SFU busy; GEMV a then GEMV b each produce
# 64 BF16 = 8 L2 words, each read by an EXP issued right after it (no DONE poll in between: the scheduler tags
# the EXP with its GEMV). While the SFU is still on the REDUCE_SUMs both results are claimed and waiting.
PASM = """\
data x len=512
weights wa n=64 k=512 scale=1 seed=2
weights wb n=64 k=512 scale=1 seed=3
out ya bytes=128
out yb bytes=128
MEMSET dest_cache=0 dest_addr=0 a_value=512 b_value=1 c_value=1
MEMSET dest_cache=1 dest_addr=1 a_value=64 b_value=512 c_value=1
MEMSET dest_cache=0 dest_addr=2 a_value=64 b_value=1 c_value=1
MEMCPY from_device=1 to_device=0 dest_addr=0 src_addr=0 aux_addr=@x shape_ptr_addr=0 async=0
CVO cvo_func=REDUCE_SUM src_addr=0 dst_addr=4000 length=2048 sub_emax=0 recip_scale=0 accm=0 async=1
CVO cvo_func=REDUCE_SUM src_addr=0 dst_addr=4008 length=2048 sub_emax=0 recip_scale=0 accm=0 async=1
CVO cvo_func=REDUCE_SUM src_addr=0 dst_addr=4016 length=2048 sub_emax=0 recip_scale=0 accm=0 async=1
stream gemv wa
stream gemv wb
GEMV dest_reg=64 src_addr=0 findemax=0 accm=0 w_scale=1 size_ptr_addr=1 shape_ptr_addr=0
CVO cvo_func=EXP src_addr=512 dst_addr=1024 length=64 sub_emax=0 recip_scale=0 accm=0 async=1
GEMV dest_reg=80 src_addr=0 findemax=0 accm=0 w_scale=1 size_ptr_addr=1 shape_ptr_addr=0
CVO cvo_func=EXP src_addr=640 dst_addr=1152 length=64 sub_emax=0 recip_scale=0 accm=0 async=1
wait sfu
MEMCPY from_device=0 to_device=1 dest_addr=0 src_addr=128 aux_addr=@ya shape_ptr_addr=2 async=1
MEMCPY from_device=0 to_device=1 dest_addr=0 src_addr=144 aux_addr=@yb shape_ptr_addr=2 async=0
wait results
"""


@pytest.fixture(scope="module")
def fifo_runs(run_with_context, tmp_path_factory):
    """``{depth: (result, system, outputs)}`` for no FIFO, a FIFO smaller than one result, one result, two."""
    d = tmp_path_factory.mktemp("sfu_fifo")
    (d / "p.pasm").write_text(PASM)
    out = {}
    for words in (0, 4, 8, 16):
        f = d / f"s{words}.yaml"
        f.write_text(textwrap.dedent(f"""\
            name: sfu-fifo
            seed: 3
            mode: data
            machine:
              profile: pccx-v002-documented
              overrides: {{cvo: {{gemv_fifo_words: {words}}}}}
            workload: {{kind: asm, params: {{source: {d / 'p.pasm'}}}}}
            """))
        res, system, outs = run_with_context(load_scenario(str(f), registry, []))
        assert res["status"] == "finished", res.get("error")
        mem = system.actors["pccx/ddr"].mem
        vals = [from_bf16(mem[a:a + n].view(np.uint16)) for a, n in (outs["ya"], outs["yb"])]
        out[words] = (system, vals)
    return out


def _gemv_ends(system) -> list[int]:
    return [r["end"] for r in system.actors["pccx/axil_stat"].records if r["op"] == "GEMV"]


def _cvo_starts(system) -> list[int]:
    return [r["start"] for r in system.actors["pccx/axil_stat"].records if r["op"] == "CVO"]


def test_credits_back_pressure_the_gemv_until_the_sfu_releases_the_older_result(fifo_runs):
    """Depth 8 words holds one result: GEMV b waits for credits until the SFU starts b's EXP (which
    releases a's entry), so it retires after that start; depth 16 holds both and b retires at once."""
    small, big = fifo_runs[8][0], fifo_runs[16][0]
    for s in (small, big):
        assert s.reports["pccx/cvo"]["fifo_hits"] == 2          # both EXPs streamed from the FIFO
    exp_b_start = _cvo_starts(small)[-1]
    assert _gemv_ends(small)[1] >= exp_b_start                  # b held back by the credits
    assert small.reports["pccx/gemv"]["sfu_fifo_stall_ps"] > 0
    assert _gemv_ends(big)[1] < _cvo_starts(big)[-1]            # room for both: no wait
    assert "sfu_fifo_stall_ps" not in big.reports.get("pccx/gemv", {})


def test_a_result_deeper_than_the_fifo_goes_through_l2(fifo_runs):
    """Depth 4 < 8 words of a result: nothing enters the FIFO, the EXPs wait for their GEMV and read L2."""
    s = fifo_runs[4][0]
    assert "fifo_hits" not in s.reports.get("pccx/cvo", {})
    assert "sfu_fifo_stall_ps" not in s.reports.get("pccx/gemv", {})


def test_the_fifo_changes_no_value(fifo_runs):
    """The SFU is slow enough here that without a FIFO both GEMVs retire before their EXPs start (they read
    finished results from L2): every FIFO depth gives the same values as that run."""
    plain, vals0 = fifo_runs[0]
    assert max(_gemv_ends(plain)) < _cvo_starts(plain)[-2]
    for w in (4, 8, 16):
        assert all(np.array_equal(a, b) for a, b in zip(fifo_runs[w][1], vals0))
    assert all(np.all(np.isfinite(v)) and np.all(v > 0) for v in vals0)   # EXP outputs


def test_the_direct_fifo_is_documented_not_built():
    """The pccx docs describe the GEMV->SFU FIFO, the RTL top has none: on in the documented profile only
    (a profile that extends the documented one must set it back to 0 for the as-built machine)."""
    from actors.pccx.profile import load_profile

    assert load_profile("pccx-v002-documented")["cvo"]["gemv_fifo_words"] == 1024
    assert load_profile("pccx-v002-rtl")["cvo"]["gemv_fifo_words"] == 0


REVERSE = """\
data x len=512
weights wa n=64 k=512 scale=1 seed=2
out y bytes=128
MEMSET dest_cache=0 dest_addr=0 a_value=512 b_value=1 c_value=1
MEMSET dest_cache=1 dest_addr=1 a_value=64 b_value=512 c_value=1
MEMSET dest_cache=0 dest_addr=2 a_value=64 b_value=1 c_value=1
MEMCPY from_device=1 to_device=0 dest_addr=0 src_addr=0 aux_addr=@x shape_ptr_addr=0 async=0
CVO cvo_func=REDUCE_SUM src_addr=0 dst_addr=4000 length=2048 sub_emax=0 recip_scale=0 accm=0 async=1
CVO cvo_func=EXP src_addr=0 dst_addr=8192 length=512 sub_emax=0 recip_scale=0 accm=0 async=1
{poll}
stream gemv wa
GEMV dest_reg=2000 src_addr=1024 findemax=0 accm=0 w_scale=1 size_ptr_addr=1 shape_ptr_addr=0
wait gemv
MEMCPY from_device=0 to_device=1 dest_addr=0 src_addr=2000 aux_addr=@y shape_ptr_addr=2 async=0
wait results
"""


def _asm_run(run_with_context, tmp_path, program: str, out: str, words: int, poll: str | None):
    """Run ``program`` (``{poll}`` replaced by ``wait <poll>`` or nothing) in data mode with a FIFO of ``words``;
    (system, the BF16 values of output ``out``)."""
    name = f"{out}{words}{poll}"
    src = tmp_path / f"{name}.pasm"
    src.write_text(program.format(poll=f"wait {poll}" if poll else ""))
    f = tmp_path / f"{name}.yaml"
    f.write_text(f"name: r\nseed: 3\nmode: data\nmachine: {{profile: pccx-v002-documented, overrides: "
                 f"{{cvo: {{gemv_fifo_words: {words}}}}}}}\nworkload: {{kind: asm, params: {{source: {src}}}}}\n")
    res, system, outs = run_with_context(load_scenario(str(f), registry, []))
    assert res["status"] == "finished", res.get("error")
    a, n = outs[out]
    return system, from_bf16(system.actors["pccx/ddr"].mem[a:a + n].view(np.uint16))


def test_reverse_direction_gemv_waits_for_the_cvo_writing_its_activation(run_with_context, tmp_path):
    """A GEMV reading exp(x) that a busy SFU has not produced yet, with no DONE poll in between: with the
    FIFO's scoreboard the GEMV unit waits for that CVO (same values as with a poll); without it the GEMV
    reads the L2 words before the EXP wrote them (other values)."""
    def run(words: int, poll: bool):
        return _asm_run(run_with_context, tmp_path, REVERSE, "y", words, "softmax" if poll else None)

    ref = run(0, True)[1]
    system, on = run(1024, False)
    stale = run(0, False)[1]
    assert np.array_equal(on, ref)
    assert system.reports["pccx/gemv"]["cvo_wait_ps"] > 0
    assert not np.array_equal(stale, ref)


EARLY = """\
data x len=512
weights wa n=512 k=512 scale=1 seed=2
out e bytes=1024
MEMSET dest_cache=0 dest_addr=0 a_value=512 b_value=1 c_value=1
MEMSET dest_cache=1 dest_addr=1 a_value=512 b_value=1 c_value=1
MEMSET dest_cache=0 dest_addr=2 a_value=512 b_value=1 c_value=1
MEMCPY from_device=1 to_device=0 dest_addr=0 src_addr=0 aux_addr=@x shape_ptr_addr=0 async=0
stream gemv wa
GEMV dest_reg=64 src_addr=0 findemax=1 accm=0 w_scale=1 size_ptr_addr=1 shape_ptr_addr=0
{poll}
CVO cvo_func=EXP src_addr=512 dst_addr=1536 length=512 sub_emax=1 recip_scale=0 accm=0 async=1
wait done
MEMCPY from_device=0 to_device=1 dest_addr=0 src_addr=192 aux_addr=@e shape_ptr_addr=2 async=0
wait results
"""


def test_the_sfu_starts_on_the_fifo_while_the_gemv_writes_back(run_with_context, tmp_path):
    """A 512-row GEMV result (64 L2 words) read by an EXP with no poll in between: the entry enters the FIFO as
    the write-back starts, so the EXP starts before the GEMV retires, at most the 64-cycle write-back earlier
    (it reads one word per clock, the write-back writes one), and its values are those of a polled run."""
    def run(words: int, poll: bool):
        return _asm_run(run_with_context, tmp_path, EARLY, "e", words, "gemv" if poll else None)

    system, on = run(1024, False)
    tc = 2500   # 400 MHz
    gemv_end = _gemv_ends(system)[0]
    exp_start = _cvo_starts(system)[0]
    assert system.reports["pccx/cvo"]["fifo_hits"] == 1
    assert gemv_end - 64 * tc <= exp_start < gemv_end
    assert np.array_equal(on, run(0, True)[1])


LATE = """\
data x len=512
weights wa n=64 k=512 scale=1 seed=2
weights wb n=64 k=512 scale=1 seed=3
out ea bytes=128
MEMSET dest_cache=0 dest_addr=0 a_value=512 b_value=1 c_value=1
MEMSET dest_cache=1 dest_addr=1 a_value=64 b_value=512 c_value=1
MEMSET dest_cache=0 dest_addr=2 a_value=64 b_value=1 c_value=1
MEMCPY from_device=1 to_device=0 dest_addr=0 src_addr=0 aux_addr=@x shape_ptr_addr=0 async=0
GEMV dest_reg=64 src_addr=0 findemax=0 accm=0 w_scale=1 size_ptr_addr=1 shape_ptr_addr=0
CVO cvo_func=EXP src_addr=512 dst_addr=1024 length=64 sub_emax=0 recip_scale=0 accm=0 async=1
GEMV dest_reg=80 src_addr=0 findemax=0 accm=0 w_scale=1 size_ptr_addr=1 shape_ptr_addr=0
CVO cvo_func=EXP src_addr=640 dst_addr=1152 length=64 sub_emax=0 recip_scale=0 accm=0 async=1
sleep 5us
stream gemv wa
stream gemv wb
wait sfu
MEMCPY from_device=0 to_device=1 dest_addr=0 src_addr=128 aux_addr=@ea shape_ptr_addr=2 async=0
wait results
"""


# the same computation with the streams first and a DONE poll before the EXPs (no FIFO needed)
LATE_POLLED = "\n".join(LATE.splitlines()[:8] + ["stream gemv wa", "stream gemv wb"]
                         + [ln for ln in LATE.splitlines() if ln.startswith("GEMV")] + ["wait gemv"]
                         + [ln for ln in LATE.splitlines() if ln.startswith("CVO")] + LATE.splitlines()[-3:]) + "\n"


def test_every_pending_claim_keeps_its_fifo_slot(run_with_context, tmp_path):
    """Both GEMVs and both EXPs are issued while GEMV a still waits for its weights, so the claims of a and of b
    are both pending when a's result is ready: the GEMV unit keeps them in order and both results enter the
    FIFO (both EXPs hit), the values those of a program that streams first and polls before the EXPs."""
    system, on = _asm_run(run_with_context, tmp_path, LATE, "ea", 16, None)
    assert system.reports["pccx/cvo"]["fifo_hits"] == 2
    assert system.reports["pccx/gemv"]["sfu_fifo_entries"] == 2
    assert np.array_equal(on, _asm_run(run_with_context, tmp_path, LATE_POLLED, "ea", 0, None)[1])
