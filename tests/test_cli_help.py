"""``emu ... --help`` (tools/cli_help.py): every option says what it does, every command ends with examples,
and every example runs as written, in a fresh directory beside the shipped scenarios/ (tests/docrun.py)."""
import argparse
import shlex
import tempfile
import time
from pathlib import Path

import pytest

import docrun
from tools.cli import build_parser, main
from tools.cli_help import EXAMPLES, SETUP, SLOW, parsers

PARSER = build_parser()
COMMANDS = [path for path, _ in parsers(PARSER)]
BUDGET_S = 30          # an example command path's run, its setup included: examples are quick (seconds)


def test_every_option_of_every_command_has_its_help_and_every_command_its_examples():
    missing, bare = [], []
    for path, p in parsers(PARSER):
        for a in p._actions:
            if isinstance(a, (argparse._HelpAction, argparse._SubParsersAction, argparse._VersionAction)):
                continue
            if not (a.help or "").strip():
                missing.append(f"emu {path} {'/'.join(a.option_strings) or a.dest}")
        if "examples:\n  emu " not in (p.epilog or "") or not (p.description or "").strip():
            bare.append(f"emu {path}".strip())
    assert not missing, f"options without a help text: {missing}"
    assert not bare, f"commands without examples or description (tools/cli_help.py EXAMPLES, DESCRIPTIONS): {bare}"
    assert set(EXAMPLES) == set(COMMANDS), set(EXAMPLES) ^ set(COMMANDS)


def test_the_help_says_defaults_and_how_to_list_the_keys(capsys):
    assert main(["run", "--help"]) == 0
    text = capsys.readouterr().out
    flat = " ".join(text.split())
    assert "emu validate --schema SCENARIO" in flat and "emu explain SCENARIO" in flat       # --set names the keys
    assert "--no-bundle write no result bundle (default: off)" in flat
    assert "--out OUT result bundle directory (default: runs/<scenario name>)" in flat
    assert text.rstrip().endswith("docs: emu help TOPIC, or docs/README.md (the index)")


def _runs() -> list[str]:
    """The command paths whose examples are run: a path whose every example another path also shows (``emu
    trace`` and ``emu trace summary``) runs once."""
    seen, out = set(), []
    for path in sorted(EXAMPLES, key=lambda p: (-len(p.split()), p)):      # the most specific first
        cmds = {c for c, _, _ in EXAMPLES[path]}
        if not cmds <= seen:
            out.append(path)
        seen |= cmds
    return sorted(out)


def test_every_example_is_run_under_some_command():
    ran = {c for p in _runs() for c, _, _ in EXAMPLES[p]}
    assert ran == {c for ex in EXAMPLES.values() for c, _, _ in ex}


@pytest.mark.parametrize("path", _runs(), ids=lambda p: p or "emu")
def test_every_example_of_the_help_runs_as_written(path):
    """Each example runs in a fresh directory and ends with its status, within the budget; a slow one
    (status SLOW) is parsed by the real parser and each scenario file it names is validated instead."""
    setup = SETUP.get(path) or SETUP.get(path.split(" ")[0])
    commands, expected = ([docrun.Command(setup), docrun.Command("echo $?")], [0]) if setup else ([], [])
    for cmd, _, status in EXAMPLES[path]:
        if status == SLOW:
            words = shlex.split(cmd)
            assert words[0] == "emu" and PARSER.parse_args(words[1:]).cmd == words[1]
            lines = [f"emu validate {w}" for w in words if w.startswith("scenarios/")]
            expected += [0] * len(lines)
        else:
            lines, expected = [cmd], expected + [status]
        for line in lines:
            commands += [docrun.Command(line), docrun.Command("echo $?")]
    block = docrun.Block(Path(docrun.ROOT / "tools" / "cli_help.py"), 0, {}, commands)
    start = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="emu-help-") as d:
        outs = docrun.run_block(block, Path(d))
    took = time.monotonic() - start
    got = [int(o[0]) for o in outs[1::2]]
    assert got == expected, "\n".join(f"$ {c.line}\n" + "\n".join(o[-8:]) for c, o in zip(commands[::2], outs[::2]))
    assert took < BUDGET_S, f"emu {path}: the examples took {took:.1f} s; mark a slow one SLOW (tools/cli_help.py)"


def test_emu_help_points_to_the_docs_page_or_the_command(capsys):
    assert main(["help"]) == 0
    out = capsys.readouterr().out
    for f in Path(docrun.ROOT / "docs").glob("*.md"):
        if f.stem != "README":
            assert f"(docs/{f.stem}.md)" in out
    assert main(["help", "faults"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("Faults, fault campaigns and input limits\n  docs/faults.md") and "  - Input limits" in out
    assert main(["help", "sweep"]) == 0                  # a page and a command: both
    out = capsys.readouterr().out
    assert out.startswith("Sweeps: `emu sweep SPEC.yaml`\n  docs/sweep.md") and "\nusage: emu sweep " in out
    assert main(["help", "trace", "summary"]) == 0
    assert capsys.readouterr().out.startswith("usage: emu trace summary")
    assert main(["help", "fault"]) == 2
    assert "no such docs page or command (did you mean faults?)" in capsys.readouterr().err


def test_every_scenario_set_option_is_the_shared_one():
    """One --set definition (tools/cli_help.add_set_argument): each names an example and how to list the keys.
    emu fork's --set is another option: a machine parameter changed mid-run, its keys listed in its help."""
    found = []
    for path, p in parsers(PARSER):
        for a in p._actions:
            if "--set" in a.option_strings and path != "fork":
                found.append(path)
                flat = " ".join(a.help.split())
                assert "e.g. workload.params.context=1024" in flat and "emu validate --schema SCENARIO" in flat \
                    and "emu explain SCENARIO" in flat, f"emu {path} --set: {a.help!r}"
    assert {"run", "validate", "explain", "whatif", "profile", "faults campaign", "trace replay"} <= set(found), found


@pytest.mark.parametrize("command, says", [
    ("run", ["Run a scenario: build the machine", "--trace FILE write the binary trace to FILE",
             "--set KEY.PATH=VALUE override one key of the scenario, e.g. workload.params.context=1024"]),
    ("sweep", ["Run every point of a sweep file", "Re-running the same --out resumes",
               "--only KEY=VALUE run and tabulate only the points with this varied value (repeatable); "
               "default: every point"]),
    ("profile", ["Where a run's virtual time went", "--rows ROWS rows of each table (the costliest first) "
                 "(default: 15)", "emu profile runs/gqa --rows 5 # the five costliest kernel lines"]),
    ("whatif", ["Sensitivity of a scenario's end time to each resource", "--plot PNG write a tornado chart "
                "to PNG; default: no chart", "emu whatif --list scenarios/ahbm/gqa/decode.yaml"]),
])
def test_the_help_of_the_main_commands_as_a_user_sees_it(emu, command, says):
    """The real ``emu COMMAND --help`` (a subprocess): what the command is for, options with their defaults,
    the shared --set, the examples, the docs pointer."""
    flat = " ".join(emu(command, "--help", check=0).stdout.split())
    for text in says + ["emu validate --schema SCENARIO" if command != "sweep" else "emu validate scenarios/",
                        "examples: emu ", "docs: emu help TOPIC"]:
        assert text in flat, f"emu {command} --help lacks {text!r}"
