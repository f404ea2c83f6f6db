"""Hugging Face ``transformers`` causal LMs as the text policy's model (``pip install 'forkyard[hf]'``).

:class:`HFCausalLM` puts any ``AutoModelForCausalLM`` behind the interface the text policy uses
(:class:`trainer.text.lm.CausalLM`): ``forward(ids, past) -> (logits, past)`` with ids ``[B, T]`` int64 and logits
``[B, T, V]``, plus ``config.context`` / ``config.vocab_size``. The cache it hands out is a plain list of
``(keys, values)`` tensors, rebuilt into a fresh ``DynamicCache`` at each call: a transformers cache is
updated in place, and forked policy sessions share their prefix's cache, so none may be (keys and values
are appended with ``torch.cat``, which leaves the tensors of the list untouched).

Checkpoints are Hugging Face folders (:func:`save_folder` / :func:`load_folder`): ``save_pretrained`` of the
model (``config.json``, ``model.safetensors``), of a ``PreTrainedTokenizerFast`` with a chat template that
renders exactly the text policy's template (:func:`hf_tokenizer`), and ``forkyard.json`` (forkyard's own
tokenizer and metadata). A folder written elsewhere (a user's Qwen, Llama or SmolLM checkpoint) loads through
the same path; its tokenizer is used through :class:`HFTokenizerAdapter`, which adds the template's role
tokens when the tokenizer lacks them (and resizes the embeddings). Nothing is downloaded: folders are local
paths and tests build their models from configs (:func:`build_llama`).

Why one file: it is everything forkyard does with ``transformers`` (the optional ``hf`` extra: nothing else
imports it), and the model, the tokenizer adapter, the chat templates and the folders share one convention
for special tokens; split, each part would need the others to be read.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

import torch
import torch.nn as nn

from trainer.text.lm import SPECIAL_TOKENS, LMConfig, SpecialTokenIds
from trainer.text.text_policy import ChatTemplate
from trainer.stops import stop_ids
from trainer.update import resolve_device

#: forkyard's metadata file in a model folder.
META_FILE = "forkyard.json"

#: The chat template of :class:`trainer.text.text_policy.ChatTemplate` in Jinja (``tokenizer.apply_chat_template``):
#: ``<|bos|>``, then per message a role token, the content and ``<|end|>``; the generation prompt is
#: ``<|assistant|>``. Tools, when given, open the first user turn as JSON lines. An assistant message with
#: ``tool_calls`` (the OpenAI / Hugging Face message form, as TRL's tool loop writes them) renders each call
#: after its content as ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``, a form
#: :func:`envs.tool_calls.parse_model_output` reads; messages without tool calls render as before, so the
#: text policy's ids still equal the template's.
CHAT_TEMPLATE = (
    "{{ '<|bos|>' }}{% for m in messages %}"
    "{% if m['role'] == 'user' %}{{ '<|user|>' }}"
    "{% if loop.first and tools %}{% for t in tools %}{{ t | tojson }}{{ '\\n' }}{% endfor %}{% endif %}"
    "{{ m['content'] }}{{ '<|end|>' }}"
    "{% elif m['role'] == 'assistant' %}{{ '<|assistant|>' + (m['content'] or '') }}"
    "{% for c in m['tool_calls'] or [] %}{% set f = c['function'] if c['function'] is defined else c %}"
    "{{ '<tool_call>{\"name\": ' + (f['name'] | tojson) + ', \"arguments\": ' }}"
    "{% if f['arguments'] is string %}{{ f['arguments'] }}{% else %}{{ f['arguments'] | tojson }}{% endif %}"
    "{{ '}</tool_call>' }}{% endfor %}{{ '<|end|>' }}"
    "{% elif m['role'] == 'tool' %}{{ '<|tool|>' + m['content'] + '<|end|>' }}{% endif %}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|assistant|>' }}{% endif %}"
)

#: How an assistant turn of :data:`CHAT_TEMPLATE` parses back into a message (transformers' response
#: templates, ``tokenizer.parse_response``, transformers >= 5.13; TRL's tool loop reads tool calls with it):
#: text up to the first ``<tool_call>`` is the content, each ``<tool_call>`` block a JSON call, ``<|end|>``
#: closes the turn. Saved with the tokenizer (``tokenizer_config.json``).
RESPONSE_TEMPLATE = {
    "defaults": {"role": "assistant"},
    "start_anchor": "<|assistant|>",
    "fields": {
        "tool_calls": {"open": "<tool_call>", "close_pattern": "</tool_call>\\s*", "repeats": True, "content": "json",
                       "transform": {"type": "function", "function": "{content}"}},
        "content": {"close_pattern": "<\\|end\\|>\\s*", "content": "text"},
    },
}


@lru_cache(maxsize=1)
def _fill_layer():
    """transformers' ``DynamicLayer`` over preallocated buffers ``[B, H, S, dh]`` whose first ``fill`` slots hold the
    cache: ``update`` writes the new keys and values into the next slots in place and returns views of the filled
    slots (a ``DynamicLayer`` concatenates, copying the whole cache at every decoded token). Built on first use:
    transformers is imported only by the ``hf`` extra's code paths."""
    from transformers.cache_utils import DynamicLayer

    class FillLayer(DynamicLayer):
        def __init__(self, keys: torch.Tensor, values: torch.Tensor, fill: int):
            super().__init__()
            self.device, self.buffers, self.fill, self.is_initialized = keys.device, (keys, values), fill, True
            self.keys, self.values = keys[:, :, :fill], values[:, :, :fill]

        def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
            k, v = self.buffers
            t = key_states.shape[-2]
            if self.fill + t > k.shape[2]:
                raise ValueError(f"{self.fill + t} slots exceed the preallocated cache of {k.shape[2]}")
            k[:, :, self.fill:self.fill + t] = key_states
            v[:, :, self.fill:self.fill + t] = value_states
            self.fill += t
            self.keys, self.values = k[:, :, :self.fill], v[:, :, :self.fill]
            return self.keys, self.values

        def get_seq_length(self) -> int:
            return self.fill

    return FillLayer


@dataclass
class HFModelConfig:
    """The part of a model's config the text policy reads: ``context`` (longest window, tokens) and
    ``vocab_size`` (logit width)."""

    context: int
    vocab_size: int


class HFCausalLM(nn.Module):
    """A ``transformers`` causal LM behind :class:`trainer.text.lm.CausalLM` (module docstring).

    Args:
        hf: a ``PreTrainedModel`` with a causal-LM head.
        tokenizer: the text policy's tokenizer for it (forkyard's own, or an :class:`HFTokenizerAdapter`, whose
            suppressed ids then leave out the model's stop ids: :meth:`HFTokenizerAdapter.allow_stops`).
    """

    def __init__(self, hf, tokenizer):
        super().__init__()
        self.hf = hf
        self.tokenizer = tokenizer
        if isinstance(tokenizer, HFTokenizerAdapter):
            tokenizer.allow_stops(stop_ids(hf, tokenizer))
        self.config = HFModelConfig(int(hf.config.max_position_embeddings),
                                    int(hf.get_output_embeddings().weight.shape[0]))
        import inspect

        # transformers 5.2x names the cache argument `cache` (`past_key_values` before, now deprecated); a
        # peft model passes it through to its base model.
        base = hf.get_base_model() if hasattr(hf, "get_base_model") else hf
        self._cache_kw = "cache" if "cache" in inspect.signature(base.forward).parameters else "past_key_values"

    #: :meth:`forward` takes ``fill`` (preallocated cache buffers written in place) and ``logits_at``, as
    #: :meth:`trainer.text.lm.TinyCausalLM.forward` does: the batched engine's decoding then never copies the cache.
    in_place_cache = True

    def forward(self, ids: torch.Tensor, past: list[tuple[torch.Tensor, torch.Tensor]] | None = None,
                mask: torch.Tensor | None = None, positions: torch.Tensor | None = None,
                attention: torch.Tensor | None = None, fill: int | None = None,
                logits_at: torch.Tensor | None = None):
        """``(logits [B, T, V], cache)`` of ``ids`` [B, T] after the slots ``past`` holds (None: none).
        Without ``fill`` the ``past`` given is never modified. ``mask`` [B, P + T] bool (True: a real token) and
        ``positions`` [B, T] int64 go to the model as ``attention_mask`` and ``position_ids`` (padded batches,
        :meth:`trainer.text.lm.TinyCausalLM.forward`). In training mode or with gradients on (the RL update's eval-mode
        forward, :func:`trainer.update.dropout_off`), without ``past``, no cache is built (the cache returned is
        None): gradient checkpointing recomputes activations and cannot keep one. ``attention`` [B, T, T] bool
        (without ``past`` and ``mask``; True: query i attends key j) goes to the model as a 4D additive mask,
        which ``transformers`` uses as given (a packed prefix tree, :mod:`trainer.text.tree_update`). ``fill``: with
        ``past``, its tensors are buffers of at least ``fill + T`` slots whose first ``fill`` hold the cache; the new
        keys and values are written into them in place and the buffers are returned (``past`` is then modified).
        ``logits_at`` [B] int64: only that position's logits of each row are returned ([B, 1, V]). Raises
        ValueError past ``config.context`` positions, and with ``attention`` under an attention implementation other
        than sdpa or eager (flash-attention kernels would drop the mask)."""
        from transformers import DynamicCache

        p = fill if fill is not None else 0 if past is None else past[0][0].shape[2]
        last = p + ids.shape[1] if positions is None else int(positions.max()) + 1
        if last > self.config.context:
            raise ValueError(f"{last} positions exceed the model context {self.config.context}")
        extra = {} if mask is None else {"attention_mask": mask.long(), "position_ids": positions}
        if attention is not None:
            kind = getattr(self.hf.config, "_attn_implementation", None) or "eager"
            if kind not in ("sdpa", "eager"):  # flash-attention kernels take no arbitrary mask
                raise ValueError(f"a tree attention mask needs the sdpa or eager attention, not {kind!r}; "
                                 "load the model with attn_implementation='sdpa' or train with --update flat")
            dtype = self.hf.get_input_embeddings().weight.dtype
            additive = torch.zeros(attention.shape, dtype=dtype, device=ids.device)
            additive.masked_fill_(~attention, torch.finfo(dtype).min)
            extra = {"attention_mask": additive[:, None], "position_ids": positions}
        if past is None and (self.hf.training or torch.is_grad_enabled()):
            return self.hf(input_ids=ids, use_cache=False, **extra).logits, None
        if fill is not None and past is not None:
            cache = DynamicCache()
            cache.layers = [_fill_layer()(k, v, fill) for k, v in past]
        else:
            cache = DynamicCache(ddp_cache_data=past) if past is not None else DynamicCache()
        out = self.hf(input_ids=ids, use_cache=True, **extra, **{self._cache_kw: cache})
        logits = out.logits
        if logits_at is not None:
            logits = logits[torch.arange(logits.shape[0], device=logits.device), logits_at][:, None]
        if fill is not None and past is not None:
            return logits, past
        new = out.get("cache", None) or out.get("past_key_values", None)
        return logits, [(layer.keys, layer.values) for layer in new.layers]

    @property
    def lora(self) -> bool:
        """Whether the model carries LoRA adapters (:func:`configure_training`)."""
        return hasattr(self.hf, "merge_and_unload")

    def plain(self):
        """The ``PreTrainedModel`` to save: the model itself, or with LoRA a copy with the adapters merged into
        its weights (so a saved folder loads with ``AutoModelForCausalLM`` alone)."""
        if not self.lora:
            return self.hf
        import copy

        return copy.deepcopy(self.hf).merge_and_unload()


def configure_training(model, gradient_checkpointing: bool = False, lora_rank: int = 0,
                       lora_alpha: float = 16.0) -> "HFCausalLM":
    """Training options of a Hugging Face policy, applied in place; returns ``model``.

    Args:
        gradient_checkpointing: recompute activations in the backward pass (``activation_checkpointing_enable``):
            less activation memory, about one more forward pass of compute per update.
        lora_rank: 0 trains every weight; r > 0 freezes them and trains rank-r adapters (Hu et al. 2021,
            "LoRA", eq. 3: ``W x + (alpha / r) B A x``) on every linear layer (``peft``,
            ``target_modules="all-linear"``, which leaves out the output layer), plus the input embedding
            rows of tokens the tokenizer added (role tokens a user's checkpoint lacked: frozen, they would
            keep their resize init). On a model with untied output embeddings the output rows of those
            tokens stay at their init; a tokenizer with its own chat template adds none.
        lora_alpha: the LoRA scale numerator (alpha).

    Raises:
        ValueError: an option on a model that is not a Hugging Face model (forkyard's ``--arch tiny``), or a
            negative rank. A model that already has adapters keeps them.
        ImportError: ``peft`` is missing (``pip install 'forkyard[hf]'``).
    """
    if not (gradient_checkpointing or lora_rank):
        return model
    if not isinstance(model, HFCausalLM):
        raise ValueError("gradient checkpointing and LoRA need a Hugging Face model (--arch llama or --model FOLDER)")
    if lora_rank < 0 or not lora_alpha > 0:
        raise ValueError(f"lora_rank must be >= 0 and lora_alpha > 0, got {lora_rank} and {lora_alpha}")
    if gradient_checkpointing:
        hf = model.hf
        if hasattr(hf, "activation_checkpointing_enable"):  # transformers >= 5.2x's name
            hf.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
        else:
            hf.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    if lora_rank and not model.lora:  # a model that has its adapters keeps them (SFT then RL in one process)
        from peft import LoraConfig, get_peft_model

        added = sorted(model.tokenizer.special[t] for t in getattr(model.tokenizer, "added", ()))
        config = LoraConfig(r=lora_rank, lora_alpha=lora_alpha, lora_dropout=0.0, bias="none",
                            target_modules="all-linear", trainable_token_indices=added or None)
        model.hf = get_peft_model(model.hf, config)
    return model


def build_llama(cfg: LMConfig, tokenizer, device: str = "auto", dtype: str = "float32", seed: int = 0) -> HFCausalLM:
    """A fresh ``LlamaForCausalLM`` of ``cfg``'s size (width, depth, heads, context; MLP 4x width, tied
    embeddings, no dropout) for ``tokenizer``'s vocabulary, on ``device`` in ``dtype``: the text policy's
    default model in a standard architecture. Builds from the config alone (nothing downloaded).

    Llama rather than Qwen2: ``AutoTokenizer`` gives a ``qwen2`` folder Qwen2's own pre-tokenizer whatever
    its ``tokenizer.json`` says (transformers 5), so a server loading the folder would tokenize our BPE
    differently; a ``llama`` folder loads its ``tokenizer.json`` as written (tested)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    hf_cfg = LlamaConfig(vocab_size=tokenizer.vocab_size, hidden_size=cfg.d_model, intermediate_size=4 * cfg.d_model,
                         num_hidden_layers=cfg.n_layers, num_attention_heads=cfg.n_heads,
                         num_key_value_heads=cfg.n_heads, max_position_embeddings=cfg.context,
                         tie_word_embeddings=True, attention_dropout=0.0,
                         pad_token_id=tokenizer.pad_id, bos_token_id=tokenizer.bos_id, eos_token_id=tokenizer.eot_id)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        hf = LlamaForCausalLM(hf_cfg)
    return HFCausalLM(hf.to(device=resolve_device(device), dtype=getattr(torch, dtype)), tokenizer).eval()


def hf_tokenizer(tokenizer):
    """forkyard's BPE tokenizer (:class:`trainer.text.tokenizer.BPETokenizer`) as a ``PreTrainedTokenizerFast``
    with the same ids (its role tokens as special tokens right after the BPE vocabulary),
    :data:`CHAT_TEMPLATE` and :data:`RESPONSE_TEMPLATE` (so TRL's tool loop takes it as it is). Raises ValueError
    for the byte-level tokenizer (no ``tokenizers`` model)."""
    from transformers import PreTrainedTokenizerFast

    tk = getattr(tokenizer, "_tk", None)
    if tk is None:
        raise ValueError("only the BPE tokenizer has a Hugging Face form; train with --tokenizer bpe")
    from tokenizers import Tokenizer

    tk = Tokenizer.from_str(tk.to_str())
    tk.add_special_tokens(list(SPECIAL_TOKENS))
    fast = PreTrainedTokenizerFast(tokenizer_object=tk, bos_token="<|bos|>", eos_token="<|end|>", pad_token="<|pad|>",
                                   additional_special_tokens=["<|user|>", "<|assistant|>", "<|tool|>"])
    fast.chat_template = CHAT_TEMPLATE
    fast.response_template = RESPONSE_TEMPLATE
    return fast


#: Placeholders a tokenizer's own chat template is rendered with (Unicode private-use code points): the text
#: around them is the template's, tokenized with its special tokens; what replaces them is content.
_CONTENT, _ACTION = "\ue000", "\ue001"


#: A tool definition a template is tried with, to learn whether it renders ``tools=``.
_PROBE_TOOL = {"type": "function", "function": {"name": "probe", "description": "d", "parameters": {
    "type": "object", "properties": {"k": {"type": "integer"}}, "required": ["k"]}}}


class HFChatTemplate(ChatTemplate):
    """The text policy's template (:class:`trainer.text.text_policy.ChatTemplate`: ``first``, ``observation``,
    ``render``, ``encode_observation``) rendered by a Hugging Face tokenizer's own chat template, with the env's
    tools (``tools=``), for a user's checkpoint whose tokenizer has one (Qwen, Llama 3, SmolLM, ...).

    The template is rendered once with placeholders (a user turn, an assistant turn, a tool turn), and the
    text around them is tokenized with the template's special tokens; observations are tokenized as content
    (special-token text in an observation stays text) and appended as deltas, so a session's ids only grow
    and are never re-tokenised. The end-of-turn id (``eot_id``) is the special token that closes an assistant
    message (``<|im_end|>`` for ChatML templates); what the template puts after it (a newline) opens the next
    observation's delta. For a template that inserts message content verbatim (ChatML, Qwen) the decoded ids
    of an episode equal ``apply_chat_template`` of its messages (tested); one that transforms content (Llama 3
    trims it) gets the content untransformed, and a template whose text depends on the day (``strftime_now``)
    fixes it at construction. The ids may split differently at the placeholders' edges than tokenizing that
    text whole.

    Raises:
        ValueError: a template that re-renders earlier turns when a turn is appended (not append-only), that
            has no tool role, whose assistant turn opens with another header than its generation prompt, or
            whose assistant message is not closed by a special token.
    """

    def __init__(self, tok: "HFTokenizerAdapter", max_obs_tokens: int | None = None,
                 tools: list[dict[str, Any]] | tuple[dict[str, Any], ...] | None = None):
        super().__init__(tok, max_obs_tokens)  # the cut; tools go to the chat template, not into the user turn
        self.tools = list(tools) if tools else None
        hf = tok.hf

        def render(messages: list[dict[str, str]], generation: bool) -> str:
            try:
                return hf.apply_chat_template(messages, tools=self.tools, tokenize=False,
                                              add_generation_prompt=generation)
            except Exception as exc:  # a template's own raise_exception (e.g. no tool role)
                raise ValueError(f"the tokenizer's chat template cannot render this chat: {exc}") from None

        prompt = render([{"role": "user", "content": _CONTENT}], True)
        self._first = self._split(prompt)
        chat = [{"role": "user", "content": _CONTENT}, {"role": "assistant", "content": _ACTION}]
        closed = render(chat, False)
        if not closed.startswith(prompt + _ACTION):
            raise ValueError("the tokenizer's chat template renders an assistant turn with another header than its "
                             "generation prompt")
        # the user turn's placeholder becomes plain text, so only the tool turn's is left to split at
        closed = closed.replace(_CONTENT, "u", 1)
        more = render(chat + [{"role": "tool", "content": _CONTENT}], True).replace(_CONTENT, "u", 1)
        if not more.startswith(closed) or closed.count(_ACTION) != 1:
            raise ValueError("the tokenizer's chat template re-renders earlier turns when a tool turn is appended; "
                             "forkyard appends token deltas and needs an append-only template")
        after = self._template(closed[closed.index(_ACTION) + 1:])
        if not after or after[0] not in hf.all_special_ids:
            raise ValueError("the tokenizer's chat template does not close an assistant message with a special token")
        self.eot_id = after[0]
        pre, post = self._split(more[len(closed):])
        self._obs = (after[1:] + pre, post)

    def _template(self, text: str) -> list[int]:
        return self.tok.encode_template(text)

    def _split(self, text: str) -> tuple[list[int], list[int]]:
        parts = text.split(_CONTENT)
        if len(parts) != 2:
            raise ValueError("the tokenizer's chat template did not render a message's content exactly once")
        return self._template(parts[0]), self._template(parts[1])

    def first(self, observation: str) -> list[int]:
        """The prompt of turn 0: the template's system part and tools, the user turn, the generation prompt."""
        return [*self._first[0], *self.encode_observation(observation), *self._first[1]]

    def observation(self, observation: str) -> list[int]:
        """What follows an action's end-of-turn id: the template's tool turn around the observation, and the
        next generation prompt."""
        return [*self._obs[0], *self.encode_observation(observation), *self._obs[1]]


class HFTokenizerAdapter(SpecialTokenIds):
    """A ``transformers`` tokenizer with the text policy's tokenizer interface (``encode``, ``decode``,
    ``vocab_size``, ``eot_id``, ``pad_id``, ``suppressed_ids``).

    A tokenizer with a chat template that can render tool turns keeps it: the policy's prompts are that
    template's (:class:`HFChatTemplate`, :meth:`chat_template`), ``eot_id`` is the token closing its assistant
    messages, and nothing is added. A tokenizer without one (a base model) gets forkyard's template: its role
    tokens are added as special tokens (``added`` says which, so the model's embeddings can be resized). A
    chat template that cannot serve (no tool role, not append-only) falls back to forkyard's with a warning
    that says why; one that serves but cannot render ``tools=`` is kept, and asking it for tools raises
    ValueError (``tools_ok`` says which).

    ``suppressed_ids``: every added token marked special (not only the named ones: Llama 3's header tokens
    are among them) except ``eot_id`` and the model's other stop ids (:meth:`allow_stops`), so a policy cannot
    write a turn of its own. Added tokens that are not special (Qwen's ``<tool_call>``) stay writable, and
    observation text containing them becomes those ids. Encoding holds a lock: ``transformers`` switches
    special-token splitting on the shared Rust tokenizer.
    """

    kind = "hf"

    def __init__(self, hf_tokenizer):
        import threading

        self.hf = hf_tokenizer
        self.lock = threading.Lock()
        self.own_template = self.tools_ok = False
        if getattr(hf_tokenizer, "chat_template", None):
            self.added = []
            try:
                eot = HFChatTemplate(self).eot_id
            except ValueError as exc:
                import warnings

                warnings.warn(f"{exc}; using forkyard's chat template with added role tokens instead", stacklevel=2)
            else:
                self.own_template = True
                self.special = {}
                self.vocab_size = len(hf_tokenizer)
                self.eot_id = eot
                pad = hf_tokenizer.pad_token_id
                self.pad_id = eot if pad is None else pad
                self.bos_id = self.user_id = self.assistant_id = self.tool_id = None
                self.suppressed_ids = self._special_ids(eot)
                try:
                    HFChatTemplate(self, tools=[_PROBE_TOOL])
                    self.tools_ok = True
                except ValueError:
                    pass
                return
        vocab = hf_tokenizer.get_vocab()
        self.added = [t for t in SPECIAL_TOKENS if t not in vocab]
        if self.added:
            hf_tokenizer.add_special_tokens({"additional_special_tokens": self.added})
        ids = {t: hf_tokenizer.convert_tokens_to_ids(t) for t in SPECIAL_TOKENS}
        self.special = ids
        self.vocab_size = len(hf_tokenizer)
        self.pad_id, self.bos_id, self.user_id = ids["<|pad|>"], ids["<|bos|>"], ids["<|user|>"]
        self.assistant_id, self.tool_id, self.eot_id = ids["<|assistant|>"], ids["<|tool|>"], ids["<|end|>"]
        self.suppressed_ids = self._special_ids(self.eot_id)

    def allow_stops(self, stops: frozenset[int]) -> None:
        """Let a policy write every id of ``stops`` (:func:`trainer.stops.stop_ids` of its model and this
        tokenizer): they leave ``suppressed_ids``, so an id the model's generation config lists as an end
        (Qwen2.5's ``<|endoftext|>``, Llama 3.1's ``<|eom_id|>``) ends an action as ``eot_id`` does instead of
        having probability 0 (field case S50). :class:`HFCausalLM` calls it when it pairs a model with this
        tokenizer, before anything is sampled or scored."""
        self.suppressed_ids = tuple(i for i in self.suppressed_ids if i not in stops)

    def _special_ids(self, eot: int) -> tuple[int, ...]:
        hf = self.hf
        special = set(hf.all_special_ids) | {i for i, t in hf.added_tokens_decoder.items() if t.special}
        return tuple(sorted(special - {eot}))

    def encode(self, text: str) -> list[int]:
        """Text -> ids, special-token text left as text (an observation cannot forge a role token)."""
        with self.lock:
            return self.hf.encode(text.encode("utf-8", errors="replace").decode("utf-8"), add_special_tokens=False,
                                  split_special_tokens=True)

    def encode_template(self, text: str) -> list[int]:
        """A chat template's own text -> ids, its special tokens parsed as such."""
        with self.lock:
            return self.hf.encode(text, add_special_tokens=False, split_special_tokens=False) if text else []

    def decode(self, ids: list[int]) -> str:
        """Ids -> text, special ids dropped."""
        return self.hf.decode(ids, skip_special_tokens=True)

    def chat_template(self, max_obs_tokens: int | None = None, tools=None):
        """The policy's template for this tokenizer: :class:`HFChatTemplate` when it keeps its own chat
        template, else forkyard's :class:`trainer.text.text_policy.ChatTemplate` over the added role tokens.
        Raises ValueError for tools its own template cannot render."""
        if tools and self.own_template and not self.tools_ok:
            raise ValueError("this tokenizer's chat template cannot render tools=; train with --tools none")
        return (HFChatTemplate if self.own_template else ChatTemplate)(self, max_obs_tokens, tools)


def untie_output(model: HFCausalLM) -> bool:
    """Give the output layer a weight of its own, a copy of the input embeddings it was tied to (the same function,
    two parameters from now on; ``tie_word_embeddings`` turned off), for a vLLM server that reloads the weights in
    place (:meth:`trainer.vllm_sampler.VLLMSampler.load_weights`: vLLM 0.32 leaves a tied output layer unloaded).
    Call it before an optimizer is built over the parameters. Returns whether the layer was tied."""
    hf = model.hf.get_base_model() if hasattr(model.hf, "get_base_model") else model.hf
    if not getattr(hf.config, "tie_word_embeddings", False):
        return False
    hf.get_output_embeddings().weight = nn.Parameter(hf.get_input_embeddings().weight.detach().clone())
    hf.config.tie_word_embeddings = False
    return True


def save_folder(model: HFCausalLM, folder: str | Path, **extra: Any) -> Path:
    """Write ``model`` as a Hugging Face folder (module docstring); ``extra``: JSON-able metadata kept in
    ``forkyard.json``. Returns the folder."""
    out = Path(folder)
    out.mkdir(parents=True, exist_ok=True)
    model.plain().save_pretrained(out)
    tok = model.tokenizer
    if isinstance(tok, HFTokenizerAdapter):
        tok.hf.save_pretrained(out)
        meta = {"tokenizer": None}
    else:
        if getattr(tok, "_tk", None) is not None:
            hf_tokenizer(tok).save_pretrained(out)
        meta = {"tokenizer": tok.to_json()}
    (out / META_FILE).write_text(json.dumps({**meta, "extra": extra}, indent=2))
    return out


def load_folder(folder: str | Path, device: str = "auto", dtype: str = "float32") -> HFCausalLM:
    """A Hugging Face model folder as an :class:`HFCausalLM` (``AutoModelForCausalLM`` /
    ``AutoTokenizer``, local files only). A folder forkyard wrote comes back with forkyard's tokenizer;
    any other with an :class:`HFTokenizerAdapter` (embeddings resized when role tokens were added).

    Raises:
        FileNotFoundError: no ``config.json`` in ``folder``.
        ImportError: ``transformers`` is missing (``pip install 'forkyard[hf]'``).
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from trainer.text.tokenizer import tokenizer_from_json

    path = Path(folder)
    if not (path / "config.json").is_file():
        raise FileNotFoundError(f"{path} is not a Hugging Face model folder (no config.json)")
    hf = AutoModelForCausalLM.from_pretrained(path, local_files_only=True, dtype=getattr(torch, dtype))
    meta = json.loads((path / META_FILE).read_text()) if (path / META_FILE).is_file() else {}
    if meta.get("tokenizer"):
        tok = tokenizer_from_json(meta["tokenizer"])
    else:
        tok = HFTokenizerAdapter(AutoTokenizer.from_pretrained(path, local_files_only=True))
        if tok.added or tok.vocab_size > hf.get_input_embeddings().weight.shape[0]:
            hf.resize_token_embeddings(tok.vocab_size)
    return HFCausalLM(hf.to(device=resolve_device(device)), tok).eval()
