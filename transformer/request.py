"""One decoding request (not in the paper): every per-request option in one typed object, and the one
table of which options combine, the options fixed when the model is loaded included.

The command line (`translate`, `evaluate`, `parse`, `attention`, `score`), the server and training's dev
BLEU each build a ``DecodeRequest`` and hand it to ``Translator``; nothing else decodes. Before any
decoding, ``DecodeRequest.verify`` refuses, in one line naming the options, each pair of options that
``REFUSED`` lists and each value the search cannot use, as vLLM's ``SamplingParams._verify_args`` does.
Every other pair of ``OPTIONS`` works; tests/test_cli.py shows, pair by pair, that both options of it
take effect, and docs/decoding.md prints the table.
"""

from __future__ import annotations

import dataclasses
import math
import numbers
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import torch

from .config import (EARLY_STOPS, LENGTH_NORMS, MAX_ALPHA, ConfigError, DecodeConfig, EarlyStop, LengthNorm,
                     check_sequence, check_strings)
from .sampling import Sampling

# The options that can meet in one decoding, in the table's order: a request's, then the Translator's.
OPTIONS = ("beam", "early_stop", "nbest", "scores", "alignment", "prefix", "constraints", "sample",
           "int8", "bf16", "ensemble", "parse", "device")

# Each pair of OPTIONS that does not combine: (option, option, why), the options in the order the line
# names them. Every pair not listed here works.
REFUSED: list[tuple[str, str, str]] = [
    ("sample", "beam", "sampling draws each token; there is no beam to size (nbest sets the number of draws)"),
    ("sample", "early_stop", "each draw ends at its own EOS; there is no beam to stop"),
    ("sample", "constraints", "lexical constraints need beam search"),
    ("constraints", "parse", "its beam writes only trees of the input, and lexical constraints would "
                             "replace that constraint"),
    ("scores", "nbest", "n-best lists carry the score of every hypothesis already"),
    ("alignment", "ensemble", "an ensemble has no one attention to align with"),
    ("int8", "device", "int8 kernels run on the CPU only"),
    ("int8", "bf16", "int8 quantizes the fp32 weights; give one of the two"),
]

SAMPLING_SETTINGS = ("topk", "topp", "temperature", "seed")  # each only with sample
SEED = 1  # sample's seed when none is given: the same draws every time, as any other seed
# The smallest temperature: the smallest normal float32. The log-probs are divided by it, and a
# subnormal divisor is 0 where subnormals are flushed to zero (training turns that on for the whole
# process: train.py), which would make every draw 0/0. Above it, sampling.Sampling.draw never
# overflows to NaN, and a temperature this small draws the greedy choice.
MIN_TEMPERATURE = torch.finfo(torch.float32).tiny
# The largest: float32's largest. A larger divisor is inf in float32, and the tokens excluded at -inf
# (PAD, always) would become -inf / inf = NaN, which no draw takes.
MAX_TEMPERATURE = torch.finfo(torch.float32).max

# How each option and value is spelt on the command line, and in the server's JSON (API).
CLI: dict[str, str] = {
    "beam": "--beam", "early_stop": "--early-stop", "nbest": "--nbest", "scores": "--scores",
    "alignment": "--alignment", "prefix": "--prefix", "constraints": "--constraints", "sample": "--sample",
    "int8": "--int8", "bf16": "--bf16", "ensemble": "--ensemble", "parse": "a parsing run", "device": "--device",
    "alpha": "--alpha", "length_norm": "--length-norm", "max_len_offset": "--max-len-offset",
    "batch_size": "--batch-size",
    "topk": "--topk", "topp": "--topp", "temperature": "--temperature", "seed": "--seed",
    # an input line, and a per-line option's item (``line_of``): numbered from 1 as a file's lines are
    "line": "line {n}", "item": "{option} line {n}",
}
API: dict[str, str] = CLI | {k: k for k in ("beam", "early_stop", "nbest", "scores", "alignment", "prefix",
                                             "constraints", "sample", "alpha", "length_norm", "max_len_offset",
                                             *SAMPLING_SETTINGS)} | {"line": "text[{i}]", "item": "{option}[{i}]"}


def line_of(names: Mapping[str, str], index: int, key: str = "") -> str:
    """Input line ``index`` (from 0), or its item of the per-line option ``key`` (prefix, constraints), as
    ``names`` spell them: "line 3" and "--prefix line 3" on the command line and in Python, "text[2]" and
    "prefix[2]" in the server's JSON, as its other errors name a field (its errors said "line 3" of text[2])."""
    if not key:
        return names["line"].format(n=index + 1, i=index)
    return names["item"].format(option=names[key], n=index + 1, i=index)


@dataclass(frozen=True)
class Setup:
    """What a ``Translator`` fixes when it loads the model, and requests combine with."""

    int8: bool = False
    ensemble: bool = False  # more than one model
    parse: bool = False  # a parsing run's tree constraint (trees.TreeConstraint) is on
    device: str = "cpu"
    bf16: bool = False  # the weights in bf16

    def options(self) -> set[str]:
        """The load-time OPTIONS this setup holds (``device``: a device other than the CPU)."""
        given = {"int8": self.int8, "bf16": self.bf16, "ensemble": self.ensemble, "parse": self.parse,
                 "device": torch.device(self.device).type != "cpu"}
        return {k for k, v in given.items() if v}


def refuse_pairs(given: set[str], names: Mapping[str, str] = CLI) -> None:
    """ConfigError naming both options for the first pair of ``given`` that ``REFUSED`` lists."""
    for a, b, why in REFUSED:
        if a in given and b in given:
            raise ConfigError(f"{names[a]} with {names[b]}: {why}")


@dataclass(frozen=True)
class DecodeRequest:
    """Every per-request decoding option. None: not given, so the run's ``decode.*`` value (beam_size,
    alpha, length_norm, max_len_offset, early_stop, batch_size), one plain output (nbest), no prefixes or
    constraints, or sampling's defaults (topk 0: every token, topp 1.0, temperature 1.0, seed 1).

    ``prefixes``: one per input line ("" for none), each output starts with it; ``constraints``: per
    input line, the phrases every output must contain; ``scores`` and ``alignment`` say what the answer
    holds beside the text (the command line writes them; n-best lists always carry scores; in a program an
    output's alignment is ``figures.align(translator, line, output)``)."""

    beam_size: int | None = None
    alpha: float | None = None
    length_norm: LengthNorm | None = None
    max_len_offset: int | None = None
    early_stop: EarlyStop | None = None
    batch_size: int | None = None
    nbest: int | None = None
    scores: bool = False
    alignment: bool = False
    prefixes: Sequence[str] | None = None
    constraints: Sequence[Sequence[str]] | None = None
    sample: bool = False
    topk: int | None = None
    topp: float | None = None
    temperature: float | None = None
    seed: int | None = None

    def options(self) -> set[str]:
        """The request's OPTIONS that were given."""
        given = {"beam": self.beam_size is not None, "early_stop": self.early_stop is not None,
                 "nbest": self.nbest is not None, "scores": self.scores, "alignment": self.alignment,
                 "prefix": self.prefixes is not None, "constraints": self.constraints is not None,
                 "sample": self.sample}
        return {k for k, v in given.items() if v}

    def verify(self, setup: Setup = Setup(), run: DecodeConfig = DecodeConfig(), lines: int | None = None,
               names: Mapping[str, str] = CLI) -> None:
        """ConfigError, one line naming the option(s), for a pair of options the table refuses (with the
        translator's ``setup``), a sampling setting without sampling, a value the search cannot use, an
        n-best list longer than the beam (``run``'s beam unless given), or, given the number of input
        ``lines``, prefixes or constraints for another number of lines, and a flag (scores, alignment, sample)
        that is not a bool. Nothing else is refused."""
        for key, value in (("scores", self.scores), ("alignment", self.alignment), ("sample", self.sample)):
            if not isinstance(value, bool):  # taken for its truth: sample="no" sampled
                raise ConfigError(f"{names[key]} {value!r}: must be True or False")
        refuse_pairs(self.options() | setup.options(), names)
        if self.prefixes is not None:
            check_strings(self.prefixes, f"{names['prefix']} (one string a line)")
        if self.constraints is not None:
            check_sequence(self.constraints, names["constraints"], "a list of phrases a line")  # as prefixes are
            for i, phrases in enumerate(self.constraints):
                check_strings(phrases, f"{line_of(names, i, 'constraints')} (a list of phrases)")
        for key, value in (("beam", self.beam_size), ("max_len_offset", self.max_len_offset), ("nbest", self.nbest),
                           ("batch_size", self.batch_size), ("topk", self.topk), ("seed", self.seed)):
            if value is not None and (isinstance(value, bool) or not isinstance(value, numbers.Integral)):
                raise ConfigError(f"{names[key]} {value!r}: must be a whole number")
        for key, value in (("alpha", self.alpha), ("topp", self.topp), ("temperature", self.temperature)):
            if value is not None and (isinstance(value, bool) or not isinstance(value, numbers.Real)):
                raise ConfigError(f"{names[key]} {value!r}: must be a number")
        for key in SAMPLING_SETTINGS:
            if getattr(self, key) is not None and not self.sample:
                raise ConfigError(f"{names[key]} without {names['sample']}: a setting of sampling")

        def bad(key: str, value: object, why: str) -> ConfigError:  # a line break or lone surrogate in a string
            # as Python writes it: the error is one line, and one the server can encode
            shown = repr(value) if isinstance(value, str) and not value.isprintable() else value
            return ConfigError(f"{names[key]} {shown}: {why}")

        if self.beam_size is not None and self.beam_size < 1:
            raise bad("beam", self.beam_size, "must be at least 1")
        if self.alpha is not None and not (math.isfinite(self.alpha) and 0 <= self.alpha <= MAX_ALPHA):
            raise bad("alpha", self.alpha, f"must be a finite number >= 0 (the early stop's bound needs α >= 0) and "
                                           f"<= {MAX_ALPHA:g} (beyond, the length penalty overflows)")
        if self.length_norm is not None and self.length_norm not in LENGTH_NORMS:
            raise bad("length_norm", self.length_norm, f"must be one of {', '.join(LENGTH_NORMS)}")
        if self.max_len_offset is not None and self.max_len_offset < 0:
            raise bad("max_len_offset", self.max_len_offset, "must be >= 0")
        if self.batch_size is not None and self.batch_size < 1:
            raise bad("batch_size", self.batch_size, "must be at least 1")
        if self.early_stop is not None and self.early_stop not in EARLY_STOPS:
            raise bad("early_stop", self.early_stop, f"must be one of {', '.join(EARLY_STOPS)}")
        if self.nbest is not None and self.nbest < 1:
            raise bad("nbest", self.nbest, "must be at least 1")
        beam = run.beam_size if self.beam_size is None else self.beam_size
        if self.nbest is not None and not self.sample and self.nbest > beam:
            size = names["beam"] if self.beam_size is not None else "the run's beam size"
            raise ConfigError(f"{names['nbest']} {self.nbest} with {size} {beam}: an n-best list holds at most "
                              f"the beam's hypotheses; give {names['beam']} {self.nbest} or more")
        if self.topk is not None and self.topk < 0:
            raise bad("topk", self.topk, "must be >= 0 (0: every token)")
        if self.topp is not None and not 0 < self.topp <= 1:
            raise bad("topp", self.topp, "must be in (0, 1]")
        if self.temperature is not None and not MIN_TEMPERATURE <= self.temperature <= MAX_TEMPERATURE:
            raise bad("temperature", self.temperature, f"must be in {MIN_TEMPERATURE:.2g} .. {MAX_TEMPERATURE:.2g} "
                                                       "(float32's normal numbers: the log-probs are divided by it)")
        if self.seed is not None and not 0 <= self.seed < 2**64:
            raise bad("seed", self.seed, "must be in 0 .. 2^64 - 1 (a seed of torch's generator)")
        for key, values in self.per_line().items():
            if lines is not None and len(values) != lines:
                raise ConfigError(f"{names[key]}: {len(values)} given for {lines} input line{'s' * (lines != 1)}")

    def per_line(self) -> dict[str, Sequence]:
        """The options given line by line that the request holds: option ("prefix", "constraints") -> its
        values, the i-th for input line i."""
        return {key: values for key, values in (("prefix", self.prefixes), ("constraints", self.constraints))
                if values is not None}

    def lines(self, start: int, stop: int) -> DecodeRequest:
        """The request for input lines start .. stop - 1 alone: their own prefixes and constraints (fewer
        where the request holds fewer)."""
        cut = {"prefixes": self.prefixes, "constraints": self.constraints}
        return dataclasses.replace(self, **{k: v[start:stop] for k, v in cut.items() if v is not None})

    def resolve(self, run: DecodeConfig) -> DecodeRequest:
        """The request with ``run``'s ``decode.*`` values where it gives none; beam size and early stop
        only where they apply (not when sampling), so that a resolved request verifies as it did."""
        search = {} if self.sample else {"beam_size": self.beam_size or run.beam_size,
                                         "early_stop": self.early_stop or run.early_stop}
        return dataclasses.replace(
            self, alpha=run.alpha if self.alpha is None else self.alpha, length_norm=self.length_norm or run.length_norm,
            max_len_offset=run.max_len_offset if self.max_len_offset is None else self.max_len_offset,
            batch_size=self.batch_size or run.batch_size, **search)

    def sampling(self, device: torch.device) -> Sampling | None:
        """The draws ``sample`` asks for, with a generator on ``device`` seeded by ``seed``; None without it."""
        if not self.sample:
            return None
        # as Python's numbers: numpy's and fractions' (accepted as whole and real numbers) failed in torch
        generator = torch.Generator(device).manual_seed(SEED if self.seed is None else int(self.seed))
        return Sampling(generator, int(self.topk or 0), 1.0 if self.topp is None else float(self.topp),
                        1.0 if self.temperature is None else float(self.temperature))
