"""Benchmarks: emu bench engine/machine, side-by-side A/B, instruction counts, the SimPy peer."""
