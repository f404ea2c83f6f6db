"""Field case S62: an env's ``step`` reads its action with the one reader of tool calls (envs/action_input.py):
keyword and positional calls of every registered env's own tools alike, a model's reply in the forms serving
stacks write, and a JSON call object; what it cannot read is refused in the observation, never raised."""

from __future__ import annotations

import json

import gymnasium as gym
import pytest
from openenv.core.env_server.mcp_types import CallToolAction

import envs
from envs.action_input import read_action
from envs.actions import ActionParseError, format_action, parse_action
from envs.clueprobe import ClueProbeEnv
from envs.tool_calls import action_to_call, call_to_action, param_names

#: A value of a parameter of this JSON-schema type (an enum's first value, a range's minimum), when no legal
#: action of the tool shows one.
_BY_TYPE = {"integer": 0, "number": 0, "string": "x", "boolean": False}


def _schema_value(spec: dict) -> object:
    if spec.get("enum"):
        return spec["enum"][0]
    if "minimum" in spec:
        return spec["minimum"]
    kind = spec.get("type", "string")
    return _BY_TYPE.get(kind if isinstance(kind, str) else kind[0], "x")


def _arguments(tool: dict, legal: list[str]) -> tuple[dict, bool]:
    """(arguments of a call of ``tool`` by parameter name, whether they come from a legal action now)."""
    name = tool["function"]["name"]
    for text in legal:
        call = parse_action(text)
        if call.name == name and (call.args or call.kwargs):
            return action_to_call(text, [tool])["arguments"], True
    props = tool["function"]["parameters"].get("properties", {})
    required = tool["function"]["parameters"].get("required", list(props))
    return {p: _schema_value(props[p]) for p in props if p in required} or \
        {p: _schema_value(s) for p, s in list(props.items())[:1]}, False


def _outcome(env, action) -> tuple:
    obs, reward, term, trunc, info = env.step(action)
    return obs, reward, term, trunc, info["invalid_action"], info.get("termination_reason")


@pytest.mark.parametrize("env_id", sorted(envs.forkyard_specs()))
def test_field_case_s62_every_env_takes_its_tools_parameters_as_keywords_and_positionally(env_id):
    """For every registered env with tools, and every tool with parameters: the call with its schema's parameter
    names as keywords and the same call positionally (the canonical text) have the same outcome in two copies
    of one state, and the history records the one canonical action for both; at least one such call runs."""
    env = gym.make(env_id).unwrapped
    try:
        _, info = env.reset(seed=3)
        tools = env.tool_schemas() if callable(getattr(env, "tool_schemas", None)) else []
        if not any(param_names(t) for t in tools):
            pytest.skip(f"{env_id} declares no tool with parameters")
        ran = 0
        for tool in tools:
            if not param_names(tool):
                continue
            arguments, legal = _arguments(tool, info.get("legal_actions", []))
            name = tool["function"]["name"]
            positional = call_to_action({"name": name, "arguments": arguments}, tools)
            keywords = format_action(name, **arguments)
            assert "=" in keywords and parse_action(keywords).kwargs
            one, two = env.fork(2)
            try:
                got_positional, got_keywords = _outcome(one, positional), _outcome(two, keywords)
                assert got_keywords == got_positional, (keywords, got_keywords[0][:300], got_positional[0][:300])
                assert one.history[-1][0] == two.history[-1][0] == positional
                ran += legal and not got_positional[4]
            finally:
                one.close()
                two.close()
        assert ran >= 1 or "legal_actions" not in info, f"{env_id}: no keyword call ran"
    finally:
        env.close()


def test_clueprobe_takes_the_keyword_its_schema_names():
    env = ClueProbeEnv(max_turns=2)
    env.reset(seed=0, options={"target": 2})
    assert param_names(env.tool_schemas()[0]) == ["k"]
    obs, _, _, _, info = env.step("probe(k=1)")
    assert obs.startswith("probe(1) -> bit 1 of the target is 1.") and not info["invalid_action"]
    obs, reward, term, _, info = env.step("answer(c=2)")
    assert (reward, term, info["termination_reason"]) == (1.0, True, "answered")
    assert [a for a, _ in env.history] == ["probe(1)", "answer(2)"]
    assert info["episode_metrics"] == {"distinct_probes": 1}


PROBE_1 = [
    "probe(1)",
    "probe(k=1)",
    '<tool_call>{"name": "probe", "arguments": {"k": 1}}</tool_call>',
    '<tool_call>\n{"name": "probe", "arguments": {"k": 1}}\n</tool_call>',
    'I will read bit 1.\n<tool_call>{"name": "probe", "arguments": {"k": 1}}</tool_call>',
    '<think>probe(0) or probe(2)? <tool_call>{"name": "probe", "arguments": {"k": 2}}</tool_call></think>'
    '<tool_call>{"name": "probe", "arguments": {"k": 1}}</tool_call>',
    'Let me think.</think>\n\n<tool_call>{"name": "probe", "arguments": {"k": 1}}</tool_call>',
    '<tool_call>{"name": "probe", "arguments": {"k": 1}}',  # a stop string cut the closing tag
    '{"name": "probe", "arguments": {"k": 1}}',
    '{"name": "probe", "parameters": {"k": 1}}',
    '{"name": "probe", "arguments": "{\\"k\\": 1}"}',
    '{"type": "function", "function": {"name": "probe", "arguments": "{\\"k\\": 1}"}}',
    '{"id": "call_0", "type": "function", "function": {"name": "probe", "arguments": "{\\"k\\": 1}"}}',
    '[{"name": "probe", "arguments": {"k": 1}}]',
    {"name": "probe", "arguments": {"k": 1}},
    {"name": "probe", "arguments": '{"k": 1}'},
    {"type": "function", "function": {"name": "probe", "arguments": '{"k": 1}'}},
    [{"name": "probe", "arguments": {"k": 1}}],
    {"role": "assistant", "content": None, "tool_calls": [
        {"id": "c0", "type": "function", "function": {"name": "probe", "arguments": '{"k": 1}'}}]},
    {"role": "assistant", "content": '<tool_call>{"name": "probe", "arguments": {"k": 1}}</tool_call>'},
    CallToolAction(tool_name="probe", arguments={"k": 1}).model_dump(),  # the real OpenEnv action model
]


@pytest.mark.parametrize("form", PROBE_1, ids=lambda f: json.dumps(f)[:60])
def test_field_case_s62_every_form_of_a_call_is_the_same_step(form):
    """A tool call in any form a model or a client writes steps exactly as ``probe(1)``: the same observation,
    reward and info (anchor and state keys included: the history records the action read)."""
    plain, other = ClueProbeEnv(max_turns=4), ClueProbeEnv(max_turns=4)
    plain.reset(seed=5)
    other.reset(seed=5)
    assert other.step(form) == plain.step("probe(1)")
    assert other.history == plain.history and other.history[0][0] == "probe(1)"
    assert read_action(form, other.tool_schemas()) == "probe(1)"


@pytest.mark.parametrize("form, says", [
    ("probe(j=1)", "this env has two tools: probe(k) with an int k in 0..2"),  # the env's own reason
    ("probe(1, k=1)", "got probe(1, k=1)"),
    ('{"name": "probe", "arguments": {"j": 1}}', "has no argument 'j'"),
    ('<tool_call>{"name": "peek", "arguments": {"k": 1}}</tool_call>', "unknown tool 'peek'; tools: answer, probe"),
    ('<tool_call>{"name": "probe", "arguments": {"k": 1}}</tool_call><tool_call>{"name": "probe", "arguments": '
     '{"k": 2}}</tool_call>', "2 tool calls in one turn"),
    ('<tool_call>{"name": "probe", "arguments": {"k": [1]}}</tool_call>', "must be a string, a number"),
    ("<tool_call>probe(1)</tool_call>", "not valid JSON"),
    ("<think>probe(1)</think>", "no tool call"),
    ({"name": "probe", "arguments": {"k": 1}, "why": "x"}, "has the keys"),
    ({"type": "call_tool", "tool_name": "probe", "arguments": {"k": float("nan")}}, "finite number"),
    ([], "an empty JSON array"),
    ({"role": "assistant", "content": ""}, "the action is empty"),
    (5, "must be text or a JSON tool call, got int"),
    (None, "must be text or a JSON tool call, got NoneType"),
    ("", "the action is empty"),
    ("probe(99)", "probe(k) needs k in 0..2"),
])
def test_field_case_s62_what_is_refused_says_why_in_the_observation(form, says):
    env = ClueProbeEnv(max_turns=3)
    env.reset(seed=0)
    obs, reward, term, trunc, info = env.step(form)
    assert obs.startswith("Invalid action: ") and says in obs, obs
    assert (reward, term, trunc, info["invalid_action"]) == (ClueProbeEnv.invalid_action_reward, False, False, True)
    assert env.turn == 1 and isinstance(env.history[0][0], str)
    if form not in ("probe(99)", "probe(j=1)", "probe(1, k=1)"):  # the env's refusals; the others the reader's
        with pytest.raises(ActionParseError, match="."):
            read_action(form, env.tool_schemas())


def test_an_env_without_tool_schemas_reads_its_own_syntax_alone():
    """Without declared tools there are no parameter names to bind: text of the env's syntax goes to it as
    written (its keywords too), and a JSON call object is refused with the reason."""
    assert read_action("probe(k=1)", None) == "probe(k=1)"
    assert read_action("probe(1)", lambda: None) == "probe(1)"
    with pytest.raises(ActionParseError, match="declares no tool schemas"):
        read_action({"name": "probe", "arguments": {"k": 1}}, None)
    with pytest.raises(ActionParseError, match="could not parse"):
        read_action('<tool_call>{"name": "probe", "arguments": {"k": 1}}</tool_call>', [])


def test_the_positional_fast_path_never_asks_for_the_schemas():
    """``probe(1)`` (every step of a rollout) is handed to the env as written, without building the tools."""
    def no_tools():
        raise AssertionError("tool_schemas() called on the fast path")
    assert read_action("probe( 1 )", no_tools) == "probe( 1 )"
    assert read_action("unknown_tool(1)", no_tools) == "unknown_tool(1)"
