"""The bounded load test (bench/load.py): 32 clients for a minute against the two-model default
preset (the README's figures are bench/load.py's two minutes). No 5xx but the designed 503, no
lost request, RSS growth under 5% from 30 s to 60 s (the prefix cache's RAM tier, capped at
16 MiB per model, is full well before), a clean exit and an intact audit trail."""

from __future__ import annotations

import importlib.util
import json

import pytest

from conftest import ROOT

pytestmark = pytest.mark.slow


def test_32_clients_for_a_minute(real_models, tmp_path):
    spec = importlib.util.spec_from_file_location("load", ROOT / "bench" / "load.py")
    load = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(load)
    result = load.run(ROOT / "presets" / "fixed-appliance.yaml", clients=32, seconds=60, max_tokens=16,
                      workdir=tmp_path)
    print(json.dumps(result, indent=2))
    assert result["by_status"].get("200", 0) > 50, result
    assert result["server_errors_5xx_other_than_503"] == 0, result
    assert result["lost"] == 0, result["errors"]
    assert set(result["by_status"]) <= {"200", "429", "503"}, result
    assert result["rss_growth_percent"] < 5, result
    assert result["exit_code"] == 0 and result["audit_ok"], result
    assert result["pass"]
