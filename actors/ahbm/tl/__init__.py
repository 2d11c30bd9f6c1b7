"""The ``tl`` kernel runtime of the AHBM PE (DESIGN.md §4, seed ADR-0060 §1, ADR-0062/0063/0064).

Kernels are synchronous Python in the seed's Triton-like style; the PE CPU runs
them in its Trio task through greenback, and every ``tl`` call becomes messages
to the PE's engines.  Modules (one concept each):

* ``errors``    KernelError (names the PE and the kernel's file:line);
* ``backend``   the interface the runtime calls (dispatch, engine commands, waits, TCM);
* ``handles``   TensorHandle (lazy data, operators -> MATH commands);
* ``scratch``   TCM arenas and ``tl.scratch_scope`` (per-tile recycling);
* ``runtime``   the ``tl`` API (load/store/dot/composite/ref/trans/MATH/send/recv/...);
* ``kernel_registry`` the kernel registry and ``run_kernel``, registered as the PE
                CPU's KernelLaunch handler (actors/ahbm/cpu.py stays hardware-only);
* ``launcher``  KernelLaunch messages for a grid of PEs, sent by the machine's host
                (``io/host``, actors/ahbm/host.py; protocols/ahbm_tl.py);
* ``workloads`` the baseline attention workloads (``WORKLOADS``), on the machine
                built by actors/ahbm/builder.py.
"""

__all__: list[str] = []
