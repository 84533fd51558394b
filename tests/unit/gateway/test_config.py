"""Settings from a file, the environment and flags: what each source changes, and the errors."""

from __future__ import annotations

import doctest
import json

import pytest
from pydantic import ValidationError

import sloserve.gateway.config as config
from sloserve.gateway.config import ConfigError, Settings, load_settings


def test_an_environment_key_changes_that_key_and_keeps_the_files_map(tmp_path, monkeypatch):
    """``SLOSERVE_MODELS__DIGITS__SLO_MS`` sets one key of one model; the file's other models and keys stay."""
    f = tmp_path / "c.json"
    f.write_text(json.dumps({"models": {"digits": {"slo_ms": 30, "max_queue_rows": 64}, "heavy": {"slo_ms": 80}}}))
    monkeypatch.setenv("SLOSERVE_MODELS__DIGITS__SLO_MS", "15")
    s = load_settings(f)
    assert s.models["digits"].slo_ms == 15 and s.models["digits"].max_queue_rows == 64
    assert s.models["heavy"].slo_ms == 80


def test_a_setting_in_the_environment_that_is_not_json_is_a_clear_error(monkeypatch):
    monkeypatch.setenv("SLOSERVE_MODELS", "digits,heavy")
    with pytest.raises(ConfigError, match="(?s)invalid settings in the environment.*SLOSERVE_MODELS__"):
        load_settings()


def test_the_locustfiles_variables_are_not_the_gateways(monkeypatch):
    """The load generator's options have a prefix of their own: exporting them leaves serve alone."""
    monkeypatch.setenv("SLOSERVE_LOCUST_MODELS", "digits,heavy")
    monkeypatch.setenv("SLOSERVE_LOCUST_SLO_MS", "50")
    assert load_settings().models == {}


def test_the_config_module_examples_hold():
    assert doctest.testmod(config).failed == 0


@pytest.mark.parametrize("host", ["0.0.0.0", "192.0.2.7", "::", "gateway.example.com"])
def test_binding_beyond_loopback_needs_tokens(host):
    with pytest.raises(ValidationError, match="listens beyond this machine"):
        Settings(host=host)
    assert Settings(host=host, auth_tokens="a-long-token-1 *").host == host


@pytest.mark.parametrize("host", ["127.0.0.1", "127.0.0.2", "::1", "localhost"])
def test_loopback_needs_no_tokens(host):
    assert Settings(host=host).host == host


def test_device_types_and_device_type_are_one_or_the_other():
    import pytest

    from sloserve.gateway.config import Settings

    with pytest.raises(ValueError, match="device_type .* or device_types"):
        Settings(models={"heavy": {"device_type": "T4", "device_types": ["cpu", "T4"]}})
    with pytest.raises(ValueError, match="twice"):
        Settings(models={"heavy": {"device_types": ["T4", "t4"]}})
    with pytest.raises(ValueError, match="replica_processes"):
        Settings(backend="inprocess", replica_processes=True, models={"heavy": {"device_types": ["cpu", "T4"]}})
    assert Settings(models={"heavy": {"device_types": ["cpu", "T4"]}}).models["heavy"].devices() == ["cpu", "T4"]
    assert Settings(models={"heavy": {"device_type": "T4"}}).models["heavy"].devices() == ["T4"]
