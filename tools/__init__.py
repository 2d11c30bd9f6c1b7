"""The ``emu`` command line and the tools over runs and traces."""
