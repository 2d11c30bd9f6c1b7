"""The pccx v002 NPU (DESIGN.md §5): actors, machine builder, host driver, programs."""
