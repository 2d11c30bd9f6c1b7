"""The AHBM machine of the first seed: SIPs of 4x4 CUBEs, 8 PEs per CUBE (DESIGN.md §4).

Modules (one concept each):

* ``params``     profile schema and the derived, integer-ps machine parameters;
* ``costs``      every service-time formula, with its source;
* ``tiles``      the PE scheduler's tile plan for a composite GEMM;
* ``memory``     HBM pseudo-channel controllers (address-striped) and the TCM;
* ``hbmport``    the NOC side of a PE's HBM controller (remote DMA, host loads);
* ``dma``, ``gemm``, ``mathunit``, ``scheduler``, ``cpu``   the PE engines;
* ``ipcq``       PE<->PE queue pairs with credits;
* ``noc``        CUBE NOC routers (XY) and UCIe links;
* ``host``       the IO die / host: timed tensor loads, launches scripts, collects completions;
* ``placement``  tensor placement over (cube, pe) axes and the HBM allocator;
* ``builder``    wires a machine from a profile;
* ``microbench`` the microbenchmark and idle workloads;
* ``machine``    the family entry point (``PROFILE_SCHEMA``, ``WORKLOADS``);
* ``testkit``    helpers for tests (load a profile with overrides, build, read PE logs).
"""

__all__: list[str] = []
