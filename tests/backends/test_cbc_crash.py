"""A CBC process that dies of a signal is run once more; a second crash is an error, not a hang."""

import os
import stat

import pulp
import pytest

from pipeopt.backends import pulp as door


def _model():
    prob = pulp.LpProblem("tiny", pulp.LpMinimize)
    x = pulp.LpVariable("x", 0, 3, cat=pulp.LpInteger)
    y = pulp.LpVariable("y", 0, 3, cat=pulp.LpInteger)
    prob += 2 * x + 3 * y
    prob += x + y >= 2.5
    return prob


def _crashing_cbc(tmp_path, crashes: int) -> str:
    """A wrapper that segfaults its first ``crashes`` runs, then runs the real CBC."""
    real = door._cbc_path()  # before the patch
    count = tmp_path / "count"
    count.write_text("0")
    script = tmp_path / "cbc"
    script.write_text(
        "#!/bin/sh\n"
        f'n=$(cat "{count}")\n'
        f'echo $((n + 1)) > "{count}"\n'
        f'if [ "$n" -lt {crashes} ]; then kill -SEGV $$; fi\n'
        f'exec "{real}" "$@"\n'
    )
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    return str(script)


def test_one_crash_is_run_again_and_said(tmp_path, monkeypatch):
    wrapper = _crashing_cbc(tmp_path, 1)
    monkeypatch.setattr(door, "_cbc_path", lambda: wrapper)
    out = door.solve_pulp(_model(), solver="cbc")
    assert out.status == "optimal"
    assert out.objective == pytest.approx(6.0)  # x = 3, y = 0
    assert any("crashed once (SIGSEGV)" in n for n in out.notes)


def test_two_crashes_are_an_error_naming_the_signal(tmp_path, monkeypatch):
    wrapper = _crashing_cbc(tmp_path, 2)
    monkeypatch.setattr(door, "_cbc_path", lambda: wrapper)
    with pytest.raises(RuntimeError, match="CBC crashed \\(SIGSEGV"):
        door.solve_pulp(_model(), solver="cbc")
    assert int((tmp_path / "count").read_text()) == 2
    assert os.path.exists(tmp_path / "cbc")


def test_a_crash_after_the_deadline_is_no_solution_not_an_error(monkeypatch):
    """CI saw CBC segfault at the end of a 1 s solve: with no time to run it again, the door
    reports that nothing was proven (as at a deadline) and names the crash."""
    from pipeopt.backends.deadline import Deadline

    calls = []

    def crash_late(workdir, mps, mip, deadline, *args):
        calls.append(1)
        while not deadline.expired():
            pass
        raise door.CbcCrashed(-11, "log")

    monkeypatch.setattr(door, "_run_cbc", crash_late)
    out = door.solve_pulp(_model(), solver="cbc", deadline=Deadline(0.05))
    assert out.status == "no_solution" and out.objective is None and out.bound is None
    assert any("SIGSEGV" in n and "nothing proven" in n for n in out.notes)
    assert calls == [1]
