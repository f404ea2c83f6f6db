"""Which env classes a server serves and with which kwargs (the checks every transport shares).

* Env classes: every served env is an :class:`envs.core.TextEnv` subclass registered in Gymnasium's registry by
  :func:`envs.register_env`; the server builds the class itself (not through ``gymnasium.make``, whose wrappers
  the session would lose). A class that is not a ``TextEnv`` is refused (422).
* Kwargs: a kwarg is either a parameter of the env's constructor, checked with strict types, or refused
  with 422 naming it: ``gymnasium.make`` keywords (:data:`GYM_MAKE_KEYWORDS`; use the env's own turn
  budget) and what the server decides (:data:`SERVER_DECIDED_KWARGS`) included.

The session store that uses them: :mod:`sandbox_server.env_sessions` (which re-exports these names).
"""

from __future__ import annotations

import importlib
import inspect
import sys
import typing
from typing import Any

import gymnasium as gym
import pydantic
from pydantic import BaseModel

import envs
from envs.core import TextEnv
from envs.errors import InvalidValue, UnknownEnv

#: ``gymnasium.make``'s own keywords (and those of older Gymnasium versions): never passed on silently.
GYM_MAKE_KEYWORDS = frozenset(
    {p for p in inspect.signature(gym.make).parameters if p not in ("id", "kwargs")}
    | {"max_episode_steps", "disable_env_checker", "autoreset", "apply_api_compatibility", "order_enforce"})
#: Kwargs the server decides, never the client: where the env's sandbox runs and what it reads.
SERVER_DECIDED_KWARGS = frozenset({"backend", "server_url", "sandbox_provider", "corpus_dir"})


def env_class(env_id: str) -> tuple[type[TextEnv], dict[str, Any]]:
    """(env class, default kwargs) of a registered forkyard id (:func:`envs.env_spec`, plugins included), or of
    Gymnasium's ``"module:Id"`` form when ``module`` is already imported (:func:`import_env_modules` at start-up,
    or a plugin): then ``Id`` is looked up. No module a client names is imported here.

    Raises:
        UnknownEnv: an id not registered (or a ``module:`` this server has not imported).
        InvalidValue: a class that is not a TextEnv (the server relies on its declared ``blocking`` /
            ``uses_sandbox``, fork and spaces).
    """
    module, _, name = env_id.rpartition(":")  # no colon: module "", name env_id
    if module and module not in sys.modules:  # never imported on a client's word: the operator names modules
        raise UnknownEnv(f"env id {env_id!r}: this server has not imported {module!r}; a server serves "
                         "the envs of the modules its operator names (--env-modules, FORKYARD_ENV_MODULES) "
                         "and of installed plugins, and never imports a module a client names")
    try:
        _, entry, defaults = envs.env_spec(name)
    except KeyError as exc:
        raise UnknownEnv(exc.args[0]) from None
    module, _, name = entry.partition(":")
    cls = getattr(importlib.import_module(module), name)
    if not (isinstance(cls, type) and issubclass(cls, TextEnv)):
        raise InvalidValue(f"{env_id} ({entry}) is not an envs.core.TextEnv subclass: this server serves "
                           "TextEnv subclasses only (it relies on their declared blocking / uses_sandbox, "
                           "fork and text spaces)")
    return cls, dict(defaults)


def import_env_modules(names: str) -> list[str]:
    """Import the modules ``names`` (comma-separated: ``ServerSettings.env_modules``) so that the envs they
    register are served. Returns the modules imported, in order.

    Raises:
        ValueError: a module that cannot be imported (its name and the error): a server refuses to start
            rather than serve fewer envs than its operator named.
    """
    done = []
    for name in [n.strip() for n in names.split(",") if n.strip()]:
        try:
            importlib.import_module(name)
        except Exception as exc:  # noqa: BLE001 - any failure is the operator's to fix, reported by name
            raise ValueError(f"cannot import the env module {name!r}: {type(exc).__name__}: {exc}") from exc
        done.append(name)
    return done


_SIGNATURES: dict[type, tuple[dict[str, inspect.Parameter], bool, type[BaseModel] | None]] = {}


def _signature(cls: type) -> tuple[dict[str, inspect.Parameter], bool, type[BaseModel] | None]:
    """(named parameters, takes **kwargs, a strict pydantic model of the annotated ones) of ``cls.__init__``."""
    if cls not in _SIGNATURES:
        sig = inspect.signature(cls.__init__)
        params = {k: p for k, p in list(sig.parameters.items())[1:]
                  if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}
        var_kw = any(p.kind == p.VAR_KEYWORD for p in sig.parameters.values())
        try:
            hints = typing.get_type_hints(cls.__init__)
        except Exception:  # noqa: BLE001 - unresolvable annotations: the env checks its own values
            hints = {}
        fields = {k: (hints[k], None) for k in params if k in hints and hints[k] is not Any}
        model = pydantic.create_model(f"{cls.__name__}Kwargs", __config__=pydantic.ConfigDict(
            strict=True, arbitrary_types_allowed=True), **fields) if fields else None
        _SIGNATURES[cls] = (params, var_kw, model)
    return _SIGNATURES[cls]


def check_kwargs(env_id: str, cls: type, kwargs: dict[str, Any]) -> None:
    """Refuse (:class:`~envs.errors.InvalidValue`, naming them) kwargs the env would not honour: server-decided ones,
    ``gymnasium.make`` keywords, unknown names, and values of the wrong type (strict: ``true`` is not an int)."""
    params, var_kw, model = _signature(cls)
    decided = sorted(k for k in kwargs if k in SERVER_DECIDED_KWARGS)
    if decided:
        raise InvalidValue(f"kwargs {decided} are decided by this server, not by the client: the server "
                           f"runs {env_id} (and its sandbox) itself")
    make_kw = sorted(k for k in kwargs if k in GYM_MAKE_KEYWORDS and k not in params)
    if make_kw:
        raise InvalidValue(f"kwargs {make_kw} are gymnasium.make keywords, which a server session does not "
                           f"apply (it runs the bare env); use the env's own limits instead, e.g. its turn "
                           f"budget: accepted kwargs of {env_id}: {_accepted(params)}")
    unknown = sorted(k for k in kwargs if k not in params)
    if unknown and not var_kw:
        raise InvalidValue(f"{env_id} takes no kwargs {unknown}; accepted: {_accepted(params)}")
    if model is not None:
        try:
            model.model_validate({k: v for k, v in kwargs.items() if k in model.model_fields})
        except pydantic.ValidationError as exc:
            raise InvalidValue(f"cannot make {env_id}: " + "; ".join(
                f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors())) from None


def _accepted(params: dict[str, inspect.Parameter]) -> list[str]:
    return sorted(k for k in params if k not in SERVER_DECIDED_KWARGS)


__all__ = ["GYM_MAKE_KEYWORDS", "SERVER_DECIDED_KWARGS", "check_kwargs", "env_class", "import_env_modules"]
