"""Gemma 3N decode runs on the pccx machine (micro config, timing mode): prefetch rule 1 on/off, chunked
weight streaming bound, KV ring wrap in the driver loop, corrupted instruction words."""
from __future__ import annotations

import textwrap

import numpy as np
import pytest

from actors import registry
from emulator.scenario import load_scenario

POLL_NS, AXIL_NS, TAXI_NS, BURST_BEATS = 20, 40, 4, 16   # the documented profile's figures used below


def _run(run_with_context, tmp_path, params: str = "", overrides: str = "", sets=(), tokens: int = 1, context: int = 3):
    f = tmp_path / "s.yaml"
    f.write_text(textwrap.dedent(f"""\
        name: g
        seed: 1
        mode: timing
        machine:
          profile: pccx-v002-documented
          overrides: {{driver: {{poll_interval: {POLL_NS}ns}}{overrides}}}
        workload:
          kind: gemma3n
          params: {{model: micro, tokens: {tokens}, context: {context}, model_set: {{hidden: 128, ffn: 1024}}{params}}}
        """))
    sc = load_scenario(str(f), registry, list(sets))
    return run_with_context(sc)


@pytest.fixture(scope="module")
def runs(run_with_context, tmp_path_factory):
    on = _run(run_with_context, tmp_path_factory.mktemp("on"))
    off = _run(run_with_context, tmp_path_factory.mktemp("off"), ", prefetch: false")
    return on, off


def test_prefetch_rule1_saves_exactly_the_recorded_overlap(runs):
    """Rule 1 on vs off: the end time drops by the recorded overlapped (hidden) transfer time, plus the
    DONE polls the off switch adds (each extra wait costs 1-2 status reads of 2 x axil.latency and at most
    one poll interval)."""
    (on, _, _), (off, _, _) = runs
    assert on["status"] == off["status"] == "finished"
    assert off["prefetch_overlap_us"] < 0.01          # nothing transfers before its GEMV when prefetch is off
    assert on["prefetch_overlap_us"] > 0.3 * on["weight_transfer_us"]
    delta_us = (off["end_time_ps"] - on["end_time_ps"]) / 1e6
    residual_us = delta_us - on["prefetch_overlap_us"]
    extra_waits = off["polls_per_token"] - on["polls_per_token"]
    assert extra_waits > 0
    assert 0 <= residual_us <= extra_waits * (2 * 2 * AXIL_NS + POLL_NS) / 1000
    # per layer too: every layer hides some transfer
    assert all(v > 0 for k, v in on["prefetch_overlap_per_layer_us"].items() if 0 <= int(k) < 4)


def test_chunked_streaming_within_bound(runs, run_with_context, tmp_path):
    """A chunk of c bursts delays a stream's first MACs by at most (c-1) bursts of HP time and lets at most
    one more chunk wait in the consumer (up to c bursts more buffering): over the program's weight streams
    the end time moves by at most streams x c x burst_beats x Taxi, either way."""
    (on, _, ctx), _ = runs
    c = 4
    chunked, _, _ = _run(run_with_context, tmp_path, overrides=", hp: {chunk_bursts: 4}")
    assert chunked["status"] == "finished"
    streams = ctx.compiler.sid
    bound_ps = streams * c * BURST_BEATS * TAXI_NS * 1000
    assert abs(chunked["end_time_ps"] - on["end_time_ps"]) <= bound_ps
    assert chunked["events"] < on["events"]


def test_chunk_must_divide_the_fifo(run_with_context, tmp_path):
    from emulator.errors import BuildError

    with pytest.raises(BuildError, match="chunk_bursts"):
        _run(run_with_context, tmp_path, overrides=", hp: {chunk_bursts: 3}")


def test_kv_ring_wraps_in_the_token_loop(run_with_context, tmp_path):
    res, _, ctx = _run(run_with_context, tmp_path, tokens=2, context=7)
    assert res["status"] == "finished" and res["tokens"] == 2
    ring = ctx.compiler.ring
    assert res["kv_ring"] == {"max_tokens": 8, "written": 9, "sink": 2, "attended": 8}
    # position 8 overwrote the oldest non-sink entry (position 2, slot 2); the sinks survive
    assert ring.slots[:3] == [0, 1, 8] and sorted(ring.valid()) == [0, 1, 3, 4, 5, 6, 7, 8]


@pytest.mark.parametrize("seq,kind,needle", [(15, "address", "src_addr=131071 >= 114688"),
                                              (49, "reserved_bits", "reserved bits"),
                                              (50, "opcode", "reserved opcode 0xF")])
def test_corrupted_word_raises_the_error_interrupt(run_with_context, tmp_path, seq, kind, needle):
    res, system, _ = _run(run_with_context, tmp_path, params=f", corrupt_enabled: true, corrupt: {{seq: {seq}, kind: {kind}}}")
    assert res["status"] == "error"
    assert needle in res["error"] and "stage" in res["error"] and "layer" in res["error"]
    halted = system.actors["pccx/driver"].halted
    assert halted["seq"] == seq and halted["where"].startswith("token 3 layer")
    assert system.actors["pccx/axil_stat"].error


def test_ple_rule3_overlap_saves_exactly_the_window_time(runs, run_with_context, tmp_path):
    """Rule 3 on (default) vs serialised: layer i's PLE injection rides on layer i+1's AltUp router (its gate
    GEMV runs under the router-norm host step, its host math shares the router's round trips).  The end
    time drops by exactly the sum over layers of the PLE windows' difference (correction end -> next
    prediction end; outside them both programs are identical), every window shrinks, the gate GEMV runs
    under host work in every layer but the last (serialised after the AltUp correction in both)."""
    (on, _, ctx), _ = runs
    serial, _, _ = _run(run_with_context, tmp_path, ", ple_overlap: false")
    assert on["status"] == serial["status"] == "finished"
    nl = ctx.compiler.c["num_layers"]
    assert on["end_time_ps"] < serial["end_time_ps"]
    assert serial["end_time_ps"] - on["end_time_ps"] == serial["ple_window_ps"] - on["ple_window_ps"]
    assert set(on["ple_window_per_layer_us"]) == {str(k) for k in range(nl - 1)}
    assert all(on["ple_window_per_layer_us"][k] < serial["ple_window_per_layer_us"][k]
               for k in on["ple_window_per_layer_us"])
    assert all(on["ple_overlap_per_layer_us"][str(k)] > 0 for k in range(nl - 1))
    assert on["ple_overlap_per_layer_us"][str(nl - 1)] == 0
    assert serial["ple_overlap_us"] == 0
    assert on["instructions_per_token"] < serial["instructions_per_token"]


def test_sfu_fifo_rule2_cvo_takes_gemv_results_without_a_poll(runs, run_with_context, tmp_path):
    """Rule 2 (documented profile: ``cvo.gemv_fifo_words`` 1024; 0 = off): the scheduler tags a CVO reading
    the last GEMV's output, the SFU waits for that result on the direct FIFO, and the V GEMV waits for the
    EXPs writing its operand (reverse direction), so the program drops its DONE polls between the score
    GEMV and the EXP, the softmax and the V GEMV, and the V GEMV and the SCALE: 3 polls fewer per attention
    pass (a KV head's query heads on the lanes: one pass per KV head and layer here), every EXP streams its
    scores and every SCALE its [sum, context] from the FIFO, and the token ends earlier than without it."""
    (on, _, ctx), _ = runs
    plain, system0, _ = _run(run_with_context, tmp_path, overrides=", cvo: {gemv_fifo_words: 0}")
    assert plain["status"] == "finished"
    comp = ctx.compiler
    c = comp.c
    heads = c["num_layers"] * c["num_heads"]
    passes = c["num_layers"] * c["num_kv_heads"] * -(-(c["num_heads"] // c["num_kv_heads"]) // comp.pass_heads)
    assert comp.pass_heads == 2 and passes == 4
    assert on["sfu_fifo_hits"] == {"EXP": heads, "SCALE": heads}
    assert "fifo_hits" not in system0.reports.get("pccx/cvo", {})
    assert plain["polls_per_token"] - on["polls_per_token"] == 3 * passes
    assert on["end_time_ps"] < plain["end_time_ps"]


def test_sfu_fifo_keeps_the_data_exact(run_with_context, tmp_path):
    """Data mode, 2 decode steps: the logits are bit-identical with and without the FIFO (the SFU never
    reads a score or a context vector before the GEMV produced it, though nothing polls in between)."""
    logits = []
    for words in (0, 1024):   # off, the documented profile's depth
        f = tmp_path / f"d{words}.yaml"
        f.write_text(textwrap.dedent(f"""\
            name: d
            seed: 3
            mode: data
            machine:
              profile: pccx-v002-documented
              overrides: {{cvo: {{gemv_fifo_words: {words}, gelu_form: tanh}}}}
            workload:
              kind: gemma3n
              params: {{model: micro, tokens: 2, prompt: [1, 2]}}
            """))
        res, _, ctx = run_with_context(load_scenario(str(f), registry, []))
        assert res["status"] == "finished", res.get("error")
        logits.append(np.stack(ctx.compiler.hm.logits))
    assert np.array_equal(logits[0], logits[1])


def test_sfu_fifo_serves_every_head_of_tiny(run_with_context, tmp_path):
    """tiny (4 query heads per KV head on the lanes), one token: the scheduler claims the scores GEMV and the
    V GEMV of every pass before either retires; the GEMV unit keeps both claims in order, so every EXP and
    every SCALE reads the FIFO (7 layers x 4 heads each)."""
    f = tmp_path / "t.yaml"
    f.write_text("name: t\nseed: 1\nmode: timing\nmachine: {profile: pccx-v002-documented}\n"
                 "workload: {kind: gemma3n, params: {model: tiny, tokens: 1, context: 8}}\n")
    res, _, ctx = run_with_context(load_scenario(str(f), registry, []))
    assert res["status"] == "finished"
    heads = 7 * 4
    assert res["sfu_fifo_hits"] == {"EXP": heads, "SCALE": heads}
    assert res["sfu_fifo_entries"] == 2 * heads        # one piece per head of each scores and V GEMV


def test_report_separates_weight_and_kv_bytes_and_names_the_binding_bound(runs):
    """The HP bytes split into weights and KV; the KV bytes into the read-once figure, scales, the sum row,
    padding and re-reads (none with the heads on the lanes); the bounds use weights + KV read once; the seed's
    budget rows carry what its own numbers imply (two 128-bit HP ports at 250 MHz: 8 GB/s)."""
    (on, _, ctx), _ = runs
    comp, b = ctx.compiler, on["bounds"]
    assert b["hp_bytes_per_token"] == b["weight_bytes_per_token"] + b["kv_bytes_per_token"]
    over = b["kv_overhead_bytes_per_token"]
    assert over["reread"] == 0 and b["kv_bytes_per_token"] == b["kv_read_once_bytes_per_token"] + sum(over.values())
    assert b["bound_bytes_per_token"] == (comp.weight_min + comp.kv_once + comp.kv_scale_once)
    assert b["binding"] == "weight_stream" and b["tok_s_bound"] == b["tok_s_bound_weight_stream"]
    assert on["budget"][0]["bound"] == b["tok_s_bound"] and on["budget"][0]["binding"] == "weight_stream"
    rows = {r["row"]: r for r in on["design_budget"]}
    assert rows["weight stream (GB/s)"]["doc_implies"] == 8.0
    assert rows["KV read at 4 slots (GB/s)"]["doc_implies"] == round(20 * 512 * 0.5 * 2 * 4 / 0.05 / 1e9, 3)
    assert rows["weight buffer holds one GEMV's weights (bytes)"]["doc_implies"] == comp.mats["L0.gate"].nbytes
    assert sum(on["hp_idle_per_stage_us"].values()) > 0 and on["l2_words_used"] == comp.l2.used_words()


def test_rtl_dropped_gemv_is_named_by_the_gemv_that_reads_its_weights(run_with_context, tmp_path):
    """As built (errors: rtl), a GEMV word with a reserved opcode is dropped by the decoder while its weights
    are streamed: the next GEMV's lane finds them and the error names the dropped instruction, which the
    report lists with its place and word."""
    from actors.pccx.gemma3n.compiler import Compiler
    from actors.pccx.gemma3n.config import load_config
    from actors.pccx.profile import load_profile

    comp = Compiler(load_config("micro", {"hidden": 128, "ffn": 1024}), load_profile("pccx-v002-rtl"))
    for _ in range(3):
        comp.ring.append()
    comp.setup()
    comp.token(3)
    seq = comp.stream_seq[5]          # the 6th GEMV of token 3
    res, _, _ = _run(run_with_context, tmp_path, sets=["machine.profile=pccx-v002-rtl"],
                     params=f", corrupt_enabled: true, corrupt: {{seq: {seq}, kind: opcode}}")
    assert res["status"] == "error"
    assert f"which the driver streamed for instruction #{seq}: instruction #{seq} never reached the GEMV unit" \
        in res["error"] and "wrong byte count" not in res["error"]
    d = res["dropped_instructions"]
    assert [x["instruction"] for x in d] == [seq] and "reserved opcode 0xF" in d[0]["text"]
    assert d[0]["where"].startswith("token 3 layer")


def test_a_kv_stream_of_many_datamover_commands_does_not_stall_the_driver(run_with_context, tmp_path):
    """FP16 K rows of 128 elements are 16 slices: 16 DataMover commands per K stream, each larger than a 1 KB
    weight FIFO.  The driver may queue only dm_cmd_depth + 1 of them before the GEMV's push (it would block on
    a full command FIFO while the port waits for a GEMV not yet pushed: a deadlock); the rest follow the push,
    and the token finishes, on both profiles."""
    for prof in ("pccx-v002-documented", "pccx-v002-rtl"):
        res, _, _ = _run(run_with_context, tmp_path, overrides=", hp: {fifo_words: 64}", context=60,
                         sets=[f"machine.profile={prof}", "workload.params.model_set.head_dim=128",
                               "workload.params.model_set.kv={dtype: fp16, max_tokens: 64}"])
        assert res["status"] == "finished", (prof, res["status"], res.get("error"))
