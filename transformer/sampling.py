"""Sampling instead of searching (not in the paper): back-translation's usual decoding."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from .tokenizer import EOS_ID


@dataclass
class Sampling:
    """Drawing each next token from the model's distribution instead of searching (not in the paper;
    back-translation's usual decoding): the log-probs divided by ``temperature``, then cut to the
    ``topk`` most probable tokens (0: all; those tied with the k-th kept too) and to the smallest set whose
    probability reaches ``topp`` (1.0: all). ``generator`` makes the draws repeatable: the same seed, inputs
    and batch size give the same outputs on the same machine."""

    generator: torch.Generator
    topk: int = 0
    topp: float = 1.0
    temperature: float = 1.0

    def draw(self, log_probs: Tensor) -> Tensor:
        """log_probs [N, V] (``next_log_probs``: excluded tokens at -inf) -> one token per row [N].

        The row's best log-prob is subtracted before dividing by the temperature: the best token's logit
        is then 0 at any temperature, where a small one would otherwise overflow every logit of the row
        to -inf (1e-38 takes a best log-prob of -5 past float32's range) and leave nothing to draw; as
        the temperature falls, the draw becomes the greedy choice. ``request.MIN_TEMPERATURE`` bounds it.
        """
        logits = (log_probs - log_probs.max(-1, keepdim=True).values) / self.temperature
        if 0 < self.topk < logits.size(-1):
            kth = logits.topk(self.topk, -1).values[:, -1:]
            logits = logits.masked_fill(logits < kth, float("-inf"))
        if self.topp < 1.0:
            sorted_logits, order = logits.sort(-1, descending=True)
            probs = sorted_logits.softmax(-1)
            beyond = probs.cumsum(-1) - probs >= self.topp  # the tokens before it already reach topp
            beyond[:, 0] = False  # also where topp is below float32's resolution (0 >= 0 cut every token)
            cut = torch.zeros_like(beyond).scatter(-1, order, beyond)  # back to vocabulary order
            logits = logits.masked_fill(cut, float("-inf"))  # the most probable token always stays
        probs = logits.softmax(-1)
        # a model whose scores are not numbers (weights that overflow) draws EOS, its score NaN, for the caller to
        # name the line (Translator: ModelOverflow); multinomial itself failed on it, an internal error
        eos = probs.new_zeros(probs.size(-1))  # made where probs are: from a host tensor, a GPU step would sync
        eos[EOS_ID] = 1.0
        probs = torch.where(probs.isnan().any(-1, keepdim=True), eos, probs)
        return torch.multinomial(probs, 1, generator=self.generator).flatten()
