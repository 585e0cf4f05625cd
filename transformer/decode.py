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

from collections.abc import Sequence
from typing import Protocol

import torch
from torch import Tensor
from tqdm import tqdm

from .config import EARLY_STOPS, DecodeConfig, EarlyStop
from .tokenizer import BOS_ID, EOS_ID, PAD_ID


def length_penalty(length: int | Tensor, alpha: float) -> float | Tensor:
    """GNMT length penalty (Wu et al. 2016; A11): lp(Y) = ((5 + |Y|) / 6)^α, |Y| counting the EOS."""
    return ((5 + length) / 6) ** alpha


def max_lengths(src: Tensor, max_len_offset: int) -> Tensor:
    """src [B, S] -> [B] largest |Y| (EOS included): each sentence's own length (EOS included) + offset.

    DEVIATION(§6.1): "input length + 50" is per sentence; the authors' code used the padded batch
    length (A11), which made a sentence's output limit depend on the batch it happened to be in.
    """
    return ((src != PAD_ID).sum(1) + max_len_offset).clamp(min=1)


def top_next_tokens(logits: Tensor, k: int, step: int, max_len: Tensor,
                    allowed: Tensor | None = None) -> tuple[Tensor, Tensor]:
    """logits [N, V] of output position step + 1 -> each row's k best next tokens: their log-probs
    [N, k] and ids [N, k], best first. PAD/BOS, tokens a constraint does not allow (``allowed`` [N, V]
    False) and, for rows whose limit ``max_len`` [N] is reached, everything but EOS are excluded
    (-inf), so every output finishes, constrained or not.

    The scores are the model's own log-probabilities, log_softmax taken before any exclusion. Only
    k values per row leave this function: a beam's best 2·beam continuations are among its own best
    2·beam tokens, so beam search searches [n, beam·k] candidates instead of adding the beam scores
    to all [n, beam·V] log-probs and searching those: k columns sorted per row instead of beam·V.
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
    return log_probs.topk(min(k, log_probs.size(-1)), -1)


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


PAPER = DecodeConfig()  # §6.1's settings: the searches' defaults come from the one config, not literals here


@torch.inference_mode()
def greedy_search(model, src: Tensor, max_len_offset: int = PAPER.max_len_offset,
                  use_cache: bool = True) -> list[list[int]]:
    """Most probable next token at each step, until EOS. src [B, S] -> B outputs without BOS/EOS.

    Each output has at most len(src) + max_len_offset - 1 tokens (len(src) counting its EOS): the
    limit counts the output's EOS, which is forced at the last position (see ``max_lengths``).
    """
    next_logits = NextTokenLogits(model, src, use_cache)
    max_len = max_lengths(src, max_len_offset)
    prefix = src.new_full((src.size(0), 1), BOS_ID)  # [n, t]
    sentence = torch.arange(src.size(0), device=src.device)  # [n] index into the batch
    outputs: list[list[int]] = [[] for _ in range(src.size(0))]
    for step in range(int(max_len.max())):
        token = top_next_tokens(next_logits(prefix), 1, step, max_len)[1][:, 0]  # [n]
        prefix = torch.cat([prefix, token[:, None]], 1)
        done = token == EOS_ID
        for s, hyp in zip(sentence[done].tolist(), prefix[done, 1:-1].tolist()):
            outputs[s] = hyp
        if done.all():
            break
        if done.any():  # prune finished sentences so no step is spent on them
            keep = (~done).nonzero().flatten()
            next_logits.reorder(keep)
            prefix, sentence, max_len = prefix[keep], sentence[keep], max_len[keep]
    return outputs


def beam_step(log_probs: Tensor, tokens: Tensor, scores: Tensor, length: int, alpha: float) -> tuple[Tensor, ...]:
    """One step of the GNMT/tensor2tensor beam search (A11), for n sentences with ``beam`` beams each.

    log_probs [n*beam, k], tokens [n*beam, k]: each alive beam's k >= 2 best next tokens and their
    log-probs (``top_next_tokens``; k = 2·beam holds every candidate the step can keep); scores
    [n, beam] the beams' raw log P(prefix) (-inf for an empty beam); ``length`` = |Y| of a
    hypothesis ending at this token.
    Returns
      alive_scores [n, beam]   raw log-probs of the best ``beam`` non-EOS candidates, best first
      alive_origin [n, beam]   the beam (0..beam-1) each one extends
      alive_token [n, beam]    its new token
      finished_score [n]       best penalised score log P / lp(length) among EOS candidates (-inf: none)
      finished_origin [n]      the beam that candidate ends
    Taking 2·beam candidates guarantees ``beam`` non-EOS ones, since each beam has one EOS candidate.
    """
    n, beam = scores.shape
    k = log_probs.size(-1)
    total = (scores[:, :, None] + log_probs.view(n, beam, k)).view(n, beam * k)  # [n, beam*k]
    cand_scores, cand = total.topk(2 * beam, dim=1)  # [n, 2*beam], sorted
    cand_origin, cand_token = cand // k, tokens.view(n, beam * k).gather(1, cand)
    is_eos = cand_token == EOS_ID
    # DEVIATION(§6.1): only EOS candidates within the top ``beam`` are finished (fairseq's rule);
    # the authors' code finished any EOS among the top 2·beam (A11). With this rule beam 1 is
    # exactly greedy search (α = 0), and a hypothesis no beam would keep is never returned.
    in_beam = torch.arange(2 * beam, device=cand.device) < beam
    finished = (cand_scores / length_penalty(length, alpha)).masked_fill(~(is_eos & in_beam), float("-inf"))
    finished_score, finished_pos = finished.max(1)  # [n]
    alive_scores, alive_pos = cand_scores.masked_fill(is_eos, float("-inf")).topk(beam, dim=1)  # [n, beam]
    return (alive_scores, cand_origin.gather(1, alive_pos), cand_token.gather(1, alive_pos),
            finished_score, cand_origin.gather(1, finished_pos[:, None]).squeeze(1))


@torch.inference_mode()
def beam_search(model, src: Tensor, beam_size: int = PAPER.beam_size, alpha: float = PAPER.alpha,
                max_len_offset: int = PAPER.max_len_offset, use_cache: bool = True,
                constraint: Constraint | None = None, early_stop: EarlyStop = PAPER.early_stop) -> list[list[int]]:
    """Beam search with GNMT length penalty and early stopping (§6.1, A11). src [B, S] -> B outputs
    (the best finished hypothesis by log P(Y) / lp(|Y|)), without BOS and EOS.

    Length: |Y| (EOS included) <= len(src) + max_len_offset, per sentence, len(src) counting the
    source's EOS; at that limit EOS is forced, so every output is a finished hypothesis.
    Early stop: a sentence is done once its best finished score >= best alive raw log-prob /
    lp(max_len): log-probs only fall and, for α >= 0, lp is largest at max_len, so no continuation
    could score higher. Like the authors' code (TH ``stop_early``, A11), the best finished one is
    compared. Unlike it, only EOS candidates within the step's top ``beam`` are finished
    (``beam_step``, a documented deviation), so beam 1 is exactly greedy search.

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
    batch, dev = src.size(0), src.device
    next_logits = NextTokenLogits(model, src, use_cache)
    next_logits.expand(beam_size)  # B -> B*beam rows
    max_len = max_lengths(src, max_len_offset)  # [n]
    if constraint is not None:
        constraint.begin(src, beam_size, max_len)
    sentence = torch.arange(batch, device=dev)  # [n] index into the batch
    prefix = src.new_full((batch * beam_size, 1), BOS_ID)  # [n*beam, t]
    scores = torch.full((batch, beam_size), float("-inf"), device=dev)  # [n, beam]
    scores[:, 0] = 0.0  # one live beam at step 0, so the beams do not start as copies
    best_score = torch.full((batch,), float("-inf"), device=dev)  # [B] best finished, penalised
    outputs: list[list[int]] = [[] for _ in range(batch)]
    for step in range(int(max_len.max())):
        allowed = constraint.allowed() if constraint is not None else None
        log_probs, tokens = top_next_tokens(next_logits(prefix), 2 * beam_size, step,
                                            max_len.repeat_interleave(beam_size), allowed)
        scores, origin, token, fin_score, fin_origin = beam_step(log_probs, tokens, scores, step + 1, alpha)
        better = (fin_score > best_score[sentence]).nonzero().flatten()  # [k] sentences that improved
        best_score[sentence[better]] = fin_score[better]
        hyps = prefix[better * beam_size + fin_origin[better], 1:]  # [k, t - 1]: the prefix EOS ends
        for s, hyp in zip(sentence[better].tolist(), hyps.tolist()):
            outputs[s] = hyp
        done = best_score[sentence] >= scores[:, 0] / length_penalty(max_len, alpha)  # [n] GNMT early stop
        if early_stop == "top":  # this step's best candidate is EOS: it outscores every alive one
            done |= fin_score * length_penalty(step + 1, alpha) >= scores[:, 0]
        if done.all():
            break
        keep = (~done).nonzero().flatten()  # prune finished sentences with the beam reorder
        rows = (keep[:, None] * beam_size + origin[keep]).flatten()  # [n'*beam] previous rows to continue
        next_logits.reorder(rows)
        prefix = torch.cat([prefix[rows], token[keep].flatten()[:, None]], 1)
        if constraint is not None:
            constraint.advance(rows, token[keep].flatten())
        scores, sentence, max_len = scores[keep], sentence[keep], max_len[keep]
    return outputs


def translate_ids(model, sources: Sequence[Sequence[int]], beam_size: int = PAPER.beam_size,
                  alpha: float = PAPER.alpha, max_len_offset: int = PAPER.max_len_offset,
                  batch_size: int = PAPER.batch_size, progress: bool = False, constraint: Constraint | None = None,
                  early_stop: EarlyStop = PAPER.early_stop) -> list[list[int]]:
    """Decode many sources (token ids, each ending with EOS): one output per input, in input order.

    Sentences are sorted by length (longest first, so memory trouble shows at once) and decoded
    ``batch_size`` at a time; beam_size 1 is greedy search (beam search when there is a
    ``constraint``); ``early_stop`` is beam search's stopping rule; ``progress`` shows a bar of
    sentences (on stderr). Outputs have no EOS. No input is dropped or truncated; an empty source is
    refused, since attention over no key at all is undefined.
    """
    if any(len(s) == 0 for s in sources):
        raise ValueError("empty source: every source needs at least its EOS token")
    device = next(model.parameters()).device
    order = sorted(range(len(sources)), key=lambda i: -len(sources[i]))
    outputs: list[list[int]] = [[] for _ in sources]
    bar = tqdm(total=len(sources), desc="translate", unit="sent", disable=not progress, mininterval=1.0)
    for start in range(0, len(order), batch_size):
        chunk = order[start: start + batch_size]
        src = torch.full((len(chunk), len(sources[chunk[0]])), PAD_ID, dtype=torch.long)  # [B, S]
        for row, i in enumerate(chunk):
            src[row, : len(sources[i])] = torch.as_tensor(sources[i], dtype=torch.long)
        src = src.to(device)
        if beam_size == 1 and constraint is None:
            decoded = greedy_search(model, src, max_len_offset)
        else:
            decoded = beam_search(model, src, beam_size, alpha, max_len_offset, constraint=constraint,
                                  early_stop=early_stop)
        for i, out in zip(chunk, decoded):
            outputs[i] = out
        bar.update(len(chunk))
    bar.close()
    return outputs
