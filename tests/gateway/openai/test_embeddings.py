"""/v1/embeddings through the real server, with the official SDK (float and base64)."""

from __future__ import annotations

import numpy as np
import openai
import pytest

from tests.integration.kserve_support import shared_server

pytestmark = pytest.mark.integration

MODEL = "all-minilm-l6-v2"


@pytest.fixture(scope="module")
def sdk() -> openai.OpenAI:
    server = shared_server()
    return openai.OpenAI(base_url=f"http://{server.http_url}/v1", api_key="unused", max_retries=0, timeout=60)


def test_listed_as_a_model(sdk: openai.OpenAI) -> None:
    assert MODEL in [m.id for m in sdk.models.list()]


def test_float_and_base64_agree_and_are_normalised(sdk: openai.OpenAI) -> None:
    texts = ["A cat sits on the mat.", "A kitten rests on a rug.", "Stock markets fell sharply today."]
    as_float = sdk.embeddings.create(model=MODEL, input=texts, encoding_format="float")
    as_b64 = sdk.embeddings.create(model=MODEL, input=texts)  # the SDK asks for base64 by default
    a = np.array([d.embedding for d in as_float.data])
    b = np.array([d.embedding for d in as_b64.data])
    assert a.shape == (3, 384) and [d.index for d in as_float.data] == [0, 1, 2]
    np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(np.linalg.norm(a, axis=1), 1.0, atol=1e-4)
    sim = a @ a.T
    assert sim[0, 1] > sim[0, 2] + 0.2  # the model is real: cat ~ kitten, not ~ stocks
    assert as_float.usage.prompt_tokens > 3


def test_single_string_and_token_ids(sdk: openai.OpenAI) -> None:
    one = sdk.embeddings.create(model=MODEL, input="hello world", encoding_format="float").data[0].embedding
    assert len(one) == 384
    # BERT vocabulary ids of "[CLS] hello world [SEP]".
    ids = sdk.embeddings.create(model=MODEL, input=[[101, 7592, 2088, 102]], encoding_format="float")
    np.testing.assert_allclose(ids.data[0].embedding, one, atol=1e-5)


def test_more_inputs_than_the_model_batch_are_split(sdk: openai.OpenAI) -> None:
    """OpenAI accepts 2,048 inputs; the model's max_batch_size is 64. 150 inputs come back
    in order, each equal to its embedding computed alone."""
    texts = [f"sentence number {i} about {'cats' if i % 2 else 'markets'}" for i in range(150)]
    many = sdk.embeddings.create(model=MODEL, input=texts, encoding_format="float")
    assert [d.index for d in many.data] == list(range(150))
    for i in (0, 63, 64, 149):
        alone = sdk.embeddings.create(model=MODEL, input=texts[i], encoding_format="float").data[0].embedding
        np.testing.assert_allclose(many.data[i].embedding, alone, atol=1e-5)


def test_bad_inputs(sdk: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as e:
        sdk.embeddings.create(model=MODEL, input="word " * 600)
    assert e.value.code == "context_length_exceeded"
    with pytest.raises(openai.BadRequestError):
        sdk.embeddings.create(model=MODEL, input=[])
    with pytest.raises(openai.BadRequestError):
        sdk.embeddings.create(model=MODEL, input="x", dimensions=128)
    with pytest.raises(openai.NotFoundError):
        sdk.embeddings.create(model="no-such-embedder", input="x")
