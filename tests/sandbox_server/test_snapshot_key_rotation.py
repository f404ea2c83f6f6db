"""Field case S54, "One key, no rotation": ``FORKYARD_SNAPSHOT_KEY="NEW,OLD"`` was read as NEW alone (Fernet's
lenient base64 stops at the first key's padding), so tokens sealed before a key change were refused as forged.

Now the setting is a list (the first key seals, every one opens: ``MultiFernet``), read strictly at start-up,
and the API key variables take a list too (a server accepts each, a client sends the first). Real servers on
loopback (``create_env_app`` under uvicorn, and the ``python -m sandbox_server`` command), real Fernet keys.
"""

from __future__ import annotations

import os
import subprocess
import sys

import gymnasium as gym
import httpx
import pytest
from cryptography.fernet import Fernet
from pydantic import ValidationError

import envs  # noqa: F401 - registers the forkyard ids
from envs.api_key import KEY_FILE_VAR, KEY_VAR, api_key, api_keys
from sandbox_server.app import create_env_app
from sandbox_server.settings import ServerSettings, explain, snapshot_keys
from sandbox_server.snapshot_tokens import SnapshotSealer, SnapshotTokenError
from tests.docker_support import ROOT, UvicornThread

CLUE = "forkyard/ClueProbe-v0"
VAR = "FORKYARD_SNAPSHOT_KEY"
NEW, OLD = Fernet.generate_key().decode(), Fernet.generate_key().decode()


@pytest.fixture(autouse=True)
def clean_env(monkeypatch):
    for var in (VAR, KEY_VAR, KEY_FILE_VAR):
        monkeypatch.delenv(var, raising=False)


def leaks(text: str) -> bool:
    """Whether ``text`` shows any part of either key (a 12-character slice is already too much)."""
    return any(key[i:i + 12] in text for key in (NEW, OLD) for i in range(0, len(key) - 11))


def serve(monkeypatch, key: str, port: int | None = None) -> UvicornThread:
    """An env server started as an operator starts it: the key from the variable."""
    monkeypatch.setenv(VAR, key)
    return UvicornThread(create_env_app(), port=port).start()


def snapshot_token(srv: UvicornThread, probe: int) -> str:
    """The sealed snapshot of a ClueProbe session on ``srv`` after one probe (turn 1)."""
    sid = httpx.post(f"{srv.url}/v1/envs", json={"env_id": CLUE, "seed": 7}).json()["session_id"]
    assert httpx.post(f"{srv.url}/v1/envs/{sid}/step", json={"action": f"probe({probe})"}).status_code == 200
    made = httpx.post(f"{srv.url}/v1/envs/{sid}/snapshot")
    assert made.status_code == 200, made.text
    httpx.delete(f"{srv.url}/v1/envs/{sid}")
    return made.json()["snapshot"]


def restore(srv: UvicornThread, token: str) -> httpx.Response:
    return httpx.post(f"{srv.url}/v1/envs/restore", json={"snapshot": token})


# ------------------------------------------------------------------------------------ rotation on real servers
def test_s54_a_rotation_keeps_old_tokens_and_seals_new_ones_with_the_new_key(monkeypatch):
    """Seal under OLD; restart under ``NEW,OLD``: the old token restores, new tokens are sealed with NEW;
    restart under NEW alone: NEW's tokens restore, OLD's are refused as forged, saying why."""
    srv = serve(monkeypatch, OLD)
    port = srv.port
    try:
        old_token = snapshot_token(srv, 1)
    finally:
        srv.stop()

    srv = serve(monkeypatch, f"{NEW},{OLD}", port)  # the same address, restarted with the new key first
    try:
        back = restore(srv, old_token)
        assert back.status_code == 201, back.text
        assert back.json()["info"]["turn"] == 1
        new_token = snapshot_token(srv, 2)
    finally:
        srv.stop()
    assert SnapshotSealer(NEW).open(new_token).env_id == CLUE  # sealed with NEW: NEW alone opens it...
    with pytest.raises(SnapshotTokenError):
        SnapshotSealer(OLD).open(new_token)  # ...and OLD does not

    srv = serve(monkeypatch, NEW, port)  # OLD dropped
    try:
        assert restore(srv, new_token).status_code == 201
        refused = restore(srv, old_token)
        assert refused.status_code == 422
        detail = refused.json()["detail"]
        assert "another key" in detail and VAR in detail and "NEW,OLD" in detail  # says what to do
        assert not leaks(refused.text)
    finally:
        srv.stop()


def test_s54_spaces_around_the_commas_and_a_trailing_newline_read_as_the_same_list(monkeypatch):
    """A list written ``NEW, OLD`` (or a key file's trailing newline) means the same keys: no key holds
    whitespace, so dropping it around a key never changes which keys are meant."""
    assert ServerSettings(snapshot_key=f" {NEW} , {OLD}\n").snapshot_key.get_secret_value() == f"{NEW},{OLD}"
    old_token = SnapshotSealer(OLD).seal(gym.make(CLUE).unwrapped.snapshot())
    srv = serve(monkeypatch, f"{NEW}, {OLD}\n")
    try:
        assert restore(srv, old_token).status_code == 201
    finally:
        srv.stop()


def test_s54_the_sealer_takes_a_list_as_text_or_as_a_sequence():
    snap = gym.make(CLUE).unwrapped.snapshot()
    by_old = SnapshotSealer(OLD).seal(snap)
    for keys in (f"{NEW},{OLD}", [NEW, OLD], (NEW.encode(), OLD.encode()), f"{NEW},{OLD}".encode()):
        sealer = SnapshotSealer(keys)
        assert sealer.open(by_old) == snap
        assert SnapshotSealer(NEW).open(sealer.seal(snap)) == snap  # the first key seals
        with pytest.raises(SnapshotTokenError):
            SnapshotSealer(OLD).open(sealer.seal(snap))
    with pytest.raises(SnapshotTokenError, match="another key"):
        SnapshotSealer(NEW).open(by_old)
    as_bytes = SnapshotSealer(NEW.encode())  # Fernet.generate_key() gives bytes
    assert SnapshotSealer(NEW).open(as_bytes.seal(snap)) == snap
    own = SnapshotSealer()  # no key: one drawn for this sealer alone
    assert own.open(own.seal(snap)) == snap
    with pytest.raises(SnapshotTokenError):
        SnapshotSealer().open(own.seal(snap))


# ------------------------------------------------------------------------------------ malformed lists
#: (what is wrong, the setting's text, a word the refusal must say)
MALFORMED = [
    ("trailing comma", f"{NEW},", "key 2 of 2 is empty"),
    ("leading comma", f",{NEW}", "key 1 of 2 is empty"),
    ("empty middle item", f"{NEW},,{OLD}", "key 2 of 3 is empty"),
    ("only commas", ",", "key 1 of 2 is empty"),
    ("empty", "", "it is empty"),
    ("blank", "  ", "it is empty"),
    ("space-separated", f"{NEW} {OLD}", "holds whitespace"),
    ("no separator", f"{NEW}{OLD}", "key 1 of 1 is not a Fernet key"),
    ("too short", f"{NEW},{OLD[:-2]}", "key 2 of 2 is not a Fernet key"),
    ("trailing junk", f"{NEW},{OLD}x", "key 2 of 2 is not a Fernet key"),
    ("standard base64", f"{NEW},{'+/' + OLD[2:]}", "key 2 of 2 is not a Fernet key"),
    ("not a key at all", "not-a-key-but-a-secret-phrase", "key 1 of 1 is not a Fernet key"),
    ("semicolon-separated", f"{NEW};{OLD}", "key 1 of 1 is not a Fernet key"),
    ("duplicate", f"{NEW},{OLD},{NEW}", "key 3 of 3 repeats key 1"),
]


@pytest.mark.parametrize("value,word", [m[1:] for m in MALFORMED], ids=[m[0] for m in MALFORMED])
def test_s54_a_malformed_list_is_refused_naming_the_setting_never_a_key(monkeypatch, value, word):
    with pytest.raises(ValidationError) as by_keyword:
        ServerSettings(snapshot_key=value)
    monkeypatch.setenv(VAR, value)
    with pytest.raises(ValidationError) as by_variable:
        ServerSettings()
    said = explain(by_variable.value, ServerSettings)
    assert said == explain(by_keyword.value, ServerSettings)
    assert said.startswith(f"{VAR}: ") and word in said and "Fernet key" in said
    assert not leaks(said) and not leaks(str(by_variable.value))
    with pytest.raises(ValueError, match=VAR) as app_refused:  # the app refuses to be built, too
        create_env_app()
    assert not leaks(str(app_refused.value))
    with pytest.raises(ValueError, match=word) as sealer_refused:  # and so does the sealer, given it directly
        SnapshotSealer(value)
    assert not leaks(str(sealer_refused.value))


@pytest.mark.parametrize("value", [f"{NEW},", f"{NEW} {OLD}", f"{NEW},{OLD[:-2]}", f"{NEW},{NEW}"],
                         ids=["trailing comma", "space-separated", "too short", "duplicate"])
def test_s54_the_server_command_stops_at_start_up_on_a_malformed_list(value):
    """``python -m sandbox_server`` exits 2 before serving, one line naming the variable, no key, no traceback."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("FORKYARD_")}
    r = subprocess.run([sys.executable, "-m", "sandbox_server", "--no-sandboxes", "--port", "0"], cwd=ROOT,
                       capture_output=True, text=True, timeout=60,
                       env={**env, "PYTHONPATH": str(ROOT), VAR: value})
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr[-2000:]
    assert f"{VAR}: " in r.stderr.strip().splitlines()[-1]
    assert not leaks(r.stderr + r.stdout)


def test_s54_snapshot_keys_reads_a_list_in_order():
    assert snapshot_keys(NEW) == (NEW,)
    assert snapshot_keys(f"{NEW},{OLD}") == (NEW, OLD)
    assert snapshot_keys(f"{OLD},{NEW}") == (OLD, NEW)
    with pytest.raises(ValueError, match="^the key must be one Fernet key"):
        snapshot_keys(f"{NEW},", "the key")


# ------------------------------------------------------------------------------------ API keys
def test_s54_the_api_key_variables_hold_a_list_the_client_sends_the_first(tmp_path):
    assert api_keys(environ={}) == () and api_key(environ={}) is None
    assert api_keys(environ={KEY_VAR: "fy-new-key,fy-old-key"}) == ("fy-new-key", "fy-old-key")
    assert api_key(environ={KEY_VAR: "fy-new-key,fy-old-key"}) == "fy-new-key"
    assert api_keys("fy-new-key,fy-old-key", environ={KEY_VAR: "other"}) == ("fy-new-key", "fy-old-key")
    (tmp_path / "k").write_text("fy-new-key,fy-old-key\n")
    assert api_keys(environ={KEY_FILE_VAR: str(tmp_path / "k")}) == ("fy-new-key", "fy-old-key")
    assert api_keys(environ={KEY_VAR: "fy-one-key"}) == ("fy-one-key",)


@pytest.mark.parametrize("value,word", [
    ("fy-new-key,", "key 2 of 2"), (",fy-new-key", "key 1 of 2"), ("fy-new-key,,fy-old-key", "key 2 of 3"),
    ("fy-new-key, fy-old-key", "key 2 of 2"), ("fy-new-key,fy-new-key", "repeats key 1"), ("", KEY_VAR)])
def test_s54_a_malformed_api_key_list_is_refused_naming_the_variable(tmp_path, value, word):
    (tmp_path / "k").write_text(value)
    for environ, var in (({KEY_VAR: value}, KEY_VAR), ({KEY_FILE_VAR: str(tmp_path / "k")}, KEY_FILE_VAR)):
        with pytest.raises(ValueError, match=var) as refused:
            api_keys(environ=environ)
        assert word in str(refused.value) or not value
        assert "fy-new-key" not in str(refused.value) and "fy-old-key" not in str(refused.value)
        with pytest.raises(ValueError):
            api_key(environ=environ)  # a client refuses the same list


def test_s54_a_client_given_the_list_reaches_a_server_that_requires_the_new_key(monkeypatch):
    """A client in the server's own environment, given ``NEW,OLD``, sends NEW (not the whole text)."""
    srv = UvicornThread(create_env_app(api_key="fy-new-key")).start()
    try:
        from envs.remote import RemoteEnv

        monkeypatch.setenv(KEY_VAR, "fy-new-key,fy-old-key")
        env = RemoteEnv(CLUE, srv.url)
        try:
            _, info = env.reset(seed=3)
            assert info["turn"] == 0
        finally:
            env.close()
        monkeypatch.setenv(KEY_VAR, "fy-old-key,fy-new-key")  # the old key first: refused by this server
        env = RemoteEnv(CLUE, srv.url)
        try:
            with pytest.raises(PermissionError):
                env.reset(seed=3)
        finally:
            env.close()
    finally:
        srv.stop()
