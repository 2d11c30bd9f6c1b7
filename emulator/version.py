"""The emulator's version (one place: ``emulator.__version__``, the trace header, ``emu --version``)."""
__version__ = "0.1.0"
