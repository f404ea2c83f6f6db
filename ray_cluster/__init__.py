"""Everything of forkyard that runs on Ray (``pip install 'forkyard[ray]'``; docs/scaling.md).

* :mod:`ray_cluster.nodes`: :class:`~ray_cluster.nodes.NodeHost`, the actor holding a node's env sessions and
  sandbox service, pinned to its node; :func:`~ray_cluster.nodes.start_hosts`, node names, node loss.
* :mod:`ray_cluster.transport`: a host's sessions as Gymnasium envs (:class:`~ray_cluster.transport.ClusterEnv`
  over :class:`~ray_cluster.transport.RayTransport`, a transport of :class:`envs.session_client.SessionClient`).
* :mod:`ray_cluster.sandboxes`: :class:`~ray_cluster.sandboxes.RayProvider`, sandboxes on the cluster's nodes
  (the ``ray`` entry of the entry-point group ``forkyard.sandbox_providers``).
* :mod:`ray_cluster.collector`: rollout workers on the nodes and the driver's
  :class:`~ray_cluster.collector.RayCollector` (the ``ray`` entry of ``forkyard.collectors``).

This package may import ``envs``, ``sandbox_server`` and ``trainer``; none of them imports it, nor names it in
code: they reach it through those two entry-point groups (``pyproject.toml``), so the training loop and the
server import nothing of Ray. ``ray`` itself is imported only here, inside the functions that need it.
"""
