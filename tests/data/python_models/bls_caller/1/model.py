import asyncio
import json
import time

import numpy as np
import triton_python_backend_utils as pb_utils


def summary(response):
    """What a BLS response holds, as plain data."""
    if response.has_error():
        # Triton's BLS errors all say INTERNAL; the appliance's say what failed.
        return {"error": response.error().message()}
    return {t.name(): t.as_numpy().tolist() for t in response.output_tensors()}


def call_of(name, x):
    """The BLS request for call ``name`` (without its async_ prefix)."""
    if name == "add_sub":
        rows = x.reshape(1, 4)  # add_sub batches: a request of one row
        inputs = [pb_utils.Tensor("INPUT0", rows), pb_utils.Tensor("INPUT1", rows)]
        return pb_utils.InferenceRequest(
            model_name="add_sub", inputs=inputs, requested_output_names=["OUTPUT0"]
        ), False
    if name == "nope":
        return pb_utils.InferenceRequest(
            model_name="nope", inputs=[pb_utils.Tensor("X", x)], requested_output_names=["Y"]
        ), False
    if name == "misbehaving_error":
        return pb_utils.InferenceRequest(
            model_name="misbehaving",
            inputs=[pb_utils.Tensor("X", x[:2])],
            requested_output_names=["Y"],
            parameters={"do": "error"},
        ), False
    if name == "square":
        n = pb_utils.Tensor("IN", np.array([3], np.int32))
        return pb_utils.InferenceRequest(
            model_name="square_stream", inputs=[n], requested_output_names=["OUT", "IDX"]
        ), True
    raise pb_utils.TritonModelException(f"unknown call {name}")


def sequence_steps():
    """Three steps of one sequence of accumulate, its id and flags on each request."""
    start, end = (
        pb_utils.TRITONSERVER_REQUEST_FLAG_SEQUENCE_START,
        pb_utils.TRITONSERVER_REQUEST_FLAG_SEQUENCE_END,
    )
    answers = []
    for value, flags in ((2, start), (3, 0), (4, end)):
        request = pb_utils.InferenceRequest(
            model_name="accumulate",
            inputs=[pb_utils.Tensor("VALUE", np.array([[value]], np.int32))],
            requested_output_names=["SUM", "SEEN"],
            correlation_id=71,
            flags=flags,
        )
        answers.append(summary(request.exec()))
    return answers


def wait_ready(name, ready):
    """is_model_ready once it says ``ready`` (an unload finishes after its call)."""
    deadline = time.monotonic() + 30
    while pb_utils.is_model_ready(name) != ready and time.monotonic() < deadline:
        time.sleep(0.1)
    return pb_utils.is_model_ready(name)


def manage(request, x):
    """Triton's model loading API on auto_declared, then a call with the API's other names."""
    seen = [pb_utils.is_model_ready("auto_declared"), pb_utils.is_model_ready("nope")]
    pb_utils.unload_model("auto_declared")
    seen.append(wait_ready("auto_declared", False))
    pb_utils.load_model("auto_declared")
    seen.append(pb_utils.is_model_ready("auto_declared"))
    try:
        pb_utils.load_model("no_such_model")
        seen.append("loaded")
    except pb_utils.TritonModelException as ex:
        seen.append({"error": "no_such_model" in str(ex)})
    pb_utils.Logger.log("a line at INFO", pb_utils.Logger.INFO)
    rows = x.reshape(1, 4)
    call = pb_utils.InferenceRequest(
        model_name="add_sub",
        inputs=[pb_utils.Tensor("INPUT0", rows), pb_utils.Tensor("INPUT1", rows)],
        requested_output_names=["OUTPUT1"],
        preferred_memory=pb_utils.PreferredMemory(pb_utils.TRITONSERVER_MEMORY_CPU, 0),
        trace=request.trace(),
    )
    seen.append(summary(call.exec()))
    return seen


class TritonPythonModel:
    async def execute(self, requests):
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "X").as_numpy()
            name = json.loads(request.parameters()).get("call", "add_sub")
            if name == "sequence":
                seen = sequence_steps()
            elif name == "manage":
                seen = manage(request, x)
            elif name.startswith("async_"):
                # Two requests, as Triton's examples make (one request run twice at
                # once crashed tritonserver 2.51 now and then).
                first, decoupled = call_of(name[len("async_") :], x)
                second, _ = call_of(name[len("async_") :], x)
                first, second = await asyncio.gather(
                    first.async_exec(decoupled), second.async_exec(decoupled)
                )
                seen = [self.seen(first, decoupled), self.seen(second, decoupled)]
            else:
                call, decoupled = call_of(name, x)
                seen = self.seen(call.exec(decoupled), decoupled)
            text = np.array([json.dumps(seen, sort_keys=True).encode()], dtype=object)
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("SEEN", text)]))
        return responses

    def seen(self, answer, decoupled):
        if not decoupled:
            return summary(answer)
        return [summary(response) for response in answer]
