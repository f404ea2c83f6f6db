"""CodeRepair tasks: small Python packages generated from a seed, one function made wrong, tests shown and held back.

A task (:func:`draw_task`) is a package of two modules, each holding functions drawn from :data:`FUNCTIONS` (a
bank of small, well-known utility functions with their reference source), a bug injected into one of them (one of
that function's mutations: an off-by-one, a wrong operator, a lost case; each changes its result on some inputs),
visible unit tests (``tests/test_<module>.py``, at least one of which fails under the bug, so the bug can be
found by running them) and hidden tests (more cases for every function, at least one of which fails under the
bug, so that making the visible tests pass by special-casing them does not pass). Expected values are computed
by the reference functions here, on the host: generator code, never the agent's.

Everything is plain data: file texts (path under the workspace -> text), the bug's location and fix, the hidden
test module's text. Standard library only.
"""

from __future__ import annotations

import random
import textwrap
from dataclasses import dataclass
from typing import Any, Callable

__all__ = ["FUNCTIONS", "PACKAGES", "Function", "draw_task", "render_call"]


@dataclass(frozen=True)
class Function:
    """One function of the bank: its source (a ``def``), mutations ``(old, new)`` of that source (each a bug: the
    text ``old`` occurs once), and a draw of one argument tuple from an RNG."""

    name: str
    source: str
    bugs: tuple[tuple[str, str], ...]
    args: Callable[[random.Random], tuple]


def _ints(rng: random.Random, n: int, lo: int = -9, hi: int = 20) -> list[int]:
    return [rng.randint(lo, hi) for _ in range(n)]


def _word(rng: random.Random) -> str:
    return "".join(rng.choice("abcdeiouxyz") for _ in range(rng.randint(1, 6)))


FUNCTIONS: tuple[Function, ...] = (
    Function("clamp", '''
def clamp(x, lo, hi):
    """x limited to the range [lo, hi]."""
    return max(lo, min(x, hi))
''', (("min(x, hi)", "min(x, lo)"), ("max(lo, min(x, hi))", "min(lo, max(x, hi))")),
        lambda r: (r.randint(-20, 30), r.randint(-5, 3), r.randint(4, 12))),
    Function("mean", '''
def mean(xs):
    """The arithmetic mean of a non-empty list of numbers."""
    return sum(xs) / len(xs)
''', (("/ len(xs)", "/ (len(xs) + 1)"), ("sum(xs)", "sum(xs[1:])")),
        lambda r: (_ints(r, r.randint(1, 6)),)),
    Function("count_vowels", '''
def count_vowels(text):
    """How many letters of text are vowels (a, e, i, o, u), upper or lower case."""
    return sum(1 for c in text.lower() if c in "aeiou")
''', (('"aeiou"', '"aeio"'), ("text.lower()", "text")),
        lambda r: (" ".join(_word(r).upper() if r.random() < 0.3 else _word(r) for _ in range(r.randint(1, 4))),)),
    Function("running_total", '''
def running_total(xs):
    """The list of prefix sums of xs: element i is xs[0] + ... + xs[i]."""
    out, total = [], 0
    for x in xs:
        total += x
        out.append(total)
    return out
''', (("        total += x\n        out.append(total)", "        out.append(total)\n        total += x"),
      ("out, total = [], 0", "out, total = [], 1")),
        lambda r: (_ints(r, r.randint(1, 6)),)),
    Function("fizzbuzz", '''
def fizzbuzz(n):
    """"FizzBuzz" for multiples of 15, "Fizz" of 3, "Buzz" of 5, else the number as text."""
    if n % 15 == 0:
        return "FizzBuzz"
    if n % 3 == 0:
        return "Fizz"
    if n % 5 == 0:
        return "Buzz"
    return str(n)
''', (("n % 15 == 0", "n % 10 == 0"), ('    if n % 5 == 0:\n        return "Buzz"\n', "")),
        lambda r: (r.choice([r.randint(1, 100), 15 * r.randint(1, 6), 5 * r.randint(1, 19), 3 * r.randint(1, 30)]),)),
    Function("second_largest", '''
def second_largest(xs):
    """The second largest distinct value of xs (which holds at least two distinct values)."""
    return sorted(set(xs))[-2]
''', (("sorted(set(xs))[-2]", "sorted(xs)[-2]"), ("[-2]", "[1]")),
        lambda r: ((lambda xs: xs + [xs[0]] * r.randint(0, 2) + [max(xs) + 1] * r.randint(1, 2))(
            _ints(r, r.randint(2, 5))),)),
    Function("word_count", '''
def word_count(text):
    """How many words text holds, words being separated by any run of white space."""
    return len(text.split())
''', (("text.split()", 'text.split(" ")'), ("len(text.split())", "len(text.split()) + 1")),
        lambda r: ("  ".join(_word(r) for _ in range(r.randint(1, 4))) + r.choice(["", " ", "  "]),)),
    Function("is_palindrome", '''
def is_palindrome(text):
    """Whether text reads the same backwards, ignoring case and everything but letters and digits."""
    kept = [c.lower() for c in text if c.isalnum()]
    return kept == kept[::-1]
''', (("c.lower() for c", "c for c"), ("if c.isalnum()", "if c != ' '")),
        lambda r: (r.choice(["Abba", "No lemon, no melon", "abc", "Step on no pets!", "xyzzy", "Racecar",
                             "ab, ba", "12a21", "a b c"]),)),
)

#: Package names a task draws from.
PACKAGES = ("textkit", "numkit", "listkit", "toolbox")
_BY_NAME = {f.name: f for f in FUNCTIONS}


def _define(source: str) -> Callable:
    """The function a source text defines (the bank's own code, never an agent's)."""
    scope: dict[str, Any] = {}
    exec(compile(textwrap.dedent(source), "<bank>", "exec"), scope)  # noqa: S102 - the bank's reference code
    return next(v for k, v in scope.items() if callable(v) and not k.startswith("__"))


def render_call(name: str, args: tuple) -> str:
    """``name(arg, ...)`` with the arguments as Python literals."""
    return f"{name}({', '.join(repr(a) for a in args)})"


def _cases(rng: random.Random, fn: Function, n: int, tries: int = 200) -> list[tuple[tuple, Any]]:
    ref = _define(fn.source)
    out, seen = [], set()
    for _ in range(tries):
        args = fn.args(rng)
        key = repr(args)
        if key in seen:
            continue
        seen.add(key)
        out.append((args, ref(*args)))
        if len(out) == n:
            break
    return out


def _fails(buggy: Callable, cases: list[tuple[tuple, Any]]) -> bool:
    for args, want in cases:
        try:
            if buggy(*args) != want:
                return True
        except Exception:  # noqa: BLE001 - the bug crashes on this case: it fails the test
            return True
    return False


def _test_module(module: str, package: str, cases: dict[str, list[tuple[tuple, Any]]], cls: str) -> str:
    lines = ["import unittest", "", f"from {package}.{module} import {', '.join(sorted(cases))}", "", "",
             f"class {cls}(unittest.TestCase):"]
    for name in sorted(cases):
        for i, (args, want) in enumerate(cases[name]):
            lines += [f"    def test_{name}_{i}(self):",
                      f"        self.assertEqual({render_call(name, args)}, {want!r})", ""]
    return "\n".join(lines).rstrip() + "\n"


def draw_task(rng: random.Random, n_functions: int = 4, visible: int = 3, hidden: int = 6) -> dict[str, Any]:
    """One CodeRepair task drawn from ``rng`` (module docstring).

    Args:
        n_functions: functions in the package (2..len(FUNCTIONS)), split over two modules.
        visible / hidden: test cases per function in the visible / hidden tests.

    Returns:
        ``{"package", "files": {path: text}, "hidden": test module text, "bug": {"path", "function", "buggy",
        "fixed", "wrong", "probe"}, "modules": [module paths], "tests": [visible test paths]}``: paths relative to
        the workspace; ``buggy`` / ``fixed``: the wrong and the right text of the changed lines; ``wrong``: a repair
        of them that the hidden tests still fail (another mutation, or the buggy lines with a comment); ``probe``:
        a call of the function with a visible test's arguments (``name(arg, ...)``).

    Raises:
        ValueError: ``n_functions`` out of range, or ``visible`` / ``hidden`` below 1.
    """
    if not 2 <= n_functions <= len(FUNCTIONS) or visible < 1 or hidden < 1:
        raise ValueError(f"n_functions must be in 2..{len(FUNCTIONS)} and visible, hidden >= 1; got {n_functions}, "
                         f"{visible}, {hidden}")
    package = rng.choice(PACKAGES)
    chosen = rng.sample(FUNCTIONS, n_functions)
    modules = {"core": chosen[: n_functions // 2], "extra": chosen[n_functions // 2:]}
    target = rng.choice(chosen)
    for _ in range(50):  # a bug the visible tests and the hidden tests both catch
        old, new = rng.choice(target.bugs)
        buggy = _define(target.source.replace(old, new, 1))
        shown = {f.name: _cases(rng, f, visible) for f in chosen}
        held = {f.name: _cases(rng, f, hidden) for f in chosen}
        if _fails(buggy, shown[target.name]) and _fails(buggy, held[target.name]):
            break
    else:  # pragma: no cover - every bank entry's bugs are caught within a few draws (tests/envs check all seeds)
        raise RuntimeError(f"no caught bug for {target.name}")
    files = {f"{package}/__init__.py": f'"""{package}: small utilities."""\n', "tests/__init__.py": ""}
    bug_path = fixed_lines = buggy_lines = ""
    for module, fns in modules.items():
        path = f"{package}/{module}.py"
        text = (f'"""{package}.{module}."""\n' + "".join(
            "\n" + textwrap.dedent(f.source).strip("\n") + "\n" + "\n" for f in fns)).rstrip("\n") + "\n"
        if target in fns:  # the bug's whole lines, unique in the module: what a repair replaces
            at = text.index(textwrap.dedent(target.source).strip("\n")) + target.source.strip("\n").index(old)
            start, end = text.rfind("\n", 0, at) + 1, text.find("\n", at + len(old))
            fixed_lines = text[start:end]
            buggy_lines = fixed_lines.replace(old, new, 1)
            text, bug_path = text[:start] + buggy_lines + text[end:], path
            assert text.count(buggy_lines) == 1, (target.name, buggy_lines)
        files[path] = text
        files[f"tests/test_{module}.py"] = _test_module(module, package, {f.name: shown[f.name] for f in fns},
                                                        f"Test{module.title()}")
    wrong = buggy_lines + "  # fixed"  # a repair that looks made and changes nothing
    for old2, new2 in target.bugs:  # or another mutation of the same lines, when the hidden tests catch it too
        candidate = fixed_lines.replace(old2, new2, 1)
        source = textwrap.dedent(target.source)  # holds the module's lines verbatim
        if old2 in fixed_lines and candidate != buggy_lines and _fails(
                _define(source.replace(fixed_lines, candidate, 1)), held[target.name]):
            wrong = candidate
            break
    hidden_text = "\n".join(
        _test_module(module, package, {f.name: held[f.name] for f in fns}, f"Hidden{module.title()}")
        for module, fns in modules.items())
    return {"package": package, "files": files, "hidden": hidden_text,
            "bug": {"path": bug_path, "function": target.name, "buggy": buggy_lines, "fixed": fixed_lines,
                    "wrong": wrong, "probe": render_call(target.name, shown[target.name][0][0])},
            "modules": [f"{package}/{m}.py" for m in modules], "tests": [f"tests/test_{m}.py" for m in modules]}
