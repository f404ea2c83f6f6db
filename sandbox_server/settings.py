"""Every setting of the sandbox service, declared once (pydantic-settings, environment prefix ``FORKYARD_``).

Two groups:

* :class:`ServiceConfig`: the service's limits (pool sizes, timeouts, TTLs, caps). A value comes from the
  keyword given to the constructor, else the environment variable ``FORKYARD_<FIELD>`` (for example
  ``FORKYARD_MAX_TOTAL=64``), else the default written here.
* :class:`ServerSettings`: how a server runs (address, backend, names, body limit), read the same way.

Each setting is validated here once, whichever way its value arrives (constructor keyword, ``FORKYARD_*``
variable, or the server command's flag, which passes its text on unchanged): the same value is refused with
the same words (field case S33). :func:`explain` turns a refusal into the one message the server command
prints (exit status 2), naming the flag and the variable and, for a choice, the accepted values.

One configuration per server: the server command (:mod:`sandbox_server.__main__`), or whoever calls
:func:`sandbox_server.app.create_app`, builds :class:`ServerSettings` and :class:`ServiceConfig` once, at start-up,
and passes them down (the app, the backend: :func:`sandbox_server.backends.make_backend`, the corpus:
:func:`corpus_dir`, the Ray provider). Nothing reads a ``FORKYARD_*`` variable again after that, and nothing
writes one: a flag wins over its variable because the flag's value is the one in the settings passed down.
Library callers that hold no settings (``make_backend(kind)``, an env given a backend name:
:mod:`sandbox_server.embedded`) read ``ServerSettings()`` once, where they make what they need.

Per-backend options (image, resource limits, bind mounts) are fields of each backend's config model in
:mod:`sandbox_server.backends`; the settings give their shared values (``server_name``, ``sandbox_image``,
``corpus``) where a backend is made, and the defaults of those fields are this module's (one source).
Folders the project caches into are computed by :func:`cache_dir` only.
"""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path
from typing import Any, Literal, Mapping, get_args

from cryptography.fernet import Fernet
from pydantic import Field, SecretStr, ValidationError, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

#: Most bytes of per-episode files one write may carry.
MAX_WRITE_BYTES = 8 << 20
#: uvicorn's log levels (``FORKYARD_LOG_LEVEL``, ``--log-level``), any letter case.
LogLevel = Literal["critical", "error", "warning", "info", "debug", "trace"]
LOG_LEVELS: tuple[str, ...] = get_args(LogLevel)
#: The longest duration any setting may name, in seconds (about 115 days): past it, waits on the clock overflow
#: (``threading`` refuses timeouts above ``threading.TIMEOUT_MAX``), so ``inf`` and ``1e300`` are refused early.
MAX_SECONDS = 1e7


class ServiceConfig(BaseSettings):
    """Limits of a :class:`~sandbox_server.service.SandboxService`. Times in seconds, sizes in bytes.

    ``ServiceConfig(max_total=8)`` takes ``max_total`` from the keyword and every other field from
    ``FORKYARD_<FIELD>`` or its default. Raises ``pydantic.ValidationError`` on a value of the wrong type
    or out of range (seconds: at most :data:`MAX_SECONDS`; ``inf`` and ``nan`` are refused), ``min_idle`` above
    ``max_total`` or ``default_timeout_s`` above ``max_timeout_s``.
    """

    model_config = SettingsConfigDict(env_prefix="FORKYARD_", extra="forbid", validate_assignment=True)

    #: Sandboxes kept idle and ready.
    min_idle: int = Field(2, ge=0)
    #: Most sandboxes at once (idle + in use).
    max_total: int = Field(16, ge=1)
    #: Most sandboxes starting at once.
    max_concurrent_starts: int = Field(2, ge=1)
    #: Seconds a create / clone / fork waits for a free sandbox before a 503.
    acquire_timeout_s: float = Field(15.0, gt=0, le=MAX_SECONDS)
    #: Seconds a session may stay unused before the service deletes it.
    idle_ttl_s: float = Field(900.0, gt=0, le=MAX_SECONDS)
    #: Seconds a stored snapshot lives unless a request asks for another TTL.
    snapshot_ttl_s: float = Field(900.0, gt=0, le=MAX_SECONDS)
    #: Deadline of a tool call that names none, in seconds.
    default_timeout_s: float = Field(10.0, gt=0, le=MAX_SECONDS)
    #: Longest deadline a tool call may ask for, in seconds.
    max_timeout_s: float = Field(60.0, gt=0, le=MAX_SECONDS)
    #: Bytes of stdout (and of stderr) a tool call returns; the rest is cut and flagged.
    output_cap_bytes: int = Field(65536, ge=1)
    #: Seconds between sweeps of expired sessions and snapshots.
    reap_interval_s: float = Field(5.0, gt=0, le=MAX_SECONDS)
    #: Most bytes all stored snapshots may hold together (their tars); past it ``snapshot`` refuses.
    max_snapshot_bytes: int = Field(256 << 20, ge=1)
    #: Seconds an env session (``/v1/envs``) may stay idle before the server closes it.
    env_ttl_s: float = Field(600.0, gt=0, le=MAX_SECONDS)
    #: Most env sessions a server holds at once (``/v1/envs``); past it creates and forks answer 503.
    max_env_sessions: int = Field(256, ge=1)
    #: Reuse released sandboxes after a verified reset (every process but the agent killed, /scratch and
    #: /tmp emptied and checked, a ping answered); False destroys each released sandbox and starts another.
    recycle: bool = True
    #: Sessions one sandbox serves before it is destroyed instead of recycled: a bound on whatever a reset
    #: does not check (the agent's own memory, kernel counters), costing one start per that many sessions.
    max_sandbox_uses: int = Field(200, ge=1)
    #: Seconds an idle sandbox above ``min_idle`` (one a burst of sessions gave back) is kept for the next
    #: burst before it is destroyed.
    surplus_idle_ttl_s: float = Field(10.0, ge=0, le=MAX_SECONDS)

    @model_validator(mode="after")
    def _idle_fits_total(self) -> "ServiceConfig":
        if self.min_idle > self.max_total:
            raise ValueError(f"min_idle ({self.min_idle}) must not exceed max_total ({self.max_total})")
        if self.default_timeout_s > self.max_timeout_s:
            raise ValueError(f"default_timeout_s ({self.default_timeout_s:g}) must not exceed max_timeout_s "
                             f"({self.max_timeout_s:g})")
        return self

    @classmethod
    def from_env(cls, **overrides: Any) -> "ServiceConfig":
        """The same as the constructor, except that keywords whose value is None are ignored (handy for
        optional command-line flags)."""
        return cls(**{k: v for k, v in overrides.items() if v is not None})


def default_max_body_bytes() -> int:
    """The largest legitimate request body: a file upload of :data:`MAX_WRITE_BYTES` in base64 (4/3 of it)
    plus 1 MiB for names and JSON."""
    return 4 * -(-MAX_WRITE_BYTES // 3) + (1 << 20)


class ServerSettings(BaseSettings):
    """How a server runs: ``FORKYARD_HOST``, ``FORKYARD_PORT``, ``FORKYARD_BACKEND``, ``FORKYARD_SERVER_NAME``,
    ``FORKYARD_SANDBOX_IMAGE``, ``FORKYARD_MAX_BODY_BYTES``, ``FORKYARD_CORPUS``, ``FORKYARD_LOG_LEVEL``,
    ``FORKYARD_RAY``, ``FORKYARD_SNAPSHOT_KEY``, ``FORKYARD_ENV_MODULES``, ``FORKYARD_ALLOWED_HOSTS``,
    ``FORKYARD_ALLOWED_ORIGINS``.

    Raises ``pydantic.ValidationError`` on a value of the wrong type.
    """

    # hide_input_in_errors: an error never echoes a value (FORKYARD_SNAPSHOT_KEY is a secret); it names the field.
    model_config = SettingsConfigDict(env_prefix="FORKYARD_", extra="forbid", validate_assignment=True,
                                      hide_input_in_errors=True)

    #: Address the server listens on (loopback unless told otherwise).
    host: str = Field("127.0.0.1", min_length=1)
    #: TCP port.
    port: int = Field(8000, ge=0, le=65535)
    #: Backend of every sandbox the server serves, env sessions included: a name registered in
    #: :data:`sandbox_server.backends.BACKENDS` (``local``, ``docker``, plugins). The registry checks the name
    #: where a backend is made (:func:`sandbox_server.backends.backend_config`): the settings know no backend.
    backend: str = Field("local", min_length=1)
    #: Label value that ties sandboxes to this server: start-up clean-up looks only at sandboxes with it.
    server_name: str = Field("default", min_length=1)
    #: Image of the docker backend's sandboxes (``docker/sandbox.Dockerfile``).
    sandbox_image: str = Field("forkyard-sandbox:latest", min_length=1)
    #: Request-body limit of the routes that carry files, in bytes (other routes have smaller ones).
    max_body_bytes: int = Field(default_factory=default_max_body_bytes, ge=1)
    #: Host folder of the read-only corpus shown as ``/data`` by the local backend (default: a cache folder).
    corpus: str | None = None
    #: uvicorn's log level: one of :data:`LOG_LEVELS` (read in any letter case).
    log_level: LogLevel = "info"
    #: A Ray cluster (``auto``, an address, ``local``) whose nodes hold the sandboxes of the server's env
    #: sessions (:class:`ray_cluster.sandboxes.RayProvider`); None: the server's own pool.
    ray: str | None = None
    #: Fernet key sealing the env snapshots handed to clients (:mod:`sandbox_server.snapshot_tokens`), or several,
    #: comma-separated, to rotate it (``NEW,OLD``: the first seals, every one opens; :func:`snapshot_keys`); None:
    #: a key drawn per server process (tokens restore only on the server that made them, until it restarts).
    snapshot_key: SecretStr | None = None
    #: Modules the server imports at start-up, comma-separated (``my_pkg.envs,other.envs``), so that the envs
    #: they register (:func:`envs.register_env`) are served, under their ids and Gymnasium's ``"module:Id"``.
    #: A client's ``"module:Id"`` may name only a module imported here or by an installed plugin: the server
    #: never imports a module a client names.
    env_modules: str = ""
    #: Host names served besides loopback ones, comma-separated (``*`` any, ``*.example.com`` subdomains): on a
    #: request that came through loopback, the only other names served (DNS rebinding); on another address, the
    #: whole rule when set (:mod:`sandbox_server.web_guard`).
    allowed_hosts: str = ""
    #: Web origins (``https://app.example.com``, ``*`` any) that may send requests and open WebSockets besides
    #: the server's own and loopback ones, comma-separated (:mod:`sandbox_server.web_guard`).
    allowed_origins: str = ""

    @field_validator("log_level", mode="before")
    @classmethod
    def _log_level_case(cls, value: Any) -> Any:
        return value.strip().lower() if isinstance(value, str) else value

    @field_validator("env_modules")
    @classmethod
    def _module_names(cls, value: str) -> str:
        names = [n.strip() for n in value.split(",") if n.strip()]
        bad = [n for n in names if not all(part.isidentifier() for part in n.split("."))]
        if bad:
            raise ValueError(f"not module names: {bad}; give dotted module names, comma-separated")
        return ",".join(names)

    @field_validator("allowed_hosts", "allowed_origins")
    @classmethod
    def _web_lists(cls, value: str, info: Any) -> str:
        from sandbox_server.web_guard import WebGuard

        items = [item.strip() for item in value.split(",") if item.strip()]
        WebGuard(**{info.field_name: items})  # ValueError naming the items that are not origins
        return ",".join(items)

    @field_validator("snapshot_key")
    @classmethod
    def _fernet_keys(cls, key: SecretStr | None) -> SecretStr | None:
        if key is None:
            return None
        return SecretStr(",".join(snapshot_keys(key.get_secret_value())))  # the list, read strictly (S54)


#: A Fernet key as written: 32 bytes in URL-safe base64, exactly (Fernet's own decoder skips stray characters
#: and stops at the padding, so ``"NEW,OLD"`` would read as NEW alone: field case S54).
_FERNET_KEY = re.compile(r"[A-Za-z0-9_-]{43}=")


def snapshot_keys(value: str, source: str = "FORKYARD_SNAPSHOT_KEY") -> tuple[str, ...]:
    """The keys of a ``FORKYARD_SNAPSHOT_KEY`` value: one Fernet key, or several comma-separated for a rotation
    (``NEW,OLD``: the first seals, every one opens; field case S54). Whitespace around a key is dropped.

    Args:
        value: the setting's text.
        source: the name the errors give the value (the variable, or an argument's name).

    Returns:
        The keys, in order, each 44 characters of URL-safe base64.

    Raises:
        ValueError: an empty value or item (a stray comma), an item that is not a Fernet key (too short, not
            URL-safe base64, two keys without a comma between them) or a key listed twice; the message names
            ``source`` and the item's place, never the value.
    """
    rule = (f"{source} must be one Fernet key (32 random bytes in URL-safe base64: 44 characters) or several, "
            "comma-separated, the sealing key first")
    items = [item.strip() for item in value.split(",")]
    if items == [""]:
        raise ValueError(f"{rule}: it is empty (unset it for a key per server process)")
    for i, item in enumerate(items, 1):
        place = f"key {i} of {len(items)}"
        if not item:
            raise ValueError(f"{rule}: {place} is empty (a stray comma?)")
        if any(c.isspace() for c in item):
            raise ValueError(f"{rule}: {place} holds whitespace (separate keys with commas)")
        if not _FERNET_KEY.fullmatch(item):
            raise ValueError(f"{rule}: {place} is not a Fernet key")
        Fernet(item)  # cannot fail once the pattern matched; kept as the library's own word
        if item in items[:i - 1]:
            raise ValueError(f"{rule}: {place} repeats key {items.index(item) + 1}")
    return tuple(items)


def _secret(model: type[BaseSettings], field: str) -> bool:
    """Whether ``model.field`` holds a secret (a ``SecretStr``, or a name that says key, token or password)."""
    info = model.model_fields.get(field)
    secret_type = info is not None and "SecretStr" in repr(info.annotation)
    return secret_type or any(word in field for word in ("key", "token", "password", "secret"))


def explain(exc: ValidationError, model: type[BaseSettings], flags: Mapping[str, str] | None = None) -> str:
    """The one message for settings ``model`` refused: a part per bad setting, ``FLAG / FORKYARD_NAME: why
    (got VALUE)``, the same whether the value came from a flag, a variable or a keyword.

    Args:
        exc: what ``model(...)`` raised.
        model: :class:`ServerSettings` or :class:`ServiceConfig`.
        flags: ``{field: flag}`` of the fields the caller also takes as command-line flags.

    Values of secret fields (:data:`SecretStr`, ``*key*``...) are never echoed.
    """
    lines = []
    for err in exc.errors(include_url=False):
        field = str(err["loc"][0]) if err["loc"] else ""
        names = [f"FORKYARD_{field.upper()}"] if field else [f"the {model.__name__} settings"]
        if flags and field in flags:
            names.insert(0, flags[field])
        why = str(err["msg"]).removeprefix("Value error, ")
        shown = "" if not field or _secret(model, field) or "input" not in err else f" (got {err['input']!r})"
        lines.append(f"{' / '.join(names)}: {why}{shown}")
    return "; ".join(lines)


def cache_dir() -> Path:
    """The per-user folder forkyard caches into: ``$XDG_CACHE_HOME/forkyard`` (default ``~/.cache/forkyard``)."""
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "forkyard"


def default_corpus_dir() -> str:
    """The corpus folder when no setting names one: a cache folder per Python version (the corpus is that
    interpreter's standard library), under :func:`cache_dir`."""
    return str(cache_dir() / ("corpus-py%d.%d.%d" % sys.version_info[:3]))


def corpus_dir(settings: ServerSettings | None = None) -> str:
    """Where the host's corpus lives: ``settings.corpus`` (``FORKYARD_CORPUS``), else :func:`default_corpus_dir`.

    Args:
        settings: the settings the caller holds (a server's, passed down from start-up); None: a library caller
            holding none, for whom ``ServerSettings()`` is read from the ``FORKYARD_*`` variables now.

    Raises:
        pydantic.ValidationError: ``settings`` is None and a ``FORKYARD_*`` variable holds a bad value.
    """
    configured = (settings if settings is not None else ServerSettings()).corpus
    return configured or default_corpus_dir()
