"""The arithmetic of ``make bench-instructions`` (tools/bench/instructions.py); valgrind itself is not run here."""
import pytest

from tools.bench.instructions import parse_refs, per_message

CACHEGRIND = """==5657== Cachegrind, a high-precision tracing profiler
==5657== Command: python -c ...
==5657==
==5657== I   refs:      14,293,851,844
"""


def test_the_instruction_total_is_read_from_cachegrinds_summary():
    assert parse_refs(CACHEGRIND) == 14_293_851_844


def test_a_summary_without_the_total_is_an_error_that_shows_the_output():
    with pytest.raises(RuntimeError, match="(?s)no .I refs. line.*Cachegrind"):
        parse_refs(CACHEGRIND.replace("I   refs", "D   refs"))


def test_per_message_cost_removes_the_start_up_shared_by_both_runs():
    # start-up 1.4 G instructions, 75 k per message: 20000 and 2000 messages
    start, each = 1_400_000_000, 75_000
    assert per_message((start + 20000 * each, 20000), (start + 2000 * each, 2000)) == each


def test_the_larger_run_must_carry_more_messages():
    with pytest.raises(ValueError, match="more messages"):
        per_message((10, 100), (5, 100))
