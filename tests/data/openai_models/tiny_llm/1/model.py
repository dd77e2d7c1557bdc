"""A word-level "language model" for the OpenAI routes' tests, as Triton's frontend drives one.

Its tokens are the prompt's words, repeated until max_tokens. A prompt that
is the word "settings" answers the inputs it was sent, as JSON (strings
reversed, so that a stop sequence sent is not found in the answer). A prompt
with the word "slow" takes 50 ms a token and stops when cancelled; each
such generation appends "<tokens sent> <cancelled>" to generated.log beside
this file. A prompt with the word "fail" fails after two tokens.
"""

import json
import os
import threading
import time

import numpy as np
import triton_python_backend_utils as pb_utils

LOG = os.path.join(os.path.dirname(os.path.abspath(__file__)), "generated.log")


def _response(text, input_tokens, output_tokens):
    return pb_utils.InferenceResponse(
        [
            pb_utils.Tensor("text_output", np.array([[text.encode()]], dtype=object)),
            pb_utils.Tensor("num_input_tokens", np.array([[input_tokens]], np.int32)),
            pb_utils.Tensor("num_output_tokens", np.array([[output_tokens]], np.int32)),
        ]
    )


def _value(request, name):
    tensor = pb_utils.get_input_tensor_by_name(request, name)
    return None if tensor is None else tensor.as_numpy()


class TritonPythonModel:
    def initialize(self, args):
        self.threads = []

    def execute(self, requests):
        for request in requests:
            thread = threading.Thread(target=self.generate, args=(request,), daemon=True)
            self.threads.append(thread)
            thread.start()
        return None

    def generate(self, request):
        sender = request.get_response_sender()
        prompt = _value(request, "text_input").reshape(-1)[0].decode()
        stream = bool(_value(request, "stream").reshape(-1)[0])
        limit = _value(request, "max_tokens")
        limit = 16 if limit is None else int(limit.reshape(-1)[0])
        words = prompt.split() or ["nothing"]
        final = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL
        if prompt == "settings":
            sent = {}
            for name in (t.name() for t in request.inputs()):
                array = _value(request, name)
                values = [
                    v.decode()[::-1] if isinstance(v, bytes) else v.item()
                    for v in array.reshape(-1)
                ]
                sent[name] = [str(array.dtype), list(array.shape), values]
            sender.send(_response(json.dumps(sent, sort_keys=True), 1, 1), flags=final)
            return
        slow = "slow" in words
        tokens = [(" " if i else "") + words[i % len(words)] for i in range(limit)]
        if not stream:
            sender.send(_response("".join(tokens), len(words), len(tokens)), flags=final)
            return
        sent = 0
        for token in tokens:
            if slow:
                time.sleep(0.05)
                if sender.is_cancelled():
                    break
            if "fail" in words and sent == 2:
                error = pb_utils.TritonError("tiny_llm failed on purpose")
                sender.send(pb_utils.InferenceResponse(error=error), flags=final)
                return
            sender.send(_response(token, len(words), 1))
            sent += 1
        if slow:
            with open(LOG, "a") as log:
                log.write(f"{sent} {sender.is_cancelled()}\n")
        if not sender.is_cancelled():
            sender.send(flags=final)

    def finalize(self):
        for thread in self.threads:
            thread.join(5)
