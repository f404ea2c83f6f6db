"""The text policy: a language model that reads observations and writes actions, and how it is trained.

One-way import order (:data:`IMPORT_ORDER`, held by ``tests/repo/test_layers.py``): each module imports only those
above it in this list and the trainer's core (:mod:`trainer.loop`, :mod:`trainer.rollout`, :mod:`trainer.update`,
:mod:`trainer.config`, ...), which imports nothing of this package except the command line (:mod:`trainer.cli` registers
:mod:`trainer.text.text_cli`) and the run plots (:mod:`trainer.plot` reads the monitors' keys).

==================  ================================================================================
``losses``          the PPO loss, its reductions (torch only)
``monitors``        stability checks over iteration metrics (echo traps, format collapse)
``lm``              forkyard's small transformer (:class:`~trainer.text.lm.TinyCausalLM`) and its KV cache
``tokenizer``       the BPE tokenizer trained on the env's demo texts, and the byte tokenizer
``text_policy``     the chat template, sampling sessions, behavior log-probs and their recompute
``hf``              Hugging Face causal LMs behind the same interface (LoRA, chat templates)
``checkpoints``     saving and loading either kind of model
``engine``          batched rollouts across every live episode and branch
``tree_update``     the update's rows as prefix trees: one forward per shared prefix
``text_config``     the settings of SFT, RL and evaluation (no torch import)
``text_eval``       sampled, greedy and exact evaluation
``text_sft``        supervised warm start on demonstrations
``text_train``      PPO in the shared loop (the ``lm`` policy's setup)
``text_cli``        ``forkyard sft``, ``eval-lm`` and ``plot``
==================  ================================================================================
"""

#: The package's modules, each importing only those before it (and the trainer's core).
IMPORT_ORDER = ("losses", "monitors", "lm", "tokenizer", "text_policy", "hf", "checkpoints", "engine", "tree_update",
                "text_config", "text_eval", "text_sft", "text_train", "text_cli")
