"""`transformer serve`: the HTTP API in-process, dynamic batching, and limits that answer in JSON."""

import asyncio
import contextlib
import gzip
import json
import logging
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch

pytest.importorskip("fastapi")
from fastapi.testclient import TestClient  # noqa: E402

import transformer  # noqa: E402
from transformer.data import encode_for_decoding  # noqa: E402
from transformer.figures import attention_maps  # noqa: E402
from transformer.request import DecodeRequest  # noqa: E402
from transformer.config import MAX_ALPHA, ConfigError  # noqa: E402
from transformer.serve import MAX_RESTARTS, Batcher, LimitError, Limits, _in_model_thread, create_app  # noqa: E402
from transformer.translator import Translator  # noqa: E402

LINES = ["A dog runs on the beach.", "Two men are talking.", "A girl in a red dress is jumping."]
BEAM2 = DecodeRequest(beam_size=2, alpha=0.6)


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
    assert r.json()["translations"] == translator.translate(LINES, DecodeRequest(beam_size=2, alpha=0.6)) + [""]
    default = client.post("/v1/translate", json={"text": LINES[:1]}).json()["translations"]
    assert default == translator.translate(LINES[:1])  # the run's beam 4 and alpha 0.6 (§6.1)


def test_the_servers_batch_size_bounds_its_batches_as_translates_does(tiny_run):
    """serve --batch-size (the translator's decode.batch_size) was overwritten by the token bound alone, so a
    sampled answer, which depends on the batch, differed from translate's with the same options."""
    one = Translator(tiny_run, log=lambda m: None, decode={"batch_size": 1})
    sample = DecodeRequest(sample=True, seed=5)
    with TestClient(create_app(one, Limits())) as c:
        r = c.post("/v1/translate", json={"text": LINES, "sample": True, "seed": 5})
    assert r.status_code == 200 and r.json()["translations"] == one.translate(LINES, sample)
    assert one.translate(LINES, sample) != one.translate(LINES, DecodeRequest(sample=True, seed=5, batch_size=64))


def test_blank_lines_take_no_draws_in_translate_as_in_the_server(client, translator):
    """The server leaves blank lines out of its batches; the translator decoded them (EOS alone) beside the
    others, so they drew from the seed's generator and moved every other line's draws: the same seed and
    input sampled other outputs from `translate` than from `serve`, and a blank line changed its neighbours'."""
    sample = DecodeRequest(sample=True, seed=3)
    with_blanks = [LINES[0], "", " \u200b ", LINES[2]]  # the client's limit: 4 sentences
    plain = translator.translate([LINES[0], LINES[2]], sample)
    assert translator.translate(with_blanks, sample) == [plain[0], "", "", plain[1]]
    r = client.post("/v1/translate", json={"text": with_blanks, "sample": True, "seed": 3})
    assert r.status_code == 200 and r.json()["translations"] == translator.translate(with_blanks, sample)


@pytest.mark.parametrize("max_wait_ms", [200, 0])
def test_requests_from_many_clients_are_decoded_together(translator, max_wait_ms):
    """Three requests queued before the first batch is made go in it. --max-wait-ms 0 (batch what has come, wait
    for nothing) was refused as not positive; and a wait run out took nothing more that was queued
    (asyncio.wait_for with no time left gives up at once on Python 3.11)."""
    async def scenario():
        batcher = Batcher(translator, Limits(max_wait_ms=max_wait_ms), ThreadPoolExecutor(1))
        worker = asyncio.create_task(batcher.run())
        results = await asyncio.gather(*(batcher.translate([line], BEAM2) for line in LINES))
        worker.cancel()
        return batcher, results

    batcher, results = asyncio.run(scenario())
    assert batcher.requests == 3 and batcher.batches == 1
    assert [r[0] for r in results] == translator.translate(LINES, BEAM2)  # each gets its own answer


def test_requests_of_other_settings_do_not_split_a_batch(translator):
    """Requests of two settings, alternating: each setting's are decoded together, two batches in all. The first
    request of other settings ended the batch it met, so 80 such requests took 80 batches, six times as long."""
    other = DecodeRequest(beam_size=2, alpha=0.7)

    async def scenario():
        batcher = Batcher(translator, Limits(max_wait_ms=200), ThreadPoolExecutor(1))
        worker = asyncio.create_task(batcher.run())
        results = await asyncio.gather(*(batcher.translate([line], request) for line in LINES
                                         for request in (BEAM2, other)))
        worker.cancel()
        return batcher, results

    batcher, results = asyncio.run(scenario())
    assert batcher.requests == 6 and batcher.batches == 2 and batcher.queued == 0
    assert [r[0] for r in results[::2]] == translator.translate(LINES, BEAM2)
    assert [r[0] for r in results[1::2]] == translator.translate(LINES, other)


def test_batches_respect_the_token_bound_and_beam(translator):
    async def scenario():
        batcher = Batcher(translator, Limits(max_wait_ms=200, max_batch_tokens=40), ThreadPoolExecutor(1))
        worker = asyncio.create_task(batcher.run())
        results = await asyncio.gather(batcher.translate(LINES[:1], BEAM2), batcher.translate(LINES[1:2], DecodeRequest(beam_size=3)),
                                       *(batcher.translate([line], BEAM2) for line in LINES))
        worker.cancel()
        return batcher, results

    batcher, results = asyncio.run(scenario())
    assert batcher.requests == 5 and batcher.batches >= 3  # another beam, or over 40 tokens: a new batch
    assert results[1] == translator.translate(LINES[1:2], DecodeRequest(beam_size=3))


@pytest.mark.parametrize("body, status, message", [
    ({"text": ["a"] * 5}, 422, "5 sentences, more than the limit of 4"),
    ({"text": ["a" * 201]}, 422, "text[0]: 201 characters"),
    ({"text": ["a"], "prefix": ["a" * 201]}, 422, "prefix[0]: 201 characters"),
    ({"text": ["a"], "constraints": [["a" * 100, "b" * 100]]}, 422, "constraints[0]: 201 characters"),  # joined
    ({"text": ["a"], "beam": 0}, 422, "beam 0: must be at least 1"),
    ({"text": ["a"], "beam": 17}, 422, "beam: 17, more than the limit of 16 (--max-beam)"),
    # the server's limit, not the vocabulary's size (1,000 pieces), which a beam past both was refused by
    ({"text": ["a"], "beam": 1001}, 422, "beam: 1001, more than the limit of 16 (--max-beam)"),
    ({"text": ["a"], "alpha": -1.0}, 422, "alpha -1.0: must be a finite number >= 0"),
    ({"text": "not a list"}, 422, "invalid request: text: Input should be a valid list"),
    ({"beam": 4}, 422, "invalid request: text: Field required"),
    ({"text": ["a"], "beem": 4}, 422, "invalid request: beem: Extra inputs are not permitted"),
])
def test_bad_requests_get_json_errors(client, body, status, message):
    """The one line says what is wrong: "invalid request" alone named no field (they were in "detail" only,
    which a client that shows the error line, as the API's every error has one, did not show)."""
    r = client.post("/v1/translate", json=body)
    assert r.status_code == status and message in r.json()["error"] and "\n" not in r.json()["error"], r.json()


def test_a_request_at_the_limits_is_served(client):
    """The limits are inclusive: max_sentences sentences of max_chars characters are within them (a "more
    than the limit" check written as >= would refuse a request the help text allows)."""
    r = client.post("/v1/translate", json={"text": ["a" * 200] + ["a"] * 3, "beam": 1})
    assert r.status_code == 200, r.json()
    assert len(r.json()["translations"]) == 4


def test_the_runs_own_beam_is_allowed_past_max_beam(translator):
    """--max-beam bounds what a request may ask, but never refuses the run's own beam (decode.beam_size: 21 for
    parsing, §6.3; 4 here), which is also what a request without "beam" gets."""
    with TestClient(create_app(translator, Limits(max_beam=2))) as c:
        assert c.post("/v1/translate", json={"text": LINES[:1]}).status_code == 200
        assert c.post("/v1/translate", json={"text": LINES[:1], "beam": 4}).status_code == 200
        r = c.post("/v1/translate", json={"text": LINES[:1], "beam": 5})
        assert r.status_code == 422 and r.json()["error"] == ("beam: 5, more than the limit of 4 (the server's own "
                                                              "beam (--beam or the run's), above --max-beam)")


def test_nbest_scores_prefixes_and_sampling_through_the_api(client, translator):
    r = client.post("/v1/translate", json={"text": LINES[:2] + [""], "beam": 3, "nbest": 3})
    assert r.status_code == 200, r.json()
    data = r.json()
    expected = translator.decode(LINES[:2], DecodeRequest(nbest=3, beam_size=3))
    assert [[(h["text"], round(h["score"], 5)) for h in hyps] for hyps in data["nbest"][:2]] == \
        [[(t, round(x, 5)) for t, x in hyps] for hyps in expected]
    assert data["translations"] == [hyps[0]["text"] for hyps in data["nbest"]] and data["translations"][2] == ""
    assert data["nbest"][2] == [{"text": "", "score": 0.0}] * 3  # K hypotheses for an empty sentence too
    scored = client.post("/v1/translate", json={"text": LINES[:2] + [""], "beam": 3, "scores": True}).json()
    assert scored["translations"] == data["translations"] and "nbest" not in scored
    assert scored["scores"][:2] == [hyps[0]["score"] for hyps in data["nbest"][:2]]
    plain = client.post("/v1/translate", json={"text": LINES[:1]}).json()
    assert set(plain) == {"translations"}  # nothing asked, nothing more answered
    r = client.post("/v1/translate", json={"text": LINES[:2], "prefix": ["Ein Hund", ""]})
    assert r.status_code == 200 and r.json()["translations"][0].startswith("Ein Hund")
    assert r.json()["translations"][1] == translator.translate(LINES[1:2])[0]
    r = client.post("/v1/translate", json={"text": LINES[:2], "constraints": [["Hund", "Strand"], []], "beam": 5})
    assert r.status_code == 200 and all(w in r.json()["translations"][0] for w in ("Hund", "Strand"))
    draws = [client.post("/v1/translate", json={"text": LINES, "sample": True, "seed": seed, "nbest": 2}).json()
             for seed in (1, 1, 2)]
    assert draws[0] == draws[1] != draws[2]


def test_alignment_through_the_api(client, translator):
    """"alignment" answers what `translate --alignment` writes: each output's word pairs (figures.align), of
    the translation and of every n-best hypothesis; an empty line aligns nothing. Requests that ask for it
    and requests that do not are each answered their own way."""
    from transformer.figures import align

    prefixes = ["Ein Hund läuft", "Zwei Männer", ""]  # the tiny model's own outputs are empty: words to align
    r = client.post("/v1/translate", json={"text": LINES[:2] + [""], "beam": 3, "alignment": True, "prefix": prefixes})
    assert r.status_code == 200, r.json()
    data = r.json()
    assert data["translations"][:2] == translator.translate(LINES[:2], DecodeRequest(beam_size=3,
                                                                                     prefixes=prefixes[:2]))
    assert data["alignments"] == [[list(p) for p in align(translator, s, t)]
                                  for s, t in zip(LINES[:2], data["translations"])] + [[]]
    assert all(data["alignments"][:2]) and "nbest" not in data
    r = client.post("/v1/translate", json={"text": LINES[:1], "beam": 3, "nbest": 2, "alignment": True,
                                           "prefix": prefixes[:1]}).json()
    assert "alignments" not in r and len(r["nbest"][0]) == 2 and all(h["alignment"] for h in r["nbest"][0])
    assert [h["alignment"] for h in r["nbest"][0]] == [[list(p) for p in align(translator, LINES[0], h["text"])]
                                                       for h in r["nbest"][0]]
    plain = client.post("/v1/translate", json={"text": LINES[:1], "beam": 3, "nbest": 2}).json()
    assert all(set(h) == {"text", "score"} for h in plain["nbest"][0])


def test_the_search_settings_through_the_api(client, translator):
    """early_stop, length_norm and max_len_offset, as the command line's --early-stop, --length-norm and
    --max-len-offset; every option the API spells is a key of the request."""
    from transformer.request import API
    from transformer.serve import TranslateRequest

    assert {k for k, v in API.items() if k == v} == set(TranslateRequest.model_fields) - {"text"}
    body = {"text": LINES, "beam": 3, "nbest": 3, "early_stop": "top", "length_norm": "length", "max_len_offset": 3}
    r = client.post("/v1/translate", json=body)
    assert r.status_code == 200, r.json()
    asked = DecodeRequest(beam_size=3, nbest=3, early_stop="top", length_norm="length", max_len_offset=3)
    expected = translator.decode(LINES, asked)
    assert [[(h["text"], round(h["score"], 5)) for h in hyps] for hyps in r.json()["nbest"]] == \
        [[(t, round(x, 5)) for t, x in hyps] for hyps in expected]
    assert expected != translator.decode(LINES, DecodeRequest(beam_size=3, nbest=3))  # the settings took effect
    for key, value, message in (("early_stop", "first", "early_stop first: must be one of bound, top"),
                                ("length_norm", "none", "length_norm none: must be one of gnmt, length"),
                                ("max_len_offset", -1, "max_len_offset -1: must be >= 0")):
        r = client.post("/v1/translate", json={"text": LINES[:1], key: value})
        assert r.status_code == 422 and message in r.json()["error"], r.json()


def test_score_endpoint_equals_the_translator(client, translator):
    body = {"text": LINES[:2], "translation": ["Ein Hund rennt.", "Zwei Männer reden."]}
    r = client.post("/v1/score", json=body)
    assert r.status_code == 200, r.json()
    expected = translator.score(body["text"], body["translation"])
    assert [round(x, 5) for x in r.json()["scores"]] == [round(e.score, 5) for e in expected]
    assert [round(x, 5) for x in r.json()["log_probs"]] == [round(e.log_prob, 5) for e in expected]


def test_a_sentence_is_read_as_translate_reads_a_line(client, translator):
    """Python's whitespace is wider than the vocabulary's: the server made spaces of U+000B, U+001C..U+001F
    and U+0085 in every text, which the vocabulary removes or keeps, so that it translated and scored other
    pieces than `translate` and `score` (the translator) did for the same line."""
    text = ["Two\x0bmen are\x1ctalking.", "A dog\x85runs on the beach."]
    prefix = ["Zwei\x1fMänner", ""]
    r = client.post("/v1/translate", json={"text": text, "prefix": prefix, "scores": True})
    assert r.status_code == 200, r.json()
    expected = translator.decode(text, DecodeRequest(prefixes=prefix))
    assert [(t, round(x, 4)) for t, x in zip(r.json()["translations"], r.json()["scores"])] == \
        [(t, round(x, 4)) for (t, x), in expected]
    translation = ["Zwei\x1eMänner reden.", "Ein\x0bHund."]
    r = client.post("/v1/score", json={"text": text, "translation": translation})
    assert r.status_code == 200, r.json()
    assert [round(x, 4) for x in r.json()["log_probs"]] == [round(e.log_prob, 4)
                                                           for e in translator.score(text, translation)]


def test_score_endpoint_takes_the_length_norm_as_translate_does(client, translator):
    """/v1/score had no "length_norm": what /v1/translate answered with "length_norm": "length", and
    `transformer score --length-norm length` gives, could not be scored there (an unknown key)."""
    body = {"text": LINES[:2], "translation": ["Ein Hund rennt am Strand.", "Zwei Männer reden."], "alpha": 1.0}
    r = client.post("/v1/score", json={**body, "length_norm": "length"})
    assert r.status_code == 200, r.json()
    expected = translator.score(body["text"], body["translation"], 1.0, length_norm="length")
    assert [round(x, 5) for x in r.json()["scores"]] == [round(e.score, 5) for e in expected]
    gnmt = translator.score(body["text"], body["translation"], 1.0, length_norm="gnmt")
    r = client.post("/v1/score", json=body)
    assert [round(x, 5) for x in r.json()["scores"]] == [round(e.score, 5) for e in gnmt]
    r = client.post("/v1/score", json={**body, "length_norm": "none"})
    assert r.status_code == 422 and "length_norm none: must be one of gnmt, length" in r.json()["error"], r.json()


@pytest.mark.parametrize("path, body, message", [
    ("/v1/translate", {"text": ["a"], "beam": 2, "nbest": 3}, "nbest 3 with beam 2: an n-best list holds at most"),
    ("/v1/translate", {"text": ["a"], "nbest": 0}, "nbest 0: must be at least 1"),
    ("/v1/translate", {"text": ["a", "b"], "prefix": ["x"]}, "prefix: 1 given for 2 input lines"),
    ("/v1/translate", {"text": ["a"], "topk": 3}, "topk without sample: a setting of sampling"),
    ("/v1/translate", {"text": ["a"], "sample": True, "seed": 1, "topp": 1.5}, "topp 1.5: must be in (0, 1]"),
    ("/v1/translate", {"text": ["a"], "sample": True, "seed": 2**64}, "seed 18446744073709551616: must be in 0"),
    ("/v1/translate", {"text": ["a"], "sample": True, "seed": 1, "nbest": 17}, "nbest: 17 draws, more than the limit of 16"),
    ("/v1/translate", {"text": ["a"], "sample": True, "beam": 2}, "sample with beam: sampling draws each token"),
    ("/v1/translate", {"text": ["a"], "nbest": 2, "scores": True}, "scores with nbest: n-best lists carry the score"),
    ("/v1/translate", {"text": ["a"], "sample": True, "constraints": [["x"]]},
     "sample with constraints: lexical constraints need beam search"),
    ("/v1/translate", {"text": ["a"], "constraints": [["x"], ["y"]]}, "constraints: 2 given for 1 input line"),
    ("/v1/translate", {"text": ["a"], "constraints": [["x y z " * 30]]}, "constraints[0]: "),
    ("/v1/translate", {"text": ["a"], "prefix": ["x y z " * 30]}, "prefix[0]: "),
    # each named as the request's field, as its other errors name one (it said "line 2" of prefix[1])
    ("/v1/translate", {"text": ["a", " "], "prefix": ["", "x"]}, "prefix[1]: its input line is empty"),
    ("/v1/translate", {"text": ["", "a"], "constraints": [["x"], []]}, "constraints[0]: its input line is empty"),
    # a line of zero-width spaces is blank once normalised: it got a translation of nothing and took a prefix
    ("/v1/translate", {"text": ["a", "\u200b\u200b"], "prefix": ["", "x"]}, "prefix[1]: its input line is empty"),
    ("/v1/attention", {"text": "\u200b"}, "text: empty sentence"),
    ("/v1/score", {"text": ["a", "b"], "translation": ["x"]}, "translation: 1 given for 2 input lines"),
    ("/v1/score", {"text": ["a"] * 5, "translation": ["x"] * 5}, "5 sentences, more than the limit of 4"),
    ("/v1/score", {"text": ["a"], "translation": ["x"], "alpha": -0.5}, "alpha -0.5: must be a finite number >= 0"),
    # a character no piece holds came out as "⁇": the output did not start with the prefix it was promised
    ("/v1/translate", {"text": ["a dog"], "prefix": ["ein 🐶"]},
     "prefix[0]: the model's vocabulary has no piece for '🐶', so no output can hold the prefix as written"),
    ("/v1/translate", {"text": ["a", "a dog"], "constraints": [[], ["Hund", "🐶 «x»"]]},
     "constraints[1]: the model's vocabulary has no piece for '🐶', '«', '»'"),
    # a JSON string may hold a lone surrogate, which is no character: the tokenizer failed on it (500)
    ("/v1/translate", {"text": ["a \ud800"]}, '"field": "text[0]", "problem": "not Unicode text: a lone '
                                             'surrogate (U+D800) at character 3"'),
    ("/v1/translate", {"text": ["a"], "prefix": ["\udfff"]}, '"field": "prefix[0]"'),
    ("/v1/translate", {"text": ["a"], "constraints": [["x", "\ud800"]]}, '"field": "constraints[0][1]"'),
    ("/v1/score", {"text": ["a"], "translation": ["\ud800"]}, '"field": "translation[0]"'),
    ("/v1/attention", {"text": "\ud800"}, '"field": "text"'),
    ("/v1/attention", {"text": "a", "translation": "\ud800"}, '"field": "translation"'),
    # the options' names too: their errors held the value as sent, which no UTF-8 answer can hold (a 500)
    ("/v1/translate", {"text": ["a"], "early_stop": "\ud800"}, '"field": "early_stop"'),
    ("/v1/translate", {"text": ["a"], "length_norm": "\udfff"}, '"field": "length_norm"'),
    ("/v1/score", {"text": ["a"], "translation": ["b"], "length_norm": "\ud800"}, '"field": "length_norm"'),
    # and a line break in one, as Python writes it: the error is one line
    ("/v1/translate", {"text": ["a"], "early_stop": "x\ny"}, "early_stop 'x\\ny': must be one of bound, top"),
    ("/v1/translate", {"text": ["a"], "length_norm": "x\ry"}, "length_norm 'x\\ry': must be one of"),
])
def test_bad_feature_requests_get_json_errors(client, path, body, message):
    r = client.post(path, content=json.dumps(body), headers={"content-type": "application/json"})  # "\ud800" as sent
    assert r.status_code == 422 and message in r.json()["error"] + json.dumps(r.json().get("detail", "")), r.json()


def test_a_long_list_of_wrong_types_gets_one_short_answer(client, translator):
    """"text" as a list of 300,000 numbers (within the body limit) was answered with one problem a number, 38 MB
    in 3 s of the event loop; the first item of another kind is the one problem, and any request's answer names
    at most MAX_ERRORS_SHOWN problems, with the count of the others."""
    from transformer.serve import MAX_ERRORS_SHOWN

    with TestClient(create_app(translator, Limits())) as big:
        r = big.post("/v1/translate", content=b'{"text": [' + b",".join([b"1"] * 300_000) + b"]}",
                     headers={"content-type": "application/json"})
    assert r.status_code == 422 and len(r.content) < 1000
    assert r.json()["error"] == "invalid request: text: item 0 is a number, not a string"
    for body, problem in (({"text": ["a", ["b"]]}, "text: item 1 is an array, not a string"),
                          ({"text": ["a"], "constraints": [["x"], "y"]},
                           "constraints: item 1 is a string, not an array of strings"),
                          ({"text": ["a"], "constraints": [["x", None]]},
                           "constraints: item 0: item 1 is null, not a string")):
        r = client.post("/v1/translate", json=body)
        assert r.status_code == 422 and r.json()["error"] == f"invalid request: {problem}", r.json()
    r = client.post("/v1/translate", json={"text": ["a"], **{f"key{i}": 1 for i in range(MAX_ERRORS_SHOWN + 5)}})
    assert r.status_code == 422 and r.json()["error"].endswith("; and 5 more")
    assert len(r.json()["detail"]) == MAX_ERRORS_SHOWN


def test_query_parameters_and_unreadable_numbers_are_refused(client, translator):
    """`?nbest=2` was dropped without a word (a misspelt key in the body is refused); a number of more digits
    than Python reads was called malformed JSON."""
    r = client.post("/v1/translate?scores=true&nbest=2", json={"text": ["a"]})
    assert r.status_code == 422 and r.json()["error"].startswith("query parameters are not read (nbest, scores)")
    r = client.post("/v1/translate?a%0Ab%0D=1&c=2", json={"text": ["a"]})  # a line break in a name: one line still
    assert r.status_code == 422 and r.json()["error"].startswith("query parameters are not read ('a\\nb\\r', c)")
    for path, body in (("/v1/score", {"text": ["a"], "translation": ["b"]}), ("/v1/attention", {"text": "a"})):
        assert client.post(path + "?alpha=1", json=body).status_code == 422
    with TestClient(create_app(translator, Limits())) as big:  # the client's body limit is 4,096 bytes
        r = big.post("/v1/translate", content=b'{"text": ["a"], "beam": ' + b"9" * 5000 + b"}",
                     headers={"content-type": "application/json"})
    assert r.status_code == 400 and r.json()["error"] == "the body holds a number of more than 4,300 digits"


def test_a_body_not_sent_as_json_is_told_so(client):
    """curl -d '{...}' without a Content-Type sends a form: 'invalid request', 'Input should be a valid
    dictionary' said nothing of it."""
    body = json.dumps({"text": LINES[:1]})
    for headers in ({}, {"content-type": "text/plain"}):
        r = client.post("/v1/translate", content=body, headers=headers)
        assert r.status_code == 415 and "Content-Type: application/json" in r.json()["error"], r.json()
    r = client.post("/v1/translate", content=body, headers={"content-type": "application/json; charset=utf-8"})
    assert r.status_code == 200
    # a compressed body was read as sent: "malformed JSON: the body is not UTF-8 text"
    r = client.post("/v1/translate", content=gzip.compress(body.encode()),
                    headers={"content-type": "application/json", "content-encoding": "gzip"})
    assert r.status_code == 415 and r.json()["error"] == ("Content-Encoding gzip: the server reads a body as it is "
                                                          "sent; send it uncompressed"), r.json()
    r = client.post("/v1/translate", content=body, headers={"content-type": "application/json",
                                                            "content-encoding": "identity"})
    assert r.status_code == 200


def test_malformed_json_and_large_bodies(client):
    r = client.post("/v1/translate", content=b'{"text": ["a"', headers={"content-type": "application/json"})
    assert r.status_code == 400 and r.json()["error"].startswith("malformed JSON")
    r = client.post("/v1/translate", content=b'{"text": ["a"}', headers={"content-type": "application/json"})
    # the parser's reason and where: it was "malformed JSON: JSON decode error"
    assert r.status_code == 400 and r.json() == {"error": "malformed JSON: Expecting ',' delimiter at character 14"}
    for body, problem in ((b"", "malformed JSON: the body is empty"),  # was a 422 of a nameless field
                          (b'{"text": ["\xff"]}', "malformed JSON: the body is not UTF-8 text"),  # FastAPI's words
                          (b"[" * 2000 + b"]" * 2000, "malformed JSON: the body nests arrays or objects too "
                                                            "deeply")):  # it said "not UTF-8 text"
        r = client.post("/v1/translate", content=body, headers={"content-type": "application/json"})
        assert r.status_code == 400 and r.json()["error"].startswith(problem), r.json()
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
    for kind, weights in maps.weights.items():
        got = torch.tensor(data["weights"][kind], dtype=torch.float32).view(data["shape"][kind]) / data["scale"]
        # rounded to thousandths: half of one apart at most, and float32's last bits beside it
        torch.testing.assert_close(got, weights, atol=0.5 / data["scale"] + 1e-5, rtol=0)
    assert data["src"] == maps.src and data["tgt_out"][-1] == "</s>" and data["translation"] == "Ein Hund läuft."
    own = client.post("/v1/attention", json={"text": LINES[0]}).json()
    assert own["translation"] == translator.translate(LINES[:1])[0]
    assert client.post("/v1/attention", json={"text": "  "}).status_code == 422
    assert data["unknown"] == own["unknown"] == []


def test_attention_names_the_characters_the_model_reads_as_unknown(client):
    """A character without a piece is labelled as typed, where the model read its unknown piece: the answer (and
    the page, beside the figure) says which, as `transformer attention` notes them."""
    r = client.post("/v1/attention", json={"text": "a 犬 dog ☃", "translation": "ein 犬 Hund"})
    assert r.status_code == 200 and r.json()["unknown"] == ["犬", "☃"]
    assert "犬" in r.json()["src"] or "▁犬" in r.json()["src"]  # the label as typed


def test_a_busy_attention_answer_is_counted_as_refused(translator, monkeypatch):
    """/health's refused_busy counted the translations refused as busy, not the attention requests."""
    import transformer.serve

    started, gate = threading.Event(), threading.Event()

    def held(*args, **kwargs):
        started.set()
        gate.wait(30)
        return attention_maps(*args, **kwargs)

    monkeypatch.setattr(transformer.serve, "attention_maps", held)
    with TestClient(create_app(translator, Limits(max_attention_queued=1))) as c:
        with ThreadPoolExecutor(1) as pool:
            first = pool.submit(c.post, "/v1/attention", json={"text": "a dog"})
            assert started.wait(30)
            busy = c.post("/v1/attention", json={"text": "a dog"})
            gate.set()
            assert first.result(60).status_code == 200
        assert busy.status_code == 503 and busy.headers["retry-after"] == "1"
        assert busy.json()["error"].startswith("busy: 1 attention request is in progress, the limit")
        assert c.get("/health").json()["refused_busy"] == 1


def test_attention_requests_are_bounded_in_pieces(translator):
    with TestClient(create_app(translator, Limits(max_attention_pieces=8))) as c:
        r = c.post("/v1/attention", json={"text": "a b c d e f g h i j"})
        assert r.status_code == 422 and "more than the limit of 8" in r.json()["error"]
        r = c.post("/v1/attention", json={"text": "a dog", "translation": "ein " * 20})
        assert r.status_code == 422 and r.json()["error"].startswith("translation: ")
        assert c.post("/v1/attention", json={"text": "a dog", "translation": "ein Hund"}).status_code == 200


def test_health_page_and_openapi(client):
    assert client.get("/health").json()["status"] == "ok"
    assert client.get("/health").json()["version"] == transformer.__version__  # which code answers
    # which weights it serves: a run still training has newer checkpoints than those it loaded
    served = client.get("/health").json()["weights"]
    assert served and all(name.endswith(".safetensors") and "/" not in name for name in served)
    for path in ("/health", "/"):  # what uptime checkers send: GET's headers, without the body
        head, got = client.head(path), client.get(path)
        assert head.status_code == 200 and head.content == b""
        for header in ("content-type", "content-length"):  # "/" said application/json, of the page as a JSON string
            assert head.headers[header] == got.headers[header], (path, header)
    page = client.get("/")
    assert page.status_code == 200 and "renderAttention" in page.text and "/v1/translate" in page.text
    # the α field's bound is the API's (it was 2, where the API takes up to 10), and one model's attention is drawn
    assert f'id="alpha" type="number" min="0" max="{MAX_ALPHA:g}"' in page.text and 'data-drawn="true"' in page.text
    paths = client.get("/openapi.json").json()["paths"]
    assert {"/v1/translate", "/v1/attention", "/health"} <= set(paths)
    assert client.get("/openapi.json").json()["info"]["version"] == transformer.__version__


def test_the_openapi_description_is_of_the_answers_sent(client):
    """/openapi.json described FastAPI's own 422 body ({"detail": [{loc, msg, type}]}), which the server never
    sends, none of its 400/413/415/503, and /v1/attention's answer as {}: a client generated from it read every
    error wrongly. Each answer described now validates against its schema."""
    from transformer.serve import AttentionResponse, ErrorResponse

    spec = client.get("/openapi.json").json()
    for path in ("/v1/translate", "/v1/score", "/v1/attention"):
        answers = spec["paths"][path]["post"]["responses"]
        for status in ("400", "413", "415", "422", "500", "503"):
            assert answers[status]["content"]["application/json"]["schema"] == \
                {"$ref": "#/components/schemas/ErrorResponse"}, (path, status)
    assert {"200", "503"} <= set(spec["paths"]["/health"]["get"]["responses"])  # serving.md's fourth failure
    assert "HTTPValidationError" not in spec["components"]["schemas"]
    assert spec["paths"]["/v1/attention"]["post"]["responses"]["200"]["content"]["application/json"]["schema"] == \
        {"$ref": "#/components/schemas/AttentionResponse"}
    invalid = client.post("/v1/translate", json={"text": ["A dog."], "beam": "4", "beem": 2})
    malformed = client.post("/v1/translate", content=b"{", headers={"content-type": "application/json"})
    refused = client.post("/v1/translate", json={"text": ["A dog."], "sample": True, "beam": 2})
    for answer, status in ((invalid, 422), (malformed, 400), (refused, 422)):
        assert answer.status_code == status and ErrorResponse.model_validate(answer.json()).error, answer.json()
    assert len(ErrorResponse.model_validate(invalid.json()).detail) == 2
    maps = client.post("/v1/attention", json={"text": "A dog runs."})
    assert maps.status_code == 200 and AttentionResponse.model_validate(maps.json()).scale > 0


@contextlib.contextmanager
def server_log():
    """The records the server logs (uvicorn's error logger) meanwhile: caught on that logger itself, which a server
    run in this process earlier left not propagating to the root's (pytest's caplog) and set to CRITICAL."""
    records, logger, level = [], logging.getLogger("uvicorn.error"), logging.getLogger("uvicorn.error").level
    handler = logging.Handler()
    handler.emit = records.append
    logger.addHandler(handler)
    logger.setLevel(logging.ERROR)
    try:
        yield records
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)


def run_batcher(translator, limits: Limits, scenario):
    """Runs ``scenario(batcher)`` on a fresh event loop with the batcher's supervised worker."""
    async def main():
        batcher = Batcher(translator, limits, ThreadPoolExecutor(1))
        worker = asyncio.create_task(batcher.supervise())
        try:
            return batcher, await scenario(batcher)
        finally:
            worker.cancel()

    return asyncio.run(main())


def test_a_full_queue_refuses_at_once_with_retry_after(translator):
    async def scenario(batcher):
        gate = threading.Event()
        batcher.executor.submit(gate.wait)  # the model thread is busy: the first request waits in it
        first = asyncio.create_task(batcher.translate(LINES[:2], BEAM2))
        await asyncio.sleep(0.05)
        second = asyncio.create_task(batcher.translate(LINES[:2], BEAM2))  # 2 sentences queued, the limit 3
        await asyncio.sleep(0.05)
        with pytest.raises(LimitError) as busy:
            await batcher.translate(LINES[:2], BEAM2)
        gate.set()
        return busy.value, await first, await second

    _, (busy, first, second) = run_batcher(translator, Limits(max_queued=3), scenario)
    assert busy.status == 503 and busy.retry_after == 1 and busy.message.startswith("busy: 2 sentences are waiting")
    assert first == second == translator.translate(LINES[:2], BEAM2)


def test_a_request_no_one_waits_for_keeps_no_place_in_the_queue(translator):
    """A request whose wait timed out (or whose client left) is never decoded: its sentences counted against
    --max-queued until the worker reached them, and live clients were refused as "busy" meanwhile."""
    async def scenario(batcher):
        gate = threading.Event()
        batcher.executor.submit(gate.wait)  # the model thread is busy
        held = asyncio.create_task(batcher.translate(LINES[:1], BEAM2))  # the worker waits with it for the thread
        await asyncio.sleep(0.05)
        with pytest.raises(LimitError) as late:  # queued behind it, and given up
            await batcher.translate(LINES[:2], BEAM2)
        queued = batcher.queued
        second = asyncio.create_task(batcher.translate(LINES[:2], BEAM2))  # 2 of 3: the given-up one not counted
        await asyncio.sleep(0.05)
        gate.set()
        with pytest.raises(LimitError):  # it waited past the timeout for the thread too
            await held
        return late.value, queued, await second

    _, (late, queued, second) = run_batcher(translator, Limits(max_queued=3, queue_timeout=0.2), scenario)
    assert late.status == 503 and late.message.startswith("waited 0.2 s") and queued == 0
    assert second == translator.translate(LINES[:2], BEAM2)


def test_stopping_answers_every_waiting_request_at_once(translator):
    """Ctrl-C or SIGTERM: requests waited for the batch decoding to end before their 503, and one longer than
    uvicorn's grace was cancelled by uvicorn instead, its client getting a plain-text 500."""
    async def scenario(batcher):
        gate = threading.Event()
        batcher.executor.submit(gate.wait)  # a long batch holds the model thread
        waiting = asyncio.create_task(batcher.translate(LINES[:2], BEAM2))
        await asyncio.sleep(0.05)
        batcher.stop()
        try:
            with pytest.raises(LimitError) as stopped:
                await asyncio.wait_for(waiting, 2)  # answered while the model thread is still busy
        finally:
            gate.set()
        return stopped.value, batcher.queued

    _, (stopped, queued) = run_batcher(translator, Limits(max_queued=3), scenario)
    assert (stopped.status, stopped.message, queued) == (503, "the server is shutting down", 0)


def test_a_request_larger_than_the_queue_gets_422_not_a_503_to_retry_for_ever(translator):
    with TestClient(create_app(translator, Limits(max_queued=2))) as c:
        r = c.post("/v1/translate", json={"text": LINES})
        assert r.status_code == 422 and "retry-after" not in r.headers, r.json()
        assert r.json()["error"] == ("3 sentences, more than this server queues at once (the limit is 2, "
                                     "--max-queued): send them in smaller requests")
        assert c.post("/v1/translate", json={"text": LINES[:2]}).status_code == 200


@pytest.fixture
def decoded(translator, monkeypatch) -> list[str]:
    """Every line the translator is asked to decode, in order."""
    lines_seen: list[str] = []
    real = translator.stream  # what the server's worker calls (translate calls it too)

    def stream(chunks, *args, **kwargs):
        return real((lines_seen.extend(lines) or lines for lines in chunks), *args, **kwargs)

    monkeypatch.setattr(translator, "stream", stream)
    return lines_seen


def test_a_request_not_decoded_within_its_deadline_gets_503_and_is_never_decoded(translator, decoded):
    async def scenario(batcher):
        gate = threading.Event()
        batcher.executor.submit(gate.wait)  # the model thread is busy with something else
        started = time.monotonic()
        with pytest.raises(LimitError) as e:
            await batcher.translate(["A late dog."], BEAM2)
        waited = time.monotonic() - started
        gate.set()
        ok = await batcher.translate(["A dog."], BEAM2)
        return e.value, waited, ok

    batcher, (error, waited, ok) = run_batcher(translator, Limits(queue_timeout=0.3), scenario)
    assert error.status == 503 and error.retry_after and 0.3 <= waited < 2
    assert decoded == ["A dog."]  # the late one was dropped, never decoded
    assert ok == translator.translate(["A dog."], BEAM2)
    assert batcher.timed_out == 1 and batcher.dropped == 1


def test_a_request_whose_client_left_is_dropped_before_decoding(translator, decoded):
    async def scenario(batcher):
        gate = threading.Event()
        batcher.executor.submit(gate.wait)
        gone = asyncio.get_running_loop().create_future()
        waiting = asyncio.create_task(batcher.translate(["A gone dog."], BEAM2, gone))
        await asyncio.sleep(0.05)
        gone.set_result("http.disconnect")
        with pytest.raises(LimitError):
            await waiting
        gate.set()
        return await batcher.translate(["A dog."], BEAM2)

    batcher, _ = run_batcher(translator, Limits(), scenario)
    assert decoded == ["A dog."] and batcher.dropped == 1


def test_stopping_ends_a_batch_at_its_next_search_step(translator, monkeypatch):
    """Ctrl-C waited for the batch being decoded: a request at the server's limits decodes one batch for minutes
    (91 s in a user's trial), during which the server said nothing and a second Ctrl-C did nothing. The search
    now stops at its next step."""
    import transformer.search

    steps, real = [], transformer.search.next_log_probs

    async def scenario(batcher):
        def counted(*args, **kwargs):  # a search step of the one batch; the server stops during its third
            steps.append(1)
            if len(steps) == 3:
                batcher.stop()
            return real(*args, **kwargs)

        monkeypatch.setattr(transformer.search, "next_log_probs", counted)
        with pytest.raises(LimitError) as stopped:
            await batcher.translate(LINES, DecodeRequest(beam_size=2, max_len_offset=200))
        return stopped.value

    _, stopped = run_batcher(translator, Limits(), scenario)
    assert (stopped.status, stopped.message, len(steps)) == (503, "the server is shutting down", 3)


@pytest.mark.parametrize("how", ["client gone", "server stopping"])
def test_work_no_one_waits_for_stops_at_the_next_batch(translator, monkeypatch, how):
    """A request decoded in several batches (--max-batch-tokens) whose client leaves mid-decode, or while
    the server shuts down (Ctrl-C), is not decoded further: one long request held the model thread, and
    the server's exit, for minutes. The next request is served (or, stopping, refused with 503)."""
    import transformer.decode

    reached, gate, seen = threading.Event(), threading.Event(), []
    real = transformer.decode.beam_hypotheses

    def held(model, src, *args, **kwargs):  # the search of one batch; the next is asked for once the gate opens
        found = real(model, src, *args, **kwargs)
        seen.extend(row[row != 0].tolist() for row in src)  # each sentence's ids, padding left out
        reached.set()
        gate.wait(30)
        return found

    monkeypatch.setattr(transformer.decode, "beam_hypotheses", held)

    async def scenario(batcher):
        gone = asyncio.get_running_loop().create_future()
        task = asyncio.create_task(batcher.translate(LINES, BEAM2, gone))
        assert await asyncio.to_thread(reached.wait, 30)
        if how == "client gone":
            gone.set_result("http.disconnect")
        else:
            batcher.stop()
        await asyncio.sleep(0.05)
        gate.set()
        with pytest.raises(LimitError) as e:
            await task
        with pytest.raises(LimitError) if how == "server stopping" else contextlib.nullcontext() as after:
            await batcher.translate(["A dog."], BEAM2)
        return e.value, after

    batcher, (error, after) = run_batcher(translator, Limits(max_batch_tokens=8), scenario)
    assert len(seen) == (1 if how == "server stopping" else 2), seen  # one of the three lines; then "A dog."
    if how == "client gone":
        assert error.status == 499 and seen[1] == encode_for_decoding(["A dog."], translator.tokenizer)[0]
    else:
        assert error.status == 503 and after.value.status == 503
        assert error.message == after.value.message == "the server is shutting down"


def test_an_attention_request_is_dropped_when_its_client_leaves_or_its_wait_ends(translator):
    """/v1/attention waits for the model thread as a translation does: its client's leaving frees its slot
    (the web page's "busy" for everyone else), a wait past --queue-timeout is a 503, neither is computed."""
    ran = []

    class Client:  # the ASGI request's receive(): its next message is the client leaving
        def __init__(self):
            self.left = asyncio.get_running_loop().create_future()

        async def receive(self):
            return await self.left

    async def scenario():
        executor = ThreadPoolExecutor(1)
        gate = threading.Event()
        executor.submit(gate.wait, 30)  # the model thread is busy decoding
        client = Client()
        never = asyncio.Event()  # the server does not stop here
        leaving = asyncio.create_task(_in_model_thread(executor, client, 30, lambda: ran.append("gone"), never))
        await asyncio.sleep(0.05)
        client.left.set_result({"type": "http.disconnect"})
        with pytest.raises(LimitError) as gone:
            await leaving
        with pytest.raises(LimitError) as late:
            await _in_model_thread(executor, Client(), 0.2, lambda: ran.append("late"), never)
        gate.set()
        return gone.value, late.value, await _in_model_thread(executor, Client(), 30, lambda: "maps", never)

    gone, late, answered = asyncio.run(scenario())
    assert (gone.status, late.status, answered, ran) == (499, 503, "maps", [])
    assert late.message.startswith("waited 0.2 s for the model")


@pytest.mark.parametrize("taken", [False, True], ids=["waiting", "computing"])
def test_an_attention_request_is_answered_at_once_when_the_server_stops(taken):
    """Ctrl-C or SIGTERM answered queued translations 503 at once, and not an attention request, which waits
    for the model thread outside the queue: behind a batch longer than uvicorn's grace it was cancelled, its
    client getting a plain-text 500."""
    class Client:  # a client that stays
        async def receive(self):
            await asyncio.sleep(3600)

    async def scenario():
        executor, stopped = ThreadPoolExecutor(1), asyncio.Event()
        gate = threading.Event()
        if not taken:
            executor.submit(gate.wait, 30)  # a long batch holds the model thread
        waiting = asyncio.create_task(_in_model_thread(executor, Client(), 30, lambda: gate.wait(30), stopped))
        await asyncio.sleep(0.05)
        stopped.set()
        try:
            with pytest.raises(LimitError) as said:
                await asyncio.wait_for(waiting, 2)  # while the model thread is still busy
        finally:
            gate.set()
            executor.shutdown()
        return said.value

    said = asyncio.run(scenario())
    assert (said.status, said.message) == (503, "the server is shutting down")


def test_a_failing_worker_answers_500_is_restarted_then_gives_up_and_says_so(translator, monkeypatch):
    async def broken(self, batch):
        raise RuntimeError("a bug in the worker")

    monkeypatch.setattr(Batcher, "_decode", broken)

    async def scenario(batcher):
        errors = []
        for _ in range(MAX_RESTARTS + 2):
            with pytest.raises(LimitError) as e:
                await batcher.translate(["A dog."], BEAM2)
            errors.append(e.value)
            await asyncio.sleep(0.01)
        return errors

    with server_log() as logged:
        batcher, errors = run_batcher(translator, Limits(), scenario)
    assert [e.status for e in errors] == [500] * (MAX_RESTARTS + 1) + [503]
    assert "a bug in the worker" in errors[0].message and not batcher.alive
    assert len(batcher.failures) == MAX_RESTARTS + 1
    # the last failure's client was told "it is restarted", and its traceback, as every failure's, was not logged
    assert [e.message.rsplit("; ", 1)[1] for e in errors[:-1]] == ["it is restarted"] * MAX_RESTARTS + [
        "decoding has stopped"]
    assert [r.exc_info[1].args for r in logged] == [("a bug in the worker",)] * (MAX_RESTARTS + 1)


def test_health_is_503_once_decoding_has_stopped(translator, monkeypatch):
    async def broken(self, batch):
        raise RuntimeError("a bug")

    monkeypatch.setattr(Batcher, "_decode", broken)
    with TestClient(create_app(translator, Limits())) as c:
        assert c.get("/health").status_code == 200
        for _ in range(MAX_RESTARTS + 1):
            assert c.post("/v1/translate", json={"text": ["A dog."]}).status_code == 500
        health = c.get("/health")
        assert health.status_code == 503 and health.json()["status"] == "error"
        assert "RuntimeError: a bug" in health.json()["worker_failures"][-1]
        assert c.post("/v1/translate", json={"text": ["A dog."]}).status_code == 503
        # a request with nothing to decode was answered 200, as if the server worked
        for path, body in (("/v1/translate", {"text": [""]}), ("/v1/translate", {"text": []}),
                           ("/v1/score", {"text": [], "translation": []})):
            assert c.post(path, json=body).status_code == 503, body
        # attention runs on the model thread, not through the stopped worker: it answered 200 still
        attention = c.post("/v1/attention", json={"text": "A dog."})
        assert attention.status_code == 503 and attention.json()["error"].startswith("decoding has stopped after")


@pytest.mark.parametrize("field, value", [("max_queued", 0), ("queue_timeout", float("nan")),
                                          ("max_wait_ms", float("inf")), ("max_wait_ms", -1),
                                          ("max_connections", -1)])
def test_limits_must_be_positive_and_finite(field, value):
    zero = " or 0" if field == "max_wait_ms" else ""  # no wait: what is queued
    with pytest.raises(ConfigError, match=f"--{field.replace('_', '-')} must be a positive number{zero}, got"):
        Limits(**{field: value})


def test_an_attention_limit_that_refuses_every_request_is_refused():
    """A sentence's EOS alone is one piece: --max-attention-pieces 1 was taken, then refused every request."""
    with pytest.raises(ConfigError, match=r"--max-attention-pieces 1: give at least 2 \(a word and its EOS\)"):
        Limits(max_attention_pieces=1)
    assert Limits(max_attention_pieces=2).max_attention_pieces == 2


def test_an_error_in_the_decoding_thread_answers_json_and_the_server_goes_on(translator, monkeypatch):
    """What decoding raises reaches the client as {"error": one line}: 500 for a failure, 422 for a user
    error the checks before queueing let through; the worker is not restarted, the next request is served."""
    real = translator.stream

    def stream(chunks, *args, **kwargs):
        def checked():
            for lines in chunks:
                if lines == ["A broken dog."]:
                    raise RuntimeError("a bug in decoding\nand its second line")
                if lines == ["A refused dog."]:
                    raise ConfigError("a rule no check saw")
                yield lines
        return real(checked(), *args, **kwargs)

    monkeypatch.setattr(translator, "stream", stream)
    with TestClient(create_app(translator, Limits())) as c, server_log() as logged:
        r = c.post("/v1/translate", json={"text": ["A broken dog."]})
        assert r.status_code == 500 and r.json() == {"error": "decoding failed: RuntimeError: a bug in decoding"}
        # the API says a 500's traceback is in the server's log: a failed batch's was nowhere
        assert [r.exc_info[1].args[0] for r in logged] == ["a bug in decoding\nand its second line"]
        r = c.post("/v1/translate", json={"text": ["A refused dog."]})
        assert r.status_code == 422 and r.json() == {"error": "a rule no check saw"}
        assert len(logged) == 1  # a user's error is the user's to read, not a failure of the server
        assert c.post("/v1/translate", json={"text": ["A dog."]}).status_code == 200
        health = c.get("/health")
        assert health.status_code == 200 and health.json()["worker_failures"] == []


def test_any_other_failure_answers_json_too(translator, monkeypatch):
    def broken(*args):
        raise RuntimeError("no maps")

    monkeypatch.setattr("transformer.serve._attention", broken)
    with TestClient(create_app(translator, Limits()), raise_server_exceptions=False) as c:
        r = c.post("/v1/attention", json={"text": "A dog."})
        assert r.status_code == 500 and r.json() == {"error": "answering failed: RuntimeError: no maps"}


def test_an_attention_request_past_the_models_positions_is_a_422_as_a_translation_is(translator, monkeypatch):
    """A sentence or translation past a learned position table (Table 3 row E) was answered 500 by
    /v1/attention, with a traceback in the server's log, where /v1/translate answers it 422; the model's own
    failing (ModelOverflow) stays a 500."""
    from transformer.config import ConfigError
    from transformer.translator import ModelOverflow

    for error, status in ((ConfigError("line 1: 71 pieces with EOS, more than the model's learned positions"), 422),
                          (ModelOverflow("the model's outputs overflowed"), 500)):
        def refused(*args, error=error):
            raise error

        monkeypatch.setattr("transformer.serve.attention_maps", refused)
        with TestClient(create_app(translator, Limits()), raise_server_exceptions=False) as c:
            r = c.post("/v1/attention", json={"text": "A dog.", "translation": "Ein Hund."})
        assert r.status_code == status and str(error) in r.json()["error"]


@pytest.mark.parametrize("max_batch_tokens", [8192, 8])
def test_score_batches_hold_at_most_max_batch_tokens(translator, max_batch_tokens):
    """/v1/score is bounded by --max-batch-tokens (target pieces per forward pass), as translation is;
    one pair alone may exceed it (it is never cut)."""
    targets = ["Ein Hund rennt am Strand.", "Zwei Männer reden laut miteinander.", "Ein Mädchen springt hoch."]
    shapes = []
    hook = translator.model.register_forward_hook(lambda module, args, out: shapes.append(args[1].shape))
    try:
        with TestClient(create_app(translator, Limits(max_batch_tokens=max_batch_tokens))) as c:
            r = c.post("/v1/score", json={"text": LINES, "translation": targets})
    finally:
        hook.remove()
    assert r.status_code == 200, r.json()
    assert len(shapes) == (1 if max_batch_tokens == 8192 else 3)
    assert all(rows == 1 or rows * length <= max_batch_tokens for rows, length in shapes)
    expected = translator.score(LINES, targets)  # in one batch: the same sums, in another order of rounding
    assert r.json()["scores"] == pytest.approx([e.score for e in expected], abs=1e-4)


def test_a_parse_prefix_that_cannot_start_a_tree_gets_422(tiny_parse_run):
    parser = Translator(tiny_parse_run, log=lambda m: None)
    with TestClient(create_app(parser, Limits())) as c:
        r = c.post("/v1/translate", json={"text": ["The dog barked ."], "prefix": ["The dog"]})
        assert r.status_code == 422 and r.json()["error"].startswith(
            "prefix[0] on a parsing run: its piece 1, 'The', cannot continue a tree of the input"), r.json()
        r = c.post("/v1/translate", json={"text": ["The dog barked ."], "prefix": ["(S (NP"]})
        assert r.status_code == 200 and r.json()["translations"][0].startswith("(S (NP")


def test_a_port_in_use_is_refused_in_one_line_before_anything_is_said(tmp_path, capsys):
    """Before the model is loaded, and before "serving ... on": uvicorn binding it itself printed that line,
    then its own error, and exited 3."""
    import socket

    from transformer.cli import main

    with socket.create_server(("127.0.0.1", 0)) as taken:
        port = taken.getsockname()[1]
        assert main(["serve", str(tmp_path / "not a run"), "--port", str(port)]) == 1
    out, err = capsys.readouterr()
    assert (out, err) == ("", f"error: --host 127.0.0.1 --port {port}: cannot listen there (Address already in "
                              "use): another program listens there; give another --port\n")


def test_localhost_is_listened_on_as_uvicorn_would():
    """IPv4 for a name, as uvicorn binds: getaddrinfo's first answer for "localhost" may be ::1."""
    import socket

    from transformer.serve import listen

    for host, family in (("localhost", socket.AF_INET), ("127.0.0.1", socket.AF_INET)):
        with listen(host, 0) as sock:
            assert sock.family == family and sock.getsockname()[0] == "127.0.0.1"


def test_each_request_gets_exactly_its_own_lines_answers(translator):
    """Requests of several lines decoded in one batch: each gets one answer per line of its own, in order, and
    none of the next request's (a slice one too long would hand a client another's translation)."""
    async def scenario():
        batcher = Batcher(translator, Limits(max_wait_ms=200), ThreadPoolExecutor(1))
        worker = asyncio.create_task(batcher.run())
        results = await asyncio.gather(batcher.translate(LINES[:2], BEAM2), batcher.translate(LINES[2:], BEAM2))
        worker.cancel()
        return batcher, results

    batcher, results = asyncio.run(scenario())
    assert batcher.batches == 1
    assert results == [translator.translate(LINES[:2], BEAM2), translator.translate(LINES[2:], BEAM2)]


def test_a_batch_closes_where_the_next_request_would_pass_the_token_bound(translator):
    """max_batch_tokens counts source tokens (EOS included) x beam: a bound that the first two requests fill
    exactly takes both in one batch, and the third, which would pass it, waits for the next."""
    tokens = [2 * (len(ids) + 1) for ids in translator.tokenizer.encode_batch(LINES)]

    async def scenario():
        limits = Limits(max_wait_ms=200, max_batch_tokens=tokens[0] + tokens[1])
        batcher = Batcher(translator, limits, ThreadPoolExecutor(1))
        worker = asyncio.create_task(batcher.run())
        results = await asyncio.gather(*(batcher.translate([line], BEAM2) for line in LINES))
        worker.cancel()
        return batcher, results

    batcher, results = asyncio.run(scenario())
    assert batcher.batches == 2 and [r[0] for r in results] == translator.translate(LINES, BEAM2)


@pytest.mark.parametrize("signals, status, said", [(("SIGTERM",), 143, "terminated"),
                                                   (("SIGINT", "SIGINT"), 130, "interrupted")])
def test_a_client_stalled_in_its_body_holds_no_shutdown(signals, status, said):
    """A client that sent its headers and part of its body held SIGTERM for the whole --request-timeout (a
    minute here); a second Ctrl-C in that wait printed two tracebacks of uvicorn's. The client is answered 503 at
    once, as the requests waiting to be decoded are, and the server stops with its one line."""
    import signal
    import socket
    import subprocess
    import sys
    import urllib.request
    from pathlib import Path

    run = Path(__file__).parent / "data" / "decode_reference"
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen([sys.executable, "-m", "transformer", "serve", str(run), "--port", str(port),
                             "--request-timeout", "60"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1):
                    break
            except OSError:
                assert proc.poll() is None and time.monotonic() < deadline
                time.sleep(0.2)
        with socket.create_connection(("127.0.0.1", port)) as stalled:
            stalled.sendall(b"POST /v1/translate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                            b"Content-Length: 40\r\n\r\n{\"text\"")
            time.sleep(0.5)
            for name in signals:
                proc.send_signal(getattr(signal, name))
                time.sleep(1.0)
            _, err = proc.communicate(timeout=30)  # not the 60 s of --request-timeout
            stalled.settimeout(5)
            answer = b"".join(iter(lambda: stalled.recv(65536), b""))
    finally:
        proc.kill()
    assert proc.returncode == status and "Traceback" not in err and err.endswith(f"{said}\n"), err[-3000:]
    # answered as the requests waiting to be decoded are: it was a plain-text 500 once uvicorn's grace ran out
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 503 ") and json.loads(body) == {"error": "the server is shutting down"}, answer


def test_the_body_limit_loses_no_message_and_answers_once_at_shutdown():
    """The race of a body's receive against the server's stop: a receive the app gave up on (a timeout, Starlette's
    disconnect poll) left a task that took the next chunk, and each left a waiter on the stop behind; an app that
    read again after the stop's disconnect was answered a second 503."""
    from types import SimpleNamespace

    from transformer.serve import SHUTTING_DOWN, BodyLimit

    async def scenario() -> tuple[list, list, list]:
        chunks: asyncio.Queue = asyncio.Queue()
        stopped = asyncio.Event()
        got, sent = [], []

        async def app(scope, receive, send):
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(receive(), 0.05)  # nothing sent yet: given up on
            await chunks.put({"type": "http.request", "body": b"ab", "more_body": True})
            got.append(await asyncio.wait_for(receive(), 5))  # the chunk: the receive given up on took it, lost
            stopped.set()  # the server stops while the rest of the body is awaited
            got.append(await receive())
            got.append(await receive())  # read again after the stop's disconnect: answered twice

        async def send(message):
            sent.append(message)

        scope = {"type": "http", "headers": [], "app": SimpleNamespace(state=SimpleNamespace(
            batcher=SimpleNamespace(stopped=stopped)))}
        await BodyLimit(app, 1000)(scope, chunks.get, send)
        await asyncio.sleep(0)
        left = [t for t in asyncio.all_tasks() if t is not asyncio.current_task() and not t.done()]
        return got, sent, left

    got, sent, left = asyncio.run(scenario())
    assert got == [{"type": "http.request", "body": b"ab", "more_body": True}] + [{"type": "http.disconnect"}] * 2
    assert [m["status"] for m in sent if m["type"] == "http.response.start"] == [503]
    assert json.loads(sent[-1]["body"]) == {"error": SHUTTING_DOWN} and left == []
