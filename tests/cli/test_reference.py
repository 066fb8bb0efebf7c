"""towers/docs/cli.md, the command-line reference, held against the parsers it describes."""
import pathlib
import re

import pytest

from towers.cli.parsers import build_parser

REFERENCE = pathlib.Path(__file__).resolve().parents[2] / 'towers' / 'docs' / 'cli.md'
FLAG = re.compile(r'--[a-z][a-z0-9-]*')


def _commands():
    return build_parser()._subparsers._group_actions[0].choices


def _options(parser):
    """{option: default} of a parser and of its own subcommands (data convert, ...)."""
    options, parsers = {}, [parser]
    while parsers:
        for action in parsers.pop()._actions:
            if action.dest == 'command' or getattr(action, '_name_parser_map', None):
                parsers.extend(action.choices.values())
                continue
            for option in action.option_strings:
                if option.startswith('--') and option != '--help':
                    options[option] = action.default
    return options


def _table(command):
    """{option: its default cell} of the options table of `towers COMMAND`'s section."""
    section = re.search(r'^## `towers %s`\n(.*?)(?=^## )' % command, REFERENCE.read_text(),
                        re.S | re.M).group(1)
    rows = {}
    for line in section.splitlines():
        if line.startswith('| `--'):
            name, default = line.split('|')[1:3]
            for option in FLAG.findall(line):  # named in the row: its own, or beside another
                rows.setdefault(option, default.strip() if option in name else None)
    return rows


@pytest.mark.parametrize('command', ['train', 'bench'])
def test_the_options_table_lists_every_option_and_no_other(command):
    table, options = _table(command), _options(_commands()[command])
    assert set(options) - set(table) == set(), 'options the table lacks'
    assert {o for o in table if o not in options and table[o] is not None} == set(), \
        'rows of options the command does not have'


def _literal(cell):
    """The one value a default cell says ('`adam`', '100', '0.9'), or None for prose."""
    match = re.fullmatch(r'`?(-?[\w.,]+)`?', cell or '')
    return match and match.group(1)


@pytest.mark.parametrize('command', ['train', 'bench'])
def test_a_default_the_table_states_is_the_parsers(command):
    options, compared = _options(_commands()[command]), 0
    for option, cell in _table(command).items():
        said, default = _literal(cell), options.get(option)
        if said is None or default is None or isinstance(default, bool):
            continue
        compared += 1
        if isinstance(default, (int, float)):
            assert float(said) == default, (option, cell, default)
        else:
            assert said == default, (option, cell, default)
    assert compared >= 10


def test_every_option_of_every_command_is_named_in_the_reference():
    text = REFERENCE.read_text()
    named = set(FLAG.findall(text))
    missing = {command: sorted(set(_options(parser)) - named)
               for command, parser in _commands().items()}
    assert {c: m for c, m in missing.items() if m} == {}
