"""Parameter sweeps: the sweep file, one point, the backends (pool, Ray), results, best choice, plots, progress."""
