"""tiny_embed: a batch of texts in, a unit vector each out (mean of the last hidden states)."""

import os

import numpy as np
import torch
import triton_python_backend_utils as pb_utils
from tokenizers import Tokenizer
from transformers import GPT2Model

HERE = os.path.dirname(os.path.abspath(__file__))


class TritonPythonModel:
    def initialize(self, args):
        torch.set_num_threads(1)
        self.model = GPT2Model.from_pretrained(HERE).eval()
        self.tokenizer = Tokenizer.from_file(
            os.path.join(HERE, "..", "tokenizer", "tokenizer.json")
        )
        self.context = self.model.config.n_positions

    def execute(self, requests):
        texts = [
            pb_utils.get_input_tensor_by_name(r, "text_input").as_numpy().reshape(-1)[0]
            for r in requests
        ]
        encoded = [
            self.tokenizer.encode(t.decode("utf-8", "replace")).ids[: self.context] or [0]
            for t in texts
        ]
        longest = max(len(ids) for ids in encoded)
        ids = torch.zeros((len(encoded), longest), dtype=torch.long)
        mask = torch.zeros((len(encoded), longest), dtype=torch.long)
        for row, tokens in enumerate(encoded):
            ids[row, : len(tokens)] = torch.tensor(tokens)
            mask[row, : len(tokens)] = 1
        with torch.no_grad():
            hidden = self.model(input_ids=ids, attention_mask=mask).last_hidden_state
        weights = mask.unsqueeze(-1).float()
        pooled = (hidden * weights).sum(1) / weights.sum(1)
        vectors = torch.nn.functional.normalize(pooled, dim=-1).numpy().astype(np.float32)
        return [
            pb_utils.InferenceResponse([pb_utils.Tensor("embedding", vectors[row : row + 1])])
            for row in range(len(requests))
        ]
