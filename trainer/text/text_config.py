"""The text policy's settings: one dataclass for SFT and RL (:class:`TextTrainConfig`), one for evaluation
(:class:`EvalConfig`). ``forkyard sft``, ``train-lm`` (= ``train --policy lm``) and ``eval-lm`` are
generated from these fields (:mod:`trainer.config`). No torch import here, so building the command line
stays cheap.

Groups (which command shows a field): ``common`` (env, model size, numerics, seed, run folder) for
``sft`` and ``train-lm``; ``sft`` for ``sft``; ``loop`` (the shared loop's settings of
:class:`trainer.loop.LoopConfig`, PPO, sampling, evaluation, checkpoint) for ``train-lm``.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from trainer.config import setting
from trainer.loop import LoopConfig, env_parameters



@lru_cache(maxsize=16)
def _env_tools(env_id: str, kwargs_json: str) -> tuple[dict[str, Any], ...]:
    from envs.features import ToolSchemas
    from trainer.loop import make_env

    env = make_env(env_id, json.loads(kwargs_json))
    try:
        if not isinstance(env, ToolSchemas):
            raise ValueError(f"{env_id} declares no tool schemas (envs.features.ToolSchemas); use --tools none")
        return tuple(env.tool_schemas())
    finally:
        env.close()


def _reductions() -> tuple[str, ...]:
    from trainer.text.losses import REDUCTIONS  # imports torch: read only when a parser shows --reduction

    return REDUCTIONS


@dataclass
class TextTrainConfig(LoopConfig):
    """Hyperparameters of a text-policy run (SFT and RL share it). The loop's settings are those of
    :class:`trainer.loop.LoopConfig`; a text run defaults to 6 bases, 60 iterations and an evaluation
    every 10 iterations."""

    # the loop's settings with the text policy's defaults
    n_base: int = 6
    iterations: int = 60
    eval_every: int = 10
    # env
    max_turns: int | None = 4
    bits: int = setting(3, group="common", help="ClueProbe: target bits")
    # model
    d_model: int = setting(96, group="common", help="model width (a new model; a checkpoint keeps its own)")
    n_layers: int = setting(2, group="common", help="transformer blocks (a new model)")
    n_heads: int = setting(4, group="common", help="attention heads (a new model)")
    context: int = setting(512, group="common", help="model context in tokens (a new model)")
    arch: str = setting("tiny", choices=("tiny", "llama"), group="common",
                        help="a new model's architecture: tiny (forkyard's own transformer) or llama (transformers' "
                             "LlamaForCausalLM of the same size; checkpoints are Hugging Face folders)")
    tokenizer: str = setting("bpe", choices=("bpe", "byte"), group="common",
                             help="bpe: trained on the env's demo texts, digits kept single; byte: UTF-8 bytes")
    vocab: int = setting(512, group="common", help="BPE vocabulary size (bytes + merges; 6 special tokens on top)")
    dtype: str = setting("float32", choices=("float32", "bfloat16"), group="common", help="parameter dtype")
    max_obs_tokens: int | None = setting(None, group="common",
                                         help="cut observations to this many tokens for the model (SFT, sampling, "
                                              "evaluation alike; None: never). FileQA's tool outputs need it")
    tools: str = setting("none", choices=("none", "text", "json"), group="common",
                         help="the env's tools as JSON schemas in the prompt: none; text (demos write name(args)); "
                              "json (demos write <tool_call> JSON). With tools, model output in any tool-call form "
                              "maps to the env action")
    gradient_checkpointing: bool = setting(False, group="common",
                                           help="Hugging Face models: recompute activations in the backward pass "
                                                "(less memory, about one more forward pass per update)")
    lora_rank: int = setting(0, group="common",
                             help="Hugging Face models: train rank-r LoRA adapters (peft) on every linear layer "
                                  "instead of every weight (0: all weights); saved folders have the adapters merged")
    lora_alpha: float = setting(16.0, group="common", help="LoRA scale numerator (the update is alpha / r * B A x)")
    # SFT
    sft_steps: int = setting(300, group="sft", help="SFT optimizer steps")
    sft_batch: int = setting(32, group="sft", help="SFT episodes per step")
    sft_lr: float = setting(3e-3, group="sft", help="SFT AdamW learning rate")
    demo_skill: float = setting(0.0, group="sft",
                                help="demonstrations: chance of the env's scripted play at each action (envs.features."
                                     "Demonstrator; ClueProbe: answers from the probed bits; FileQA: the informative "
                                     "tool, then the answer); 0: random legal actions")
    # RL
    lr: float = setting(2e-4, group="loop",
                        help="Adam learning rate (1e-3 collapsed to invalid actions within 2 iterations, "
                             "docs/results/text_policy.md)")
    ppo_epochs: int = setting(2, group="loop", help="full-batch PPO epochs per iteration")
    max_grad_norm: float = setting(1.0, group="loop", help="gradient-norm clip")
    clip_low: float = setting(0.2, group="loop", help="PPO ratio clip below 1")
    clip_high: float = setting(0.28, group="loop", help="PPO ratio clip above 1 (DAPO clip-higher)")
    entropy_coef: float = setting(0.0, group="loop", help="entropy bonus weight")
    kl_coef: float = setting(0.0, group="loop", help="KL weight against the starting model (0: no reference model)")
    reduction: str = setting("token-mean", choices=_reductions, group="loop",
                             help="loss reduction (trainer/text/losses.py)")
    update: str = setting("flat", choices=("flat", "tree"), group="loop",
                          help="the PPO forward: flat (one padded row per episode) or tree (rows merged into prefix "
                               "trees, one forward per shared prefix; same loss and gradients, trainer/text/"
                               "tree_update.py)")
    invalid_penalty: float = setting(0.0, group="loop",
                                     help="shaping: subtract this from an episode's return per illegal action on its "
                                          "path")
    fork_entropy: str = setting("first", choices=("first", "greedy_max"), group="loop",
                                help="entropy fork selection: first token of the action, or max along its greedy "
                                     "continuation")
    temperature: float = setting(1.0, group="loop", help="sampling temperature (0: greedy)")
    top_p: float = setting(1.0, group="loop", help="nucleus sampling: sample from the smallest token set of this mass")
    max_new_tokens: int = setting(16, group="loop", help="token limit of one action")
    sampler: str = setting("batched", choices=("batched", "serial", "vllm"), group="loop",
                           help="rollout sampling: batched (trainer/text/engine.py: every live episode advances "
                                "together; the same episodes as serial for the same seeds), serial (one session at "
                                "a time) or vllm (a vLLM server, --vllm-url; a Hugging Face model, its weights synced "
                                "after every update: trainer/vllm_sampler.py)")
    vllm_url: str | None = setting(None, group="loop",
                                   help="--sampler vllm: a running server's root URL (scripts/vllm-serve.sh MODEL_DIR "
                                        "PORT on a folder of the model's architecture, output layer untied: the "
                                        "weights are synced before the first rollout); None: one is started on "
                                        "loopback (make vllm first) and stopped at exit")
    tis_cap: float | None = setting(None, group="loop",
                                    help="truncated importance sampling: the PPO ratio against the trainer's "
                                         "recompute, "
                                         "each token weighted by min(recompute / behavior, TIS_CAP) (for a sampler "
                                         "whose numbers differ from the trainer's, vLLM; None: off)")
    max_batch: int = setting(64, group="loop", help="batched sampling: most sequences in one forward pass (more wait)")
    max_kv_tokens: int | None = setting(None, group="loop",
                                        help="batched sampling: most KV-cache slots (rows x tokens) of one wave; "
                                             "rows past it wait (None: max_batch only; trainer/text/engine.py)")
    max_live: int | None = setting(None, group="loop", help="batched sampling: most episodes live at once (each holds "
                                                            "an env copy, FileQA: a sandbox); None: all of a rollout")
    env_threads: int = setting(16, group="loop", help="batched sampling: worker threads for a wave's env calls when "
                                                      "the env blocks (FileQA's sandboxes); 1: one after another")
    window_step: int = setting(1, group="common", help="the prompt window's start moves in multiples of this many "
                                                       "tokens (1: slides every turn; larger: less prefill)")
    eval_samples: int = setting(64, group="loop", help="held-out episodes of each periodic sampled evaluation")
    checkpoint: str | None = setting(None, flag="--model", aliases=("--checkpoint",), group="loop",
                                     help="the model to start from: RUN_DIR/sft.pt of forkyard sft, or a Hugging Face "
                                          "model folder (AutoModelForCausalLM; RUN_DIR/sft of sft --arch llama, or any "
                                          "local causal LM)")

    def env_options(self) -> dict[str, Any]:
        """:meth:`LoopConfig.env_options`, and ``bits`` when the env's constructor takes it (ClueProbe) and
        ``--env-kwarg`` does not set it."""
        kwargs = super().env_options()
        if "bits" in env_parameters(self.env_id):
            kwargs.setdefault("bits", self.bits)
        return kwargs

    def lm_config(self, vocab_size: int = 262):
        """The :class:`trainer.text.lm.LMConfig` of a new model with ``vocab_size`` token ids."""
        from trainer.text.lm import LMConfig

        return LMConfig(vocab_size=vocab_size, d_model=self.d_model, n_layers=self.n_layers, n_heads=self.n_heads,
                        context=self.context)

    def sampling(self):
        """The :class:`trainer.text.text_policy.SamplingConfig` of the training policy."""
        from trainer.text.text_policy import SamplingConfig

        return SamplingConfig(temperature=self.temperature, top_p=self.top_p, max_new_tokens=self.max_new_tokens,
                              entropy_mode=self.fork_entropy, max_obs_tokens=self.max_obs_tokens,
                              tools=self.env_tools(), window_step=self.window_step)

    def env_tools(self) -> tuple[dict[str, Any], ...] | None:
        """The env's tool definitions (``env.tool_schemas()``) when ``tools`` is not ``"none"``, else None.

        Raises:
            ValueError: the env declares no tools (:class:`envs.features.ToolSchemas`).
        """
        if self.tools == "none":
            return None
        return _env_tools(self.env_id, json.dumps(self.env_options(), sort_keys=True))

    def validate(self) -> None:
        """:meth:`LoopConfig.validate`, ``lr > 0``, and the settings that need one another (LoRA and a Hugging Face
        model, the vLLM sampler and its URL). Raises ValueError."""
        super().validate()
        if not self.lr > 0:
            raise ValueError(f"lr must be > 0, got {self.lr}")
        if self.max_batch < 1:
            raise ValueError(f"max_batch must be >= 1, got {self.max_batch}")
        if self.lora_rank < 0 or not self.lora_alpha > 0:
            raise ValueError(f"lora_rank must be >= 0 and lora_alpha > 0, got {self.lora_rank} and {self.lora_alpha}")
        self.env_tools()  # --tools on an env without tool schemas: refused here, before any work
        hf_model = os.path.isdir(self.checkpoint) if self.checkpoint else self.arch != "tiny"
        if (self.lora_rank or self.gradient_checkpointing) and not hf_model:
            raise ValueError("--lora-rank and --gradient-checkpointing need a Hugging Face model: --arch llama, or "
                             "--model FOLDER")
        if self.sampler == "vllm" and not hf_model:
            raise ValueError("--sampler vllm needs a Hugging Face model (--arch llama, or --model FOLDER): vLLM serves "
                             "Hugging Face folders")
        if self.tis_cap is not None and not self.tis_cap >= 1:
            raise ValueError(f"tis_cap must be >= 1, got {self.tis_cap}")


@dataclass
class EvalConfig(TextTrainConfig):
    """``forkyard eval-lm``: the checkpoints and how to evaluate them. The env and sampling settings are
    :class:`TextTrainConfig`'s; evaluation runs on the CPU with 8 new tokens per action unless told
    (the settings of the evaluations in docs/results/text_policy.md)."""

    max_new_tokens: int = 8
    device: str = "cpu"
    checkpoints: list[str] = setting(default_factory=list, positional=True, help="model.pt / sft.pt files")
    samples: int = setting(1000, help="held-out seeds (10**9 + i) for sampled accuracy; 0 skips sampling")
    exact: bool = setting(False, help="also the exact expected success over every accepted action path "
                                      "(trainer/text/text_eval.py)")

    def validate(self) -> None:
        """:meth:`TextTrainConfig.validate`, and no ``exact`` with ``tools="json"`` (the exact metric scores the
        env's ``name(args)`` texts, not the ``<tool_call>`` JSON such a policy writes). Raises ValueError."""
        super().validate()
        if self.exact and self.tools == "json":
            raise ValueError("--exact scores name(args) action texts; a policy trained with --tools json writes "
                             "<tool_call> JSON, so its exact success would read near 0. Evaluate it sampled")


#: The fields ``forkyard eval-lm`` takes.
EVAL_FIELDS = ("checkpoints", "env_id", "max_turns", "max_new_tokens", "temperature", "samples", "exact", "device",
               "threads", "sampler", "max_batch", "max_obs_tokens", "tools")
