"""What may be written next, beside the model's choice (not in the paper): a target prefix, lexical
constraints (terminology), and the protocol they share with the parse constraint (``trees.TreeConstraint``).

Each follows every row of the search (``search.beam_hypotheses``): the same pruning and beam reordering
as the prefixes, then the row's new token. Scores stay the model's own: a constraint only removes
tokens (-inf) or, for lexical constraints, proposes candidates and orders the beam by banks.

Shape legend as in ``search``: N rows (n sentences × beam), V vocabulary, P phrases, L phrase length.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import torch
from torch import Tensor

from .tokenizer import EOS_ID

INCOMPLETE = 1e6  # rank penalty of a finished hypothesis that misses a lexical constraint


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

    def met(self, tokens: Tensor) -> tuple[Tensor, Tensor]:
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


class LexicalConstraints:
    """Outputs that must contain given phrases (terminology; not in the paper): Post & Vilar (2018)'s
    dynamic beam allocation, vectorised after Hu et al. (2019). Each row tracks the phrases it has
    written and its progress inside the one it is writing (a phrase counts only when written whole and
    in one piece; a token that leaves it midway keeps the longest part of the phrase that the written
    tokens still end with, as Knuth-Morris-Pratt matching does, so "a a a b" holds "a a b"; a phrase
    written inside another's progress counts too, found at the output's end: "a b d" holds "b d"). At each
    step every row also proposes the tokens that advance its constraints, and the beam is divided
    among hypotheses by how many constraint tokens they have met (``banks``): the best of each bank
    first, the fullest bank first, so hypotheses that have met more are kept although they score
    lower. EOS is allowed only once every phrase is written (at the length limit it is forced all the
    same). Scores stay the model's own. ``phrases``: per sentence, its phrases as token ids."""

    banked = True  # beam search divides its beam by ``met`` and adds ``candidates`` (see ``beam_hypotheses``)

    def __init__(self, phrases: Sequence[Sequence[Sequence[int]]], vocab_size: int) -> None:
        self.phrases, self.vocab_size = [[list(p) for p in ps if p] for ps in phrases], vocab_size

    def begin(self, src: Tensor, beam: int, max_len: Tensor) -> None:
        n, dev = len(self.phrases), src.device
        p_max = max(1, max(len(ps) for ps in self.phrases))
        l_max = max(1, max((len(p) for ps in self.phrases for p in ps), default=1))
        table = torch.full((n, p_max, l_max), -1, dtype=torch.long)
        right = table.clone()
        for i, ps in enumerate(self.phrases):
            if sum(len(p) for p in ps) >= int(max_len[i]):
                raise ValueError(f"constraints of {sum(len(p) for p in ps)} tokens do not fit the maximum output "
                                 f"length ({int(max_len[i])} with EOS: input length + max_len_offset)")
            for j, p in enumerate(ps):
                table[i, j, : len(p)] = right[i, j, l_max - len(p):] = torch.as_tensor(p, dtype=torch.long)
        rows = lambda x: x.to(dev).repeat_interleave(beam, 0)  # noqa: E731  sentence-major rows
        self.table = rows(table)  # [N, P, L] each row's phrases, -1 padded
        # [N, P, L] the phrases right-aligned, matched against each row's last L tokens: a phrase written inside
        # another one's progress ("a b d" holds "b d" while tracking "a b c") is found there
        self.ending = rows(right)
        self.last = torch.full((self.table.size(0), l_max - 1), -1, dtype=torch.long, device=dev)  # -1: before it
        self.borders = rows(borders(table))  # [N, P, L, L]
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
        """Each row's state after writing each of ``tokens`` [N, K]: (done [N, K, P], cur [N, K], pos [N, K]).

        In the phrase in progress, the token makes the progress m + 1 for the longest m whose first m
        tokens end what was written (``borders``) and are followed by the token; m = pos when it
        continues the phrase. Where no such m is left, the token may start another unwritten phrase."""
        n, k = tokens.shape
        rows, phrase = torch.arange(n, device=tokens.device), self.cur.clamp(min=0)
        ends = self.borders[rows, phrase, self.pos] & (self.cur >= 0)[:, None]  # [N, L] the m that may go on
        goes_on = ends[:, None, :] & (self.table[rows, phrase][:, None, :] == tokens[:, :, None])  # [N, K, L]
        kept = (goes_on * torch.arange(1, goes_on.size(2) + 1, device=tokens.device)).amax(-1)  # [N, K], 0: none
        continues = kept > 0
        starts = (tokens[:, :, None] == self.table[:, None, :, 0]) & ~self.done[:, None, :]  # [N, K, P]
        first = starts.float().argmax(-1)  # the first unwritten phrase this token starts
        cur = torch.where(continues, self.cur[:, None], torch.where(starts.any(-1), first, -1))
        pos = torch.where(continues, kept, (cur >= 0).long())
        length = self.length.gather(1, cur.clamp(min=0))  # [N, K]
        complete = (cur >= 0) & (pos == length)
        index = cur.clamp(min=0)[:, :, None]
        done = self.done[:, None, :].expand(n, k, -1).clone()
        done.scatter_(2, index, done.gather(2, index) | complete[:, :, None])
        window = torch.cat([self.last[:, None, :].expand(n, k, -1), tokens[:, :, None]], 2)  # [N, K, L]
        ending = self.ending[:, None]  # [N, 1, P, L]
        done |= ((ending < 0) | (ending == window[:, :, None])).all(-1)  # a phrase the output now ends with
        return done, torch.where(complete, -1, cur), torch.where(complete, 0, pos)

    def met(self, tokens: Tensor) -> tuple[Tensor, Tensor]:
        """[N, K] constraint tokens each row has met after writing each of ``tokens`` [N, K]: whole
        phrases written, plus its progress in the one in progress (its bank); and [N, K] whether that
        writes every phrase."""
        done, _, pos = self._after(tokens)
        return (done.long() * self.length[:, None, :]).sum(-1) + pos, done.all(-1)

    def advance(self, rows: Tensor, tokens: Tensor) -> None:
        self.table, self.length, self.borders = self.table[rows], self.length[rows], self.borders[rows]
        self.done, self.cur, self.pos, self.last = self.done[rows], self.cur[rows], self.pos[rows], self.last[rows]
        self.ending = self.ending[rows]
        done, cur, pos = self._after(tokens[:, None])
        self.done, self.cur, self.pos = done[:, 0], cur[:, 0], pos[:, 0]
        self.last = torch.cat([self.last, tokens[:, None]], 1)[:, 1:]


def borders(table: Tensor) -> Tensor:
    """table [n, P, L] (phrases, -1 padded) -> [n, P, L, L]: [i, p, j, m] whether the first m tokens of
    phrase p are also the last m of its first j (m <= j; m = 0 and m = j always): where its matching may
    go on from after j tokens when the next token is not its (j+1)-th (Knuth-Morris-Pratt's failure
    links, every one of them). Shift by shift: j = m + s holds when the phrase shifted by s agrees with
    it on its first m tokens."""
    n, phrases, length = table.shape
    out = torch.zeros(n, phrases, length, length, dtype=torch.bool, device=table.device)
    for s in range(length):
        agree = (table[..., s:] == table[..., : length - s]).cumprod(-1).bool()  # [n, P, L - s]: on 0..t
        m = torch.arange(length - s, device=table.device)
        out[:, :, m + s, m] = torch.cat([torch.ones_like(agree[..., :1]), agree[..., :-1]], -1)
    return out


def with_proposals(log_probs: Tensor, best: tuple[Tensor, Tensor], proposals: Tensor) -> tuple[Tensor, Tensor]:
    """Each row's k best tokens ``best`` (their log-probs and ids [N, k], ``search.row_topk`` of
    log_probs [N, V]) and the tokens its constraints propose (proposals [N, E], -1: none), with their
    log-probs: [N, k + E] each. A proposal already among the k best, or proposed twice, or not
    allowed, gets -inf, so no candidate is counted twice."""
    values, tokens = best
    e = proposals.size(1)
    earlier = torch.ones(e, e, dtype=torch.bool, device=proposals.device).tril(-1)  # j < i
    repeated = ((proposals[:, :, None] == proposals[:, None, :]) & earlier).any(-1)
    dup = (proposals[:, :, None] == tokens[:, None, :]).any(-1) | repeated | (proposals < 0)
    extra = log_probs.gather(1, proposals.clamp(min=0)).masked_fill(dup, float("-inf"))
    return torch.cat([values, extra], 1), torch.cat([tokens, proposals.clamp(min=0)], 1)


def bank_order(total: Tensor, banks: Tensor, complete: Tensor | None = None, eos: Tensor | None = None,
               beam: int = 0) -> Tensor:
    """Dynamic beam allocation (Post & Vilar 2018), vectorised after Hu et al. (2019): candidates
    total [n, M] (scores) with banks [n, M] (constraint tokens met) -> candidate indices [n, M] in the
    order the beam takes them: the best of every bank first (fuller banks first), then the second best
    of every bank, and so on; impossible candidates (-inf) last. A bank with too few candidates leaves
    its places to the others, so the beam stays full.

    Before all of these, best first, the candidates that write every phrase (``complete`` [n, M]) and that
    plain beam search of width ``beam`` would keep: finish (EOS, ``eos`` [n, M], among the ``beam`` best)
    or keep alive (among the ``beam`` best that are not EOS). With one place per bank, an output that met
    its constraints lost its place to a sibling of its own bank scoring a hair better, the other places
    going to hopeless candidates of emptier banks, and a constraint the best output already met made the
    output worse (27 of 40 test2016 lines, beam 4, with a word of each line's own output as its constraint:
    benchmarks/results/constraint_kept.md). Not in Post & Vilar: what meets every constraint competes as in
    plain search."""
    by_score = total.sort(dim=1, descending=True, stable=True).indices  # [n, M]
    bank = banks.gather(1, by_score)
    width = int(banks.max()) + 1
    one_hot = torch.nn.functional.one_hot(bank, width)  # [n, M, banks]
    rank = (one_hot.cumsum(1) * one_hot).sum(-1) - 1  # place within its bank, by score
    impossible = total.gather(1, by_score) == float("-inf")
    key = (rank * width + (width - 1 - bank)).masked_fill(impossible, total.size(1) * width)
    if complete is not None and eos is not None and beam:
        ends = eos.gather(1, by_score)  # plain search finishes EOS among its beam best, keeps the beam best others
        plain = torch.where(ends, torch.arange(total.size(1), device=total.device) < beam,
                            (~ends).cumsum(1) <= beam)
        key = key.masked_fill(complete.gather(1, by_score) & plain & ~impossible, -1)
    return by_score.gather(1, key.sort(dim=1, stable=True).indices)
