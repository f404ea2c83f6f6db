"""The one action format: parsing, canonical spelling, and that bad text never raises anything else."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from envs.actions import (
    MAX_ACTION_CHARS,
    ActionParseError,
    ToolCall,
    bind_arguments,
    format_action,
    parse_action,
)


@pytest.mark.parametrize(
    "text, expected",
    [
        ("probe(2)", ToolCall("probe", (2,))),
        ("  answer( 5 )\n", ToolCall("answer", (5,))),
        ('cat("Lib/os.py")', ToolCall("cat", ("Lib/os.py",))),
        ("grep(pattern='a b', path='.', recursive=True)", ToolCall("grep", (), (("pattern", "a b"), ("path", "."), ("recursive", True)))),
        ("head('x', n=-3)", ToolCall("head", ("x",), (("n", -3),))),
        ("ls()", ToolCall("ls")),
        ("cat('café 🚀')", ToolCall("cat", ("café 🚀",))),
    ],
)
def test_parse(text, expected):
    assert parse_action(text) == expected


@pytest.mark.parametrize(
    "text, fragment",
    [
        ("", "empty"),
        ("probe", "single tool call"),
        ("probe(1", "could not parse"),
        ("os.system('ls')", "single tool call"),
        ("probe(1); answer(2)", "could not parse"),
        ("probe(x)", "literal"),
        ("probe(__import__('os'))", "literal"),
        ("probe(*a)", "literal"),
        ("probe(**a)", "not allowed"),
        ("cat([1, 2])", "literal"),
        ("probe(1)\nanswer(2)", "could not parse"),
        ("cat('a\x00b')", "NUL"),
        ("x(" + "(" * 300 + ")" * 300 + ")", "could not parse"),
        ("p(" + "1," * MAX_ACTION_CHARS + ")", "limit"),
    ],
)
def test_parse_errors_explain(text, fragment):
    with pytest.raises(ActionParseError) as err:
        parse_action(text)
    assert fragment in str(err.value)


def test_non_text_action_is_a_parse_error():
    with pytest.raises(ActionParseError, match="must be text"):
        parse_action(["probe(1)"])


def test_canonical_round_trip():
    text = format_action("grep", "def main", path=".", n=3)
    assert text == "grep('def main', path='.', n=3)"
    assert parse_action(text).text() == text


def test_bind_arguments():
    call = parse_action("grep('x', path='.')")
    assert bind_arguments(call, ["pattern", "path"]) == {"pattern": "x", "path": "."}
    with pytest.raises(ActionParseError, match="no argument 'nope'"):
        bind_arguments(parse_action("grep(nope=1)"), ["pattern", "path"])
    with pytest.raises(ActionParseError, match="twice"):
        bind_arguments(parse_action("grep('x', pattern='y')"), ["pattern", "path"])
    with pytest.raises(ActionParseError, match="at most 2"):
        bind_arguments(parse_action("grep(1, 2, 3)"), ["pattern", "path"])


@settings(max_examples=500, deadline=None)
@given(st.text(max_size=300))
def test_arbitrary_text_parses_or_raises_action_parse_error(text):
    try:
        call = parse_action(text)
    except ActionParseError as exc:
        assert str(exc)
    else:
        assert isinstance(call, ToolCall) and call.name.isidentifier()


def test_a_keyword_called_name_is_an_argument_like_any_other():
    """``find(name='*.py')`` is a documented FileQA action: formatting it once raised a TypeError."""
    from envs.actions import format_action, parse_action

    call = parse_action("find('Lib', name='*.py')")
    assert call.text() == "find('Lib', name='*.py')"
    assert format_action("find", name="x") == "find(name='x')"
