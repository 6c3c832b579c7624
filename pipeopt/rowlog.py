"""The bench's rows on disk while a sweep runs, and what a resumed sweep keeps of them.

:class:`RowLog` appends one CSV line per finished solve and flushes it, so a sweep that is
killed leaves a valid partial file (the columns of :data:`pipeopt.bench.COLUMNS`;
``best_bound`` and ``gap`` stay empty until the sweep ends and the bench rewrites the file in
task order). :func:`resume` reads such a file back and hands each task its row.

A row belongs to a task when instance, problem, stages, workers and method agree; when several
tasks agree on those (the partition DP in the one-order and the replicated-one-order space), the
row's space must be the task's, or else a larger space that no task of the same key has (a
method may state a larger space than it was run in: PipeDream's ``replicated-convex`` plans of
a ``replicated-one-order`` task; :func:`pipeopt.problems.spaces.contains`).
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path

import pandas as pd

from .errors import InvalidProblemError, ReadError
from .problems import spaces

TaskKey = tuple  # (instance, problem, stages or None, workers or None, method)

STATUSES = ("optimal", "feasible", "time_limit", "infeasible", "skipped", "error")


def _count(x) -> int | None:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return None
    return int(x)


def key(instance: str, problem: str, stages, workers, method: str) -> TaskKey:
    """The key a task and its row share (``stages`` / ``workers``: an int, or None / NaN)."""
    return (str(instance), str(problem), _count(stages), _count(workers), str(method))


class RowLog:
    """A CSV of bench rows that grows by one flushed line per :meth:`append`.

    Parameters
    ----------
    path
        The CSV file.
    columns
        Column names, in order (the bench's ``COLUMNS``).
    append
        Keep the rows already in ``path`` (a resumed sweep) instead of starting it afresh.

    Raises
    ------
    ReadError
        If ``append`` and the file's header is not ``columns``.
    OSError
        If the file cannot be opened.
    """

    def __init__(self, path: str | Path, columns: Sequence[str], *, append: bool = False):
        self.path = Path(path)
        self.columns = list(columns)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        header = ",".join(self.columns)
        fresh = not (append and self.path.exists() and self.path.stat().st_size > 0)
        if not fresh:
            with open(self.path, encoding="utf-8") as fh:
                first = fh.readline().rstrip("\r\n")
            if first != header:
                raise ReadError(f"{self.path} has other columns than the bench writes ({first[:80]!r}); "
                                "rows cannot be appended to it")
        self._fh = open(self.path, "w" if fresh else "a", newline="", encoding="utf-8")
        if fresh:
            self._fh.write(header + "\n")
            self._fh.flush()

    def append(self, row: dict) -> None:
        """Write ``row`` (missing columns empty) as one line, and flush it."""
        text = pd.DataFrame([row]).reindex(columns=self.columns).to_csv(header=False, index=False)
        self._fh.write(text)
        self._fh.flush()

    def close(self) -> None:
        self._fh.close()

    def __enter__(self) -> RowLog:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _drop_partial_line(path: Path) -> bool:
    """Cut a last line that a killed writer left unfinished (no newline); True if it did."""
    data = path.read_bytes()
    if not data or data.endswith(b"\n"):
        return False
    with open(path, "r+b") as fh:
        fh.truncate(data.rfind(b"\n") + 1)
    return True


def resume(path: str | Path, tasks: Sequence[tuple[TaskKey, str]], read) -> dict[int, dict]:
    """The rows of ``path`` that tasks of this sweep can keep: ``{task index: row}``.

    Parameters
    ----------
    path
        A CSV written by :class:`RowLog` or by the bench (a missing or empty file: no rows).
    tasks
        ``(key, space)`` of every task of the sweep, in task order (:func:`key`).
    read
        ``read(path) -> DataFrame``: the bench's row reader (checks the columns).

    Raises
    ------
    ReadError
        If the file is not a bench CSV, or a row of it is incomplete.
    InvalidProblemError
        If a row belongs to no task of this sweep (the file was written with other
        instances, sizes or methods): resume with the options that wrote it, or another file.
    """
    path = Path(path)
    if not path.exists() or path.stat().st_size == 0:
        return {}
    if _drop_partial_line(path):
        print(f"note: dropped the unfinished last line of {path}")
    df = read(path)
    bad = df.index[~df["status"].isin(STATUSES)]
    if len(bad):
        raise ReadError(f"{path}: row {int(bad[0]) + 2} is not a complete bench row (status {df['status'][bad[0]]!r})")
    rows = [_typed(r) for r in df.to_dict("records")]
    by_key: dict = defaultdict(list)  # key -> row numbers, in file order
    for n, r in enumerate(rows):
        by_key[key(r["instance"], r["problem"], r["stages"], r["workers"], r["method"])].append(n)
    shared = defaultdict(int)
    spaces_of = defaultdict(set)  # key -> the spaces of its tasks
    for k, space in tasks:
        shared[k] += 1
        spaces_of[k].add(space)
    kept: dict[int, dict] = {}
    for same in (True, False):  # the rows of a task's own space first, then of a larger one
        for t, (k, space) in enumerate(tasks):
            if t in kept:
                continue
            for n in by_key.get(k, ()):
                s = str(rows[n]["space"])
                own = shared[k] == 1 or s == space
                larger = s not in spaces_of[k] and spaces.contains(s, space)
                if own if same else larger:
                    kept[t] = rows[n]
                    by_key[k].remove(n)
                    break
    left = [n for ns in by_key.values() for n in ns]
    if left:
        r = rows[left[0]]
        raise InvalidProblemError(
            f"{path} holds {len(left)} row(s) of no task of this sweep (e.g. {r['instance']} {r['problem']} "
            f"{r['method']} S={_count(r['stages'])} q={_count(r['workers'])}, file row {left[0] + 2}): "
            "resume with the instances, sizes and methods that wrote it, or write to another --out"
        )
    return kept


def _typed(row: dict) -> dict:
    """A row read from CSV with the types the bench writes (counts int, ``exact`` bool, note str)."""
    row = dict(row)
    for c in ("layers", "units", "stages", "workers"):
        v = _count(row.get(c))
        row[c] = math.nan if v is None else v
    exact = row.get("exact")
    row["exact"] = exact if isinstance(exact, bool) else str(exact).strip().lower() == "true"
    note = row.get("note")
    row["note"] = "" if note is None or (isinstance(note, float) and math.isnan(note)) else str(note)
    return row
