"""One run: the plan, the build and run, the result bundle, the progress line, plots, component declarations."""
