"""The base class of the envs whose tools run in a sandbox (FileQA, TextToSQL): one copy of the sandbox plumbing.

:class:`SandboxedTextEnv` owns everything between a :class:`~envs.core.TextEnv` and an
:class:`envs.sandbox.SandboxProvider`: finding the provider, one sandbox per episode holding the episode's
files, releasing it, forking it, carrying it in snapshots, and running tool calls in it. A subclass brings
the task: what an episode draws and which files it puts in its sandbox, how tool output reads, and how an
answer is scored. This module knows no service or backend.
"""

from __future__ import annotations

import base64
from contextlib import contextmanager
from typing import Any, ClassVar, Iterator

from envs.core import EnvInfraError, IllegalActionError, Outcome, TextEnv
from envs.finalize import run_finalizer
from envs.sandbox import ExportingProvider, SandboxFailure, SandboxProvider, SandboxRefusal, provider_for
from envs.tool_calls import function_tool

__all__ = ["SandboxedTextEnv", "infra_errors", "tool_schema"]


@contextmanager
def infra_errors(what: str) -> Iterator[None]:
    """Turn a :class:`~envs.sandbox.SandboxFailure` raised inside into ``EnvInfraError(f"{what}: {failure}")``
    (chained to it); anything else passes through."""
    try:
        yield
    except SandboxFailure as exc:
        raise EnvInfraError(f"{what}: {exc}") from exc


class SandboxedTextEnv(TextEnv):
    """A text env whose tools run in a sandbox taken from a :class:`~envs.sandbox.SandboxProvider`.

    The contract a subclass gets (times in seconds; sandbox ids are the provider's opaque strings):

    * **Provider and tools.** :meth:`_open_provider` (called by the subclass's ``__init__`` before it builds
      its kwargs) takes ``sandbox_provider`` (a server passes its own service: :attr:`uses_sandbox`) or
      :func:`~envs.sandbox.provider_for` of ``backend`` (a backend name, a server URL or None for the default),
      the backend's name (``backend``, else the provider's ``name``) and the provider's tools of
      :attr:`tool_family` (a listing without families, an older server, counts as ``files``). Raises
      ValueError when ``backend`` is not a str or None, and EnvInfraError when the backend is unavailable or
      lacks a tool of :attr:`needed_tools`. ``__init__`` then keeps them: ``self._tools`` (tool name ->
      ordered parameter names) and ``self._tool_schemas`` (their JSON-schema definitions, :func:`tool_schema`).
    * **One sandbox per episode.** The subclass's ``_reset_task`` draws its task from ``self.np_random`` and
      calls :meth:`_start_episode` with the episode's files (name under /scratch -> bytes): the previous
      sandbox is released, ``self._calls`` (the episode's tool calls, as the subclass records them) emptied,
      and a new sandbox created (EnvInfraError when none can be had). :meth:`close` (and garbage collection)
      release it; a released sandbox is never used again (the pool resets or replaces it).
    * **Fork** (:attr:`fork_method` ``"sandbox"``): children share the parent's task state, which is therefore
      never changed in place (a new episode assigns new objects), get their own list of calls, and get one
      clone each of the parent's sandbox: one provider snapshot, n clones, all or EnvInfraError.
    * **Snapshots** carry the sandbox: ``task`` state is ``{"calls": ..., "sandbox": base64 tar of its writable
      areas, /scratch and /tmp with modes and mtimes}`` plus what the subclass adds by overriding
      :meth:`_task_state` / :meth:`_load_task_state` (calling ``super()``). :meth:`snapshot` raises
      EnvInfraError when the provider cannot export (:class:`~envs.sandbox.ExportingProvider`; a server URL:
      run the env on the server instead) or the export fails. :meth:`restore` builds the new sandbox first
      (``create(archive=...)``) and changes nothing when that or the snapshot check fails (ValueError for a
      snapshot of another class or kwargs, EnvInfraError for no sandbox).
    * **Tool calls.** :meth:`_exec` runs one call with a deadline of ``per_turn_timeout_s``; a refusal (nothing
      ran) becomes an :class:`~envs.core.IllegalActionError` (an invalid-action observation), a sandbox or
      service failure, a sandbox the provider had to replace (its state is gone) or a closed env an
      EnvInfraError (the episode ends as ``infra_error``). :meth:`_tool_outcome` makes the observation of a
      call that ran, with notes for cut output, an error and a timeout; a timeout ends the episode as
      truncated with ``termination_reason="timeout"`` unless ``continue_on_timeout``.

    Envs holding a live sandbox never pickle (:meth:`TextEnv.__getstate__`): send their snapshot instead.
    """

    blocking = True  # steps wait on a sandbox: servers run them in worker threads
    uses_sandbox = True  # servers pass their own sandbox service as ``sandbox_provider``
    fork_method = "sandbox"  # the task and calls as task state, the sandbox cloned by the provider
    #: The provider's tool family this env offers (``sandbox_server.tools.TOOL_FAMILIES``: ``files``, ``sql``).
    tool_family: ClassVar[str] = "files"
    #: Tools of :attr:`tool_family` the env cannot work without: a provider lacking one fails construction.
    needed_tools: ClassVar[tuple[str, ...]] = ()
    #: Further tool families the env calls (their tools join :attr:`needed_tools`' check and the listing).
    extra_families: ClassVar[tuple[str, ...]] = ()
    #: Opt-in families (``sandbox_server.tools.OPT_IN_FAMILIES``: ``workspace``, ``interpreter``) the env's sandboxes
    #: are created with; passed to the provider's ``create`` as ``families`` only when not empty.
    sandbox_families: ClassVar[tuple[str, ...]] = ()

    def __init__(self, *, provider: SandboxProvider, backend: str, tools: list[Any], per_turn_timeout_s: float,
                 continue_on_timeout: bool, max_turns: int, kwargs: dict[str, Any], render_mode: str | None = None):
        """Keep what :meth:`_open_provider` returned; ``per_turn_timeout_s`` (seconds) validated by the subclass."""
        super().__init__(max_turns=max_turns, render_mode=render_mode, kwargs=kwargs)
        self.backend = backend
        self.per_turn_timeout_s = float(per_turn_timeout_s)
        self.continue_on_timeout = continue_on_timeout
        self._provider = provider
        self._tools: dict[str, list[str]] = {t.name: list(t.params) for t in tools}
        self._tool_schemas = [tool_schema(t) for t in tools]
        self._sandbox: str | None = None
        self._calls: list[str] = []

    @classmethod
    def _open_provider(cls, backend: str | None, sandbox_provider: Any) -> tuple[SandboxProvider, str, list[Any]]:
        """``(provider, backend name, the provider's tools of tool_family)`` (see the class docstring).

        Raises:
            ValueError: ``backend`` is not a str or None.
            EnvInfraError: the backend is unavailable, or it has not every tool of :attr:`needed_tools`.
        """
        if backend is not None and not isinstance(backend, str):
            raise ValueError(f"backend must be a backend name or a server URL (a str), got {backend!r}")
        with infra_errors(f"sandbox backend {backend or 'default'!r} is unavailable"):
            provider: SandboxProvider = sandbox_provider if sandbox_provider is not None else provider_for(backend)
            families = (cls.tool_family, *cls.extra_families)
            tools = [t for t in provider.tools() if getattr(t, "family", "files") in families]
        missing = sorted(set(cls.needed_tools) - {t.name for t in tools})
        if missing:
            raise EnvInfraError(f"the sandbox service {provider.name!r} has no {cls.tool_family} tools {missing} "
                                f"(the {cls.tool_family} tool family: a server older than this env?)")
        return provider, backend or provider.name, tools

    # ------------------------------------------------------------------ the sandbox's life
    def _start_episode(self, files: dict[str, Any] | None) -> None:
        """Release the sandbox, empty the calls, and create the new episode's sandbox with ``files`` under
        /scratch (name -> bytes). Raises EnvInfraError when no sandbox can be had."""
        self._release()
        self._calls = []
        with infra_errors("no sandbox"):
            self._sandbox = self._provider.create(files=files or None, **self._create_options()).id

    def _create_options(self) -> dict[str, Any]:
        """Keywords of every ``create`` of this env's sandboxes beyond the files: its :attr:`sandbox_families`."""
        return {"families": list(self.sandbox_families)} if self.sandbox_families else {}

    def _release(self) -> None:
        if self._sandbox is not None:
            sid, self._sandbox = self._sandbox, None
            try:
                self._provider.delete(sid)
            except Exception:  # noqa: BLE001 - already gone (TTL) or server down: nothing to free
                pass

    def close(self) -> None:
        """Release the sandbox (the pool resets and reuses it, or destroys and replaces it)."""
        self._release()

    def __del__(self):  # best effort: a garbage-collected env gives its sandbox back, never on an event loop
        if self.__dict__.get("_sandbox") is not None:
            run_finalizer(self._release)

    def _fork_into(self, children: list[Any]) -> None:
        for child in children:
            child._calls = list(self._calls)
            child._sandbox = None
        if self._sandbox is None:
            return
        with infra_errors("sandbox fork failed"):  # one snapshot, n clones from the warm pool
            boxes = self._provider.fork(self._sandbox, len(children))
        for child, box in zip(children, boxes, strict=True):  # one clone per child, or a loud error
            child._sandbox = box.id

    # ------------------------------------------------------------------ snapshots
    def _task_state(self) -> dict[str, Any]:
        return {"calls": list(self._calls), "sandbox": self._export_sandbox()}

    def _load_task_state(self, state: dict[str, Any]) -> None:
        self._calls = list(state["calls"])

    def _export_sandbox(self) -> str | None:
        """The sandbox's writable areas as base64 tar text (None when the env holds no sandbox).

        Raises:
            EnvInfraError: the provider cannot export a sandbox (a server URL: snapshot the env session on
                the server instead), or the sandbox failed.
        """
        if self._sandbox is None:
            return None
        if not isinstance(self._provider, ExportingProvider):
            raise EnvInfraError(f"{type(self._provider).__name__} cannot export a sandbox, so a snapshot of this "
                                "env could not restore it; run the env on the server (server_url=) and fork there")
        with infra_errors("could not export the sandbox"):
            return base64.b64encode(self._provider.export(self._sandbox)).decode("ascii")

    def restore(self, snapshot: Any) -> None:
        """Set this env to a snapshot's state, sandbox included: a new sandbox is made from the snapshot's
        tar of /scratch and /tmp, so every tool answers as it did in the snapshotted env.

        Raises:
            ValueError: a snapshot of another env class or other kwargs (nothing changed).
            EnvInfraError: no sandbox could be made from it (nothing changed).
        """
        snapshot = self._checked_snapshot(snapshot)  # raises before anything changes
        archive = snapshot.state.get("task", {}).get("sandbox")
        new_sandbox = None
        if archive is not None:
            with infra_errors("could not rebuild the sandbox of the snapshot"):
                new_sandbox = self._provider.create(archive=base64.b64decode(archive), **self._create_options()).id
        try:
            super().restore(snapshot)
        except BaseException:
            if new_sandbox is not None:
                self._provider.delete(new_sandbox)
            raise
        self._release()
        self._sandbox = new_sandbox

    # ------------------------------------------------------------------ tool calls
    def _exec(self, tool: str, args: dict[str, Any], during: str) -> Any:
        """Run ``tool`` with ``args`` in the sandbox, with a deadline of ``per_turn_timeout_s`` seconds; the
        provider's result (a timeout is a result: ``status="timeout"``).

        Raises:
            IllegalActionError: the provider refused the call (nothing ran).
            EnvInfraError: the env holds no sandbox (closed), the sandbox or its service failed, or the sandbox
                was replaced during the call (``"the sandbox failed {during}: ..."``).
        """
        if self._sandbox is None:
            raise EnvInfraError("the env holds no sandbox (it was closed): reset it")
        try:
            res = self._provider.exec(self._sandbox, tool, args, timeout_s=self.per_turn_timeout_s)
        except SandboxRefusal as exc:  # e.g. an argument over the service's length limit: nothing ran
            raise IllegalActionError(f"the sandbox refused the call: {exc}") from None
        except SandboxFailure as exc:
            raise EnvInfraError(f"sandbox failure: {exc}") from exc
        if res.sandbox_replaced:  # the sandbox failed, not the tool: the episode ends as infra_error
            raise EnvInfraError(f"the sandbox failed {during}: {res.message}")
        return res

    def _tool_outcome(self, head: str, body: str, res: Any, notes: list[str] | tuple[str, ...] = ()) -> Outcome:
        """The outcome of a tool call that ran: ``head + body``, then a line of notes (output cut at the
        sandbox's cap, the subclass's ``notes``, an error, a timeout). A timeout ends the episode (truncated,
        ``"timeout"``) unless ``continue_on_timeout``; ``info["tool_status"]`` is the result's status."""
        notes = (["[output cut at the sandbox's cap]"] if res.truncated else []) + list(notes)
        if res.status == "error":
            notes.append(f"[error: {res.message or 'the tool could not run'}]")
        if res.status == "timeout":
            notes.append(f"[timed out after {self.per_turn_timeout_s:g} s]")
            if not self.continue_on_timeout:
                return Outcome(head + body + "\n" + " ".join(notes), truncated=True, reason="timeout",
                               info={"tool_status": "timeout"})
        return Outcome(head + body + ("\n" + " ".join(notes) if notes else ""), info={"tool_status": res.status})

    def tool_schemas(self) -> list[dict[str, Any]]:
        """The env's sandbox tools (from the provider's tool registry, :attr:`tool_family`) as JSON-schema tool
        definitions (:class:`envs.features.ToolSchemas`); a subclass adds its own actions (``answer``)."""
        return list(self._tool_schemas)


def tool_schema(spec: Any) -> dict[str, Any]:
    """A provider's tool (``name``, ``params``, and ``description`` / ``schema`` when it has them: forkyard's
    ``ToolSpec``) as a JSON-schema tool definition; parameters without a schema are strings."""
    schema = getattr(spec, "schema_", None) or getattr(spec, "schema", None)
    props = dict(schema.get("properties", {})) if isinstance(schema, dict) else {}
    properties = {p: props.get(p, {"type": "string"}) for p in spec.params}
    required = list(schema.get("required", spec.params)) if isinstance(schema, dict) else list(spec.params)
    return function_tool(spec.name, getattr(spec, "description", "") or spec.name, properties, required)
