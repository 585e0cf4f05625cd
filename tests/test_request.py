"""The one table of decoding options (request.py): every pair refused or accepted as it says, bad values
refused in one line naming the option, and the table as docs/decoding.md prints it. The pairs run end
to end, with both options shown to take effect, in tests/test_cli.py."""

import math
from itertools import combinations
from pathlib import Path

import pytest
import torch

from transformer.config import ConfigError, DecodeConfig
from transformer.request import API, CLI, MAX_TEMPERATURE, MIN_TEMPERATURE, OPTIONS, REFUSED, DecodeRequest, Setup
from transformer.sampling import Sampling

DOCS = Path(__file__).resolve().parents[1] / "docs" / "decoding.md"


def with_options(options: set[str]) -> tuple[DecodeRequest, Setup]:
    """The smallest request and translator setup that hold ``options`` (names of ``OPTIONS``)."""
    request = DecodeRequest(beam_size=4 if "beam" in options else None,
                            early_stop="top" if "early_stop" in options else None,
                            nbest=2 if "nbest" in options else None, scores="scores" in options,
                            alignment="alignment" in options, prefixes=["Ein"] if "prefix" in options else None,
                            constraints=[["Hund"]] if "constraints" in options else None, sample="sample" in options)
    setup = Setup("int8" in options, "ensemble" in options, "parse" in options,
                  "cuda" if "device" in options else "cpu", "bf16" in options)
    return request, setup


def test_each_option_is_one_field_or_setting():
    """Every option of the table is given by exactly one field of the request or the setup."""
    for option in OPTIONS:
        request, setup = with_options({option})
        assert request.options() | setup.options() == {option}
    assert DecodeRequest().options() == Setup().options() == set()
    assert {o for a, b, _ in REFUSED for o in (a, b)} <= set(OPTIONS)


@pytest.mark.parametrize("names", [CLI, API], ids=["command line", "server"])
def test_the_table_refuses_its_pairs_in_one_line_and_accepts_every_other(names):
    refused = {frozenset((a, b)): (a, b, why) for a, b, why in REFUSED}
    for pair in combinations(OPTIONS, 2):
        request, setup = with_options(set(pair))
        if frozenset(pair) not in refused:
            request.verify(setup, lines=1, names=names)
            continue
        a, b, why = refused[frozenset(pair)]
        with pytest.raises(ConfigError) as e:
            request.verify(setup, lines=1, names=names)
        assert str(e.value) == f"{names[a]} with {names[b]}: {why}" and "\n" not in str(e.value)


@pytest.mark.parametrize("fields, message", [
    ({"beam_size": 0}, "--beam 0: must be at least 1"),
    ({"alpha": float("nan")}, "--alpha nan: must be a finite number >= 0"),
    ({"alpha": -0.1}, "--alpha -0.1: must be a finite number >= 0"),
    ({"alpha": 1e30}, "--alpha 1e+30: must be a finite number >= 0 (the early stop's bound needs α >= 0) and <= 10 "
                      "(beyond, the length penalty overflows)"),
    ({"max_len_offset": -1}, "--max-len-offset -1: must be >= 0"),
    ({"batch_size": 0}, "--batch-size 0: must be at least 1"),
    ({"early_stop": "first"}, "--early-stop first: must be one of bound, top"),
    ({"length_norm": "average"}, "--length-norm average: must be one of gnmt, length"),
    ({"nbest": 0}, "--nbest 0: must be at least 1"),
    ({"nbest": 5}, "--nbest 5 with the run's beam size 4: an n-best list holds at most the beam's hypotheses; "
                   "give --beam 5 or more"),
    ({"nbest": 3, "beam_size": 2}, "--nbest 3 with --beam 2:"),
    ({"topk": 3}, "--topk without --sample: a setting of sampling"),
    ({"seed": 1}, "--seed without --sample: a setting of sampling"),
    ({"sample": True, "topk": -1}, "--topk -1: must be >= 0 (0: every token)"),
    ({"sample": True, "topp": 0.0}, "--topp 0.0: must be in (0, 1]"),
    ({"sample": True, "topp": 1.01}, "--topp 1.01: must be in (0, 1]"),
    ({"sample": True, "topp": float("nan")}, "--topp nan: must be in (0, 1]"),
    ({"sample": True, "temperature": 0.0}, "--temperature 0.0: must be in 1.2e-38 .. 3.4e+38"),
    ({"sample": True, "temperature": 1e-40}, "--temperature 1e-40: must be in 1.2e-38 .. 3.4e+38 (float32's normal "
                                             "numbers: the log-probs are divided by it)"),
    ({"sample": True, "temperature": 1e39}, "--temperature 1e+39: must be in 1.2e-38 .. 3.4e+38"),
    ({"sample": True, "temperature": float("inf")}, "--temperature inf: must be in 1.2e-38 .. 3.4e+38"),
    ({"sample": True, "temperature": float("nan")}, "--temperature nan: must be in 1.2e-38 .. 3.4e+38"),
    ({"sample": True, "seed": -1}, "--seed -1: must be in 0 .. 2^64 - 1"),
    ({"sample": True, "seed": 2**64}, f"--seed {2**64}: must be in 0 .. 2^64 - 1 (a seed of torch's generator)"),
    ({"prefixes": ["a", "b"]}, "--prefix: 2 given for 3 input lines"),
    ({"constraints": [[]]}, "--constraints: 1 given for 3 input lines"),
    ({"sample": "no"}, "--sample 'no': must be True or False"),  # taken for its truth, it sampled
    ({"scores": 1}, "--scores 1: must be True or False"),
    ({"alignment": None}, "--alignment None: must be True or False"),
])
def test_bad_values_are_refused_in_one_line_naming_the_option(fields, message):
    with pytest.raises(ConfigError) as e:
        DecodeRequest(**fields).verify(Setup(), DecodeConfig(), lines=3)
    assert str(e.value).startswith(message) and "\n" not in str(e.value)


def test_a_count_of_one_input_line_is_said_in_the_singular():
    with pytest.raises(ConfigError) as e:
        DecodeRequest(prefixes=["a", "b"]).verify(Setup(), DecodeConfig(), lines=1)
    assert str(e.value) == "--prefix: 2 given for 1 input line"


def test_the_values_at_the_edges_are_accepted():
    edges = DecodeRequest(sample=True, nbest=50, topk=0, topp=1.0, temperature=MIN_TEMPERATURE, seed=2**64 - 1,
                          alpha=0.0, max_len_offset=0)
    edges.verify(Setup(), DecodeConfig(), lines=1)
    assert edges.sampling(torch.device("cpu")).generator.initial_seed() == 2**64 - 1
    DecodeRequest(nbest=4, seed=None).verify()  # the run's beam 4 holds four


def test_numbers_of_other_kinds_are_taken_as_pythons():
    """numpy's and fractions' numbers pass as whole and real numbers; torch then refused them in a TypeError
    (a uint64 seed past 2^63, a Fraction temperature dividing a tensor)."""
    import fractions

    import numpy as np

    other = DecodeRequest(sample=True, seed=np.uint64(2**63 + 5), topk=np.int64(3), topp=np.float32(0.5),
                          temperature=fractions.Fraction(1, 2))
    other.verify()
    sampling = other.sampling(torch.device("cpu"))
    assert sampling.generator.initial_seed() == 2**63 + 5
    assert (sampling.topk, sampling.topp, sampling.temperature) == (3, 0.5, 0.5)
    assert all(type(x) in (int, float) for x in (sampling.topk, sampling.topp, sampling.temperature))


def test_resolve_fills_the_runs_defaults_where_they_apply_and_verifies_again():
    run = DecodeConfig(beam_size=5, alpha=0.3, max_len_offset=7, early_stop="top", batch_size=9, length_norm="length")
    search = DecodeRequest(nbest=2, alpha=1.0).resolve(run)
    assert (search.beam_size, search.alpha, search.max_len_offset, search.early_stop, search.batch_size, search.nbest,
            search.length_norm) == (5, 1.0, 7, "top", 9, 2, "length")
    assert DecodeRequest(length_norm="gnmt").resolve(run).length_norm == "gnmt"  # given: it, not the run's
    # given zeros are given values, not "none given": α 0 (no length penalty) and offset 0 stay
    zeros = DecodeRequest(alpha=0.0, max_len_offset=0).resolve(run)
    assert (zeros.alpha, zeros.max_len_offset) == (0.0, 0)
    drawn = DecodeRequest(sample=True, nbest=3).resolve(run)
    assert drawn.beam_size is None and drawn.early_stop is None and drawn.alpha == 0.3  # no beam to size or stop
    for request in (search, drawn):
        request.verify(Setup(), run)


def test_a_request_cut_to_lines_holds_their_own_prefixes_and_constraints():
    """Streamed input is decoded a chunk of lines at a time: the chunk's request holds the prefixes and
    constraints of its lines alone (line i the i-th), fewer where fewer were given, and verifies against the
    chunk's line count; its other options are the request's."""
    request = DecodeRequest(beam_size=2, prefixes=["a", "b", "c"], constraints=[["x"], ["y"], ["z"]])
    part = request.lines(1, 2)
    assert (list(part.prefixes), list(part.constraints), part.beam_size) == (["b"], [["y"]], 2)
    part.verify(lines=1)
    assert list(request.lines(2, 5).prefixes) == ["c"] and list(request.lines(3, 5).constraints) == []


def test_sampling_settings_and_their_defaults():
    assert DecodeRequest().sampling(torch.device("cpu")) is None
    default = DecodeRequest(sample=True).sampling(torch.device("cpu"))
    assert (default.topk, default.topp, default.temperature, default.generator.initial_seed()) == (0, 1.0, 1.0, 1)
    given = DecodeRequest(sample=True, topk=5, topp=0.9, temperature=0.5, seed=7).sampling(torch.device("cpu"))
    assert (given.topk, given.topp, given.temperature, given.generator.initial_seed()) == (5, 0.9, 0.5, 7)


def test_the_smallest_temperature_draws_the_most_probable_token():
    """MIN_TEMPERATURE divides a log-prob of -0.5 to -4e37 and one of -5 past float32: without the row's
    best subtracted first, the second row's logits would all be -inf and its draw NaN; with it, each
    draw is the greedy choice, subnormals flushed (as after training) or not."""
    log_probs = torch.tensor([[-2.0, -0.5, -1.5, float("-inf")], [-30.0, -31.0, -29.5, -40.0]]).log_softmax(-1)
    torch.set_flush_denormal(True)  # what training does for the whole process
    for topk, topp in ((0, 1.0), (2, 1.0), (0, 0.5)):
        sampling = Sampling(torch.Generator().manual_seed(0), topk, topp, temperature=MIN_TEMPERATURE)
        assert sampling.draw(log_probs).tolist() == [1, 2]
    assert math.isfinite(float(Sampling(torch.Generator(), temperature=1e3).draw(log_probs).sum()))


def test_the_smallest_topp_draws_the_most_probable_token():
    """topp 1e-300 is in (0, 1] but 0 in float32: every token's mass before it (0 for the best) reached
    it, every logit was cut, and the draw failed on NaN (500 from the server, exit 70 from translate)."""
    log_probs = torch.tensor([[-2.0, -0.5, float("-inf"), -1.5], [-0.1, -3.0, -4.0, -5.0]]).log_softmax(-1)
    for topp in (1e-300, 1e-46, MIN_TEMPERATURE):
        assert Sampling(torch.Generator().manual_seed(0), topp=topp).draw(log_probs).tolist() == [1, 0]


def test_the_largest_temperature_draws_among_the_allowed_tokens():
    """MAX_TEMPERATURE, float32's largest: every allowed token's logit is then about 0 and the excluded
    ones (-inf) stay excluded; one step larger would divide -inf by inf, NaN, and no draw."""
    log_probs = torch.tensor([[-2.0, -0.5, float("-inf"), -1.5]]).log_softmax(-1).expand(400, -1)
    drawn = Sampling(torch.Generator().manual_seed(0), temperature=MAX_TEMPERATURE).draw(log_probs)
    assert set(drawn.tolist()) == {0, 1, 3}  # uniform over the allowed: all three drawn in 400 rows


def render_table() -> str:
    """The table of docs/decoding.md, from ``REFUSED``: ✓, or ✗ and the number of its line below."""
    number = {frozenset((a, b)): k for k, (a, b, _) in enumerate(REFUSED, 1)}
    name = {o: f"`{CLI[o]}`" if CLI[o].startswith("--") else CLI[o] for o in OPTIONS}
    rows = ["| | " + " | ".join(name[o] for o in OPTIONS) + " |", "|---" * (len(OPTIONS) + 1) + "|"]
    for a in OPTIONS:
        cells = ["" if a == b else f"✗ {number[frozenset((a, b))]}" if frozenset((a, b)) in number else "✓"
                 for b in OPTIONS]
        rows.append(f"| {name[a]} | " + " | ".join(cells) + " |")
    lines = [f"{k}. `{CLI[a]} with {CLI[b]}: {why}`" for k, (a, b, why) in enumerate(REFUSED, 1)]
    return "\n".join(rows) + "\n\n" + "\n".join(lines) + "\n"


def test_the_decoding_page_prints_the_table():
    assert render_table() in DOCS.read_text(encoding="utf-8"), render_table()
