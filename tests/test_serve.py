"""`transformer serve`: the HTTP API in-process, dynamic batching, and limits that answer in JSON."""

import asyncio
import json
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch

pytest.importorskip("fastapi")
from fastapi.testclient import TestClient  # noqa: E402

from transformer.figures import attention_maps  # noqa: E402
from transformer.serve import Batcher, Limits, create_app  # noqa: E402
from transformer.translator import Translator  # noqa: E402

LINES = ["A dog runs on the beach.", "Two men are talking.", "A girl in a red dress is jumping."]


@pytest.fixture(scope="module")
def translator(tiny_run):
    return Translator(tiny_run, log=lambda m: None)


@pytest.fixture(scope="module")
def client(translator):
    with TestClient(create_app(translator, Limits(max_body_bytes=4096, max_sentences=4, max_chars=200))) as c:
        yield c


def test_translate_equals_the_translator(client, translator):
    r = client.post("/v1/translate", json={"text": LINES + [""], "beam": 2, "alpha": 0.6})
    assert r.status_code == 200
    assert r.json()["translations"] == translator.translate(LINES, beam_size=2, alpha=0.6) + [""]
    default = client.post("/v1/translate", json={"text": LINES[:1]}).json()["translations"]
    assert default == translator.translate(LINES[:1])  # the run's beam 4 and alpha 0.6 (§6.1)


def test_requests_from_many_clients_are_decoded_together(translator):
    async def scenario():
        batcher = Batcher(translator, Limits(max_wait_ms=200), ThreadPoolExecutor(1))
        worker = asyncio.create_task(batcher.run())
        results = await asyncio.gather(*(batcher.translate([line], 2, 0.6) for line in LINES))
        worker.cancel()
        return batcher, results

    batcher, results = asyncio.run(scenario())
    assert batcher.requests == 3 and batcher.batches == 1
    assert [r[0] for r in results] == translator.translate(LINES, beam_size=2)  # each gets its own answer


def test_batches_respect_the_token_bound_and_beam(translator):
    async def scenario():
        batcher = Batcher(translator, Limits(max_wait_ms=200, max_batch_tokens=40), ThreadPoolExecutor(1))
        worker = asyncio.create_task(batcher.run())
        results = await asyncio.gather(batcher.translate(LINES[:1], 2, 0.6), batcher.translate(LINES[1:2], 3, 0.6),
                                       *(batcher.translate([line], 2, 0.6) for line in LINES))
        worker.cancel()
        return batcher, results

    batcher, results = asyncio.run(scenario())
    assert batcher.requests == 5 and batcher.batches >= 3  # another beam, or over 40 tokens: a new batch
    assert results[1] == translator.translate(LINES[1:2], beam_size=3)


@pytest.mark.parametrize("body, status, message", [
    ({"text": ["a"] * 5}, 422, "5 sentences, more than the limit of 4"),
    ({"text": ["a" * 201]}, 422, "text[0]: 201 characters"),
    ({"text": ["a"], "beam": 0}, 422, "beam: 0 is outside 1..16"),
    ({"text": ["a"], "beam": 17}, 422, "beam: 17 is outside"),
    ({"text": ["a"], "alpha": -1}, 422, "invalid request"),
    ({"text": "not a list"}, 422, "invalid request"),
    ({"beam": 4}, 422, "invalid request"),
])
def test_bad_requests_get_json_errors(client, body, status, message):
    r = client.post("/v1/translate", json=body)
    assert r.status_code == status and message in r.json()["error"] + json.dumps(r.json().get("detail", ""))


def test_malformed_json_and_large_bodies(client):
    r = client.post("/v1/translate", content=b'{"text": ["a"', headers={"content-type": "application/json"})
    assert r.status_code == 400 and r.json()["error"].startswith("malformed JSON")
    r = client.post("/v1/translate", content=json.dumps({"text": ["a" * 5000]}).encode(),
                    headers={"content-type": "application/json"})
    assert r.status_code == 413 and "4096 bytes" in r.json()["error"]
    chunks = iter([b'{"text": ["', b"a" * 3000, b"a" * 3000, b'"]}'])  # no Content-Length: counted as it arrives
    r = client.post("/v1/translate", content=chunks, headers={"content-type": "application/json"})
    assert r.status_code == 413
    assert client.post("/v1/translate", json={"text": ["A dog."]}).status_code == 200  # the server goes on


def test_attention_endpoint_gives_the_models_weights(client, translator):
    r = client.post("/v1/attention", json={"text": LINES[0], "translation": "Ein Hund läuft."})
    assert r.status_code == 200
    data = r.json()
    maps = attention_maps(translator, LINES[0], "Ein Hund läuft.")
    torch.testing.assert_close(torch.tensor(data["pieces"]["weights"]["enc_self"]), maps.weights["enc_self"],
                               atol=1e-4, rtol=0)
    assert data["pieces"]["src"] == maps.src and data["words"]["tgt_out"][-1] == "</s>"
    own = client.post("/v1/attention", json={"text": LINES[0]}).json()
    assert own["translation"] == translator.translate(LINES[:1])[0]
    assert client.post("/v1/attention", json={"text": "  "}).status_code == 422


def test_health_page_and_openapi(client):
    assert client.get("/health").json()["status"] == "ok"
    page = client.get("/")
    assert page.status_code == 200 and "renderAttention" in page.text and "/v1/translate" in page.text
    paths = client.get("/openapi.json").json()["paths"]
    assert {"/v1/translate", "/v1/attention", "/health"} <= set(paths)
