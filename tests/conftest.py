"""Shared fixtures: the real PipeDream profiles from ../shared/data (never copied here)."""

from __future__ import annotations

import functools
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

ROOT = Path(__file__).resolve().parent.parent
PROFILE_DIR = ROOT.parent / "shared" / "data" / "pipedream-profiles"
PROFILES = sorted(p.stem for p in PROFILE_DIR.glob("*.txt") if p.stem != "LICENSE")


@functools.lru_cache(maxsize=None)
def profile(name: str, devices: int = 16):
    """A PipeDream profile read as an Instance on ``devices`` identical GPUs (cached)."""
    from pipeopt.io.pipedream import read_pipedream

    return read_pipedream(PROFILE_DIR / f"{name}.txt", devices=devices)


@pytest.fixture(scope="session")
def profile_dir() -> Path:
    if not PROFILE_DIR.exists():
        pytest.skip("../shared/data/pipedream-profiles is not present")
    return PROFILE_DIR
