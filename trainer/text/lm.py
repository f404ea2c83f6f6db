"""A small causal language model and a byte-level tokenizer, trained from scratch (no weights downloaded).

Tokenizer: :class:`ByteTokenizer`. Ids 0..255 are the UTF-8 bytes of the text; ids 256.. are the
special tokens of the chat template (:data:`SPECIAL_TOKENS`): ``<|pad|>``, ``<|bos|>``, ``<|user|>``,
``<|assistant|>``, ``<|tool|>``, ``<|end|>``. Special tokens are never produced by encoding text, so no
observation can forge a role header or an end-of-turn token. Decoding skips special ids and decodes the
bytes with ``errors="replace"`` (invalid UTF-8 becomes U+FFFD, never an exception). The text policy's
default is a BPE tokenizer trained locally on the env's texts (:class:`trainer.text.tokenizer.BPETokenizer`,
same interface, episodes about 5x shorter); checkpoints store whichever was used.

Model: :class:`TinyCausalLM`, a pre-LayerNorm decoder-only transformer (GPT-2 layout: token + learned
position embeddings, ``n_layers`` blocks of causal self-attention and a 4x GELU MLP, final LayerNorm,
output head tied to the token embedding). It is sized by :class:`LMConfig` alone: on a 2-core CPU the
defaults (d_model 96, 2 layers, 4 heads, context 512, float32) train in minutes; on a GPU raise
``d_model`` / ``n_layers`` / ``context`` and pass ``device="cuda"`` (or ``"auto"``) and ``dtype``.

The interface the rest of the trainer uses (:class:`CausalLM`) is deliberately what a Hugging Face
causal LM offers, so one can be dropped in behind a thin adapter: ``forward(ids, past) -> (logits,
past)`` with ids ``[B, T]`` int64 and logits ``[B, T, V]`` float, plus ``config.context`` and
``config.vocab_size`` (an adapter maps these to ``model(input_ids=ids, past_key_values=past,
use_cache=True)``, ``out.logits``, ``out.past_key_values`` and ``config.max_position_embeddings``; the
tokenizer adapter needs ``encode`` / ``decode`` and the ids of the role and end-of-turn tokens).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Protocol

import torch
import torch.nn as nn
import torch.nn.functional as F

from trainer.update import resolve_device

#: The special tokens of the chat template, in id order from 256.
SPECIAL_TOKENS = ("<|pad|>", "<|bos|>", "<|user|>", "<|assistant|>", "<|tool|>", "<|end|>")


class SpecialTokenIds:
    """The chat template's special-token ids, placed right after a tokenizer's text ids (shared by
    :class:`ByteTokenizer` and :class:`trainer.text.tokenizer.BPETokenizer`).

    Attributes (set by :meth:`_init_specials`):
        special: {name: id} for :data:`SPECIAL_TOKENS`, ids ``first..first+5``.
        vocab_size: ``first + 6``.
        pad_id, bos_id, user_id, assistant_id, tool_id, eot_id: ids of the special tokens.
        suppressed_ids: special ids a policy may never generate: all but ``<|end|>`` (a policy that
            wrote ``<|tool|>`` would forge a turn).
    """

    def _init_specials(self, first: int) -> None:
        self.special = {name: first + i for i, name in enumerate(SPECIAL_TOKENS)}
        self.vocab_size = first + len(SPECIAL_TOKENS)
        self.pad_id = self.special["<|pad|>"]
        self.bos_id = self.special["<|bos|>"]
        self.user_id = self.special["<|user|>"]
        self.assistant_id = self.special["<|assistant|>"]
        self.tool_id = self.special["<|tool|>"]
        self.eot_id = self.special["<|end|>"]
        self.suppressed_ids = tuple(i for name, i in self.special.items() if name != "<|end|>")


class ByteTokenizer(SpecialTokenIds):
    """UTF-8 bytes (ids 0..255) plus the chat template's special tokens (ids 256..261).

    Attributes:
        vocab_size: 262.
        pad_id, bos_id, user_id, assistant_id, tool_id, eot_id, suppressed_ids: see :class:`SpecialTokenIds`.
    """

    kind = "byte"

    def __init__(self) -> None:
        self._init_specials(256)

    def to_json(self) -> str:
        """The tokenizer as a JSON string (stored in checkpoints)."""
        return '{"kind": "byte"}'

    def encode(self, text: str) -> list[int]:
        """Text -> list of byte ids (0..255). A lone surrogate (not valid UTF-8) becomes ``?``, so any
        Python ``str`` encodes without raising."""
        return list(text.encode("utf-8", errors="replace"))

    def decode(self, ids: list[int]) -> str:
        """Ids -> text; special ids are dropped, invalid UTF-8 becomes U+FFFD."""
        return bytes(i for i in ids if 0 <= i < 256).decode("utf-8", errors="replace")


@dataclass
class LMConfig:
    """Size and numerics of :class:`TinyCausalLM`.

    Attributes:
        vocab_size: number of token ids (262 for :class:`ByteTokenizer`).
        d_model: width; must be divisible by ``n_heads``.
        n_layers: transformer blocks.
        n_heads: attention heads.
        context: longest token window the model attends over (learned positions 0..context-1).
        dropout: 0.0 by default so the sampling and training forwards are the same function (the
            importance ratio is exactly 1 on the first on-policy epoch).
    """

    vocab_size: int = 262
    d_model: int = 96
    n_layers: int = 2
    n_heads: int = 4
    context: int = 512
    dropout: float = 0.0

    def to_dict(self) -> dict:
        return asdict(self)


#: One layer's key/value cache: (k, v), each [B, n_heads, T_past, d_head].
KVCache = list[tuple[torch.Tensor, torch.Tensor]]


class CausalLM(Protocol):
    """What the text policy needs of a language model (a Hugging Face causal LM fits behind an adapter)."""

    config: LMConfig

    def forward(self, ids: torch.Tensor, past: KVCache | None = None) -> tuple[torch.Tensor, KVCache]: ...

    def parameters(self): ...


class _Block(nn.Module):
    def __init__(self, cfg: LMConfig):
        super().__init__()
        self.n_heads = cfg.n_heads
        self.ln1 = nn.LayerNorm(cfg.d_model)
        self.qkv = nn.Linear(cfg.d_model, 3 * cfg.d_model)
        self.proj = nn.Linear(cfg.d_model, cfg.d_model)
        self.ln2 = nn.LayerNorm(cfg.d_model)
        self.mlp = nn.Sequential(nn.Linear(cfg.d_model, 4 * cfg.d_model), nn.GELU(),
                                 nn.Linear(4 * cfg.d_model, cfg.d_model))
        self.dropout = cfg.dropout

    def forward(self, x: torch.Tensor, past: tuple[torch.Tensor, torch.Tensor] | None,
                attn: torch.Tensor | None = None, fill: int | None = None):
        b, t, d = x.shape
        h = self.n_heads
        q, k, v = self.qkv(self.ln1(x)).split(d, dim=-1)
        q, k, v = (z.view(b, t, h, d // h).transpose(1, 2) for z in (q, k, v))
        if fill is not None:  # write into the preallocated buffers (TinyCausalLM.forward's `fill`)
            past[0][:, :, fill:fill + t] = k
            past[1][:, :, fill:fill + t] = v
            k, v = past[0][:, :, :fill + t], past[1][:, :, :fill + t]
            buffers = past
        elif past is not None:
            k = torch.cat([past[0], k], dim=2)  # new tensors: a forked session may share `past` safely
            v = torch.cat([past[1], v], dim=2)
        s = k.shape[2]
        drop = self.dropout if self.training else 0.0
        if attn is not None:  # [B, 1, t, s] from TinyCausalLM.forward's mask (bool) or attention (additive float)
            a = F.scaled_dot_product_attention(q, k, v, attn_mask=attn, dropout_p=drop)
        elif s == t:
            a = F.scaled_dot_product_attention(q, k, v, is_causal=True, dropout_p=drop)
        else:  # t new queries after s - t cached positions: query i sees keys 0..s-t+i
            mask = torch.ones(t, s, dtype=torch.bool, device=x.device).tril(diagonal=s - t)
            a = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=drop)
        x = x + self.proj(a.transpose(1, 2).reshape(b, t, d))
        x = x + self.mlp(self.ln2(x))
        return x, (buffers if fill is not None else (k, v))


class TinyCausalLM(nn.Module):
    """Decoder-only transformer (see the module docstring). Initialisation as GPT-2 (normal, std 0.02).

    Args:
        cfg: an :class:`LMConfig`.

    Raises:
        ValueError: if ``d_model`` is not divisible by ``n_heads``.
    """

    def __init__(self, cfg: LMConfig):
        super().__init__()
        if cfg.d_model % cfg.n_heads:
            raise ValueError(f"d_model {cfg.d_model} is not divisible by n_heads {cfg.n_heads}")
        self.config = cfg
        self.tok = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.pos = nn.Embedding(cfg.context, cfg.d_model)
        self.blocks = nn.ModuleList(_Block(cfg) for _ in range(cfg.n_layers))
        self.ln_f = nn.LayerNorm(cfg.d_model)
        self.apply(self._init)
        for blk in self.blocks:  # GPT-2: residual projections scaled by 1/sqrt(2 * n_layers)
            nn.init.normal_(blk.proj.weight, std=0.02 / math.sqrt(2 * cfg.n_layers))

    @staticmethod
    def _init(m: nn.Module) -> None:
        if isinstance(m, (nn.Linear, nn.Embedding)):
            nn.init.normal_(m.weight, std=0.02)
        if isinstance(m, nn.Linear) and m.bias is not None:
            nn.init.zeros_(m.bias)

    #: :meth:`forward` takes ``fill`` (preallocated cache buffers written in place).
    in_place_cache = True

    def forward(self, ids: torch.Tensor, past: KVCache | None = None, mask: torch.Tensor | None = None,
                positions: torch.Tensor | None = None, fill: int | None = None,
                logits_at: torch.Tensor | None = None,
                attention: torch.Tensor | None = None) -> tuple[torch.Tensor, KVCache]:
        """Logits of the next token at every position.

        Args:
            ids: [B, T] int64 token ids; with ``past``, the T tokens that follow the cached ones.
            past: the cache returned by a previous call (P slots), or None.
            mask: [B, P + T] bool, True at the slots (cache, then ``ids``) that hold real tokens; a query sees
                the real slots at or before its own (and always its own slot, so a padding query attends to
                something). None: every slot is real. Batched sampling (:mod:`trainer.text.engine`) pads with it.
            positions: [B, T] int64 positions of ``ids`` (with ``mask``: a row's real tokens before them);
                None: P..P+T-1.
            fill: with ``past``, its tensors are buffers of at least ``fill + T`` slots of which the first
                ``fill`` hold the cache (P = ``fill``): the new keys and values are written into them in place
                and the buffers are returned (no copy of the cache per token; batched decoding). None: ``past``
                is never modified.
            logits_at: [B] int64: the logits of only that position of each row are computed (returned as
                [B, 1, vocab_size]; a prefill needs the last real one). None: every position's.
            attention: [B, T, T] bool, without ``past`` and ``mask``: True where query i may attend key j (a packed
                prefix tree's ancestor mask, :mod:`trainer.text.tree_update`, with ``positions`` the nodes'
                depths). None: causal.

        Returns:
            ``(logits, cache)``: logits [B, T, vocab_size] in the parameters' dtype, and the cache of the P + T
            slots (fresh tensors; the ``past`` passed in is never modified).

        Raises:
            ValueError: if a position reaches ``config.context`` (P + T > context without ``positions``).
        """
        p = fill if fill is not None else 0 if past is None else past[0][0].shape[2]
        t = ids.shape[1]
        if positions is None:
            if p + t > self.config.context:
                raise ValueError(f"{p + t} positions exceed the model context {self.config.context}; "
                                 "truncate the prompt")
            x = self.tok(ids) + self.pos(torch.arange(p, p + t, device=ids.device))[None]
        else:
            if int(positions.max()) >= self.config.context:
                raise ValueError(f"position {int(positions.max())} is past the model context {self.config.context}")
            x = self.tok(ids) + self.pos(positions)
        attn = None
        if attention is not None:  # additive, built once: a bool mask is converted again by every layer's attention
            attn = torch.zeros(attention.shape, dtype=x.dtype, device=x.device).masked_fill_(~attention, -math.inf)
            attn = attn[:, None]
        if mask is not None:
            q = torch.arange(t, device=ids.device)[:, None] + p  # [t, 1] slot of each query
            slot = torch.arange(p + t, device=ids.device)[None]  # [1, s]
            attn = (mask[:, None, None, :] & (slot <= q)[None, None]) | (slot == q)[None, None]
        cache: KVCache = []
        for i, blk in enumerate(self.blocks):
            x, kv = blk(x, None if past is None else past[i], attn, fill)
            cache.append(kv)
        if logits_at is not None:
            x = x[torch.arange(x.shape[0], device=x.device), logits_at][:, None]
        logits = self.ln_f(x) @ self.tok.weight.T
        return logits, cache


def build_model(
    cfg: LMConfig | None = None, device: str = "auto", dtype: str = "float32", seed: int = 0
) -> TinyCausalLM:
    """A freshly initialised :class:`TinyCausalLM` on ``device`` in ``dtype`` (``float32`` or ``bfloat16``)."""
    cfg = cfg or LMConfig()
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = TinyCausalLM(cfg)
    return model.to(device=resolve_device(device), dtype=getattr(torch, dtype))
