"""Settings are declared once (sandbox_server/settings.py) and read from FORKYARD_* variables; docs/serving.md
names every one of them, so a new setting cannot go undocumented."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest
import uvicorn.config
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from sandbox_server.backends import BACKENDS, make_backend
from sandbox_server.settings import LOG_LEVELS, MAX_SECONDS, ServerSettings, ServiceConfig, explain

ROOT = Path(__file__).resolve().parents[2]


def test_the_docs_name_the_api_key_variables_and_compose_reads_no_other():
    from envs.api_key import KEY_FILE_VAR, KEY_VAR

    readme = ROOT.joinpath("docs", "serving.md").read_text()
    assert KEY_VAR in readme and KEY_FILE_VAR in readme
    compose = set(re.findall(r"FORKYARD_[A-Z0-9_]+", ROOT.joinpath("compose.yaml").read_text()))
    known = {f"FORKYARD_{f.upper()}" for m in (ServiceConfig, ServerSettings) for f in m.model_fields}
    assert compose - known == {KEY_VAR, "FORKYARD_PUBLISH_ADDRESS", "FORKYARD_SERVER_IMAGE"}
    assert "FORKYARD_PUBLISH_ADDRESS" in readme


@pytest.mark.parametrize("model", [ServiceConfig, ServerSettings])
def test_the_docs_name_every_setting(model):
    readme = ROOT.joinpath("docs", "serving.md").read_text()
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


# ---------------------------------------------------------------------------------------------------
# field case S33: one validation per setting, whichever way its value arrives (keyword, FORKYARD_* variable,
# or the server command's flag, which hands its text to the same model: tests/sandbox_server/test_server_command.py)

SECONDS_FIELDS = [f for f, info in ServiceConfig.model_fields.items() if info.annotation is float]

#: (model, field, a refused value as the text a variable or a flag carries)
REFUSED = [
    (ServerSettings, "log_level", "warn"), (ServerSettings, "log_level", "verbose"), (ServerSettings, "log_level", ""),
    (ServerSettings, "port", "abc"), (ServerSettings, "port", "70000"), (ServerSettings, "port", "-1"),
    (ServerSettings, "port", "80.5"), (ServerSettings, "backend", ""),
    (ServerSettings, "host", ""), (ServerSettings, "server_name", ""), (ServerSettings, "sandbox_image", ""),
    (ServerSettings, "max_body_bytes", "0"), (ServerSettings, "max_body_bytes", "lots"),
    (ServerSettings, "snapshot_key", "not-a-fernet-key"),
    (ServiceConfig, "min_idle", "-1"), (ServiceConfig, "max_total", "many"), (ServiceConfig, "recycle", "perhaps"),
    (ServiceConfig, "output_cap_bytes", "0"), (ServiceConfig, "max_sandbox_uses", "1.5"),
    *[(ServiceConfig, f, v) for f in SECONDS_FIELDS for v in ("inf", "nan", "1e300", "-1", "soon")],
]


@pytest.mark.parametrize("model,field,value", REFUSED, ids=[f"{f}={v!r}" for _, f, v in REFUSED])
def test_a_refused_value_reads_the_same_as_keyword_and_as_variable(monkeypatch, model, field, value):
    """Field case S33: the variable and the keyword are refused with the one message (:func:`explain`), which
    names the variable; a secret is never echoed."""
    var = f"FORKYARD_{field.upper()}"
    with pytest.raises(ValidationError) as by_keyword:
        model(**{field: value})
    monkeypatch.setenv(var, value)
    with pytest.raises(ValidationError) as by_variable:
        model()
    said = explain(by_variable.value, model)
    assert said == explain(by_keyword.value, model)
    assert said.startswith(f"{var}: ")
    if field == "snapshot_key":
        assert value not in said
    else:
        assert repr(value) in said


def test_a_choice_is_refused_naming_the_accepted_values(monkeypatch):
    monkeypatch.setenv("FORKYARD_LOG_LEVEL", "warn")
    with pytest.raises(ValidationError) as exc:
        ServerSettings()
    assert all(repr(level) in str(exc.value) for level in LOG_LEVELS)
    # a backend name is the backend registry's to check, where a backend is made (the settings know none)
    with pytest.raises(ValueError, match=f"unknown backend 'nope'; accepted values: {', '.join(sorted(BACKENDS))}"):
        make_backend("nope")


@given(level=st.sampled_from(LOG_LEVELS), upper=st.lists(st.booleans(), min_size=8, max_size=8))
def test_every_accepted_log_level_is_one_uvicorn_knows(level, upper):
    """Whatever letter case it is given in, an accepted level is a key of uvicorn's own table (a refused one
    never reaches uvicorn, whose lookup raised the KeyError of field case S33)."""
    text = "".join(c.upper() if u else c for c, u in zip(level, upper * 2, strict=False))  # 16 flags, <= 16 letters
    assert ServerSettings(log_level=text).log_level in uvicorn.config.LOG_LEVELS
    assert set(LOG_LEVELS) == set(uvicorn.config.LOG_LEVELS)


@settings(max_examples=300, deadline=None)
@given(field=st.sampled_from(SECONDS_FIELDS), value=st.floats(allow_nan=True, allow_infinity=True))
def test_a_duration_is_accepted_exactly_when_it_is_a_finite_bounded_number(field, value):
    """Every duration setting: accepted iff 0 < value <= MAX_SECONDS (0 too where it means "none"), and the
    variable agrees with the keyword."""
    lowest_ok = ServiceConfig.model_fields[field].metadata[0]
    fine = (value >= 0 if hasattr(lowest_ok, "ge") else value > 0) and value <= MAX_SECONDS
    # the other timeout out of the way of default_timeout_s <= max_timeout_s (5e-324: the least positive float)
    base = {"default_timeout_s": {"max_timeout_s": MAX_SECONDS},
            "max_timeout_s": {"default_timeout_s": 5e-324}}.get(field, {})
    outcomes = []
    for how in ("keyword", "variable"):
        old = os.environ.get(f"FORKYARD_{field.upper()}")
        try:
            if how == "variable":
                os.environ[f"FORKYARD_{field.upper()}"] = repr(value)
                cfg = ServiceConfig(**base)
            else:
                cfg = ServiceConfig(**{**base, field: repr(value)})  # the text a flag carries
            outcomes.append(getattr(cfg, field) == value)
        except ValidationError as exc:
            outcomes.append(explain(exc, ServiceConfig))
        finally:
            if old is None:
                os.environ.pop(f"FORKYARD_{field.upper()}", None)
            else:
                os.environ[f"FORKYARD_{field.upper()}"] = old
    assert outcomes[0] == outcomes[1]
    assert (outcomes[0] is True) == fine, (field, value, outcomes)


def test_a_default_timeout_above_the_maximum_is_refused():
    with pytest.raises(ValidationError, match="default_timeout_s"):
        ServiceConfig(default_timeout_s=30, max_timeout_s=10)
