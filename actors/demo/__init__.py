"""The demo machine (token ring, 2-level reduce-to-root) used to exercise the engine."""
