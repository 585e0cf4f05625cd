"""An ensemble decodes as one model (not in the paper): the search sees a model like any other."""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import Tensor


class EnsembleCache:
    """The caches of an ensemble's models, reordered together."""

    def __init__(self, caches: list) -> None:
        self.caches = caches

    def reorder(self, rows: Tensor, sentences: Tensor | None = None) -> None:
        for c in self.caches:
            c.reorder(rows, sentences)


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
    def vocab_size(self) -> int:
        return self.models[0].vocab_size

    @property
    def max_output_length(self) -> int | None:
        """The shortest of the models' limits (``Transformer.max_output_length``)."""
        limits = [m.max_output_length for m in self.models if m.max_output_length is not None]
        return min(limits, default=None)

    def _mean(self, logits: list[Tensor]) -> Tensor:
        log_probs = torch.stack([x.float().log_softmax(-1) for x in logits])  # [M, ..., V]
        return log_probs.logsumexp(0) - math.log(len(logits))

    def encode(self, src: Tensor) -> tuple[list[Tensor], list[Tensor]]:
        encoded = [m.encode(src) for m in self.models]
        return [e[0] for e in encoded], [e[1] for e in encoded]

    def init_cache(self, memories: list[Tensor], masks: list[Tensor], beam: int = 1, max_len: int = 1024) -> EnsembleCache:
        return EnsembleCache([m.init_cache(z, mask, beam, max_len) for m, z, mask in zip(self.models, memories, masks)])

    def decode_step(self, tokens: Tensor, cache: EnsembleCache) -> Tensor:
        return self._mean([m.decode_step(tokens, c) for m, c in zip(self.models, cache.caches)])

    def forward(self, src: Tensor, tgt_in: Tensor) -> Tensor:
        return self._mean([m(src, tgt_in) for m in self.models])
