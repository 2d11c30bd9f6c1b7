"""The README and the docs show real output: every block with ``$ emu ...`` output is run and compared
(tests/docrun.py has the rules and the masks); a block that cannot run says why."""
import pytest

import docrun

ALL = [b for f in docrun.DOCS for b in docrun.blocks(f)]


def test_every_block_runs_or_says_why_not():
    assert len(ALL) >= 15
    for b in ALL:
        for why in ("skip", "slow"):
            if why in b.options:
                assert len(b.options[why]) > 20, f"{b.where}: a {why} block needs its reason"
    assert sum("skip" in b.options for b in ALL) <= 4


@pytest.mark.parametrize("block", [pytest.param(b, marks=pytest.mark.slow) if "slow" in b.options else b
                                   for b in ALL if "skip" not in b.options], ids=lambda b: b.where)
def test_the_shown_output_is_the_real_output(block):
    """One test per block, so the test runner's workers share them out and a failure names its block."""
    problems = docrun.check(block)
    assert not problems, "\n\n".join(problems) + "\n\n(python -m tests.docrun FILE prints the real output)"


def test_a_changed_output_fails_the_check():
    """The comparison can fail: one number of a shown output changed is found."""
    (block,) = [b for b in ALL if b.commands[0].line == "emu run scenarios/demo/reduce.yaml"][:1]
    assert not docrun.check(block)
    cmd = block.commands[0]
    i = next(n for n, line in enumerate(cmd.shown) if "end time" in line)
    cmd.shown[i] = cmd.shown[i].replace("16.1418us", "16.1419us")
    try:
        (problem,) = docrun.check(block)
        assert "16.1419us" in problem and "16.1418us" in problem
    finally:
        cmd.shown[i] = cmd.shown[i].replace("16.1419us", "16.1418us")


@pytest.mark.parametrize("shown, actual, ok", [
    (["a", "...", "z"], ["a", "b", "c", "z"], True),
    (["a", "z"], ["a", "b", "z"], False),                 # no '...': every line is shown
    (["a", "..."], ["a", "b"], True),
    (["...", "b"], ["a", "b", "c"], False),              # the last shown line is the last line
    (["  wall   0.1 s (9 events/s)"], ["  wall 7.25 s (1,234 events/s)"], True),   # a mask
])
def test_the_matching_rules(shown, actual, ok):
    assert (docrun.compare(shown, actual, {}) is None) == ok
