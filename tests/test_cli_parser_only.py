"""``pipeopt CMD ...`` builds only CMD's parser (start-up, issue 22): its parsing, ``--help`` and
usage errors must be the full parser's, and ``pipeopt --help`` must still list every command."""

import contextlib
import io

import pytest

from pipeopt.cli import COMMANDS, build_parser, main


def _run(parser, argv):
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            ns = parser.parse_args(argv)
        except SystemExit as exc:
            return ("exit", exc.code, out.getvalue(), err.getvalue())
    return ("ok", vars(ns), out.getvalue(), err.getvalue())


def test_commands_are_the_full_parsers_subcommands():
    choices = build_parser()._subparsers._group_actions[0].choices
    assert tuple(choices) == COMMANDS


@pytest.mark.parametrize("command", COMMANDS)
@pytest.mark.parametrize("rest", [["--help"], [], ["--no-such-option"], ["x.json", "--stages", "0"],
                                  ["x.json", "--stages", "4"], ["x.json", "plan.json", "--json"]])
def test_only_parser_matches_full(command, rest, monkeypatch):
    monkeypatch.setenv("COLUMNS", "100")
    argv = [command, *rest]
    assert _run(build_parser(command), argv) == _run(build_parser(), argv)


def test_top_level_help_and_wrong_command_unchanged(capsys):
    assert main(["--help"]) == 0
    out = capsys.readouterr().out
    for command in COMMANDS:
        assert command in out
    assert main(["no-such-command"]) == 2
    assert "invalid choice: 'no-such-command'" in capsys.readouterr().err
