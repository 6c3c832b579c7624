"""The compact per-stage cells of ``benchmarks/recompute.py`` (recompute sets, memory per stage)."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import SimpleNamespace

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("bench_recompute", ROOT / "benchmarks" / "recompute.py")
bench = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(bench)
GIB = 2**30


def test_ranges_and_compact_sets():
    assert bench.ranges([5, 0, 2, 1, 7, 8]) == "0-2,5,7-8"
    assert bench.compact(None) == "-" and bench.compact({}) == "-"
    rc = {"input": "full", "layer1_attn": "full", "layer2_attn": "full", "layer2_mlp": "full",
          "layer4_mlp": "selective", "layers.3": "full"}
    assert bench.compact(rc) == "input, attn 1-2, mlp 2, mlp 4 [selective], layers. 3"


def test_memory_cell_lists_every_stage():
    ev = SimpleNamespace(memory=[30.04 * GIB, 12.5 * GIB], memory_capacity=[37.253 * GIB] * 2)
    assert bench.memory_cell(ev) == "30.0/12.5 of 37.3"
    ev = SimpleNamespace(memory=[1 * GIB, 2 * GIB], memory_capacity=[4 * GIB, 8 * GIB])
    assert bench.memory_cell(ev) == "1.0/2.0 of 4.0/8.0"
