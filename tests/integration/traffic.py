"""Mixed traffic for the observability tests: LLM (in-process and routed, streamed and not),
embeddings, classic models over KServe v2 HTTP, plus the failures the error panels and alerts
watch (400, 401, a quota refusal, a 503 while the only worker drains, a failing classic request).
Bounded in count and time; loopback only."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx

# Long enough to span several 16-token KV blocks, so repeated requests hit the prefix cache.
SYSTEM = ("You are a careful assistant for an observability test. Answer briefly and plainly. " * 12).strip()
MAX_ROUNDS = 200


class Traffic:
    def __init__(self, url: str, key: str, tight_key: str, local_llm: str, sim_llm: str, sim_worker: str) -> None:
        self.url, self.local_llm, self.sim_llm, self.sim_worker = url, local_llm, sim_llm, sim_worker
        self.client = httpx.Client(base_url=url, timeout=60, headers={"Authorization": f"Bearer {key}"})
        self.tight_key = tight_key
        self.statuses: dict[int, int] = {}

    def wait_for_models(self, timeout_s: float = 120.0) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            ids = {m["id"] for m in self.client.get("/v1/models").json()["data"]}
            if {self.local_llm, self.sim_llm} <= ids:
                return
            time.sleep(0.2)
        raise AssertionError(f"models not served after {timeout_s} s")

    def run(self, seconds: float) -> None:
        """Rounds of ordinary traffic for `seconds`; the failures once, in the first round."""
        self._failures()
        end = time.monotonic() + seconds
        for i in range(MAX_ROUNDS):
            if time.monotonic() > end:
                break
            self._round(i)

    def _post(self, path: str, body: dict[str, Any], **kwargs: Any) -> httpx.Response:
        r = self.client.post(path, json=body, **kwargs)
        self.statuses[r.status_code] = self.statuses.get(r.status_code, 0) + 1
        return r

    def _stream_chat(self, model: str, user: str, system: str | None = None) -> None:
        messages = ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": user}]
        body = {"model": model, "messages": messages, "max_tokens": 6, "temperature": 0, "stream": True,
                "stream_options": {"include_usage": True}}
        with self.client.stream("POST", "/v1/chat/completions", json=body) as r:
            assert r.status_code == 200, r.read()
            assert "[DONE]" in "".join(r.iter_text())

    def _round(self, i: int) -> None:
        if i % 4 == 0:  # a burst: requests overlap on the worker and in the in-process engine's batch
            with ThreadPoolExecutor(4) as pool:
                list(pool.map(lambda j: self._stream_chat(self.sim_llm if j % 2 else self.local_llm,
                                                          f"Burst {i} {j}.", SYSTEM), range(4)))
        self._stream_chat(self.local_llm, f"Say hello {i % 3}.")
        self._stream_chat(self.sim_llm, f"Question {i % 4}?", SYSTEM)  # the shared system prompt is cached
        assert self._post("/v1/completions", {"model": self.sim_llm, "prompt": SYSTEM + f" Item {i}.",
                                              "max_tokens": 4}).status_code == 200
        assert self._post("/v1/embeddings", {"model": "all-minilm-l6-v2",
                                             "input": ["a cat", f"a dog {i}"]}).status_code == 200
        pixels = [float((i + j) % 16) for j in range(64)]
        assert self._post("/v2/models/digits_onnx/infer", {"inputs": [
            {"name": "input", "shape": [2, 64], "datatype": "FP32", "data": pixels + pixels}]}).status_code == 200
        assert self._post("/v2/models/digits_ensemble/infer", {"inputs": [
            {"name": "IMAGE", "shape": [1, 8, 8], "datatype": "UINT8", "data": [(i * 7 + j) % 256 for j in range(64)]}
        ]}).status_code == 200
        assert self._post("/v2/models/breast_cancer_gb/infer", {"inputs": [
            {"name": "input", "shape": [1, 30], "datatype": "FP32", "data": [1.0] * 30}]}).status_code == 200

    def _failures(self) -> None:
        assert self._post("/v1/completions", {"model": self.local_llm, "prompt": "x",
                                              "max_tokens": -1}).status_code == 400
        assert httpx.get(self.url + "/v1/models", headers={"Authorization": "Bearer sk-wrong"},
                         timeout=30).status_code == 401
        tight = {"Authorization": f"Bearer {self.tight_key}"}
        codes = [httpx.get(self.url + "/v1/models", headers=tight, timeout=30).status_code for _ in range(2)]
        assert codes == [200, 429], codes  # rpm: 1
        assert self._post("/v2/models/digits_onnx/infer", {"inputs": [
            {"name": "nope", "shape": [1, 64], "datatype": "FP32", "data": [0.0] * 64}]}).status_code == 400
        # The only worker of the sim model drains: its requests get 503 until it is back.
        admin = httpx.Client(base_url=self.url, timeout=30)  # admin routes: loopback, no admin key configured
        assert admin.post(f"/v1/admin/workers/{self.sim_worker}/drain").status_code == 200
        try:
            assert self._post("/v1/completions", {"model": self.sim_llm, "prompt": "x",
                                                  "max_tokens": 2}).status_code == 503
        finally:
            assert admin.post(f"/v1/admin/workers/{self.sim_worker}/drain?undo=1").status_code == 200
