"""Checkpoints of the text policy's models: one file for forkyard's transformer, a folder for a Hugging Face one.

:func:`save_checkpoint` writes a :class:`trainer.text.lm.TinyCausalLM` as one ``torch.save`` file (weights, its
:class:`~trainer.text.lm.LMConfig`, the tokenizer's JSON and JSON-able metadata; no code) and a
:class:`trainer.text.hf.HFCausalLM` as a model folder (:func:`trainer.text.hf.save_folder`); :func:`load_checkpoint`
reads either back. Above :mod:`trainer.text.lm`, :mod:`trainer.text.hf` and :mod:`trainer.text.tokenizer`, which know
nothing of it (one import direction: the model modules never import their checkpoint format).
"""

from __future__ import annotations

from pathlib import Path

import torch

from trainer.text.hf import load_folder, save_folder
from trainer.text.lm import LMConfig, TinyCausalLM
from trainer.text.tokenizer import tokenizer_from_json
from trainer.update import resolve_device


def save_checkpoint(model, path: str, tokenizer=None, **extra) -> str:
    """Save the weights, the :class:`LMConfig`, the tokenizer (its ``to_json``; None: byte-level) and
    ``extra`` JSON-able metadata to ``path``. A Hugging Face model (:class:`trainer.text.hf.HFCausalLM`) is saved
    as a model folder instead, ``path`` without its ``.pt`` (:func:`trainer.text.hf.save_folder`). Returns the
    path written."""
    if hasattr(model, "hf"):
        return str(save_folder(model, path[:-3] if path.endswith(".pt") else path, **extra))
    blob = {"config": model.config.to_dict(), "state_dict": model.state_dict(), "extra": extra,
            "tokenizer": tokenizer.to_json() if tokenizer is not None else None}
    torch.save(blob, path)
    return path


def load_checkpoint(path: str, device: str = "auto", dtype: str = "float32"):
    """Inverse of :func:`save_checkpoint` (weights only; the file holds no code). The model comes back with
    its tokenizer as ``model.tokenizer`` (a :class:`ByteTokenizer` for checkpoints that stored none). A
    folder is a Hugging Face model folder (:func:`trainer.text.hf.load_folder`)."""
    if Path(path).is_dir():
        return load_folder(path, device, dtype)
    blob = torch.load(path, map_location="cpu", weights_only=True)
    model = TinyCausalLM(LMConfig(**blob["config"]))
    model.load_state_dict(blob["state_dict"])
    model.tokenizer = tokenizer_from_json(blob.get("tokenizer"))
    return model.to(device=resolve_device(device), dtype=getattr(torch, dtype))


__all__ = ["load_checkpoint", "save_checkpoint"]
