"""Greedy and beam search (§6.1): "beam search with a beam size of 4 and length penalty α = 0.6 ...
maximum output length during inference to input length + 50, but terminate early when possible".

The search is the authors' (tensor2tensor's GNMT-style beam search, IMPLEMENTATION-NOTES A11):
each step keeps the top 2·beam candidates over beam × V; EOS candidates become finished hypotheses
scored by log P(Y) / lp(|Y|) (those among the top ``beam`` only, where the authors' code took any of the
2·beam: a deviation, ``beam_step``), the best ``beam`` others stay alive with their raw log-probs; a
sentence stops as soon as no alive beam can still beat its best finished hypothesis.

What the search asks of a model is one thing: the next token's logits for each row (``NextTokenLogits``:
``Transformer.decode_step`` with its cache, an ``ensemble.Ensemble``, an int8 copy). What changes the
scores is a ``constraints.Constraint`` (a prefix, lexical constraints, well-formed trees) or
``sampling.Sampling``; ``decode.py`` batches many inputs through it.

Shape legend: B sentences in the batch, n sentences still being decoded (finished ones are pruned),
S source length, t target prefix length (the start symbol included), V vocabulary, n*beam rows of
the decoder batch (sentence-major: row i*beam + k is beam k of sentence i).

Call ``model.eval()`` first: these functions do not change the model's mode (dropout would apply).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import torch
from torch import Tensor

from .config import EARLY_STOPS, DecodeConfig, EarlyStop, LengthNorm
from .constraints import INCOMPLETE, Constraint, bank_order, with_proposals
from .sampling import Sampling
from .tokenizer import BOS_ID, EOS_ID, PAD_ID


class Stopped(Exception):
    """A search's ``stop`` said so before a step (or ``decode.decode_ids``' before a batch): what is left is not
    decoded (the server's request whose client has gone, or its Ctrl-C, which would wait for the whole batch)."""


class Hypothesis(NamedTuple):
    """One output of a search: its tokens (no BOS, no EOS) and the score the beam ranks it by,
    log P(Y | X) / lp(|Y|) (§6.1, A11; |Y| counts the EOS)."""

    tokens: list[int]
    score: float


def length_penalty(length: int | Tensor, alpha: float, norm: LengthNorm = "gnmt") -> float | Tensor:
    """What log P(Y) is divided by, |Y| counting the EOS: GNMT's lp(Y) = ((5 + |Y|) / 6)^α (Wu et al. 2016;
    §6.1, A11), or with ``norm`` "length" |Y|^α (fairseq, Hugging Face, CTranslate2). Both grow with |Y|
    for α >= 0, which the early-stop bound needs."""
    return (length if norm == "length" else (5 + length) / 6) ** alpha


def max_lengths(src: Tensor, max_len_offset: int, limit: int | None = None) -> Tensor:
    """src [B, S] -> [B] largest |Y| (EOS included): each sentence's own length (EOS included) + offset,
    and at most ``limit``, the positions a learned table has (``Transformer.max_output_length``).

    DEVIATION(§6.1): "input length + 50" is per sentence; the authors' code used the padded batch
    length (A11), which made a sentence's output limit depend on the batch it happened to be in.
    DEVIATION(§6.1, Table 3 row E): a learned position table ends the output at its last row, where
    input + 50 would go beyond it.
    """
    return ((src != PAD_ID).sum(1) + max_len_offset).clamp(min=1, max=limit)


def next_log_probs(logits: Tensor, step: int, max_len: Tensor, allowed: Tensor | None = None,
                   shortest: int = 0) -> Tensor:
    """logits [N, V] of output position step + 1 -> the log-probs the search may choose from [N, V]:
    PAD/BOS, tokens a constraint does not allow (``allowed`` [N, V] False) and, for rows whose limit
    ``max_len`` [N] is reached, everything but EOS are excluded (-inf), so every output finishes,
    constrained or not. The values left are the model's own log-probabilities, log_softmax taken
    before any exclusion. ``shortest``: the smallest of ``max_len``, when the caller knows it: no row
    is looked at for its limit before then (no host sync on a GPU at those steps).

    DEVIATION(§6.1): EOS is forced at the limit; the authors' code instead returned the alive
    hypotheses, unpenalised, when none had finished (A11). Forcing keeps one scoring rule for all.
    """
    log_probs = (logits if logits.dtype == torch.float32 else logits.float()).log_softmax(-1)
    at_limit = (step + 1 >= max_len).nonzero().flatten() if step + 1 >= shortest else None  # rows at their limit
    eos = None if at_limit is None else log_probs[at_limit, EOS_ID]  # a copy, taken before any masking
    if allowed is not None:
        log_probs.masked_fill_(~allowed, float("-inf"))
    log_probs[:, PAD_ID] = float("-inf")  # the start symbol is never an output
    if at_limit is not None and at_limit.numel():
        log_probs[at_limit] = float("-inf")
        log_probs[at_limit, EOS_ID] = eos
    return log_probs


TOPK_CHUNK = 100  # columns per chunk of ``row_topk``'s first stage


def row_topk(x: Tensor, k: int) -> tuple[Tensor, Tensor]:
    """Each row's k largest values of x [N, V] and their columns [N, k], best first: ``torch.topk``'s
    answer (up to the order of equal values). The search's one top-k over the vocabulary.

    On a CPU, over many long rows, it takes two stages: the maximum of every chunk of ``TOPK_CHUNK``
    columns, then the plain top-k over the columns of each row's k best chunks (and the last columns,
    when V is not a multiple of the chunk). Exact: a chunk holding one of a row's k best values has a
    maximum at least as large, and k other chunks with larger maxima would hold k larger values.
    The chunk maxima are one vectorised pass, and ``torch.topk`` over whole long rows is the slower
    kernel on a CPU from a few dozen rows on (benchmarks/linear_kernels.py measures both).
    """
    n, v = x.shape
    k = min(k, v)
    chunks = v // TOPK_CHUNK
    if x.device.type != "cpu" or n < 16 or chunks < 4 * k:  # short work: the one call is as fast
        return x.topk(k, -1)
    main = chunks * TOPK_CHUNK
    blocks = x[:, :main].unflatten(1, (chunks, TOPK_CHUNK))  # [N, chunks, C]
    best = blocks.amax(-1).topk(k, -1).indices  # [N, k] each row's k best chunks
    # a view when V is a multiple of the chunk, else one copy of the whole chunks
    picked = blocks.flatten(0, 1).index_select(0, (best + torch.arange(n, device=x.device)[:, None] * chunks).flatten())
    columns = (best[:, :, None] * TOPK_CHUNK + torch.arange(TOPK_CHUNK, device=x.device)).flatten(1)  # [N, k*C]
    candidates = picked.view(n, k * TOPK_CHUNK)
    if main < v:  # the last, partial chunk: always a candidate
        candidates = torch.cat([candidates, x[:, main:]], 1)
        columns = torch.cat([columns, torch.arange(main, v, device=x.device).expand(n, v - main)], 1)
    values, at = candidates.topk(k, -1)
    return values, columns.gather(1, at)


class NextTokenLogits:
    """Next-token logits for a batch of prefixes: the only thing cached and uncached search differ in.

    With the cache, one ``decode_step`` per token (cross-attention keys/values projected once per
    sentence). Without it, the whole prefix is run again through ``model(src, tgt_in)``: quadratic,
    but independent of the cache, so it serves as the reference the cache is tested against.
    ``beam`` rows per sentence of src [n, S], sentence-major; outputs of at most ``max_len`` positions.
    """

    def __init__(self, model, src: Tensor, beam: int, max_len: int, use_cache: bool = True):
        self.model = model
        self.src = src.repeat_interleave(beam, 0) if not use_cache and beam > 1 else src
        self.cache = model.init_cache(*model.encode(src), beam, max_len) if use_cache else None

    def __call__(self, prefix: Tensor) -> Tensor:
        """prefix [N, t] (starts with BOS; the cache holds positions < t - 1) -> logits [N, V]."""
        if self.cache is None:
            return self.model(self.src, prefix)[:, -1]
        return self.model.decode_step(prefix[:, -1], self.cache)

    def reorder(self, rows: Tensor, sentences: Tensor | None = None) -> None:
        """Continue rows ``rows`` [N'] (repeats allowed), the beams of each sentence together: beam
        reordering; ``sentences`` [n']: the sentences kept, when finished ones were pruned."""
        if self.cache is None:
            self.src = self.src.index_select(0, rows)
        else:
            self.cache.reorder(rows, sentences)


PAPER = DecodeConfig()  # §6.1's settings: the searches' defaults come from the one config, not literals here


@torch.inference_mode()
def greedy_hypotheses(model, src: Tensor, max_len_offset: int = PAPER.max_len_offset, alpha: float = PAPER.alpha,
                      use_cache: bool = True, sampling: Sampling | None = None,
                      constraint: Constraint | None = None, length_norm: LengthNorm = PAPER.length_norm,
                      stop: Callable[[], bool] | None = None) -> list[Hypothesis]:
    """Most probable next token at each step (or, with ``sampling``, one drawn), among those
    ``constraint`` allows, until EOS. src [B, S] -> B hypotheses, scored as beam search scores them
    (log P / lp(|Y|) with ``alpha`` and ``length_norm``).

    Each output has at most len(src) + max_len_offset - 1 tokens (len(src) counting its EOS): the
    limit counts the output's EOS, which is forced at the last position (see ``max_lengths``). ``stop`` is
    asked before each step; True raises Stopped.
    """
    max_len = max_lengths(src, max_len_offset, model.max_output_length)
    next_logits = NextTokenLogits(model, src, 1, int(max_len.max()), use_cache)
    prefix = src.new_full((src.size(0), 1), BOS_ID)  # [n, t]
    sentence = torch.arange(src.size(0), device=src.device)  # [n] index into the batch
    log_p = torch.zeros(src.size(0), device=src.device)  # [n] log P(prefix)
    outputs: list[Hypothesis] = [Hypothesis([], float("-inf"))] * src.size(0)
    if constraint is not None:
        constraint.begin(src, 1, max_len)
    shortest = int(max_len.min())  # host int: no limit check before it (next_log_probs)
    for step in range(int(max_len.max())):
        if stop is not None and stop():
            raise Stopped
        log_probs = next_log_probs(next_logits(prefix), step, max_len, constraint.allowed() if constraint else None,
                                   shortest)
        token = row_topk(log_probs, 1)[1][:, 0] if sampling is None else sampling.draw(log_probs)  # [n]
        log_p += log_probs.gather(1, token[:, None]).squeeze(1)
        prefix = torch.cat([prefix, token[:, None]], 1)
        done = token == EOS_ID
        ended = done.nonzero().flatten()  # the step's one host sync
        rows = None  # every row continues
        if ended.numel():
            scores = (log_p[ended] / length_penalty(step + 1, alpha, length_norm)).tolist()
            for s, hyp, score in zip(sentence[ended].tolist(), prefix[ended, 1:-1].tolist(), scores):
                outputs[s] = Hypothesis(hyp, score)
            if ended.numel() == token.numel():
                break
            rows = (~done).nonzero().flatten()  # prune finished sentences so no step is spent on them
            next_logits.reorder(rows, rows)
            prefix, sentence, max_len, log_p, token = prefix[rows], sentence[rows], max_len[rows], log_p[rows], token[rows]
            shortest = int(max_len.min())
        if constraint is not None:
            constraint.advance(torch.arange(token.numel(), device=token.device) if rows is None else rows, token)
    return outputs


def greedy_search(model, src: Tensor, max_len_offset: int = PAPER.max_len_offset,
                  use_cache: bool = True) -> list[list[int]]:
    """``greedy_hypotheses``' tokens: src [B, S] -> B outputs without BOS/EOS."""
    return [h.tokens for h in greedy_hypotheses(model, src, max_len_offset, use_cache=use_cache)]


def beam_step(log_probs: Tensor, tokens: Tensor, scores: Tensor, length: int, alpha: float,
              banks: tuple[Tensor, Tensor] | None = None, length_norm: LengthNorm = PAPER.length_norm
              ) -> tuple[Tensor, ...]:
    """One step of the GNMT/tensor2tensor beam search (A11), for n sentences with ``beam`` beams each.

    log_probs [n*beam, k], tokens [n*beam, k]: each alive beam's k >= 2 best next tokens and their
    log-probs (``row_topk`` of ``next_log_probs``; k = 2·beam holds every candidate the step can keep); scores
    [n, beam] the beams' raw log P(prefix) (-inf for an empty beam); ``length`` = |Y| of a
    hypothesis ending at this token.
    Returns
      alive_scores [n, beam]   raw log-probs of the best ``beam`` non-EOS candidates, best first
      alive_origin [n, beam]   the beam (0..beam-1) each one extends
      alive_token [n, beam]    its new token
      finished_scores [n, beam] penalised scores log P / lp(length) (``length_norm``'s) of the EOS candidates, best
                               first (-inf: no more of them)
      finished_origin [n, beam] the beam each one ends
    Taking 2·beam candidates guarantees ``beam`` non-EOS ones, since each beam has one EOS candidate.

    ``banks`` (lexical constraints, not in the paper): [n*beam, k] the constraint tokens each candidate
    has met, and [n*beam, k] whether it has met every one. The candidates are then taken in dynamic beam
    allocation's order instead of by score (``bank_order``), and the alive ones are the first ``beam``
    non-EOS ones in that order (so alive_scores are not sorted).
    """
    n, beam = scores.shape
    k = log_probs.size(-1)
    total = (scores[:, :, None] + log_probs.view(n, beam, k)).view(n, beam * k)  # [n, beam*k]
    if banks is None:
        cand_scores, cand = total.topk(2 * beam, dim=1)  # [n, 2*beam], sorted
    else:
        cand = bank_order(total, banks[0].view(n, beam * k), banks[1].view(n, beam * k),
                          tokens.view(n, beam * k) == EOS_ID, beam)[:, : 2 * beam]
        cand_scores = total.gather(1, cand)
    cand_origin, cand_token = cand // k, tokens.view(n, beam * k).gather(1, cand)
    is_eos = cand_token == EOS_ID
    # DEVIATION(§6.1): only EOS candidates within the top ``beam`` are finished (fairseq's rule);
    # the authors' code finished any EOS among the top 2·beam (A11). With this rule beam 1 is
    # exactly greedy search (α = 0), and a hypothesis no beam would keep is never returned.
    lp = length_penalty(length, alpha, length_norm)
    finished = torch.where(is_eos[:, :beam], cand_scores[:, :beam] / lp, float("-inf"))
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
                    nbest: int = 1, length_norm: LengthNorm = PAPER.length_norm,
                    stop: Callable[[], bool] | None = None) -> list[list[Hypothesis]]:
    """Beam search with GNMT length penalty and early stopping (§6.1, A11). src [B, S] -> for each
    sentence its ``nbest`` (<= beam) best finished hypotheses by log P(Y) / lp(|Y|), best first
    (``length_norm`` "length": lp(|Y|) = |Y|^α instead, ``length_penalty``).

    Length: |Y| (EOS included) <= len(src) + max_len_offset, per sentence, len(src) counting the
    source's EOS; at that limit EOS is forced, so every output is a finished hypothesis.
    Early stop: a sentence is done once its best finished score >= best alive raw log-prob /
    lp(max_len): log-probs only fall and, for α >= 0, lp is largest at max_len, so no continuation
    could score higher. Like the authors' code (TH ``stop_early``, A11), the best finished one is
    compared; for n-best lists, the nbest-th best, so that no hypothesis the list should hold is missed
    (the first of the list is the 1-best output, whatever ``nbest``; not so with ``early_stop="top"``, below).
    Unlike it, only EOS candidates
    within the step's top ``beam`` are finished (``beam_step``, a documented deviation), so beam 1 is
    exactly greedy search at α = 0 (with α > 0 the length penalty may prefer a longer output to greedy's).

    ``constraint`` (not in the paper) keeps the tokens it does not allow at -inf at every step; EOS is
    forced at the length limit all the same.

    ``early_stop="top"`` (not in the paper): a sentence also stops once its best candidate of the step
    is EOS, as OpenNMT-py stops (and CTranslate2 without a length penalty; with one it waits, as fairseq, for
    beam-size finished hypotheses). An approximation: a longer hypothesis might still have
    scored higher. An n-best list waits until it holds ``nbest`` hypotheses, so it may find such a one,
    and then its first is not the 1-best search's output. Fewer decoder steps for a little BLEU:
    benchmarks/results/speed.md and
    search_work.json measure both.

    ``stop`` is asked before each step; True raises Stopped.
    """
    if early_stop not in EARLY_STOPS:
        raise ValueError(f"early_stop = {early_stop!r}: expected one of {', '.join(EARLY_STOPS)}")
    if alpha < 0:
        raise ValueError(f"alpha = {alpha}: the early-stop bound needs alpha >= 0")
    if not 1 <= nbest <= beam_size:
        raise ValueError(f"nbest = {nbest}: expected 1..beam size ({beam_size})")
    batch, dev = src.size(0), src.device
    max_len = max_lengths(src, max_len_offset, model.max_output_length)  # [n]
    next_logits = NextTokenLogits(model, src, beam_size, int(max_len.max()), use_cache)  # B*beam rows
    if constraint is not None:
        constraint.begin(src, beam_size, max_len)
    banked = getattr(constraint, "banked", False)  # lexical constraints: dynamic beam allocation
    sentence = torch.arange(batch, device=dev)  # [n] index into the batch
    prefix = src.new_full((batch * beam_size, 1), BOS_ID)  # [n*beam, t]
    scores = torch.full((batch, beam_size), float("-inf"), device=dev)  # [n, beam]
    scores[:, 0] = 0.0  # one live beam at step 0, so the beams do not start as copies
    # [n] nbest-th best finished (-inf: fewer); float64, as rank_keys' keys
    kth_score = torch.full((batch,), float("-inf"), dtype=torch.float64, device=dev)
    ranked: list[list[tuple[float, Hypothesis]]] = [[] for _ in range(batch)]  # (rank key, hypothesis), best first
    row_max_len, shortest = max_len.repeat_interleave(beam_size), int(max_len.min())  # [n*beam]; host int
    bound = length_penalty(max_len, alpha, length_norm)  # [n] lp at each sentence's length limit, the largest it can reach
    first_rows = torch.arange(batch, device=dev)[:, None] * beam_size  # [n, 1] each sentence's first row
    for step in range(int(max_len.max())):
        if stop is not None and stop():
            raise Stopped
        log_probs = next_log_probs(next_logits(prefix), step, row_max_len,
                                   constraint.allowed() if constraint is not None else None, shortest)
        # a beam's best 2·beam continuations are among its own 2·beam best tokens: the step ranks [n, beam·2·beam]
        # candidates instead of adding the scores to all [n, beam·V] log-probs
        if not banked:
            banks, (log_probs, tokens) = None, row_topk(log_probs, 2 * beam_size)
        else:
            log_probs, tokens = with_proposals(log_probs, row_topk(log_probs, 2 * beam_size), constraint.candidates())
            banks = constraint.met(tokens)
        scores, origin, token, fin_scores, fin_origin = beam_step(log_probs, tokens, scores, step + 1, alpha, banks,
                                                                    length_norm)
        keys, fin_scores, fin_origin = rank_keys(fin_scores, fin_origin, constraint if banked else None, nbest)
        rows, cols = (keys > kth_score[:, None]).nonzero(as_tuple=True)  # entries of the lists
        if rows.numel():
            hyps = prefix[rows * beam_size + fin_origin[rows, cols], 1:]  # [k, t - 1]: the prefixes EOS ends
            for r, s, hyp, score, key in zip(rows.tolist(), sentence[rows].tolist(), hyps.tolist(),
                                             fin_scores[rows, cols].tolist(), keys[rows, cols].tolist()):
                kth_score[r] = keep_nbest(ranked[s], key, Hypothesis(hyp, score), nbest)
        best_alive = scores.max(1).values  # scores[:, 0], unless banks ordered the beam
        done = kth_score >= best_alive / bound  # [n] GNMT early stop
        if early_stop == "top":  # this step's best candidate is EOS: it outscores every alive one
            top = fin_scores[:, 0] * length_penalty(step + 1, alpha, length_norm) >= best_alive
            done |= top & (kth_score > float("-inf"))  # and the n-best list is full
        keep = (~done).nonzero().flatten()  # the step's one host sync when no hypothesis finished
        if keep.numel() == 0:
            break
        pruned = keep.numel() < sentence.numel()  # prune finished sentences with the beam reorder
        if pruned:
            origin, token, scores, sentence, max_len = origin[keep], token[keep], scores[keep], sentence[keep], max_len[keep]
            kth_score, bound = kth_score[keep], bound[keep]
            first_rows, row_max_len = first_rows[: keep.numel()], max_len.repeat_interleave(beam_size)
            shortest = int(max_len.min())
            rows = (keep[:, None] * beam_size + origin).flatten()  # [n'*beam] previous rows to continue
        else:
            rows = (first_rows + origin).flatten()
        next_logits.reorder(rows, keep if pruned else None)
        prefix = torch.cat([prefix[rows], token.flatten()[:, None]], 1)
        if constraint is not None:
            constraint.advance(rows, token.flatten())
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
        # in float64: at 1e6 float32 rounds to 1/16, and incomplete ones 0.01 apart tied (the better one left out)
        missing = (~lexical.complete()[rows]).double()
        keys, order = (fin_scores.double() - INCOMPLETE * missing).sort(1, descending=True)
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
