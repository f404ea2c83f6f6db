"""forkyard sandbox service: sandboxes, tool whitelist, pool and HTTP API."""
