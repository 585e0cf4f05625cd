"""Decoding many inputs (§6.1's search over a corpus): sort by length, batch, run the search with its
constraints, put the outputs back in input order; and scoring given outputs (forced decoding).

The searches themselves are in ``search.py``; what constrains them in ``constraints.py``; sampling in
``sampling.py``; which options a request may combine in ``request.py``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import NamedTuple

import torch
from tqdm import tqdm

from .config import EarlyStop, LengthNorm
from .constraints import Constraint, LexicalConstraints, PrefixConstraint
from .data import Example, collate, pad
from .sampling import Sampling
from .search import PAPER, Hypothesis, Stopped, beam_hypotheses, greedy_hypotheses, length_penalty
from .tokenizer import EOS_ID


# a batch's rows are padded to its first (longest) source: a row may be padded to at most twice its length and
# this many pieces more, or it starts a batch of its own
PAD_SLACK = 16


def length_batches(lengths: Sequence[int], batch_size: int) -> Iterator[list[int]]:
    """Batches of positions in ``lengths`` (sorted longest first): at most ``batch_size`` each, and a source
    shorter than half its batch's first (less ``PAD_SLACK``) starts a new one. Counted in sentences alone, one
    long line (thousands of pieces) took 63 short ones into its batch, padded to its length: memory that grows
    with the square of that length, times the batch, until the kernel killed the process without a word."""
    batch: list[int] = []
    for k, n in enumerate(lengths):
        if batch and (len(batch) == batch_size or lengths[batch[0]] > 2 * n + PAD_SLACK):
            yield batch
            batch = []
        batch.append(k)
    if batch:
        yield batch


def decode_ids(model, sources: Sequence[Sequence[int]], beam_size: int = PAPER.beam_size,
               alpha: float = PAPER.alpha, max_len_offset: int = PAPER.max_len_offset,
               batch_size: int = PAPER.batch_size, bar: tqdm | None = None,
               constraint: Constraint | None = None, early_stop: EarlyStop = PAPER.early_stop, nbest: int = 1,
               prefixes: Sequence[Sequence[int]] | None = None, sampling: Sampling | None = None,
               constraints: Sequence[Sequence[Sequence[int]]] | None = None,
               length_norm: LengthNorm = PAPER.length_norm, stop: Callable[[], bool] | None = None
               ) -> list[list[Hypothesis]]:
    """Decode many sources (token ids, each ending with EOS): for each input, in input order, its
    ``nbest`` hypotheses, best first.

    Sentences are sorted by length (longest first, so memory trouble shows at once) and decoded
    ``batch_size`` at a time, a much longer one in a batch of its own (``length_batches``). beam_size 1 is greedy search (beam search with a ``constraint``, and for an
    input with a prefix or constraints, decoded apart from the others of its batch, so that an input's
    output never depends on what shares its batch); ``early_stop`` is beam search's stopping rule; ``prefixes`` (one per
    source, token ids, [] for none) are forced as each output's first tokens (``PrefixConstraint``);
    ``sampling`` draws each token instead of searching, ``nbest`` independent draws per input;
    ``constraints`` (per source, phrases as token ids) must each appear in its outputs
    (``LexicalConstraints``, in ``constraint``'s place). Which of these combine is decided before, in
    one place (``request.DecodeRequest.verify``, which refuses lexical constraints with sampling or
    with a ``constraint``); this driver runs what it is given.
    ``length_norm`` is the length normalisation of every score (``search.length_penalty``).
    ``bar``, a progress bar of sentences, is advanced by each batch's. ``stop`` is asked before each
    batch and each search step; True raises Stopped (the server's request whose client has gone, or its
    Ctrl-C). No input is dropped or truncated; an empty source is refused, since attention over no key at
    all is undefined.
    """
    if any(len(s) == 0 for s in sources):
        raise ValueError("empty source: every source needs at least its EOS token")
    if prefixes is not None and len(prefixes) != len(sources):
        raise ValueError(f"{len(prefixes)} prefixes for {len(sources)} sources")
    if constraints is not None and len(constraints) != len(sources):
        raise ValueError(f"{len(constraints)} constraint lists for {len(sources)} sources")
    device = next(model.parameters()).device
    draws = nbest if sampling is not None else 1  # sampling: nbest rows per sentence, one per draw

    def decoded(chunk: list[int]) -> list[list[Hypothesis]]:
        src = pad([sources[i] for i in chunk]).to(device)  # [B, S]
        forced = constraint
        if constraints is not None and any(constraints[i] for i in chunk):
            forced = LexicalConstraints([constraints[i] for i in chunk], model.vocab_size)
        if prefixes is not None and any(prefixes[i] for i in chunk):  # the prefix first, then what else applies
            forced = PrefixConstraint([prefixes[i] for i in chunk for _ in range(draws)], model.vocab_size, forced)
        if sampling is not None:
            drawn = greedy_hypotheses(model, src.repeat_interleave(nbest, 0), max_len_offset, alpha,
                                      sampling=sampling, constraint=forced, length_norm=length_norm, stop=stop)
            return [sorted(drawn[k * nbest:(k + 1) * nbest], key=lambda h: -h.score) for k in range(len(chunk))]
        if beam_size == 1 and forced is None:
            return [[h] for h in greedy_hypotheses(model, src, max_len_offset, alpha, length_norm=length_norm,
                                                   stop=stop)]
        return beam_hypotheses(model, src, beam_size, alpha, max_len_offset, constraint=forced,
                               early_stop=early_stop, nbest=nbest, length_norm=length_norm, stop=stop)

    def own(i: int) -> bool:
        """Whether input i has a prefix or constraints of its own."""
        return bool(prefixes is not None and prefixes[i] or constraints is not None and constraints[i])

    order = sorted(range(len(sources)), key=lambda i: -len(sources[i]))
    outputs: list[list[Hypothesis]] = [[] for _ in sources]
    for chunk in length_batches([len(sources[i]) for i in order], batch_size):
        if stop is not None and stop():
            raise Stopped
        chunk = [order[k] for k in chunk]
        groups = [chunk]
        if beam_size == 1 and sampling is None and constraint is None:
            # beam 1 is greedy search for an input without a prefix or constraints, whatever shares its
            # batch: inputs with them take beam search, in a batch of their own
            groups = [g for g in ([i for i in chunk if not own(i)], [i for i in chunk if own(i)]) if g]
        for group in groups:
            for i, out in zip(group, decoded(group)):
                outputs[i] = out
        if bar is not None:
            bar.update(len(chunk))
    return outputs


def translate_ids(model, sources: Sequence[Sequence[int]], beam_size: int = PAPER.beam_size,
                  alpha: float = PAPER.alpha, max_len_offset: int = PAPER.max_len_offset,
                  batch_size: int = PAPER.batch_size, early_stop: EarlyStop = PAPER.early_stop,
                  length_norm: LengthNorm = PAPER.length_norm) -> list[list[int]]:
    """``decode_ids``' 1-best outputs, their tokens (no EOS): one per input, in input order."""
    return [hyps[0].tokens for hyps in decode_ids(model, sources, beam_size, alpha, max_len_offset, batch_size,
                                                  early_stop=early_stop, length_norm=length_norm)]


class Scored(NamedTuple):
    """A given output scored by the model (forced decoding): ``score`` as the beam ranks hypotheses,
    log P / lp(|Y|) (|Y| with EOS), ``log_prob`` = log P(Y | X), and each token's log-prob (EOS last)."""

    score: float
    log_prob: float
    token_log_probs: list[float]


@torch.inference_mode()
def score_ids(model, sources: Sequence[Sequence[int]], targets: Sequence[Sequence[int]],
              alpha: float = PAPER.alpha, max_tokens: int = 8192,
              length_norm: LengthNorm = PAPER.length_norm) -> list[Scored]:
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
        pairs = [Example(sources[i], list(targets[i]) + [EOS_ID]) for i in chunk]
        batch = collate(pairs, list(range(len(pairs)))).to(device)
        log_probs = model(batch.src, batch.tgt_in).float().log_softmax(-1)  # [B, T, V]
        token_lp = log_probs.gather(2, batch.tgt_out[:, :, None]).squeeze(2).cpu()  # [B, T]
        for row, i in enumerate(chunk):
            lps = token_lp[row, : len(targets[i]) + 1].tolist()
            total = sum(lps)
            results[i] = Scored(total / float(length_penalty(len(lps), alpha, length_norm)), total, lps)
    return results  # type: ignore[return-value]
