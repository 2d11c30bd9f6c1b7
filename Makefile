# The two commands of the README: `make run` and `make test`.
# Both create .venv on first use and install the project with what it needs.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: run test test-all test-slow bench bench-machine bench-instructions bench-ab clean fuzz-campaign gqa-llama gqa-llama-long gqa-llama-128k gqa-ring-sweep sweep-demo sweep-ray-cluster llama70b llama70b-multi milestone milestone-doc gemma3n-e4b

$(STAMP): pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[test,bench,ray]'
	touch $(STAMP)

run: $(STAMP)
	$(BIN)/emu run scenarios/demo/reduce.yaml

# The tests on every core (pytest-xdist): `make test` is the fast tier (each feature at validation scale, a few
# minutes on 2 cores); `make test-all` adds the slow tier (tests marked slow: larger scales, further
# parametrisations); `make test-slow` runs the slow tier alone (CI runs it after `make test`). docs/testing.md.
TEST_JOBS ?= auto
test: $(STAMP)
	$(BIN)/python -m pytest -n $(TEST_JOBS)

test-all: $(STAMP)
	$(BIN)/python -m pytest -n $(TEST_JOBS) --slow

test-slow: $(STAMP)
	$(BIN)/python -m pytest -n $(TEST_JOBS) --slow -m slow

bench: $(STAMP)
	$(BIN)/emu bench engine

bench-machine: $(STAMP)
	$(BIN)/emu bench machine --full

# The engine benchmark in instructions per message (valgrind's cachegrind): unmoved by a noisy machine.
bench-instructions: $(STAMP)
	$(BIN)/python -m tools.bench.instructions

# CPU of the 128-rank decode under BASE (a git revision) and this tree, side by side (one per core,
# same machine phase): tools/bench/ab.py. The default base is issue 13's code, whose run took
# 106-112 s of CPU when the issue was filed: the last line scales that figure by the ratio.
BASE ?= 308d103
bench-ab: $(STAMP)
	$(BIN)/python -m tools.bench.ab --base $(BASE) --runs 3 --base-cpu 109

# Robustness campaign (issue 15): >= 1,000 mutated scenario files over every shipped
# scenario, then >= 1,000 random fault plans over the demo, AHBM and pccx families.
# Outputs under runs/fuzz and runs/campaign/*; exits non-zero on any traceback or hang.
fuzz-campaign: $(STAMP)
	$(BIN)/python -m tools.robust.fuzz --mutants 1000 --seed 1 --skip "microbench|16ranks|32ranks|_long|4sip|2sip" --workdir runs/fuzz
	$(BIN)/emu faults campaign scenarios/demo/reduce.yaml --plans 500 --seed 1 --no-minimise --out runs/campaign/reduce
	$(BIN)/emu faults campaign scenarios/ahbm/attention_decode.yaml --plans 200 --seed 2 --no-minimise --out runs/campaign/attention_decode
	$(BIN)/emu faults campaign scenarios/pccx/program.yaml --plans 150 --seed 3 --no-minimise --out runs/campaign/pccx
	$(BIN)/emu faults campaign scenarios/demo/ring.yaml --plans 150 --seed 4 --no-minimise --out runs/campaign/ring

sweep-demo: $(STAMP)
	$(BIN)/emu sweep scenarios/sweeps/reduce-grid.yaml --out runs/sweeps/reduce-grid

# A two-node Ray cluster on this machine (its own port, token and temporary directory), a sweep on it and on the
# process pool, the comparison printed, the cluster stopped (docs/sweep.md "A Ray cluster"). SPEC: the sweep file.
SPEC ?= scenarios/sweeps/reduce-cluster.yaml
sweep-ray-cluster: $(STAMP)
	$(BIN)/python -m tools.sweep.local_cluster $(SPEC)

# The Llama3-70B milestone bench (docs/sweep.md "The Llama3-70B milestone bench"): every case x context searched
# on 1 SIP with one KV head, each best point confirmed on 4 SIPs with all eight, four for the 32K Ring (83 min
# on 2 cores, 2026-12-05).  Two lanes, one core each: the 32K Ring panel (83 min, its 4-SIP confirmation 60)
# beside the other four, one after the other (47 min).  Resumable: run it again to continue; the 32K lane's
# output is in its .log.
LLAMA70B := decode-nosp decode-sp prefill-nosp prefill-sp
L70 := runs/sweeps/llama70b
llama70b: $(STAMP)
	@mkdir -p runs/sweeps; start=$$(date +%s); \
	$(BIN)/emu sweep scenarios/ahbm/llama70b/prefill-sp-32k.yaml --out $(L70)-prefill-sp-32k -j 1 \
	  > $(L70)-prefill-sp-32k.log 2>&1 & long=$$!; \
	for p in $(LLAMA70B); do $(BIN)/emu sweep scenarios/ahbm/llama70b/$$p.yaml --out $(L70)-$$p -j 1 \
	  || { kill $$long; exit 1; }; done; \
	wait $$long; status=$$?; cat $(L70)-prefill-sp-32k.log; \
	echo "make llama70b: $$(( ($$(date +%s) - start) / 60 )) min wall"; exit $$status

# The seed's whole milestone (docs/milestone.md): the four single-user sweeps above and the two multi-user panels
# below in one lane, the 32K Ring panel in the other (one core each, resumable: run it again to continue), then
# docs/milestone.md regenerated from what they wrote (milestone-doc: the best points re-run with a trace for their
# limits lines).  Wall time and the machine's loop calibration are printed at the end.
MILESTONE := decode-nosp decode-sp prefill-nosp prefill-sp multi-user-decode multi-user-prefill
milestone: $(STAMP)
	@mkdir -p runs/sweeps; start=$$(date +%s); \
	$(BIN)/emu sweep scenarios/ahbm/llama70b/prefill-sp-32k.yaml --out $(L70)-prefill-sp-32k -j 1 -q \
	  > $(L70)-prefill-sp-32k.log 2>&1 & long=$$!; \
	for p in $(MILESTONE); do $(BIN)/emu sweep scenarios/ahbm/llama70b/$$p.yaml --out $(L70)-$$p -j 1 -q \
	  || { kill $$long; exit 1; }; done; \
	wait $$long; status=$$?; tail -n 4 $(L70)-prefill-sp-32k.log; [ $$status = 0 ] || exit $$status; \
	$(MAKE) --no-print-directory milestone-doc; \
	echo "make milestone: $$(( ($$(date +%s) - start) / 60 )) min wall, loop calibration $$($(BIN)/python -c \
	  'from tools.bench.command import loop_ns; print(round(loop_ns(), 1))') ns"

milestone-doc: $(STAMP)
	$(BIN)/python -m tools.sweep.milestone --limits

# The milestone's multi-user panels (docs/requests.md): B concurrent requests per KV head's Group, decode and
# prefill, SP and no SP, 1 and 4 SIPs. Long; resumable like llama70b.
llama70b-multi: $(STAMP)
	for p in multi-user-decode multi-user-prefill; do $(BIN)/emu sweep scenarios/ahbm/llama70b/$$p.yaml --out runs/sweeps/llama70b-$$p || exit $$?; done

# Llama3-70B-shape GQA attention runs (timing mode, minutes each): not part of the tests.  The 32K
# prefills, Ring and no SP (minutes each, docs/gqa.md "Long contexts"), are gqa-llama-long; the 128K Ring
# prefill (hours) gqa-llama-128k.
gqa-llama: $(STAMP)
	for f in scenarios/ahbm/gqa/llama70b_*.yaml; do case $$f in *prefill_*32k*|*prefill_*128k*) continue;; esac; \
	  $(BIN)/emu run $$f --no-bundle || exit 1; done

gqa-llama-long: $(STAMP)
	for f in scenarios/ahbm/gqa/llama70b_prefill_ring_32k_1sip.yaml scenarios/ahbm/gqa/llama70b_prefill_nosp_32k_1sip.yaml; do \
	  $(BIN)/emu run $$f --no-bundle || exit 1; done

gqa-llama-128k: $(STAMP)
	$(BIN)/emu run scenarios/ahbm/gqa/llama70b_prefill_ring_128k_1sip.yaml --no-bundle --set stop.wall_timeout=6h

# Ring prefill at Llama3-70B shapes, 512 tokens, one head: C = 1/2/4/8 x contiguous/zigzag (docs/gqa.md); minutes each
gqa-ring-sweep: $(STAMP)
	for C in 1 2 4 8; do for o in contiguous zigzag; do $(BIN)/emu run scenarios/ahbm/gqa/llama70b_prefill_ring_1sip.yaml \
	  --no-bundle --set workload.params.heads=1 --set workload.params.C=$$C --set workload.params.context=512 \
	  --set workload.params.chunk=512 --set workload.params.ring_order=$$o || exit 1; done; done

# Gemma 3N E4B decode on pccx (docs/pccx-gemma3n.md): one token per scenario, minutes each
gemma3n-e4b: $(STAMP)
	for s in scenarios/pccx/gemma3n/e4b-*.yaml; do $(BIN)/emu run $$s --no-bundle || exit 1; done

clean:
	rm -rf $(VENV) runs
