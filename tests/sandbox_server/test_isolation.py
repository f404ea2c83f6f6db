"""Isolation by default, session environments (S17) and host paths (S23), on every backend.

* The local backend refuses to start without working bubblewrap unless built with the explicit
  ``unsafe_no_isolation=True``; in CI the isolated backend is the one tested.
* S17: session variables that change how programs load or run are refused (at create / update_state once
  the service validates them, and by the agent on every call), and nothing uploaded into /scratch can be
  executed: a real shared object whose constructor would leave markers never runs.
* S23: two forks of one sandbox answer the same tool calls with identical text, and no host path (state
  folder, data folder) ever appears in an output or a message.
"""

from __future__ import annotations

import io
import os
import shutil
import subprocess
import tarfile
import uuid
from pathlib import Path

import pytest

from sandbox_server.agent import PathRewriter, utf8_cut
from sandbox_server.backends import LocalBackend
from sandbox_server.errors import IsolationUnavailable, ToolRefused
from sandbox_server.tools import SESSION_ENV_NAMES
from tests.docker_support import (
    CAP, IN_CI, SERVER_NAME, delete_quietly, fake_bin, host_sh, require_bwrap, unisolated,
)

MARK = "[... output cut at"


# -- isolation by default ---------------------------------------------------------------------------------

def test_ci_tests_the_isolated_local_backend(fixture_data):
    """In CI bubblewrap must be installed and work: the default LocalBackend is isolated (a missing bwrap
    fails here, never skips). Elsewhere the test skips with the reason when bwrap is missing."""
    if not IN_CI:
        require_bwrap()
    b = LocalBackend(fixture_data, server_name=f"{SERVER_NAME}-ci")
    try:
        assert b.isolated is True and b.isolation == "bubblewrap"
        assert "bubblewrap" in b.describe() and "UNSAFE" not in b.describe()
        sid = b.create()
        conf = b.confinement(sid)
        assert conf["noexec"] == ["/scratch", "/tmp"] and conf["caps_dropped"] is True
        r = b.exec(sid, ["sh", "-c", "grep -E '^Cap(Eff|Prm|Bnd)' /proc/self/status; "
                                     "grep -E ' /(scratch|tmp) ' /proc/self/mountinfo"])
        caps = dict(line.split(":\t") for line in r.stdout.splitlines() if line.startswith("Cap"))
        assert set(caps.values()) == {"0000000000000000"}, r.stdout
        mounts = [line for line in r.stdout.splitlines() if " - tmpfs " in line]
        assert len(mounts) == 2 and all("noexec" in m.split()[5] for m in mounts), r.stdout
        assert b.exec(sid, ["cat", "/proc/net/dev"]).stdout.count(":") == 1  # loopback only: no network
    finally:
        b.close()


@pytest.mark.parametrize("bwrap_script",
                         [None, "#!/bin/sh\necho 'bwrap: setting up uid map: Permission denied' >&2\nexit 1\n"],
                         ids=["missing", "broken"])
def test_no_silent_fallback_without_bubblewrap(fixture_data, tmp_path, monkeypatch, bwrap_script):
    monkeypatch.setenv("PATH", fake_bin(tmp_path, bwrap_script))
    with pytest.raises(IsolationUnavailable) as exc:
        LocalBackend(fixture_data, server_name=f"{SERVER_NAME}-nobwrap")
    msg = str(exc.value)
    assert "apt-get install bubblewrap" in msg and "make" in msg and "unsafe_no_isolation=True" in msg
    if bwrap_script:
        assert "Permission denied" in msg  # bwrap's own reason is kept
    # the explicit opt-in
    b = LocalBackend(fixture_data, server_name=f"{SERVER_NAME}-nobwrap", unsafe_no_isolation=True)
    try:
        assert b.isolated is False and b.isolation == "none (unsafe)" and "UNSAFE" in b.describe()
        sid = b.create()
        assert b.exec(sid, ["cat", "/data/a.txt"], path_args=[1]).stdout == "apple\n"
    finally:
        b.close()


def test_unsafe_flag_must_be_a_bool(fixture_data):
    with pytest.raises(TypeError):
        LocalBackend(fixture_data, unsafe_no_isolation="yes")  # type: ignore[arg-type]


def test_docker_backend_says_it_is_isolated(docker_service):
    b = docker_service.backend
    assert b.isolated is True and "noexec" in b.describe()
    info = docker_service.create()
    try:
        r = docker_service.exec_argv(info.id, ["grep", "-E", " /(scratch|tmp) ", "/proc/self/mountinfo"])
        opts = [line.split()[5] for line in r.stdout.splitlines()]
        assert len(opts) == 2 and all("noexec" in o and "nosuid" in o and "nodev" in o for o in opts), r.stdout
    finally:
        docker_service.delete(info.id)


# -- S17: session variables that change how programs load --------------------------------------------------

SO_SOURCE = r"""
#include <fcntl.h>
#include <unistd.h>
__attribute__((constructor)) static void forkyard_pwn(void) {
    int fd;
    fd = open("%(host)s", O_WRONLY | O_CREAT, 0644); if (fd >= 0) close(fd);
    fd = open("PWNED", O_WRONLY | O_CREAT, 0644); if (fd >= 0) close(fd);
    fd = open("/scratch/PWNED", O_WRONLY | O_CREAT, 0644); if (fd >= 0) close(fd);
}
"""


@pytest.fixture(scope="module")
def evil_so(tmp_path_factory) -> tuple[bytes, Path]:
    """A real shared object whose constructor creates a host marker file (and /scratch/PWNED, ./PWNED)."""
    gcc = shutil.which("gcc") or shutil.which("cc")
    if not gcc:
        pytest.skip("no C compiler (gcc) to build the S17 shared object")
    d = tmp_path_factory.mktemp("s17")
    marker = d / f"marker-{uuid.uuid4().hex}"
    (d / "x.c").write_text(SO_SOURCE % {"host": marker})
    r = subprocess.run([gcc, "-shared", "-fPIC", "-o", str(d / "x.so"), str(d / "x.c")], capture_output=True, text=True)
    if r.returncode != 0:
        pytest.skip(f"gcc could not build a shared object: {r.stderr[-500:]}")
    # Prove the library works when loaded outside a sandbox, so the checks below are not vacuous.
    probe = subprocess.run(["cat", "/dev/null"], env={"LD_PRELOAD": str(d / "x.so"), "PATH": "/usr/bin:/bin"}, cwd=d)
    assert probe.returncode == 0 and marker.exists()
    marker.unlink()
    (d / "PWNED").unlink(missing_ok=True)
    return (d / "x.so").read_bytes(), marker


def _snapshot_names(service, sid):
    with tarfile.open(fileobj=io.BytesIO(service.backend.snapshot(service._session(sid).sid))) as tar:
        return [n for n in tar.getnames() if n not in ("scratch", "tmp")]


def _refusal(service, env: dict, **create_kw) -> tuple[str, str | None]:
    """Create a session with ``env`` and run ``cat``; return (refusal message, session id or None). Refused
    at create (the service validates) or at the call (the agent does): either way nothing runs."""
    try:
        info = service.create(env=env, **create_kw)
    except ToolRefused as exc:
        return str(exc), None
    with pytest.raises(ToolRefused) as exc:
        service.exec(info.id, "cat", {"path": "/data/a.txt"})
    return str(exc.value), info.id


def test_s17_ld_preload_of_an_uploaded_library_is_refused_and_never_runs(service, evil_so):
    so, marker = evil_so
    msg, sid = _refusal(service, {"LD_LIBRARY_PATH": ".", "LD_PRELOAD": "x.so"}, files={"x.so": so}, cwd="/scratch")
    try:
        assert "LD_LIBRARY_PATH" in msg and "LD_PRELOAD" in msg
        assert not marker.exists()
        if sid is not None:
            assert sorted(_snapshot_names(service, sid)) == ["scratch/x.so"]  # no PWNED anywhere
            # the same variables set later (update_state) are refused just the same
            service.update_state(sid, env={})
            assert service.exec(sid, "cat", {"path": "/data/a.txt"}).stdout == "apple\n"
            try:
                service.update_state(sid, env={"LD_PRELOAD": "/scratch/x.so"})
            except ToolRefused as exc:
                assert "LD_PRELOAD" in str(exc)
            else:
                with pytest.raises(ToolRefused, match="LD_PRELOAD"):
                    service.exec(sid, "cat", {"path": "/data/a.txt"})
            assert not marker.exists()
    finally:
        if sid:
            delete_quietly(service, sid)


@pytest.mark.parametrize("env", [
    {"PATH": "/scratch"}, {"HOME": "/scratch"}, {"PYTHONPATH": "/scratch"}, {"GCONV_PATH": "/scratch"},
    {"LOCPATH": "/scratch"}, {"MALLOC_CHECK_": "3"}, {"GLIBC_TUNABLES": "glibc.malloc.check=3"}, {"IFS": "x"},
    {"BASH_ENV": "/scratch/x"}, {"ENV": "/scratch/x"}, {"PERL5LIB": "/scratch"}, {"LD_AUDIT": "x.so"},
    {"LC_ALL": "/scratch/locale"}, {"LANG": "../../scratch/x"}, {"TZ": "/etc/shadow"}, {"TZ": ":/scratch/tz"},
    {"TERM": "x\x00y"}, {"COLUMNS": "80; rm"}, {"LANG": "x" * 300}, {"": "x"},
], ids=lambda e: next(iter(e)) or "empty")
def test_s17_loader_and_interpreter_variables_are_refused(service, env):
    msg, sid = _refusal(service, env)
    try:
        name = next(iter(env))
        if name in SESSION_ENV_NAMES:  # an allowed name with a value of the wrong form
            assert f"{name}: " in msg
        else:
            assert (name or "''") in msg.split("not allowed: ")[1].split(" (allowed")[0].split(", ")
    finally:
        if sid:
            delete_quietly(service, sid)


def test_s17_display_and_locale_variables_work(service):
    info = service.create(env={"TZ": "Europe/Paris", "LANG": "C.UTF-8", "LC_ALL": "C.UTF-8", "TERM": "dumb",
                               "COLUMNS": "80", "NO_COLOR": "1"})
    try:
        r = service.exec_argv(info.id, ["sh", "-c", "echo $TZ $COLUMNS"])
        assert r.status == "ok" and r.stdout == "Europe/Paris 80\n"
    finally:
        service.delete(info.id)


def test_s17_nothing_uploaded_can_be_executed(service):
    """A program written into /scratch (made executable by trusted code) cannot be executed: noexec tmpfs in
    Docker and under bubblewrap, Landlock in the unisolated mode."""
    if unisolated(service):
        sid0 = service.create().id
        abi = service.backend.confinement(service._session(sid0).sid).get("landlock_abi", 0)
        service.delete(sid0)
        if not abi:
            pytest.skip("unisolated local backend on a kernel without Landlock: the environment allow-list is the "
                        "barrier")
    true_bin = Path(shutil.which("true")).read_bytes()
    info = service.create(files={"t": true_bin, "s.sh": b"#!/bin/sh\necho RAN\n"})
    try:
        r = host_sh(service, info.id, "chmod 755 /scratch/t /scratch/s.sh && ls -l /scratch/t /scratch/s.sh")
        assert r.status == "ok" and r.stdout.count("-rwxr-xr-x") == 2, r
        for prog in ("/scratch/t", "/scratch/s.sh"):
            res = service.exec_argv(info.id, [prog], path_args=[0])
            assert res.status == "error" and "Permission denied" in res.message and "RAN" not in res.stdout, res
            assert res.message.startswith(f"could not start {prog}:")  # the sandbox path, never a host path
        res = host_sh(service, info.id, "cp /scratch/t /tmp/t2 && chmod 755 /tmp/t2 && /tmp/t2 && echo RAN")
        assert "RAN" not in res.stdout and "Permission denied" in res.stderr, res
    finally:
        service.delete(info.id)


def test_s17_preload_by_trusted_code_cannot_map_an_uploaded_library(service, evil_so):
    """Even a trusted caller setting LD_PRELOAD itself cannot load code from /scratch where it is noexec
    (Docker, bubblewrap); the unisolated mode has only the allow-list, so it is not run there."""
    if unisolated(service):
        pytest.skip("unisolated mode: mmap of an uploaded library is not blocked; the allow-list is the barrier")
    so, marker = evil_so
    info = service.create(files={"x.so": so}, cwd="/scratch")
    try:
        r = service.exec_argv(info.id, ["sh", "-c", "LD_PRELOAD=/scratch/x.so cat /data/a.txt"])
        assert r.stdout == "apple\n" and "x.so" in r.stderr, r  # ld.so: cannot be preloaded (failed to map segment)
        assert not marker.exists() and sorted(_snapshot_names(service, info.id)) == ["scratch/x.so"]
    finally:
        service.delete(info.id)


# -- S23: no host path reaches an agent -----------------------------------------------------------------

LOG = "".join(f"2024-01-01 00:00:{i % 60:02d} {'ERROR' if i % 7 == 0 else 'INFO'} event {i}\n" for i in range(200))
CALLS = [
    ("wc", {"path": "/scratch/app.log"}), ("wc", {"path": "app.log"}),
    ("grep", {"pattern": "ERROR", "path": "/scratch"}), ("grep", {"pattern": "ERROR", "path": "/scratch/logs"}),
    ("grep", {"pattern": "needle", "path": "/data/sub"}), ("find", {"path": "/scratch"}),
    ("find", {"path": "/data/sub"}), ("cat", {"path": "/scratch/missing.txt"}), ("cat", {"path": "/data/missing"}),
    ("cat", {"path": "/scratch/esc"}), ("ls", {"path": "/scratch/nope"}), ("ls", {"path": "/scratch", "long": True}),
    ("stat", {"path": "/scratch/app.log"}), ("stat", {"path": "/scratch/ok"}), ("head", {"path": "/scratch/logs"}),
    ("grep", {"pattern": "(", "path": "/scratch/app.log"}), ("tail", {"path": "/data/sub", "lines": 1}),
]


def _answers(service, sid):
    out = []
    for tool, args in CALLS:
        try:
            r = service.exec(sid, tool, args)
            out.append((tool, r.status, r.exit_code, r.stdout, r.stderr, r.message, r.truncated))
        except ToolRefused as exc:
            out.append((tool, "refused", str(exc)))
    for argv, paths in ((["/scratch/nope"], [0]), (["cat", "/scratch/missing", "/data/missing"], [1, 2])):
        r = service.exec_argv(sid, argv, path_args=paths)
        out.append((argv[0], r.status, r.exit_code, r.stdout, r.stderr, r.message))
    return out


def _host_paths(service, fixture_data) -> list[str]:
    b = service.backend
    paths = [str(fixture_data), os.path.realpath(fixture_data), str(fixture_data.parent)]
    if hasattr(b, "state_dir"):
        paths += [str(b.state_dir), os.path.realpath(b.state_dir), str(b.state_dir.parent.parent)]
    return paths


def test_s23_forks_answer_identically_in_sandbox_paths(service, fixture_data):
    origin = service.create(files={"app.log": LOG.encode(), "logs/a.log": b"x ERROR a\n", "logs/b.log": b"ERROR b\n"},
                            cwd="/scratch")
    ids = [origin.id]
    try:
        host_sh(service, origin.id, "ln -s /etc/passwd /scratch/esc && ln -s app.log /scratch/ok")
        kids = service.fork(origin.id, 2)
        ids += [k.id for k in kids]
        a, b = (_answers(service, k.id) for k in kids)
        assert a == b
        text = repr(a)
        for p in _host_paths(service, fixture_data):
            assert p not in text, f"host path {p} in an answer"
        assert "/root/" not in text and "/.cache/" not in text
        by_tool = {(x[0], i): x for i, x in enumerate(a)}
        assert by_tool[("wc", 0)][3].split() == ["200", "1000", str(len(LOG)), "/scratch/app.log"]
        assert by_tool[("grep", 2)][3].startswith("/scratch/app.log:1:") or "/scratch/logs/" in by_tool[("grep", 2)][3]
        assert by_tool[("find", 5)][3].splitlines()[0] == "/scratch"
        assert by_tool[("cat", 7)][4] == "cat: /scratch/missing.txt: No such file or directory\n"
        assert by_tool[("cat", 9)][1] == "refused" and "symbolic link" in by_tool[("cat", 9)][2]
        assert by_tool[("/scratch/nope", len(CALLS))][5].startswith("could not start /scratch/nope: ")
        assert "cat: /scratch/missing: No such file or directory" in by_tool[("cat", len(CALLS) + 1)][4]
        assert "cat: /data/missing: No such file or directory" in by_tool[("cat", len(CALLS) + 1)][4]
    finally:
        delete_quietly(service, *ids)


def test_s23_the_cap_counts_sandbox_path_bytes(service):
    """``grep -r`` prints a path per line: the capped output is byte for byte what Docker would give, on every
    backend (paths are rewritten before the cap, and never cut mid-way into a host path)."""
    lines = [f"line {i} é {'x' * (i % 50)}" for i in range(3000)]
    info = service.create(files={"d/f.txt": ("\n".join(lines) + "\n").encode()})
    try:
        r = service.exec(info.id, "grep", {"pattern": "", "path": "/scratch/d"})
        full = "".join(f"/scratch/d/f.txt:{i + 1}:{line}\n" for i, line in enumerate(lines)).encode()
        assert len(full) > CAP
        expected = utf8_cut(full[:CAP]).decode() + f"\n{MARK} {CAP} bytes]"
        assert r.truncated and r.stdout == expected
    finally:
        service.delete(info.id)


def test_path_rewriter_is_the_same_however_the_stream_is_cut():
    rw_pairs = [(b"/h/state/1-ab/l-cd/scratch", b"/scratch"), (b"/h/corpus", b"/data")]
    text = (b"/h/corpus/x:1:a /h/corpus2/y /h/state/1-ab/l-cd/scratch\n/h/state/1-ab/l-cd/scratchy "
            b"'/h/corpus' /h/corpus\xc3\xa9 /h/state/1-ab/l-cd/scratch/f: No such file\n") * 3
    whole = PathRewriter(rw_pairs).feed(text, final=True)
    assert whole.count(b"/data/x") == 3 and b"/h/corpus2/y" in whole and b"/h/state/1-ab/l-cd/scratchy" in whole
    assert b"'/data'" in whole and b"/h/corpus\xc3\xa9" in whole and b"/scratch/f: No such" in whole
    for step in (1, 2, 3, 7, 13, 64):
        rw = PathRewriter(rw_pairs)
        got = b"".join(rw.feed(text[i:i + step]) for i in range(0, len(text), step)) + rw.feed(b"", final=True)
        assert got == whole, step
    assert PathRewriter([]).feed(b"abc") == b"abc"


def test_session_env_names_are_only_locale_and_display():
    assert not [n for n in SESSION_ENV_NAMES if n.startswith(("LD_", "PYTHON", "MALLOC", "GLIBC", "PERL"))]
    assert not {"PATH", "HOME", "IFS", "ENV", "BASH_ENV", "GCONV_PATH", "LOCPATH", "TMPDIR",
                "POSIXLY_CORRECT"} & SESSION_ENV_NAMES
