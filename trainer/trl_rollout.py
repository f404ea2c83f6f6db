"""Tree-fork rollouts inside TRL: a ``rollout_func`` for ``GRPOTrainer`` that forks the env within each group.

TRL (1.16) hands ``rollout_func(prompts, trainer)`` its batch with each prompt ``num_generations`` (G) times
in a row and expects one completion per row: ``prompt_ids``, ``completion_ids``, ``logprobs`` and, for
multi-turn rollouts, ``env_mask`` (1 on the model's tokens, 0 on the env's). :class:`TreeForkRollout` plays
each group as one forkyard tree (:func:`trainer.waves.tree_rollout` with one base and G branches): the
base episode runs to its end, then G-1 branches restart from a fork of the env (and of the token
context) at the fork turn and each samples its own continuation. So the G completions of a group share
their prefix and differ from the fork turn on: siblings that really share a state (the tree-fork
argument; GiGPO, arXiv:2505.10978, groups steps by shared state, which independent rollouts rarely give
it). TRL's group-normalised advantage then compares the branches; the shared prefix, the same tokens in
every row of the group, gets the group's summed advantage, zero.

Each turn (every live session of the call's groups together by default, :mod:`trainer.trl_engine`; one at a time
with ``sampler="serial"``, the same draws): the model's reply is sampled with ``temperature`` from the
chat-template context (prompt, the env's first observation appended to the last user message as TRL's
``environment_factory`` does, and the tools' JSON schemas) until a stop id (:func:`trainer.stops.stop_ids`: the
tokenizer's EOS and every id of the model's generation config, as TRL's own generation stops; field case S50),
read by :func:`envs.tool_calls.parse_model_output` (any other text reaches the env as written: its invalid-action
observation), and stepped; the env's reply is appended as a tool message, laid out token for token as TRL's own
tool loop lays it out (:meth:`ChatPolicy.tool_suffix`). Token ids are kept as generated, never re-tokenised;
``logprobs`` are the sampling distribution's (natural log, 0.0 on env tokens). ``env_reward`` (each branch's
summed env reward, None when the infrastructure lost it) goes to :meth:`TreeForkRollout.reward`, the reward
function to pass in ``reward_funcs``::

    rollout = TreeForkRollout("forkyard/ClueProbe-v0", max_turns=4)          # server_url=... for a server
    trainer = GRPOTrainer(model=model, processing_class=tok, args=config, train_dataset=rows,
                          reward_funcs=[rollout.reward], rollout_func=rollout)

Each group's env is reset with a seed drawn from ``seed``, the trainer's step and the group's index; the
fork turn is uniform over the turns the base took or, with ``fork_turn="entropy"``, the turn where the
next-token entropy at the start of the model's reply was highest (ARPO, arXiv:2507.19849). With
``fork_turn="none"`` the group is G independent episodes of the same task (:func:`trainer.waves.group_rollout`,
every episode reset with the group's seed): the same sampling, layout and rewards without the fork, the
control that isolates what the fork adds.
"""

from __future__ import annotations

import random
from typing import Any, Callable

import gymnasium as gym
import torch

from envs.actions import ActionParseError
from envs.core import EnvInfraError
from envs.tool_calls import parse_model_output
from envs.trl import env_tools
from trainer.rollout import Episode, Rollout, Step
from trainer.waves import group_rollout, tree_rollout
from trainer.stops import stop_ids
from trainer.trl_engine import MAX_BATCH, Group, Reply, Tree, group_rollouts, sample_rows, tree_rollouts


class ChatSession:
    """One branch's token context (prompt + completion so far) for :func:`trainer.waves.tree_rollout`.

    Attributes:
        completion: token ids after the prompt (the model's and the env's).
        logprobs: per completion token, the sampling log-prob (0.0 on env tokens).
        mask: per completion token, 1 for the model's, 0 for the env's.
    """

    def __init__(self, policy: "ChatPolicy", prompt: list[int], turn: int = 0):
        self.policy, self.prompt, self.turn = policy, prompt, turn
        self.completion: list[int] = []
        self.logprobs: list[float] = []
        self.mask: list[int] = []
        self.anchor_key = ""

    @property
    def ids(self) -> list[int]:
        """The context the next reply is sampled after: prompt + completion so far."""
        return self.prompt + self.completion

    def act(self, rng: random.Random) -> Step:
        return self.record(*self.policy.sample(self.ids, rng))

    def record(self, new: list[int], logps: list[float], entropy: float) -> Step:
        """Append a sampled reply (:data:`trainer.trl_engine.Reply`) to the context and read its action."""
        self.completion += new
        self.logprobs += logps
        self.mask += [1] * len(new)
        ended = bool(new) and new[-1] in self.policy.stops  # any stop id ends the turn as the EOS does (S50)
        if not ended:  # cut at max_new_tokens: the turn is closed for the context, not by the model (mask 0)
            self.completion.append(self.policy.tokenizer.eos_token_id)
            self.logprobs.append(0.0)
            self.mask.append(0)
        text = self.policy.tokenizer.decode(new[:-1] if ended else new)
        try:
            action = parse_model_output(text, self.policy.tools)
        except ActionParseError:
            action = text.strip()  # the env answers with its invalid-action observation
        step = Step(self.turn, self.anchor_key, action, float(sum(logps)), entropy, data=self)
        self.turn += 1
        return step

    def observe(self, observation: str, info: dict[str, Any]) -> None:
        suffix = self.policy.tool_suffix(observation)
        self.completion += suffix
        self.logprobs += [0.0] * len(suffix)
        self.mask += [0] * len(suffix)
        self.anchor_key = info.get("anchor_key", "")

    def fork(self) -> "ChatSession":
        twin = ChatSession(self.policy, self.prompt, self.turn)
        twin.completion, twin.logprobs, twin.mask = list(self.completion), list(self.logprobs), list(self.mask)
        twin.anchor_key = self.anchor_key
        return twin

    def entropy(self) -> float:
        return self.policy.next_token_entropy(self.ids)


class ChatPolicy:
    """A causal LM and its chat template as the :class:`trainer.rollout.Actor` of one group's tree.

    Args:
        model: a ``transformers`` causal LM (its device is used).
        tokenizer: its tokenizer, with a chat template that renders ``tools=`` and tool messages.
        messages: the group's prompt (chat messages).
        tools: the env's JSON-schema tools.
        temperature: sampling temperature (> 0).
        max_new_tokens: most tokens of one reply.
        chat_template: the template to render with (None: the tokenizer's own). TRL renders with its training
            template where it has one (``trainer.chat_template``), whose turns append without rewriting earlier ones.

    Attributes:
        stops: the ids that end a reply, :func:`trainer.stops.stop_ids` of ``model`` and ``tokenizer``.

    Raises:
        ValueError: neither the tokenizer nor the model names an end-of-sequence id.
    """

    def __init__(self, model: Any, tokenizer: Any, messages: list[dict], tools: list[dict], temperature: float,
                 max_new_tokens: int, chat_template: str | None = None):
        self.model, self.tokenizer, self.messages, self.tools = model, tokenizer, messages, tools
        self.chat_template = chat_template
        self.temperature, self.max_new_tokens = temperature, max_new_tokens
        self.device = next(model.parameters()).device
        self.stops = stop_ids(model, tokenizer)
        self._suffixes: dict[str, list[int]] = {}

    def session(self, observation: str, info: dict[str, Any]) -> ChatSession:
        last = self.messages[-1]
        messages = self.messages[:-1] + [{**last, "content": last["content"] + observation}]
        prompt = self.tokenizer.apply_chat_template(messages, tools=self.tools, add_generation_prompt=True,
                                                    tokenize=True, return_dict=False, chat_template=self.chat_template)
        session = ChatSession(self, list(prompt))
        session.anchor_key = info.get("anchor_key", "")
        return session

    def sample(self, ids: list[int], rng: random.Random) -> Reply:
        """One reply after ``ids``: (new token ids up to and including a stop id, their log-probs, first-token entropy),
        drawn from ``rng`` (:func:`trainer.trl_engine.sample_rows` with one row: the draws of a batch)."""
        return self.sample_many([ids], [rng])[0]

    def sample_many(self, contexts: list[list[int]], rngs: list[random.Random],
                    before_draw: Callable[[int, float], None] | None = None) -> list[Reply]:
        """One reply after each context, sampled together, row b from ``rngs[b]``
        (:func:`trainer.trl_engine.sample_rows` with this policy's model and settings)."""
        tok = self.tokenizer
        pad = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
        return sample_rows(self.model, contexts, rngs, self.temperature, self.max_new_tokens, self.stops, pad,
                           before_draw)

    @torch.no_grad()
    def next_token_entropy(self, ids: list[int]) -> float:
        """Entropy (nats) of the sampling distribution of the reply's first token after ``ids``."""
        logits = self.model(input_ids=torch.tensor([ids], device=self.device)).logits[0, -1].float()
        logp = torch.log_softmax(logits / self.temperature, dim=-1)
        return float(-(logp.exp() * logp).sum())

    def tool_suffix(self, content: str) -> list[int]:
        """Token ids of a tool message carrying ``content`` and the next generation prompt, after the
        assistant's turn end: the delta of two renderings of a short conversation, the first cut after its last
        stop id (:attr:`stops`). TRL's tool loop cuts after its tokenizer's EOS; where that EOS closes the
        template's turns (the tokenizer of a chat model) the two agree, and where the template closes them with
        another listed id (``<|im_end|>`` under a base tokenizer's ``<|endoftext|>``) the cut keeps what the
        template writes after it (its newline) in the delta, as the template renders it (field case S50)."""
        if content not in self._suffixes:
            tok = self.tokenizer
            dummy = [{"role": "user", "content": "dummy"},
                     {"role": "assistant", "content": "",
                      "tool_calls": [{"type": "function", "function": {"name": "tool", "arguments": {}}}]}]
            prefix = list(tok.apply_chat_template(dummy, tokenize=True, return_dict=False,
                                                  chat_template=self.chat_template))
            full = list(tok.apply_chat_template(dummy + [{"role": "tool", "name": "tool", "content": content}],
                                                add_generation_prompt=True, tokenize=True, return_dict=False,
                                                chat_template=self.chat_template))
            ends = [i for i, t in enumerate(prefix) if t in self.stops]
            prefix = prefix[:ends[-1] + 1] if ends else prefix
            if full[:len(prefix)] != prefix:
                raise ValueError("the chat template does not append a tool message to a conversation")
            self._suffixes[content] = full[len(prefix):]
        return self._suffixes[content]


def training_template(trainer: Any) -> str | None:
    """The chat template a multi-turn rollout renders with: the trainer's (TRL swaps in a prefix-preserving
    training template when its own tool loop runs), else TRL's training template for a tokenizer whose template
    rewrites earlier turns (Qwen3's drops reasoning from past turns), else None (the tokenizer's own)."""
    from trl.chat_template_utils import get_training_chat_template, is_chat_template_prefix_preserving

    if getattr(trainer, "chat_template", None) is not None:
        return trainer.chat_template
    tok = trainer.processing_class
    return None if is_chat_template_prefix_preserving(tok) else get_training_chat_template(tok)


class TreeForkRollout:
    """TRL's ``rollout_func`` playing each group of G rows as one tree-fork rollout (module docstring).

    Args:
        env_id: a registered env id; the env must offer ``tool_schemas()``.
        fork_turn: ``"uniform"``, ``"entropy"``, or ``"none"`` (G independent episodes, no fork).
        seed: base of the groups' reset seeds.
        temperature: sampling temperature.
        max_new_tokens: most tokens of one reply.
        sampler: ``"batched"`` (default): every group of a call played together, the live sessions of a wave
            sampled in one batched forward per token (:mod:`trainer.trl_engine`); ``"serial"``: one group, one
            session after another (:func:`trainer.waves.tree_rollout` / :func:`~trainer.waves.group_rollout`).
            Both draw alike: the same seeds give the same rows.
        max_batch: most sessions in one batched forward (``sampler="batched"``).
        **env_kwargs: the env's kwargs (``server_url=...`` runs it on a forkyard server, forks included).

    Attributes:
        env_calls: env steps taken so far (every branch's).
        episodes: the :class:`trainer.rollout.Episode` list of the last call, row for row.

    Raises:
        ValueError: an unknown ``fork_turn`` or ``sampler``, or ``max_batch < 1``.

    Raises (on call):
        ValueError: rows not in groups of ``trainer.num_generations`` (``num_generations_eval`` in evaluation)
            identical prompts.
    """

    def __init__(self, env_id: str, *, fork_turn: str = "uniform", seed: int = 0, temperature: float = 1.0,
                 max_new_tokens: int = 64, sampler: str = "batched", max_batch: int = MAX_BATCH, **env_kwargs: Any):
        if fork_turn not in ("uniform", "entropy", "none"):
            raise ValueError(f"fork_turn must be 'uniform', 'entropy' or 'none', got {fork_turn!r}")
        if sampler not in ("batched", "serial"):
            raise ValueError(f"sampler must be 'batched' or 'serial', got {sampler!r}")
        if max_batch < 1:
            raise ValueError(f"max_batch must be >= 1, got {max_batch}")
        self.env_id, self.env_kwargs, self.fork_turn, self.seed = env_id, env_kwargs, fork_turn, seed
        self.temperature, self.max_new_tokens = temperature, max_new_tokens
        self.sampler, self.max_batch = sampler, max_batch
        self.env_calls = 0
        self.episodes: list[Episode] = []

    def __call__(self, prompts: list[list[dict]], trainer: Any) -> dict[str, list]:
        g = trainer.num_generations if trainer.model.training else trainer.num_generations_eval
        if len(prompts) % g or any(prompts[i] != prompts[i - i % g] for i in range(len(prompts))):
            raise ValueError(f"rollout_func expects each prompt {g} times in a row (num_generations); got "
                             f"{len(prompts)} rows")
        model = trainer.accelerator.unwrap_model(trainer.model)
        was_training = model.training
        model.eval()
        out: dict[str, list] = {"prompt_ids": [], "completion_ids": [], "logprobs": [], "env_mask": [],
                                "env_reward": []}
        self.episodes = []
        tok, template = trainer.processing_class, training_template(trainer)
        groups = [(prompts[j * g], self.seed * 1_000_003 + trainer.state.global_step * 1009 + j)
                  for j in range(len(prompts) // g)]
        try:
            rollouts = self.play(model, tok, template, groups, g)
        finally:
            model.train(was_training)
        for (messages, seed), rollout in zip(groups, rollouts, strict=True):
            self._rows(rollout, tok, template, messages, g, seed, out)
        return out

    def play(self, model: Any, tok: Any, template: str | None, groups: list[tuple[list[dict], int]],
             g: int) -> list[Rollout]:
        """One :class:`trainer.rollout.Rollout` per ``(messages, reset seed)`` of ``groups``: a tree of one base and
        ``g`` branches (``fork_turn="none"``: ``g`` independent episodes), each group on its own env (closed on
        return), sampled with ``self.sampler``. A group whose env was lost before its tree started gets an empty
        rollout."""
        envs_: list[Any] = []
        specs: list[tuple[Any, ChatPolicy, int] | None] = []
        try:
            for messages, seed in groups:
                env = gym.make(self.env_id, **self.env_kwargs).unwrapped
                envs_.append(env)
                try:
                    tools = env_tools(env, self.env_id, seed)
                except EnvInfraError:  # lost before its tree started: every row of the group is lost (_rows)
                    specs.append(None)
                    continue
                policy = ChatPolicy(model, tok, messages, tools, self.temperature, self.max_new_tokens, template)
                specs.append((env, policy, seed))
            if self.sampler == "serial":
                return [self._serial(spec, g) for spec in specs]
            live = [spec for spec in specs if spec is not None]
            if self.fork_turn == "none":
                played = iter(group_rollouts([Group(env, policy, [seed] * g, random.Random(seed))
                                              for env, policy, seed in live], self.max_batch))
            else:
                played = iter(tree_rollouts([Tree(env, policy, g, [seed], random.Random(seed))
                                             for env, policy, seed in live], self.fork_turn, self.max_batch))
            return [next(played) if spec is not None else Rollout("tree", []) for spec in specs]
        finally:
            for env in envs_:
                env.close()

    def _serial(self, spec: tuple | None, g: int) -> Rollout:
        if spec is None:
            return Rollout("tree", [])
        env, policy, seed = spec
        try:
            if self.fork_turn == "none":
                return group_rollout(env, policy, g, [seed] * g, random.Random(seed))
            return tree_rollout(env, policy, 1, g, [seed], random.Random(seed), self.fork_turn)
        except EnvInfraError:
            return Rollout("tree", [])

    def _rows(self, rollout: Rollout, tok: Any, template: str | None, messages: list[dict], g: int, seed: int,
              out: dict[str, list]) -> None:
        """Append a group's g rows to ``out`` (TRL's columns and ``env_reward``) and its episodes to
        :attr:`episodes`."""
        self.env_calls += rollout.env_calls
        fallback = None
        lost = [Episode(seed=seed, base=0, branch=j, infra_failure=True, reason="infra_error")
                for j in range(len(rollout.episodes), g)]  # a base lost at its reset: no branch was started
        for ep in rollout.episodes + lost:
            session: ChatSession | None = ep.steps[-1].data if ep.steps else None
            if session is None and fallback is None:  # lost before its first action: a row TRL can still hold
                fallback = list(tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=True,
                                                        return_dict=False, chat_template=template))
            out["prompt_ids"].append(session.prompt if session is not None else fallback)
            out["completion_ids"].append(session.completion if session else [tok.eos_token_id])
            out["logprobs"].append(session.logprobs if session else [0.0])
            out["env_mask"].append(session.mask if session else [0])
            out["env_reward"].append(None if ep.infra_failure or session is None else float(ep.reward))
            self.episodes.append(ep)

    def reward(self, completions: list, env_reward: list[float | None], **kwargs: Any) -> list[float | None]:
        """The reward function for ``reward_funcs``: each row's env reward (None: lost to the infrastructure)."""
        return list(env_reward)


__all__ = ["ChatPolicy", "ChatSession", "TreeForkRollout", "training_template"]
