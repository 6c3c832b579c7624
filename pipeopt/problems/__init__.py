"""The problems pipeopt solves, one folder each: its problem class, exact methods and baselines side by side."""
