"""What ``emu ... --help`` says, in one place: the help layout, the shared ``--set`` option, every command's
examples, and ``emu help [TOPIC]`` (the docs page for a topic).

Why one place: the help is the first document a user reads, and it goes stale when each command writes
its own.  Every option's help says what it does and, by the :class:`Formatter`, its default; every
command's ``--help`` ends with real examples from :data:`EXAMPLES`, which ``tests/test_cli_help.py`` runs in
a fresh directory beside the shipped ``scenarios/`` (the README's docs runner, tests/docrun.py), so an
example that stops working fails the suite.
"""
from __future__ import annotations

import argparse
import difflib
import re
import sys
import textwrap
from pathlib import Path

__all__ = ["Formatter", "add_set_argument", "EXAMPLES", "SLOW", "DESCRIPTIONS", "finish", "add_help_command", "parsers", "DOCS"]

DOCS = Path(__file__).resolve().parents[1] / "docs"


class Formatter(argparse.RawDescriptionHelpFormatter):
    """Wraps a description's prose to the terminal but keeps the lines of the examples (a paragraph whose
    lines are indented, or that starts ``examples:``); adds ``(default: ...)`` to an option whose help does
    not say its default."""

    def _fill_text(self, text, width, indent):
        paragraphs = text.strip("\n").split("\n\n")
        return "\n\n".join(
            p if p.startswith("examples:") or any(l[:1].isspace() for l in p.splitlines())
            else textwrap.fill(" ".join(p.split()), width, initial_indent=indent, subsequent_indent=indent)
            for p in paragraphs)

    def _get_help_string(self, action) -> str:
        text = action.help or ""
        if ("default" in text or action.default is argparse.SUPPRESS or not action.option_strings
                or action.required):
            return text
        d = action.default
        if isinstance(action, argparse._StoreTrueAction):
            shown = "off"
        elif d is None:
            shown = "none"
        elif isinstance(d, list):
            shown = "none" if not d else ", ".join(map(str, d))
        else:
            shown = "%(default)s"
        return f"{text} (default: {shown})"


SET_HELP = ("override one key of the scenario, e.g. workload.params.context=1024 or "
            "machine.overrides.hbm.pc_bandwidth=32GB/s (repeatable); the keys: emu validate --schema SCENARIO "
            "(the format and every parameter with its default), emu explain SCENARIO (the values in force)")


def add_set_argument(parser, *, what: str = "scenario") -> None:
    """The ``--set KEY.PATH=VALUE`` option, the same on every command that loads a scenario."""
    parser.add_argument("--set", action="append", default=[], metavar="KEY.PATH=VALUE",
                        help=SET_HELP.replace("the scenario", f"the {what}"))


#: the status of an example that is inherently slow (a full-scale benchmark): its epilog line says so
#: (:data:`SLOW_NOTE`), and tests/test_cli_help.py only parses its command line and validates each scenario
#: file it names, instead of running it
SLOW = "slow"
SLOW_NOTE = "(slow) "

#: command path -> its examples: (command line, what it shows, exit status or :data:`SLOW`).  Each runs in a
#: fresh directory holding a link to the shipped scenarios/ (tests/test_cli_help.py), within seconds.
EXAMPLES: dict[str, list[tuple[str, str, int]]] = {
    "": [("emu run scenarios/demo/reduce.yaml", "the default scenario: a 2-level reduce-to-root", 0),
         ("emu help", "the topics and the docs page of each", 0)],
    "run": [("emu run scenarios/demo/reduce.yaml", "run, print the summary, write runs/reduce-demo/", 0),
            ("emu run scenarios/ahbm/gqa/decode.yaml --set workload.params.context=1024 --no-bundle --quiet",
             "one knob changed, no bundle", 0),
            ("emu run scenarios/ahbm/gqa/decode_sp.yaml --stop-on 'send IpcqData on *ipcq.tx_*' --out runs/stop",
             "break at the reduction's first hop; then emu inspect runs/stop", 0)],
    "validate": [("emu validate scenarios/ahbm/gqa/decode.yaml", "check a scenario without running it", 0),
                 ("emu validate --schema scenarios/ahbm/gqa/decode.yaml", "the format, every key and default", 0)],
    "explain": [("emu explain scenarios/demo/reduce.yaml", "every actor and link with its parameters", 0),
                ("emu explain scenarios/faults/delay.yaml --faults", "what each fault's target glob matches", 0)],
    "bench": [("emu bench engine --scale 0.05 --repeats 1", "emulator vs SimPy, a small scale", 0),
              ("emu bench machine --repeats 1", "whole machines per CPU second", 0),
              ("emu bench engine", "the published engine ratio: full scale, five repeats", SLOW)],
    "trace": [("emu trace summary runs/ex/trace.emutrace", "after: emu run scenarios/demo/ring.yaml --out runs/ex", 0)],
    "trace perfetto": [("emu trace perfetto runs/ex/trace.emutrace", "a .pftrace for ui.perfetto.dev", 0)],
    "trace summary": [("emu trace summary runs/ex/trace.emutrace", "utilisation, traffic, critical path", 0)],
    "trace diff": [("emu trace diff runs/ex/trace.emutrace runs/ex/trace.emutrace", "identical traces", 0)],
    "trace chakra": [("emu trace chakra runs/ex-sp --out runs/ex-sp/chakra",
                      "one Chakra execution trace per PE, after: emu run scenarios/ahbm/gqa/decode_sp.yaml --out runs/ex-sp", 0)],
    "trace replay": [("emu trace replay runs/ex/trace.emutrace --actor ring/n3", "one actor against its inputs", 0)],
    "compare": [("emu compare runs/ex runs/ex", "two bundles' end times, links and actors side by side", 0)],
    "sweep": [("emu sweep scenarios/sweeps/reduce-grid.yaml --out runs/grid -q", "a grid, resumable", 0),
              ("emu validate scenarios/sweeps/reduce-grid.yaml", "check a sweep file and count its points", 0)],
    "faults": [("emu faults campaign scenarios/demo/reduce.yaml --plans 3 --out runs/camp",
                "random fault plans, each must end in a result, an error or a deadlock report", 0)],
    "faults campaign": [("emu faults campaign scenarios/demo/reduce.yaml --plans 3 --out runs/camp",
                         "three seeded fault plans", 0)],
    "pccx": [("emu pccx disasm 0x0", "decode a 64-bit instruction word", 0)],
    "pccx disasm": [("emu pccx disasm 0x0", "decode one 64-bit instruction word", 0)],
    "pccx asm": [("emu pccx disasm 0x0 | emu pccx asm -", "the text form back to the word", 0)],
    "pccx compile": [("emu pccx compile scenarios/pccx/gemma3n/models/tiny.yaml -o tiny.pasm",
                      "the Gemma 3N instruction stream of a model config", 0)],
    "profile": [("emu profile runs/gqa", "after: emu run scenarios/ahbm/gqa/decode.yaml --out runs/gqa", 0),
                ("emu profile runs/gqa --rows 5", "the five costliest kernel lines", 0)],
    "whatif": [("emu whatif scenarios/demo/reduce.yaml -j 2", "each resource 10 % faster and slower", 0),
               ("emu whatif --list scenarios/ahbm/gqa/decode.yaml", "the knobs per resource", 0)],
    "interval": [("emu interval scenarios/demo/reduce.yaml --samples 4 -j 2",
                  "no declared ranges in the demo profile: it says so", 2),
                 ("emu interval scenarios/ahbm/gqa/decode.yaml --set mode=timing --samples 4 -j 2",
                  "p5/p50/p95 over the AHBM profile's declared ranges, and the drivers", 0)],
    "calibrate": [("emu calibrate scenarios/calibration/demo-selfcheck.csv --fit pe_link.latency=10ns,40ns "
                   "--fit mesh_link.latency=30ns,90ns --out runs/demo-cal.yaml -j 2",
                   "recover two demo link latencies from end times the emulator gave with them", 0),
                  ("emu calibrate scenarios/calibration/demo-selfcheck.csv --fit pe_link.latency --out runs/x.yaml",
                   "a parameter the profile declares no range for: the error says how to give one", 2)],
    "inspect": [("emu inspect runs/stop --tree", "after: emu run scenarios/ahbm/gqa/decode_sp.yaml --stop-at 1.35us "
                 "--out runs/stop", 0)],
    "bisect": [("emu bisect runs/c1 runs/c2", "after two runs with --checkpoint-every 200ns --out runs/c1 / c2", 0)],
    "fork": [("emu fork runs/sp --at 1.3us", "after: emu run scenarios/ahbm/gqa/decode_sp.yaml --out runs/sp; "
              "no change: the same digest", 0),
             ("emu fork runs/sp --at 1.3us --delay '{link: \"sip0/cube00/pe4/ipcq.tx_N->*\", delay: 50ns}' "
              "--out runs/sp-fork", "a delayed link from 1.3us on, compared", 0)],
    "help": [("emu help", "the topics", 0), ("emu help faults", "docs/faults.md's sections", 0),
             ("emu help run", "emu run's help", 0)],
}

#: what a command is for, where its parser says nothing more than its one-line help in ``emu -h``
DESCRIPTIONS: dict[str, str] = {
    "trace": "Read a binary trace (.emutrace, written by emu run --trace or into a bundle): convert it for "
             "Perfetto or ASTRA-sim, summarise it, compare two, or replay one actor (docs/trace-tools.md; the "
             "format: docs/trace-format.md).",
    "trace perfetto": "Convert a trace into Perfetto's format: one track per actor, one flow per message, "
                      "to open in ui.perfetto.dev.",
    "trace summary": "Per-actor utilisation, per-link traffic and the critical path of a trace, from the "
                     "trace alone (no re-run).",
    "trace diff": "Compare two traces event by event and report the first event where they differ (the "
                  "digest, the time, the actor), or that they are identical.",
    "trace chakra": "Export a run as Chakra execution traces, one ET file per PE (chakra.<rank>.et), for "
                    "ASTRA-sim or any Chakra tool (docs/chakra.md).",
    "trace replay": "Rebuild one actor from the recorded run's scenario and feed it its recorded inputs "
                    "alone; check that it sends what it sent in the run (a regression test for one actor's "
                    "code). The trace must be recorded with payloads.",
    "compare": "Two result bundles side by side: end time, per-link traffic and per-actor busy time, with "
               "the difference of each (docs/trace-tools.md).",
    "sweep": "Run every point of a sweep file (a base scenario, the keys to vary, the metrics to collect) on "
             "local processes or a Ray cluster; collect one row per point into results.csv, the best "
             "point per metric and plots (docs/sweep.md). Re-running the same --out resumes: finished "
             "points are kept.",
    "faults": "Fault campaigns: many seeded random fault plans against one scenario (docs/faults.md).",
    "faults campaign": "Run a scenario under many seeded random fault plans (link delays, drops, "
                       "stalls); every plan must end in a result, a clear error or a deadlock report, "
                       "never a hang or a traceback. Writes one line per plan and a summary.",
    "pccx": "The pccx ISA's tools: decode and encode 64-bit instruction words, compile a Gemma 3N model "
            "config into an instruction stream (docs/pasm.md, docs/pccx-gemma3n.md).",
    "pccx disasm": "Decode 64-bit pccx instruction words (hex) into their text form.",
    "pccx asm": "Encode the text form of pccx instructions (as emu pccx disasm prints it) into 64-bit "
                "words.",
    "pccx compile": "Compile a Gemma 3N model config into the pccx instruction stream a pccx scenario "
                    "runs.",
    "profile": "Where a run's virtual time went: AHBM runs by tl kernel line (engine, stall and host time "
               "of each line on the critical PE, or summed over every PE), pccx runs by program stage. "
               "Reads a trace or a bundle; given a scenario file, runs it first (docs/explain.md).",
    "interval": "The spread of a run's results implied by its machine profile's declared uncertainty: "
                "runs the scenario --samples times over a Latin hypercube of the declared parameter ranges "
                "(those the scenario does not pin), on the process pool or Ray, and prints p5/p50/p95 of "
                "each metric beside the default run, whether the interval has converged, and the "
                "parameters that drive each metric (Spearman rank correlation) (docs/interval.md).",
    "calibrate": "Fit chosen machine-profile parameters to a CSV of observed figures (scenario, metric, value, "
                 "unit, source, split): bounded least squares on the log ratios of the fitted rows, each "
                 "evaluation a run of every scenario on the process pool or Ray; prints every row before and "
                 "after with the error of the held-out rows, and writes a calibrated profile that extends the "
                 "original (docs/calibrate.md).",
    "whatif": "Sensitivity of a scenario's end time to each resource: runs the scenario with each resource "
              "(HBM bandwidth, DMA, GEMM, links, ...) made --factor faster and --factor slower, measured "
              "beside the one-run estimate, and ranks the resources by their effect; --list shows the knobs of each resource without running (docs/explain.md).",
}

#: what an example needs run before it, in the same directory (the bundles and traces it reads): by command
#: path, else by its first word
SETUP = {
    "trace": "emu run scenarios/demo/ring.yaml --out runs/ex --quiet",
    "trace chakra": "emu run scenarios/ahbm/gqa/decode_sp.yaml --out runs/ex-sp --quiet",
    "compare": "emu run scenarios/demo/ring.yaml --out runs/ex --quiet",
    "profile": "emu run scenarios/ahbm/gqa/decode.yaml --out runs/gqa --quiet",
    "inspect": "emu run scenarios/ahbm/gqa/decode_sp.yaml --stop-at 1.35us --out runs/stop --quiet",
    "bisect": "emu run scenarios/demo/reduce.yaml --checkpoint-every 200ns --out runs/c1 --quiet && "
              "emu run scenarios/demo/reduce.yaml --checkpoint-every 200ns --out runs/c2 --quiet",
    "fork": "emu run scenarios/ahbm/gqa/decode_sp.yaml --out runs/sp --quiet",
}


def parsers(parser, path=()):
    """``(command path, parser)`` of ``parser`` and every sub-command below it, depth first."""
    yield " ".join(path), parser
    for a in parser._actions:
        if isinstance(a, argparse._SubParsersAction):
            for name, sp in a.choices.items():
                yield from parsers(sp, (*path, name))


def _epilog(path: str) -> str | None:
    ex = [(cmd, (SLOW_NOTE if status == SLOW else "") + what) for cmd, what, status in EXAMPLES.get(path, [])]
    if not ex:
        return None
    width = max(len(cmd) for cmd, _ in ex)
    lines = [f"  {cmd}" + (" " * (width - len(cmd)) + f"   # {what}" if width <= 72 else f"\n      # {what}")
             for cmd, what in ex]
    return "examples:\n" + "\n".join(lines) + "\n\ndocs: emu help TOPIC, or docs/README.md (the index)"


def finish(parser) -> None:
    """Every parser of the tree gets the :class:`Formatter` and its examples as epilog."""
    for path, p in parsers(parser):
        p.formatter_class = Formatter
        p.description = p.description or DESCRIPTIONS.get(path)
        epilog = _epilog(path)
        if epilog:
            p.epilog = (p.epilog + "\n\n" if p.epilog else "") + epilog


# -- emu help -------------------------------------------------------------------------------------------------------
def _pages() -> dict[str, tuple[str, list[str]]]:
    """docs page stem -> (its title, its section headings)."""
    out = {}
    for f in sorted(DOCS.glob("*.md")):
        if f.stem == "README":
            continue
        lines = f.read_text().splitlines()
        title = next((l.lstrip("# ").strip() for l in lines if l.startswith("# ")), f.stem)
        out[f.stem] = (title, [l.lstrip("# ").strip() for l in lines if re.match(r"^##+ ", l)])
    return out


def _help(args, parser) -> int:
    pages = _pages()
    commands = {path: p for path, p in parsers(parser) if path}
    topic = " ".join(args.topic)
    if not topic:
        print("emu help TOPIC: a docs page (its title, file and sections) or a command (its --help)")
        print("docs pages:")
        for stem, (title, _) in pages.items():
            print(f"  {stem:<16} {title}  (docs/{stem}.md)")
        print("commands: " + ", ".join(p for p in commands if " " not in p))
        return 0
    if topic in pages:
        title, sections = pages[topic]
        print(f"{title}\n  docs/{topic}.md (in the emulator's source tree: {DOCS / (topic + '.md')})")
        for s in sections:
            print(f"  - {s}")
        if topic not in commands:
            return 0
        print()                          # a page and a command of the same name (sweep): both
    if topic in commands:
        commands[topic].print_help()
        return 0
    close = difflib.get_close_matches(topic, list(dict.fromkeys([*pages, *commands])), n=3)
    print(f"error: emu help {topic!r}: no such docs page or command"
          + (f" (did you mean {', '.join(close)}?)" if close else "") + "; emu help lists them", file=sys.stderr)
    return 2


def add_help_command(sub, parser) -> None:
    h = sub.add_parser("help", help="the docs page for a topic, or a command's help (emu help lists the topics)",
                       description="Where to read about TOPIC: a docs page's title, file and sections, or a "
                                   "command's --help.")
    h.add_argument("topic", nargs="*", help="a docs page (faults, scenario, outputs, sweep, ...) or a command "
                   "(run, trace summary, ...); none: list them")
    h.set_defaults(func=lambda args: _help(args, parser))
