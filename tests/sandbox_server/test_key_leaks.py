"""A key never shows, whatever characters it holds and however it was given (field case S60).

Keys here hold the characters that defeated the URL redaction (``/ @ : % # ? = & +``) between two markers,
``Qk1x`` and ``Zr9w``: a message, repr, log record or file that shows any part of a key around a reserved
character shows a marker. Real components throughout: a keyed env server on loopback (uvicorn), every client
(RemoteEnv over HTTP and WebSocket, RemoteVectorEnv, ForkyardEnvClient, SandboxClient, AsyncSandboxClient and
OpenEnv's own GenericEnvClient), the server's log records, and the ``forkyard train`` command. Also the URL
tokens (``POST /v1/tokens``, sandbox_server/auth.py): what to put in a URL instead of the server's key.
"""

from __future__ import annotations

import asyncio
import base64
import logging
import os
import re
import socket
import subprocess
import sys
import time
import traceback
import urllib.parse

import gymnasium as gym
import httpx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import envs  # noqa: F401 - registers the forkyard ids
from envs.api_key import KEY_FILE_VAR, KEY_VAR, redact, split_credentials
from envs.core import EnvInfraError
from envs.remote import RemoteEnv
from envs.remote_vector import RemoteVectorEnv
from sandbox_server.app import create_env_app
from sandbox_server.client import AsyncSandboxClient, SandboxClient
from sandbox_server.errors import SandboxNotFound, ServiceUnavailable
from tests.docker_support import ROOT, UvicornThread, free_port

CLUE = "forkyard/ClueProbe-v0"
MARKS = ("Qk1x", "Zr9w")
KEY = "Qk1x/s3@c:r%t#q?x=1&+~!Zr9w"
WRONG = "Qk1x/wr@ng:k%y#?Zr9w"
#: Visible ASCII but the comma (which separates the keys of a rotation): what check_key lets a key hold.
VISIBLE = st.characters(min_codepoint=33, max_codepoint=126, blacklist_characters=",")
KEYS = st.text(VISIBLE, max_size=24).map(lambda middle: f"{MARKS[0]}{middle}{MARKS[1]}")


def q(key: str) -> str:
    """``key`` percent-encoded for a URL's user info."""
    return urllib.parse.quote(key, safe="")


def hidden(text: str) -> bool:
    """Whether ``text`` shows no part of a marked key, in any form a key travels in (raw, percent-encoded,
    Basic's base64)."""
    basic = {base64.b64encode(f"forkyard:{k}".encode()).decode() for k in (KEY, WRONG)}
    return not any(mark in text or mark.lower() in text for mark in MARKS) and not any(b in text for b in basic)


def shown(exc: BaseException) -> str:
    """Everything an exception shows: its message, repr and the whole traceback with its causes."""
    return f"{exc}\n{exc!r}\n" + "".join(traceback.format_exception(exc))


@pytest.fixture(autouse=True)
def no_key_in_env(monkeypatch):
    monkeypatch.delenv(KEY_VAR, raising=False)
    monkeypatch.delenv(KEY_FILE_VAR, raising=False)


@pytest.fixture(scope="module")
def server():
    """An env server that requires ``KEY``."""
    srv = UvicornThread(create_env_app(api_key=KEY)).start()
    yield srv
    srv.stop()


def in_url(url: str, key: str) -> str:
    return url.replace("http://", f"http://forkyard:{q(key)}@")


# ---------------------------------------------------------------------------------------------- the one redaction
@settings(max_examples=300, deadline=None)
@given(KEYS, st.sampled_from(["http", "https", "ws", "wss"]), st.sampled_from(["", "/openenv/forkyard/x", "/v1/envs"]))
def test_redact_hides_a_key_in_any_url_form(key, scheme, path):
    for info in (f"forkyard:{key}", f"forkyard:{q(key)}", key, f"u:{key}"):
        url = f"{scheme}://{info}@127.0.0.1:8000{path}"
        for text in (url, repr(url), f"GET {url}: failed", repr(ConnectionError(f"Failed to connect to {url}")),
                     url[len(scheme) + 3:], f"got {url[len(scheme) + 3:]!r}"):
            assert hidden(redact(text)), text
    assert redact(f"http://forkyard:{q(key)}@h:1/x") == "http://***@h:1/x"
    for text in (f"x {key} y", f"{q(key)}", repr(key), urllib.parse.quote_plus(key),
                 re.sub("%[0-9A-F]{2}", lambda m: m[0].lower(), q(key))):
        assert hidden(redact(text, [key])), text


@settings(max_examples=300, deadline=None)
@given(KEYS)
def test_a_key_percent_encoded_in_a_url_is_read_and_one_written_raw_is_refused_unechoed(key):
    url, got = split_credentials(f"http://forkyard:{q(key)}@127.0.0.1:8000/openenv/x")
    assert (url, got) == ("http://127.0.0.1:8000/openenv/x", key)
    raw = f"http://forkyard:{key}@127.0.0.1:8000/openenv/x"
    # A URL carries these as they are, and a % followed by two hex digits is an escape whoever wrote it (a key
    # written raw with "%21" in it is read as "!": the server then refuses it, 401, as any wrong key)
    safe = all(c.isalnum() or c in "-._~!$&'()*+;=:" for c in re.sub(r"%[0-9A-Fa-f]{2}", "", key))
    decoded = urllib.parse.unquote(key)
    if safe and all(33 <= ord(c) <= 126 for c in decoded):
        assert split_credentials(raw)[1] == decoded
        return
    with pytest.raises(ValueError) as err:
        split_credentials(raw)
    assert "percent-encode" in str(err.value) and "FORKYARD_API_KEY" in str(err.value) and hidden(shown(err.value))


def test_every_client_refuses_a_key_a_url_cannot_carry_without_showing_it():
    raw = f"http://forkyard:{KEY}@127.0.0.1:1"
    from envs.openenv_client import ForkyardEnvClient
    from trainer.tabular_config import TrainConfig

    makers = [lambda: RemoteEnv(CLUE, raw), lambda: RemoteEnv(CLUE, raw, transport="ws"),
              lambda: RemoteVectorEnv(CLUE, raw, 2), lambda: ForkyardEnvClient(base_url=f"{raw}/openenv/{CLUE}"),
              lambda: SandboxClient(raw), lambda: AsyncSandboxClient(raw), lambda: gym.make(CLUE, server_url=raw),
              lambda: RemoteEnv(CLUE, raw.replace("http://", "")), lambda: TrainConfig(server_url=raw)]
    for make in makers:
        with pytest.raises(ValueError) as err:
            make()
        assert hidden(shown(err.value)), shown(err.value)
    for make in makers[:7]:
        with pytest.raises(ValueError, match="percent-encode"):
            make()


# ---------------------------------------------------------------------------------------------- every client
def test_every_client_reaches_the_server_with_the_key_in_any_form_and_shows_it_nowhere(server, monkeypatch, tmp_path):
    from openenv.core.generic_client import GenericEnvClient

    from envs.openenv_client import ForkyardEnvClient

    url = in_url(server.url, KEY)
    for transport in ("http", "ws"):
        env = gym.make(CLUE, server_url=url, transport=transport)
        assert "Turn 1 of" in env.reset(seed=0)[0] and env.step("probe(0)")[4]["turn"] == 1
        kid = env.unwrapped.fork(1)[0]
        for text in (repr(env), str(env), repr(env.spec), repr(env.unwrapped), repr(kid), repr(vars(env.unwrapped))):
            assert hidden(text), text
        assert hidden(repr(vars(env.unwrapped._session.transport)))
        kid.close()
        env.close()
        again = gym.make(env.spec)  # a concealed spec still carries the key
        again.reset(seed=1)
        again.close()
    vec = RemoteVectorEnv(CLUE, url, 2)
    assert len(vec.reset(seed=0)[0]) == 2
    assert hidden(repr(vec)) and hidden(repr(vars(vec)))
    vec.close()
    base = f"{url}/openenv/{CLUE}"
    fy = ForkyardEnvClient(base_url=base)
    with fy.sync() as env:
        env.reset(seed=0)
        assert len(env.fork(1)) == 1
        assert hidden(repr(env)) and hidden(repr(fy)) and hidden(repr(vars(fy)))
    with GenericEnvClient(base_url=base).sync() as env:  # OpenEnv's own: websockets decodes the user info
        assert "Turn 1 of" in env.reset(seed=0).observation["text"]
    for client in (SandboxClient(url), SandboxClient(server.url, api_key=KEY)):
        with pytest.raises(SandboxNotFound):  # past the door: an env server has no pool
            client.pool_status()
        assert hidden(repr(client)) and hidden(client.name) and hidden(repr(vars(client)))
        client.close()

    async def go() -> None:
        async with AsyncSandboxClient(url) as c:
            with pytest.raises(SandboxNotFound):
                await c.pool_status()

    asyncio.run(go())
    monkeypatch.setenv(KEY_VAR, KEY)
    env = RemoteEnv(CLUE, server.url)
    env.reset(seed=0)
    assert hidden(repr(vars(env)))
    env.close()
    monkeypatch.delenv(KEY_VAR)
    (tmp_path / "key").write_text(KEY + "\n")
    monkeypatch.setenv(KEY_FILE_VAR, str(tmp_path / "key"))
    with ForkyardEnvClient(base_url=f"{server.url}/openenv/{CLUE}").sync() as env:
        env.reset(seed=0)


def _silent_listener() -> tuple[socket.socket, str]:
    """A socket that accepts connections (the backlog does) and never answers: every read times out."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(16)
    return sock, f"http://127.0.0.1:{sock.getsockname()[1]}"


@pytest.mark.parametrize("given_as", ["url", "argument", "environment"])
def test_no_client_error_shows_the_key(server, monkeypatch, given_as):
    """Connection refused, a timeout, 401 (wrong key), 404 (a lost session, an unknown route) and a failed
    WebSocket handshake, for every client, with the key in the URL, an argument or FORKYARD_API_KEY."""
    from envs.openenv_client import ForkyardEnvClient

    silent, silent_url = _silent_listener()
    dead = f"http://127.0.0.1:{free_port()}"

    def args(base: str, key: str) -> tuple[str, dict]:
        if given_as == "url":
            return in_url(base, key), {}
        if given_as == "argument":
            return base, {"api_key": key}
        monkeypatch.setenv(KEY_VAR, key)
        return base, {}

    failures: list[BaseException] = []

    def expect(errors, fn, *a, **kw) -> None:
        with pytest.raises(errors) as err:
            fn(*a, **kw)
        failures.append(err.value)

    def reset(env) -> None:
        env.reset(seed=0)

    def fy_reset(url: str, wait: float, kw: dict) -> None:
        fy = ForkyardEnvClient(base_url=f"{url}/openenv/{CLUE}", connect_timeout_s=wait, message_timeout_s=wait, **kw)
        fy.sync().reset(seed=0)

    try:
        for base, key, wait, errors in ((dead, KEY, 5, EnvInfraError), (silent_url, KEY, 0.5, EnvInfraError),
                                        (server.url, WRONG, 30, PermissionError)):
            url, kw = args(base, key)
            for transport in ("http", "ws"):
                env = RemoteEnv(CLUE, url, transport=transport, timeout_s=wait, connect_retries=0, **kw)
                expect(errors, reset, env)
            expect(errors, reset, RemoteVectorEnv(CLUE, url, 1, timeout_s=wait, connect_retries=0, **kw))
            expect((ServiceUnavailable, PermissionError), SandboxClient(url, timeout_s=wait, busy_timeout_s=0,
                                                                        **kw).pool_status)
            expect((ConnectionError, RuntimeError), fy_reset, url, wait, kw)
        url, kw = args(server.url, KEY)  # 404s: a session the server lost, a route it does not have
        env = RemoteEnv(CLUE, url, **kw)
        env.reset(seed=0)
        env._session.session_id = "no-such-session"  # as a server that lost it answers: 404
        expect(EnvInfraError, env.step, "probe(0)")
        expect(SandboxNotFound, SandboxClient(url, **kw).pool_status)
    finally:
        silent.close()
    assert len(failures) == 17
    for exc in failures:
        assert hidden(shown(exc)), shown(exc)


# ---------------------------------------------------------------------------------------------- the server's side
def test_the_server_logs_no_key_and_warns_once_of_a_key_in_a_url(server, caplog):
    from openenv.core.generic_client import GenericEnvClient

    caplog.set_level(logging.DEBUG)
    basic = base64.b64encode(f"forkyard:{KEY}".encode()).decode()
    with httpx.Client(base_url=server.url, timeout=30) as http:
        for headers in ({"Authorization": f"Bearer {WRONG}"}, {"Authorization": f"Basic {basic}"},
                        {"Authorization": f"Bearer {KEY}"}, {"Authorization": f"Basic {KEY}"}):
            http.get("/v1/envs", headers=headers)
            http.post("/v1/envs", headers=headers, content=b"{not json")
        metrics = http.get("/metrics", headers={"Authorization": f"Bearer {KEY}"}).text
    with pytest.raises(ConnectionError):
        with GenericEnvClient(base_url=in_url(f"{server.url}/openenv/{CLUE}", WRONG)).sync() as env:
            env.reset(seed=0)
    with GenericEnvClient(base_url=in_url(f"{server.url}/openenv/{CLUE}", KEY)).sync() as env:
        env.reset(seed=0)
    for extra in ({"api_key": KEY}, {}):  # forkyard's WebSocket clients: the header in websockets' DEBUG lines
        env = RemoteEnv(CLUE, server.url if extra else in_url(server.url, KEY), transport="ws", **extra)
        env.reset(seed=0)
        env.close()
    assert any("authorization" in r.getMessage().lower() for r in caplog.records)  # the lines were logged
    text = "\n".join(f"{r.getMessage()} {r.exc_text or ''} {r.args!r}" for r in caplog.records)
    assert hidden(text) and hidden(metrics)
    app = server.server.config.app
    assert hidden(repr(app.user_middleware)) and hidden(repr(app.middleware_stack))


def test_a_key_sent_as_basic_credentials_warns_once_pointing_to_url_tokens(caplog):
    srv = UvicornThread(create_env_app(api_key=KEY)).start()
    try:
        caplog.set_level(logging.WARNING, logger="sandbox_server.auth")
        basic = base64.b64encode(f"forkyard:{KEY}".encode()).decode()
        for _ in range(3):
            assert httpx.get(f"{srv.url}/v1/envs", headers={"Authorization": f"Basic {basic}"}).status_code == 200
        warned = [r for r in caplog.records if r.name == "sandbox_server.auth"]
        assert len(warned) == 1 and "POST /v1/tokens" in warned[0].getMessage() and hidden(warned[0].getMessage())
    finally:
        srv.stop()


# ---------------------------------------------------------------------------------------------- URL tokens
def _mint(url: str, key: str, **body) -> httpx.Response:
    return httpx.post(f"{url}/v1/tokens", json=body, headers={"Authorization": f"Bearer {key}"}, timeout=30)


def test_a_url_token_opens_the_openenv_routes_only_until_it_expires(server, caplog):
    from openenv.core.generic_client import GenericEnvClient

    caplog.set_level(logging.WARNING, logger="sandbox_server.auth")
    r = _mint(server.url, KEY)
    assert r.status_code == 201, r.text
    answer = r.json()
    token = answer["token"]
    assert answer["scope"] == "/openenv/" and answer["userinfo"] == f"forkyard:{token}" and hidden(r.text)
    assert urllib.parse.quote(token, safe="") == token  # URL-safe as it is
    assert answer["expires_at"] - time.time() == pytest.approx(3600, abs=60)
    base = f"{server.url}/openenv/{CLUE}".replace("http://", f"http://forkyard:{token}@")
    with GenericEnvClient(base_url=base).sync() as env:  # verifiers' and OpenEnv's form, with a token
        assert "Turn 1 of" in env.reset(seed=0).observation["text"]
    env = RemoteEnv(CLUE, server.url, transport="ws", api_key=token)  # forkyard's clients take one too
    assert "Turn 1 of" in env.reset(seed=0)[0]
    env.close()
    with httpx.Client(base_url=server.url, timeout=30) as http:
        bearer = {"Authorization": f"Bearer {token}"}
        assert http.get(f"/openenv/{CLUE}/health", headers=bearer).status_code == 200
        for method, path in (("GET", "/v1/envs"), ("POST", "/v1/envs"), ("GET", "/metrics"), ("GET", "/docs"),
                             ("GET", "/openenv/../v1/envs"), ("POST", "/v1/tokens")):
            assert http.request(method, path, headers=bearer, json={}).status_code == 401, path
        tampered = token[:-2] + ("AA" if token[-2:] != "AA" else "BB")
        assert http.get(f"/openenv/{CLUE}/health", headers={"Authorization": f"Bearer {tampered}"}).status_code == 401
        one = _mint(server.url, KEY, env_id=CLUE).json()["token"]
        assert http.get(f"/openenv/{CLUE}/health", headers={"Authorization": f"Bearer {one}"}).status_code == 200
        other = "forkyard/FileQA-v0"
        assert http.get(f"/openenv/{other}/health", headers={"Authorization": f"Bearer {one}"}).status_code == 401
        short = _mint(server.url, KEY, ttl_s=1).json()["token"]
        time.sleep(2.1)
        assert http.get(f"/openenv/{CLUE}/health", headers={"Authorization": f"Bearer {short}"}).status_code == 401
        for body in ({"ttl_s": 0}, {"ttl_s": 10**9}, {"ttl_s": "1"}, {"env_id": "../v1"}, {"env_id": "/x"},
                     {"scope": "/"}, [1]):
            r = http.post("/v1/tokens", json=body, headers={"Authorization": f"Bearer {KEY}"})
            assert r.status_code == 422 and r.json()["status"] == "invalid", body
        assert http.get("/v1/tokens", headers={"Authorization": f"Bearer {KEY}"}).status_code == 405
        assert http.post("/v1/tokens", json={}).status_code == 401
        assert http.post("/v1/tokens", json={}, headers={"Authorization": f"Bearer {WRONG}"}).status_code == 401
    assert not [r for r in caplog.records if r.name == "sandbox_server.auth"]  # a token in a URL is the right form


def test_a_url_token_lives_through_a_restart_and_a_rotation_and_dies_with_its_key():
    new = "fy-new-Qk1x0123456789Zr9w"
    srv = UvicornThread(create_env_app(api_key=KEY)).start()
    try:
        token = _mint(srv.url, KEY).json()["token"]
    finally:
        srv.stop()
    for keys, status in ((KEY, 200), (f"{new},{KEY}", 200), (new, 401)):
        srv = UvicornThread(create_env_app(api_key=keys)).start()
        try:
            r = httpx.get(f"{srv.url}/openenv/{CLUE}/health", headers={"Authorization": f"Bearer {token}"})
            assert r.status_code == status, keys
        finally:
            srv.stop()


# ---------------------------------------------------------------------------------------------- run folders
def test_forkyard_train_refuses_a_server_url_with_a_key_and_writes_nothing(tmp_path):
    run = tmp_path / "run"
    for url in (f"http://forkyard:{q(KEY)}@127.0.0.1:1", f"http://forkyard:{KEY}@127.0.0.1:1"):
        res = subprocess.run([sys.executable, "-m", "trainer.cli", "train", "--server", url, "--run-dir", str(run),
                              "--iterations", "1"], capture_output=True, text=True, timeout=300, cwd=ROOT,
                             env={**os.environ, "PYTHONPATH": str(ROOT)})
        assert res.returncode == 2, res.stderr
        assert "FORKYARD_API_KEY" in res.stderr and hidden(res.stdout + res.stderr), res.stderr
        assert not (run / "config.json").exists()
