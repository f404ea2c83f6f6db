"""Tools as JSON schemas and tool calls in model output: the mapping to env actions is lossless
both ways (hypothesis), every env's legal actions survive it, malformed output gets the env's invalid-action
observation, and the schemas are served over HTTP (a real uvicorn on loopback)."""

from __future__ import annotations

import json
import keyword
import math

import gymnasium as gym
import httpx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import envs  # noqa: F401  (registers the ids)
from envs.actions import ActionParseError, format_action, parse_action
from envs.features import ToolSchemas
from envs.tool_calls import (action_to_call, call_to_action, calls_from_openai, canonical_action, format_tool_call,
                             function_tool, parse_model_output, read_calls)
from sandbox_server.app import create_env_app
from tests.docker_support import UvicornThread

# Tool and parameter names are identifiers that are not Python keywords: `as()` or `f(if=1)` is no action text
# (a schema with such a name cannot be written as name(args); test_keyword_names_are_refused).
NAMES = st.from_regex(r"[a-z][a-z0-9_]{0,7}", fullmatch=True).filter(lambda s: not keyword.iskeyword(s))
SCALARS = st.one_of(st.none(), st.booleans(), st.integers(-10**12, 10**12),
                    st.floats(allow_nan=False, allow_infinity=False), st.text(max_size=40))


@st.composite
def tool_and_call(draw):
    """A tool with 1-4 parameters and a call of it giving any subset of them."""
    name = draw(NAMES)
    params = draw(st.lists(NAMES, min_size=1, max_size=4, unique=True))
    tool = function_tool(name, "a tool", {p: {"type": "string"} for p in params})
    given_ = draw(st.lists(st.sampled_from(params), unique=True))
    args = {p: draw(SCALARS) for p in draw(st.permutations(given_))}
    return [tool], {"name": name, "arguments": args}


def typed(call: dict) -> list:
    """A call compared with its value types (``True == 1`` in Python; not here) and order-free arguments."""
    return [call["name"], sorted((k, type(v).__name__, repr(v)) for k, v in call["arguments"].items())]


@settings(max_examples=300, deadline=None)
@given(tool_and_call())
def test_a_call_survives_action_text_and_back(tc):
    tools, call = tc
    action = call_to_action(call, tools)
    assert typed(action_to_call(action, tools)) == typed(call)
    assert canonical_action(action, tools) == action  # canonical text is a fixed point


@settings(max_examples=300, deadline=None)
@given(tool_and_call(), st.integers(0, 4))
def test_an_action_text_survives_the_call_and_back(tc, n_positional):
    tools, call = tc
    params = list(tools[0]["function"]["parameters"]["properties"])
    # Any spelling of the call: the first parameters positional (when given in order), the rest as keywords.
    ordered = [p for p in params if p in call["arguments"]]
    k = 0
    while k < min(n_positional, len(ordered)) and ordered[k] == params[k]:
        k += 1
    text = format_action(call["name"], *[call["arguments"][p] for p in ordered[:k]],
                         **{p: call["arguments"][p] for p in ordered[k:]})
    assert call_to_action(action_to_call(text, tools), tools) == canonical_action(text, tools)
    assert typed(action_to_call(canonical_action(text, tools), tools)) == typed(action_to_call(text, tools))


CLUE_TOOLS = gym.make("forkyard/ClueProbe-v0").unwrapped.tool_schemas()


@pytest.mark.parametrize("output", [
    '<tool_call>\n{"name": "probe", "arguments": {"k": 2}}\n</tool_call>',
    'Let me check bit 2.\n<tool_call>{"name": "probe", "arguments": {"k": 2}}</tool_call>',
    '{"name": "probe", "arguments": {"k": 2}}',
    '{"name": "probe", "parameters": {"k": 2}}',  # Llama 3's key
    '{"name": "probe", "arguments": "{\\"k\\": 2}"}',  # the OpenAI API's arguments string
    "probe(2)", "  probe(k=2) ",
])
def test_every_common_form_maps_to_one_action(output):
    assert parse_model_output(output, CLUE_TOOLS) == "probe(2)"


@pytest.mark.parametrize("output, says", [
    ('<tool_call>{"name": "probe", "arguments": {"k": 1}}</tool_call><tool_call>{"name": "probe", '
     '"arguments": {"k": 2}}</tool_call>', "2 tool calls in one turn"),
    ('{"name": "probe", "arguments": {"k": 1}}; probe(2)', "2 tool calls in one turn"),
    ('<tool_call>{"name": "probe", "arguments": {"k": 1}</tool_call>', "not valid JSON"),
    ('<think>probe(2) is the call to make.</think>', "empty outside the reasoning"),
    ('<think>Unfinished reasoning <tool_call>{"name": "probe", "arguments": {"k": 2}}</tool_call>', "empty"),
    ('<tool_call>{"name": "probe", "arguments": {"k": 1}</tool_call>', "not valid JSON"),
    ('{"name": "rm", "arguments": {}}', "unknown tool 'rm'"),
    ('{"name": "probe", "arguments": {"k": [1, 2]}}', "must be a string, a number"),
    ('{"name": "probe", "arguments": {"k": NaN}}', "not a finite number"),
    ('{"name": "probe", "arguments": {"bit": 1}}', "no argument 'bit'"),
    ('{"name": "probe", "arguments": {"k": 1}, "extra": 1}', 'keys "name" and "arguments"'),
    ("probe(2) and answer(3)", "a single tool call"),
    ("", "empty"),
])
def test_anything_else_is_refused_with_a_reason(output, says):
    with pytest.raises(ActionParseError, match=says):
        parse_model_output(output, CLUE_TOOLS)


def test_refused_output_gets_the_envs_invalid_action_observation():
    env = gym.make("forkyard/ClueProbe-v0").unwrapped
    env.reset(seed=0)
    raw = '<tool_call>{"name": "probe", "arguments": {"k": [1]}}</tool_call>'
    with pytest.raises(ActionParseError):
        parse_model_output(raw, env.tool_schemas())
    obs, reward, terminated, truncated, info = env.step(raw)  # what a trainer does with it: the env says why
    assert info["invalid_action"] and obs.startswith("Invalid action") and reward == env.invalid_action_reward == 0.0


@pytest.mark.parametrize("env_id", ["forkyard/ClueProbe-v0", "forkyard/FileQA-v0"])
def test_every_legal_action_is_a_call_of_a_declared_tool_and_back(env_id):
    env = gym.make(env_id).unwrapped
    assert isinstance(env, ToolSchemas)
    tools = env.tool_schemas()
    names = [t["function"]["name"] for t in tools]
    assert len(names) == len(set(names)) and "answer" in names
    for t in tools:
        params = t["function"]["parameters"]
        assert params["type"] == "object" and set(params["required"]) <= set(params["properties"])
        json.dumps(t)  # plain JSON
    seen = 0
    for seed in range(6):
        _, info = env.reset(seed=seed)
        for action in info["legal_actions"]:
            call = action_to_call(action, tools)
            assert call_to_action(call, tools) == action  # legal actions are already canonical
            assert parse_model_output(format_tool_call(call), tools) == action
            seen += 1
    env.close()
    assert seen >= 12


def test_fileqa_schemas_come_from_the_sandbox_tool_registry():
    from sandbox_server.tools import TOOLS

    env = gym.make("forkyard/FileQA-v0").unwrapped
    by_name = {t["function"]["name"]: t["function"] for t in env.tool_schemas()}
    env.close()
    assert set(by_name) == {n for n, t in TOOLS.items() if t.family == "files"} | {"answer"}  # no sql tools
    for name, tool in ((n, t) for n, t in TOOLS.items() if t.family == "files"):
        assert by_name[name]["parameters"]["properties"] == tool.json_schema()["properties"]
        assert list(by_name[name]["parameters"]["properties"]) == tool.param_names


def test_tool_schemas_over_http_equal_the_in_process_ones(local_service):
    srv = UvicornThread(create_env_app(ttl_s=600, sandbox_provider=local_service)).start()
    try:
        for env_id in ("forkyard/ClueProbe-v0", "forkyard/FileQA-v0"):
            remote = gym.make(env_id, server_url=srv.url).unwrapped
            remote.reset(seed=3)
            local = gym.make(env_id).unwrapped
            assert remote.tool_schemas() == local.tool_schemas()
            remote.close()
            local.close()
        r = httpx.get(f"{srv.url}/v1/envs/nope/tools", timeout=10)
        assert r.status_code == 404 and "nope" in r.json()["detail"]
    finally:
        srv.stop()


def test_floats_and_strings_keep_their_exact_values():
    tools = [function_tool("f", "", {"x": {"type": "number"}, "s": {"type": "string"}})]
    for x, s in [(0.1, "it's \"quoted\"\n"), (-0.0, "café 🚀"), (1e308, "\\x00"), (5e-324, "")]:
        call = action_to_call(call_to_action({"name": "f", "arguments": {"x": x, "s": s}}, tools), tools)
        assert call["arguments"]["s"] == s and math.copysign(1, call["arguments"]["x"]) == math.copysign(1, x)
        assert call["arguments"]["x"] == x
    assert parse_action(call_to_action({"name": "f", "arguments": {"s": "x"}}, tools)).kwargs == (("s", "x"),)


def test_keyword_names_are_refused_not_mangled():
    tools = [function_tool("as", "", {"x": {"type": "string"}}), function_tool("f", "", {"if": {"type": "integer"}})]
    with pytest.raises(ActionParseError, match="could not parse"):
        call_to_action({"name": "as", "arguments": {}}, tools)
    assert call_to_action({"name": "f", "arguments": {"if": 1}}, tools) == "f(1)"  # positional: still an action


# ------------------------------------------------------------------ field cases S34, S35, S36: one parser
FILEQA_TOOLS = gym.make("forkyard/FileQA-v0").unwrapped.tool_schemas()
PROBE = '{"name": "probe", "arguments": {"k": %d}}'


def test_field_case_s35_a_closing_tag_inside_a_json_argument_is_a_string():
    grep = '{"name": "grep", "arguments": {"pattern": "</tool_call>", "path": "."}}'
    for output in (f"<tool_call>{grep}</tool_call>", f"<tool_call>\n{grep}\n</tool_call>", grep,
                   "grep('</tool_call>', '.')", f"Searching.\n<tool_call>{grep}</tool_call>\nDone."):
        assert parse_model_output(output, FILEQA_TOOLS) == "grep('</tool_call>', '.')"
    # the other tags inside strings, and the closing tag cut by a stop string at the very end
    think = '{"name": "grep", "arguments": {"pattern": "<think>x</think><tool_call>", "path": "."}}'
    assert parse_model_output(f"<tool_call>{think}", FILEQA_TOOLS) == "grep('<think>x</think><tool_call>', '.')"


def test_field_case_s36_a_call_drafted_in_the_reasoning_is_never_a_call():
    draft = f"<think>I could call <tool_call>{PROBE % 0}</tool_call>, but bit 2 tells more.</think>"
    assert parse_model_output(draft + f"<tool_call>{PROBE % 2}</tool_call>", CLUE_TOOLS) == "probe(2)"
    assert read_calls(draft, CLUE_TOOLS) == []
    with pytest.raises(ActionParseError, match="no tool call"):
        parse_model_output(draft, CLUE_TOOLS)
    # what a trainer then does: the raw text goes to the env, which answers with its invalid-action observation
    env = gym.make("forkyard/ClueProbe-v0").unwrapped
    env.reset(seed=0)
    obs, reward, _, _, info = env.step(draft)
    assert info["invalid_action"] and obs.startswith("Invalid action") and reward == 0.0
    env.close()
    # a template that opens the reasoning in the prompt: the output holds only the closing tag
    assert parse_model_output(f"probe(0) first? <tool_call>{PROBE % 0}</tool_call></think>\nprobe(1)",
                              CLUE_TOOLS) == "probe(1)"
    # a </think> inside a drafted call's JSON string does not end the reasoning
    tricky = ('<think><tool_call>{"name": "grep", "arguments": {"pattern": "</think>", "path": "."}}</tool_call>'
              '</think><tool_call>{"name": "cat", "arguments": {"path": "a.txt"}}</tool_call>')
    assert [c.action for c in read_calls(tricky, FILEQA_TOOLS)] == ["cat('a.txt')"]


def test_field_case_s34_several_calls_of_a_turn_are_read_in_order():
    two = f"<tool_call>{PROBE % 1}</tool_call>\n<tool_call>{PROBE % 2}</tool_call>"
    assert [c.action for c in read_calls(two, CLUE_TOOLS)] == ["probe(1)", "probe(2)"]
    with pytest.raises(ActionParseError, match="write exactly one tool call per turn"):
        parse_model_output(two, CLUE_TOOLS)  # one env action per turn: the same text is refused everywhere
    for bare in (f"{PROBE % 1}; {PROBE % 2}", f"{PROBE % 1}\n{PROBE % 2}", f"[{PROBE % 1}, {PROBE % 2}]"):
        assert [c.action for c in read_calls(bare, CLUE_TOOLS)] == ["probe(1)", "probe(2)"]
    mixed = read_calls(f'<tool_call>{{"name": "rm", "arguments": {{}}}}</tool_call><tool_call>{PROBE % 2}</tool_call>',
                       CLUE_TOOLS)
    assert mixed[0].action is None and "unknown tool 'rm'" in mixed[0].error and mixed[1].action == "probe(2)"
    structured = [{"id": "a", "type": "function", "function": {"name": "probe", "arguments": '{"k": 1}'}},
                  {"id": "b", "type": "function", "function": {"name": "rm", "arguments": "{}"}},
                  {"id": "c", "type": "function", "function": {"name": "answer", "arguments": {"c": 3}}}]
    assert [c.action for c in calls_from_openai(structured, CLUE_TOOLS)] == ["probe(1)", None, "answer(3)"]


@pytest.mark.parametrize("output", ["ｐｒｏｂｅ(0)", "probe( 0 )", "probe(0x0)", "probe(0b0)", "probe((0))",
                                    '{"name": "ｐｒｏｂｅ", "arguments": {"k": 0}}',
                                    '{"name": " probe ", "arguments": {" k": 0}}',
                                    '<tool_call>{"name": "probe", "arguments": {"ｋ": 0}}</tool_call>'])
def test_unusual_spellings_mean_what_they_mean_to_the_env(output):
    # Python reads identifiers NFKC-normalised and literals by value: the JSON forms read names the same way
    assert parse_model_output(output, CLUE_TOOLS) == "probe(0)"


# Strings full of the delimiters and the syntax of every form: tags, quotes, braces, parentheses, escapes.
NASTY = st.lists(st.one_of(st.sampled_from(["<tool_call>", "</tool_call>", "<think>", "</think>", '"', "'", "{", "}",
                                            "(", ")", "[", "]", ",", ";", "\\", "\\n", "\n", " ", "=", "0x0", "ｐ"]),
                           st.text(max_size=6)), max_size=8).map("".join)
NASTY_SCALARS = st.one_of(st.none(), st.booleans(), st.integers(-10**12, 10**12),
                          st.floats(allow_nan=False, allow_infinity=False), NASTY)
PLAIN = st.text(st.characters(blacklist_characters="<", blacklist_categories=("Cs",)), max_size=30)


CALL_COUNTS = st.integers(1, 3)


@st.composite
def tools_and_calls(draw, n=CALL_COUNTS):
    """A few tools and a list of calls of them whose string arguments hold tags and syntax."""
    names = draw(st.lists(NAMES, min_size=1, max_size=3, unique=True))
    tools, calls = [], []
    for name in names:
        params = draw(st.lists(NAMES, min_size=1, max_size=3, unique=True))
        tools.append(function_tool(name, "a tool", {p: {"type": "string"} for p in params}))
    for _ in range(draw(n)):
        tool = draw(st.sampled_from(tools))
        params = list(tool["function"]["parameters"]["properties"])
        given_ = draw(st.lists(st.sampled_from(params), unique=True))
        calls.append({"name": tool["function"]["name"], "arguments": {p: draw(NASTY_SCALARS) for p in given_}})
    return tools, calls


def _ws(draw):
    return draw(st.sampled_from(["", " ", "\n", "\n\n", "\t "]))


@settings(max_examples=300, deadline=None)
@given(tools_and_calls(n=st.just(1)), st.data())
def test_every_form_of_one_call_gives_the_same_action(tc, data):
    tools, (call,) = tc
    expected = call_to_action(call, tools)
    body = json.dumps(call, ensure_ascii=data.draw(st.booleans()))
    ws = data.draw(st.sampled_from(["", " ", "\n"]))
    forms = [f"<tool_call>{ws}{body}{ws}</tool_call>", body, expected, f"{ws}{body}{ws}",
             f"<tool_call>{body}",  # the closing tag cut at the end
             json.dumps({"name": call["name"], "arguments": json.dumps(call["arguments"])}),  # OpenAI's string
             json.dumps({"name": call["name"], "parameters": call["arguments"]})]  # Llama 3's key
    for form in forms:
        assert parse_model_output(form, tools) == expected, form
    structured = [{"id": "x", "type": "function",
                   "function": {"name": call["name"], "arguments": json.dumps(call["arguments"])}}]
    assert [c.action for c in calls_from_openai(structured, tools)] == [expected]


@settings(max_examples=300, deadline=None)
@given(tools_and_calls(), tools_and_calls(n=st.integers(0, 2)), st.lists(PLAIN, min_size=8, max_size=8),
       st.booleans())
def test_the_calls_of_a_turn_are_found_in_order_and_drafts_in_reasoning_never(tc, drafts_tc, texts, opened_by_prompt):
    """Reasoning with drafted calls (their strings full of tags), then the real calls with text between them;
    the reasoning opened by the prompt (only ``</think>`` in the output) or in the output."""
    tools, calls = tc
    drafts = [c for c in drafts_tc[1]]
    draft_tools = drafts_tc[0]
    reasoning = texts[0] + "".join(format_tool_call(d) + t for d, t in zip(drafts, texts[1:], strict=False))
    out = ("" if opened_by_prompt else "<think>") + reasoning + "</think>" + texts[3]
    for c, t in zip(calls, texts[4:], strict=False):
        out += format_tool_call(c) + t
    names = {x["function"]["name"] for x in tools}
    got = read_calls(out, tools + [t for t in draft_tools if t["function"]["name"] not in names])
    assert [c.action for c in got] == [call_to_action(c, tools) for c in calls]
    if len(calls) == 1:
        assert parse_model_output(out, tools) == call_to_action(calls[0], tools)


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=200) | NASTY)
def test_any_output_reads_or_raises_action_parse_error(text):
    for tools in (CLUE_TOOLS, FILEQA_TOOLS):
        for c in read_calls(text, tools):
            assert (c.action is None) != (c.error is None)
            if c.action is not None:
                assert canonical_action(c.action, tools) == c.action  # what reaches the env is canonical
        try:
            parse_model_output(text, tools)
        except ActionParseError:
            pass


@settings(max_examples=200, deadline=None)
@given(tools_and_calls(), st.lists(st.sampled_from(["\n", "; ", " ", ";\n"]), min_size=3, max_size=3),
       st.lists(st.sampled_from(["json", "call"]), min_size=3, max_size=3),
       st.sampled_from(["", "<think>", "</think>"]))
def test_several_bare_calls_in_one_turn_are_delimited_by_their_grammar(tc, seps, kinds, reasoning):
    tools, calls = tc
    out = {"": "", "<think>": f"<think>{format_tool_call(calls[0])}</think>",
           "</think>": f"{format_tool_call(calls[-1])}</think>"}[reasoning]
    for c, sep, kind in zip(calls, seps, kinds, strict=False):
        out += (json.dumps(c) if kind == "json" else call_to_action(c, tools)) + sep
    assert [c.action for c in read_calls(out, tools)] == [call_to_action(c, tools) for c in calls]
