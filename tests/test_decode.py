"""Greedy and beam search (§6.1, A11): hand-computed toy cases, brute force, invariances."""

from __future__ import annotations

import itertools
import math
from pathlib import Path

import pytest
import torch

from transformer.config import ModelConfig
from transformer.constraints import LexicalConstraints, PrefixConstraint, bank_order, borders, with_proposals
from transformer.decode import decode_ids, score_ids, translate_ids
from transformer.ensemble import Ensemble
from transformer.sampling import Sampling
from transformer.search import (Stopped, beam_hypotheses, beam_search, beam_step, greedy_hypotheses, greedy_search,
                                Hypothesis, keep_nbest, length_penalty, max_lengths, next_log_probs, row_topk)
from transformer.model import PositionsError, Transformer
from transformer.request import MIN_TEMPERATURE
from transformer.tokenizer import BOS_ID, EOS_ID, PAD_ID

A, B, C = 3, 4, 5  # ordinary tokens of the scripted model (2 is UNK)


@pytest.mark.parametrize("rows, vocab, k", [(16, 10000, 8), (40, 3456, 2), (20, 1237, 1), (64, 2000, 5),
                                             (3, 5000, 8)])
def test_row_topk_is_torch_topk(rows, vocab, k):
    """The search's two-stage top-k (chunk maxima first) gives torch.topk's values and ids: with the
    best values inside one chunk, in the last partial chunk, in masked rows and in a row at its length
    limit (one finite value); the last case runs the plain call (few rows)."""
    x = torch.randn(rows, vocab, generator=torch.Generator().manual_seed(vocab + k)) * 4
    x[0] = float("-inf")
    x[0, 1234 % vocab] = 0.0  # a row at its limit: EOS alone
    x[1, ::3] = float("-inf")  # tokens a constraint does not allow
    x[2, -7:] += 100.0  # the best values in the columns after the last whole chunk
    x[-1, 500:508] += 100.0  # the best values all in one chunk
    values, ids = row_topk(x, k)
    want_values, want_ids = x.topk(k, -1)
    assert torch.equal(values, want_values)
    finite = want_values > float("-inf")  # -inf ties may come in any order
    assert torch.equal(ids[finite], want_ids[finite])
    assert torch.equal(x.gather(1, ids), values)


class ScriptedCache:
    """The scripted model's whole state is the prefix decoded so far."""

    def __init__(self, rows: int):
        self.prefix = torch.zeros(rows, 0, dtype=torch.long)
        self.length = 0

    def reorder(self, index: torch.Tensor, sentences: torch.Tensor | None = None) -> None:
        self.prefix = self.prefix.index_select(0, index)


class ScriptedModel:
    """Next-token probabilities from a fixed table keyed by the tokens generated so far (no BOS)."""

    max_output_length = None  # no learned position table

    def __init__(self, table: dict[tuple[int, ...], dict[int, float]], default: dict[int, float] | None = None,
                 vocab: int = 6):
        self.table, self.default, self.vocab = table, default or {EOS_ID: 1.0}, vocab
        self.rows: list[int] = []  # batch rows of each decode_step: shows early stopping and pruning

    def logits(self, generated: tuple[int, ...]) -> torch.Tensor:
        probs = torch.zeros(self.vocab)
        for token, p in self.table.get(generated, self.default).items():
            probs[token] = p
        return probs.log()  # log 0 = -inf: that token is impossible

    def encode(self, src):
        return src, src != PAD_ID

    def init_cache(self, memory, src_mask, beam=1, max_len=1024):
        return ScriptedCache(memory.size(0) * beam)

    def decode_step(self, tokens, cache):
        self.rows.append(tokens.numel())
        cache.prefix = torch.cat([cache.prefix, tokens[:, None]], 1)
        cache.length += 1
        return torch.stack([self.logits(tuple(row[1:].tolist())) for row in cache.prefix])

    def __call__(self, src, tgt_in):
        return torch.stack([torch.stack([self.logits(tuple(row[1:t + 1].tolist())) for t in range(row.numel())])
                            for row in tgt_in])


SRC = torch.tensor([[C, EOS_ID]])  # the scripted model ignores its source; max_len = 2 + offset


def test_length_penalty_hand_values():
    assert length_penalty(1, 0.6) == 1.0  # ((5 + 1) / 6)^α
    assert length_penalty(7, 1.0) == 2.0
    assert math.isclose(length_penalty(3, 0.5), math.sqrt(8 / 6))
    assert torch.allclose(length_penalty(torch.tensor([1, 7]), 1.0), torch.tensor([1.0, 2.0]))
    assert length_penalty(7, 1.0, "length") == 7.0  # |Y|^α (fairseq, Hugging Face, CTranslate2)
    assert math.isclose(length_penalty(4, 0.5, "length"), 2.0)
    assert torch.allclose(length_penalty(torch.tensor([1, 9]), 0.5, "length"), torch.tensor([1.0, 3.0]))


def test_beam_step_hand_computed():
    # 2 beams with P(prefix) .6 and .4; columns PAD, EOS, 2, 3.
    log_probs = torch.tensor([[0, .5, .3, .2], [0, .1, .65, .25]]).log()
    scores = torch.tensor([[.6, .4]]).log()
    # joint: beam 0: EOS .30, 2 .18, 3 .12; beam 1: 2 .26, 3 .10, EOS .04 -> top 4: .30 .26 .18 .12
    tokens = torch.arange(4).repeat(2, 1)  # every token of each beam, as row_topk gives them for k = V
    alive, origin, token, fin_score, fin_origin = beam_step(log_probs, tokens, scores, length=3, alpha=1.0)
    assert torch.allclose(alive, torch.tensor([[.26, .18]]).log())
    assert origin.tolist() == [[1, 0]] and token.tolist() == [[2, 2]]
    # the finished candidates, best first: only beam 0's EOS is among the top 2 (beam 1's, .04, is not)
    assert torch.allclose(fin_score[:, 0], torch.tensor([math.log(.30) / (8 / 6)]))  # lp(3) = (5 + 3) / 6
    assert fin_origin[:, 0].tolist() == [0] and torch.isinf(fin_score[:, 1]).all()


def test_the_top_next_tokens_are_the_best_log_probs_with_exclusions():
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(3, 50, generator=g) * 3
    log_probs = logits.log_softmax(-1)
    allowed = torch.rand(3, 50, generator=g) > 0.3
    allowed[:, EOS_ID] = False  # row 2 is at its limit: EOS comes back there all the same
    values, tokens = row_topk(next_log_probs(logits.clone(), 4, torch.tensor([9, 6, 5]), allowed), 5)
    for row in range(2):  # the scores are the unmasked log-softmax; excluded tokens never appear
        ok = allowed[row].clone()
        ok[PAD_ID] = False
        expected = log_probs[row].masked_fill(~ok, float("-inf")).topk(5)
        assert torch.allclose(values[row], expected.values) and tokens[row].tolist() == expected.indices.tolist()
    assert tokens[2, 0] == EOS_ID and torch.isclose(values[2, 0], log_probs[2, EOS_ID])
    assert torch.isinf(values[2, 1:]).all()


def test_beam_beats_greedy():
    # Greedy: A (.5), C (.3), EOS -> [A, C], P = .15. Beam 2: step 0 keeps A .5, B .45; step 1's top 4
    # are BC .405 (from beam 1), AC .15, AA .14, AB .11 (no EOS); step 2 finishes [B, C] with .3645
    # and [A, C] with .09, and keeps ACA .06 and BCA .0405 alive: both below .3645, so it stops.
    model = ScriptedModel({(): {A: .5, B: .45, EOS_ID: .05}, (A,): {C: .3, A: .28, B: .22, EOS_ID: .2},
                           (B,): {C: .9, EOS_ID: .1}, (A, C): {EOS_ID: .6, A: .4}, (B, C): {EOS_ID: .9, A: .1}})
    assert greedy_search(model, SRC) == [[A, C]]
    model.rows.clear()
    assert beam_search(model, SRC, beam_size=2, alpha=0.0) == [[B, C]]
    assert model.rows == [2, 2, 2]  # early stop after step 2 with live beams left
    assert beam_search(model, SRC, beam_size=2, alpha=0.0, use_cache=False) == [[B, C]]


LENGTH_TABLE = {(): {EOS_ID: .3, A: .7}, (A,): {A: .6, EOS_ID: .4}, (A, A): {EOS_ID: .6, B: .4}}
# P: [] .3, [A] .28, [A, A] .252, [A, A, B] .168 (its EOS has probability 1)
# α = 0: the most probable, [], wins.
# α = 1: log P / ((5 + |Y|) / 6): [] -1.204 / 1, [A] -1.273 / (7/6) = -1.091,
#        [A, A] -1.378 / (8/6) = -1.034 (best), [A, A, B] -1.784 / (9/6) = -1.189


@pytest.mark.parametrize("beam_size", [2, 4])
def test_length_penalty_changes_the_winner(beam_size):
    model = ScriptedModel(LENGTH_TABLE)
    assert beam_search(model, SRC, beam_size, alpha=0.0, max_len_offset=3) == [[]]
    assert beam_search(model, SRC, beam_size, alpha=1.0, max_len_offset=3) == [[A, A]]


# length_norm "length", α = 1: log P / |Y|: [] -1.204 / 1, [A] -1.273 / 2, [A, A] -1.378 / 3 = -0.459,
# [A, A, B] -1.784 / 4 = -0.446 (best): dividing by |Y| favours the longest more than GNMT's lp does
@pytest.mark.parametrize("beam_size", [2, 4])
def test_length_normalisation_by_the_length_changes_the_winner(beam_size):
    model = ScriptedModel(LENGTH_TABLE)
    (best, *_), = beam_hypotheses(model, SRC, beam_size, alpha=1.0, max_len_offset=3, length_norm="length")
    assert best.tokens == [A, A, B] and math.isclose(best.score, math.log(.168) / 4, rel_tol=1e-5)
    assert beam_hypotheses(model, SRC, beam_size, alpha=0.0, max_len_offset=3, length_norm="length")[0][0].tokens == []


def test_length_counts_the_eos():
    # P([]) = .4, P([A]) = .6 * .46 = .276 (after A only EOS is possible: PAD is masked). With α = 2,
    # lp(1) = 1, lp(2) = (7/6)^2: [] scores -0.916, [A] -1.287 / 1.361 = -0.946, so [] wins. Were
    # |Y| to leave out the EOS, [A] would win: -1.287 / 1 > -0.916 / (5/6)^2 = -1.319.
    model = ScriptedModel({(): {EOS_ID: .4, A: .6}, (A,): {EOS_ID: .46, PAD_ID: .54}})
    assert beam_search(model, SRC, beam_size=2, alpha=2.0) == [[]]


def test_eos_outside_the_top_beam_is_not_finished():
    # Greedy takes A (.6) then EOS: [A] with .33. EOS (.4) is the 2nd candidate at step 0; with beam 1
    # it is outside the top beam, so it is not finished (DEVIATION from A11) and beam 1 = greedy.
    # With beam 2 it is inside, and [] (.4) beats [A] (.33).
    model = ScriptedModel({(): {A: .6, EOS_ID: .4}, (A,): {EOS_ID: .55, B: .45}})
    assert greedy_search(model, SRC) == [[A]]
    assert beam_search(model, SRC, beam_size=1, alpha=0.0) == [[A]]
    assert beam_search(model, SRC, beam_size=2, alpha=0.0) == [[]]


def test_top_early_stop_ends_when_the_best_candidate_ends():
    # α = 2. Step 0: EOS (.52) is the best candidate, so "top" stops with []: log .52 = -0.654.
    # "bound" goes on (alive A, -0.734, could still reach -0.734 / lp(max_len) = -0.008) and
    # finds [A]: log(.48 * .99) / (7/6)^2 = -0.547, better than [].
    model = ScriptedModel({(): {EOS_ID: .52, A: .48}, (A,): {EOS_ID: .99, B: .01}})
    assert beam_search(model, SRC, beam_size=2, alpha=2.0) == [[A]]
    model.rows.clear()
    assert beam_search(model, SRC, beam_size=2, alpha=2.0, early_stop="top") == [[]]
    assert model.rows == [2]
    with pytest.raises(ValueError, match="early_stop"):
        beam_search(model, SRC, early_stop="first")


def test_the_bound_stops_only_when_no_alive_hypothesis_can_win_at_the_length_limit():
    """The "bound" rule (§6.1's early stop, A11) divides the best alive score by lp at the length limit, the
    largest it can reach, not one short of it. α = 2, outputs of at most 3 tokens (EOS counted): after step 0,
    [] has log .58 = -0.545; alive A (log .42 = -0.868) could still reach -0.868 / lp(3) = -0.488, better,
    so the search goes on, and finds [A, B]: log(.42 * .99 * .99) / lp(3) = -0.499. Divided by lp(2), A's
    bound (-0.638) would have stopped the search with []."""
    model = ScriptedModel({(): {EOS_ID: .58, A: .42}, (A,): {B: .99, EOS_ID: .01}, (A, B): {EOS_ID: .99, C: .01}})
    assert beam_search(model, SRC, beam_size=2, alpha=2.0, max_len_offset=1) == [[A, B]]
    assert model.rows == [2, 2, 2]  # three steps: none was cut


def test_pad_is_never_generated():
    model = ScriptedModel({(): {PAD_ID: .9, A: .1}, (A,): {PAD_ID: .6, EOS_ID: .4}})
    assert greedy_search(model, SRC) == [[A]]
    assert beam_search(model, SRC, beam_size=3) == [[A]]


def test_length_limit_is_per_sentence_forces_eos_and_prunes():
    model = ScriptedModel({}, default={A: .99, EOS_ID: .01})
    src = torch.tensor([[C, EOS_ID, PAD_ID, PAD_ID], [C, C, C, EOS_ID]])
    # |Y| <= len(src) + 2 counting the forced EOS: 3 and 5 tokens before it
    assert greedy_search(model, src, max_len_offset=2) == [[A] * 3, [A] * 5]
    assert model.rows == [2, 2, 2, 2, 1, 1]  # the first sentence is pruned once it has finished
    assert greedy_search(model, src, max_len_offset=2, use_cache=False) == [[A] * 3, [A] * 5]
    model.rows.clear()
    # [] (.01) is finished first, but A^k at .99^k stays ahead of it until EOS is forced
    assert beam_search(model, src, beam_size=2, max_len_offset=2) == [[A] * 3, [A] * 5]
    assert model.rows == [4, 4, 4, 4, 2, 2]


def test_outputs_end_within_a_learned_position_table():
    """Table 3 row E: the output limit (input + 50) is cut to the learned table's rows, so a long input is
    decoded, not refused mid-search (it was: "sequence of 65 positions exceeds the learned position table")."""
    torch.manual_seed(0)
    cfg = ModelConfig(n_enc_layers=1, n_dec_layers=1, d_model=16, d_ff=32, n_heads=2, p_drop=0.0,
                      positional="learned", max_positions=12)
    model = Transformer(cfg, VOCAB).eval()
    with torch.no_grad():  # EOS's logit 0 among logits of hundreds: every output runs to its limit
        model.embed.weight.mul_(100)[EOS_ID] = 0
    src = pad([[5] * 9 + [EOS_ID], [6, EOS_ID]])
    assert max_lengths(src, 50, model.max_output_length).tolist() == [12, 12]
    assert max_lengths(src, 50).tolist() == [60, 52]
    for found in (greedy_search(model, src, max_len_offset=50), beam_search(model, src, beam_size=2, max_len_offset=50)):
        assert [len(y) for y in found] == [11, 11]  # 11 tokens and the forced EOS: 12 positions
    with pytest.raises(PositionsError, match="13 positions, more than the learned position table holds"):
        model.encode(pad([[5] * 12 + [EOS_ID]]))


# --- a small real Transformer ---------------------------------------------------------------------

VOCAB = 50


def make_model(seed: int, vocab: int = VOCAB, layers: int = 2, d_model: int = 32) -> Transformer:
    torch.manual_seed(seed)
    cfg = ModelConfig(n_enc_layers=layers, n_dec_layers=layers, d_model=d_model, d_ff=2 * d_model,
                      n_heads=4, p_drop=0.0)
    return Transformer(cfg, vocab).eval()


def random_sources(generator: torch.Generator, n: int, max_len: int = 6, vocab: int = 13) -> list[list[int]]:
    """Sources of 1..max_len tokens from 3..vocab-1, then EOS (a small alphabet: quick to learn)."""
    lengths = torch.randint(1, max_len + 1, (n,), generator=generator).tolist()
    return [torch.randint(3, vocab, (k,), generator=generator).tolist() + [EOS_ID] for k in lengths]


def pad(sources: list[list[int]]) -> torch.Tensor:
    src = torch.full((len(sources), max(map(len, sources))), PAD_ID)
    for i, s in enumerate(sources):
        src[i, : len(s)] = torch.tensor(s)
    return src


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """Tiny models gain nothing from intra-op threads, and on a shared, busy CPU they stall."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def train_copy(model: Transformer, steps: int, lr: float, max_len: int, vocab: int) -> Transformer:
    """A few Adam steps on copying random sources, so that outputs have structure and stop by themselves."""
    model.train()
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    g = torch.Generator().manual_seed(0)
    for _ in range(steps):
        src = pad(random_sources(g, 32, max_len, vocab))
        tgt = torch.cat([torch.full((32, 1), BOS_ID), src], 1)  # tgt_in = BOS + copy, tgt_out = copy
        logits = model(src, tgt[:, :-1])
        loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), tgt[:, 1:].flatten(), ignore_index=PAD_ID)
        opt.zero_grad()
        loss.backward()
        opt.step()
    return model.eval()


@pytest.fixture(scope="module")
def copy_model() -> Transformer:
    return train_copy(make_model(0), steps=100, lr=3e-3, max_len=6, vocab=13)


@pytest.fixture(scope="module")
def sources() -> list[list[int]]:
    return random_sources(torch.Generator().manual_seed(1), 5)


def test_copy_model_output_is_not_trivial(copy_model, sources):
    outputs = beam_search(copy_model, pad(sources))
    assert sum(out == src[:-1] for out, src in zip(outputs, sources)) >= 2


def test_cache_equals_no_cache(copy_model, sources):
    src = pad(sources)
    assert beam_search(copy_model, src, use_cache=False) == beam_search(copy_model, src)
    assert greedy_search(copy_model, src, use_cache=False) == greedy_search(copy_model, src)
    random_model = make_model(2)  # hits the length limit: exercises pruning at max_len as well
    assert (beam_search(random_model, src, max_len_offset=3, use_cache=False)
            == beam_search(random_model, src, max_len_offset=3))


def test_batch_equals_singles(copy_model, sources):
    batch = beam_search(copy_model, pad(sources[:3]), beam_size=3)
    assert batch == [beam_search(copy_model, pad([s]), beam_size=3)[0] for s in sources[:3]]


def test_padding_changes_nothing():
    model = make_model(3)  # untrained: it runs into the limit, which must not depend on the padding
    short, long = [5, 6, EOS_ID], [7, 8, 9, 10, 11, 12, EOS_ID]
    alone = beam_search(model, pad([short]), max_len_offset=3)[0]
    assert len(alone) == len(short) + 3 - 1  # the limit is reached: the test covers it
    assert beam_search(model, pad([short, long]), max_len_offset=3)[0] == alone
    assert beam_search(model, pad([long, short]), max_len_offset=3)[1] == alone
    assert greedy_search(model, pad([long, short]), max_len_offset=3)[1] == greedy_search(model, pad([short]), 3)[0]


def log_prob(model: Transformer, src: list[int], outputs: list[list[int]]) -> torch.Tensor:
    """log P(Y) for each Y = output + [EOS], by teacher forcing (independent of decode.py)."""
    tgt = pad([[BOS_ID] + out + [EOS_ID] for out in outputs])  # [N, T + 1]
    log_probs = model(torch.tensor([src] * len(outputs)), tgt[:, :-1]).log_softmax(-1)
    token_lp = log_probs.gather(-1, tgt[:, 1:, None]).squeeze(-1)
    return token_lp.masked_fill(tgt[:, 1:] == PAD_ID, 0.0).sum(1)


def penalised(model: Transformer, src: list[int], outputs: list[list[int]], alpha: float,
              norm: str = "gnmt") -> torch.Tensor:
    lengths = torch.tensor([len(out) + 1 for out in outputs], dtype=torch.float)
    return log_prob(model, src, outputs) / (lengths if norm == "length" else (5 + lengths) / 6) ** alpha


@pytest.fixture(scope="module")
def tiny_model() -> Transformer:
    """Vocabulary 5 (PAD, EOS and three tokens), trained a little so that the best output varies."""
    return train_copy(make_model(4, vocab=5, layers=1, d_model=16), steps=20, lr=1e-2, max_len=3, vocab=5)


@pytest.mark.parametrize("norm", ["gnmt", "length"])
@pytest.mark.parametrize("alpha", [0.0, 0.6, 2.0])
def test_large_beam_finds_the_exhaustive_best(tiny_model, alpha, norm):
    sources, vocab = [[3, EOS_ID], [4, 3, EOS_ID], [EOS_ID], [2, 2, 4, EOS_ID], [4, EOS_ID]], 5
    found = [hyps[0].tokens for hyps in beam_hypotheses(tiny_model, pad(sources), beam_size=27, alpha=alpha,
                                                          max_len_offset=1, length_norm=norm)]
    for src, out in zip(sources, found):
        max_len = len(src) + 1  # |Y| with EOS <= len(src) + 1: every output of up to max_len - 1 tokens
        every = [list(y) for k in range(max_len) for y in itertools.product(range(2, vocab), repeat=k)]
        scores = penalised(tiny_model, src, every, alpha, norm)
        assert out == every[int(scores.argmax())]
        assert torch.isclose(penalised(tiny_model, src, [out], alpha, norm)[0], scores.max())
    assert len({len(out) for out in found}) >= 2  # not always the empty output: the search is exercised


def test_beam_one_equals_greedy(copy_model, sources):
    """With α = 0 beam 1 is greedy search, token for token (on trained and random models)."""
    random_model = make_model(5)
    for model in (copy_model, random_model):
        for src in sources:
            src_t = torch.tensor([src])
            assert beam_search(model, src_t, beam_size=1, alpha=0.0, max_len_offset=5) == \
                greedy_search(model, src_t, max_len_offset=5)


def test_beam_one_with_penalty_is_the_best_stop_on_the_greedy_path(copy_model, sources):
    """With α > 0 beam 1 follows the greedy path but may stop at a later argmax-EOS whose penalised
    score is better (the GNMT penalty favours length); it returns the best such stop."""
    random_model = make_model(5)
    for model, alpha in [(copy_model, 0.6), (random_model, 0.6), (random_model, 1.5)]:
        for src in sources[:3]:
            max_len = len(src) + 5  # max_len_offset 5
            path, stops = [], []
            while len(path) + 1 < max_len:  # at len(path) + 1 == max_len, EOS is forced
                lp = model(torch.tensor([src]), torch.tensor([[BOS_ID] + path]))[0, -1].log_softmax(-1)
                lp[PAD_ID] = float("-inf")
                if lp.argmax() == EOS_ID:
                    stops.append(list(path))
                lp[EOS_ID] = float("-inf")
                path.append(int(lp.argmax()))
            stops.append(path)
            scores = penalised(model, src, stops, alpha)
            out = beam_search(model, torch.tensor([src]), beam_size=1, alpha=alpha, max_len_offset=5)[0]
            assert out in stops
            # early stopping may end before a later, better stop could be reached only if no
            # continuation can beat the best finished one, so the result is the best stop seen
            assert penalised(model, src, [out], alpha)[0] >= scores[: stops.index(out) + 1].max() - 1e-5



def test_beam_one_decodes_an_input_alike_whatever_else_in_its_batch_has_a_prefix_or_constraints():
    """At beam 1 an input without a prefix or constraints is greedy search and one with them beam search
    (which, with α > 0, looks past greedy's first EOS): chosen per input, so the second input's output is
    the same alone, in a batch with a prefix and in a batch with constraints (here greedy's [] against
    beam 1's [A, A, A, A], a better penalised score)."""
    class Model(ScriptedModel):
        vocab_size = 6

        def parameters(self):
            yield torch.zeros(1)

    after_a = {A: 0.99, EOS_ID: 0.01}
    table = {(): {EOS_ID: 0.5, A: 0.48, B: 0.02}, (A,): after_a, (A, A): after_a, (A, A, A): after_a,
             (A, A, A, A): {EOS_ID: 1.0}}
    sources = [[C, C, C, C, C, EOS_ID]] * 2
    alone = decode_ids(Model(table), sources, beam_size=1, alpha=0.6, max_len_offset=5)
    assert [hyps[0].tokens for hyps in alone] == [[], []]
    for given in ({"prefixes": [[B], []]}, {"constraints": [[[B]], []]}):
        lists = decode_ids(Model(table), sources, beam_size=1, alpha=0.6, max_len_offset=5, **given)
        assert lists[1] == alone[1], given
        assert lists[0][0].tokens[0] == B, given  # the first input's own prefix or constraint took effect


def test_outputs_respect_the_limit_and_never_hold_special_tokens(sources):
    model = make_model(6)
    src = pad(sources)
    for outputs in (beam_search(model, src, max_len_offset=2), greedy_search(model, src, max_len_offset=2)):
        limits = [len(s) + 2 - 1 for s in sources]
        assert all(len(out) <= limit for out, limit in zip(outputs, limits))
        assert any(len(out) == limit for out, limit in zip(outputs, limits))
        assert not any({PAD_ID, EOS_ID} & set(out) for out in outputs)


@pytest.mark.parametrize("beam_size", [1, 3])
def test_translate_ids_keeps_order_and_every_input(copy_model, sources, beam_size):
    inputs = [sources[0], [EOS_ID], *sources[1:]]
    outputs = translate_ids(copy_model, inputs, beam_size, 0.6, 10, batch_size=2)
    assert len(outputs) == len(inputs)
    search = greedy_search if beam_size == 1 else lambda m, s, o: beam_search(m, s, beam_size, 0.6, o)
    assert outputs == [search(copy_model, torch.tensor([s]), 10)[0] for s in inputs]
    with pytest.raises(ValueError):
        translate_ids(copy_model, [[5, EOS_ID], []], beam_size, 0.6, 10, 2)


# --- after the paper: n-best lists, forced scoring, prefixes, sampling (all on the one search) ---


@pytest.mark.parametrize("alpha", [0.0, 0.6])
def test_nbest_of_a_large_beam_is_the_exhaustive_top_k(tiny_model, alpha):
    """With a beam larger than every prefix set, the n-best list is the k best outputs of all, in order,
    with their scores; its first is the plain output."""
    sources, vocab = [[3, EOS_ID], [4, 3, EOS_ID], [4, EOS_ID]], 5
    lists = beam_hypotheses(tiny_model, pad(sources), beam_size=27, alpha=alpha, max_len_offset=1, nbest=5)
    plain = beam_search(tiny_model, pad(sources), beam_size=27, alpha=alpha, max_len_offset=1)
    for src, hyps, out in zip(sources, lists, plain):
        every = [list(y) for k in range(len(src) + 1) for y in itertools.product(range(2, vocab), repeat=k)]
        scores = penalised(tiny_model, src, every, alpha)
        best = scores.topk(5)
        assert [h.tokens for h in hyps] == [every[i] for i in best.indices.tolist()]
        assert torch.allclose(torch.tensor([h.score for h in hyps]), best.values, atol=1e-5)
        assert hyps[0].tokens == out


def test_nbest_first_is_the_plain_output_and_scores_are_the_forced_scores(copy_model, sources):
    src = pad(sources)
    for beam in (2, 4):
        plain = beam_search(copy_model, src, beam_size=beam, alpha=0.6)
        lists = beam_hypotheses(copy_model, src, beam_size=beam, alpha=0.6, nbest=beam)
        assert [hyps[0].tokens for hyps in lists] == plain
        for s, hyps in zip(sources, lists):
            assert len(hyps) == beam and len({tuple(h.tokens) for h in hyps}) == beam  # distinct
            assert all(a.score >= b.score for a, b in zip(hyps, hyps[1:]))  # sorted
            forced = score_ids(copy_model, [s] * len(hyps), [h.tokens for h in hyps], alpha=0.6)
            assert max(abs(f.score - h.score) for f, h in zip(forced, hyps)) < 1e-4
    with pytest.raises(ValueError, match="nbest"):
        beam_hypotheses(copy_model, src, beam_size=2, nbest=3)



def test_an_nbest_list_under_the_top_rule_may_start_with_a_better_hypothesis():
    """What docs/decoding.md says of --early-stop top: the plain search stops at step 0, where EOS is the step's
    best candidate ([] scored log .4); the 2-best list must hold two, runs a step more and finds [A], better
    under α 2 (log .39 / lp(2)), which goes first. The exact bound keeps its promise on the same model."""
    m = {(): {EOS_ID: .4, A: .39, B: .21}, (A,): {EOS_ID: 1.0}, (B,): {EOS_ID: 1.0}}
    search = dict(beam_size=2, alpha=2.0)
    plain = beam_hypotheses(ScriptedModel(m), SRC, early_stop="top", **search)[0][0]
    listed = beam_hypotheses(ScriptedModel(m), SRC, early_stop="top", nbest=2, **search)[0]
    assert plain.tokens == [] and [h.tokens for h in listed] == [[A], []] and listed[0].score > plain.score
    bound = beam_hypotheses(ScriptedModel(m), SRC, nbest=2, **search)[0]
    assert bound[0] == beam_hypotheses(ScriptedModel(m), SRC, **search)[0][0]

@pytest.mark.parametrize("beam_size", [1, 4])
def test_length_normalisation_reaches_every_score(copy_model, sources, beam_size):
    """decode_ids' length_norm reaches greedy and beam search alike, and forced scoring gives their
    outputs the same scores: log P / |Y|^α; the paper's lp gives others."""
    lists = decode_ids(copy_model, sources, beam_size, alpha=1.0, length_norm="length", nbest=beam_size)
    for s, hyps in zip(sources, lists):
        forced = score_ids(copy_model, [s] * len(hyps), [h.tokens for h in hyps], alpha=1.0, length_norm="length")
        assert max(abs(f.score - h.score) for f, h in zip(forced, hyps)) < 1e-4
        assert all(abs(f.score - f.log_prob / (len(h.tokens) + 1)) < 1e-6 for f, h in zip(forced, hyps))
    gnmt = decode_ids(copy_model, sources, beam_size, alpha=1.0, nbest=beam_size)
    assert [h.score for hyps in gnmt for h in hyps] != [h.score for hyps in lists for h in hyps]


def test_score_is_the_teacher_forced_log_probability(copy_model, sources):
    """score_ids against log P(Y) computed by log_prob (a plain full forward, no decode.py), batched
    by a small token budget and across unequal lengths, in input order."""
    targets = [s[:-1][::-1] for s in sources] + [[]]  # reversed copies, and an empty output
    srcs = sources + [sources[0]]
    got = score_ids(copy_model, srcs, targets, alpha=0.6, max_tokens=7)
    for src, tgt, r in zip(srcs, targets, got):
        expected = log_prob(copy_model, src, [tgt])[0].detach()
        assert abs(r.log_prob - expected.item()) < 1e-4 and len(r.token_log_probs) == len(tgt) + 1
        assert abs(r.score - r.log_prob / ((5 + len(tgt) + 1) / 6) ** 0.6) < 1e-6
    with pytest.raises(ValueError, match="targets"):
        score_ids(copy_model, srcs, targets[:-1])


def test_a_prefix_is_forced_and_the_search_goes_on_from_it():
    # Unforced, the beam takes A then ends: [A] (.6 * .9). Forced to start with B, the best
    # continuation of B is C (.7) then EOS: [B, C]; the scores stay the model's own.
    model = ScriptedModel({(): {A: .6, B: .4}, (A,): {EOS_ID: .9, C: .1}, (B,): {C: .7, A: .3},
                           (B, C): {EOS_ID: 1.0}, (B, A): {EOS_ID: 1.0}})
    assert beam_search(model, SRC, beam_size=2, alpha=0.0) == [[A]]
    hyps = beam_hypotheses(model, SRC, beam_size=2, alpha=0.0, nbest=2,
                           constraint=PrefixConstraint([[B]], model.vocab))[0]
    assert [h.tokens for h in hyps] == [[B, C], [B, A]]
    assert math.isclose(hyps[0].score, math.log(.4 * .7), rel_tol=1e-5)
    assert math.isclose(hyps[1].score, math.log(.4 * .3), rel_tol=1e-5)


def test_prefixes_through_decode_ids_start_every_output(copy_model, sources):
    prefixes = [[7, 8], [], [9], [7, 8, 9, 10], [11]]
    lists = decode_ids(copy_model, sources, beam_size=3, alpha=0.6, max_len_offset=10, batch_size=2, nbest=3,
                       prefixes=prefixes)
    for prefix, hyps, src in zip(prefixes, lists, sources):
        assert all(h.tokens[: len(prefix)] == prefix for h in hyps)
        if not prefix:  # no prefix: the plain search
            assert hyps[0].tokens == beam_search(copy_model, torch.tensor([src]), 3, 0.6, 10)[0]
    with pytest.raises(ValueError, match="prefix"):
        decode_ids(copy_model, [[5, EOS_ID]], 2, 0.6, 2, prefixes=[[5, 5, 5, 5]])  # |Y| <= 2 + 2, EOS included


def test_prefixes_and_constraints_together_are_both_kept(copy_model, sources):
    """A prefix wraps the lexical constraints, it does not replace them (both asked of one batch)."""
    prefixes = [[7, 8], [], [9], [], [11]]
    phrases = [[[10]], [[9, 10]], [], [[12]], [[3], [4]]]
    lists = decode_ids(copy_model, sources, beam_size=4, alpha=0.6, max_len_offset=10, batch_size=5, nbest=2,
                       prefixes=prefixes, constraints=phrases)
    for prefix, ps, hyps in zip(prefixes, phrases, lists):
        assert all(h.tokens[: len(prefix)] == prefix for h in hyps), (prefix, hyps)
        assert all(contains(h.tokens, p) for h in hyps for p in ps), (ps, hyps)


def test_sampling_repeats_with_its_seed_and_top_k_one_is_greedy(copy_model, sources):
    random_model = make_model(7)  # flat distributions: draws differ
    src = pad(sources)

    def draw(model, seed, **kw):
        return greedy_hypotheses(model, src, 10, 0.6, sampling=Sampling(torch.Generator().manual_seed(seed), **kw))

    assert draw(random_model, 1) == draw(random_model, 1)
    assert [h.tokens for h in draw(random_model, 1)] != [h.tokens for h in draw(random_model, 2)]
    assert [h.tokens for h in draw(random_model, 3, topk=1)] == greedy_search(random_model, src, 10)
    assert [h.tokens for h in draw(random_model, 3, topp=1e-6)] == greedy_search(random_model, src, 10)
    drawn = draw(random_model, 4, temperature=0.7)
    forced = score_ids(random_model, sources, [h.tokens for h in drawn], alpha=0.6)
    assert max(abs(f.score - h.score) for f, h in zip(forced, drawn)) < 1e-4  # the model's own scores


def test_top_k_and_top_p_keep_only_their_tokens():
    log_probs = torch.tensor([[.5, .3, .15, .05]]).log().repeat(2000, 1)
    for kw, allowed in [({"topk": 2}, {0, 1}), ({"topp": 0.7}, {0, 1}), ({"topp": 0.81}, {0, 1, 2}),
                        ({"topk": 3, "topp": 0.5}, {0})]:
        drawn = Sampling(torch.Generator().manual_seed(0), **kw).draw(log_probs)
        assert set(drawn.tolist()) == allowed, kw
    # temperature: a low one concentrates the draws on the best token
    cold = Sampling(torch.Generator().manual_seed(0), temperature=0.1).draw(log_probs)
    assert (cold == 0).float().mean() > 0.95


def test_sampling_nbest_draws_per_input(sources):
    random_model = make_model(8)
    lists = decode_ids(random_model, sources, batch_size=2, nbest=3, sampling=Sampling(torch.Generator().manual_seed(5)))
    assert all(len(hyps) == 3 and all(a.score >= b.score for a, b in zip(hyps, hyps[1:])) for hyps in lists)
    assert any(len({tuple(h.tokens) for h in hyps}) > 1 for hyps in lists)
    assert lists == decode_ids(random_model, sources, batch_size=2, nbest=3,
                               sampling=Sampling(torch.Generator().manual_seed(5)))


def test_an_ensemble_of_a_model_with_itself_is_the_model(copy_model, sources):
    src = pad(sources)
    pair = Ensemble([copy_model, copy_model])
    assert beam_search(pair, src, beam_size=3) == beam_search(copy_model, src, beam_size=3)
    assert greedy_search(pair, src) == greedy_search(copy_model, src)
    alone = beam_hypotheses(copy_model, src, beam_size=3, nbest=2)
    together = beam_hypotheses(pair, src, beam_size=3, nbest=2)
    assert all(abs(a.score - b.score) < 1e-5 for x, y in zip(alone, together) for a, b in zip(x, y))


def test_an_ensemble_averages_the_probabilities(copy_model, sources):
    other = train_copy(make_model(9), steps=30, lr=3e-3, max_len=6, vocab=13)  # another model of the same data
    src, pair = pad(sources), Ensemble([copy_model, other])
    tgt_in = torch.cat([torch.full((len(sources), 1), BOS_ID), src[:, :3]], 1)
    with torch.inference_mode():
        mean = (copy_model(src, tgt_in).softmax(-1) + other(src, tgt_in).softmax(-1)) / 2
        assert torch.allclose(pair(src, tgt_in), mean.log(), atol=1e-5)
        # the cached steps: the same means, one position at a time
        cache = pair.init_cache(*pair.encode(src))
        for t in range(tgt_in.size(1)):
            assert torch.allclose(pair.decode_step(tgt_in[:, t], cache), mean[:, t].log(), atol=1e-5)
    outputs = [beam_search(m, src, beam_size=3) for m in (copy_model, other, pair)]
    assert outputs[2] != outputs[0] and outputs[2] != outputs[1]


def test_an_ensemble_ends_within_its_shortest_learned_position_table():
    """An ensemble decodes only as far as every one of its models can: the shortest learned position table
    bounds it (the longest would run the other model past its table mid-search); a sinusoidal model, no
    table, bounds nothing."""
    def model(positional: str, rows: int = 1024) -> Transformer:
        cfg = ModelConfig(n_enc_layers=1, n_dec_layers=1, d_model=16, d_ff=32, n_heads=2, p_drop=0.0,
                          positional=positional, max_positions=rows)
        return Transformer(cfg, VOCAB).eval()

    short, long, free = model("learned", 12), model("learned", 20), model("sinusoidal")
    assert (short.max_output_length, long.max_output_length, free.max_output_length) == (12, 20, None)
    assert Ensemble([long, short]).max_output_length == 12
    assert Ensemble([free, long]).max_output_length == 20
    assert Ensemble([free, free]).max_output_length is None


def contains(tokens: list[int], phrase: list[int]) -> bool:
    return any(tokens[i: i + len(phrase)] == phrase for i in range(len(tokens) - len(phrase) + 1))


def test_bank_order_takes_the_best_of_every_bank_in_turn():
    total = torch.tensor([[-1.0, -2.0, -3.0, -4.0, -5.0, float("-inf")]])
    banks = torch.tensor([[0, 0, 1, 0, 2, 2]])
    # round 1: bank 2's best (-5), bank 1's (-3), bank 0's (-1); round 2: bank 0's second (-2); then -4; -inf last
    assert bank_order(total, banks).tolist() == [[4, 2, 0, 1, 3, 5]]


def test_bank_order_keeps_first_what_meets_every_constraint_and_plain_search_keeps():
    """Candidates that met every constraint (bank 2, complete) and that plain beam search would keep (the 3
    best) go first, best first; the rest in turn by bank. With one place per bank, the complete -1.1 lost to
    its sibling -1.0 and the places went to -5 and -6 of emptier banks."""
    total = torch.tensor([[-1.0, -1.1, -5.0, -6.0, -1.2, -7.0]])
    banks = torch.tensor([[2, 2, 1, 0, 2, 0]])
    complete, none = banks == 2, torch.zeros_like(banks, dtype=torch.bool)
    assert bank_order(total, banks).tolist() == [[0, 2, 3, 1, 5, 4]]  # Post & Vilar's order: -1.1 comes 4th
    assert bank_order(total, banks, complete, none, beam=3).tolist() == [[0, 1, 4, 2, 3, 5]]
    assert bank_order(total, banks, complete, none, beam=2).tolist() == [[0, 1, 2, 3, 5, 4]]  # -1.2: not in plain's 2
    # -1.0 is EOS: plain search of beam 2 finishes it and keeps the 2 best others alive, -1.2 among them
    assert bank_order(total, banks, complete, none.index_fill(1, torch.tensor([0]), True), beam=2).tolist() == [
        [0, 1, 4, 2, 3, 5]]


def test_a_constraint_the_best_output_already_meets_leaves_it(tmp_path):
    """The reference model's "Ein Hund rennt." holds "rennt": with it as a constraint the search returned
    "Ein Hund rennt mit einem Hund." (-4.10 against -2.23), having dropped the better output for want of
    places in its bank."""
    from transformer.request import DecodeRequest
    from transformer.translator import Translator

    translator = Translator(Path(__file__).parent / "data" / "decode_reference", log=lambda m: None)
    plain = translator.decode(["A dog runs."], DecodeRequest())
    assert plain[0][0][0] == "Ein Hund rennt."
    assert translator.decode(["A dog runs."], DecodeRequest(constraints=[["rennt"]])) == plain


def test_a_constraint_is_written_although_it_scores_lower():
    # Unconstrained: [A] (.6 * .9). With the constraint [C]: the beam keeps the hypothesis that has
    # met C (bank 1) beside the better-scoring ones (bank 0), and EOS waits for the constraint: [A, C]
    # (.6 * .1 * 1.0) beats [B, C] (.4 * .05 * 1.0); [C] alone (P 0) is impossible.
    model = ScriptedModel({(): {A: .6, B: .4}, (A,): {EOS_ID: .9, C: .1}, (B,): {B: .95, C: .05},
                           (A, C): {EOS_ID: 1.0}, (B, C): {EOS_ID: 1.0}, (B, B): {EOS_ID: 1.0}})
    assert beam_search(model, SRC, beam_size=2, alpha=0.0) == [[A]]
    out = beam_hypotheses(model, SRC, beam_size=2, alpha=0.0, constraint=LexicalConstraints([[[C]]], model.vocab))
    assert [h.tokens for h in out[0]] == [[A, C]] and math.isclose(out[0][0].score, math.log(.06), rel_tol=1e-5)



def test_borders_are_every_failure_link_of_each_phrase():
    """[i, p, j, m]: the phrase's first m tokens end its first j, against the definition written out."""
    g = torch.Generator().manual_seed(0)
    for length in range(1, 8):
        table = torch.randint(3, 5, (3, 2, length), generator=g)  # two tokens: many repeats
        table[1, 1, int(torch.randint(0, length, (1,), generator=g)):] = -1  # a shorter phrase, padded
        found = borders(table)
        for i, p, j in itertools.product(range(3), range(2), range(length)):
            phrase = table[i, p].tolist()
            assert found[i, p, j].tolist() == [m <= j and phrase[j - m:j] == phrase[:m] for m in range(length)]


@pytest.mark.parametrize("phrase, written, held", [
    ([A, A, B], [A, A, A, B], True),  # "a a" left by the third a: "a a" is still the end of what was written
    ([A, B, A, C], [A, B, A, B, A, C], True),
    ([A, A, B], [A, B, A, A, A, A, B], True),
    ([A, B], [A, A, B], True),
    ([A, B, A, C], [A, B, A, B, A, B], False),
    ([A, A, B], [A, A, C, A, B], False),  # left for good: no part of it ends "a a c"
])
def test_a_phrase_is_met_where_a_partial_match_restarts_inside_it(phrase, written, held):
    lexical = LexicalConstraints([[phrase]], 6)
    lexical.begin(SRC, 1, torch.tensor([20]))
    for token in written:
        lexical.advance(torch.tensor([0]), torch.tensor([token]))
    assert bool(lexical.complete()[0]) is held


def test_a_phrase_is_met_wherever_the_output_holds_it_whole():
    """One phrase tracked at a time: "b d" written inside "a b c"'s progress ("a b d") was never counted, EOS stayed
    refused, and the search returned a longer, worse output that wrote it again. Now every phrase counts where the
    output holds it in one piece, on random phrases and outputs, as a plain substring test says."""
    lexical = LexicalConstraints([[[A, B, C], [B, 6]]], 7)
    lexical.begin(SRC, 1, torch.tensor([20]))
    for token in (A, B, 6):
        lexical.advance(torch.tensor([0]), torch.tensor([token]))
    assert lexical.done[0].tolist() == [False, True] and not lexical.allowed()[0, EOS_ID]
    g = torch.Generator().manual_seed(0)
    for _ in range(300):
        phrases = [torch.randint(3, 6, (int(torch.randint(1, 4, (1,), generator=g)),), generator=g).tolist()
                   for _ in range(int(torch.randint(1, 4, (1,), generator=g)))]
        written = torch.randint(3, 6, (int(torch.randint(0, 10, (1,), generator=g)),), generator=g).tolist()
        lexical = LexicalConstraints([phrases], 7)
        lexical.begin(SRC, 1, torch.tensor([40]))
        for token in written:
            lexical.advance(torch.tensor([0]), torch.tensor([token]))
        held = [any(written[i:i + len(p)] == p for i in range(len(written) - len(p) + 1)) for p in phrases]
        assert lexical.done[0, :len(phrases)].tolist() == held, (phrases, written)


def test_outputs_that_miss_a_constraint_rank_by_their_own_scores():
    """Their keys were score - 1e6 in float32, which rounds to 1/16 there: -3.01 and -3.02 tied, and the better one,
    come later, did not enter a full list."""
    from transformer.search import rank_keys

    class Missing:  # no row has met its constraints
        def complete(self):
            return torch.zeros(2, dtype=torch.bool)

    keys, scores, _ = rank_keys(torch.tensor([[-3.02, -3.01]]), torch.tensor([[0, 1]]), Missing(), 2)
    assert keys[0, 0] > keys[0, 1] and scores[0].tolist() == pytest.approx([-3.01, -3.02])


def test_eos_waits_until_every_phrase_is_written():
    """Lexical constraints allow EOS only once every phrase is written, and no other token is refused: an EOS
    allowed before would let outputs that miss a phrase end early, and when no output holds them all those
    would be returned instead of the ones the search forced to its length limit. (Where some output holds
    them, the ranking hides the difference, so the searches above cannot tell.)"""
    lexical = LexicalConstraints([[[A, B], [C]]], 6)
    lexical.begin(SRC, 1, torch.tensor([20]))
    eos_allowed = [bool(lexical.allowed()[0, EOS_ID])]
    for token in (A, B, C):
        lexical.advance(torch.tensor([0]), torch.tensor([token]))
        eos_allowed.append(bool(lexical.allowed()[0, EOS_ID]))
        assert lexical.allowed()[0, [t for t in range(6) if t != EOS_ID]].all()
    assert eos_allowed == [False, False, False, True]


def test_an_output_that_holds_its_constraint_after_a_false_start_is_found():
    """The unconstrained best, [A A A B], holds the phrase [A A B]: the constrained search finds it first
    (before, the phrase counted as left at the third A, EOS waited for it, and [A A B] came out)."""
    table = {(): {A: .9, B: .1}, (A,): {A: .9, B: .1}, (A, A): {A: .9, B: .1}, (A, A, A): {B: .9, EOS_ID: .1},
             (A, A, A, B): {EOS_ID: 1.0}}
    for beam in (2, 4):
        free = beam_hypotheses(ScriptedModel(table), SRC, beam_size=beam, alpha=0.0)[0][0]
        held = beam_hypotheses(ScriptedModel(table), SRC, beam_size=beam, alpha=0.0,
                               constraint=LexicalConstraints([[[A, A, B]]], 6))[0][0]
        assert free.tokens == held.tokens == [A, A, A, B] and held.score == free.score

def test_every_constraint_appears_in_every_output(copy_model, sources):
    g = torch.Generator().manual_seed(3)
    phrases = [[torch.randint(3, 13, (int(torch.randint(1, 3, (1,), generator=g)),), generator=g).tolist()
                for _ in range(int(torch.randint(0, 3, (1,), generator=g)))] for _ in sources]
    phrases[0] = [[7, 8], [7, 9]]  # two phrases that start alike
    lists = decode_ids(copy_model, sources, beam_size=4, alpha=0.6, max_len_offset=10, batch_size=2, nbest=2,
                       constraints=phrases)
    for ps, hyps, src in zip(phrases, lists, sources):
        assert all(contains(h.tokens, p) for h in hyps for p in ps), (ps, hyps)
        forced = score_ids(copy_model, [src] * len(hyps), [h.tokens for h in hyps], alpha=0.6)
        assert max(abs(f.score - h.score) for f, h in zip(forced, hyps)) < 1e-4  # the model's own scores
        if not ps:
            assert hyps[0].tokens == beam_search(copy_model, torch.tensor([src]), 4, 0.6, 10)[0]
    with pytest.raises(ValueError, match="do not fit"):
        decode_ids(copy_model, [[5, EOS_ID]], 4, 0.6, 2, constraints=[[[5, 6], [7, 8]]])


def test_row_topk_finds_a_best_value_in_a_last_chunk_of_one_column():
    """A vocabulary one column longer than a multiple of the chunk: that last column is a chunk of its own,
    searched as every partial chunk is; the token with the largest id can win."""
    x = torch.randn(16, 801, generator=torch.Generator().manual_seed(0))
    x[:, -1] = 100.0
    values, ids = row_topk(x, 2)
    assert ids[:, 0].tolist() == [800] * 16 and torch.equal(values, x.topk(2, -1).values)


def test_an_nbest_tie_keeps_the_earlier_hypothesis_first():
    """keep_nbest: a hypothesis scoring as one already in the list goes after it, so that of two equal scores
    the one found first (the shorter) stays the 1-best; a list cut to nbest drops the later one."""
    found = []
    assert keep_nbest(found, -1.0, Hypothesis([A], -1.0), 2) == float("-inf")
    assert keep_nbest(found, -1.0, Hypothesis([B, B], -1.0), 2) == -1.0
    assert [h.tokens for _, h in found] == [[A], [B, B]]
    assert keep_nbest(found, -1.0, Hypothesis([C], -1.0), 2) == -1.0
    assert [h.tokens for _, h in found] == [[A], [B, B]]


def test_an_nbest_list_with_a_complete_hypothesis_drops_those_that_miss_a_constraint():
    """Under lexical constraints an output that misses one (EOS forced at the length limit) is returned only when
    no output holds them all: with [C] found, the forced [A], as likely, is left out of the 2-best list."""
    table = {(): {A: .5, C: .5}, (A,): {A: .5, EOS_ID: .5}, (C,): {EOS_ID: 1.0}}
    lists = beam_hypotheses(ScriptedModel(table), SRC, beam_size=2, alpha=0.0, max_len_offset=0, nbest=2,
                            constraint=LexicalConstraints([[[C]]], 6))
    assert [h.tokens for h in lists[0]] == [[C]]
    alone = beam_hypotheses(ScriptedModel(table), SRC, beam_size=2, alpha=0.0, max_len_offset=0, nbest=2,
                            constraint=LexicalConstraints([[[B]]], 6))  # no output can hold [B]
    assert sorted(h.tokens for h in alone[0]) == [[A], [C]]


def test_a_prefix_keeps_the_rules_of_the_constraints_it_wraps():
    """Past its prefix a row may write what the wrapped constraint allows, not anything: with a lexical
    constraint inside, EOS waits for the phrase. Were the inner rule dropped, an output with a prefix could end
    before its terminology is written, and where no output holds it that one would be returned."""
    prefixed = PrefixConstraint([[A]], 6, inner=LexicalConstraints([[[C]]], 6))
    prefixed.begin(SRC, 1, torch.tensor([20]))
    assert prefixed.allowed()[0].nonzero().flatten().tolist() == [A]
    prefixed.advance(torch.tensor([0]), torch.tensor([A]))
    assert not prefixed.allowed()[0, EOS_ID] and prefixed.allowed()[0, [0, 2, 3, 4, 5]].all()
    prefixed.advance(torch.tensor([0]), torch.tensor([C]))
    assert prefixed.allowed()[0].all()


def test_lexical_candidates_are_only_the_tokens_that_advance_an_unwritten_phrase():
    """candidates(): the next token of the phrase in progress (-1 when none is) and the first token of each
    phrase not yet written (-1 once written). A written phrase proposing its first token again, or a row with no
    phrase in progress proposing one, spends the beam on candidates that meet nothing."""
    lexical = LexicalConstraints([[[A, B], [C]]], 6)
    lexical.begin(SRC, 1, torch.tensor([20]))
    assert lexical.candidates().tolist() == [[-1, A, C]]
    lexical.advance(torch.tensor([0]), torch.tensor([A]))
    assert lexical.candidates().tolist() == [[B, A, C]]
    lexical.advance(torch.tensor([0]), torch.tensor([B]))
    assert lexical.candidates().tolist() == [[-1, -1, C]]
    lexical.advance(torch.tensor([0]), torch.tensor([C]))
    assert lexical.candidates().tolist() == [[-1, -1, -1]]


def test_with_proposals_counts_no_candidate_twice():
    """A proposal already among the row's best, proposed a second time, or absent (-1) gets -inf; a new one keeps
    its log-prob. A candidate counted twice would fill two beam places with one hypothesis; -1 must not become
    a draw of token 0 with that token's log-prob."""
    log_probs = torch.tensor([[-0.5, -1.0, -2.0, -3.0, -4.0, -5.0]])
    values, tokens = with_proposals(log_probs, log_probs.topk(2, -1), torch.tensor([[1, 4, 4, -1, 5]]))
    inf = float("-inf")
    assert values.tolist() == [[-0.5, -1.0, inf, -4.0, inf, inf, -5.0]]
    assert tokens.tolist() == [[0, 1, 1, 4, 4, 0, 5]]


def test_bank_order_keeps_equal_scores_in_candidate_order():
    """Ties within a bank keep the candidates' order (row, then rank within the row), as a stable sort does: the
    beam a tie leaves is then the one the plain search keeps, not whatever order an unstable sort returns."""
    total = torch.zeros(1, 40)
    total[0, ::3] = -1.0
    order = bank_order(total, torch.zeros(1, 40, dtype=torch.long))
    assert order.tolist() == [[i for i in range(40) if i % 3] + list(range(0, 40, 3))]


def test_sampling_at_the_lowest_temperature_a_request_allows_is_greedy():
    """request.MIN_TEMPERATURE is float32's smallest normal number: divided by it, any log-prob below about -4
    overflows to -inf, so unless the row's best log-prob is subtracted first every token is -inf and the draw
    fails. At that temperature sampling is the greedy choice."""
    log_probs = (torch.randn(4, 2000, generator=torch.Generator().manual_seed(0)) * 0.5).log_softmax(-1)
    assert (log_probs.max(-1).values < -5).all()  # past float32's range once divided
    drawn = Sampling(torch.Generator().manual_seed(0), temperature=MIN_TEMPERATURE).draw(log_probs)
    assert torch.equal(drawn, log_probs.argmax(-1))


def test_top_p_keeps_the_smallest_set_that_reaches_it_exactly():
    """topp: the most probable tokens up to the first whose running total reaches topp, a total equal to topp
    included (probabilities that are exact in float32): 0.5 + 0.25 reaches 0.75, so the third token is cut."""
    log_probs = torch.tensor([[.5, .25, .125, .125]]).log().repeat(2000, 1)
    for topp, allowed in [(0.5, {0}), (0.75, {0, 1}), (0.875, {0, 1, 2})]:
        drawn = Sampling(torch.Generator().manual_seed(0), topp=topp).draw(log_probs)
        assert set(drawn.tolist()) == allowed, topp


def test_sampling_defaults_cut_no_token():
    """Sampling(generator) alone draws from the whole distribution (topk 0, topp 1.0, temperature 1.0), as its
    docstring and request's defaults say: the least probable token (5%) is drawn too, at about its rate."""
    log_probs = torch.tensor([[.5, .3, .15, .05]]).log().repeat(4000, 1)
    drawn = Sampling(torch.Generator().manual_seed(0)).draw(log_probs)
    assert set(drawn.tolist()) == {0, 1, 2, 3} and 0.03 < (drawn == 3).float().mean() < 0.07


def test_a_much_longer_source_is_batched_alone():
    """Batches counted in sentences alone padded the short lines sharing a long line's batch to its length:
    a line of 2,000 words among 9 short ones took 1.5 GB at beam 1, alone 0.5 GB (and 23 GB, killed by the
    kernel, for 12,500 words among 4). The outputs do not depend on the batches (decoding is batch-invariant)."""
    from transformer.decode import PAD_SLACK, length_batches

    assert list(length_batches([2000, 12, 11, 10], 64)) == [[0], [1, 2, 3]]
    assert list(length_batches([40, 39, 30, 25, 20, 12], 4)) == [[0, 1, 2, 3], [4, 5]]
    assert list(length_batches([2 * 4 + PAD_SLACK, 5, 4], 64)) == [[0, 1, 2]]  # short lines keep their batches
    assert list(length_batches([2 * 5 + PAD_SLACK + 1, 5], 64)) == [[0], [1]]
    assert list(length_batches([], 64)) == []


@pytest.mark.parametrize("how", ["beam", "greedy", "sampling"])
def test_stop_is_asked_before_each_step(copy_model, sources, how):
    """decode_ids' stop was asked between batches only: the server's Ctrl-C, or a client gone, waited for the
    whole batch (a request at the server's limits decodes one batch for minutes). It ends the search at the next
    step, and an unasked stop changes no output."""
    asked = []

    def stop() -> bool:
        asked.append(True)
        return len(asked) > 3  # before the first batch's third step

    settings = {"beam": {"beam_size": 3}, "greedy": {"beam_size": 1},
                "sampling": {"beam_size": 1, "sampling": Sampling(torch.Generator().manual_seed(0)), "nbest": 2}}[how]
    with pytest.raises(Stopped):
        decode_ids(copy_model, sources, max_len_offset=10, stop=stop, **settings)
    assert len(asked) == 4  # once before the batch, then before each of its steps: its third was not run
    if how != "sampling":  # a draw depends on the generator's state
        assert decode_ids(copy_model, sources, max_len_offset=10, stop=lambda: False, **settings) == \
            decode_ids(copy_model, sources, max_len_offset=10, **settings)
