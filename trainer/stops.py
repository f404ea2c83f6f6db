"""The ids that end a model's reply: the one stop set every forkyard sampler reads (field case S50).

A tokenizer names one EOS (``eos_token``), while a model's generation config may list several
(``generation_config.eos_token_id``: Qwen2.5's ``<|im_end|>`` and ``<|endoftext|>``, Llama 3.1 Instruct's
three), and ``generate``, vLLM and TRL's own generation stop at any of them. A sampler stopping at the
tokenizer's id alone samples on past a listed one, and what it writes there reaches the action text and the
loss. :func:`stop_ids` is the union; the samplers (:func:`trainer.trl_engine.sample_rows` and
:class:`trainer.trl_rollout.ChatPolicy`, :class:`trainer.text.text_policy.TextSession` and the batched
:func:`trainer.text.engine.generate`) take it, and a reply ends at the first of its ids it samples, kept in the
reply (mask 1) as the tokenizer's EOS is.
"""

from __future__ import annotations

from typing import Any


def _ids(value: Any) -> set[int]:
    """``value`` (None, an int, or a list / tuple / tensor of ints) as a set of ints."""
    if value is None:
        return set()
    if isinstance(value, int):
        return {value}
    if hasattr(value, "tolist"):  # a tensor (a generation config may hold one)
        return _ids(value.tolist())
    return {int(v) for v in value if v is not None}


def stop_ids(model: Any, tokenizer: Any) -> frozenset[int]:
    """Every id that ends a reply of ``model`` written with ``tokenizer``.

    The union of: the tokenizer's EOS (``eos_token_id`` of a ``transformers`` tokenizer), its end-of-turn id
    (``eot_id`` of forkyard's tokenizers and of :class:`trainer.text.hf.HFTokenizerAdapter`, whose wrapped
    ``hf`` tokenizer's EOS counts too), and the ``eos_token_id`` of the model's ``generation_config`` and of its
    config (and of its text config, for a composite model), each an int, a list of ints or None. A forkyard
    model wrapping a ``transformers`` one (:class:`trainer.text.hf.HFCausalLM`, attribute ``hf``) is read
    through it; a model without a generation config (:class:`trainer.text.lm.TinyCausalLM`) adds nothing.

    Args:
        model: a ``transformers`` causal LM (a peft model passes its base model's configs through), an
            :class:`~trainer.text.hf.HFCausalLM`, or any forkyard model (None: the tokenizer's ids only).
        tokenizer: a ``transformers`` tokenizer or a forkyard one.

    Returns:
        the stop set, a frozenset of token ids (int).

    Raises:
        ValueError: the set is empty (neither the tokenizer nor the model names an end id): no reply could end
            before its token limit.
    """
    found: set[int] = set()
    for tok in (tokenizer, getattr(tokenizer, "hf", None)):
        for name in ("eot_id", "eos_token_id"):
            found |= _ids(getattr(tok, name, None))
    for m in (model, getattr(model, "hf", None)):
        if m is None:
            continue
        gen = getattr(m, "generation_config", None)
        found |= _ids(getattr(gen, "eos_token_id", None))
        config = getattr(m, "config", None)
        found |= _ids(getattr(config, "eos_token_id", None))
        get_text = getattr(config, "get_text_config", None)
        text = get_text() if callable(get_text) else None
        found |= _ids(getattr(text, "eos_token_id", None))
    if not found:
        raise ValueError("neither the tokenizer nor the model names an end-of-sequence id: no stop set")
    return frozenset(found)


__all__ = ["stop_ids"]
