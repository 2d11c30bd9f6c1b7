"""Robustness: fault campaigns and scenario fuzzing."""
