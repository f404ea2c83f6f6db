"""The one action format: parsing, canonical spelling, and that bad text never raises anything else."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from envs.action_input import is_legal
from envs.actions import (
    MAX_ACTION_CHARS,
    ActionParseError,
    ToolCall,
    bind_arguments,
    canonical_text,
    format_action,
    is_legal_action,
    parse_action,
)


@pytest.mark.parametrize(
    "text, expected",
    [
        ("probe(2)", ToolCall("probe", (2,))),
        ("  answer( 5 )\n", ToolCall("answer", (5,))),
        ('cat("Lib/os.py")', ToolCall("cat", ("Lib/os.py",))),
        ("grep(pattern='a b', path='.', recursive=True)",
         ToolCall("grep", (), (("pattern", "a b"), ("path", "."), ("recursive", True)))),
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


# ------------------------------------------------------------------ field case S43: legality by meaning
@pytest.mark.parametrize("spelling", ["ｐｒｏｂｅ(0)", "probe( 0 )", "probe(0x0)", "probe(0o0)", "probe(0b0)",
                                      "probe((0))", " probe(0)\n", "probe(+0)", "probe(-0)", "probe(0,)",
                                      "\U0001d429robe(0)"])
def test_field_case_s43_every_spelling_the_env_runs_as_probe_0_is_legal(spelling):
    import gymnasium as gym

    import envs  # noqa: F401  (registers the ids)

    env = gym.make("forkyard/ClueProbe-v0").unwrapped
    _, info = env.reset(seed=0)
    assert "probe(0)" in info["legal_actions"] and spelling not in info["legal_actions"]
    assert canonical_text(spelling) == "probe(0)" and is_legal_action(spelling, info["legal_actions"])
    obs, _, _, _, after = env.step(spelling)
    assert not after["invalid_action"] and obs.startswith("probe(0) -> bit 0")
    env.close()


@pytest.mark.parametrize("spelling", ["probe(True)", "probe(0.0)", "probe(j=0)", "probe('0')", "probe(0, 1)",
                                      "probe(０)", "probe(0)probe(1)", "", "probe", "<tool_call>probe(0)</tool_call>"])
def test_spellings_the_env_refuses_are_illegal(spelling):
    from envs.clueprobe import ClueProbeEnv

    tools = ClueProbeEnv().tool_schemas()
    assert not is_legal_action(spelling, ["probe(0)", "probe(1)", "probe(2)"])
    assert not is_legal(spelling, ["probe(0)", "probe(1)", "probe(2)"], tools)


@pytest.mark.parametrize("form", ["probe(k=0)", "probe( k = 0 )", '<tool_call>{"name": "probe", "arguments": {"k": 0}}'
                                  "</tool_call>", '{"name": "probe", "arguments": "{\\"k\\": 0}"}',
                                  {"name": "probe", "arguments": {"k": 0}}])
def test_field_case_s62_with_the_tools_a_call_the_env_reads_is_legal(form):
    """Given the env's tools, ``is_legal_action`` reads an action as the env's ``step`` does (keywords of the
    schema, a model's tool-call forms); without them only the env's ``name(args)`` text."""
    import gymnasium as gym

    import envs  # noqa: F401

    env = gym.make("forkyard/ClueProbe-v0").unwrapped
    _, info = env.reset(seed=0)
    assert is_legal(form, info["legal_actions"], env.tool_schemas())
    assert not is_legal_action(form, info["legal_actions"])
    obs, _, _, _, after = env.step(form)
    assert not after["invalid_action"] and obs.startswith("probe(0) -> bit 0") and env.history[0][0] == "probe(0)"


def _int_spelling(draw, v: int) -> str:
    base = draw(st.sampled_from([str, hex, oct, bin]))(abs(v))
    base = base if v >= 0 else "-" + base
    return draw(st.sampled_from(["{}", "({})", "+{}" if v >= 0 else "{}", " {} "])).format(base)


def _name_spelling(draw, name: str) -> str:
    # fullwidth letters (U+FF41..) are NFKC-equal to ASCII: Python reads them as the same identifier
    return "".join(chr(ord(c) + 0xFEE0) if c.isalpha() and draw(st.booleans()) else c for c in name)


@settings(max_examples=300, deadline=None)
@given(st.data(), st.integers(0, 8))
def test_is_legal_action_agrees_with_the_env_on_every_respelling(data, seed):
    """Whatever an action's spelling, ``is_legal_action`` says what the env does with it: ClueProbe runs
    exactly its legal actions and answers anything else with its invalid-action observation."""
    import gymnasium as gym

    import envs  # noqa: F401

    env = gym.make("forkyard/ClueProbe-v0", max_turns=3).unwrapped
    _, info = env.reset(seed=seed)
    for _ in range(3):
        name = data.draw(st.sampled_from(["probe", "answer"]))
        value = data.draw(st.integers(-2, 9))
        arg = data.draw(st.one_of(st.just(_int_spelling(data.draw, value)),
                                  st.sampled_from(["True", "0.0", "'1'", "k=0", "None"])))
        form = data.draw(st.sampled_from(["{}({})", " {} ( {} ) ", "{}({},)"]))
        text = form.format(_name_spelling(data.draw, name), arg)
        text = data.draw(st.one_of(st.just(text), st.text(max_size=12)))
        legal = is_legal(text, info["legal_actions"], env.tool_schemas())  # as the env reads it (S62)
        _, _, terminated, truncated, info = env.step(text)
        assert legal == (not info["invalid_action"]), text
        if terminated or truncated:
            break
    env.close()
