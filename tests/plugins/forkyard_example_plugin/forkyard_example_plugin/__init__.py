"""An example forkyard plugin: each module adds one kind through its entry-point group (see pyproject.toml).

* :mod:`.coin`: the env ``example/Coin-v0`` (group ``forkyard.envs``), and ``example/CoinMore-v0`` registered
  by a callable; :mod:`.unlisted` registers ``CoinToo-v0`` when imported (Gymnasium's ``"module:Id"`` form).
* :mod:`.backend`: the sandbox backend ``example-local`` (``forkyard.backends``).
* :mod:`.estimator`: the advantage estimator ``example-centred`` (``forkyard.estimators``).
* :mod:`.policy`: the policy ``example-tabular`` (``forkyard.policies``).

Nothing here is imported by forkyard unless the package is installed.
"""
