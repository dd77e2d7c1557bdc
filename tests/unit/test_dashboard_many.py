"""The dashboard with hundreds of models: tables folded under a count by state."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from appliance.client.status_format import SUMMARY_ABOVE
from appliance.protocols.dashboard import assets, html
from tests.unit.test_dashboard import state


def many(count: int, not_ready: int = 0) -> dict[str, Any]:
    model = state()["models"][0]
    models = [dict(model, name=f"m{index}", ready=index >= not_ready) for index in range(count)]
    processes = [
        {"pid": 100 + index, "role": f"model[m{index}#0]", "model": f"m{index}", "state": "ready"}
        for index in range(count)
    ]
    return state(models=models, processes=processes)


def test_a_few_models_show_their_tables_open() -> None:
    page = html.render(state())
    assert "<details id='models-box' open><summary id='models-summary'>1 models: 1 ready" in page
    assert "<details id='processes-box' open>" in page


def test_many_models_are_counted_by_state_with_the_table_folded() -> None:
    page = html.render(many(SUMMARY_ABOVE + 176, not_ready=2))
    assert "<details id='models-box'><summary id='models-summary'>200 models: 198 ready, " in page
    assert "2 not ready</summary>" in page
    assert "<summary id='processes-summary'>200 processes: 200 ready</summary>" in page
    # Still all there, for whoever unfolds it.
    assert "<td>m199</td><td>ready</td>" in page


@pytest.mark.skipif(shutil.which("node") is None, reason="node is not installed")
def test_the_script_parses(tmp_path: Path) -> None:
    script = tmp_path / "dashboard.js"
    script.write_text(assets.SCRIPT.replace("POLL_MS", "1000"))
    subprocess.run(["node", "--check", str(script)], check=True, timeout=30)
