"""The sandbox backend ``example-local``: forkyard's local backend (bubblewrap) under another name, counting
the sandboxes it starts."""

from __future__ import annotations

from typing import Literal

from sandbox_server.backends import Backend, LocalBackend, LocalBackendConfig


class ExampleLocalBackend(LocalBackend):
    """:class:`LocalBackend` that counts its sandboxes (:attr:`started`)."""

    name = "example-local"
    started = 0

    def create(self) -> str:
        type(self).started += 1
        return super().create()


class ExampleLocalConfig(LocalBackendConfig):
    """Options of ``example-local``: those of the local backend."""

    type: Literal["example-local"] = "example-local"

    def build(self) -> Backend:
        return ExampleLocalBackend(self.data_dir, state_dir=self.state_dir, server_name=self.server_name,
                                   unsafe_no_isolation=self.unsafe_no_isolation)
