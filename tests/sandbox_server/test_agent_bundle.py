"""The agent package delivered as one zipapp (sandbox_server/agent_bundle.py): the same bytes from the same
sources whatever the time zone, every module of the package inside, and the archive alone serving the
agent's protocol under ``python3 -I`` (no checkout, no site-packages)."""

from __future__ import annotations

import base64
import json
import os
import stat
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from sandbox_server import agent_bundle
from sandbox_server.agent_bundle import AGENT_PACKAGE, ZIP_PACKAGE, agent_sha, agent_zipapp, build_agent_zipapp

ROOT = Path(__file__).resolve().parents[2]


def test_the_zipapp_is_deterministic_and_holds_every_module(tmp_path):
    a, b = agent_bundle.zipapp_bytes(), agent_bundle.zipapp_bytes()
    assert a == b and a.startswith(b"#!/usr/bin/env python3\n")
    # another process in another time zone builds the same bytes (zip dates are fixed, not local mtimes)
    out = tmp_path / "tz.pyz"
    sha = subprocess.run([sys.executable, "-m", "sandbox_server.agent_bundle", str(out)], cwd=ROOT, check=True,
                         capture_output=True, text=True, env={**os.environ, "TZ": "Pacific/Kiritimati"}).stdout.strip()
    assert out.read_bytes() == a and sha == agent_sha() and len(sha) == 16
    with zipfile.ZipFile(out) as zf:
        infos = zf.infolist()
    names = [i.filename for i in infos]
    assert names == sorted(names)
    assert set(names) == {"__main__.py"} | {f"{ZIP_PACKAGE}/{p.name}" for p in AGENT_PACKAGE.glob("*.py")}
    assert {i.date_time for i in infos} == {(1980, 1, 1, 0, 0, 0)} and {i.compress_type for i in infos} == {0}


def test_the_zipapp_alone_serves_the_protocol(tmp_path):
    pyz = tmp_path / "agent.pyz"
    assert build_agent_zipapp(pyz) == agent_sha()
    for d in ("data", "scratch", "tmp"):
        (tmp_path / d).mkdir()
    (tmp_path / "data" / "a.txt").write_text("apple\n")
    reqs = [{"id": 1, "op": "ping"},
            {"id": 2, "op": "write", "files": {"n/b.txt": base64.b64encode(b"hi\n").decode()}},
            {"id": 3, "op": "exec", "argv": ["cat", "/data/a.txt", "/scratch/n/b.txt"], "path_args": [1, 2]},
            {"id": 4, "op": "exec", "argv": ["cat", "/etc/passwd"], "path_args": [1]}]
    roots = [f"--root=/{d}={tmp_path / d}" for d in ("data", "scratch", "tmp")]
    r = subprocess.run([sys.executable, "-u", "-I", str(pyz), *roots], cwd=tmp_path, timeout=60, check=True,
                       input="".join(json.dumps(q) + "\n" for q in reqs), capture_output=True, text=True)
    ans = [json.loads(line) for line in r.stdout.splitlines()]
    assert [a["id"] for a in ans] == [1, 2, 3, 4]
    assert ans[0]["pong"] is True and ans[0]["limits"]["area_bytes"] == 16 << 20
    assert ans[1] == {"ok": True, "id": 2}
    assert ans[2]["stdout"] == "apple\nhi\n" and ans[2]["status"] == "ok"
    assert ans[3]["status"] == "refused" and str(tmp_path) not in ans[3]["message"]


def test_the_local_copy_is_rewritten_when_altered(tmp_path):
    p = agent_zipapp(tmp_path)
    assert p.name == "agent.pyz" and p.read_bytes() == agent_bundle.zipapp_bytes()
    assert agent_zipapp(tmp_path) == p
    p.write_bytes(b"not the agent")
    assert agent_zipapp(tmp_path) == p and p.read_bytes() == agent_bundle.zipapp_bytes()
    p.unlink()
    assert agent_zipapp(tmp_path).read_bytes() == agent_bundle.zipapp_bytes()


def test_only_a_regular_file_is_replaced(tmp_path):
    fifo, folder = tmp_path / "fifo.pyz", tmp_path / "dir.pyz"
    os.mkfifo(fifo)
    folder.mkdir()
    for p in (fifo, folder):
        with pytest.raises(FileExistsError, match="not a regular file"):
            build_agent_zipapp(p)
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode) and folder.is_dir()
