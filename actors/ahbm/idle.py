"""The AHBM ``idle`` workload: build the whole machine and launch an empty script on every PE
(``launch: true``) or on none: the scale check (how many actors, how long a build and run take)."""
from __future__ import annotations

from emulator.schema import Bool, Map

from actors.ahbm.builder import build_machine
from actors.ahbm.params import Params

__all__ = ["IDLE_PARAMS", "build_idle", "check_idle"]

IDLE_PARAMS = Map({"launch": Bool(default=True, doc="launch an empty script on every PE")})


def build_idle(system, profile: dict, p: dict) -> dict:
    """Build the machine of ``profile``; the context is ``{"machine": Machine}``."""
    prm = Params.of(profile)
    scripts = {}
    if p["launch"]:
        scripts = {(s, c, q): [] for s in range(prm.sips) for c in range(prm.cubes) for q in range(prm.P)}
    return {"machine": build_machine(system, profile, scripts=scripts)}


def check_idle(system, profile: dict, params: dict, result, *, context: dict) -> dict:
    """How much was built and how many PEs reported done."""
    m = context["machine"]
    return {"pes": len(m.pes), "routers": len(m.routers), "pes_done": len(m.host.logs)}
