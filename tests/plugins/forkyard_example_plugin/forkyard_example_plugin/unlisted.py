"""Registers ``CoinToo-v0`` when imported, through no entry point: reached by Gymnasium's ``"module:Id"`` form,
``forkyard_example_plugin.unlisted:CoinToo-v0`` (``gymnasium.make``, ``forkyard train --env``, the server)."""

from envs import register_env

register_env("CoinToo-v0", "forkyard_example_plugin.coin:CoinEnv")
