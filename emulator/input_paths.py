"""Files a scenario names stay inside the scenario's tree (issue 39).

Why: a scenario is often someone else's file.  Without a rule, its
``arrivals_file: ../../../etc/passwd`` would make the tool read any file the
user can read and show it in an error.  So every file a scenario, a profile,
a sweep file or a result bundle names (arrival traces, machine profiles and
their ``extends:``, programs, a sweep's base, a bundle's recorded profile)
is resolved -- symlinks followed, ``..`` collapsed -- and must then lie under
one of the *input roots*:

1. the folder of the file that names it (the scenario's folder; a sweep's
   folder for its base; a bundle's folder for what it recorded);
2. the emulator's own shipped ``scenarios/`` tree (trusted content: shipped
   profiles such as ``ahbm`` live in ``scenarios/machines``);
3. every ``--allow-path DIR`` given on the command line;
4. a scenario's ``inputs_root:`` key: a folder (relative to the scenario) that
   contains the scenario, so ``inputs_root: ..`` lets a project keep ``data/``
   beside ``scenarios/``.  It replaces the scenario's folder as root 1.

A file outside them is an error naming the key, the value as written, the
resolved path and the roots -- never the file's contents, since it is never
read.  The roots are a ``{folder: why}`` map (JSON-friendly: it travels in the
resolved scenario to sweep workers and workload builds).
"""
from __future__ import annotations

from pathlib import Path

from emulator.errors import BuildError
from emulator.schema import Problem, SchemaError

__all__ = ["SHIPPED", "input_roots", "admits", "confined_file", "bundle_file",
           "check_inputs_root", "add_allow_path_argument"]

#: the emulator's own scenarios/ tree: its profiles and data are trusted wherever the scenario lives
SHIPPED = Path(__file__).resolve().parents[1] / "scenarios"

Roots = dict   # resolved folder (str) -> why it is allowed (str)


def input_roots(folder, *, allow=(), inputs_root=None, own: str = "the scenario's folder") -> Roots:
    """The roots for files named by a document in ``folder`` (module docstring): ``inputs_root`` (an already
    checked folder, see :func:`check_inputs_root`) or ``folder`` (said as ``own``), the shipped tree, each
    ``allow`` folder."""
    roots: Roots = {}
    if inputs_root is not None:
        roots[str(Path(inputs_root).resolve())] = "inputs_root"
    else:
        roots[str(Path(folder).resolve())] = own
    roots.setdefault(str(SHIPPED), "the emulator's scenarios/")
    for d in allow or ():
        roots.setdefault(str(Path(d).resolve()), "--allow-path")
    return roots


def admits(roots: Roots, path: Path) -> bool:
    """Whether the resolved ``path`` lies under one of ``roots``."""
    return any(path.is_relative_to(r) for r in roots)


def _outside(value, resolved: Path, roots: Roots) -> tuple[str, str, str]:
    """``(expected, found, hint)`` of a file outside the roots, for a :class:`Problem` or a build error."""
    where = ", ".join(f"{r} ({why})" for r, why in roots.items())
    return (f"a file under one of the input roots: {where}",
            f"{str(value)!r}, which resolves to {resolved}",
            "admit another folder with --allow-path DIR or an inputs_root: key")


def confined_file(candidates, key: str, value, roots: Roots, where: tuple | None = None, *,
                  first: bool = False) -> Path | None:
    """The first of ``candidates`` that is a file under ``roots``, resolved; None when none of them exists.

    A candidate that exists only outside the roots is an error (never read): a :class:`SchemaError` at
    ``where`` (``(file, line)``) when given, else a :class:`BuildError` starting with ``key`` (the runner
    prefixes the scenario's file and line).  Fallbacks (working directory, repository) are candidates too,
    so they count only where they stay inside the roots.  ``first``: the first existing candidate decides
    (a search path, where a later file must not silently stand in for the one found).
    """
    refused = None
    for c in candidates:
        c = Path(c)
        if not c.is_file():
            continue
        resolved = c.resolve()
        if admits(roots, resolved):
            return resolved
        refused = refused or resolved
        if first:
            break
    if refused is None:
        return None
    expected, found, hint = _outside(value, refused, roots)
    if where is not None:
        raise SchemaError([Problem(where[0], where[1], key, expected, found, hint)])
    raise BuildError(f"{key}: expected {expected}, found {found} ({hint})")


def bundle_file(bundle, name: str, roots: Roots | None = None) -> Path | None:
    """A result bundle's own file ``name`` (``result.json``...), resolved: None when missing, an error when it
    lies outside the bundle's folder (a symlink out of it), or outside ``roots`` when given."""
    return confined_file([Path(bundle) / name], name, name,
                         roots or input_roots(bundle, own="the bundle's folder"))


def check_inputs_root(value: str, scenario_file: str) -> tuple[Path | None, str, str]:
    """``(folder, expected, found)`` of an ``inputs_root:`` value: the folder when it is usable, else None with
    why.  Usable: a folder (relative to the scenario) that contains the scenario file, and is neither the
    filesystem root nor the user's home directory (those would admit everything the user can read)."""
    scen = Path(scenario_file).resolve()
    folder = (scen.parent / value).resolve()
    expected = "a folder that contains the scenario (e.g. '..'), not / or the home directory"
    if not folder.is_dir():
        return None, expected, f"{value!r}, which resolves to {folder}, not a folder"
    if folder == Path(folder.anchor) or folder == Path.home().resolve():
        return None, expected, f"{value!r}, which resolves to {folder}"
    if not scen.is_relative_to(folder):
        return None, expected, f"{value!r}, which resolves to {folder}, which does not contain {scen}"
    return folder, expected, ""


def add_allow_path_argument(parser) -> None:
    """``--allow-path DIR`` (repeatable) on a subcommand that loads scenarios, sweeps or bundles."""
    parser.add_argument("--allow-path", action="append", default=[], metavar="DIR",
                        help="also read files the scenario names from under DIR (repeatable; by default only "
                             "the scenario's folder and the emulator's scenarios/)")
