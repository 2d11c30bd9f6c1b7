"""Gemma 3N decode on the pccx v002 machine: model configs, the KV ring, the compiler, the workload."""
