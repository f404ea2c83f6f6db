"""forkyard's trainer: tree-fork rollouts, advantage estimators, policies and experiments.

Importing this package does not import torch; the modules that need it do so themselves.
"""
