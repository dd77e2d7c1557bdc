"""The stateful sequence models Triton's sequence example clients expect.

Each takes one INT32 value per step (INPUT, [1, 1]) and returns OUTPUT, and
each step carries a ``sequence_id`` with ``sequence_start`` on the first and
``sequence_end`` on the last (see docs/models/sequences.md). What they
compute is what the examples (``simple_*_sequence_*_client.py``) assert:

- ``simple_sequence``: the input, plus 1 on a sequence's first step.
- ``simple_dyna_sequence``: the same, plus the sequence's (integer)
  correlation id on its last step.
- ``simple_string_dyna_sequence``: the running sum of the sequence's
  inputs, kept as implicit state, plus its correlation id (a string holding
  an integer) on its last step.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from appliance.errors import BadRequest
from appliance.model import Arrays, Model, Outputs, spec, state


class SimpleSequence(Model):
    """OUTPUT = INPUT + START: reads the start control input only."""

    inputs = [spec("INPUT", "INT32", [-1, 1])]
    outputs = [spec("OUTPUT", "INT32", [-1, 1])]
    max_batch_size = 8
    sequence_batching = True
    sequence_controls = {"START": "start", "READY": "ready"}

    def predict(self, inputs: Arrays, parameters: Mapping[str, Any]) -> Outputs:
        return {"OUTPUT": inputs["INPUT"] + inputs["START"]}


class SimpleDynaSequence(Model):
    """OUTPUT = INPUT + START, plus CORRID on the sequence's END step."""

    inputs = [spec("INPUT", "INT32", [-1, 1])]
    outputs = [spec("OUTPUT", "INT32", [-1, 1])]
    max_batch_size = 8
    sequence_batching = True
    sequence_controls = {"START": "start", "END": "end", "READY": "ready", "CORRID": "corrid"}

    def predict(self, inputs: Arrays, parameters: Mapping[str, Any]) -> Outputs:
        corrid = _integers(inputs["CORRID"])
        total = inputs["INPUT"] + inputs["START"] + inputs["END"] * corrid
        return {"OUTPUT": total.astype(np.int32)}


class SimpleStringDynaSequence(Model):
    """OUTPUT = the running sum of INPUT, plus CORRID (a string) on the END step."""

    inputs = [spec("INPUT", "INT32", [-1, 1])]
    outputs = [spec("OUTPUT", "INT32", [-1, 1])]
    max_batch_size = 8
    sequence_batching = True
    sequence_controls = {"START": "start", "END": "end", "READY": "ready", "CORRID": "corrid"}
    sequence_state = [state("SUM_IN", "SUM_OUT", "INT32", [1])]

    def predict(self, inputs: Arrays, parameters: Mapping[str, Any]) -> Outputs:
        # A start step's state input holds the initial 0, so every sum starts afresh.
        running = inputs["SUM_IN"] + inputs["INPUT"]
        corrid = _integers(inputs["CORRID"])
        total = running + inputs["END"] * corrid
        return {"OUTPUT": total.astype(np.int32), "SUM_OUT": running}


def _integers(corrids: Any) -> Any:
    """Correlation ids as int64, from integers or from strings holding integers."""
    if corrids.dtype != object:
        return corrids.astype(np.int64)
    try:
        return np.vectorize(int, otypes=[np.int64])(corrids)
    except ValueError:
        raise BadRequest(
            "this model needs a sequence_id that is an integer, or a string holding one"
        ) from None
