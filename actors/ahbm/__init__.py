"""The AHBM machine of the first seed: SIPs of 4x4 CUBEs, 8 PEs per CUBE (DESIGN.md §4).

Modules (one concept each):

* ``params``     profile schema and the derived, integer-ps machine parameters;
* ``costs``      every service-time formula, with its source;
* ``tiles``      the PE scheduler's tile plan for a composite GEMM;
* ``memory``     HBM pseudo-channel controllers (address-striped) and the TCM;
* ``hbm_access`` one 2-D block access over a PE's pseudo-channels (used by dma and hbmport);
* ``answers``    request/answer matching by id for an actor with several accesses in flight;
* ``hbmport``    the NOC side of a PE's HBM controller (remote DMA, host loads);
* ``dma``, ``gemm``, ``mathunit``, ``scheduler``, ``cpu``   the PE engines (``cpu`` is hardware
  only: the ``tl`` runtime registers its KernelLaunch handler, tl/kernel_registry.py);
* ``ipcq``       PE<->PE queue pairs with credits;
* ``noc``        CUBE NOC routers (XY) and UCIe links;
* ``host``       the IO die / host: timed tensor loads, launches scripts, collects completions;
* ``placement``  tensor placement over (cube, pe) axes and the HBM allocator;
* ``builder``    wires a machine from a profile;
* ``closed_forms`` closed-form models of the engines and interconnect (what microbench checks);
* ``microbench`` the microbenchmark workload (build, measured vs closed form, data checks);
* ``idle``       the idle workload (whole machine, empty scripts: the scale check);
* ``machine``    the family entry point (``PROFILE_SCHEMA``, ``WORKLOADS``);
* ``testkit``    the one test kit: profiles with overrides, machines (scripts, ``tl`` kernels, workloads on
                 a small mesh), PE logs, HBM place/fetch, and closed forms written from the profile numbers.
"""

__all__: list[str] = []
