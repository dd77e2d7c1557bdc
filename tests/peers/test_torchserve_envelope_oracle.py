"""TorchServe's request envelopes on both servers: the same handler behind
``service_envelope=kservev2`` and ``kserve``, the same bodies in, the same answers out.

The handler is tests/system/test_torchserve_envelopes.py's (it doubles the
numbers it is given). Each envelope is one TorchServe start and one of the
appliance's, on the same model store.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import requests

from bench.servers import PeerUnavailable
from bench.torchserve_peer import torchserve
from tests.system.model_store import serving_model_store
from tests.system.test_torchserve_envelopes import HANDLER
from tests.torchserve_models import write_mar

pytestmark = pytest.mark.peers

TIMEOUT = 60
V2_BODY = {
    "id": "req-7",
    "inputs": [
        {"name": "a", "shape": [2, 2], "datatype": "FP32", "data": [1.5, 2, 3, 4]},
        {"name": "t", "shape": [1], "datatype": "BYTES", "data": ["abc"]},
    ],
}
CALLS = {
    "kservev2": [
        ("/predictions/doubler", V2_BODY),
        ("/predictions/doubler", {k: v for k, v in V2_BODY.items() if k != "id"}),
    ],
    "kserve": [
        ("/v1/models/doubler:predict", {"instances": [[1, 2], [3, 4]]}),
        ("/v1/models/doubler:explain", {"instances": [[5]]}),
        ("/predictions/doubler", {"instances": [[7]]}),
    ],
}


@pytest.mark.parametrize("envelope", ["kservev2", "kserve"])
def test_an_envelope_answers_as_torchserve_s(envelope: str, tmp_path: Path) -> None:
    store = tmp_path / "store"
    write_mar(store, "doubler", HANDLER, version="2.5")
    answers: dict[str, list[tuple[int, object]]] = {}
    try:
        with torchserve(store, "all", {"service_envelope": envelope}) as peer:
            answers["torchserve"] = _calls(peer.urls["inference"], envelope)
    except PeerUnavailable as ex:
        pytest.skip(f"real TorchServe is not available here: {ex}")
    with serving_model_store(store, flags=("--service-envelope", envelope)) as appliance:
        answers["appliance"] = _calls(f"http://127.0.0.1:{appliance.ports['http']}", envelope)
    theirs, ours = answers["torchserve"], answers["appliance"]
    for (status, body), (their_status, their_body), (_, sent) in zip(
        ours, theirs, CALLS[envelope], strict=True
    ):
        assert status == their_status
        if isinstance(body, dict) and "id" in body and "id" not in sent:
            # Without an id of the request's, each server names its own request id.
            assert isinstance(their_body, dict)
            body, their_body = {**body, "id": ""}, {**their_body, "id": ""}
        assert body == their_body


def _calls(base: str, envelope: str) -> list[tuple[int, object]]:
    found = []
    for path, body in CALLS[envelope]:
        answer = requests.post(base + path, json=body, timeout=TIMEOUT)
        found.append((answer.status_code, json.loads(answer.content)))
    return found
