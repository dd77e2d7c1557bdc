"""tiny_gpt: a decoupled Python model that generates text with a tiny GPT-2, token by token.

Written as a model for Triton's OpenAI frontend is: the prompt in
``text_input``, each new piece of text as one response's ``text_output``
when ``stream`` is true (the whole text in one response otherwise), with
``num_input_tokens`` and ``num_output_tokens``. ``max_tokens``,
``temperature`` (0: greedy), ``top_p`` and ``seed`` are honoured; the end
of text token stops a generation, and so does its client going away.

Every generation in progress shares one loop: each step runs the network
once over all of them (left-padded, masked), and a request that arrives
joins at the next step, so many streams cost one forward pass a token
between them (continuous batching). The network is small enough to run
over each sequence's whole window every step, with no cache.
"""

import os
import queue
import threading

import numpy as np
import torch
import triton_python_backend_utils as pb_utils
from tokenizers import Tokenizer
from transformers import GPT2LMHeadModel

HERE = os.path.dirname(os.path.abspath(__file__))
EOS = "<|endoftext|>"
FINAL = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL


def _scalar(request, name, default):
    tensor = pb_utils.get_input_tensor_by_name(request, name)
    return default if tensor is None else tensor.as_numpy().reshape(-1)[0]


def _response(text, prompt_tokens, new_tokens):
    return pb_utils.InferenceResponse(
        [
            pb_utils.Tensor("text_output", np.array([[text.encode()]], dtype=object)),
            pb_utils.Tensor("num_input_tokens", np.array([[prompt_tokens]], np.int32)),
            pb_utils.Tensor("num_output_tokens", np.array([[new_tokens]], np.int32)),
        ]
    )


class Generation:
    """One request's prompt, settings and what it has made so far."""

    def __init__(self, request, tokenizer, eos, context):
        self.sender = request.get_response_sender()
        prompt = _scalar(request, "text_input", b"").decode("utf-8", "replace")
        self.stream = bool(_scalar(request, "stream", False))
        self.limit = max(int(_scalar(request, "max_tokens", 16)), 0)
        self.temperature = float(_scalar(request, "temperature", 1.0))
        self.top_p = float(_scalar(request, "top_p", 1.0))
        seed = _scalar(request, "seed", None)
        self.random = torch.Generator().manual_seed(int(seed) if seed is not None else 0)
        if seed is None:
            self.random.seed()
        self.prompt = tokenizer.encode(prompt).ids[-(context - 1) :] or [eos]
        self.made = []
        self.sent_text = ""
        self.done = self.limit == 0

    def window(self, context):
        return (self.prompt + self.made)[-context:]


class TritonPythonModel:
    def initialize(self, args):
        torch.set_num_threads(1)
        self.model = GPT2LMHeadModel.from_pretrained(HERE).eval()
        self.tokenizer = Tokenizer.from_file(
            os.path.join(HERE, "..", "tokenizer", "tokenizer.json")
        )
        self.eos = self.tokenizer.token_to_id(EOS)
        self.context = self.model.config.n_positions
        self.arrivals = queue.SimpleQueue()
        self.loop = threading.Thread(target=self._run, daemon=True)
        self.loop.start()

    def execute(self, requests):
        for request in requests:
            try:
                self.arrivals.put(Generation(request, self.tokenizer, self.eos, self.context))
            except Exception as ex:  # a request it cannot read: its client gets why
                error = pb_utils.TritonError(f"tiny_gpt: {type(ex).__name__}: {ex}")
                sender = request.get_response_sender()
                sender.send(pb_utils.InferenceResponse(error=error), flags=FINAL)
        return None

    def _run(self):
        active = []
        while True:
            if not active:
                arrived = self.arrivals.get()
                if arrived is None:
                    return
                active.append(arrived)
            while True:
                try:
                    arrived = self.arrivals.get_nowait()
                except queue.Empty:
                    break
                if arrived is None:
                    return
                active.append(arrived)
            active = [g for g in active if not self._finish_if_over(g)]
            if active:
                try:
                    self._step(active)
                except Exception as ex:  # the clients get the reason, the model keeps serving
                    error = pb_utils.TritonError(f"tiny_gpt: {type(ex).__name__}: {ex}")
                    for generation in active:
                        generation.sender.send(pb_utils.InferenceResponse(error=error), flags=FINAL)
                    active = []
                active = [g for g in active if not self._finish_if_over(g)]

    def _step(self, active):
        """One token for every generation in progress: one forward pass over all of them."""
        windows = [g.window(self.context) for g in active]
        longest = max(len(w) for w in windows)
        ids = torch.full((len(windows), longest), self.eos, dtype=torch.long)
        mask = torch.zeros((len(windows), longest), dtype=torch.long)
        for row, window in enumerate(windows):
            ids[row, longest - len(window) :] = torch.tensor(window)
            mask[row, longest - len(window) :] = 1
        positions = (mask.cumsum(-1) - 1).clamp(min=0)
        with torch.no_grad():
            logits = self.model(input_ids=ids, attention_mask=mask, position_ids=positions).logits
        for row, generation in enumerate(active):
            token = self._pick(logits[row, -1], generation)
            if token == self.eos:
                generation.done = True
                continue
            generation.made.append(token)
            if len(generation.made) >= generation.limit:
                generation.done = True
            if generation.stream:
                text = self.tokenizer.decode(generation.made)
                if not text.endswith("\ufffd"):
                    # A piece of a character waits for the rest of its bytes.
                    delta = text[len(generation.sent_text) :]
                    generation.sender.send(_response(delta, len(generation.prompt), 1))
                    generation.sent_text = text

    def _finish_if_over(self, generation):
        """Answer a generation that is done (or whose client went away); True if it is over."""
        if generation.sender.is_cancelled():
            return True
        if not generation.done:
            return False
        text = self.tokenizer.decode(generation.made)
        prompt_tokens = len(generation.prompt)
        if generation.stream:
            rest = text[len(generation.sent_text) :]
            if rest:
                generation.sender.send(_response(rest, prompt_tokens, 0))
            generation.sender.send(flags=FINAL)
        else:
            response = _response(text, prompt_tokens, len(generation.made))
            generation.sender.send(response, flags=FINAL)
        return True

    @staticmethod
    def _pick(logits, generation):
        if generation.temperature <= 0:
            return int(torch.argmax(logits))
        probabilities = torch.softmax(logits / generation.temperature, dim=-1)
        if generation.top_p < 1.0:
            ordered, order = torch.sort(probabilities, descending=True)
            keep = torch.cumsum(ordered, dim=-1) - ordered < generation.top_p
            probabilities = torch.zeros_like(probabilities).scatter(0, order[keep], ordered[keep])
        return int(torch.multinomial(probabilities, 1, generator=generation.random))

    def finalize(self):
        self.arrivals.put(None)
        self.loop.join(5)
