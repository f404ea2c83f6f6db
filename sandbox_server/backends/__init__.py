"""Sandbox backends: one interface (:class:`~sandbox_server.backends.base.Backend`), a registry of
implementations, and one config model per implementation.

Built-in backends, one module each:

* ``local`` (:mod:`.local`, :class:`LocalBackend`): the agent as a subprocess under bubblewrap (no Docker).
* ``docker`` (:mod:`.docker`, :class:`DockerBackend`): a hardened container per sandbox.

A backend is chosen by name in exactly one place, :func:`make_backend`, which every server, env and
command uses. To add one, write a :class:`BackendConfig` subclass whose ``type`` names it and whose
``build()`` returns the backend, and pass it to :func:`register_backend`::

    class MyConfig(BackendConfig):
        type: Literal["mine"] = "mine"
        def build(self) -> Backend: ...

    register_backend(MyConfig)          # now: make_backend("mine"), python -m sandbox_server --backend mine

or, from an installed package, declare the config class in the entry-point group ``forkyard.backends``
under its ``type`` (``mine = "my_pkg.backend:MyConfig"``): :data:`BACKENDS` loads the group on first lookup
(:class:`envs.plugins.PluginRegistry`; a plugin that fails is reported by name, never fatal).

The server's settings reach a backend where it is made: ``make_backend(kind, settings=settings)`` fills the
options the settings hold (``server_name``, the docker ``image`` from ``sandbox_image``, the local backend's
``corpus``: :meth:`BackendConfig.settings_options`) unless ``options`` give them; a server passes the one
:class:`~sandbox_server.settings.ServerSettings` it built at start-up, a library caller that passes none gets
``ServerSettings()`` read from the ``FORKYARD_*`` variables at that call. The config models themselves read no
variable: their defaults are the plain defaults of the same fields of ``ServerSettings`` (one source).
"""

from __future__ import annotations

from typing import Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field

from envs.plugins import PluginRegistry
from sandbox_server.backends.base import (
    AGENT_GRACE_S, AGENT_PATH, LABEL, OWNER_LABELS, AgentBackend, Backend, Channel, agent_sha, machine_id, owner_alive,
    owner_record, process_start,
)
from sandbox_server.backends.limits import SANDBOX_MEMORY, SANDBOX_PIDS, check_write_limits, parse_size
from sandbox_server.backends.docker import DockerBackend
from sandbox_server.backends.local import INSTALL_HINT, LocalBackend, bwrap_problem, default_state_root
from sandbox_server.corpus import ensure_corpus
from sandbox_server.settings import ServerSettings, default_corpus_dir


def _setting_default(field: str) -> Any:
    """The plain default of the :class:`ServerSettings` field ``field`` (no variable read)."""
    return ServerSettings.model_fields[field].default


class BackendConfig(BaseModel):
    """Options of one backend kind; ``build()`` makes the backend. Subclasses set ``type`` to their
    registered name. Unknown fields are refused (``pydantic.ValidationError``)."""

    model_config = ConfigDict(extra="forbid", arbitrary_types_allowed=True)

    type: str
    #: Label value tying sandboxes to their server (``make_backend``: the settings' ``server_name``).
    server_name: str = Field(_setting_default("server_name"), min_length=1)
    #: Host folder shown read-only as ``/data`` (default: the backend's own corpus).
    data_dir: str | None = None
    #: Whether the backend's sandboxes may run without isolation (only a backend that can do so accepts True).
    accepts_unsafe: ClassVar[bool] = False

    @classmethod
    def settings_options(cls, settings: ServerSettings) -> dict[str, Any]:
        """The options of this kind that come from the server's ``settings`` where a backend is made
        (:func:`backend_config`): ``server_name`` here; a subclass adds its own (``super()`` first)."""
        return {"server_name": settings.server_name}

    def build(self) -> Backend:
        """Make the backend. Raises the backend's start-up errors (``EngineUnavailable``, ``IsolationUnavailable``)."""
        raise NotImplementedError


class LocalBackendConfig(BackendConfig):
    """:class:`LocalBackend` options (see its docstring): bubblewrap isolation, refused when missing unless
    ``unsafe_no_isolation`` is True."""

    type: Literal["local"] = "local"
    state_dir: str | None = None
    unsafe_no_isolation: bool = False
    #: Folder the corpus is built in and shown from as ``/data`` when ``data_dir`` is not given
    #: (``make_backend``: the settings' ``corpus``; None: :func:`~sandbox_server.settings.default_corpus_dir`).
    corpus: str | None = None
    #: The bounds of each sandbox's control group (:mod:`sandbox_server.backends.cgroups`), as Docker's.
    mem_limit: str = SANDBOX_MEMORY
    pids_limit: int = Field(SANDBOX_PIDS, ge=1)
    accepts_unsafe: ClassVar[bool] = True

    @classmethod
    def settings_options(cls, settings: ServerSettings) -> dict[str, Any]:
        return {**super().settings_options(settings), "corpus": settings.corpus}

    def corpus_data_dir(self) -> str:
        """The folder shown as ``/data``: ``data_dir``, else the corpus (built there on first use)."""
        return self.data_dir if self.data_dir is not None else ensure_corpus(self.corpus or default_corpus_dir())

    def build(self) -> Backend:
        return LocalBackend(self.corpus_data_dir(), state_dir=self.state_dir,
                            unsafe_no_isolation=self.unsafe_no_isolation, server_name=self.server_name,
                            mem_limit=self.mem_limit, pids_limit=self.pids_limit)


class DockerBackendConfig(BackendConfig):
    """:class:`DockerBackend` options (see its docstring): the image, resource limits and the engine."""

    type: Literal["docker"] = "docker"
    #: The sandboxes' image (``make_backend``: the settings' ``sandbox_image``).
    image: str = Field(_setting_default("sandbox_image"), min_length=1)
    user: str = "1000:1000"
    mem_limit: str = SANDBOX_MEMORY
    pids_limit: int = Field(SANDBOX_PIDS, ge=1)
    nano_cpus: int = Field(1_000_000_000, ge=1)
    tmpfs_size: str = "16m"
    engine_timeout_s: float = Field(30.0, gt=0)
    base_url: str | None = None

    @classmethod
    def settings_options(cls, settings: ServerSettings) -> dict[str, Any]:
        return {**super().settings_options(settings), "image": settings.sandbox_image}

    def build(self) -> Backend:
        kw = self.model_dump(exclude={"type", "image"})
        return DockerBackend(self.image, **kw)


#: Registered backends by name: their config models (plugins of ``forkyard.backends`` join on first lookup).
BACKENDS: PluginRegistry = PluginRegistry()


def register_backend(config_cls: type[BackendConfig]) -> type[BackendConfig]:
    """Register a backend under the default of its config's ``type`` field; returns the class (usable as a
    decorator). Raises ``ValueError`` if the name is taken by another class or the model has no ``type``
    default."""
    name = config_cls.model_fields["type"].default
    if not isinstance(name, str) or not name:
        raise ValueError(f"{config_cls.__name__}.type needs a default: the backend's name")
    if BACKENDS.get(name, config_cls) is not config_cls:
        raise ValueError(f"backend {name!r} is already registered by {BACKENDS[name].__name__}")
    BACKENDS[name] = config_cls
    return config_cls


def _add_plugin(name: str, obj: Any) -> None:
    """A ``forkyard.backends`` entry point: a :class:`BackendConfig` subclass whose ``type`` is ``name``."""
    if not (isinstance(obj, type) and issubclass(obj, BackendConfig)):
        raise TypeError(f"names {obj!r}, not a sandbox_server.backends.BackendConfig subclass")
    if obj.model_fields["type"].default != name:
        raise ValueError(f"the entry point's name must be the config's type, {obj.model_fields['type'].default!r}")
    register_backend(obj)


register_backend(LocalBackendConfig)
register_backend(DockerBackendConfig)
BACKENDS.load_from("forkyard.backends", _add_plugin)


def _config_class(kind: str) -> type[BackendConfig]:
    """The config model registered as ``kind``. Raises ValueError naming the accepted values."""
    cls = BACKENDS.get(kind)
    if cls is None:
        raise ValueError(f"unknown backend {kind!r}; accepted values: {', '.join(sorted(BACKENDS))}"
                         f"{BACKENDS.explain(kind)}")
    return cls


def backend_config(kind: str, *, settings: ServerSettings | None = None, **options: Any) -> BackendConfig:
    """The config of backend ``kind`` with ``options``; the options ``settings`` holds
    (:meth:`BackendConfig.settings_options`: ``server_name``, the docker ``image``, the local ``corpus``) unless
    ``options`` give them; the others from the model's defaults. No ``FORKYARD_*`` variable is read here
    (``settings=None``: the models' plain defaults).

    Raises:
        ValueError: an unknown backend name, or options it does not take (``pydantic.ValidationError``
            is a ``ValueError``), or ``unsafe_no_isolation`` for a backend that is always isolated.
    """
    cls = _config_class(kind)
    if options.get("unsafe_no_isolation") and not cls.accepts_unsafe:
        raise ValueError(f"unsafe_no_isolation applies to the local backend only, not to {kind!r}")
    if not cls.accepts_unsafe:
        options.pop("unsafe_no_isolation", None)
    given = {k: (str(v) if k in ("data_dir", "state_dir", "corpus") and v is not None else v)
             for k, v in options.items()}
    return cls(**({**cls.settings_options(settings), **given} if settings is not None else given))


def make_backend(kind: str | None = None, *, settings: ServerSettings | None = None, **options: Any) -> Backend:
    """Build a backend by registered name; ``options`` are fields of its config model (:data:`BACKENDS`).
    The one place a backend name becomes a backend.

    Args:
        kind: the backend's registered name (default: ``settings.backend``).
        settings: the server's settings, whose ``server_name``, ``sandbox_image`` and ``corpus`` the backend takes
            unless ``options`` give them (:func:`backend_config`); None: ``ServerSettings()`` read from the
            ``FORKYARD_*`` variables now, once (a library caller holding no settings).

    Raises:
        ValueError: unknown name or options (``pydantic.ValidationError`` too, for a bad ``FORKYARD_*`` variable
            read when ``settings`` is None). EngineUnavailable / IsolationUnavailable: it cannot start.
    """
    if kind is not None:
        _config_class(kind)  # an unknown name is refused before any variable is read
    settings = settings if settings is not None else ServerSettings()
    return backend_config(kind or settings.backend, settings=settings, **options).build()


__all__ = [
    "AGENT_GRACE_S", "AGENT_PATH", "BACKENDS", "INSTALL_HINT", "LABEL", "OWNER_LABELS", "AgentBackend", "Backend",
    "BackendConfig", "Channel", "DockerBackend", "DockerBackendConfig", "LocalBackend", "LocalBackendConfig",
    "agent_sha", "backend_config", "bwrap_problem", "check_write_limits", "default_state_root", "machine_id",
    "make_backend", "owner_alive", "owner_record", "parse_size", "process_start", "register_backend",
]
