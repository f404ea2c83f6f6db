"""The tool registry and its validation (no sandbox needed): every refusal rule, table-driven. At the end,
field case S45 (a path argument that looks like an operator) also on every backend (the ``service`` fixture)."""

from __future__ import annotations

import math
import posixpath

import pytest
from hypothesis import given
from hypothesis import strategies as st

from envs.actions import bind_arguments, parse_action
from sandbox_server.agent import utf8_cut
from sandbox_server.tools import (MAX_ARG_CHARS, MAX_ENV_VALUE_CHARS, MAX_ENV_VARS, SESSION_ENV_NAMES, STAT_FORMAT,
                                  TOOLS, ToolRefused, clamp_timeout, tool_specs, validate_call,
                                  validate_session_env)

# (tool, args, words the refusal message must contain)
REFUSED = [
    ("rm", {"path": "x"}, "unknown tool"),
    ("sh", {}, "unknown tool"),
    ("cat notes.txt; rm -rf /data", {}, "unknown tool"),  # S1: the whole string is not a tool name
    ("cat", {"path": "../../etc/passwd"}, ".."),  # S9
    ("cat", {"path": "/data/../data2/secret"}, ".."),  # S9
    ("cat", {"path": "/data2/secret"}, "outside"),  # S9: a sibling whose name starts like the root
    ("cat", {"path": "/etc/passwd"}, "outside"),
    ("head", {"path": "/proc/self/environ"}, "outside"),  # S9
    ("grep", {"pattern": "", "path": "/"}, "outside"),  # S4: grep -r '' /
    ("find", {"path": "/"}, "outside"),  # S4: find /
    ("cat", {"path": "a\x00b"}, "NUL"),
    ("grep", {"pattern": "a\x00"}, "NUL"),
    ("cat", {"path": "a\nb"}, "control character"),  # S1: a newline then a second command
    ("cat", {"path": "x" * (MAX_ARG_CHARS + 1)}, "limit"),
    ("grep", {"pattern": "x" * (MAX_ARG_CHARS + 1)}, "limit"),
    ("cat", {}, "needs the argument"),
    ("cat", {"path": 3}, "must be a string"),
    ("cat", {"path": "a", "flags": "-n"}, "has no argument"),
    ("find", {"exec": "touch /tmp/pwned {} ;"}, "has no argument"),  # S2: -exec & co are not parameters
    ("find", {"execdir": "x"}, "has no argument"),
    ("find", {"delete": True}, "has no argument"),
    ("find", {"fprint": "out"}, "has no argument"),
    ("find", {"follow": True}, "has no argument"),
    ("find", {"type": "f -delete"}, "must be one of"),
    ("find", {"maxdepth": 1000}, "between"),
    ("find", {"maxdepth": "1; rm"}, "must be an integer"),
    ("head", {"path": "a", "lines": -1}, "between"),
    ("head", {"path": "a", "lines": True}, "must be an integer"),
    ("grep", {"pattern": "x", "recursive": "yes"}, "true or false"),
    ("sort", {"path": "a"}, "unknown tool"),  # S2: sort is not whitelisted at all
    ("cat", {"path": ""}, "empty"),
]


@pytest.mark.parametrize("tool,args,words", REFUSED, ids=[f"{t}-{i}" for i, (t, _, _) in enumerate(REFUSED)])
def test_refused_before_execution(tool, args, words):
    with pytest.raises(ToolRefused) as exc:
        validate_call(tool, args)
    assert words.lower() in str(exc.value).lower()


# S1: shell metacharacters are *allowed* as data: they reach the tool as literal argv items, never a shell.
SHELLISH = ["notes.txt; rm -rf /data", "$(touch /tmp/pwned)", "`touch /tmp/pwned`", "a.txt && touch /tmp/pwned",
            "a.txt | sh", "x > a.txt"]


@pytest.mark.parametrize("path", SHELLISH)
def test_shell_syntax_stays_one_literal_argument(path):
    call = validate_call("cat", {"path": path})
    assert call.argv in (["cat", "--", path], ["cat", "--", "./" + path])  # ./ for odd first characters (S45)


@pytest.mark.parametrize("tool,args", [("cat", {"path": "-rf"}), ("grep", {"pattern": "-r", "path": "-rf"}),
                                       ("find", {"path": "-delete"}), ("ls", {"path": "--help"}),
                                       ("find", {"name": "-exec"})])
def test_leading_dash_never_reads_as_an_option(tool, args):
    call = validate_call(tool, args)
    for i in call.path_args:
        assert not call.argv[i].startswith("-")
    if tool == "grep":
        assert call.argv[call.argv.index("-e") + 1] == "-r"
    if tool == "find" and "name" in args:
        assert call.argv[call.argv.index("-name") + 1] == "-exec" and "-P" == call.argv[1]
    if tool != "find":
        assert call.argv.index("--") < min(call.path_args)


def test_every_tool_builds_an_argv_and_has_a_schema():
    specs = {s.name: s for s in tool_specs()}
    files = {n for n, s in specs.items() if s.family == "files"}
    assert files == {"ls", "cat", "head", "tail", "wc", "grep", "find", "stat"}
    sql = {n for n, s in specs.items() if s.family == "sql"}
    assert sql == {"list_tables", "describe", "query", "rows"}  # test_sql_tools.py
    workspace = {n for n, s in specs.items() if s.family == "workspace"}
    assert workspace == {"write_file", "replace_in_file", "make_dir", "remove", "run_python",
                         "run_tests"}  # test_workspace_tools.py
    assert set(specs) - files - sql - workspace == {"run_cell"}  # the interpreter family: test_interpreter.py
    for name, tool in TOOLS.items():
        assert specs[name].params == tool.param_names and specs[name].family == tool.family
        assert specs[name].schema_["additionalProperties"] is False
        args = {p.name: ("x" if p.type == "string" else None) for p in tool.params if p.required}
        call = validate_call(name, args, cwd="/scratch", families=["workspace", "interpreter"])
        assert call.argv[0] == (name if tool.family == "files" else "python3")
        assert all(isinstance(a, str) for a in call.argv)


def test_text_actions_bind_to_the_schemas():
    call = parse_action('grep("def main", path="Lib", fixed=True)')
    args = bind_arguments(call, TOOLS["grep"].param_names)
    assert validate_call(call.name, args).argv[-3:] == ["def main", "--", "Lib"]
    args = bind_arguments(parse_action('head("Lib/abc.py", 3)'), TOOLS["head"].param_names)
    assert validate_call("head", args).argv == ["head", "-n", "3", "--", "Lib/abc.py"]


def test_paths_under_scratch_and_relative_cwd():
    assert validate_call("cat", {"path": "/scratch/q.txt"}).argv[-1] == "/scratch/q.txt"
    assert validate_call("cat", {"path": "q.txt"}, cwd="/scratch").argv[-1] == "q.txt"
    with pytest.raises(ToolRefused):
        validate_call("cat", {"path": "/tmp/x"})


@pytest.mark.parametrize("value,expected", [(None, 5.0), (2, 2.0), (1e9, 10.0), (10.5, 10.0), (0.25, 0.25)])
def test_timeouts_are_clamped(value, expected):
    assert clamp_timeout(value, 5.0, 10.0) == expected


@pytest.mark.parametrize("value", [-1, 0, math.nan, "5", True])
def test_bad_timeouts_are_refused(value):
    with pytest.raises(ToolRefused, match="timeout_s"):
        clamp_timeout(value, 5.0, 10.0)


@given(st.text(max_size=40), st.integers(min_value=0, max_value=200))
def test_utf8_cut_never_splits_a_character(text, cut):
    raw = text.encode("utf-8")[:cut]
    out = utf8_cut(raw)
    assert raw.startswith(out) and len(raw) - len(out) <= 3
    out.decode("utf-8")  # no exception: a cut of valid UTF-8 stays valid


def test_utf8_cut_keeps_invalid_bytes_for_replacement():
    assert utf8_cut(b"caf\xe9") == b"caf"  # a lone lead byte at the end is an incomplete sequence
    assert utf8_cut(b"caf\xe9x") == b"caf\xe9x"
    assert utf8_cut(b"a\xc3\xa9") == b"a\xc3\xa9"


# -- S17: the session-environment allow-list ---------------------------------------------------------------

@pytest.mark.parametrize("env,names", [
    ({"LD_PRELOAD": "x.so", "LD_LIBRARY_PATH": "."}, ["LD_LIBRARY_PATH", "LD_PRELOAD"]),
    ({"PATH": "/scratch", "HOME": "/scratch", "PYTHONPATH": "/scratch", "PYTHONSTARTUP": "x"},
     ["HOME", "PATH", "PYTHONPATH", "PYTHONSTARTUP"]),
    ({"GCONV_PATH": "/scratch", "LOCPATH": "/scratch", "MALLOC_PERTURB_": "1", "GLIBC_TUNABLES": "x"},
     ["GCONV_PATH", "GLIBC_TUNABLES", "LOCPATH", "MALLOC_PERTURB_"]),
    ({"IFS": " ", "BASH_ENV": "x", "ENV": "x", "PERL5OPT": "-Mx", "POSIXLY_CORRECT": "1", "A": "1"},
     ["A", "BASH_ENV", "ENV", "IFS", "PERL5OPT", "POSIXLY_CORRECT"]),
    ({"LANG": "C.UTF-8", "LD_AUDIT": "x", "lang": "C"}, ["LD_AUDIT", "lang"]),
])
def test_session_env_refuses_every_unlisted_name(env, names):
    with pytest.raises(ToolRefused) as exc:
        validate_session_env(env)
    listed = str(exc.value).split("not allowed: ")[1].split(" (allowed")[0].split(", ")
    assert listed == names


@pytest.mark.parametrize("env,words", [
    ({"LC_ALL": "/scratch/loc"}, "LC_ALL: "), ({"LANG": "../x"}, "LANG: "), ({"TZ": "/etc/passwd"}, "TZ: "),
    ({"TZ": ":/scratch/z"}, "TZ: "), ({"TZ": "../../scratch/z"}, "TZ: "), ({"LANG": "C\x00x"}, "NUL"),
    ({"TERM": "x" * (MAX_ENV_VALUE_CHARS + 1)}, "limit is"), ({"COLUMNS": "80x"}, "COLUMNS: "),
    ({"LANG": 5}, "must be a string"), ({f"LC_{i}": "C" for i in range(MAX_ENV_VARS + 1)}, "variables; the limit"),
    ([("LANG", "C")], "must be an object"),
])
def test_session_env_value_rules(env, words):
    with pytest.raises(ToolRefused) as exc:
        validate_session_env(env)
    assert words in str(exc.value)


def test_session_env_allowed_values():
    env = {"LANG": "en_US.UTF-8", "LANGUAGE": "fr:en", "LC_ALL": "C.UTF-8", "LC_TIME": "de_DE@euro",
           "TZ": "Europe/Paris", "TERM": "xterm-256color", "COLUMNS": "120", "LINES": "40", "NO_COLOR": "1"}
    assert validate_session_env(env) == env and validate_session_env(None) == {} and validate_session_env({}) == {}
    assert validate_session_env({"TZ": "EST5EDT,M3.2.0,M11.1.0"}) == {"TZ": "EST5EDT,M3.2.0,M11.1.0"}
    assert validate_session_env({"TZ": "<+03>-3"}) == {"TZ": "<+03>-3"}
    assert SESSION_ENV_NAMES >= set(env)


def test_stat_prints_a_fixed_host_independent_format():
    call = validate_call("stat", {"path": "-x"})
    assert call.argv == ["stat", "--printf", STAT_FORMAT, "--", "./-x"] and call.path_args == [4]
    for field in ("%i", "%d", "%D", "%x", "%z", "%w", "%u", "%g", "%U", "%G", "%h", "%b"):
        assert field not in STAT_FORMAT


# -- S45: a path argument is a path, whatever it looks like ---------------------------------------------------
# Field case S45: `find` with path "!" and type "f" ran `find ! -type f` (an expression, not a start path).
# Every value a tool could read as an operator, an option or stdin: find's expression tokens, options of
# every tool, "-" (stdin), and other odd first characters.
OPERATOR_LIKE = ["!", "(", ")", ",", "-name", "-type", "-", "--help", "-delete", "!x", "(a", "-exec", "+5", "\\(", "@x"]
PATH_TOOLS = sorted(name for name, tool in TOOLS.items() if any(p.is_path for p in tool.params))
_FIND_EXPRESSION_START = ("-", "!", "(", ")", ",")


def _required(tool: str) -> dict:
    return {"pattern": "x"} if tool == "grep" else {p.name: "x" for p in TOOLS[tool].params
                                                    if p.required and p.name != "path"}


def _validate(tool: str, path: str):
    """``validate_call`` of ``tool`` on ``path`` in a workspace sandbox whose cwd is /scratch (every tool is callable
    there; relative paths resolve to /scratch, where the workspace tools write)."""
    return validate_call(tool, {**_required(tool), "path": path}, cwd="/scratch", families=["workspace"])


def _path_items(call) -> list[str]:
    return [call.argv[i] for i in call.path_args]


@pytest.mark.parametrize("tool", PATH_TOOLS)
@pytest.mark.parametrize("value", OPERATOR_LIKE)
def test_s45_every_operator_like_path_becomes_a_path(tool, value):
    call = _validate(tool, value)
    (item,) = _path_items(call)
    assert item == "./" + value  # the same file, and no tool reads "./..." as an option or expression
    if tool == "find":
        assert call.argv[:3] == ["find", "-P", "./" + value]
    elif TOOLS[tool].family == "files":
        assert call.argv[call.argv.index("--") + 1] == item  # after `--` too


@given(tool=st.sampled_from(PATH_TOOLS),
       value=st.text(st.characters(blacklist_categories=("Cs",), min_codepoint=32, blacklist_characters="\x7f"),
                     min_size=1, max_size=12))
def test_s45_property_a_path_item_never_starts_like_an_operator(tool, value):
    try:
        call = _validate(tool, value)
    except ToolRefused:
        return  # refused ('..' or outside the roots): nothing runs, which also satisfies the case
    (item,) = _path_items(call)
    assert item == value or item == "./" + value
    assert posixpath.normpath(posixpath.join("/scratch", item)) == posixpath.normpath(posixpath.join("/scratch",
                                                                                                     value))
    first = item[:1]
    assert first == "/" or first == "." or first == "_" or first.isalnum()
    assert not item.startswith(_FIND_EXPRESSION_START)


@pytest.fixture
def odd_names_sb(service):
    """A sandbox whose cwd is /scratch, holding one file per :data:`OPERATOR_LIKE` name (text ``file NAME``)
    and a folder ``!d`` with ``inner.txt``."""
    files = {name: f"file {name}\n".encode() for name in OPERATOR_LIKE}
    files["!d/inner.txt"] = b"inner\n"
    info = service.create(cwd="/scratch", files=files)
    yield info.id
    service.delete(info.id)


def test_s45_operator_like_paths_name_their_files_on_every_backend(service, odd_names_sb):
    sid = odd_names_sb

    def run(tool, **args):
        r = service.exec(sid, tool, args)
        assert r.status == "ok", (tool, args, r)
        return r

    for name in OPERATOR_LIKE:
        text = f"file {name}\n"
        assert run("cat", path=name).stdout == text
        assert run("head", path=name, lines=1).stdout == text
        assert run("head", path=name, bytes=4).stdout == "file"
        assert run("tail", path=name, lines=1).stdout == text
        assert run("wc", path=name).stdout.split() == ["1", "2", str(len(text.encode())), "./" + name]
        assert "Size: %d" % len(text.encode()) in run("stat", path=name).stdout
        assert run("ls", path=name).stdout == f"./{name}\n"
        assert run("grep", pattern="file", path=name, recursive=False).stdout == f"1:{text}"
        assert run("grep", pattern="file", path=name, fixed=True).stdout == f"1:{text}"
        r = run("find", path=name, type="f")  # S45's own call: the file itself, not every non-file
        assert (r.stdout, r.exit_code) == (f"./{name}\n", 0)
        assert run("find", path=name, type="d").stdout == ""
        assert run("find", path=name, name="*", maxdepth=0).stdout == f"./{name}\n"
    assert run("ls", path="!d").stdout == "inner.txt\n"
    assert run("find", path="!d", type="f").stdout == "./!d/inner.txt\n"
    assert run("grep", pattern="inner", path="!d").stdout == "./!d/inner.txt:1:inner\n"


@pytest.mark.parametrize("value", ["!", "(", "-name", ")", ","])
def test_s45_a_missing_operator_like_start_path_lists_nothing(service, value):
    """In /data (no such names): `find` reports the missing start path instead of running an expression
    over the working directory, and every other tool reports the missing file."""
    sid = service.create().id
    try:
        r = service.exec(sid, "find", {"path": value, "type": "f"})
        assert (r.status, r.stdout, r.exit_code) == ("ok", "", 1) and "No such file" in r.stderr
        for tool in PATH_TOOLS:
            if TOOLS[tool].family == "workspace":  # not in this sandbox: tests/sandbox_server/test_workspace_tools.py
                continue
            r = service.exec(sid, tool, {**_required(tool), "path": value})
            assert r.stdout == "" and r.exit_code not in (0, None), (tool, r)
    finally:
        service.delete(sid)

