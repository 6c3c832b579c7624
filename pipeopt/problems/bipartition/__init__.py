"""Bi-Partition (Cui et al.): separate forward and backward cuts."""

from __future__ import annotations

from .problem import BipartitionProblem as BipartitionProblem
