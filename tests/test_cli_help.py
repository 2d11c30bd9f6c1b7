"""``emu ... --help`` (tools/cli_help.py): every option says what it does, every command ends with examples,
and every example runs as written, in a fresh directory beside the shipped scenarios/ (tests/docrun.py)."""
import argparse
import tempfile
from pathlib import Path

import pytest

import docrun
from tools.cli import build_parser, main
from tools.cli_help import EXAMPLES, SETUP, parsers

PARSER = build_parser()
COMMANDS = [path for path, _ in parsers(PARSER)]


def test_every_option_of_every_command_has_its_help_and_every_command_its_examples():
    missing, bare = [], []
    for path, p in parsers(PARSER):
        for a in p._actions:
            if isinstance(a, (argparse._HelpAction, argparse._SubParsersAction, argparse._VersionAction)):
                continue
            if not (a.help or "").strip():
                missing.append(f"emu {path} {'/'.join(a.option_strings) or a.dest}")
        if "examples:\n  emu " not in (p.epilog or ""):
            bare.append(f"emu {path}".strip())
    assert not missing, f"options without a help text: {missing}"
    assert not bare, f"commands without examples (tools/cli_help.py EXAMPLES): {bare}"
    assert set(EXAMPLES) == set(COMMANDS), set(EXAMPLES) ^ set(COMMANDS)


def test_the_help_says_defaults_and_how_to_list_the_keys(capsys):
    assert main(["run", "--help"]) == 0
    text = capsys.readouterr().out
    flat = " ".join(text.split())
    assert "emu validate --schema SCENARIO" in flat and "emu explain SCENARIO" in flat       # --set names the keys
    assert "--no-bundle write no result bundle (default: off)" in flat
    assert "--out OUT result bundle directory (default: runs/<scenario name>)" in flat
    assert text.rstrip().endswith("docs: emu help TOPIC, or docs/README.md (the index)")


@pytest.mark.parametrize("path", sorted(EXAMPLES), ids=lambda p: p or "emu")
def test_every_example_of_the_help_runs_as_written(path):
    setup = SETUP.get(path) or SETUP.get(path.split(" ")[0])
    commands = [docrun.Command(setup), docrun.Command("echo $?")] if setup else []
    for cmd, _, _ in EXAMPLES[path]:
        commands += [docrun.Command(cmd), docrun.Command("echo $?")]
    block = docrun.Block(Path(docrun.ROOT / "tools" / "cli_help.py"), 0, {}, commands)
    with tempfile.TemporaryDirectory(prefix="emu-help-") as d:
        outs = docrun.run_block(block, Path(d))
    expected = ([0] if setup else []) + [status for _, _, status in EXAMPLES[path]]
    got = [int(o[0]) for o in outs[1::2]]
    assert got == expected, "\n".join(f"$ {c.line}\n" + "\n".join(o[-8:]) for c, o in zip(commands[::2], outs[::2]))


def test_emu_help_points_to_the_docs_page_or_the_command(capsys):
    assert main(["help"]) == 0
    out = capsys.readouterr().out
    for f in Path(docrun.ROOT / "docs").glob("*.md"):
        if f.stem != "README":
            assert f"(docs/{f.stem}.md)" in out
    assert main(["help", "faults"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("Faults, fault campaigns and input limits\n  docs/faults.md") and "  - Input limits" in out
    assert main(["help", "trace", "summary"]) == 0
    assert capsys.readouterr().out.startswith("usage: emu trace summary")
    assert main(["help", "fault"]) == 2
    assert "no such docs page or command (did you mean faults?)" in capsys.readouterr().err
