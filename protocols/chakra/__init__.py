"""The MLCommons Chakra execution-trace schema (generated classes) and its file framing (io.py)."""
