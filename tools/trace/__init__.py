"""Tools over recorded traces: summary and critical path, compact columns, diff, Perfetto export, replay, compare."""
