"""What a request is made of before it is sent: its body, and its tensors as sent.

Every call builds its descriptor's body here (a model call, a stream, a
derivative, an ensemble's step) and turns what the caller gave into the
tensors :meth:`~appliance.client.inflight.InFlight.send` places. Apart from
inflight.py since none of it touches the ring or the calls in flight: it
checks and shapes what a caller asked for.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import numpy.typing as npt
import orjson

from appliance.core.client_memory import ClientTensor
from appliance.core.device_tensors import CudaPlace, DeviceTensor
from appliance.core.message_tensors import Placed
from appliance.core.tensor import Tensor
from appliance.errors import BadRequest

# A DeviceTensor is an input in a client's GPU memory (KServe CUDA shared memory),
# a ClientTensor one in a client's file (system shared memory), read when placed,
# a Placed one already in shared memory (an ensemble's intermediate), never copied.
TensorLike = Tensor | DeviceTensor | ClientTensor | Placed | npt.NDArray[Any]
# What a TensorLike becomes before it is sent.
TensorOf = Tensor | DeviceTensor | ClientTensor | Placed


def request_body(
    model: str,
    method: str,
    outputs: Sequence[str] | None,
    parameters: Mapping[str, Any] | None,
    args: dict[str, Any] | None,
    targets: Mapping[str, CudaPlace] | None = None,
) -> dict[str, Any]:
    """A request descriptor's body, less its tensors (see :meth:`InFlight.send`).

    ``targets``: outputs the worker writes into a client's GPU memory.
    """
    body: dict[str, Any] = {"model": model, "method": method}
    if parameters:
        check_parameters(parameters)
        body["params"] = dict(parameters)
    if outputs is not None:
        body["outputs"] = list(outputs)
    if args is not None:
        body["args"] = args
    if targets:
        body["targets"] = {name: place.to_body() for name, place in targets.items()}
    return body


def check_parameters(parameters: Mapping[str, Any]) -> None:
    """Refuse parameters a descriptor cannot carry: too deep, or an integer past 64 bits.

    Every protocol hands its client's parameters (JSON objects, query
    strings) to the model this way, so the check is made once, here: by
    encoding them as the descriptor will (orjson, at C speed), nested as deep.

    Raises:
        BadRequest: saying what orjson refused.
    """
    try:
        orjson.dumps({"params": parameters})
    except TypeError as ex:
        raise BadRequest(
            f"the request's parameters cannot be passed to the model ({ex}): they may nest "
            "about 250 levels deep and hold integers of 64 bits; send larger ones as strings"
        ) from None


def derivative_request(
    model: str,
    method: str,
    inputs: Mapping[str, TensorLike],
    parameters: Mapping[str, Any] | None,
    wrt: tuple[str, str | None, str | None],
    sens: npt.ArrayLike | None,
    vec: npt.ArrayLike | None,
) -> tuple[dict[str, Any], dict[str, TensorLike]]:
    """The body and tensors of a derivative call (see ModelClient.derivative)."""
    out_wrt, in_wrt, in_wrt2 = wrt
    tensors: dict[str, TensorLike] = dict(inputs)
    if sens is not None:
        tensors["__sens__"] = np.asarray(sens, dtype=np.float64)
    if vec is not None:
        tensors["__vec__"] = np.asarray(vec, dtype=np.float64)
    args: dict[str, Any] = {"out_wrt": out_wrt}
    if method == "apply_hessian":
        args.update(in_wrt1=in_wrt, in_wrt2=in_wrt2)
    else:
        args["in_wrt"] = in_wrt
    return request_body(model, method, None, parameters, args), tensors


def tensor_of(name: str, value: TensorLike) -> TensorOf:
    """A numpy array as a Tensor; the other kinds as they are.

    Raises:
        BadRequest: the array's element type has no appliance dtype.
    """
    # PERF: a tuple, not a union (which is built anew at each call).
    if isinstance(value, (Tensor, DeviceTensor, ClientTensor, Placed)):
        return value
    try:
        return Tensor.from_array(value)
    except (ValueError, TypeError) as ex:
        raise BadRequest(f"input {name}: {ex}") from None
