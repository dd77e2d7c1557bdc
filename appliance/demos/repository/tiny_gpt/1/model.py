"""tiny_gpt: a decoupled Python model that generates text with a tiny GPT-2, token by token.

Written as a model for Triton's OpenAI frontend is: the prompt in
``text_input``, each new piece of text as one response's ``text_output``
when ``stream`` is true (the whole text in one response otherwise), with
``num_input_tokens`` and ``num_output_tokens``. ``max_tokens``,
``temperature`` (0: greedy), ``top_p`` and ``seed`` are honoured; the end
of text token stops it, and so does the client going away.
"""

import os
import threading

import numpy as np
import torch
import triton_python_backend_utils as pb_utils
from tokenizers import Tokenizer
from transformers import GPT2LMHeadModel

HERE = os.path.dirname(os.path.abspath(__file__))
EOS = "<|endoftext|>"


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


class TritonPythonModel:
    def initialize(self, args):
        # One thread for torch: the streams share the instance's CPU, each in a thread.
        torch.set_num_threads(1)
        self.model = GPT2LMHeadModel.from_pretrained(HERE).eval()
        self.tokenizer = Tokenizer.from_file(
            os.path.join(HERE, "..", "tokenizer", "tokenizer.json")
        )
        self.eos = self.tokenizer.token_to_id(EOS)
        self.context = self.model.config.n_positions
        self.threads = []

    def execute(self, requests):
        for request in requests:
            thread = threading.Thread(target=self._generate, args=(request,), daemon=True)
            self.threads = [t for t in self.threads if t.is_alive()] + [thread]
            thread.start()
        return None

    def _generate(self, request):
        sender = request.get_response_sender()
        final = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL
        try:
            prompt = _scalar(request, "text_input", b"").decode("utf-8", "replace")
            stream = bool(_scalar(request, "stream", False))
            limit = max(int(_scalar(request, "max_tokens", 16)), 0)
            temperature = float(_scalar(request, "temperature", 1.0))
            top_p = float(_scalar(request, "top_p", 1.0))
            seed = _scalar(request, "seed", None)
            ids = self.tokenizer.encode(prompt).ids[-(self.context - 1) :] or [self.eos]
            made = []
            sent_text = ""
            random = torch.Generator().manual_seed(int(seed) if seed is not None else 0)
            if seed is None:
                random.seed()
            past = None
            step_ids = torch.tensor([ids])
            with torch.no_grad():
                while len(made) < limit and len(ids) + len(made) < self.context:
                    if sender.is_cancelled():
                        return
                    out = self.model(step_ids, past_key_values=past, use_cache=True)
                    past = out.past_key_values
                    token = self._pick(out.logits[0, -1], temperature, top_p, random)
                    if token == self.eos:
                        break
                    made.append(token)
                    step_ids = torch.tensor([[token]])
                    text = self.tokenizer.decode(made)
                    if stream and not text.endswith("\ufffd"):
                        # A piece of a character waits for the rest of its bytes.
                        sender.send(_response(text[len(sent_text) :], len(ids), 1))
                        sent_text = text
            text = self.tokenizer.decode(made)
            if stream:
                rest = text[len(sent_text) :]
                if rest:
                    sender.send(_response(rest, len(ids), 0))
                sender.send(flags=final)
            else:
                sender.send(_response(text, len(ids), len(made)), flags=final)
        except Exception as ex:  # the client gets the reason, the model keeps serving
            error = pb_utils.TritonError(f"tiny_gpt: {type(ex).__name__}: {ex}")
            sender.send(pb_utils.InferenceResponse(error=error), flags=final)

    @staticmethod
    def _pick(logits, temperature, top_p, random):
        if temperature <= 0:
            return int(torch.argmax(logits))
        probabilities = torch.softmax(logits / temperature, dim=-1)
        if top_p < 1.0:
            ordered, order = torch.sort(probabilities, descending=True)
            keep = torch.cumsum(ordered, dim=-1) - ordered < top_p
            probabilities = torch.zeros_like(probabilities).scatter(0, order[keep], ordered[keep])
        return int(torch.multinomial(probabilities, 1, generator=random))

    def finalize(self):
        for thread in self.threads:
            thread.join(5)
