"""Countdown as a puzzle, without the env: the combination rule, the solver, expressions (their text and their safe
reading) and puzzle generation (:mod:`envs.suite.countdown` is the env over them, and documents the task).

Numbers combine two at a time with ``+ - * /`` into a positive integer (:func:`combine`: ``a - b`` only when
``a > b``, ``a / b`` only when exact); :func:`solve` searches the combinations that make a target;
:func:`expression_of` writes a combination sequence as an expression with minimal parentheses, and
:func:`evaluate` reads an expression with :mod:`ast` (never ``eval``) and computes it exactly with fractions;
:func:`generate_puzzle` draws a puzzle that is solvable by construction.
"""

from __future__ import annotations

import ast
from fractions import Fraction
from functools import lru_cache

import numpy as np

from envs.actions import parse_python

OPS = ("+", "-", "*", "/")
MAX_EXPRESSION_CHARS = 200
_TARGET_TRIES = 200  # combinations drawn per puzzle before the smallest target seen is taken
#: Operator precedence, for writing expressions with minimal parentheses.
PRECEDENCE = {"+": 1, "-": 1, "*": 2, "/": 2}


# --------------------------------------------------------------------------- arithmetic
def combine(a: int, op: str, b: int) -> int | None:
    """``a op b`` under the multi-turn rule (a positive integer result), else None.

    Args:
        a, b: positive ints.
        op: one of ``+ - * /``.
    """
    if op == "+":
        return a + b
    if op == "*":
        return a * b
    if op == "-":
        return a - b if a > b else None
    if op == "/":
        return a // b if b and a % b == 0 else None
    return None


def valid_combinations(pool: tuple[int, ...]) -> list[tuple[int, str, int, int]]:
    """Every valid combination of two numbers of ``pool``, larger first: ``(a, op, b, result)``, without repeats."""
    out, seen = [], set()
    for i in range(len(pool)):
        for j in range(len(pool)):
            a, b = pool[i], pool[j]
            if i == j or a < b or (a == b and i > j):
                continue
            for op in OPS:
                r = combine(a, op, b)
                if r is not None and (a, op, b) not in seen:
                    seen.add((a, op, b))
                    out.append((a, op, b, r))
    return out


def _remove(pool: tuple[int, ...], a: int, b: int, result: int) -> tuple[int, ...]:
    rest = list(pool)
    rest.remove(a)
    rest.remove(b)
    return tuple(sorted(rest + [result]))


@lru_cache(maxsize=50_000)
def solve(pool: tuple[int, ...], target: int, use_all: bool = True) -> tuple[tuple[int, str, int], ...] | None:
    """A sequence of combinations of ``pool`` that makes ``target``, or None (depth-first search with memo).

    Args:
        pool: the numbers (positive ints; at most 5 keep it fast: at most a few thousand pools).
        target: the number to make.
        use_all: True: the last number left must be the target; False: the target appearing in the pool ends it.

    Returns:
        ``((a, op, b), ...)`` in order (every intermediate a positive integer; ``()`` when the pool already holds
        the target as required), or None when no sequence makes the target.
    """
    pool = tuple(sorted(pool))
    if (len(pool) == 1 or not use_all) and target in pool:
        return ()
    for a, op, b, r in valid_combinations(pool):
        rest = solve(_remove(pool, a, b, r), target, use_all)
        if rest is not None:
            return ((a, op, b),) + rest
    return None


def expression_of(nums: tuple[int, ...] | list[int], steps: tuple[tuple[int, str, int], ...]) -> str:
    """The expression text (minimal parentheses) of the last step of a combination sequence over ``nums``; with no
    steps, the text of ``nums[0]``.

    Raises:
        ValueError: a step combines a number that is not in the pool at that point.
    """
    pool: list[tuple[int, str, int]] = [(n, str(n), 3) for n in nums]  # (value, text, precedence)
    last = pool[0]
    for a, op, b in steps:
        left = next((p for p in pool if p[0] == a), None)
        if left is None:
            raise ValueError(f"{a} is not in the pool")
        pool.remove(left)
        right = next((p for p in pool if p[0] == b), None)
        if right is None:
            raise ValueError(f"{b} is not in the pool")
        pool.remove(right)
        prec = PRECEDENCE[op]
        lt = f"({left[1]})" if left[2] < prec else left[1]
        rt = f"({right[1]})" if right[2] < prec or (right[2] == prec and op in "-/") else right[1]
        value = combine(a, op, b)
        if value is None:
            raise ValueError(f"{a} {op} {b} is no positive integer")
        last = (value, f"{lt} {op} {rt}", prec)
        pool.append(last)
    return last[1]


class ExpressionError(ValueError):
    """An answer that is not an arithmetic expression over integers with + - * / and parentheses."""


def evaluate(expression: str) -> tuple[Fraction | None, list[int]]:
    """The exact value of an arithmetic expression and the integers it uses, read with :mod:`ast` (never ``eval``).

    Allowed: non-negative integer literals, binary ``+ - * /``, unary ``-`` and ``+``, parentheses.

    Returns:
        ``(value, numbers)``: ``value`` a :class:`fractions.Fraction`, or None on a division by zero; ``numbers``
        the integer literals in order of appearance.

    Raises:
        ExpressionError: the text is longer than 200 characters, does not parse, or holds anything else
            (names, calls, floats, ``**``, ...).
    """
    if not isinstance(expression, str) or len(expression) > MAX_EXPRESSION_CHARS:
        raise ExpressionError(f"an expression is a string of at most {MAX_EXPRESSION_CHARS} characters")
    try:
        tree = parse_python(expression.strip(), mode="eval")
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        raise ExpressionError("the expression does not parse") from None
    numbers: list[int] = []

    def walk(node: ast.AST) -> Fraction | None:
        if isinstance(node, ast.Constant) and type(node.value) is int and node.value >= 0:
            numbers.append(node.value)
            return Fraction(node.value)
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
            inner = walk(node.operand)
            return None if inner is None else (-inner if isinstance(node.op, ast.USub) else inner)
        if isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Add, ast.Sub, ast.Mult, ast.Div)):
            left, right = walk(node.left), walk(node.right)
            if left is None or right is None:
                return None
            if isinstance(node.op, ast.Add):
                return left + right
            if isinstance(node.op, ast.Sub):
                return left - right
            if isinstance(node.op, ast.Mult):
                return left * right
            return None if right == 0 else left / right
        raise ExpressionError(f"{type(node).__name__} is not allowed: use integers, + - * / and parentheses")

    try:
        value = walk(tree.body)
    except RecursionError:
        raise ExpressionError("the expression is nested too deeply") from None
    return value, numbers


# --------------------------------------------------------------------------- puzzles
def generate_puzzle(rng: np.random.Generator, num_count: int, min_number: int, max_number: int, max_target: int,
                    use_all: bool) -> tuple[list[int], int]:
    """A Countdown puzzle ``(nums, target)`` drawn from ``rng``, solvable by construction (:mod:`envs.suite.countdown`).

    Up to 200 draws of numbers and a random combination sequence; the first whose target is at most
    ``max_target`` (and, with ``use_all=False``, not one of the numbers) is taken, else the drawn puzzle with the
    smallest target (every draw is solvable).
    """
    best: tuple[list[int], int] | None = None
    for _ in range(_TARGET_TRIES):
        nums = [int(x) for x in rng.integers(min_number, max_number + 1, size=num_count)]
        pool = list(nums)
        steps = num_count - 1 if use_all else int(rng.integers(1, num_count))
        value = pool[0]
        for _ in range(steps):
            i, j = (int(k) for k in rng.choice(len(pool), size=2, replace=False))
            a, b = max(pool[i], pool[j]), min(pool[i], pool[j])
            options = [op for op in OPS if combine(a, op, b) is not None]
            op = options[int(rng.integers(len(options)))]
            value = combine(a, op, b) or 0
            pool = [p for k, p in enumerate(pool) if k not in (i, j)] + [value]
        trivial = not use_all and value in nums
        if value <= max_target and not trivial:
            return nums, value
        if not trivial and (best is None or value < best[1]):
            best = (nums, value)
    if best is None:  # every draw was trivial (only with tiny number ranges): take the sum, never one of them
        nums = [int(x) for x in rng.integers(min_number, max_number + 1, size=num_count)]
        return nums, sum(nums)
    return best
