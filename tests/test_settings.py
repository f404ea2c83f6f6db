"""Settings are declared once (sandbox_server/settings.py) and read from FORKYARD_* variables; the README
names every one of them, so a new setting cannot go undocumented."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from pydantic import ValidationError

from sandbox_server.settings import ServerSettings, ServiceConfig

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("model", [ServiceConfig, ServerSettings])
def test_the_readme_names_every_setting(model):
    readme = ROOT.joinpath("README.md").read_text()
    named = set(re.findall(r"FORKYARD_[A-Z0-9_]+", readme))
    missing = sorted(f"FORKYARD_{f.upper()}" for f in model.model_fields if f"FORKYARD_{f.upper()}" not in named)
    assert missing == []


def test_environment_keywords_and_defaults_in_that_order(monkeypatch):
    monkeypatch.setenv("FORKYARD_MAX_TOTAL", "7")
    monkeypatch.setenv("FORKYARD_RECYCLE", "false")
    cfg = ServiceConfig(min_idle=1)
    assert (cfg.max_total, cfg.recycle, cfg.min_idle, cfg.acquire_timeout_s) == (7, False, 1, 15.0)
    assert ServiceConfig(max_total=3).max_total == 3  # a keyword wins over the environment
    assert ServiceConfig.from_env(max_total=None).max_total == 7  # None means "not given"
    monkeypatch.setenv("FORKYARD_BACKEND", "docker")
    monkeypatch.setenv("FORKYARD_PORT", "8123")
    s = ServerSettings()
    assert (s.backend, s.port, s.host) == ("docker", 8123, "127.0.0.1")


@pytest.mark.parametrize("name,value", [("FORKYARD_MAX_TOTAL", "0"), ("FORKYARD_MAX_TOTAL", "many"),
                                        ("FORKYARD_ACQUIRE_TIMEOUT_S", "-1"), ("FORKYARD_RECYCLE", "perhaps")])
def test_a_bad_value_is_refused_with_its_name(monkeypatch, name, value):
    monkeypatch.setenv(name, value)
    with pytest.raises(ValidationError, match=name.removeprefix("FORKYARD_").lower()):
        ServiceConfig()


def test_unknown_keywords_are_refused():
    with pytest.raises(ValidationError):
        ServiceConfig(max_totl=3)


def test_min_idle_above_max_total_is_refused_before_anything_starts(monkeypatch):
    with pytest.raises(ValidationError, match="min_idle"):
        ServiceConfig(min_idle=5, max_total=2)
    monkeypatch.setenv("FORKYARD_MIN_IDLE", "20")
    with pytest.raises(ValidationError, match="max_total"):
        ServiceConfig()
