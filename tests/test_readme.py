"""The README and docs/: the quickstarts run as written, their commands parse, every relative
link resolves inside the repository, the README stays short and lists every problem, and the
results pages are what ``benchmarks/make_docs.py`` writes."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
DOCS = sorted((ROOT / "docs").rglob("*.md"))
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
FENCE = re.compile(r"^```.*?^```", re.S | re.M)


def _exec_block(text: str, name: str) -> dict:
    """Run the first ```python block of ``text`` from the repository root; its namespace."""
    block = re.search(r"```python\n(.*?)```", text, re.S)
    assert block, f"{name} has no Python block"
    cwd = os.getcwd()
    os.chdir(ROOT)
    try:
        scope: dict = {}
        exec(compile(block.group(1), name, "exec"), scope)
    finally:
        os.chdir(cwd)
    return scope


def test_quickstart_runs(capsys):
    scope = _exec_block(README.read_text(), "README-quickstart")
    best, milp, heur, ev, conv = scope["best"], scope["milp"], scope["heur"], scope["ev"], scope["conv"]
    # claims, not proofs under a wall-clock limit: a bound never exceeds any plan's objective
    for r in (best, milp, conv):
        assert str(r.status) in ("optimal", "time_limit") and r.lower_bound is not None
        assert r.lower_bound <= r.objective * (1 + 1e-9)
    assert heur.objective >= best.lower_bound * (1 - 1e-12)
    assert milp.objective >= best.lower_bound * (1 - 1e-9) and best.objective >= milp.lower_bound * (1 - 1e-9)
    if str(best.status) == str(milp.status) == "optimal":
        assert milp.objective == pytest.approx(best.objective, rel=1e-6)
    assert ev.objective == heur.objective
    assert conv.space == "convex"
    assert best.method in str(best)  # the result names the method the default ran
    assert "gap" in capsys.readouterr().out


def test_readme_is_short():
    assert len(README.read_text().splitlines()) <= 200


def test_readme_keeps_the_two_setup_commands():
    text = README.read_text()
    setup = text[text.index("## Set-up"):text.index("## Quickstart")]
    commands = [line for line in setup.splitlines() if line.startswith("python3 -m venv .venv")]
    assert len(commands) == 2
    assert commands[0].endswith(".venv/bin/pipeopt bench")
    assert "-m pytest" in commands[1]
    ci = (ROOT / ".ci" / "run").read_text().strip().splitlines()[-1]
    assert ci.replace("pip install -q ", "pip install ") == commands[1], "CI must run the README's test command"


def _relative_links(path: Path) -> list[str]:
    text = FENCE.sub("", path.read_text())
    return [t for t in LINK.findall(text) if not re.match(r"[a-z][a-z0-9+.-]*:", t) and not t.startswith("#")]


@pytest.mark.parametrize("path", [README, *DOCS], ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_resolves_inside_the_repository(path):
    links = _relative_links(path)
    bad = []
    for target in links:
        file, _, anchor = target.partition("#")
        dest = (path.parent / file).resolve()
        if not dest.is_relative_to(ROOT) or not dest.exists():
            bad.append(target)
        elif anchor and dest.suffix == ".md" and anchor not in _anchors(dest):
            bad.append(target)
    assert not bad, f"{path.relative_to(ROOT)}: links that do not resolve inside the repository: {bad}"


def _anchors(path: Path) -> set[str]:
    """GitHub's anchors of a Markdown file's headings."""
    heads = re.findall(r"^#+\s+(.*)$", FENCE.sub("", path.read_text()), re.M)
    return {re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-") for h in heads}


def test_the_link_check_can_fail(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("[a](missing.md) [b](https://example.org) [c](#anchor) `[d](in-code.md)`\n"
                    "```\n[e](fenced.md)\n```\n")
    assert _relative_links(page) == ["missing.md", "in-code.md"]
    assert _anchors(ROOT / "docs" / "cost-model.md") >= {"objectives-the-schedule-exactly", "a-stages-compute-time"}


def test_docs_cite_no_file_outside_the_repository():
    for path in [README, *DOCS]:
        text = path.read_text()
        assert "DESIGN.md" not in text and "STYLE.md" not in text, path
        assert "../shared/" not in "".join(_relative_links(path)), path


def test_the_problem_table_lists_every_problem_and_method():
    from pipeopt import registry

    text = README.read_text()
    table = text[text.index("## Problems"):text.index("## Headline results")]
    rows = {m.group(1): m.group(0) for m in re.finditer(r"^\| `(\w+)` \|.*$", table, re.M)}
    assert "schedule" in rows
    for problem in registry.PROBLEMS:
        assert problem in rows, f"README's problem table has no row for {problem}"
        for m in registry.methods(problem):
            if m.default or m.exact:
                assert f"`{m.name}`" in rows[problem], f"README: {problem} row misses method {m.name}"


def test_readme_commands_parse():
    """Every ``pipeopt ...`` line of the README is accepted by the command's parser, and every
    path it names exists (the third-party data beside the clone included)."""
    from pipeopt.cli import build_parser

    parser = build_parser()
    text = README.read_text()
    lines = [ln.split("#", 1)[0].strip() for block in re.findall(r"```bash\n(.*?)```", text, re.S)
             for ln in block.splitlines()]
    cells = [c for row in re.findall(r"^\|.*\|$", text, re.M) for c in re.findall(r"`(pipeopt [^`]+)`", row)]
    commands = [c for c in lines + cells if c.startswith("pipeopt ") and "--help" not in c]
    assert len(commands) >= 10
    for cmd in commands:
        ns = parser.parse_args(shlex.split(cmd)[1:])
        inputs = getattr(ns, "paths", None) or ([ns.path] if getattr(ns, "path", None) else [])
        for arg in inputs:
            assert (ROOT / arg).exists(), f"{cmd}: {arg} does not exist"
    # the docs' command blocks parse too (their paths may be placeholders: FILE, gpt.json)
    for path in DOCS:
        for block in re.findall(r"```bash\n(.*?)```", path.read_text(), re.S):
            for line in block.splitlines():
                cmd = line.split("#", 1)[0].strip()
                if cmd.startswith("pipeopt "):
                    parser.parse_args(shlex.split(cmd)[1:])


def test_compare_a_heuristic_guide_runs(capsys):
    _exec_block((ROOT / "docs" / "guides" / "compare-a-heuristic.md").read_text(), "guide-compare")
    out = capsys.readouterr().out
    assert "optimum" in out and "gap" in out


def test_results_pages_are_generated_from_benchmarks_results():
    run = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "make_docs.py"), "--check"],
                         capture_output=True, text=True, cwd=ROOT)
    assert run.returncode == 0, run.stdout + run.stderr
