"""The coefficient check both energy test files run (tests/test_energy.py, tests/test_energy_pccx.py).

Raise each coefficient of a profile's ``energy`` section by one unit (1 fJ, 1 fJ/bit or 1 µW): the run's
total must move by exactly its count (static: components x time), so a coefficient the action map ignores,
or a counter it stops reading, is caught."""
import copy

from emulator.energy import AJ_PER_FJ, account


def leaves(d, path=()):
    """Every key path of a nested dict's leaves."""
    for k, v in d.items():
        if isinstance(v, dict):
            yield from leaves(v, path + (k,))
        else:
            yield path + (k,)


def assert_every_coefficient_counts(prof: dict, inventory, system, T: int, skip) -> int:
    """``inventory(system, profile, T)`` is the family's energy_inventory; ``skip``: paths this run cannot
    exercise.  Returns how many coefficients were checked."""
    base = account(*inventory(system, prof, T), T)
    n = 0
    for path in leaves(prof["energy"]):
        if path in skip:
            continue
        p2 = copy.deepcopy(prof)
        node = p2["energy"]
        for k in path[:-1]:
            node = node[k]
        node[path[-1]] += 1
        moved = account(*inventory(system, p2, T), T).total_aj - base.total_aj
        key = "energy." + ".".join(path)
        assert moved > 0, f"{key}: the coefficient changes nothing (ignored, or its counter reads 0)"
        unit = T if path[0] == "static" else AJ_PER_FJ
        assert moved == base.coefs[key]["count"] * unit, key
        n += 1
    return n
