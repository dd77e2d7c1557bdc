"""``appliance ctl status`` as text: every row for a few models, a summary for many."""

from __future__ import annotations

from typing import Any

from appliance.client.status_format import SUMMARY_ABOVE, format_status


def reply(models: int, failed: int = 0) -> dict[str, Any]:
    processes: list[dict[str, Any]] = [
        {"pid": 1, "role": "master", "model": "", "state": "running"},
        {"pid": 2, "role": "zygote", "model": "", "state": "ready"},
        {"pid": 3, "role": "http", "model": "", "state": "ready"},
    ]
    for index in range(models):
        state = "failed" if index < failed else "ready"
        note = "cannot import module" if index < failed else ""
        processes.append(
            {
                "pid": 10 + index,
                "role": f"model[m{index}#0]",
                "model": f"m{index}",
                "state": state,
                "note": note,
            }
        )
    return {"tree": "t", "pid": 1, "online": True, "ready": True, "processes": processes}


def test_a_few_models_are_all_listed() -> None:
    text = format_status(reply(SUMMARY_ABOVE))
    assert all(f"model[m{index}#0]" in text for index in range(SUMMARY_ABOVE))
    assert "model processes:" not in text


def test_many_models_are_counted_by_state_and_those_not_ready_listed() -> None:
    text = format_status(reply(200, failed=2))
    assert "200 model processes: 198 ready, 2 failed" in text
    assert "model[m0#0]" in text
    assert "model[m1#0]" in text
    assert "model[m2#0]" not in text
    assert "model[m0#0]: cannot import module" in text
    # Every process that is no model is still listed.
    assert all(role in text for role in ("master", "zygote", "http"))
    assert len(text.splitlines()) < 15


def test_all_lists_every_model() -> None:
    text = format_status(reply(200, failed=2), every=True)
    assert all(f"model[m{index}#0]" in text for index in range(200))
    assert "model processes:" not in text


def test_ensembles_are_listed_apart_with_the_step_that_is_not_ready() -> None:
    status = reply(2)
    status["ensembles"] = [
        {"name": "pipeline", "steps": ["m0", "m1"], "ready": True, "not_ready": None},
        {
            "name": "six",
            "steps": ["m0", "gone"],
            "ready": False,
            "not_ready": "step 1 (model gone) is not loaded",
        },
    ]
    lines = format_status(status).splitlines()
    assert "ensemble pipeline  ready  (steps: m0 -> m1)" in lines
    assert (
        "ensemble six       not ready: step 1 (model gone) is not loaded  (steps: m0 -> gone)"
        in (lines)
    )
    assert "ensemble" not in format_status(reply(2))
