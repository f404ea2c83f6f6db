"""Supervised warm start of the text policy (``forkyard sft``) on format-only demonstrations.

Episodes played by the env's ``demo_action`` (the :class:`envs.features.Demonstrator` feature; ClueProbe:
uniformly random legal actions, i.e. the action format without the strategy; with ``demo_skill > 0`` a
deliberately weak scripted policy that answers from the probed bits that often and still probes at
random; an env without ``demo_action``: random actions of its ``legal_actions`` menu) are rendered with
the chat template and the model is trained by cross-entropy on the action tokens only (loss mask 1 on
the action bytes and the ``<|end|>`` that closes them). The result writes valid tool calls and still has
the strategy to learn (:mod:`trainer.text.text_train` does the RL).

A new model's tokenizer is trained here too (:func:`make_tokenizer`: BPE on demonstration texts, or bytes).

With ``cfg.tools`` the env's tool definitions open the prompt (:class:`trainer.text.text_policy.ChatTemplate`) and,
for ``"json"``, demonstrated actions are written as ``<tool_call>`` JSON (:func:`envs.tool_calls.format_tool_call`)
instead of ``name(args)``; the env still receives its own action text.
"""

from __future__ import annotations

import json
import random
import time
from contextlib import nullcontext
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch

from envs.features import Demonstrator
from envs.tool_calls import action_to_call, format_tool_call
from trainer.text.checkpoints import save_checkpoint
from trainer.text.lm import ByteTokenizer, build_model
from trainer.loop import make_env
from trainer.text.text_config import TextTrainConfig
from trainer.text.text_policy import chat_template, pad_rows, token_logprobs, tools_text
from trainer.text.tokenizer import BPETokenizer, model_tokenizer
from trainer.update import dropout_off, resolve_device


def demo_episodes(cfg: TextTrainConfig, n_episodes: int, seed: int) -> list[tuple[str, list[tuple[str, str | None]]]]:
    """``n_episodes`` episodes played by ``env.demo_action(rng, skill=cfg.demo_skill)`` (an env that is no
    :class:`envs.features.Demonstrator`: a uniformly random action of ``info["legal_actions"]``), as texts:
    ``[(first observation, [(action, observation or None at the end), ...]), ...]``.

    Raises:
        ValueError: when the env has neither ``demo_action`` nor a ``legal_actions`` menu.
    """
    tools = cfg.env_tools()
    env = make_env(cfg.env_id, cfg.env_options())
    try:
        return _play_demos(cfg, env, tools, n_episodes, seed)
    finally:
        env.close()


def _play_demos(cfg: TextTrainConfig, env, tools, n_episodes: int, seed: int):
    demonstrator = isinstance(env, Demonstrator)
    rng = random.Random(seed)
    episodes = []
    for i in range(n_episodes):
        first, info = env.reset(seed=seed * 1_000_003 + i)
        turns = []
        while True:
            if demonstrator:
                action = env.demo_action(rng, skill=cfg.demo_skill)
            elif info.get("legal_actions"):
                action = rng.choice(info["legal_actions"])
            else:
                raise ValueError(f"{cfg.env_id} has no demo_action and no legal_actions menu to demonstrate from")
            obs, r, te, tr, info = env.step(action)
            done = te or tr
            shown = format_tool_call(action_to_call(action, list(tools))) if cfg.tools == "json" else action
            turns.append((shown, None if done else obs))
            if done:
                break
        episodes.append((first, turns))
    return episodes


def make_tokenizer(cfg: TextTrainConfig, n_episodes: int = 2000):
    """The tokenizer of a new model: :class:`ByteTokenizer` (``cfg.tokenizer == "byte"``) or a
    :class:`~trainer.text.tokenizer.BPETokenizer` of ``cfg.vocab`` tokens trained on the texts of
    ``n_episodes`` demonstration episodes (seed ``cfg.seed + 7``; never the evaluation seeds)."""
    if cfg.tokenizer == "byte":
        return ByteTokenizer()
    if cfg.tokenizer != "bpe":
        raise ValueError(f"tokenizer must be 'bpe' or 'byte', got {cfg.tokenizer!r}")
    texts = []
    prefix = tools_text(cfg.env_tools())
    for first, turns in demo_episodes(cfg, n_episodes, cfg.seed + 7):
        texts.append(prefix + first)
        for action, obs in turns:
            texts.append(action)
            if obs is not None:
                texts.append(obs)
    return BPETokenizer.train(texts, cfg.vocab)


def demo_rows(
    cfg: TextTrainConfig, n_episodes: int, seed: int, tokenizer=None
) -> tuple[list[list[int]], list[list[int]]]:
    """``n_episodes`` episodes played by ``env.demo_action`` rendered with the chat template.

    Returns ``(rows, masks)``: token ids and loss masks (1 on action tokens and their ``<|end|>``)."""
    template = chat_template(tokenizer or ByteTokenizer(), cfg.max_obs_tokens, cfg.env_tools())
    rows, masks = [], []
    for first, turns in demo_episodes(cfg, n_episodes, seed):
        ids, mask = template.render(first, turns)
        rows.append(ids)
        masks.append(mask)
    return rows, masks


def training_model(cfg: TextTrainConfig, model):
    """``model`` with ``cfg``'s training options (gradient checkpointing, LoRA) applied in place
    (:func:`trainer.text.hf.configure_training`; ValueError on a model that is no Hugging Face model)."""
    from trainer.text.hf import configure_training

    return configure_training(model, cfg.gradient_checkpointing, cfg.lora_rank, cfg.lora_alpha)


def new_model(cfg: TextTrainConfig):
    """A fresh model sized by ``cfg`` with its tokenizer (:func:`make_tokenizer`) as ``model.tokenizer``:
    :class:`trainer.text.lm.TinyCausalLM`, or with ``cfg.arch == "llama"`` a ``transformers`` Llama of the same
    size (:func:`trainer.text.hf.build_llama`)."""
    tok = make_tokenizer(cfg)
    if cfg.arch == "llama":
        from trainer.text.hf import build_llama

        return build_llama(cfg.lm_config(tok.vocab_size), tok, cfg.device, cfg.dtype, cfg.seed)
    model = build_model(cfg.lm_config(tok.vocab_size), cfg.device, cfg.dtype, cfg.seed)
    model.tokenizer = tok
    return model


def sft(cfg: TextTrainConfig, model=None) -> tuple[Any, list[dict]]:
    """Supervised warm start on demonstrations (module docstring): ``cfg.sft_steps`` AdamW steps (lr
    ``cfg.sft_lr``, 20-step warm-up, linear decay to 10%, grad-norm clip 1) of ``cfg.sft_batch`` rows each,
    every forward with dropout off as in the RL update (:func:`trainer.update.dropout_off`).

    Returns ``(model, metrics)``: metrics one dict per step, ``{"step", "loss" (nats per action token),
    "wall_s"}``. With ``cfg.run_dir`` set, writes ``sft_config.json``, ``sft_metrics.jsonl`` (a row per step,
    as it goes), ``sft_resume.pt`` (weights, optimizer, schedule, step, RNG states; every ``cfg.save_every``
    steps, at the last and on SIGTERM) and ``sft.pt``; a folder holding an SFT run's records is refused.
    ``cfg.resume`` continues the SFT run in that folder from its ``sft_resume.pt`` (the model rebuilt as the run
    built it, then given the saved state; ``sft_metrics.jsonl`` continued). Prints the loss every 20 steps
    when ``cfg.progress``.

    Raises:
        trainer.loop.RunDirError: the folder holds an SFT run's records, or has none to resume.
        trainer.loop.TrainingInterrupted: SIGTERM / SIGINT stopped it (its state is saved).
    """
    from trainer.loop import (
        SFT_RECORDS,
        RunDirError,
        StopSignals,
        TrainingInterrupted,
        as_random_state,
        continue_records,
        rng_state,
        run_config,
        save_state,
        set_rng_state,
    )

    cfg = run_config(cfg, "sft", "sft_config.json", SFT_RECORDS)
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    device = resolve_device(cfg.device)
    model = training_model(cfg, model or new_model(cfg))
    tok = model_tokenizer(model)
    rows, masks = demo_rows(cfg, cfg.sft_steps * cfg.sft_batch // 4 + cfg.sft_batch, cfg.seed, tok)
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.sft_lr, weight_decay=0.0)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / 20) * max(0.1, 1 - s / cfg.sft_steps))
    rng = random.Random(cfg.seed)
    metrics: list[dict] = []
    start = 0
    out = Path(cfg.run_dir) if cfg.run_dir else None
    sink = None
    if cfg.resume:
        state_path = out / "sft_resume.pt"
        if not state_path.is_file():
            raise RunDirError(f"--resume {out}: no sft_resume.pt there (the SFT run saved no state)")
        state = torch.load(state_path, map_location="cpu", weights_only=True)
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["optimizer"])
        sched.load_state_dict(state["schedule"])
        rng.setstate(as_random_state(state["rng"]))
        set_rng_state(state["torch_rng"])
        start = state["step"]
        metrics = continue_records(out / "sft_metrics.jsonl", start, key="step")
        sink = (out / "sft_metrics.jsonl").open("a")
    elif out is not None:
        out.mkdir(parents=True, exist_ok=True)
        (out / "sft_config.json").write_text(json.dumps(asdict(cfg), indent=2))
        sink = (out / "sft_metrics.jsonl").open("x")

    def save(done: int) -> None:
        save_state(out / "sft_resume.pt", {"step": done, "model": model.state_dict(), "optimizer": opt.state_dict(),
                                           "schedule": sched.state_dict(), "rng": rng.getstate(),
                                           "torch_rng": rng_state(), "config": asdict(cfg)})

    t0 = time.perf_counter()
    wall0 = metrics[-1]["wall_s"] if metrics else 0.0
    try:
        with StopSignals() if out is not None else nullcontext() as stop, dropout_off(model):
            for step in range(start, cfg.sft_steps):
                idx = rng.sample(range(len(rows)), cfg.sft_batch)
                ids = pad_rows([rows[i] for i in idx], tok.pad_id, device)
                width = ids.shape[1]
                mask = torch.tensor([masks[i] + [0] * (width - len(masks[i])) for i in idx], dtype=torch.float32,
                                    device=device)
                logp, _, _ = token_logprobs(model, ids, suppress=tok.suppressed_ids)
                loss = -torch.where(mask > 0, logp, torch.zeros_like(logp)).sum() / mask.sum()
                opt.zero_grad()
                loss.backward()
                torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
                opt.step()
                sched.step()
                m = {"step": step, "loss": float(loss.detach()), "wall_s": wall0 + time.perf_counter() - t0}
                metrics.append(m)
                if sink is not None:
                    sink.write(json.dumps(m) + "\n")
                    sink.flush()
                if cfg.progress and step % 20 == 0:
                    print(f"sft step {step} loss {float(loss):.4f} ({time.perf_counter() - t0:.0f} s)", flush=True)
                received = getattr(stop, "received", None)
                if out is not None and (received or step + 1 == cfg.sft_steps
                                        or (cfg.save_every and (step + 1) % cfg.save_every == 0)):
                    save(step + 1)
                if received:
                    raise TrainingInterrupted(out, step + 1, received)
    finally:
        if sink is not None:
            sink.close()
    model.eval()
    if out is not None:
        save_checkpoint(model, str(out / "sft.pt"), tok, max_turns=cfg.max_turns, env_id=cfg.env_id)
    return model, metrics

