"""Greedy and beam search (§6.1): "beam search with a beam size of 4 and length penalty α = 0.6 ...
maximum output length during inference to input length + 50, but terminate early when possible".

The search is the authors' (tensor2tensor's GNMT-style beam search, IMPLEMENTATION-NOTES A11):
each step keeps the top 2·beam candidates over beam × V; EOS candidates among the top ``beam``
become finished hypotheses scored by log P(Y) / lp(|Y|), the best ``beam`` others stay alive with their raw log-probs; a
sentence stops as soon as no alive beam can still beat its best finished hypothesis.

Shape legend: B sentences in the batch, n sentences still being decoded (finished ones are pruned),
S source length, t target prefix length (the start symbol included), V vocabulary, n*beam rows of
the decoder batch (sentence-major: row i*beam + k is beam k of sentence i).

Call ``model.eval()`` first: these functions do not change the model's mode (dropout would apply).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple, Protocol

import torch
from torch import Tensor
from tqdm import tqdm

from .config import EARLY_STOPS, DecodeConfig, EarlyStop
from .tokenizer import BOS_ID, EOS_ID, PAD_ID


class Hypothesis(NamedTuple):
    """One output of a search: its tokens (no BOS, no EOS) and the score the beam ranks it by,
    log P(Y | X) / lp(|Y|) (§6.1, A11; |Y| counts the EOS)."""

    tokens: list[int]
    score: float


def length_penalty(length: int | Tensor, alpha: float) -> float | Tensor:
    """GNMT length penalty (Wu et al. 2016; A11): lp(Y) = ((5 + |Y|) / 6)^α, |Y| counting the EOS."""
    return ((5 + length) / 6) ** alpha


def max_lengths(src: Tensor, max_len_offset: int) -> Tensor:
    """src [B, S] -> [B] largest |Y| (EOS included): each sentence's own length (EOS included) + offset.

    DEVIATION(§6.1): "input length + 50" is per sentence; the authors' code used the padded batch
    length (A11), which made a sentence's output limit depend on the batch it happened to be in.
    """
    return ((src != PAD_ID).sum(1) + max_len_offset).clamp(min=1)


def next_log_probs(logits: Tensor, step: int, max_len: Tensor, allowed: Tensor | None = None) -> Tensor:
    """logits [N, V] of output position step + 1 -> the log-probs the search may choose from [N, V]:
    PAD/BOS, tokens a constraint does not allow (``allowed`` [N, V] False) and, for rows whose limit
    ``max_len`` [N] is reached, everything but EOS are excluded (-inf), so every output finishes,
    constrained or not. The values left are the model's own log-probabilities, log_softmax taken
    before any exclusion.

    DEVIATION(§6.1): EOS is forced at the limit; the authors' code instead returned the alive
    hypotheses, unpenalised, when none had finished (A11). Forcing keeps one scoring rule for all.
    """
    log_probs = logits.float().log_softmax(-1)
    at_limit = (step + 1 >= max_len).nonzero().flatten()  # rows whose next token is the max_len-th
    eos = log_probs[at_limit, EOS_ID]  # a copy, taken before any masking
    if allowed is not None:
        log_probs.masked_fill_(~allowed, float("-inf"))
    log_probs[:, PAD_ID] = float("-inf")  # the start symbol is never an output
    if at_limit.numel():
        log_probs[at_limit] = float("-inf")
        log_probs[at_limit, EOS_ID] = eos
    return log_probs


def top_next_tokens(logits: Tensor, k: int, step: int, max_len: Tensor,
                    allowed: Tensor | None = None) -> tuple[Tensor, Tensor]:
    """logits [N, V] -> each row's k best next tokens among those ``next_log_probs`` leaves: their
    log-probs [N, k] and ids [N, k], best first.

    Only k values per row leave this function: a beam's best 2·beam continuations are among its own best
    2·beam tokens, so beam search searches [n, beam·k] candidates instead of adding the beam scores
    to all [n, beam·V] log-probs and searching those: k columns sorted per row instead of beam·V.
    """
    log_probs = next_log_probs(logits, step, max_len, allowed)
    return log_probs.topk(min(k, log_probs.size(-1)), -1)


def with_proposals(log_probs: Tensor, k: int, proposals: Tensor) -> tuple[Tensor, Tensor]:
    """Each row's k best tokens (``top_next_tokens``) and the tokens its constraints propose
    (proposals [N, E], -1: none), with their log-probs: [N, k + E] each. A proposal already among the
    k best, or proposed twice, or not allowed, gets -inf, so no candidate is counted twice."""
    values, tokens = log_probs.topk(min(k, log_probs.size(-1)), -1)
    e = proposals.size(1)
    earlier = torch.ones(e, e, dtype=torch.bool, device=proposals.device).tril(-1)  # j < i
    repeated = ((proposals[:, :, None] == proposals[:, None, :]) & earlier).any(-1)
    dup = (proposals[:, :, None] == tokens[:, None, :]).any(-1) | repeated | (proposals < 0)
    extra = log_probs.gather(1, proposals.clamp(min=0)).masked_fill(dup, float("-inf"))
    return torch.cat([values, extra], 1), torch.cat([tokens, proposals.clamp(min=0)], 1)


@dataclass
class Sampling:
    """Drawing each next token from the model's distribution instead of searching (not in the paper;
    back-translation's usual decoding): the log-probs divided by ``temperature``, then cut to the
    ``topk`` most probable tokens (0: all) and to the smallest set whose probability reaches ``topp``
    (1.0: all). ``generator`` makes the draws repeatable: the same seed, inputs and batch size give the
    same outputs on the same machine."""

    generator: torch.Generator
    topk: int = 0
    topp: float = 1.0
    temperature: float = 1.0

    def draw(self, log_probs: Tensor) -> Tensor:
        """log_probs [N, V] (``next_log_probs``: excluded tokens at -inf) -> one token per row [N]."""
        logits = log_probs / self.temperature
        if 0 < self.topk < logits.size(-1):
            kth = logits.topk(self.topk, -1).values[:, -1:]
            logits = logits.masked_fill(logits < kth, float("-inf"))
        if self.topp < 1.0:
            sorted_logits, order = logits.sort(-1, descending=True)
            probs = sorted_logits.softmax(-1)
            beyond = probs.cumsum(-1) - probs >= self.topp  # the tokens before it already reach topp
            cut = torch.zeros_like(beyond).scatter(-1, order, beyond)  # back to vocabulary order
            logits = logits.masked_fill(cut, float("-inf"))  # the most probable token always stays
        return torch.multinomial(logits.softmax(-1), 1, generator=self.generator).flatten()


class Constraint(Protocol):
    """What beam search asks of a constraint on its outputs (e.g. ``trees.TreeConstraint``: only
    well-formed trees of the input). It follows every row of the search: the same pruning and beam
    reordering as the prefixes, then the row's new token."""

    def begin(self, src: Tensor, beam: int, max_len: Tensor) -> None:
        """Start ``beam`` rows per sentence of src [B, S] (sentence-major), each with an empty output;
        max_len [B] is each sentence's largest |Y|, EOS included (``max_lengths``)."""

    def allowed(self) -> Tensor:
        """[N, V] bool: the tokens each current row may write next."""

    def advance(self, rows: Tensor, tokens: Tensor) -> None:
        """Rows ``rows`` [N'] of the previous step continue (repeats allowed), each with ``tokens`` [N']."""


class PrefixConstraint:
    """Forces each output to start with given tokens (target prefixes: interactive translation, where a
    translator types the start and the model completes it; not in the paper). A row whose output is
    shorter than its sentence's prefix may write only the prefix's next token; after it, anything.
    Scores stay the model's own. ``inner`` (e.g. the parse constraint) applies as well."""

    def __init__(self, prefixes: Sequence[Sequence[int]], vocab_size: int, inner: Constraint | None = None) -> None:
        self.prefixes, self.vocab_size, self.inner = [list(p) for p in prefixes], vocab_size, inner
        self.banked = getattr(inner, "banked", False)  # lexical constraints inside: theirs are the banks

    def candidates(self) -> Tensor:
        return self.inner.candidates()

    def met(self, tokens: Tensor) -> Tensor:
        return self.inner.met(tokens)

    def complete(self) -> Tensor:
        return self.inner.complete()

    def begin(self, src: Tensor, beam: int, max_len: Tensor) -> None:
        if self.inner is not None:
            self.inner.begin(src, beam, max_len)
        longest = max(len(p) for p in self.prefixes)
        too_long = [i for i, p in enumerate(self.prefixes) if len(p) >= int(max_len[i])]
        if too_long:
            i = too_long[0]
            raise ValueError(f"a prefix of {len(self.prefixes[i])} tokens does not fit the maximum output length "
                             f"({int(max_len[i])} with EOS: input length + max_len_offset)")
        table = torch.full((len(self.prefixes), longest + 1), -1, dtype=torch.long)  # -1: free
        for i, p in enumerate(self.prefixes):
            table[i, : len(p)] = torch.as_tensor(p, dtype=torch.long)
        self.forced = table.to(src.device).repeat_interleave(beam, 0)  # [N, longest + 1]: each row's prefix
        self.step = 0

    def allowed(self) -> Tensor:
        token = self.forced[:, min(self.step, self.forced.size(1) - 1)]  # [N] the forced token, -1: free
        allowed = (token < 0)[:, None].expand(-1, self.vocab_size).clone()  # [N, V]
        forced = (token >= 0).nonzero().flatten()
        allowed[forced, token[forced]] = True
        return allowed if self.inner is None else allowed & self.inner.allowed()

    def advance(self, rows: Tensor, tokens: Tensor) -> None:
        self.forced, self.step = self.forced[rows], self.step + 1
        if self.inner is not None:
            self.inner.advance(rows, tokens)


class NextTokenLogits:
    """Next-token logits for a batch of prefixes: the only thing cached and uncached search differ in.

    With the cache, one ``decode_step`` per token (cross-attention keys/values projected once per
    sentence). Without it, the whole prefix is run again through ``model(src, tgt_in)``: quadratic,
    but independent of the cache, so it serves as the reference the cache is tested against.
    """

    def __init__(self, model, src: Tensor, use_cache: bool = True):
        self.model, self.src = model, src
        self.cache = model.init_cache(*model.encode(src)) if use_cache else None

    def __call__(self, prefix: Tensor) -> Tensor:
        """prefix [N, t] (starts with BOS; the cache holds positions < t - 1) -> logits [N, V]."""
        if self.cache is None:
            return self.model(self.src, prefix)[:, -1]
        return self.model.decode_step(prefix[:, -1], self.cache)

    def expand(self, beam: int) -> None:
        """Each sentence gets ``beam`` rows, sentence-major (before the first step of beam search)."""
        if self.cache is None:
            self.src = self.src.repeat_interleave(beam, 0)
        else:
            self.cache.expand(beam)

    def reorder(self, rows: Tensor) -> None:
        """Continue rows ``rows`` [N'] (repeats allowed), the beams of each sentence together:
        beam reordering and pruning of finished sentences."""
        if self.cache is None:
            self.src = self.src.index_select(0, rows)
        else:
            self.cache.reorder(rows)


class LexicalConstraints:
    """Outputs that must contain given phrases (terminology; not in the paper): Post & Vilar (2018)'s
    dynamic beam allocation, vectorised after Hu et al. (2019). Each row tracks the phrases it has
    written and its progress inside the one it is writing (a phrase counts only when written whole and
    in one piece; leaving it midway loses the progress). At each step every row also proposes the
    tokens that advance its constraints, and the beam is divided among hypotheses by how many
    constraint tokens they have met (``banks``): the best of each bank first, the fullest bank first,
    so hypotheses that have met more are kept although they score lower. EOS is allowed only once
    every phrase is written (at the length limit it is forced all the same). Scores stay the model's
    own. ``phrases``: per sentence, its phrases as token ids."""

    banked = True  # beam search divides its beam by ``met`` and adds ``candidates`` (see ``beam_hypotheses``)

    def __init__(self, phrases: Sequence[Sequence[Sequence[int]]], vocab_size: int) -> None:
        self.phrases, self.vocab_size = [[list(p) for p in ps if p] for ps in phrases], vocab_size

    def begin(self, src: Tensor, beam: int, max_len: Tensor) -> None:
        n, dev = len(self.phrases), src.device
        p_max = max(1, max(len(ps) for ps in self.phrases))
        l_max = max(1, max((len(p) for ps in self.phrases for p in ps), default=1))
        table = torch.full((n, p_max, l_max), -1, dtype=torch.long)
        for i, ps in enumerate(self.phrases):
            if sum(len(p) for p in ps) >= int(max_len[i]):
                raise ValueError(f"constraints of {sum(len(p) for p in ps)} tokens do not fit the maximum output "
                                 f"length ({int(max_len[i])} with EOS: input length + max_len_offset)")
            for j, p in enumerate(ps):
                table[i, j, : len(p)] = torch.as_tensor(p, dtype=torch.long)
        rows = lambda x: x.to(dev).repeat_interleave(beam, 0)  # noqa: E731  sentence-major rows
        self.table = rows(table)  # [N, P, L] each row's phrases, -1 padded
        self.length = rows((table >= 0).sum(-1))  # [N, P] phrase lengths (0: no phrase)
        self.done = self.length == 0  # [N, P] phrases written (padding counts as written)
        self.cur = torch.full((self.table.size(0),), -1, dtype=torch.long, device=dev)  # phrase in progress
        self.pos = torch.zeros_like(self.cur)  # tokens of it written so far

    def _next_in_phrase(self) -> Tensor:
        """[N] the token that continues each row's phrase in progress (-1: none)."""
        rows = torch.arange(self.cur.numel(), device=self.cur.device)
        nxt = self.table[rows, self.cur.clamp(min=0), self.pos.clamp(max=self.table.size(2) - 1)]
        return torch.where(self.cur >= 0, nxt, -1)

    def complete(self) -> Tensor:
        """[N] whether each row has written every phrase."""
        return self.done.all(-1)

    def allowed(self) -> Tensor:
        allowed = torch.ones(self.cur.numel(), self.vocab_size, dtype=torch.bool, device=self.cur.device)
        allowed[:, EOS_ID] = self.complete()
        return allowed

    def candidates(self) -> Tensor:
        """[N, P + 1] tokens each row proposes besides its best ones (-1: none): the next token of its
        phrase in progress and the first token of every phrase it has not written."""
        firsts = torch.where(self.done, -1, self.table[:, :, 0])
        return torch.cat([self._next_in_phrase()[:, None], firsts], 1)

    def _after(self, tokens: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """Each row's state after writing each of ``tokens`` [N, K]: (done [N, K, P], cur [N, K], pos [N, K])."""
        n, k = tokens.shape
        continues = (tokens == self._next_in_phrase()[:, None]) & (self.cur[:, None] >= 0)  # [N, K]
        starts = (tokens[:, :, None] == self.table[:, None, :, 0]) & ~self.done[:, None, :]  # [N, K, P]
        first = starts.float().argmax(-1)  # the first unwritten phrase this token starts
        cur = torch.where(continues, self.cur[:, None], torch.where(starts.any(-1), first, -1))
        pos = torch.where(continues, self.pos[:, None] + 1, (cur >= 0).long())
        length = self.length.gather(1, cur.clamp(min=0))  # [N, K]
        complete = (cur >= 0) & (pos == length)
        index = cur.clamp(min=0)[:, :, None]
        done = self.done[:, None, :].expand(n, k, -1).clone()
        done.scatter_(2, index, done.gather(2, index) | complete[:, :, None])
        return done, torch.where(complete, -1, cur), torch.where(complete, 0, pos)

    def met(self, tokens: Tensor) -> Tensor:
        """[N, K] constraint tokens each row has met after writing each of ``tokens`` [N, K]: whole
        phrases written, plus its progress in the one in progress (its bank)."""
        done, _, pos = self._after(tokens)
        return (done.long() * self.length[:, None, :]).sum(-1) + pos

    def advance(self, rows: Tensor, tokens: Tensor) -> None:
        self.table, self.length = self.table[rows], self.length[rows]
        self.done, self.cur, self.pos = self.done[rows], self.cur[rows], self.pos[rows]
        done, cur, pos = self._after(tokens[:, None])
        self.done, self.cur, self.pos = done[:, 0], cur[:, 0], pos[:, 0]


class EnsembleCache:
    """The caches of an ensemble's models, reordered and expanded together."""

    def __init__(self, caches: list) -> None:
        self.caches = caches

    @property
    def length(self) -> int:
        return self.caches[0].length

    def expand(self, beam: int) -> None:
        for c in self.caches:
            c.expand(beam)

    def reorder(self, rows: Tensor) -> None:
        for c in self.caches:
            c.reorder(rows)


class Ensemble(torch.nn.Module):
    """Independently trained models that decode as one (not in the paper; the usual last BLEU point of
    shared tasks): the next-token distribution is the mean of theirs, returned as log-probabilities
    (fairseq's rule, log of the mean of the probabilities), each model with its own cache. It answers
    what the searches ask of a model (encode, init_cache, decode_step, forward), so they run unchanged;
    ``next_log_probs`` taking log_softmax again leaves normalised log-probabilities as they are. The
    models must share the vocabulary."""

    def __init__(self, models: Sequence[torch.nn.Module]) -> None:
        super().__init__()
        self.models = torch.nn.ModuleList(models)

    @property
    def output_weight(self) -> Tensor:
        return self.models[0].output_weight

    @property
    def vocab_size(self) -> int:
        return self.models[0].vocab_size

    def _mean(self, logits: list[Tensor]) -> Tensor:
        log_probs = torch.stack([x.float().log_softmax(-1) for x in logits])  # [M, ..., V]
        return log_probs.logsumexp(0) - math.log(len(logits))

    def encode(self, src: Tensor) -> tuple[list[Tensor], list[Tensor]]:
        encoded = [m.encode(src) for m in self.models]
        return [e[0] for e in encoded], [e[1] for e in encoded]

    def init_cache(self, memories: list[Tensor], masks: list[Tensor]) -> EnsembleCache:
        return EnsembleCache([m.init_cache(z, mask) for m, z, mask in zip(self.models, memories, masks)])

    def decode_step(self, tokens: Tensor, cache: EnsembleCache) -> Tensor:
        return self._mean([m.decode_step(tokens, c) for m, c in zip(self.models, cache.caches)])

    def forward(self, src: Tensor, tgt_in: Tensor) -> Tensor:
        return self._mean([m(src, tgt_in) for m in self.models])


PAPER = DecodeConfig()
INCOMPLETE = 1e6  # rank penalty of a finished hypothesis that misses a lexical constraint  # §6.1's settings: the searches' defaults come from the one config, not literals here


@torch.inference_mode()
def greedy_hypotheses(model, src: Tensor, max_len_offset: int = PAPER.max_len_offset, alpha: float = PAPER.alpha,
                      use_cache: bool = True, sampling: Sampling | None = None,
                      constraint: Constraint | None = None) -> list[Hypothesis]:
    """Most probable next token at each step (or, with ``sampling``, one drawn), among those
    ``constraint`` allows, until EOS. src [B, S] -> B hypotheses, scored as beam search scores them
    (log P / lp(|Y|) with ``alpha``).

    Each output has at most len(src) + max_len_offset - 1 tokens (len(src) counting its EOS): the
    limit counts the output's EOS, which is forced at the last position (see ``max_lengths``).
    """
    next_logits = NextTokenLogits(model, src, use_cache)
    max_len = max_lengths(src, max_len_offset)
    prefix = src.new_full((src.size(0), 1), BOS_ID)  # [n, t]
    sentence = torch.arange(src.size(0), device=src.device)  # [n] index into the batch
    log_p = torch.zeros(src.size(0), device=src.device)  # [n] log P(prefix)
    outputs: list[Hypothesis] = [Hypothesis([], float("-inf"))] * src.size(0)
    if constraint is not None:
        constraint.begin(src, 1, max_len)
    for step in range(int(max_len.max())):
        log_probs = next_log_probs(next_logits(prefix), step, max_len, constraint.allowed() if constraint else None)
        token = log_probs.topk(1, -1).indices[:, 0] if sampling is None else sampling.draw(log_probs)  # [n]
        log_p += log_probs.gather(1, token[:, None]).squeeze(1)
        prefix = torch.cat([prefix, token[:, None]], 1)
        done = token == EOS_ID
        scores = (log_p[done] / length_penalty(step + 1, alpha)).tolist()
        for s, hyp, score in zip(sentence[done].tolist(), prefix[done, 1:-1].tolist(), scores):
            outputs[s] = Hypothesis(hyp, score)
        if done.all():
            break
        keep = (~done).nonzero().flatten()
        if constraint is not None:
            constraint.advance(keep, token[keep])
        if done.any():  # prune finished sentences so no step is spent on them
            next_logits.reorder(keep)
            prefix, sentence, max_len, log_p = prefix[keep], sentence[keep], max_len[keep], log_p[keep]
    return outputs


def greedy_search(model, src: Tensor, max_len_offset: int = PAPER.max_len_offset,
                  use_cache: bool = True) -> list[list[int]]:
    """``greedy_hypotheses``' tokens: src [B, S] -> B outputs without BOS/EOS."""
    return [h.tokens for h in greedy_hypotheses(model, src, max_len_offset, use_cache=use_cache)]


def bank_order(total: Tensor, banks: Tensor) -> Tensor:
    """Dynamic beam allocation (Post & Vilar 2018), vectorised after Hu et al. (2019): candidates
    total [n, M] (scores) with banks [n, M] (constraint tokens met) -> candidate indices [n, M] in the
    order the beam takes them: the best of every bank first (fuller banks first), then the second best
    of every bank, and so on; impossible candidates (-inf) last. A bank with too few candidates leaves
    its places to the others, so the beam stays full."""
    by_score = total.sort(dim=1, descending=True, stable=True).indices  # [n, M]
    bank = banks.gather(1, by_score)
    width = int(banks.max()) + 1
    one_hot = torch.nn.functional.one_hot(bank, width)  # [n, M, banks]
    rank = (one_hot.cumsum(1) * one_hot).sum(-1) - 1  # place within its bank, by score
    key = (rank * width + (width - 1 - bank)).masked_fill(total.gather(1, by_score) == float("-inf"),
                                                          total.size(1) * width)
    return by_score.gather(1, key.sort(dim=1, stable=True).indices)


def beam_step(log_probs: Tensor, tokens: Tensor, scores: Tensor, length: int, alpha: float,
              banks: Tensor | None = None) -> tuple[Tensor, ...]:
    """One step of the GNMT/tensor2tensor beam search (A11), for n sentences with ``beam`` beams each.

    log_probs [n*beam, k], tokens [n*beam, k]: each alive beam's k >= 2 best next tokens and their
    log-probs (``top_next_tokens``; k = 2·beam holds every candidate the step can keep); scores
    [n, beam] the beams' raw log P(prefix) (-inf for an empty beam); ``length`` = |Y| of a
    hypothesis ending at this token.
    Returns
      alive_scores [n, beam]   raw log-probs of the best ``beam`` non-EOS candidates, best first
      alive_origin [n, beam]   the beam (0..beam-1) each one extends
      alive_token [n, beam]    its new token
      finished_scores [n, beam] penalised scores log P / lp(length) of the EOS candidates, best
                               first (-inf: no more of them)
      finished_origin [n, beam] the beam each one ends
    Taking 2·beam candidates guarantees ``beam`` non-EOS ones, since each beam has one EOS candidate.

    ``banks`` [n*beam, k] (lexical constraints, not in the paper): the constraint tokens each candidate
    has met. The candidates are then taken in dynamic beam allocation's order instead of by score
    (``bank_order``), and the alive ones are the first ``beam`` non-EOS ones in that order (so
    alive_scores are not sorted).
    """
    n, beam = scores.shape
    k = log_probs.size(-1)
    total = (scores[:, :, None] + log_probs.view(n, beam, k)).view(n, beam * k)  # [n, beam*k]
    if banks is None:
        cand_scores, cand = total.topk(2 * beam, dim=1)  # [n, 2*beam], sorted
    else:
        cand = bank_order(total, banks.view(n, beam * k))[:, : 2 * beam]
        cand_scores = total.gather(1, cand)
    cand_origin, cand_token = cand // k, tokens.view(n, beam * k).gather(1, cand)
    is_eos = cand_token == EOS_ID
    # DEVIATION(§6.1): only EOS candidates within the top ``beam`` are finished (fairseq's rule);
    # the authors' code finished any EOS among the top 2·beam (A11). With this rule beam 1 is
    # exactly greedy search (α = 0), and a hypothesis no beam would keep is never returned.
    in_beam = torch.arange(2 * beam, device=cand.device) < beam
    finished = (cand_scores / length_penalty(length, alpha)).masked_fill(~(is_eos & in_beam), float("-inf"))
    finished_scores, finished_pos = finished.topk(beam, dim=1)  # [n, beam]
    if banks is None:
        alive_scores, alive_pos = cand_scores.masked_fill(is_eos, float("-inf")).topk(beam, dim=1)  # [n, beam]
    else:  # the first beam non-EOS candidates in bank order
        alive_pos = (torch.arange(2 * beam, device=cand.device) + 2 * beam * is_eos).argsort(1)[:, :beam]
        alive_scores = cand_scores.gather(1, alive_pos)
    return (alive_scores, cand_origin.gather(1, alive_pos), cand_token.gather(1, alive_pos),
            finished_scores, cand_origin.gather(1, finished_pos))


@torch.inference_mode()
def beam_hypotheses(model, src: Tensor, beam_size: int = PAPER.beam_size, alpha: float = PAPER.alpha,
                    max_len_offset: int = PAPER.max_len_offset, use_cache: bool = True,
                    constraint: Constraint | None = None, early_stop: EarlyStop = PAPER.early_stop,
                    nbest: int = 1) -> list[list[Hypothesis]]:
    """Beam search with GNMT length penalty and early stopping (§6.1, A11). src [B, S] -> for each
    sentence its ``nbest`` (<= beam) best finished hypotheses by log P(Y) / lp(|Y|), best first.

    Length: |Y| (EOS included) <= len(src) + max_len_offset, per sentence, len(src) counting the
    source's EOS; at that limit EOS is forced, so every output is a finished hypothesis.
    Early stop: a sentence is done once its best finished score >= best alive raw log-prob /
    lp(max_len): log-probs only fall and, for α >= 0, lp is largest at max_len, so no continuation
    could score higher. Like the authors' code (TH ``stop_early``, A11), the best finished one is
    compared; for n-best lists, the nbest-th best, so that no hypothesis the list should hold is missed
    (the first of the list is the 1-best output, whatever ``nbest``). Unlike it, only EOS candidates
    within the step's top ``beam`` are finished (``beam_step``, a documented deviation), so beam 1 is
    exactly greedy search.

    ``constraint`` (not in the paper) keeps the tokens it does not allow at -inf at every step; EOS is
    forced at the length limit all the same.

    ``early_stop="top"`` (not in the paper): a sentence also stops once its best candidate of the step
    is EOS, as OpenNMT-py and CTranslate2 stop. An approximation: a longer hypothesis might still have
    scored higher. Fewer decoder steps for a little BLEU: benchmarks/results/speed.md and
    search_work.json measure both.
    """
    if early_stop not in EARLY_STOPS:
        raise ValueError(f"early_stop = {early_stop!r}: expected one of {', '.join(EARLY_STOPS)}")
    if alpha < 0:
        raise ValueError(f"alpha = {alpha}: the early-stop bound needs alpha >= 0")
    if not 1 <= nbest <= beam_size:
        raise ValueError(f"nbest = {nbest}: expected 1..beam size ({beam_size})")
    batch, dev = src.size(0), src.device
    next_logits = NextTokenLogits(model, src, use_cache)
    next_logits.expand(beam_size)  # B -> B*beam rows
    max_len = max_lengths(src, max_len_offset)  # [n]
    if constraint is not None:
        constraint.begin(src, beam_size, max_len)
    banked = getattr(constraint, "banked", False)  # lexical constraints: dynamic beam allocation
    sentence = torch.arange(batch, device=dev)  # [n] index into the batch
    prefix = src.new_full((batch * beam_size, 1), BOS_ID)  # [n*beam, t]
    scores = torch.full((batch, beam_size), float("-inf"), device=dev)  # [n, beam]
    scores[:, 0] = 0.0  # one live beam at step 0, so the beams do not start as copies
    kth_score = torch.full((batch,), float("-inf"), device=dev)  # [B] nbest-th best finished (-inf: fewer)
    ranked: list[list[tuple[float, Hypothesis]]] = [[] for _ in range(batch)]  # (rank key, hypothesis), best first
    for step in range(int(max_len.max())):
        log_probs = next_log_probs(next_logits(prefix), step, max_len.repeat_interleave(beam_size),
                                   constraint.allowed() if constraint is not None else None)
        if not banked:
            banks, (log_probs, tokens) = None, log_probs.topk(min(2 * beam_size, log_probs.size(-1)), -1)
        else:
            log_probs, tokens = with_proposals(log_probs, 2 * beam_size, constraint.candidates())
            banks = constraint.met(tokens)
        scores, origin, token, fin_scores, fin_origin = beam_step(log_probs, tokens, scores, step + 1, alpha, banks)
        keys, fin_scores, fin_origin = rank_keys(fin_scores, fin_origin, constraint if banked else None, nbest)
        rows, cols = (keys > kth_score[sentence][:, None]).nonzero(as_tuple=True)  # entries of the lists
        if rows.numel():
            hyps = prefix[rows * beam_size + fin_origin[rows, cols], 1:]  # [k, t - 1]: the prefixes EOS ends
            for s, hyp, score, key in zip(sentence[rows].tolist(), hyps.tolist(), fin_scores[rows, cols].tolist(),
                                          keys[rows, cols].tolist()):
                kth_score[s] = keep_nbest(ranked[s], key, Hypothesis(hyp, score), nbest)
        best_alive = scores.max(1).values  # scores[:, 0], unless banks ordered the beam
        done = kth_score[sentence] >= best_alive / length_penalty(max_len, alpha)  # [n] GNMT early stop
        if early_stop == "top":  # this step's best candidate is EOS: it outscores every alive one
            top = fin_scores[:, 0] * length_penalty(step + 1, alpha) >= best_alive
            done |= top & (kth_score[sentence] > float("-inf"))  # and the n-best list is full
        if done.all():
            break
        keep = (~done).nonzero().flatten()  # prune finished sentences with the beam reorder
        rows = (keep[:, None] * beam_size + origin[keep]).flatten()  # [n'*beam] previous rows to continue
        next_logits.reorder(rows)
        prefix = torch.cat([prefix[rows], token[keep].flatten()[:, None]], 1)
        if constraint is not None:
            constraint.advance(rows, token[keep].flatten())
        scores, sentence, max_len = scores[keep], sentence[keep], max_len[keep]
    # a list with hypotheses that meet every lexical constraint holds only those; else the best that do not
    return [[h for key, h in found if key > -INCOMPLETE / 2 or found[0][0] <= -INCOMPLETE / 2] for found in ranked]


def rank_keys(fin_scores: Tensor, fin_origin: Tensor, lexical: Constraint | None,
              nbest: int) -> tuple[Tensor, Tensor, Tensor]:
    """The step's finished candidates [n, beam] (``beam_step``) cut to the ``nbest`` that may enter the
    n-best lists, with the keys they are ranked by: their scores, except that under ``lexical``
    constraints one that misses a constraint (EOS forced at the limit) ranks after all that do not."""
    keys = fin_scores
    if lexical is not None:
        beam = fin_scores.size(1)
        rows = torch.arange(fin_scores.size(0), device=fin_scores.device)[:, None] * beam + fin_origin
        keys, order = (fin_scores - INCOMPLETE * (~lexical.complete()[rows]).float()).sort(1, descending=True)
        fin_scores, fin_origin = fin_scores.gather(1, order), fin_origin.gather(1, order)
    return keys[:, :nbest], fin_scores[:, :nbest], fin_origin[:, :nbest]


def keep_nbest(found: list[tuple[float, Hypothesis]], key: float, hyp: Hypothesis, nbest: int) -> float:
    """Puts ``hyp`` into a sentence's n-best list ``found`` ((key, hypothesis), best first; on a tie the
    earlier stays first) and cuts it to ``nbest``; returns the key a new entry must beat (-inf until full)."""
    found.insert(sum(1 for k, _ in found if k >= key), (key, hyp))
    del found[nbest:]
    return found[-1][0] if len(found) == nbest else float("-inf")


def beam_search(model, src: Tensor, beam_size: int = PAPER.beam_size, alpha: float = PAPER.alpha,
                max_len_offset: int = PAPER.max_len_offset, use_cache: bool = True,
                constraint: Constraint | None = None, early_stop: EarlyStop = PAPER.early_stop) -> list[list[int]]:
    """``beam_hypotheses``' best output of each sentence, its tokens: src [B, S] -> B outputs without BOS/EOS."""
    return [hyps[0].tokens for hyps in beam_hypotheses(model, src, beam_size, alpha, max_len_offset, use_cache,
                                                        constraint, early_stop)]


def decode_ids(model, sources: Sequence[Sequence[int]], beam_size: int = PAPER.beam_size,
               alpha: float = PAPER.alpha, max_len_offset: int = PAPER.max_len_offset,
               batch_size: int = PAPER.batch_size, progress: bool = False,
               constraint: Constraint | None = None, early_stop: EarlyStop = PAPER.early_stop, nbest: int = 1,
               prefixes: Sequence[Sequence[int]] | None = None, sampling: Sampling | None = None,
               constraints: Sequence[Sequence[Sequence[int]]] | None = None) -> list[list[Hypothesis]]:
    """Decode many sources (token ids, each ending with EOS): for each input, in input order, its
    ``nbest`` hypotheses, best first.

    Sentences are sorted by length (longest first, so memory trouble shows at once) and decoded
    ``batch_size`` at a time. beam_size 1 is greedy search (beam search when there is a
    ``constraint`` or a prefix); ``early_stop`` is beam search's stopping rule; ``prefixes`` (one per
    source, token ids, [] for none) are forced as each output's first tokens (``PrefixConstraint``);
    ``sampling`` draws each token instead of searching, ``nbest`` independent draws per input;
    ``constraints`` (per source, phrases as token ids) must each appear in its outputs
    (``LexicalConstraints``; beam search only).
    ``progress`` shows a bar of sentences (on stderr). No input is dropped or truncated; an empty
    source is refused, since attention over no key at all is undefined.
    """
    if any(len(s) == 0 for s in sources):
        raise ValueError("empty source: every source needs at least its EOS token")
    if prefixes is not None and len(prefixes) != len(sources):
        raise ValueError(f"{len(prefixes)} prefixes for {len(sources)} sources")
    if constraints is not None:
        if len(constraints) != len(sources):
            raise ValueError(f"{len(constraints)} constraint lists for {len(sources)} sources")
        if sampling is not None or constraint is not None:
            raise ValueError("lexical constraints need beam search of a translation run (not sampling, not parsing)")
    device = next(model.parameters()).device
    order = sorted(range(len(sources)), key=lambda i: -len(sources[i]))
    outputs: list[list[Hypothesis]] = [[] for _ in sources]
    bar = tqdm(total=len(sources), desc="translate", unit="sent", disable=not progress, mininterval=1.0)
    for start in range(0, len(order), batch_size):
        chunk = order[start: start + batch_size]
        src = torch.full((len(chunk), len(sources[chunk[0]])), PAD_ID, dtype=torch.long)  # [B, S]
        for row, i in enumerate(chunk):
            src[row, : len(sources[i])] = torch.as_tensor(sources[i], dtype=torch.long)
        src = src.to(device)
        draws = nbest if sampling is not None else 1  # sampling: nbest rows per sentence, one per draw
        forced = constraint
        if constraints is not None and any(constraints[i] for i in chunk):
            forced = LexicalConstraints([constraints[i] for i in chunk], model.vocab_size)
        if prefixes is not None and any(prefixes[i] for i in chunk):  # the prefix first, then what else applies
            forced = PrefixConstraint([prefixes[i] for i in chunk for _ in range(draws)], model.vocab_size, forced)
        if sampling is not None:
            drawn = greedy_hypotheses(model, src.repeat_interleave(nbest, 0), max_len_offset, alpha,
                                      sampling=sampling, constraint=forced)
            decoded = [sorted(drawn[k * nbest:(k + 1) * nbest], key=lambda h: -h.score) for k in range(len(chunk))]
        elif beam_size == 1 and forced is None:
            decoded = [[h] for h in greedy_hypotheses(model, src, max_len_offset, alpha)]
        else:
            decoded = beam_hypotheses(model, src, beam_size, alpha, max_len_offset, constraint=forced,
                                      early_stop=early_stop, nbest=nbest)
        for i, out in zip(chunk, decoded):
            outputs[i] = out
        bar.update(len(chunk))
    bar.close()
    return outputs


def translate_ids(model, sources: Sequence[Sequence[int]], beam_size: int = PAPER.beam_size,
                  alpha: float = PAPER.alpha, max_len_offset: int = PAPER.max_len_offset,
                  batch_size: int = PAPER.batch_size, progress: bool = False, constraint: Constraint | None = None,
                  early_stop: EarlyStop = PAPER.early_stop) -> list[list[int]]:
    """``decode_ids``' 1-best outputs, their tokens (no EOS): one per input, in input order."""
    return [hyps[0].tokens for hyps in decode_ids(model, sources, beam_size, alpha, max_len_offset, batch_size,
                                                  progress, constraint, early_stop)]


class Scored(NamedTuple):
    """A given output scored by the model (forced decoding): ``score`` as the beam ranks hypotheses,
    log P / lp(|Y|) (|Y| with EOS), ``log_prob`` = log P(Y | X), and each token's log-prob (EOS last)."""

    score: float
    log_prob: float
    token_log_probs: list[float]


@torch.inference_mode()
def score_ids(model, sources: Sequence[Sequence[int]], targets: Sequence[Sequence[int]],
              alpha: float = PAPER.alpha, max_tokens: int = 8192) -> list[Scored]:
    """log P(target | source) of given pairs (token ids; sources end with EOS, targets without it),
    teacher-forced in one pass each: the scores beam search would give these outputs. Pairs are
    sorted by length and batched up to ``max_tokens`` target positions (a batch's logits are
    B x T x V floats: the memory bound); one result per pair, in input order."""
    if len(sources) != len(targets):
        raise ValueError(f"{len(sources)} sources but {len(targets)} targets")
    if any(len(s) == 0 for s in sources):
        raise ValueError("empty source: every source needs at least its EOS token")
    device = next(model.parameters()).device
    order = sorted(range(len(sources)), key=lambda i: (-len(targets[i]), -len(sources[i])))
    results: list[Scored | None] = [None] * len(sources)
    start = 0
    while start < len(order):
        t_len = len(targets[order[start]]) + 1  # the longest target of the batch, with EOS
        chunk = order[start: start + max(1, max_tokens // t_len)]
        start += len(chunk)
        s_len = max(len(sources[i]) for i in chunk)
        src = torch.full((len(chunk), s_len), PAD_ID, dtype=torch.long)
        tgt_in = torch.full((len(chunk), t_len), PAD_ID, dtype=torch.long)
        tgt_out = torch.full((len(chunk), t_len), PAD_ID, dtype=torch.long)
        for row, i in enumerate(chunk):
            src[row, : len(sources[i])] = torch.as_tensor(sources[i], dtype=torch.long)
            y = list(targets[i]) + [EOS_ID]
            tgt_in[row, : len(y)] = torch.as_tensor([BOS_ID] + y[:-1], dtype=torch.long)
            tgt_out[row, : len(y)] = torch.as_tensor(y, dtype=torch.long)
        log_probs = model(src.to(device), tgt_in.to(device)).float().log_softmax(-1)  # [B, T, V]
        token_lp = log_probs.gather(2, tgt_out.to(device)[:, :, None]).squeeze(2).cpu()  # [B, T]
        for row, i in enumerate(chunk):
            lps = token_lp[row, : len(targets[i]) + 1].tolist()
            total = sum(lps)
            results[i] = Scored(total / float(length_penalty(len(lps), alpha)), total, lps)
    return results  # type: ignore[return-value]
