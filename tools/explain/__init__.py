"""Explain a run: what limits it (limits.py), where its time went by kernel line or program stage
(profile.py), what a faster part would buy (whatif.py).  docs/explain.md."""
