"""The command line's two spellings: the grouped one (`runner job status`) that `runner --help`
teaches, and the earlier flat one (`runner status`) that scripts were written for. Every check
here walks the parser itself, so a command added later is covered without editing this file;
the flat spellings are the record in tests/fixtures/cli-flat-spellings.json, taken from the
parser before the grouping (they never change: they are what must keep working)."""

from __future__ import annotations

import argparse
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from runner import cli, client
from tests.support import ROOT, run_cli, write_contract

FLAT: dict[str, dict[str, Any]] = json.loads(
    (ROOT / "tests" / "fixtures" / "cli-flat-spellings.json").read_text()
)["commands"]


def _leaves(
    parser: argparse.ArgumentParser, path: tuple[str, ...] = ()
) -> Iterator[tuple[tuple[str, ...], argparse.ArgumentParser]]:
    """Every command of ``parser`` (a parser with no subcommands) and the words that name it."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from _leaves(sub, (*path, name))
            return
    yield path, parser


LEAVES = dict(_leaves(cli.build_parser()))


def _routing(parser: argparse.ArgumentParser) -> set[str]:
    """The dests that only say which subcommand was chosen (``command``, ``job_command``)."""
    found: set[str] = set()
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            found.add(action.dest)
            for sub in action.choices.values():
                found |= _routing(sub)
    return found


ROUTING = _routing(cli.build_parser())


def _value(action: argparse.Action) -> list[str]:
    """Words that fill ``action`` (a sample its type and choices accept)."""
    if action.nargs == 0:
        return []
    one = str(next(iter(action.choices))) if action.choices else "1" if action.type else "x.json"
    count = action.nargs if isinstance(action.nargs, int) else 1
    return [one] * count


def _argvs(parser: argparse.ArgumentParser) -> Iterator[list[str]]:
    """Command lines for ``parser``'s command: its positionals and required options, then
    those with each other option in turn (one at a time: some exclude each other)."""
    base: list[str] = []
    optional: list[argparse.Action] = []
    for action in parser._actions:
        if isinstance(action, argparse._HelpAction):
            continue
        if not action.option_strings:
            base += _value(action)
        elif action.required:
            base += [action.option_strings[-1], *_value(action)]
        else:
            optional.append(action)
    yield base
    for action in optional:
        yield [*base, action.option_strings[-1], *_value(action)]


def _parse(words: list[str]) -> dict[str, Any]:
    """What dispatch parses ``words`` into (after the spelling and with the parser it builds
    lazily), less the routing dests."""
    words = cli.spelled(words)
    command = words[0]
    action = words[1] if command in cli._GROUPS else None
    args = cli.build_parser(only=command, action=action).parse_args(words)
    return {k: v for k, v in vars(args).items() if k not in ROUTING}


def test_every_command_of_the_grouped_layout_is_reached_by_dispatch_as_by_the_full_parser() -> None:
    """For every command and every one of its options: the parser dispatch builds (only that
    command's module) gives what the full parser (the one completion is made from) gives."""
    full = cli.build_parser()
    assert len(LEAVES) >= len(FLAT)
    for path, parser in LEAVES.items():
        assert callable(parser.get_default("func")), path
        for argv in _argvs(parser):
            want = vars(full.parse_args([*path, *argv]))
            assert _parse([*path, *argv]) == {k: v for k, v in want.items() if k not in ROUTING}


@pytest.mark.parametrize("flat", sorted(FLAT))
def test_every_flat_spelling_reaches_its_command_with_every_option_it_had(flat: str) -> None:
    """`runner status JOB` is `runner job status JOB`: the same function, the same positionals,
    every option string it accepted, and the same parse for each option of the grouped
    command (the rewrite touches only the first words)."""
    was = FLAT[flat]
    old = flat.split()
    new = tuple(cli.spelled([*old, "x.json"])[:-1])
    assert new in LEAVES, (flat, new)
    parser = LEAVES[new]
    assert parser.get_default("func").__name__ == was["func"]
    assert [a.dest for a in parser._actions if not a.option_strings] == was["positionals"]
    options = {s for a in parser._actions for s in a.option_strings}
    assert set(was["options"]) <= options, set(was["options"]) - options
    for argv in _argvs(parser):
        assert _parse([*old, *argv]) == _parse([*new, *argv]), (flat, argv)


def test_every_alias_names_a_command_and_every_flat_command_has_its_spelling() -> None:
    for old, new in cli.ALIASES.items():
        assert new in LEAVES, (old, new)
        assert " ".join(old) in FLAT or old == ("ledger",), old  # no new flat spelling is made
    grouped = {" ".join(path) for path in LEAVES}
    for flat in FLAT:
        assert flat in grouped or tuple(flat.split()) in cli.ALIASES, flat


@pytest.mark.parametrize(
    ("given", "spelled"),
    [
        (["verify", "task.json"], ["verify", "contract", "task.json"]),
        (["verify", "--json", "task.json"], ["verify", "contract", "--json", "task.json"]),
        (["verify", "result", "job"], ["verify", "result", "job"]),
        (["verify", "--help"], ["verify", "--help"]),
        (["verify"], ["verify"]),
        (["ledger", "verify", "job"], ["verify", "ledger", "job"]),
        (["ledger", "--help"], ["verify", "ledger", "--help"]),
        (["status", "verify"], ["job", "status", "verify"]),  # only the first words
        (["job", "status", "x"], ["job", "status", "x"]),
        (["run", "status"], ["run", "status"]),
        ([], []),
    ],
)
def test_the_spelling_rewrites_only_an_earlier_spellings_first_words(
    given: list[str], spelled: list[str]
) -> None:
    assert cli.spelled(given) == spelled


def _group(parser: argparse.ArgumentParser, name: str) -> argparse.ArgumentParser:
    (sub,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    found: argparse.ArgumentParser = sub.choices[name]
    return found


def test_the_listings_of_each_group_are_its_full_parsers() -> None:
    """`runner job --help` builds only the names of the group's commands, from the table: its
    help, usage and choices are those of the group built in full."""
    for group in cli._GROUPS:
        full = _group(cli.build_parser(only=group), group)
        listed = _group(cli.build_parser(only=group, listing=True), group)
        assert listed.format_help() == full.format_help(), group
        assert listed.format_usage() == full.format_usage(), group
        assert [p for p, _ in _leaves(listed)] == [p for p, _ in _leaves(full)] != [()]


def test_the_completion_script_offers_the_grouped_spellings() -> None:
    proc = run_cli("completion", "bash")
    assert proc.returncode == 0, proc.stderr
    top = [w for w, (_, _) in cli._TABLE.items()]
    assert f"_shtab_runner_subparsers=({' '.join(top)})" in proc.stdout
    for group, (_, actions) in cli._GROUPS.items():
        assert f"_shtab_runner_{group}_subparsers=({' '.join(actions)})" in proc.stdout


def test_the_client_serves_run_and_verify_contract_only() -> None:
    served = [["run", "t.json"], ["verify", "t.json"], ["verify", "contract", "t.json"], ["verify"]]
    for given in served:
        assert client.served(given), given
    for given in (["verify", "result", "j"], ["verify", "bundle", "b"], ["verify", "ledger", "j"],
                  ["verify-result", "j"], ["job", "status", "j"], []):  # fmt: skip
        assert not client.served(given), given


def test_top_level_help_teaches_the_groups_and_lists_the_earlier_spellings() -> None:
    proc = run_cli("--help")
    assert proc.returncode == 0, proc.stderr
    text = " ".join(proc.stdout.split())  # as wrapped for any terminal's width
    for group, (_, actions) in cli._GROUPS.items():
        assert f"{group} " in text and " | ".join(actions) in text, group  # its commands named
    assert "earlier spellings" in text
    for old, new in cli.ALIASES.items():
        if old != ("ledger",):
            assert f"{' '.join(old)} = {' '.join(new)}" in text


def test_verify_contract_and_its_flat_spelling_say_the_same(tmp_path: Path) -> None:
    """End to end, no engine: the grouped spelling and the flat one print the same findings
    and exit with the same code; so do a refusal's."""
    contract = write_contract(tmp_path, "sha256:" + "ab" * 32)
    env = {"RUNNER_SERVER": "off", "RUNNER_CONFIG_DIR": str(tmp_path / "config")}
    new = run_cli("verify", "contract", str(contract), "--allow-unsigned", "--json", env=env)
    old = run_cli("verify", str(contract), "--allow-unsigned", "--json", env=env)
    assert new.returncode == old.returncode == 0, new.stderr
    assert json.loads(new.stdout) == json.loads(old.stdout)
    assert json.loads(new.stdout)["valid"] is True
    refused_new = run_cli("verify", "contract", str(contract), "--json", env=env)
    refused_old = run_cli("verify", "--json", str(contract), env=env)
    assert refused_new.returncode == refused_old.returncode == 3
    assert refused_new.stdout == refused_old.stdout


def test_grouped_help_and_usage_errors_end_to_end(tmp_path: Path) -> None:
    fetch = run_cli("cache", "fetch", "--help")
    assert fetch.returncode == 0 and fetch.stdout.startswith("usage: runner cache fetch")
    old = run_cli("fetch", "--help")
    assert old.returncode == 0 and old.stdout == fetch.stdout
    job = run_cli("job", "--help")
    assert job.returncode == 0 and "regrade" in job.stdout and "parse = job regrade" in job.stdout
    assert run_cli("job").returncode == 2
    bad = run_cli("job", "stats", "x")
    assert bad.returncode == 2 and "invalid choice: 'stats'" in bad.stderr
    env = {**os.environ, "RUNNER_STATE_DIR": str(tmp_path)}
    for words in (["job", "status", "no-such-job"], ["status", "no-such-job"]):
        proc = run_cli(*words, "--state-dir", str(tmp_path), env=env)
        assert proc.returncode == 5 and "job_not_found" in proc.stderr, words


def test_dispatch_imports_only_the_module_of_the_command_given() -> None:
    """`runner verify bundle X` imports bundle.py alone; `runner job --help` (a group's
    listing) no command module at all."""
    import subprocess
    import sys

    script = (
        "import sys\nfrom runner import cli\n"
        "cli.build_parser(only='job', listing=True)\n"
        "print(sorted(m for m in sys.modules if m.startswith('runner.cli.')))\n"
        "cli.build_parser(only='verify', action='bundle')\n"
        "print(sorted(m for m in sys.modules if m.startswith('runner.cli.')))\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, check=True, cwd=ROOT
    )
    listing, one = proc.stdout.splitlines()
    assert listing == "['runner.cli._common']"
    assert one == "['runner.cli._common', 'runner.cli.bundle']"


def test_a_lease_shorter_than_three_heartbeats_or_ten_seconds_is_refused_naming_both() -> None:
    """`runner run --lease` and `runner cluster submit --lease` (which passes it to the node's
    runner): a lease the runner would take its own slow moment for is a usage error."""
    from runner.cli._common import checked_lease

    assert checked_lease(None, 5.0) is None
    assert checked_lease(15.0, 5.0) == 15.0
    for lease, heartbeat in ((14.9, 5.0), (9.0, 1.0), (float("nan"), 5.0)):
        with pytest.raises(SystemExit) as exc:
            checked_lease(lease, heartbeat)
        assert exc.value.code == 2
