"""Gemma 3N model configs (YAML, schema-validated like every other input).

A config holds the shapes of one Gemma 3N decoder (HF ``Gemma3nTextConfig``
names where they exist, reference §4.1) plus the decode-time options the
compiler needs (KV dtype, ring cap, sink/window).  ``scenarios/pccx/gemma3n/models/``
ships ``e4b.yaml`` (the real E4B shapes) and small same-structure configs for
fast runs.  A workload names a config by file stem (``e4b``) or by path.
"""
from __future__ import annotations

from pathlib import Path

from emulator.schema import Bool, Enum, Float, Int, Map, Str, load_yaml, read_text, validate

__all__ = ["CONFIG_SCHEMA", "MODELS_DIR", "load_config", "global_layer", "kv_source"]

MODELS_DIR = Path(__file__).resolve().parents[3] / "scenarios" / "pccx" / "gemma3n" / "models"


def _cross(c: dict):
    """Cross-field rules: GQA divides, the KV-shared layers have a local and a global producer."""
    out = []
    if c["num_heads"] % c["num_kv_heads"]:
        out.append((["num_kv_heads"], f"a divisor of num_heads ({c['num_heads']})", c["num_kv_heads"]))
    first_shared = c["num_layers"] - c["num_kv_shared_layers"]
    if c["num_kv_shared_layers"] and first_shared < c["global_every"]:
        out.append((["num_kv_shared_layers"], f"at most num_layers - global_every ({c['num_layers'] - c['global_every']})"
                    " so a local and a global producer layer exist", c["num_kv_shared_layers"]))
    if c["sparse_layers"] > c["num_layers"]:
        out.append((["sparse_layers"], f"at most num_layers ({c['num_layers']})", c["sparse_layers"]))
    if c["kv"]["sink"] >= c["kv"]["max_tokens"]:
        out.append((["kv", "sink"], f"less than kv.max_tokens ({c['kv']['max_tokens']})", c["kv"]["sink"]))
    return out


CONFIG_SCHEMA = Map({
    "name": Str(),
    "description": Str(default=""),
    "hidden": Int(min=8, max=65535, doc="D (HF hidden_size)"),
    "num_layers": Int(min=1, max=64),
    "num_heads": Int(min=1, doc="query heads"),
    "num_kv_heads": Int(min=1),
    "head_dim": Int(min=8, max=2048),
    "ffn": Int(min=8, max=65535, doc="intermediate_size (every layer)"),
    "vocab": Int(min=2, doc="embedding / LM head rows (tied)"),
    "ple_vocab": Int(min=2, doc="vocab_size_per_layer_input"),
    "ple_dim": Int(min=1, doc="hidden_size_per_layer_input"),
    "altup_inputs": Int(min=2, max=8, doc="AltUp streams (altup_num_inputs)"),
    "laurel_rank": Int(min=1),
    "num_kv_shared_layers": Int(min=0, doc="the last N layers reuse the caches of the last local/global producer"),
    "global_every": Int(min=1, doc="layer i is global (full attention, rope_theta) when (i+1) % global_every == 0"),
    "rope_theta_local": Float(min=1),
    "rope_theta_global": Float(min=1),
    "sliding_window": Int(min=1, doc="HF sliding window of local layers (used only when kv.sliding_window is on)"),
    "sparse_layers": Int(min=0, doc="layers 0..n-1 use the 0.95 activation sparsity (Gaussian top-k)"),
    "sparsity_z": Float(default=1.6448536, doc="cutoff = mean + z * std (z of 0.95)"),
    "softcap": Float(min=0, doc="final logit softcap (0 = none)"),
    "rms_eps": Float(min=0, default=1e-6),
    "kv": Map({
        "dtype": Enum(["fp16", "int8", "int4"], doc="KV cache element type in host DDR (scales per token for int)"),
        "max_tokens": Int(min=1, doc="pccx_kv_init hard cap (ring slots)"),
        "sink": Int(min=0, default=4, doc="attention-sink entries kept when the ring wraps"),
        "sliding_window": Bool(default=False, doc="apply the HF 512-token window to local layers"),
    }),
}, check=_cross)


def load_config(ref: str, overrides: dict | None = None) -> dict:
    """A validated config: ``ref`` is a stem of MODELS_DIR (``e4b``) or a YAML path; ``overrides`` deep-merged."""
    from emulator.scenario import deep_merge

    p = Path(ref)
    path = p if p.suffix in (".yaml", ".yml") or p.exists() else MODELS_DIR / f"{ref}.yaml"
    doc = load_yaml(read_text(str(path)), str(path))
    doc.value = deep_merge(doc.value or {}, overrides or {})
    return validate(CONFIG_SCHEMA, doc)


def global_layer(c: dict, i: int) -> bool:
    """Full attention (global θ) layer: ``(i+1) % global_every == 0`` (HF layer_types, reference §4.1)."""
    return (i + 1) % c["global_every"] == 0


def kv_source(c: dict, i: int) -> int:
    """The layer whose KV cache layer ``i`` reads: itself, or for the last ``num_kv_shared_layers`` layers
    the last producer layer of the same type (E4B: 18 local, 19 global; HF kv_sharing, reference §4.1)."""
    first = c["num_layers"] - c["num_kv_shared_layers"]
    if i < first:
        return i
    want = global_layer(c, i)
    return max(j for j in range(first) if global_layer(c, j) == want)
