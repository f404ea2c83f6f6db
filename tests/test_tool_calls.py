"""Tools as JSON schemas and tool calls in model output (issue 16): the mapping to env actions is lossless
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
from envs.tool_calls import (action_to_call, call_to_action, canonical_action, format_tool_call, function_tool,
                             parse_model_output)
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
     '"arguments": {"k": 2}}</tool_call>', "2 <tool_call> blocks"),
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
    for name, tool in TOOLS.items():
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
