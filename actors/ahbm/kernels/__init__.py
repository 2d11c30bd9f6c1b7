"""``tl`` kernels of the AHBM machine (seed ADR-0060 and the baselines of its §A)."""

__all__: list[str] = []
