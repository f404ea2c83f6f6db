"""Wordle-v0: find a hidden English word in a few guesses from per-letter colour feedback, guesses as tool calls.

The word game Wordle (Josh Wardle, 2021) as a multi-turn text env, the form LLM-agent work trains on (TextArena ships
it as ``Wordle-v0``, OpenEnv's default TextArena game); here with guesses as tool calls. At ``reset`` a hidden
*answer* is drawn from the answer pool with the env's seeded RNG. On each turn the agent calls ``guess(word)`` with
a ``word_length``-letter word; the observation marks every letter of the guess:

``green``   the letter is in the answer at this position;
``yellow``  the letter is in the answer elsewhere: a guess's copies of a letter that is not green are marked
            yellow from left to right only while the answer has copies left over after its greens (the standard
            duplicate-letter rule: guess ``'speed'`` against ``'abide'`` marks the first ``e`` yellow and the second
            gray);
``gray``    the letter is not in the answer, or no copies of it are left.

The observation writes it per letter (``guess('crane') -> c gray, r yellow, a green, n gray, e gray``) and as a
pattern (``.YG..``: ``G`` green, ``Y`` yellow, ``.`` gray). Reward 1.0 when the guess is the answer, which
terminates the episode (``termination_reason="answered"``); when ``max_turns`` guesses are used up the episode is
truncated (``"max_turns"``) and the observation names the answer. Optional shaping: with ``shaping = s > 0`` every
accepted guess also earns ``s * (positions turned green for the first time) / word_length`` (at most ``s`` per
episode; 0 by default, so the return is exactly the success).

Words (offline, from two PyPI packages the ``suite`` extra pins): the **dictionary** of accepted guesses is every
lowercase ASCII word of ``word_length`` letters in ``english-words`` 2.0.2 (MIT; Webster's Second International
``web2`` and the GNU Collaborative International Dictionary of English ``gcide`` 0.53) plus every such word of
``wordfreq`` 3.1.1's English list with a Zipf frequency >= 3 (data CC BY-SA 4.0; this adds inflections such as
``asked`` and ``years``, which the dictionaries lack, and some names). The **answer pool** is the ``answers``
most frequent words (wordfreq's order) that both dictionaries list in lowercase (no inflections, few names), less
a short list of slurs and vulgar words (kept as BLAKE2b digests, so that the source does not spell them). The pool
is public, as Wordle's answer list is: the legal-action menu and the demonstrator use it. 5 letters: about 12,900
accepted guesses and 3,872 pool words (4 letters: 6,400 / 2,613; 6 letters: 21,700 / 5,417).

Held out: ``eval_answers`` pool words spread evenly over the frequency ranks are never drawn by ``reset(seed=...)``;
:meth:`WordleEnv.evaluation_resets` plays each of them once (``reset(options={"answer": w})`` fixes any pool word).

Invalid guesses: a call that is not ``guess(word)`` with a string, a word of the wrong length or with other than
letters, and a word outside the dictionary are illegal actions (:class:`~envs.core.IllegalActionError`): the
observation says why, the reward is 0 and **the guess is used up** (the core's rule for every illegal action,
kept here so that an agent cannot probe the dictionary for free). Guessing a word twice is legal (a wasted guess).

Legal-action menu (``info["legal_actions"]``, sorted, at most 10 calls): up to 5 pool words consistent with all the
feedback so far (the demonstrator's pick first, then the most frequent), and up to 5 pool words the feedback rules
out (the most frequent ones), topped up with further consistent words while fewer are ruled out (the first turn).
Any dictionary word is legal, not only the menu's. The action set is finite (the dictionary) but too large for
:class:`~envs.features.FiniteActions`' exact enumeration, so the env offers no ``action_vocabulary``.

Optional features (:mod:`envs.features`): :class:`~envs.features.ToolSchemas`, :class:`~envs.features.Demonstrator`
(a consistent-candidate solver, :meth:`WordleEnv.demo_action`), :class:`~envs.features.EvaluationResets`.
``info["episode_metrics"]`` at an episode's end: ``{"success": 0.0 or 1.0, "accepted_guesses": n}`` (success: solved).
Fork and snapshot: the task state (answer and accepted guesses with their patterns) is plain JSON
(``fork_method = "state_codec"``).
"""

from __future__ import annotations

import functools
import hashlib
import random
from typing import Any

from envs.actions import ToolCall, bind_arguments, format_action
from envs.core import Action, IllegalActionError, Outcome, TextEnv
from envs.features import mixed_demo
from envs.tool_calls import function_tool

__all__ = ["WordleEnv", "feedback", "word_lists"]

#: Word lengths the env plays (``word_length``).
WORD_LENGTHS = (4, 5, 6)
#: Bounds of the turn budget and of the answer pool size.
MAX_TURNS = 20
MIN_ANSWERS = 20
#: The legal-action menu: at most this many consistent and this many ruled-out words.
MENU_CONSISTENT = 5
MENU_RULED_OUT = 5
#: The demonstrator scores at most this many consistent guesses against at most this many consistent answers.
SCORE_OPTIONS = 40
SCORE_SAMPLE = 300
_COLOURS = {"G": "green", "Y": "yellow", ".": "gray"}
#: wordfreq's frequency buckets are centibels below 1 per word: bucket 600 is Zipf frequency 3.0.
_COMMON_BUCKET = 600
#: BLAKE2b digests (6 bytes, hex) of slurs and vulgar words left out of every answer pool (still accepted as guesses).
_EXCLUDED = frozenset({
    "01b18434faa9", "0e56f4d8790f", "0e5e98b118c4", "1c5d0a683872", "20cc8965c47e", "25b2909fd8d6", "26f85c137928",
    "2a5769b97591", "2baa9064cad6", "2e565c44e39b", "379c71ff03e4", "3a1a2f107aa0", "3a5188b6b3f1", "3dcc2ea4bf77",
    "438ed034be55", "52a7cffc8293", "53d617f709bb", "5527352cb27f", "587d000c23e8", "5fcf5e952b30", "6276af483481",
    "6498b84ff053", "70f2a5b0d326", "715b9d8577dc", "7b31a9d4f152", "8109f65e403b", "876b597383c9", "8ad8972e9bbd",
    "8c62177bd3b1", "8c881c58dc1e", "8e236ca175d6", "9431c69de414", "9c50eec86bc1", "9eba73ee4d5d", "a4149a6bc0f1",
    "abcc55b02b08", "accd397438d3", "bf4c78d9276c", "cd7b40ff8902", "d517d2ba03f4", "df1ea93f589c", "e3ad7ca817f9",
    "e533a067cd5c", "eee34e80631a", "efe913d0934b", "fd3df039c963",
})
#: The demonstrator's first guess per (word_length, answers): the same for every episode, computed once.
_OPENERS: dict[tuple[int, int], str] = {}


def feedback(guess: str, answer: str) -> str:
    """The colour pattern of ``guess`` against ``answer`` (equal lengths): one character per letter, ``G`` green,
    ``Y`` yellow, ``.`` gray, with the standard duplicate-letter rule (module docstring): greens first, then
    yellows left to right while the answer has unmatched copies of the letter.

    >>> feedback("speed", "abide"), feedback("crane", "react")
    ('..Y.Y', 'YYG.Y')
    """
    pattern = ["."] * len(guess)
    left: dict[str, int] = {}
    for i, (g, a) in enumerate(zip(guess, answer, strict=True)):
        if g == a:
            pattern[i] = "G"
        else:
            left[a] = left.get(a, 0) + 1
    for i, g in enumerate(guess):
        if pattern[i] == "." and left.get(g, 0) > 0:
            pattern[i] = "Y"
            left[g] -= 1
    return "".join(pattern)


@functools.lru_cache(maxsize=1)
def _sources() -> tuple[frozenset[str], frozenset[str], frozenset[str], list[list[str]]]:
    """(web2 as cased, web2 lowercased, gcide lowercased, wordfreq's English frequency buckets), read once."""
    try:
        import wordfreq
        from english_words import get_english_words_set
    except ImportError as exc:
        raise ImportError(f"forkyard/Wordle-v0 needs the packages english-words and wordfreq ({exc}): "
                          "pip install 'forkyard[suite]'") from exc
    return (frozenset(get_english_words_set(["web2"])),
            frozenset(get_english_words_set(["web2"], alpha=True, lower=True)),
            frozenset(get_english_words_set(["gcide"], alpha=True, lower=True)),
            wordfreq.get_frequency_list("en", "large"))


@functools.lru_cache(maxsize=len(WORD_LENGTHS))
def word_lists(word_length: int) -> tuple[tuple[str, ...], frozenset[str]]:
    """``(answer pool, dictionary)`` for ``word_length``-letter words (module docstring): the pool in descending
    frequency (ties in wordfreq's order), the dictionary of accepted guesses (a superset of the pool). Loaded from
    the installed packages once per process (about 0.6 s).

    Raises:
        ImportError: english-words or wordfreq is not installed (the message names the extra to install).
    """
    web2_cased, web2, gcide, buckets = _sources()

    def fits(w: str) -> bool:
        return len(w) == word_length and w.isascii() and w.isalpha() and w.islower()

    pool: list[str] = []
    common: set[str] = set()
    for i, bucket in enumerate(buckets):
        for w in bucket:
            if not fits(w):
                continue
            if i <= _COMMON_BUCKET:
                common.add(w)
            if w in web2_cased and w in gcide and _digest(w) not in _EXCLUDED:
                pool.append(w)
    dictionary = frozenset(w for w in web2 | gcide if fits(w)) | common
    return tuple(pool), dictionary


def _digest(word: str) -> str:
    return hashlib.blake2b(word.encode("utf-8"), digest_size=6).hexdigest()


def _int_in(name: str, value: Any, lo: int, hi: int) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or not lo <= value <= hi:
        raise ValueError(f"{name} must be an int in {lo}..{hi}, got {value!r}")
    return value


def _best_guess(candidates: tuple[str, ...]) -> str:
    """The demonstrator's guess among ``candidates`` (consistent words, most frequent first): the one of the first
    :data:`SCORE_OPTIONS` that splits the first :data:`SCORE_SAMPLE` evenly spaced candidates into the most
    distinct feedback patterns (ties: the more frequent); with two candidates or fewer, the more frequent."""
    if len(candidates) <= 2:
        return candidates[0]
    step = max(1, len(candidates) // SCORE_SAMPLE)
    sample = candidates[::step][:SCORE_SAMPLE]
    best, best_score = candidates[0], -1
    for option in candidates[:SCORE_OPTIONS]:
        score = len({feedback(option, answer) for answer in sample})
        if score > best_score:
            best, best_score = option, score
    return best


class WordleEnv(TextEnv):
    """Wordle-v0 (see module docstring).

    Args:
        max_turns: guesses per episode, 1..20 (default 6).
        word_length: letters per word, 4, 5 or 6 (default 5).
        answers: size of the answer pool (the most frequent dictionary words), 20..the words available (3,872 at
            5 letters; default 1500).
        eval_answers: pool words held out from seeded resets for :meth:`evaluation_resets`, 1..answers // 2
            (default 100).
        shaping: weight of the shaped reward for new greens, a number in [0, 1] (default 0.0: reward 1 on solving
            only).
        render_mode: ``None`` or ``"ansi"``.

    Raises:
        ValueError: on a setting of the wrong type or out of range (the message names it and its range).
        ImportError: the word-list packages are missing (:func:`word_lists`).
    """

    max_observation_length = 2048
    max_action_length = 256
    fork_method = "state_codec"

    def __init__(self, max_turns: int = 6, word_length: int = 5, answers: int = 1500, eval_answers: int = 100,
                 shaping: float = 0.0, render_mode: str | None = None):
        _int_in("max_turns", max_turns, 1, MAX_TURNS)
        if word_length not in WORD_LENGTHS or isinstance(word_length, bool) or not isinstance(word_length, int):
            raise ValueError(f"word_length must be one of {WORD_LENGTHS}, got {word_length!r}")
        _int_in("answers", answers, MIN_ANSWERS, len(word_lists(word_length)[0]))
        _int_in("eval_answers", eval_answers, 1, answers // 2)
        if isinstance(shaping, bool) or not isinstance(shaping, (int, float)) or not 0.0 <= shaping <= 1.0:
            raise ValueError(f"shaping must be a number in [0, 1], got {shaping!r}")
        super().__init__(max_turns=max_turns, render_mode=render_mode, kwargs={
            "max_turns": max_turns, "word_length": word_length, "answers": answers, "eval_answers": eval_answers,
            "shaping": shaping})
        self.word_length = word_length
        self.shaping = float(shaping)
        self._set_words()
        self._answer = self.pool[0]
        # (word, pattern) of every accepted guess: a tuple, replaced and never mutated (forks may share it)
        self._guesses: tuple[tuple[str, str], ...] = ()
        self._cache: tuple[int, tuple[str, ...], str] | None = None  # (guesses seen, consistent pool words, pick)

    # ----------------------------------------------------------------- episode
    def _reset_task(self, options: dict[str, Any] | None) -> str:
        unknown = sorted(set(options or {}) - {"answer"})
        if unknown:
            raise ValueError(f"unknown reset options {unknown}; Wordle takes only 'answer'")
        fixed = (options or {}).get("answer")
        if fixed is not None and (not isinstance(fixed, str) or fixed not in self.pool):
            raise ValueError(f"options['answer'] must be a word of the answer pool ({len(self.pool)} "
                             f"{self.word_length}-letter words), got {fixed!r}")
        drawn = self._train[int(self.np_random.integers(len(self._train)))]  # drawn always: the same RNG stream
        self._answer = fixed if fixed is not None else drawn
        self._guesses, self._cache = (), None
        n = self.word_length
        return (
            f"Wordle: find the hidden {n}-letter English word in {self.max_turns} guesses. Call guess(word) with a "
            f"{n}-letter dictionary word, e.g. {format_action('guess', self.pool[0])}. Each letter of a guess comes "
            "back green (in the word at this position), yellow (in the word elsewhere; a repeated letter is yellow "
            "only as often as the word has copies left beyond its greens) or gray (not in the word, or no copies "
            f"left). The hidden word is one of the {len(self.pool)} most frequent {n}-letter words. A word not in "
            "the dictionary is refused and still uses up a guess.\n" + self._prompt())

    def _prompt(self) -> str:
        return f"Guess {self._turn + 1} of {self.max_turns}: call guess(word)."

    def _act(self, call: ToolCall) -> Outcome:
        n = self.word_length
        if call.name != "guess":
            raise IllegalActionError(f"this env has one tool: guess(word) with a {n}-letter English word, e.g. "
                                     f"{format_action('guess', self.pool[0])}; got {call.text()}.")
        args = bind_arguments(call, ["word"])
        word = args.get("word")
        if not isinstance(word, str):
            raise IllegalActionError(f"guess(word) needs the word as a quoted string, e.g. "
                                     f"{format_action('guess', self.pool[0])}; got {call.text()}.")
        word = word.strip().lower()
        if len(word) != n or not (word.isascii() and word.isalpha()):
            raise IllegalActionError(f"{word!r} is not a {n}-letter word of the letters a-z; this guess is used up.")
        if word not in self.dictionary:
            raise IllegalActionError(f"{word!r} is not in the dictionary; this guess is used up.")
        pattern = feedback(word, self._answer)
        green_before = {i for _, p in self._guesses for i, c in enumerate(p) if c == "G"}
        new_greens = sum(1 for i, c in enumerate(pattern) if c == "G" and i not in green_before)
        self._guesses = (*self._guesses, (word, pattern))
        reward = self.shaping * new_greens / n
        letters = ", ".join(f"{ch} {_COLOURS[c]}" for ch, c in zip(word, pattern, strict=True))
        text = f"{format_action('guess', word)} -> {letters} (pattern {pattern})."
        if word == self._answer:
            return Outcome(f"{text} Solved in {len(self._guesses)} guess(es).", reward=1.0 + reward,
                           terminated=True, reason="answered")
        if self._turn + 1 >= self.max_turns:
            text += f" The word was {self._answer!r}."
        return Outcome(text, reward=reward)

    def step(self, action: Action) -> tuple[str, float, bool, bool, dict[str, Any]]:
        """:meth:`TextEnv.step`; at the episode's end ``info["episode_metrics"]`` (module docstring)."""
        out = TextEnv.step(self, action)
        if self._done:
            out[4]["episode_metrics"] = {"success": float(out[2]),  # terminated only by solving
                                         "accepted_guesses": len(self._guesses)}
        return out

    # ----------------------------------------------------------------- visible state: candidates, menu, demonstrator
    def _consistent(self) -> tuple[tuple[str, ...], str]:
        """(pool words consistent with every feedback so far, most frequent first; the demonstrator's pick)."""
        cache = self._cache
        if cache is not None and cache[0] == len(self._guesses):
            return cache[1], cache[2]
        words, seen = (cache[1], cache[0]) if cache is not None and cache[0] < len(self._guesses) else (self.pool, 0)
        for guess, pattern in self._guesses[seen:]:
            words = tuple(w for w in words if feedback(guess, w) == pattern)
        if not words:  # cannot happen for a pool answer; kept total for a restored foreign state
            words = self.pool
        if self._guesses:
            pick = _best_guess(words)
        else:
            key = (self.word_length, len(self.pool))
            if key not in _OPENERS:
                _OPENERS[key] = _best_guess(words)
            pick = _OPENERS[key]
        self._cache = (len(self._guesses), words, pick)
        return words, pick

    def _legal_actions(self) -> list[str]:
        consistent, pick = self._consistent()
        ok = set(consistent)
        chosen = [pick] + [w for w in consistent[:MENU_CONSISTENT + MENU_RULED_OUT] if w != pick]
        ruled_out = [w for w in self.pool[:200] if w not in ok][:MENU_RULED_OUT]
        menu = chosen[:MENU_CONSISTENT + MENU_RULED_OUT - len(ruled_out)] + ruled_out
        return sorted(format_action("guess", w) for w in dict.fromkeys(menu))

    def demo_action(self, rng: random.Random, skill: float = 0.0) -> str:
        """A demonstration action (:class:`envs.features.Demonstrator`), from the visible feedback only: with
        probability ``skill`` the consistent-candidate solver's guess (among the answer-pool words consistent with
        every feedback so far, the one of the :data:`SCORE_OPTIONS` most frequent that splits up to
        :data:`SCORE_SAMPLE` of them into the most feedback patterns), else a uniformly random action of the menu
        (``info["legal_actions"]``; ``skill=0`` draws exactly what a random-menu policy draws). At 5 letters, 6
        guesses and the default pool, ``skill=1`` solves 98-100% of episodes, 94% at 4 letters
        (tests/envs/test_wordle.py); ``skill=0`` about 39%.

        Raises:
            ValueError: if ``skill`` is outside [0, 1].
        """
        return mixed_demo(rng, skill, lambda: format_action("guess", self._consistent()[1]), self._legal_actions)

    def tool_schemas(self) -> list[dict[str, Any]]:
        """The one tool, ``guess``, as a JSON-schema definition (:class:`envs.features.ToolSchemas`)."""
        n = self.word_length
        return [function_tool(
            "guess", f"guess a {n}-letter English word; every letter comes back green, yellow or gray, and a right "
                     "guess ends the episode with reward 1",
            {"word": {"type": "string", "minLength": n, "maxLength": n, "pattern": f"^[a-z]{{{n}}}$",
                      "description": f"a {n}-letter dictionary word, lowercase"}})]

    @classmethod
    def evaluation_resets(cls, kwargs: dict[str, Any], n_seeds: int) -> list[tuple[int, dict[str, str]]]:
        """Every held-out answer once: ``[(0, {"answer": w}) for w in held_out]`` (``eval_answers`` words spread
        over the pool's frequency ranks, never drawn by a seeded reset; ``n_seeds`` is ignored). The
        :class:`envs.features.EvaluationResets` feature.

        Raises:
            ValueError: on kwargs the constructor refuses.
        """
        return [(0, {"answer": w}) for w in cls(**kwargs).held_out]

    # ----------------------------------------------------------------- pickle, snapshot codec
    _WORDS = ("pool", "dictionary", "held_out", "_train")

    def __getstate__(self) -> dict[str, Any]:
        """:meth:`TextEnv.__getstate__` without the word lists (rebuilt from the packages on unpickling), so that a
        pickled or deep-copied env carries its episode, not some 13,000 words."""
        state = super().__getstate__()
        for name in self._WORDS:
            state.pop(name, None)
        state["_cache"] = None
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._set_words()

    def _set_words(self) -> None:
        """The answer pool, dictionary, held-out answers and training answers of this env's kwargs."""
        kw = self._kwargs
        pool, self.dictionary = word_lists(kw["word_length"])
        self.pool = pool[:kw["answers"]]
        stride = kw["answers"] // kw["eval_answers"]
        self.held_out = self.pool[stride // 2::stride][:kw["eval_answers"]]
        held = set(self.held_out)
        self._train = tuple(w for w in self.pool if w not in held)

    def _task_state(self) -> dict[str, Any]:
        return {"answer": self._answer, "guesses": [list(g) for g in self._guesses]}

    def _load_task_state(self, state: dict[str, Any]) -> None:
        self._answer = str(state["answer"])
        self._guesses = tuple((str(w), str(p)) for w, p in state["guesses"])
        self._cache = None
