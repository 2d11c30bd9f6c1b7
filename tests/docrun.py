"""Executable docs: every ```text block of README.md and docs/*.md that shows ``$ emu ...`` output is run
and its output compared (tests/test_docs_output.py); ``python -m tests.docrun [FILE]`` prints the real
output of each block, to paste when an output legitimately changed (never edit numbers by hand).

A block is a list of commands (lines starting ``$ ``) each followed by the output it shows.  Rules:

* each block runs in a fresh directory holding a link to the repository's ``scenarios/``, with the
  project's ``emu`` on ``PATH``; commands run in order through bash (pipes work), stdout and stderr
  together, unbuffered, as a terminal shows them; ``$ echo $?`` shows the previous command's status;
* ``$ cat FILE`` followed by lines *writes* FILE with them (the example's input), then shows them;
* a line ``...`` (indentation free) stands for any number of lines; otherwise the shown lines must be
  the output's lines, consecutive, from its first line to its last (a block that shows the start only
  ends with ``...``); a trailing ``# comment`` on a command line is the reader's, not the shell's;
* lines are compared with runs of spaces collapsed (a table may realign) after these masks, which
  replace what legitimately varies from run to run by a placeholder, on both sides:
  ``MASKS`` below (wall seconds, events/s, memory, a run's wall-clock in a sweep or bench table);
* an HTML comment on the line before the block sets options: ``<!-- doc-run: vary COL,COL -->`` masks
  those table columns too; ``<!-- doc-run: interrupt 1.5s -->`` sends SIGINT (Ctrl-C) to the command
  that shows ``^C`` after that long, and masks every number (where it stops varies);
  ``<!-- doc-run: shape as "CMD" -->`` runs CMD instead of the block's first command (a benchmark at a
  smaller scale) and masks every number: the table's columns and rows are checked, not the figures;
  ``<!-- doc-run: skip REASON -->`` does not run the block (a benchmark of minutes), and says why;
  ``<!-- doc-run: slow REASON -->`` runs it in the test suite's slow tier only (docs/testing.md), and says why;
  several options are several such comment lines, one after the other, right above the block.
"""
from __future__ import annotations

import os
import re
import shlex
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

#: what varies between two runs of the same command on the same machine (applied to both sides)
MASKS = [
    (re.compile(r"wall\s+[\d.]+ s \([\d,]+ events/s\)"), "wall <wall> s (<rate> events/s)"),
    (re.compile(r"peak RSS [\d.]+ MiB"), "peak RSS <mem> MiB"),
    (re.compile(r"walked in [\d.]+ s, [\d.]+ % of the run's wall time"),        # a large trace's limits walk
     "walked in <wall> s, <share> % of the run's wall time"),
]
_HEX = re.compile(r"\b(0x)?[0-9a-f]{8,}\b")
_NUMBER = re.compile(r"\d+(?:[.,]\d+)*(?:e[+-]?\d+)?")


@dataclass
class Command:
    line: str                     # the command as shown (without "$ ")
    shown: list[str] = field(default_factory=list)


@dataclass
class Block:
    file: Path
    line: int                     # line number of the opening fence
    options: dict
    commands: list[Command]

    @property
    def where(self) -> str:
        return f"{self.file.relative_to(ROOT)}:{self.line}"


def blocks(path: Path) -> list[Block]:
    """The ```text blocks of ``path`` with at least one ``$ emu`` command that shows output."""
    lines = path.read_text().splitlines()
    out = []
    i = 0
    while i < len(lines):
        if lines[i].strip() != "```text":
            i += 1
            continue
        start = i
        opts = {}
        j = i - 1
        while j >= 0 and _options(lines[j]):             # options stack: one comment line each
            opts = {**_options(lines[j]), **opts}
            j -= 1
        i += 1
        cmds: list[Command] = []
        while i < len(lines) and lines[i].strip() != "```":
            if lines[i].startswith("$ "):
                cmds.append(Command(lines[i][2:]))
            elif cmds:
                cmds[-1].shown.append(lines[i])
            i += 1
        i += 1
        if any(re.match(r"(emu|make)\b", c.line) for c in cmds) and any(c.shown for c in cmds):
            out.append(Block(path, start + 1, opts, cmds))
    return out


def _options(line: str) -> dict:
    m = re.match(r"\s*<!--\s*doc-run:\s*(\w+)\s*(.*?)\s*-->", line)
    if not m:
        return {}
    kind, arg = m.group(1), m.group(2)
    if kind == "vary":
        return {"vary": [c.strip() for c in arg.split(",") if c.strip()]}
    if kind == "interrupt":
        return {"interrupt": float(arg.rstrip("s"))}
    if kind == "skip":
        return {"skip": arg or "no reason given"}
    if kind == "slow":
        return {"slow": arg or "no reason given"}
    if kind == "shape":
        m2 = re.match(r'as "(.*)"$', arg)
        return {"shape": m2.group(1) if m2 else None}
    raise ValueError(f"unknown doc-run option {kind!r} in {line!r}")


def _strip_comment(cmd: str) -> str:
    """``emu sweep spec.yaml --out DIR   # -j N ...`` -> the command without the reader's comment."""
    out, quote = [], None
    for i, ch in enumerate(cmd):
        if quote:
            quote = None if ch == quote else quote
        elif ch in "'\"":
            quote = ch
        elif ch == "#" and (i == 0 or cmd[i - 1].isspace()):
            return "".join(out).rstrip()
        out.append(ch)
    return cmd


def run_block(block: Block, workdir: Path) -> list[list[str]]:
    """The real output lines of each command of ``block``, run in ``workdir``."""
    (workdir / "scenarios").symlink_to(ROOT / "scenarios")
    env = dict(os.environ, PYTHONUNBUFFERED="1", COLUMNS="200",
               PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}")
    env.pop("PYTEST_CURRENT_TEST", None)
    outputs, status = [], 0
    for n, c in enumerate(block.commands):
        cmd = _strip_comment(c.line)
        if n == 0 and block.options.get("shape"):
            cmd = block.options["shape"]          # a cheaper run of the same command (its figures are masked)
        if cmd.startswith("cat ") and c.shown and len(shlex.split(cmd)) == 2:
            target = workdir / shlex.split(cmd)[1]
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text("\n".join(c.shown) + "\n")
            outputs.append(list(c.shown))
            continue
        if cmd == "echo $?":
            outputs.append([str(status)])
            continue
        proc = subprocess.Popen(["bash", "-c", cmd], cwd=workdir, env=env, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True, start_new_session=True)
        if "^C" in "".join(c.shown) and "interrupt" in block.options:
            time.sleep(block.options["interrupt"])
            os.killpg(proc.pid, signal.SIGINT)
        text, _ = proc.communicate(timeout=900)
        status = proc.returncode
        lines = text.splitlines()
        if "^C" in "".join(c.shown):
            lines = ["^C" + lines[0]] + lines[1:] if lines else ["^C"]
        outputs.append(lines)
    return outputs


def _cells_masked(lines: list[str], columns: list[str]) -> list[str]:
    """Mask the cells of ``columns`` in the tables of ``lines`` (a header line names them; cells are
    separated by two or more spaces, as tools.table.format_table writes them)."""
    out, idx = [], None
    for line in lines:
        cells = re.split(r"\s{2,}", line.strip())
        if any(c in cells for c in columns) and len(cells) > 1:
            idx = [cells.index(c) for c in columns if c in cells]
            out.append(line)
            continue
        if idx is not None and len(cells) > max(idx) and not set(line.strip()) <= {"-", " "}:
            for i in idx:
                cells[i] = "<v>"
            out.append("  ".join(cells))
            continue
        if idx is not None and not line.strip():
            idx = None
        out.append(line)
    return out


def normalise(lines: list[str], options: dict) -> list[str]:
    lines = _cells_masked(lines, options.get("vary", []))
    out = []
    for line in lines:
        for pattern, repl in MASKS:
            line = pattern.sub(repl, line)
        if "interrupt" in options or "shape" in options:
            line = _NUMBER.sub("<n>", _HEX.sub("<n>", line))
        if line.strip() and set(line.strip()) <= {"-", " "}:
            line = "<rule>"                        # a table's rule: its widths follow the cells
        out.append(" ".join(line.split()))
    return out


def compare(shown: list[str], actual: list[str], options: dict) -> str | None:
    """None when ``actual`` matches what the docs show (module docstring), else where it differs."""
    exp, act = normalise(shown, options), normalise(actual, options)
    segments, seg = [], []
    for e in exp:
        if e == "...":
            segments.append(seg)
            seg = []
        else:
            seg.append(e)
    segments.append(seg)
    pos = 0
    for n, seg in enumerate(segments):
        if not seg:
            continue
        first, last = n == 0, n == len(segments) - 1
        if first:
            if act[:len(seg)] != seg:
                return _diff(seg, act[:len(seg) + 2], "the output's first lines")
            pos = len(seg)
            continue
        found = None
        for j in range(pos, len(act) - len(seg) + 1):
            if act[j:j + len(seg)] == seg:
                found = j
                if not last:
                    break
        if found is None or (last and found + len(seg) != len(act)):
            where = "the output's last lines" if last else f"the output after line {pos}"
            return _diff(seg, act[pos:] if not last else act[-len(seg) - 2:], where)
        pos = found + len(seg)
    if len(segments) == 1 and segments[0] and len(act) != len(segments[0]):
        return _diff(segments[0], act, "the whole output (the docs show no '...')")
    return None


def _diff(want: list[str], got: list[str], where: str) -> str:
    return (f"{where} differ:\n  shown:\n" + "\n".join(f"    {w}" for w in want)
            + "\n  got:\n" + "\n".join(f"    {g}" for g in got[:len(want) + 6]))


def check(block: Block) -> list[str]:
    """Problems of one block (empty: it matches)."""
    with tempfile.TemporaryDirectory(prefix="docrun-") as d:
        outputs = run_block(block, Path(d))
    problems = []
    for c, out in zip(block.commands, outputs):
        if not c.shown:
            continue
        why = compare(c.shown, out, block.options)
        if why:
            problems.append(f"{block.where}: $ {c.line}\n{why}")
    return problems


DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def main(argv=None) -> int:
    """Print each block's real output (to paste into the docs after a real change)."""
    argv = sys.argv[1:] if argv is None else argv
    files = [Path(a).resolve() for a in argv] or DOCS
    for f in files:
        for b in blocks(f):
            if "skip" in b.options:
                print(f"== {b.where}: skipped ({b.options['skip']})")
                continue
            with tempfile.TemporaryDirectory(prefix="docrun-") as d:
                outs = run_block(b, Path(d))
            print(f"== {b.where}")
            for c, out in zip(b.commands, outs):
                print(f"$ {c.line}")
                print("\n".join(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
