"""A BPE tokenizer trained locally (Hugging Face ``tokenizers``), with the chat template's special tokens.

Why: the byte-level tokenizer (:class:`trainer.text.lm.ByteTokenizer`) turns a 4-turn ClueProbe episode into
about 450 tokens, and a small model from scratch did not learn to read the probed bits back from that
far even under supervision (docs/results/text_policy.md, "Tokenizer"). Trained on the env's own texts,
this tokenizer makes the same episode about 85 tokens and the supervised answer mapping is learned in
about 300 steps.

Design:

* Pre-tokenization: every digit is its own piece (``Split`` on ``\\d``, isolated), then GPT-2 style
  byte-level mapping without the whitespace regex, so merges may cross spaces (``" of the target is "``
  can become one token) but never swallow a digit: a number is always read and written digit by digit.
* Byte-level alphabet: all 256 bytes are in the vocabulary, so any text encodes (nothing is unknown).
  A Python ``str`` with lone surrogates is first made valid UTF-8 (``?`` for each), as the byte
  tokenizer does.
* Special tokens are *not* registered with the ``tokenizers`` model: they get the ids after the BPE
  vocabulary and are only ever appended by the chat template, so no observation text can encode to a
  role header or an end-of-turn token.

Same interface as :class:`~trainer.text.lm.ByteTokenizer`: ``vocab_size``, ``pad_id`` ... ``eot_id``,
``suppressed_ids``, ``encode``, ``decode``, plus ``to_json`` / :func:`tokenizer_from_json`.
"""

from __future__ import annotations

import json
from typing import Iterable

from trainer.text.lm import ByteTokenizer, SpecialTokenIds

KIND_BYTE = "byte"
KIND_BPE = "bpe"


def _clean(text: str) -> str:
    return text.encode("utf-8", errors="replace").decode("utf-8")


class BPETokenizer(SpecialTokenIds):
    """Byte-level BPE with isolated digits (module docstring). Build with :meth:`train` or
    :func:`tokenizer_from_json`.

    Attributes:
        bpe_size: ids ``0..bpe_size-1`` are BPE tokens.
        vocab_size: ``bpe_size + 6``; ids ``bpe_size..`` are :data:`~trainer.text.lm.SPECIAL_TOKENS` in order.
        pad_id, bos_id, user_id, assistant_id, tool_id, eot_id: ids of the special tokens.
        suppressed_ids: the special ids a policy may never generate (all but ``<|end|>``).
    """

    kind = KIND_BPE

    def __init__(self, tk):
        self._tk = tk
        self.bpe_size = tk.get_vocab_size()
        self._init_specials(self.bpe_size)

    @classmethod
    def train(cls, texts: Iterable[str], vocab_size: int = 512) -> "BPETokenizer":
        """Train on ``texts`` (observations and actions of the env's episodes).

        Args:
            texts: the training corpus.
            vocab_size: BPE vocabulary size including the 256 byte tokens (>= 257); the model's vocabulary
                is this plus the 6 special tokens. Training stops early when no pair occurs twice.

        Raises:
            ImportError: when the ``tokenizers`` package is missing (``pip install 'forkyard[train]'``).
            ValueError: on ``vocab_size < 257``.
        """
        if vocab_size < 257:
            raise ValueError(f"vocab_size must be >= 257 (256 bytes + merges), got {vocab_size}")
        from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers

        tk = Tokenizer(models.BPE())
        tk.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(r"\d"), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ])
        tk.decoder = decoders.ByteLevel()
        trainer = trainers.BpeTrainer(vocab_size=vocab_size, min_frequency=2, show_progress=False,
                                      initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
        tk.train_from_iterator((_clean(t) for t in texts), trainer=trainer)
        return cls(tk)

    def encode(self, text: str) -> list[int]:
        """Text -> BPE ids (all ``< bpe_size``; never a special id)."""
        return self._tk.encode(_clean(text), add_special_tokens=False).ids

    def decode(self, ids: list[int]) -> str:
        """Ids -> text; special (and out-of-range) ids are dropped, invalid UTF-8 becomes U+FFFD."""
        return self._tk.decode([i for i in ids if 0 <= i < self.bpe_size], skip_special_tokens=False)

    def to_json(self) -> str:
        """The tokenizer as a JSON string (stored in checkpoints)."""
        return json.dumps({"kind": KIND_BPE, "tokenizers": self._tk.to_str()})


def tokenizer_from_json(blob: str | None):
    """Inverse of ``to_json``; ``None`` (checkpoints written before tokenizers were stored) gives the
    :class:`~trainer.text.lm.ByteTokenizer`."""
    if not blob:
        return ByteTokenizer()
    data = json.loads(blob)
    if data.get("kind") == KIND_BYTE:
        return ByteTokenizer()
    if data.get("kind") != KIND_BPE:
        raise ValueError(f"unknown tokenizer kind {data.get('kind')!r}")
    from tokenizers import Tokenizer

    return BPETokenizer(Tokenizer.from_str(data["tokenizers"]))


def model_tokenizer(model):
    """The tokenizer a model was trained with (``model.tokenizer``, set by :func:`trainer.text.text_sft.sft`,
    :func:`trainer.text.text_sft.new_model` and :func:`trainer.text.checkpoints.load_checkpoint`); a bare model is
    byte-level."""
    return getattr(model, "tokenizer", None) or ByteTokenizer()
