from pathlib import Path

from sloserve.gateway.config_doc import render


def test_configuration_reference_is_current():
    doc = Path(__file__).resolve().parents[3] / "docs" / "configuration.md"
    assert doc.read_text() == render(), "regenerate: python -m sloserve.gateway.config_doc > docs/configuration.md"
