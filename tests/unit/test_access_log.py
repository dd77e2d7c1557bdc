"""server.access_log: text lines, JSON lines or none; the JSON line's fields."""

from __future__ import annotations

import io
import json
import logging
import os
import re
import time
from typing import Any

import pytest

from appliance.config.reader import from_dict
from appliance.config.settings import ConfigError, to_dict
from appliance.observability import logs, metrics

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


def test_json_lines_carry_every_field(capsys: pytest.CaptureFixture[str]) -> None:
    logs.set_access_log("json")
    try:
        token = metrics.MODEL.set("simple")
        try:
            metrics.log_access("kserve", "200", time.perf_counter(), "POST /v2/models/simple/infer")
        finally:
            metrics.MODEL.reset(token)
    finally:
        logs.set_access_log(True)
    [line] = [json.loads(text) for text in capsys.readouterr().err.splitlines()]
    assert line["protocol"] == "kserve"
    assert line["model"] == "simple"
    assert line["status"] == "200"
    assert line["request"] == "POST /v2/models/simple/infer"
    assert isinstance(line["role"], str)
    assert isinstance(line["pid"], int)
    assert 0 <= line["latency_ms"] < 1000
    assert line["time"].endswith("Z")


def test_text_lines_stay_as_they_were(capsys: pytest.CaptureFixture[str]) -> None:
    logs.set_access_log("json")
    logs.set_access_log(True)
    token = metrics.MODEL.set("")  # a call made earlier in this thread may have set it
    try:
        metrics.log_access("grps", "503", time.perf_counter())
    finally:
        metrics.MODEL.reset(token)
    line = capsys.readouterr().err
    pattern = (
        r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d INFO    \S+\[\d+\] appliance\.access: "
        r"grps model=- status=503 latency_ms=\d+\.\d\d\n"
    )
    assert re.fullmatch(pattern, line), line
    logs.set_access_log(False)
    metrics.log_access("grps", "503", time.perf_counter())
    assert capsys.readouterr().err == ""
    logs.set_access_log(True)


def test_text_lines_look_like_the_other_records(capsys: pytest.CaptureFixture[str]) -> None:
    """Same prefix as a logging record of the same process, and never interleaved with one."""
    logs.setup("tester")
    try:
        logging.getLogger("appliance.test").info("a record")
        metrics.log_access("kserve", "200", time.perf_counter(), "POST /v2/models/m/infer")
    finally:
        logging.getLogger().handlers.clear()
    record, access = capsys.readouterr().err.splitlines()
    assert record.endswith(f" INFO    tester[{os.getpid()}] appliance.test: a record")
    assert f" INFO    tester[{os.getpid()}] appliance.access: kserve model=" in access
    assert access.endswith(" POST /v2/models/m/infer")
    assert record[:19].count(":") == access[:19].count(":") == 2


class _Broken(io.StringIO):
    def write(self, _text: str) -> int:
        raise BrokenPipeError(32, "Broken pipe")


@pytest.mark.parametrize("setting", [True, "json"])
def test_a_stream_that_fails_loses_the_line_not_the_request(setting: Any) -> None:
    logs.setup("tester")
    logs.set_access_log(setting)
    try:
        [handler] = logging.getLogger().handlers
        assert isinstance(handler, logging.StreamHandler)
        handler.setStream(_Broken())
        metrics.log_access("kserve", "200", time.perf_counter(), "POST /v2/models/m/infer")
        handler.setStream(io.StringIO())
        handler.stream.close()  # a closed file raises ValueError
        metrics.log_access("kserve", "200", time.perf_counter(), "POST /v2/models/m/infer")
    finally:
        logging.getLogger().handlers.clear()
        logs.set_access_log(True)
