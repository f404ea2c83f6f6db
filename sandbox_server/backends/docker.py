"""The docker backend: a hardened container per sandbox whose main process is the agent.

Read-only root, ``network_mode=none``, all capabilities dropped, ``no-new-privileges``, a non-root user,
pids / memory / CPU limits, tmpfs ``/scratch`` and ``/tmp``, the ``forkyard.sandbox`` label. The server talks
to the container's agent through its attached stdio. Orphan clean-up removes only containers whose owning
process is gone (:meth:`DockerBackend.cleanup_orphans`). A server that runs as root beside the engine (its
containers' processes seen in its own ``/proc``) forks large areas copy-on-write (:mod:`.layers`), as the local
backend does.
"""

from __future__ import annotations

import io
import os
import select
import shutil
import socket
import tarfile
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from sandbox_server.agent import MAX_AREA_ENTRIES, MAX_WRITE_FILES
from sandbox_server.agent_bundle import SANDBOX_AGENT_PATH
from sandbox_server.errors import EngineUnavailable, SandboxNotFound
from sandbox_server.settings import cache_dir
from sandbox_server.backends.base import (
    AgentBackend, Channel, LABEL, OWNER_LABELS, machine_id, owner_alive, owner_record, process_start,
)
from sandbox_server.backends.layers import LayeredAreas, Layers
from sandbox_server.backends.limits import SANDBOX_MEMORY, SANDBOX_PIDS, parse_size


def _close_attach_socket(sock: Any) -> None:
    """Close the stream docker-py's ``attach_socket`` returned, and its descriptor now.

    That object is a ``SocketIO`` made by the HTTP response's ``makefile``, so closing it alone leaves the
    real socket open (the response still references it) until the garbage collector runs: one descriptor
    per destroyed sandbox, measured +4 per round of 4 containers. Closing the response, the socket and
    the ``SocketIO`` releases it at once.
    """
    for part in (getattr(sock, "_response", None), getattr(sock, "_sock", None), sock):
        if part is None:
            continue
        try:
            part.close()
        except Exception:  # noqa: BLE001 - already closed, or the engine went away: nothing left to free
            pass


class DockerBackend(LayeredAreas, AgentBackend):
    """Sandboxes as hardened Docker containers whose main process is the agent.

    Args:
        image: the sandbox image (``docker/sandbox.Dockerfile``; default ``forkyard-sandbox:latest``).
        server_name: value of the ``forkyard.sandbox`` label; :meth:`cleanup_orphans` looks only at
            containers with the same value, and removes only those whose owning process is gone.
        data_dir: optional host directory bind-mounted read-only over ``/data`` (default: the image's corpus).
        mem_limit / pids_limit / nano_cpus / tmpfs_size: resource limits (``"256m"``, processes, 1e9 = one CPU,
            ``"16m"`` = 16 MiB per writable area, mounted ``noexec``).
        engine_timeout_s: deadline of every engine API call, in seconds.
        base_url: engine address (default ``DOCKER_HOST`` or the local socket).
    """

    name = "docker"
    isolated = True

    def __init__(self, image: str = "forkyard-sandbox:latest", *, server_name: str = "default",
                 data_dir: str | os.PathLike | None = None, user: str = "1000:1000", mem_limit: str = SANDBOX_MEMORY,
                 pids_limit: int = SANDBOX_PIDS, nano_cpus: int = 1_000_000_000, tmpfs_size: str = "16m",
                 engine_timeout_s: float = 30.0, base_url: str | None = None):
        super().__init__()
        import docker

        self.image = image
        self.server_name = server_name
        self.data_dir = os.path.realpath(data_dir) if data_dir else None
        self.user = user
        self.limits = dict(mem_limit=mem_limit, pids_limit=pids_limit, nano_cpus=nano_cpus)
        self.tmpfs_size = tmpfs_size
        self.area_bytes = parse_size(tmpfs_size)
        self.instance = uuid.uuid4().hex
        self._owner = owner_record()
        kw: dict[str, Any] = dict(timeout=int(engine_timeout_s), max_pool_size=64)
        try:
            self.client = docker.DockerClient(base_url=base_url, **kw) if base_url else docker.from_env(**kw)
            self.client.ping()
        except Exception as exc:
            raise EngineUnavailable(f"the Docker engine does not answer: {exc}") from None
        self._containers: dict[str, Any] = {}
        self._socks: dict[str, Any] = {}
        self._pids: dict[str, tuple[int, int]] = {}  # sandbox id -> (host pid of its container's init, its start)
        #: Copy-on-write forks (:mod:`.layers`): the helper enters the containers' mount namespaces through /proc, so
        #: only a root server beside its engine (each container's init found in /proc with the container's cgroup).
        self.layers_unavailable = Layers.available()
        self._layers_root = Path(tempfile.gettempdir()) / f"forkyard-layers-{self.instance}" \
            if self.layers_unavailable is None else None  # made by the helper's first start
        self._layers = Layers(self._layers_root, self.area_bytes) if self._layers_root is not None else None

    def describe(self) -> str:
        """The backend and its isolation mode in words."""
        return (f"docker ({self.image}): read-only root, no network, no capabilities, user {self.user}, "
                f"noexec tmpfs /scratch and /tmp of {self.tmpfs_size}")

    def host_data_dir(self) -> str:
        """The bind-mounted ``data_dir``, else a copy of the image's ``/data`` in a host cache folder, made
        once per image id (the image builds its corpus from its own Python's standard library, which may
        differ from the host's). The copy comes from a created, never started container, removed at once.

        Raises:
            EngineUnavailable: the engine or the image is unavailable.
        """
        if self.data_dir:
            return self.data_dir
        try:
            image_id = self.client.images.get(self.image).id
        except Exception as exc:  # noqa: BLE001 - docker's errors are many; all mean "no corpus from the image"
            raise EngineUnavailable(f"cannot read the corpus of image {self.image!r}: {exc}") from None
        cache = cache_dir()
        dest = cache / f"corpus-image-{image_id.split(':')[-1][:16]}"
        if (dest / "MANIFEST.json").is_file():
            return str(dest)
        try:
            container = self.client.containers.create(self.image, command=["true"], network_mode="none",
                                                      labels=self.labels())
            try:
                stream, _ = container.get_archive("/data")
                data = b"".join(stream)
            finally:
                container.remove(force=True)
        except Exception as exc:  # noqa: BLE001
            raise EngineUnavailable(f"cannot copy the corpus out of image {self.image!r}: {exc}") from None
        cache.mkdir(parents=True, exist_ok=True)
        tmp = tempfile.mkdtemp(dir=cache)
        with tarfile.open(fileobj=io.BytesIO(data)) as tar:
            # Plain files and folders under data/ only (Python < 3.11.4 has no extraction filters).
            safe = [m for m in tar.getmembers()
                    if (m.isfile() or m.isdir()) and m.name.split("/")[0] == "data" and ".." not in m.name.split("/")]
            tar.extractall(tmp, members=safe)
        try:
            os.replace(os.path.join(tmp, "data"), dest)
        except OSError:  # another process won the race: its copy is the same
            pass
        shutil.rmtree(tmp, ignore_errors=True)
        return str(dest)

    def labels(self) -> dict[str, str]:
        """Labels of this instance's containers: ``forkyard.sandbox=<server_name>`` and the owner labels."""
        o = self._owner
        return {LABEL: self.server_name, OWNER_LABELS[0]: str(o["machine"]), OWNER_LABELS[1]: str(o["pid"]),
                OWNER_LABELS[2]: str(o["start"]), OWNER_LABELS[3]: self.instance}

    def run_kwargs(self) -> dict[str, Any]:
        """The hardened ``containers.create`` arguments (also used by the benchmarks' naive baseline)."""
        uid, _, gid = self.user.partition(":")
        tmpfs_opts = f"rw,noexec,nosuid,nodev,size={self.tmpfs_size},uid={uid},gid={gid or uid},mode=0755"
        kw: dict[str, Any] = dict(
            read_only=True, network_mode="none", cap_drop=["ALL"], security_opt=["no-new-privileges"],
            user=self.user, tmpfs={"/scratch": tmpfs_opts, "/tmp": tmpfs_opts}, init=True,
            labels=self.labels(), working_dir="/data", **self.limits,
        )
        if self.data_dir:
            kw["volumes"] = {self.data_dir: {"bind": "/data", "mode": "ro"}}
        return kw

    def create(self) -> str:
        """Create, start and attach to a container; returns its sandbox id once the agent answers.

        Raises:
            EngineUnavailable: the engine refused or did not answer (missing image included).
        """
        import docker.errors

        try:
            # detach=False makes docker-py set StdinOnce: when this server's attach stream closes (it exited or
            # was killed), the agent reads EOF and the container exits, so orphans are told by their status.
            c = self.client.containers.create(
                self.image, command=["python3", "-u", "-I", SANDBOX_AGENT_PATH, "--isolated", "--bounded",
                                     "--area-bytes", str(self.area_bytes), "--max-write-files", str(MAX_WRITE_FILES),
                                     "--max-area-entries", str(MAX_AREA_ENTRIES)],
                stdin_open=True, tty=False, detach=False, **self.run_kwargs())
        except docker.errors.ImageNotFound:
            raise EngineUnavailable(
                f"sandbox image {self.image!r} is missing (scripts/build-images.sh builds it)") from None
        except Exception as exc:
            raise EngineUnavailable(f"the Docker engine refused to create a sandbox: {exc}") from None
        sid = "d-" + c.id[:12]
        if getattr(self, "_closed", False):  # closed while the engine made it: nobody would remove it
            try:
                c.remove(force=True)
            except Exception:  # noqa: BLE001 - close() sweeps this instance's label too
                pass
            raise EngineUnavailable("the docker backend was closed while a sandbox was being made")
        try:
            c.start()
            sock = self.client.api.attach_socket(c.id, params={"stdin": 1, "stdout": 1, "stream": 1})
            raw: socket.socket = getattr(sock, "_sock", sock)
            raw.setblocking(True)

            def recv(timeout_s: float) -> bytes:
                r, _, _ = select.select([raw], [], [], timeout_s)
                if not r:
                    raise TimeoutError
                return raw.recv(1 << 20)

            with self._mu:
                self._containers[sid] = c
                self._socks[sid] = sock
                self._channels[sid] = Channel(raw.sendall, recv, demux=True)
            self._ping(sid, 15.0)
            self._warm(sid)
            if self._layers is not None:
                self._ns_pid(sid)  # found once now (an engine call), not in the fork that first needs it
        except Exception as exc:
            self.destroy(sid)
            try:
                c.remove(force=True)
            except Exception:
                pass
            raise EngineUnavailable(f"sandbox container did not come up: {exc}") from None
        return sid

    def _ns_pid(self, sid: str) -> int | None:
        """Host pid of the init process of sandbox ``sid``'s container (its mount namespace is the sandbox's), or None:
        gone, or not a process of this host's ``/proc`` (an engine elsewhere: its ``/proc/<pid>/cgroup`` must name
        the container)."""
        with self._mu:
            c = self._containers.get(sid)
            known = self._pids.get(sid)
        if c is None:
            return None
        if known is not None and process_start(known[0]) == known[1]:
            return known[0]
        try:
            c.reload()
            pid = int(c.attrs["State"]["Pid"])
            with open(f"/proc/{pid}/cgroup") as f:
                if c.id not in f.read():
                    return None
        except Exception:  # noqa: BLE001 - the engine or the process went away: no layers for it
            return None
        start = process_start(pid)
        if start is None:
            return None
        with self._mu:
            if sid in self._containers:
                self._pids[sid] = (pid, start)
        return pid

    def container(self, sid: str) -> Any:
        """The docker SDK container object of sandbox ``sid``. Raises SandboxNotFound."""
        try:
            return self._containers[sid]
        except KeyError:
            raise SandboxNotFound(f"no sandbox {sid!r} in the docker backend") from None

    def destroy(self, sid: str) -> None:
        """Remove the container (force) and close its stream (idempotent)."""
        self._forget_layers(sid)
        with self._mu:
            self._pids.pop(sid, None)
            c = self._containers.pop(sid, None)
            sock = self._socks.pop(sid, None)
            self._channels.pop(sid, None)
        if sock is not None:
            _close_attach_socket(sock)
        if c is not None:
            try:
                c.remove(force=True)
            except Exception:
                pass

    def cleanup_orphans(self) -> int:
        """Remove containers labelled ``forkyard.sandbox=<server_name>`` whose owner is gone. Returns the count.

        Never removes this instance's containers nor a live process's. A container is an orphan when:
        it has no owner labels (made before they existed); or its owner ran on this machine and PID
        namespace and that process is gone (pid not running, or reused: another start time); or its owner
        is elsewhere (another PID namespace, e.g. a server in a container) and the container is no longer
        running (its agent exits when the owner's attach stream closes) or was created over a minute ago
        and never started.
        """
        n = 0
        me = machine_id()
        for c in self.client.containers.list(all=True, filters={"label": f"{LABEL}={self.server_name}"}):
            if "d-" + c.id[:12] in self._containers:
                continue
            labels = c.labels or {}
            inst = labels.get(OWNER_LABELS[3])
            if inst == self.instance:
                continue
            if inst is None:
                orphan = True
            elif labels.get(OWNER_LABELS[0]) == me:
                orphan = not owner_alive({"machine": me, "pid": labels.get(OWNER_LABELS[1]),
                                          "start": labels.get(OWNER_LABELS[2]) or None})
            else:
                orphan = c.status in ("exited", "dead") or (c.status == "created" and _age_s(c) > 60)
            if not orphan:
                continue
            try:
                c.remove(force=True)
                n += 1
            except Exception:
                pass
        return n

    def close(self) -> None:
        """Remove every container of this instance (those a create still in flight made included: they
        carry this instance's label) and close the engine client."""
        self._closed = True
        super().close()
        try:
            for c in self.client.containers.list(all=True, sparse=True,
                                                 filters={"label": f"{OWNER_LABELS[3]}={self.instance}"}):
                try:
                    c.remove(force=True)
                except Exception:  # noqa: BLE001 - already gone
                    pass
        except Exception:  # noqa: BLE001 - the engine went away: nothing more to remove here
            pass
        try:
            self.client.close()
        except Exception:
            pass
        self._close_layers()
        if self._layers_root is not None:
            shutil.rmtree(self._layers_root, ignore_errors=True)


def _age_s(c: Any) -> float:
    """Seconds since a container was created (0 when unknown)."""
    import datetime

    try:
        created = datetime.datetime.strptime(str(c.attrs["Created"])[:19], "%Y-%m-%dT%H:%M:%S")
        return time.time() - created.replace(tzinfo=datetime.timezone.utc).timestamp()
    except (KeyError, ValueError):
        return 0.0
