"""The ``tl`` kernel runtime of the AHBM PE (DESIGN.md §4, seed ADR-0060 §1, ADR-0062/0063/0064).

Kernels are synchronous Python in the seed's Triton-like style; the PE CPU runs
them in its Trio task through greenback, and every ``tl`` call becomes messages
to the PE's engines.  Modules (one concept each):

* ``errors``    KernelError (names the PE and the kernel's file:line);
* ``backend``   the interface the runtime calls (dispatch, engine commands, waits, TCM);
* ``handles``   TensorHandle (lazy data, operators -> MATH commands);
* ``scratch``   TCM arenas and ``tl.scratch_scope`` (per-tile recycling);
* ``runtime``   the ``tl`` API (load/store/dot/composite/ref/trans/MATH/send/recv/...);
* ``cpu``       TlCpu: the PE CPU actor, the backend over protocols/ahbm.py messages;
* ``pe``        a CUBE (or a row of CUBEs with NOC routers) of tl PEs from the engine actors;
* ``launcher``  the host side: KernelLaunch / KernelDone (protocols/ahbm_tl.py);
* ``workloads`` the baseline attention workloads (``WORKLOADS``);
* ``testing``   profile + small-machine helpers for tests.
"""
