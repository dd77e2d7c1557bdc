"""server.access_log: text lines, JSON lines or none; the JSON line's fields."""

from __future__ import annotations

import json
import logging
import re
import time
from typing import Any

import pytest

from appliance import logs, metrics
from appliance.config import ConfigError, to_dict
from appliance.config_reader import from_dict

MODELS = [{"name": "m", "class": "pkg.mod:Model"}]


@pytest.mark.parametrize("setting", [True, False, "text", "json"])
def test_the_setting_takes_booleans_text_and_json(setting: Any) -> None:
    config = from_dict({"server": {"access_log": setting}, "models": MODELS}, "c.toml")
    assert config.server.access_log == setting
    assert from_dict(to_dict(config), "c.toml") == config


@pytest.mark.parametrize(("setting", "message"), [("xml", "'xml'"), (1, "got 1"), ([], "got []")])
def test_other_settings_are_refused_with_the_key(setting: Any, message: str) -> None:
    with pytest.raises(
        ConfigError, match=rf"server\.access_log: expected true.*{re.escape(message)}"
    ):
        from_dict({"server": {"access_log": setting}, "models": MODELS}, "c.toml")


def test_json_lines_carry_every_field() -> None:
    logs.set_access_log("json")
    logger = logging.getLogger("appliance.access")
    try:
        [handler] = logger.handlers
        assert not logger.propagate
        seen: list[str] = []
        handler.emit = lambda record: seen.append(handler.format(record))  # type: ignore[method-assign]
        token = metrics.MODEL.set("simple")
        try:
            metrics.log_access("kserve", "200", time.perf_counter(), "POST /v2/models/simple/infer")
        finally:
            metrics.MODEL.reset(token)
    finally:
        logs.set_access_log(True)
    [line] = [json.loads(text) for text in seen]
    assert line["protocol"] == "kserve"
    assert line["model"] == "simple"
    assert line["status"] == "200"
    assert line["request"] == "POST /v2/models/simple/infer"
    assert isinstance(line["role"], str)
    assert isinstance(line["pid"], int)
    assert 0 <= line["latency_ms"] < 1000
    assert line["time"].endswith("Z")


def test_text_lines_stay_as_they_were(caplog: pytest.LogCaptureFixture) -> None:
    logs.set_access_log("json")
    logs.set_access_log(True)
    logger = logging.getLogger("appliance.access")
    assert logger.handlers == []
    assert logger.propagate
    token = metrics.MODEL.set("")  # a call made earlier in this thread may have set it
    try:
        with caplog.at_level(logging.INFO, logger="appliance.access"):
            metrics.log_access("grps", "503", time.perf_counter())
    finally:
        metrics.MODEL.reset(token)
    assert "grps model=- status=503 latency_ms=" in caplog.text
    logs.set_access_log(False)
    caplog.clear()
    metrics.log_access("grps", "503", time.perf_counter())
    assert caplog.text == ""
    logs.set_access_log(True)
