"""Solver doors shared by every problem: one deadline, one PuLP door, one CP-SAT door, one bisection on T."""
