"""Copy-on-write forks of local sandboxes' writable areas, with nothing copied: a fork freezes the sandbox's areas in
place into a read-only **layer** (the tmpfs it wrote, kept read-only; the sandbox goes on over a new empty upper
tmpfs) and each copy mounts that layer under an overlay (overlayfs) at its own areas, in its own mount namespace.
What a copy writes goes to its own upper tmpfs (of the area's size, so its bound holds), and a layer never changes.

* :class:`Layers` (one per :class:`~sandbox_server.backends.local.LocalBackend`): :meth:`Layers.freeze`,
  :meth:`Layers.share`, :meth:`Layers.release` (a shared sandbox gets its plain areas back before a recycle; a frozen
  one cannot, and is destroyed; a destroyed one is forgotten). The mounts are made by a root helper process
  (:mod:`.overlay_helper`) that holds the layers open, so they go with it whatever ends the server.
* :class:`LayerRef`: a hold on a layer (a copy's restore point): while any sandbox stands on it or any ref holds it,
  the layer stays; :meth:`LayerRef.tar` gives it as the PAX tar every snapshot is (the agent's own pack, run on the
  host over a read-only view of the layer).

Needs root and overlayfs (the sandboxes' mount namespaces are entered): :meth:`Layers.available` says why not
otherwise, and the backend then copies as before.

Why one file: the layers, the holds on them, the helper's client and the backends' side (:class:`LayeredAreas`) share
one bookkeeping under one lock (which sandbox stands on which layer, which are frozen, which layers are to drop, which
helper made them); split, each part would reach into the others' state.
"""

from __future__ import annotations

import base64
import json
import logging
import os
import subprocess
import sys
import threading
import uuid
import weakref
from pathlib import Path

from sandbox_server.errors import AgentFailed

from .overlay_helper import AREAS, LOWER, UPPER, WORK, _used

log = logging.getLogger(__name__)

_HELPER = str(Path(__file__).with_name("overlay_helper.py"))


class Layer:
    """A frozen layer of a sandbox's areas, named ``name`` in the helper: read-only. Dropped when no sandbox stands on
    it and no :class:`LayerRef` holds it."""

    def __init__(self, layers: "Layers", name: str):
        self.layers, self.name = layers, name
        self.generation = layers.generation  # the helper that holds it (a restarted helper holds none of before)
        self.users: set[str] = set()  # sandboxes whose areas stand on it (its frozen source and its copies)
        self.holds = 0  # live LayerRefs
        self._tar: bytes | None = None
        self._tar_mu = threading.Lock()

    def tar(self) -> bytes:
        """The layer as the PAX tar a snapshot of the sandbox would have been (made once, by the agent's pack run on
        the host over a read-only view of the layer). Raises OSError when the layer cannot be read."""
        with self._tar_mu:
            if self._tar is None:
                from sandbox_server.agent.snapshot import SnapshotOps

                self.layers._call({"op": "view", "name": self.name}, self)
                try:
                    base = self.layers.host_path(self.name)
                    ops = SnapshotOps({a: f"{base}{a}" for a in AREAS}, [], list(AREAS))
                    self._tar = base64.b64decode(ops.pack_areas(None)["data"])
                except Exception as exc:  # the agent's Fail too: the layer is unreadable
                    raise OSError(f"the fork's layer cannot be read: {exc}") from None
                finally:
                    self.layers._call({"op": "unview", "name": self.name}, self)
            return self._tar


class LayerRef:
    """A hold on a :class:`Layer` (what a fork gives each copy as its restore point): the layer stays while the ref
    lives. ``tar()``: the layer's tar (:meth:`Layer.tar`)."""

    def __init__(self, layer: Layer):
        self.layer = layer
        with layer.layers.mu:
            layer.holds += 1
        weakref.finalize(self, layer.layers._drop_hold, layer)

    def tar(self) -> bytes:
        return self.layer.tar()

    def __bool__(self) -> bool:
        return True


class Layers:
    """The layers of one backend and their helper.

    Args:
        root: an empty host folder, where the helper mounts the tmpfs of its views (in its own mount namespace only).
        area_bytes: the size of each upper tmpfs (an area's size).
    """

    def __init__(self, root: Path, area_bytes: int):
        self.root, self.area_bytes = root, int(area_bytes)
        self.mu = threading.RLock()  # reentrant: a LayerRef's finalizer may run while this thread holds it
        self._by_user: dict[str, tuple[Layer, int]] = {}  # sandbox id -> (the layer it stands on, its agent's pid)
        self._frozen: set[str] = set()
        self._helper: subprocess.Popen | None = None
        self._helper_pid = 0
        self._helper_mu = threading.Lock()
        #: How many times the helper was restarted: a layer of an earlier helper is gone with it.
        self.generation = 0
        #: Layers to drop, named by :meth:`_maybe_drop` (which may run in a finalizer, anywhere): sent with the next
        #: call, which a flusher thread makes at once (an idle server holds no dropped layer).
        self._drops: list[str] = []
        self._flush_wanted = threading.Event()
        self._flusher: threading.Thread | None = None
        self._closed = False

    @staticmethod
    def available() -> str | None:
        """Why layers cannot be used here (not root, no overlayfs), or None."""
        if os.geteuid() != 0:
            return "not root: the sandboxes' mount namespaces cannot be entered"
        try:
            with open("/proc/filesystems") as f:
                if any(line.split()[-1:] == ["overlay"] for line in f):
                    return None
        except OSError as exc:
            return f"/proc/filesystems: {exc}"
        # not loaded yet: the kernel loads the module on the first overlay mount, if it has one
        if list(Path(f"/lib/modules/{os.uname().release}").glob("kernel/fs/overlayfs/overlay.ko*")):
            return None
        return "the kernel has no overlayfs"

    def host_path(self, name: str) -> str:
        """Where the view of layer ``name`` is seen from the host (while viewed)."""
        return f"/proc/{self._helper_pid}/root{self.root}/{name}/view"

    def _start(self) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        self._helper = subprocess.Popen([sys.executable, "-I", "-S", _HELPER, str(self.root)],
                                        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                        text=True, bufsize=1, start_new_session=True)
        first = self._helper.stdout.readline() if self._helper.stdout else ""
        ans = json.loads(first) if first.strip() else {}
        if not ans.get("ok"):
            self._helper.kill()
            self._helper = None
            raise OSError("the mount helper did not start")
        self._helper_pid = int(ans["pid"])

    def _call(self, req: dict, layer: Layer | None = None) -> dict:
        """One request to the helper (started on first use) about ``layer`` (if any). Raises OSError with the helper's
        error, or when ``layer`` was held by a helper that ended (killed: it took its layers with it; the sandboxes
        standing on them keep their mounts but are destroyed, never recycled, when released)."""
        with self._helper_mu:
            if self._helper is None or self._helper.poll() is not None:
                lost = self._helper is not None
                self._start()
                if lost:
                    self.generation += 1
                    with self.mu:
                        self._frozen |= set(self._by_user)
                        self._drops.clear()
                    log.warning("the mount helper ended: its layers are gone; %d sandboxes standing on them will be "
                                "destroyed when released", len(self._by_user))
            if layer is not None and layer.generation != self.generation:
                raise OSError("the layer was held by a mount helper that ended")
            assert self._helper is not None and self._helper.stdin is not None and self._helper.stdout is not None
            drops, self._drops[:] = list(self._drops), []
            try:
                for name in drops:
                    self._helper.stdin.write(json.dumps({"op": "drop", "name": name}) + "\n")
                self._helper.stdin.write(json.dumps(req) + "\n")
                self._helper.stdin.flush()
                for _ in drops:
                    self._helper.stdout.readline()
                line = self._helper.stdout.readline()
            except OSError as exc:
                self._helper.kill()
                raise OSError(f"the mount helper failed: {exc}") from None
            if not line:
                self._helper.kill()
                raise OSError("the mount helper ended")
        ans = json.loads(line)
        if not ans.get("ok"):
            raise OSError(ans.get("error") or "the mount helper failed")
        return ans

    def _check_current(self, sid: str) -> None:
        """Raise OSError when ``sid`` stands on a layer of a helper that ended (its mounts are not this helper's)."""
        with self.mu:
            entry = self._by_user.get(sid)
        if entry is not None and entry[0].generation != self.generation:
            raise OSError("it stands on a layer of a mount helper that ended")

    def _stand(self, sid: str, layer: Layer, pid: int) -> None:
        """Record that ``sid`` now stands on ``layer`` (and no longer on the one it stood on)."""
        with self.mu:
            old = self._by_user.get(sid)
            self._by_user[sid] = (layer, pid)
            layer.users.add(sid)
            if old is not None and old[0] is not layer:
                old[0].users.discard(sid)
                self._maybe_drop(old[0])

    def freeze(self, sid: str, pid: int) -> LayerRef:
        """Freeze sandbox ``sid``'s areas (its agent: host process ``pid``) in place into a new layer, and return a
        hold on it; the sandbox goes on over the layer. Raises OSError: refused before anything changed (a stack too
        deep) or failed midway (the sandbox's areas may then be unusable: replace it)."""
        self._check_current(sid)
        layer = Layer(self, uuid.uuid4().hex[:16])
        ref = LayerRef(layer)
        self._call({"op": "freeze", "pid": pid, "name": layer.name, "area_bytes": self.area_bytes}, layer)
        with self.mu:
            self._frozen.add(sid)
        self._stand(sid, layer, pid)
        return ref

    def share(self, ref: LayerRef, targets: dict[str, int]) -> dict[str, str]:
        """Mount ``ref``'s layer at the (empty) areas of sandboxes ``targets`` ({sandbox id: agent pid}). Returns
        ``{sandbox id: why}`` of those it could not (an area not empty, a mount refused): to be discarded."""
        with self.mu:
            busy = {sid for sid in targets if sid in self._by_user}
        todo = {sid: pid for sid, pid in targets.items() if sid not in busy}
        try:
            failed = self._call({"op": "share", "name": ref.layer.name, "pids": list(todo.values()),
                                 "area_bytes": self.area_bytes}, ref.layer)["failed"]
        except OSError as exc:
            failed = {str(pid): str(exc) for pid in todo.values()}
        for sid, pid in todo.items():
            self._stand(sid, ref.layer, pid)  # a failed one too: its mounts, if any, are forgotten when it goes
        out = {sid: "it already stands on a layer" for sid in busy}
        out.update({sid: failed[str(pid)] for sid, pid in todo.items() if str(pid) in failed})
        return out

    def restand(self, sid: str, pid: int, ref: LayerRef) -> None:
        """Put sandbox ``sid``'s areas (its agent: host process ``pid``) back to ``ref``'s layer, over an empty upper
        (a rollback; nothing copied). Raises OSError: refused before anything changed, or (its message ending
        ``[changed]``) failed midway: the sandbox's areas may then be unusable (replace it)."""
        self._check_current(sid)
        ans = self._call({"op": "restand", "pid": pid, "name": ref.layer.name, "area_bytes": self.area_bytes},
                         ref.layer)
        if ans.get("covered"):
            with self.mu:
                self._frozen.add(sid)
        self._stand(sid, ref.layer, pid)

    def release(self, sid: str, alive: bool) -> None:
        """Sandbox ``sid`` no longer uses its layer (if any). ``alive`` (before a recycle): its overlays are taken
        out and its areas are plain and empty again; else (destroyed) what was held for it is forgotten.
        Raises OSError when it cannot be given back (a frozen sandbox, a mount that would not go): destroy it."""
        with self.mu:
            entry = self._by_user.get(sid)
            frozen = sid in self._frozen
        if entry is None:
            return
        layer, pid = entry
        if alive and frozen:
            raise OSError("its own areas are layers of its copies now")
        try:
            self._call({"op": "unshare" if alive else "forget", "pid": pid})
        finally:
            with self.mu:
                self._by_user.pop(sid, None)
                self._frozen.discard(sid)
                layer.users.discard(sid)
                self._maybe_drop(layer)

    def mounts(self, sid: str) -> bool:
        """Whether sandbox ``sid`` stands on a layer (frozen, or shared one)."""
        with self.mu:
            return sid in self._by_user

    def _maybe_drop(self, layer: Layer) -> None:  # with self.mu held
        if not layer.users and not layer.holds and layer.generation == self.generation:
            self._drops.append(layer.name)  # sent with the next call: no call from here (a finalizer may run here)
            self._flush_wanted.set()
            if self._flusher is None and not self._closed:
                self._flusher = threading.Thread(target=self._flush, name="forkyard-layer-drops", daemon=True)
                self._flusher.start()

    def _flush(self) -> None:
        """Send the pending drops whenever there are some (the flusher thread), until :meth:`close`."""
        while not self._closed:
            self._flush_wanted.wait()
            self._flush_wanted.clear()
            if self._drops and not self._closed:
                try:
                    self._call({"op": "ping"})
                except OSError:
                    pass  # the helper is gone, and its layers with it

    def _drop_hold(self, layer: Layer) -> None:
        with self.mu:
            layer.holds -= 1
            self._maybe_drop(layer)

    def close(self) -> None:
        """Stop the helper: every layer goes with it (the sandboxes are gone by then)."""
        self._closed = True
        self._flush_wanted.set()
        with self._helper_mu:
            if self._helper is not None:
                try:
                    self._helper.stdin.close()  # type: ignore[union-attr]
                    self._helper.wait(5)
                except (OSError, subprocess.TimeoutExpired):
                    self._helper.kill()
                self._helper = None


def _used_bytes(folders: list[str]) -> int:
    """Bytes in use in the file systems of ``folders`` (:func:`.overlay_helper._used`; 0 for one that cannot be
    read)."""
    total = 0
    for folder in folders:
        try:
            total += _used(folder)
        except OSError:
            continue
    return total


class LayeredAreas:
    """The copy-on-write forks of a backend whose sandboxes' mount namespaces the host can enter (a mixin before
    :class:`~sandbox_server.backends.base.AgentBackend`: the local backend under bubblewrap, the docker backend). The
    backend sets ``_layers`` (a :class:`Layers`, or None where they cannot be made, with ``layers_unavailable`` saying
    why) and gives ``_ns_pid(sid)``: the host pid of a process in the sandbox's mount namespace, or None."""

    _layers: Layers | None = None
    layers_unavailable: str | None = "not set up"
    last_recycle_problem: str | None

    def _ns_pid(self, sid: str) -> int | None:
        raise NotImplementedError

    def freeze(self, sid: str, min_bytes: int = 0) -> LayerRef | None:
        """Freeze sandbox ``sid``'s areas in place into a copy-on-write layer (:meth:`Layers.freeze`: nothing copied;
        the sandbox goes on over it) for :meth:`share_areas`, and return a hold on it; or None: layers cannot be used
        here, the areas' tmpfs use less than ``min_bytes`` bytes and stand on no layer yet (the caller's tar costs less
        then), or the freeze was refused before it changed anything (logged). The caller then copies as before. The
        caller holds the sandbox's session (nothing runs in it).

        Raises:
            AgentFailed: the freeze failed midway: the sandbox's areas may be unusable (replace it).
        """
        pid = self._ns_pid(sid) if self._layers is not None else None
        if pid is None or self._layers is None:
            return None
        if not self._layers.mounts(sid) and _used_bytes([f"/proc/{pid}/root{a}" for a in AREAS]) < min_bytes:
            return None  # (one that stands on a layer already is frozen whatever it holds: it costs the same)
        try:
            return self._layers.freeze(sid, pid)
        except OSError as exc:
            if "[changed]" in str(exc):
                raise AgentFailed(f"freezing the areas of {sid} failed midway: {exc}") from None
            log.info("could not freeze the areas of %s (its copies are copied instead): %s", sid, exc)
            return None

    def share_areas(self, ref: LayerRef, sids: list[str]) -> None:
        """Mount layer ``ref`` at the (empty) areas of sandboxes ``sids`` under a copy-on-write overlay each: a
        sandbox sees the layer's files and writes only to its own upper tmpfs (its area's size). Raises AgentFailed
        naming those it could not do (all of ``sids`` must then be discarded)."""
        if self._layers is None:
            raise AgentFailed("this backend makes no layers")
        pids = {sid: self._ns_pid(sid) for sid in sids}
        failed = {sid: "its areas cannot be reached" for sid, pid in pids.items() if pid is None}
        failed.update(self._layers.share(ref, {sid: pid for sid, pid in pids.items() if pid is not None}))
        if failed:
            raise AgentFailed("mounting the fork's layer failed: " + "; ".join(f"{k}: {v}" for k, v in failed.items()))

    def restand(self, sid: str, ref: LayerRef) -> bool:
        """Roll sandbox ``sid`` back to layer ``ref`` (a snapshot's, :meth:`freeze`) in place: its areas stand on the
        layer over a new empty upper, whatever they held (nothing unpacked, nothing copied). Returns False, having
        changed nothing, when it cannot (no layers here, a refusal): the caller then unpacks the snapshot's tar.

        Raises:
            AgentFailed: it failed midway: the sandbox's areas may be unusable (replace it).
        """
        pid = self._ns_pid(sid) if self._layers is not None else None
        if pid is None or self._layers is None:
            return False
        try:
            self._layers.restand(sid, pid, ref)
        except OSError as exc:
            if "[changed]" in str(exc):
                raise AgentFailed(f"rolling {sid} back to a layer failed midway: {exc}") from None
            log.warning("could not roll %s back to its snapshot's layer (its tar is unpacked instead): %s", sid, exc)
            return False
        return True

    def recycle(self, sid: str) -> bool:
        """A sandbox shared a layer first gets its plain areas back (:meth:`Layers.release`), then the backend's
        recycle checks and resets it as any. False (destroy it) when either fails, and always for a sandbox frozen
        into a layer (its own areas are its copies' layers now)."""
        if self._layers is not None and self._layers.mounts(sid):
            try:
                self._layers.release(sid, alive=True)
            except OSError as exc:
                self.last_recycle_problem = f"{sid}: not recycled: {exc}"
                log.debug("sandbox %s is destroyed, not recycled: %s", sid, exc)
                return False
        return super().recycle(sid)  # type: ignore[misc]

    def _forget_layers(self, sid: str) -> None:
        """Sandbox ``sid`` is destroyed: what was held for it goes (its mounts end with its mount namespace)."""
        if self._layers is not None:
            self._layers.release(sid, alive=False)

    def _close_layers(self) -> None:
        if self._layers is not None:
            self._layers.close()


__all__ = ["AREAS", "LOWER", "Layer", "LayerRef", "LayeredAreas", "Layers", "UPPER", "WORK"]
