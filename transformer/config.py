"""Configuration: one dataclass per concern, defaults = the paper's base model (Table 3, §5).

A preset or recipe is a TOML file that lists what it sets (mostly what differs from these defaults); ``--set
section.key=value`` overrides it. Nothing else layers. Unknown keys are errors that suggest the
closest known key, and types are checked, so a typo never silently trains the wrong model.
"""

from __future__ import annotations

import dataclasses
import difflib
import hashlib
import json
import math
import numbers
import os
import re
import tomllib
import typing
from collections.abc import Iterator, Mapping, Set as AbstractSet
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import tomli_w

from .errors import UserError


class ConfigError(UserError, ValueError):
    """A user error in a config file or override; the message names the file and the field."""


@dataclass
class ModelConfig:
    """The architecture (§3). Defaults are the base model of Table 3."""

    n_enc_layers: int = 6  # N (§3.1)
    n_dec_layers: int = 6  # N (§3.1)
    d_model: int = 512
    d_ff: int = 2048  # inner FFN size (§3.3)
    n_heads: int = 8  # h (§3.2.2)
    d_k: int = 0  # per-head query/key size; 0 = d_model / h (§3.2.2)
    d_v: int = 0  # per-head value size; 0 = d_model / h (§3.2.2)
    p_drop: float = 0.1  # residual and embedding dropout, P_drop (§5.4)
    p_drop_attn: float = 0.0  # dropout on attention weights: not in the paper, 0 in the authors' code
    p_drop_relu: float = 0.0  # dropout after the FFN ReLU: not in the paper, 0 in the authors' code
    positional: Literal["sinusoidal", "learned"] = "sinusoidal"  # §3.5; "learned" is Table 3 row E
    # rows of the learned position table (row E); a sinusoidal model computes any position, and this
    # bounds only the output offset a request may ask (decode.max_len_offset, Translator.check)
    max_positions: int = 1024
    share_embeddings: bool = True  # one matrix for source and target embeddings (§3.4)
    share_output: bool = True  # target embedding tied to the pre-softmax projection (§3.4)
    bias: bool = True  # biases in attention projections (the authors' first code had them; A15)
    ln_eps: float = 1e-6  # LayerNorm epsilon of the authors' code (the paper is silent; A7)
    # "post": LayerNorm(x + Dropout(Sublayer(x))) as §3.1 and the paper's code; "pre":
    # x + Dropout(Sublayer(LayerNorm(x))) with a final LayerNorm per stack, the authors' later
    # default (A0, transformer_base v2). DEVIATION(§3.1) when "pre"; only recipes that need it use it.
    norm: Literal["post", "pre"] = "post"

    @property
    def head_dims(self) -> tuple[int, int]:
        """(d_k, d_v) with 0 resolved to d_model / h."""
        return (self.d_k or self.d_model // self.n_heads, self.d_v or self.d_model // self.n_heads)


@dataclass
class DataConfig:
    """Parallel text and its BPE vocabulary (§5.1)."""

    task: Literal["translate", "parse"] = "translate"  # parse: source words -> linearized tree (§6.3)
    src_lang: str = "en"
    tgt_lang: str = "de"
    # Paths as given (absolute, or from ./), else under each data root in order (prepare.resolve_data_path);
    # "" = not given.
    train_src: str = ""
    train_tgt: str = ""
    train_store: str = ""  # a token store from `transformer preprocess`, read instead of train_src/train_tgt
    valid_src: str = ""
    valid_tgt: str = ""
    test_src: str = ""
    test_tgt: str = ""
    test_tok_ref: str = ""  # tokenized lowercased reference for the literature's BLEU (optional)
    vocab_size: int = 37000  # joint BPE vocabulary (§5.1: "about 37000 tokens" for EN-DE)
    spm_input_sentences: int = 2_000_000  # sentences sampled to train sentencepiece
    max_len: int = 256  # a training pair with a side of more pieces than this, EOS included, is skipped (A10)
    # DEVIATION(§5.1), off by default: subword regularization. > 0: every epoch segments the training
    # sentences anew by BPE-dropout (Provilkov et al., 2020) with this merge-dropout probability
    # (sentencepiece's `alpha`; its sample size `nbest_size` applies to unigram models only, and the
    # vocabulary here is BPE). Validation, test and decoding keep the deterministic segmentation.
    subword_alpha: float = 0.0

    def language(self, side: Literal["src", "tgt"]) -> str:
        """The language of a side's text, for its tokenizers (sacreBLEU's, Moses'): the two letters that end
        its training file's name (train.de.gz), else data.{side}_lang's first subtag ("pt-BR": "pt"),
        lowercased. The file's name goes first: a recipe's data.tgt_lang is kept when --set moves the run to
        files of another language."""
        return language_code(getattr(self, f"train_{side}")) or primary_language(getattr(self, f"{side}_lang"))


def primary_language(lang: str) -> str:
    """A language tag's first subtag, lowercased: "pt-BR" and "pt_br" are "pt"."""
    return lang.lower().replace("_", "-").split("-")[0]


def language_code(path: object) -> str | None:
    """The two letters that end a file's name (test.de, test.de.gz), lower-cased; None when it has none."""
    code = Path(str(path)).name.removesuffix(".gz").rsplit(".", 1)[-1]
    return code.lower() if len(code) == 2 and code.isalpha() else None


@dataclass
class TrainConfig:
    """Optimisation and schedule (§5.2-§5.4)."""

    # DEVIATION(§5.1): 4,096 tokens per batch and side by default, not ~25,000 per step: the presets (base,
    # big, Table 3, parse) fit one device of any size; the WMT recipes reach 25,000 (docs/scaling.md)
    max_tokens: int = 4096  # per batch, counted separately on source and target (§5.1)
    update_freq: int = 1  # batches accumulated per optimizer step
    max_steps: int = 100_000  # base model: 100k steps (§5.2)
    max_minutes: float = 0.0  # wall-clock budget; 0 = none
    warmup_steps: int = 4000  # eq. (3)
    lr_scale: float = 1.0  # multiplier on eq. (3); 1.0 is the paper (A1)
    # DEVIATION(§5.3): linear decay to 0 over this last fraction of the budget (max_steps, or
    # max_minutes when that ends first); 0 = eq. (3) to the end, as the paper
    cooldown_fraction: float = 0.0
    beta1: float = 0.9  # §5.3
    beta2: float = 0.98  # §5.3
    adam_eps: float = 1e-9  # §5.3
    weight_decay: float = 0.0
    clip_norm: float = 0.0  # 0 = no clipping, as in the paper's code (A2)
    eps_ls: float = 0.1  # label smoothing ε_ls (§5.4)
    seed: int = 1
    # scale on the Xavier bound of the attention's query, key and value projections at initialisation: 1 as
    # the authors' later code (separate matrices, A8); 1/√2 (0.7071) as fairseq's MultiheadAttention draws all
    # of them, and the authors' first code its self-attention's fused q/k/v kernel (its encoder-decoder
    # attention drew q alone, gain 1, and a fused k/v, √(2/3)). DEVIATION(A8; the paper is silent) when not 1
    init_qkv_gain: float = 1.0
    # the unit of log_every, eval_every, bleu_every and save_every, and so of patience and of the
    # checkpoints decoding averages: "epochs" counts passes over the training data (at the step that ends
    # one), as fairseq's defaults validate, save and count patience once per epoch
    interval_unit: Literal["steps", "epochs"] = "steps"
    log_every: int = 50  # intervals (interval_unit) between log lines
    eval_every: int = 1000  # intervals between validations
    bleu_every: int = 0  # intervals between dev BLEU (beam search on valid, decode settings); 0 = never
    bleu_sentences: int = 500  # first N validation pairs translated for dev BLEU
    save_every: int = 0  # intervals between checkpoints; 0 = by time (save_minutes), which is then off
    # minutes of training between checkpoints (§6.1: "written at 10-minute intervals"), counted across resumes;
    # with save_every set, not used: one clock spaces the checkpoints an average takes
    save_minutes: float = 10.0
    keep_last: int = 20  # checkpoints of the save clock kept on disk (big averages the last 20; §6.1)
    # not in the paper: keep the weights that score best on the validation set in best.safetensors
    # ("valid_loss": the NLL, or "valid_smoothed_loss": the label-smoothed loss training minimises, as
    # fairseq's default --best-checkpoint-metric, at every eval_every; "dev_bleu" at every bleu_every),
    # and with patience N > 0 stop after N such evaluations without improvement; decoding still averages
    # the last checkpoints (§6.1)
    keep_best: Literal["", "valid_loss", "valid_smoothed_loss", "dev_bleu"] = ""
    patience: int = 0
    threads: int = 0  # torch intra-op threads; 0 = torch's default
    # fp32; bf16 autocast; fp16 autocast with dynamic loss scaling; auto: bf16 where the device
    # multiplies bf16 in hardware (a GPU with bf16 units, a CPU with AVX512-BF16 or AMX), else fp32
    precision: Literal["fp32", "bf16", "fp16", "auto"] = "fp32"
    compile: bool = False  # torch.compile the model
    # not in the paper: batches padded to a few shapes (data.ShapeBuckets: N lengths per doubling; 0 = the
    # batches as §5.1 makes them), and with cuda_graphs (which needs them and compile) the compiled graphs
    # replayed as CUDA graphs, one per shape: the host no longer launches a step's kernels one by one
    shape_buckets: int = 0
    cuda_graphs: bool = False
    max_bad_steps: int = 20  # consecutive steps with non-finite gradients (skipped) before training stops
    check_every: int = 1000  # steps between cross-rank parameter checksums (data parallel only)
    dist_timeout_s: float = 300.0  # a collective that waits longer (a rank died or hung) stops the job


EarlyStop = Literal["bound", "top"]  # beam search's stopping rules (DecodeConfig.early_stop)
EARLY_STOPS: tuple[str, ...] = typing.get_args(EarlyStop)
LengthNorm = Literal["gnmt", "length"]  # how a hypothesis' log-prob is normalised (DecodeConfig.length_norm)
LENGTH_NORMS: tuple[str, ...] = typing.get_args(LengthNorm)


@dataclass
class DecodeConfig:
    """Beam search (§6.1)."""

    beam_size: int = 4
    alpha: float = 0.6  # GNMT length penalty exponent, 0 .. MAX_ALPHA
    # "gnmt": log P / ((5 + |Y|) / 6)^α (§6.1, A11); DEVIATION(§6.1) "length", opt-in: log P / |Y|^α, as
    # fairseq's --lenpen, Hugging Face's length_penalty and CTranslate2 divide (|Y| counting the EOS)
    length_norm: LengthNorm = "gnmt"
    max_len_offset: int = 50  # maximum output length = input length + 50
    # "bound": stop a sentence once no alive beam can beat its best finished one (§6.1, A11);
    # DEVIATION(§6.1) "top", opt-in: also once the step's best candidate is EOS (OpenNMT-py's rule)
    early_stop: EarlyStop = "bound"
    batch_size: int = 64  # sentences per decoding batch
    average_last: int = 5  # checkpoints averaged before evaluation (base: 5, big: 20)
    # DEVIATION(§6.3): parse runs' beam writes only well-formed trees of the input (trees.TreeConstraint)
    constrained: bool = True


SPECIAL_PIECES = 3  # tokenizer.py's PAD_ID, EOS_ID, UNK_ID: the pieces no text is made of
MAX_VOCAB = 2**31 - 1  # piece ids are int32 in sentencepiece and in the token store (store.py)
MAX_THREADS = 1024  # train.threads, --threads: past a few thousand, creating the threads crashed the process
FLOAT32_MAX = 3.4028234663852886e38  # torch.finfo(torch.float32).max, without importing torch (config.validate)
# bounds on a model's shape far past any that trains (Table 3's largest: 6 layers, d_model 1024, d_ff 4096, h 16),
# so that a mistyped size is refused in one line, not an overflow, an allocation failure or a hang
MAX_SIZE = {"n_enc_layers": 1000, "n_dec_layers": 1000, "d_model": 2**16, "d_ff": 2**18, "n_heads": 1024,
            "d_k": 2**16, "d_v": 2**16, "max_positions": 2**20}
# GNMT tunes α in [0, 1] (Wu et al. 2016, §7); lp(|Y|) = ((5 + |Y|) / 6)^α overflows a float for α in the
# hundreds, so larger values are refused rather than left to fail inside the search
MAX_ALPHA = 10.0
# train.update_freq: a step's batches are drawn together, so a mistyped huge count filled the memory until the
# process died; train.shape_buckets: buckets per octave of length (8 is the documented choice)
MAX_UPDATE_FREQ, MAX_SHAPE_BUCKETS = 1024, 256
MAX_DIST_TIMEOUT_S = 7 * 24 * 3600  # train.dist_timeout_s
FP32_TINY = 1.1754944e-38  # fp32's smallest normal number: a smaller train.adam_eps flushes to 0 in Adam's update


def _limit(default: float | int, help: str) -> object:
    return field(default=default, metadata={"help": help})


@dataclass(frozen=True)
class ServeLimits:
    """What one request to `transformer serve`, and all of them together, may cost; the defaults suit
    a CPU server. The command line's --max-... options are these fields, with these defaults and help
    texts (serve.py says what each bound does)."""

    max_body_bytes: int = _limit(1 << 20, "request body limit in bytes")
    max_sentences: int = _limit(64, "sentences per translation or score request")
    max_chars: int = _limit(1000, "characters per sentence")
    max_beam: int = _limit(16, "largest beam, or number of sampled draws, a request may ask for (the server's "
                                 "own beam, --beam or the run's, is always allowed)")
    max_batch_tokens: int = _limit(8192, "source tokens x beam per decoding batch, with prefixes, constraints "
                                         "and scored translations: the memory bound")
    max_wait_ms: float = _limit(10.0, "how long a request waits for others to batch with, in milliseconds (0: none)")
    max_queued: int = _limit(256, "sentences waiting to be decoded, all requests together; beyond, 503 (one request "
                                   "of more sentences than this: 422)")
    queue_timeout: float = _limit(30.0, "seconds a request may wait for its decoding to start; then 503")
    max_attention_pieces: int = _limit(128, "pieces per side of an attention request (422 beyond)")
    max_attention_queued: int = _limit(2, "attention requests in progress at once; beyond, 503")
    max_connections: int = _limit(128, "connections open at once; a request on one beyond gets 503")
    request_timeout: float = _limit(20.0, "seconds for a request's headers and body to arrive, and for an answer "
                                          "to move once writing it has stalled, else the connection is closed "
                                          "(slow or stalled clients hold nothing)")
    batching: bool = True  # False: one request at a time (what the load benchmark compares against)

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            # no wait at all batches only the requests already queued: taken (it was refused as not positive)
            if f.name == "max_wait_ms" and value == 0:
                continue
            if not isinstance(value, bool) and not (math.isfinite(value) and value > 0):
                zero = " or 0" if f.name == "max_wait_ms" else ""
                raise ConfigError(f"--{f.name.replace('_', '-')} must be a positive number{zero}, got {value}")
        if self.max_attention_pieces < 2:  # a sentence's EOS alone is one: every request was refused
            raise ConfigError(f"--max-attention-pieces {self.max_attention_pieces}: give at least 2 (a word and "
                              "its EOS)")
        if self.batching and self.max_wait_ms >= 1000 * self.queue_timeout:
            raise ConfigError(f"--max-wait-ms {self.max_wait_ms:g} must be less than --queue-timeout "
                              f"({self.queue_timeout:g} s): a request waiting that long for others to batch with "
                              "would time out")


@dataclass
class Config:
    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    decode: DecodeConfig = field(default_factory=DecodeConfig)

    def training_problem(self) -> str | None:
        """Why `train` refuses these settings where decoding a run takes them, or None: a run's average of more
        checkpoints than training keeps (translate averages the fewer there are, and says so)."""
        if self.decode.average_last > self.train.keep_last:
            return (f"decode.average_last {self.decode.average_last} averages more checkpoints than train.keep_last "
                    f"{self.train.keep_last} keeps: raise train.keep_last to at least {self.decode.average_last}")
        return None

    def validate(self) -> Config:
        """Cross-field checks, in one place. Returns self so calls chain."""
        m, t, d = self.model, self.train, self.decode
        for section, values in self.to_dict().items():  # NaN and inf pass every comparison below
            for key, value in values.items():
                if isinstance(value, float) and not math.isfinite(value):
                    raise ConfigError(f"{section}.{key} must be a finite number, got {value}")
        positive = {
            "model.n_enc_layers": m.n_enc_layers, "model.n_dec_layers": m.n_dec_layers,
            "model.d_model": m.d_model, "model.d_ff": m.d_ff, "model.n_heads": m.n_heads,
            "model.max_positions": m.max_positions, "data.vocab_size": self.data.vocab_size,
            "data.max_len": self.data.max_len, "data.spm_input_sentences": self.data.spm_input_sentences,
            "train.max_tokens": t.max_tokens, "model.ln_eps": m.ln_eps, "train.adam_eps": t.adam_eps,
            "train.lr_scale": t.lr_scale, "train.bleu_sentences": t.bleu_sentences,
            "train.update_freq": t.update_freq, "train.max_steps": t.max_steps,
            "train.warmup_steps": t.warmup_steps, "train.log_every": t.log_every,
            "train.eval_every": t.eval_every, "train.keep_last": t.keep_last,
            "train.max_bad_steps": t.max_bad_steps, "train.check_every": t.check_every,
            "train.dist_timeout_s": t.dist_timeout_s,
            "decode.beam_size": d.beam_size, "decode.batch_size": d.batch_size,
            "decode.average_last": d.average_last,
        }
        for name, value in positive.items():
            if value <= 0:
                raise ConfigError(f"{name} must be positive, got {value}")
        # past a week the timeout overflowed gloo's or Python's clocks (an internal error, or a rank "lost"); below
        # a second, joining the job timed out before any rank could train
        if not 1 <= t.dist_timeout_s <= MAX_DIST_TIMEOUT_S:
            raise ConfigError(f"train.dist_timeout_s {t.dist_timeout_s:g}: give 1 to {MAX_DIST_TIMEOUT_S:,} seconds (a "
                              "week); it bounds how long a collective waits for a rank that died or hung")
        sizes = {"model.n_enc_layers": m.n_enc_layers, "model.n_dec_layers": m.n_dec_layers, "model.d_model": m.d_model,
                 "model.d_ff": m.d_ff, "model.n_heads": m.n_heads, "model.d_k": m.d_k, "model.d_v": m.d_v,
                 "model.max_positions": m.max_positions}
        for name, value in sizes.items():  # past these, building the model overflowed, or hung (1e11 layers)
            if value > MAX_SIZE[name.split(".")[1]]:
                raise ConfigError(f"{name} {value}: more than the {MAX_SIZE[name.split('.')[1]]:,} any model here can "
                                  "have (the paper's largest: 6 layers, d_model 1024, d_ff 4096, 16 heads)")
        if self.data.max_len < 2:  # a side of one piece and its EOS is 2: no pair would be kept, after the vocabulary
            raise ConfigError(f"data.max_len {self.data.max_len}: a sentence of one piece with its EOS is 2 pieces; "
                              "give at least 2")
        if self.data.vocab_size > MAX_VOCAB:
            raise ConfigError(f"data.vocab_size must be at most {MAX_VOCAB:,} (piece ids are int32), got "
                              f"{self.data.vocab_size}")
        if self.data.vocab_size <= SPECIAL_PIECES:  # was refused by the beam's rule below (beam 4, vocabulary 1)
            raise ConfigError(f"data.vocab_size {self.data.vocab_size}: padding, end of sentence and unknown take "
                              f"{SPECIAL_PIECES} pieces, and the text needs pieces of its own (one per character at "
                              "least): give more")
        at_least_zero = {
            "train.bleu_every": t.bleu_every, "train.clip_norm (0 = no clipping)": t.clip_norm,
            "train.weight_decay": t.weight_decay, "train.max_minutes (0 = no time budget)": t.max_minutes,
            "train.save_minutes": t.save_minutes, "train.save_every": t.save_every,
            "train.threads (0 = torch's default)": t.threads,
            "decode.max_len_offset": d.max_len_offset,
        }
        for name, value in at_least_zero.items():
            if value < 0:
                raise ConfigError(f"{name} must be >= 0, got {value}")
        if t.threads > MAX_THREADS:
            raise ConfigError(f"train.threads {t.threads}: give 0 .. {MAX_THREADS} (0 = torch's default, one per core)")
        if not 0 <= t.seed < 2**32:  # sentencepiece's sampling seed is an unsigned 32-bit int
            raise ConfigError(f"train.seed must be in [0, 2^32 - 1], got {t.seed}")
        if m.positional == "learned" and m.max_positions < self.data.max_len:
            raise ConfigError(f"model.max_positions ({m.max_positions}) must be >= data.max_len ({self.data.max_len}): "
                              "the learned position table needs a row for each position of the longest pair kept")
        for name, every in (("train.eval_every", t.eval_every), ("train.bleu_every", t.bleu_every)):
            if every % t.log_every:  # both are computed on a logging step
                raise ConfigError(f"{name} ({every}) must be a multiple of train.log_every ({t.log_every})")
        if t.shape_buckets < 0:
            raise ConfigError(f"train.shape_buckets must be >= 0 (0 = off), got {t.shape_buckets}")
        if t.cuda_graphs and not (t.compile and t.shape_buckets):
            raise ConfigError("train.cuda_graphs replays the compiled graphs, one per batch shape: it needs "
                              "train.compile = true and train.shape_buckets > 0 (e.g. 8)")
        if t.cuda_graphs and t.update_freq > 1:
            raise ConfigError(f"train.cuda_graphs replays one forward and backward per step: train.update_freq "
                              f"{t.update_freq} would chain {t.update_freq} graphs per step for every sequence of "
                              "shapes; take the step's tokens in one batch (train.max_tokens)")
        if (not m.d_k or not m.d_v) and m.d_model % m.n_heads:
            raise ConfigError(
                f"model.d_model ({m.d_model}) is not divisible by model.n_heads ({m.n_heads}); "
                "set model.d_k and model.d_v explicitly")
        if m.d_k < 0 or m.d_v < 0:
            raise ConfigError("model.d_k and model.d_v must be >= 0 (0 = d_model / n_heads)")
        for name, p in [("model.p_drop", m.p_drop), ("model.p_drop_attn", m.p_drop_attn),
                        ("model.p_drop_relu", m.p_drop_relu), ("train.eps_ls", t.eps_ls)]:
            if not 0.0 <= p < 1.0:
                raise ConfigError(f"{name} must be in [0, 1), got {p}")
        if self.data.vocab_size > 1 and t.eps_ls >= (self.data.vocab_size - 1) / self.data.vocab_size:
            # §5.4 over V - 1 classes (A3): each other piece then gets ε/(V-1) >= 1 - ε, and training moves away
            # from the reference
            raise ConfigError(f"train.eps_ls {t.eps_ls} with data.vocab_size {self.data.vocab_size}: the reference "
                              "would get no more probability than any other piece; it must be below (V - 1) / V")
        peak = t.lr_scale * m.d_model ** -0.5 * max(t.warmup_steps, 1) ** -0.5  # eq. (3) at its top
        if peak > FLOAT32_MAX:  # Adam's step in float32 is inf: every weight NaN at the first step
            raise ConfigError(f"train.lr_scale {t.lr_scale:g}: eq. (3)'s peak rate {peak:.3g} is beyond float32's "
                              "range")
        for name, beta in (("train.beta1", t.beta1), ("train.beta2", t.beta2)):
            if not 0.0 <= beta < 1.0:
                raise ConfigError(f"{name} must be in [0, 1), got {beta}")
        if not 0.0 <= t.cooldown_fraction <= 1.0:
            raise ConfigError(f"train.cooldown_fraction must be in [0, 1], got {t.cooldown_fraction}")
        if t.patience < 0:
            raise ConfigError(f"train.patience must be >= 0, got {t.patience}")
        if t.patience and not t.keep_best:
            raise ConfigError(f"train.patience = {t.patience} counts evaluations of train.keep_best without a better "
                              "one, and train.keep_best is not set: set it too (valid_loss, valid_smoothed_loss or "
                              "dev_bleu)")
        if not 0.0 <= self.data.subword_alpha < 1.0:
            raise ConfigError(f"data.subword_alpha must be in [0, 1), got {self.data.subword_alpha}")
        if self.data.subword_alpha and (self.data.train_store or self.data.task != "translate"):
            raise ConfigError("data.subword_alpha needs the training text (train_src/train_tgt, not train_store) of "
                              "a translation task (the parse task's bracket symbols are kept whole)")
        if t.keep_best == "dev_bleu" and (not t.bleu_every or self.data.task != "translate"):
            raise ConfigError("train.keep_best = \"dev_bleu\" needs train.bleu_every > 0 (a translation run)")
        if not t.init_qkv_gain > 0:
            raise ConfigError(f"train.init_qkv_gain must be > 0, got {t.init_qkv_gain}")
        if not 0 <= d.alpha <= MAX_ALPHA:
            raise ConfigError(f"decode.alpha must be in [0, {MAX_ALPHA:g}], got {d.alpha}")
        # the run's own decoding values, bounded as translate's flags are (Translator.check): dev BLEU and every
        # translate without the flag searched with them, a huge offset for ever
        if d.max_len_offset > m.max_positions:
            raise ConfigError(f"decode.max_len_offset {d.max_len_offset}: more than model.max_positions "
                              f"{m.max_positions}, the most positions an output of this model has")
        if d.beam_size > self.data.vocab_size:
            raise ConfigError(f"decode.beam_size {d.beam_size}: wider than data.vocab_size {self.data.vocab_size}, "
                              "all that the first step can offer")
        if t.update_freq > MAX_UPDATE_FREQ:
            raise ConfigError(f"train.update_freq {t.update_freq}: at most {MAX_UPDATE_FREQ:,} batches a step (the "
                              "paper's 8 GPUs are 8); a larger step is train.max_tokens' to make")
        if t.shape_buckets > MAX_SHAPE_BUCKETS:
            raise ConfigError(f"train.shape_buckets {t.shape_buckets}: at most {MAX_SHAPE_BUCKETS} buckets per "
                              "doubling of length (8 is the usual choice)")
        if t.adam_eps < FP32_TINY:
            raise ConfigError(f"train.adam_eps {t.adam_eps:g}: below fp32's smallest normal number ({FP32_TINY:g}), "
                              "it is 0 in Adam's update, and a weight without gradient becomes 0/0 (NaN)")
        return self

    def to_dict(self) -> dict[str, dict[str, Any]]:
        return dataclasses.asdict(self)

    def resume_differences(self, saved: Config) -> list[str]:
        """Fields that a resumed run may not change ("section.key: saved -> now"): the model, the
        data and its vocabulary, the data order and the optimisation. Budgets, logging, checkpoint
        cadence, threads and decoding may change."""
        return [change for section, keys in RESUME_FIXED.items() for change in self.differences(saved, section, keys)]

    def differences(self, saved: Config, section: str, keys: str | tuple[str, ...] = "*") -> list[str]:
        """The ``keys`` of ``section`` ("*": all) set otherwise than in ``saved``, as "section.key: saved -> now";
        two spellings of one file are the same value."""
        old, new = dataclasses.asdict(getattr(saved, section)), dataclasses.asdict(getattr(self, section))
        return [f"{section}.{key}: {old[key]!r} -> {new[key]!r}" for key in (old if keys == "*" else keys)
                if old[key] != new[key] and not _same_file(old[key], new[key])]

    def sha256(self) -> str:
        """Hash of the whole config, recorded in every checkpoint and keying benchmark results; a field
        added since (ADDED_FIELDS) is left out while it holds the value every earlier config behaved as,
        so adding a field changes no earlier config's hash."""
        values = self.to_dict()
        for name, value in ADDED_FIELDS.items():
            section, key = name.split(".")
            if values[section][key] == value:
                del values[section][key]
        return hashlib.sha256(json.dumps(values, sort_keys=True).encode()).hexdigest()

    def model_hash(self) -> str:
        """A short hash of the model section: checkpoints from another architecture are refused."""
        blob = json.dumps(dataclasses.asdict(self.model), sort_keys=True).encode()
        return hashlib.sha256(blob).hexdigest()[:16]


def edited_model(meta: dict, cfg: Config) -> bool:
    """Whether a checkpoint record's model section (read as ``cfg``) is not the one its ``model_hash`` was taken of:
    a record edited by hand (n_heads, ln_eps) loaded its weights silently into another model. A record whose
    model section lacks a field of today's (written before the field was added) is not compared."""
    given = meta.get("config", {}).get("model")
    return (isinstance(meta.get("model_hash"), str) and isinstance(given, dict)
            and given.keys() >= {f.name for f in dataclasses.fields(ModelConfig)} and meta["model_hash"] != cfg.model_hash())


# fields added after config hashes were recorded, with the behaviour every config had before them
ADDED_FIELDS: dict[str, object] = {"train.interval_unit": "steps", "decode.length_norm": "gnmt",
                                   "train.init_qkv_gain": 1.0, "train.shape_buckets": 0, "train.cuda_graphs": False}

RESUME_FIXED: dict[str, str | tuple[str, ...]] = {
    "model": "*",
    "data": ("task", "train_src", "train_tgt", "train_store", "vocab_size", "spm_input_sentences", "max_len",
             "subword_alpha"),
    "train": ("max_tokens", "update_freq", "warmup_steps", "lr_scale", "cooldown_fraction", "beta1", "beta2",
              "adam_eps", "weight_decay", "clip_norm", "eps_ls", "seed", "init_qkv_gain", "shape_buckets"),
}


def _same_file(a: object, b: object) -> bool:
    """Whether two values of a field are two spellings of one existing file or folder (a relative and an
    absolute path, say): a resume with either reads the same data."""
    if not (isinstance(a, str) and isinstance(b, str) and a and b):
        return False
    try:
        return os.path.samefile(a, b)
    except OSError:  # either is not there (from this folder): they are compared as written
        return False


def _check_type(where: str, key: str, value: Any, annotation: Any, toml: bool = True) -> Any:
    """Checks a TOML value against a dataclass field's annotation; ints are accepted for floats. ``toml``: the
    value was read as TOML (a file, --set), whose integers are 64-bit; else a program's own (whole numbers of
    any size for an int field: a batch of 10^20 sentences is every sentence in one batch)."""
    hint = annotation
    if typing.get_origin(hint) is Literal:
        choices = typing.get_args(hint)
        if value not in choices:  # a spelling of one, as keys are offered theirs (valid-loss, BF16, Pre)
            words = [c for c in choices if isinstance(c, str) and c]
            low = value.replace("-", "_").lower() if isinstance(value, str) else ""
            ends = [c for c in words if c.rsplit("_", 1)[-1] == low.rsplit("_", 1)[-1]]
            near = [] if not isinstance(value, str) else (
                [c for c in words if c.replace("_", "") == low.replace("_", "")]
                or ends[:len(ends) == 1]  # valid_bleu is BLEU's, dev_bleu, not valid_loss by its letters
                or difflib.get_close_matches(low, words, n=1))
            raise ConfigError(f"{where}: {key} must be one of {list(choices)}, got {value!r}"
                              + (f"; did you mean {near[0]!r}?" if near else ""))
        return value
    if (hint is float or toml and hint is int) and isinstance(value, int) and not isinstance(value, bool) and \
            abs(value) >= 2**63:
        # TOML's own integers are 64-bit; Python's are not, and 10**400 overflowed a float deep in training
        raise ConfigError(f"{where}: {key} must be below 2^63 in size, got an integer of {len(str(abs(value)))} digits")
    if hint is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if hint is int and isinstance(value, bool) or not isinstance(value, hint):
        quote = ""
        if hint is str and isinstance(value, (list, dict)):  # "quote it" gave a value of stray quotes
            quote = " (one value, not a list or a table)"
        elif hint is str and where.startswith("--set "):  # read as TOML: 123, true, nan and 2024-01-01 are no text
            name, _, raw = where.removeprefix("--set ").partition("=")
            quote = f"; as text, quote it: --set '{name.strip()}=\"{raw.strip()}\"'"
        elif toml and hint is bool and isinstance(value, str) and value.lower() in ("true", "false"):
            quote = f"; TOML writes it {value.lower()}, unquoted"  # "True" (Python's), or "true" quoted in a file
        elif hint in (int, float) and isinstance(value, str) and where.startswith("--set "):  # not read as TOML
            _, _, raw = where.removeprefix("--set ").partition("=")
            quote = " (not a number as TOML writes one: 0.5, not .5; 5, not 05)" if raw.strip() == value else ""
        raise ConfigError(f"{where}: {key} must be {hint.__name__}, got {type(value).__name__} {value!r}{quote}")
    return value


_SECTIONS: dict[str, type] = {"model": ModelConfig, "data": DataConfig, "train": TrainConfig,
                              "decode": DecodeConfig}


def _check_section(section: str, where: str) -> type:
    if section not in _SECTIONS:
        hint = difflib.get_close_matches(section.lower(), _SECTIONS, n=1)  # [MODEL] too
        raise ConfigError(f"{where}: unknown section [{section}]"
                          + (f"; did you mean [{hint[0]}]?" if hint else ""))
    return _SECTIONS[section]


# What fairseq, Marian, OpenNMT-py, Hugging Face and the paper call a setting that has another name here: the hint
# given for it (without one, the closest spelling was offered: lr_scale for lr with no word that it is a factor,
# max_steps for accum_steps, p_drop_relu for dropout_rate)
_LR = "train.lr_scale (a factor on eq. (3)'s schedule, 1 = the paper's: no rate is set directly)"
_EPOCHS = "train.max_steps or train.max_minutes (budgets are in updates or minutes, not epochs)"
OTHER_NAMES: dict[str, str] = {
    "label_smoothing": "train.eps_ls", "dropout": "model.p_drop", "attention_dropout": "model.p_drop_attn",
    "relu_dropout": "model.p_drop_relu", "activation_dropout": "model.p_drop_relu", "lr": _LR,
    "learning_rate": _LR, "dropout_rate": "model.p_drop", "residual_dropout": "model.p_drop",
    "hidden_size": "model.d_model", "embed_dim": "model.d_model", "encoder_embed_dim": "model.d_model",
    "ffn_dim": "model.d_ff", "filter_size": "model.d_ff", "intermediate_size": "model.d_ff",
    "encoder_ffn_embed_dim": "model.d_ff", "d_head": "model.d_k", "head_dim": "model.d_k",
    "accum_steps": "train.update_freq", "accum_count": "train.update_freq", "grad_clip": "train.clip_norm",
    "gradient_accumulation_steps": "train.update_freq", "max_epochs": _EPOCHS, "max_epoch": _EPOCHS,
    "epochs": _EPOCHS, "num_train_epochs": _EPOCHS, "warmup_updates": "train.warmup_steps",
    "warmup": "train.warmup_steps",
    "max_update": "train.max_steps", "train_steps": "train.max_steps", "batch_size": "train.max_tokens",
    "clip_grad_norm": "train.clip_norm", "max_grad_norm": "train.clip_norm", "layers": "model.n_enc_layers",
    "encoder_layers": "model.n_enc_layers", "decoder_layers": "model.n_dec_layers", "heads": "model.n_heads",
    "beam": "decode.beam_size", "lenpen": "decode.alpha", "length_penalty": "decode.alpha",
}


def _apply(cfg: Config, section: str, key: str, value: Any, where: str, toml: bool = True) -> None:
    cls = _check_section(section, where)
    hints = typing.get_type_hints(cls)
    if key not in hints:
        # the key of another section first: train.max_len was offered train.max_tokens (data.max_len exists);
        # each as keys are spelt, in lower case (train.MAX_STEPS was offered nothing)
        low = key.lower()
        if low in hints:
            hint = [f"{section}.{low}"]
        elif OTHER_NAMES.get(low, "").startswith(f"{section}."):  # train.batch_size: not decode.batch_size
            hint = [OTHER_NAMES[low]]
        else:
            hint = [f"{name}.{low}" for name, other in _SECTIONS.items() if low in typing.get_type_hints(other)]
            hint = hint or ([OTHER_NAMES[low]] if low in OTHER_NAMES else [
                f"{section}.{k}" for k in difflib.get_close_matches(low, hints, n=1)])
        raise ConfigError(f"{where}: unknown key {section}.{key}" + (f"; did you mean {hint[0]}?" if hint else ""))
    setattr(getattr(cfg, section), key, _check_type(where, f"{section}.{key}", value, hints[key], toml))


def _parse_override(text: str) -> tuple[str, str, Any]:
    """'train.max_steps=100' -> ('train', 'max_steps', 100); the value is read as TOML."""
    name, sep, raw = text.partition("=")
    section, dot, key = name.strip().partition(".")
    if not sep or not dot or not key:
        raise ConfigError(f"--set {text!r}: expected section.key=value, e.g. train.max_steps=1000")
    try:
        value = tomllib.loads(f"v = {raw.strip()}")["v"]
    except tomllib.TOMLDecodeError as e:
        if raw.strip().startswith(('"', "'")):  # kept with its quotes, it named a file '"train.en' nowhere found
            escapes = "" if "\\" not in raw else "; in \"...\" a backslash escapes: " + (
                "give a Windows path as '...'" if "'" not in raw else "write each as \\\\")
            raise ConfigError(f"--set {text}: the quoted value is no TOML string "
                              f"({str(e).split(' (at ')[0]}){escapes}") from None
        value = raw.strip()  # a bare string such as a path
    return section.strip(), key.strip(), value


# a wheel carries the presets inside the package; a checkout (an editable install) keeps them at its root
_PACKAGE = Path(__file__).resolve().parent
PRESET_DIR = next((d for d in (_PACKAGE / "configs", _PACKAGE.parent / "configs") if (d / "base.toml").is_file()),
                  _PACKAGE / "configs")


def _preset(name: str) -> Path | None:
    """The preset file ``name`` names in configs/ or configs/table3/, None when there is none."""
    return next((p for p in (PRESET_DIR / f"{name}.toml", PRESET_DIR / "table3" / f"{name}.toml") if p.is_file()), None)


def resolve_config_path(name_or_path: str) -> Path:
    """A path to a TOML file, or a preset name looked up in configs/ and configs/table3/. A folder is no config,
    so a preset's bare name is the preset even where a folder of that name is here (a run folder named after it)."""
    path = Path(name_or_path)
    if path.is_dir() and path.name == name_or_path and (preset := _preset(name_or_path)):
        return preset
    if path.suffix == ".toml" or path.exists():
        if path.is_dir():
            raise ConfigError(f"{path}: a folder, not a config file")
        if path.exists() and not path.is_file():  # a pipe (`<(...)`): the ranks of `train --nproc` read it again
            raise ConfigError(f"{path}: a pipe or device, not a config file; write the config to a file")
        if not path.is_file():
            hint = (f"; the preset is named {path.stem!r} alone, found from any folder" if _preset(path.stem)
                    else f" (from {Path.cwd()})")
            raise ConfigError(f"config file not found: {path}{hint}")
        return path
    if preset := _preset(name_or_path):
        return preset
    known = sorted(p.stem for p in PRESET_DIR.rglob("*.toml"))
    if not known:
        raise ConfigError(f"unknown preset or config {name_or_path!r}, and no presets are installed ({PRESET_DIR} "
                          "is missing: an incomplete install); give a config file's path")
    # a1 for A1: difflib's ratio of the two is 0.5, below its cutoff
    hint = ([k for k in known if k.lower() == name_or_path.lower()]
            or difflib.get_close_matches(name_or_path, known, n=1))
    raise ConfigError(f"unknown preset or config {name_or_path!r}"
                      + (f"; did you mean {hint[0]!r}?" if hint else f"; known presets: {', '.join(known)}"))


def set_section(cfg: Config, section: str, values: object, where: str) -> None:
    """``values``, a mapping of ``section``'s keys (a program's own overrides), set on ``cfg`` as a config
    file's are: each key known, each value of its field's type; ``where`` names them in an error."""
    if not isinstance(values, Mapping):
        raise ConfigError(f"{where}: a dict of {section}.* fields, not {type(values).__name__} {values!r}")
    for key, value in values.items():
        _apply(cfg, section, str(key), value, where, toml=False)


def config_from_dict(data: dict[str, Any], where: str = "config", lines: Mapping[str, int] | None = None) -> Config:
    """``lines``: where a file set each section and section.key (``key_lines``), said in an error beside ``where``."""
    if not isinstance(data, dict):  # a checkpoint record edited by hand, or written by something else
        raise ConfigError(f"{where}: must be a table of [sections], not {type(data).__name__}")
    cfg = Config()
    for section, values in data.items():
        if not isinstance(values, dict):
            raise ConfigError(f"{at_line(where, lines, section)}: top-level key {section!r} must be a [section] table")
        _check_section(section, at_line(where, lines, section))
        for key, value in values.items():
            _apply(cfg, section, key, value, at_line(where, lines, f"{section}.{key}"))
    return cfg


def at_line(where: str, lines: Mapping[str, int] | None, name: str) -> str:
    """``where`` with the line that set ``name`` in it, where ``lines`` knows it ("configs/x.toml, line 7")."""
    return f"{where}, line {lines[name]}" if lines and name in lines else where


_TOML_KEY = r"""(?:[A-Za-z0-9_-]+|"[^"\\\n]*"|'[^'\n]*')"""  # a bare key, or a quoted one
_TOML_DOTTED = re.compile(rf"\s*({_TOML_KEY}(?:\s*\.\s*{_TOML_KEY})*)\s*")


def key_lines(text: str) -> dict[str, int]:
    """The line (from 1) on which a config file's text opens each [section] and sets each section.key, for its
    errors: tomllib says where the syntax breaks, not where a well-formed value of the wrong type stands. Keys
    set inside an inline table or an array of tables are not found (their errors name the file alone)."""
    found: dict[str, int] = {}
    for parts, number in _named_lines(text):
        for n in range(1, len(parts) + 1):  # a dotted name opens each table on its way: [model.sub.deep]
            found.setdefault(".".join(parts[:n]), number)  # and "sub.x = 1" in [model] opens model.sub
    return found


def _named_lines(text: str) -> Iterator[tuple[list[str], int]]:
    """Each [table] header and key = value line of a TOML text: the full dotted name it opens or sets, and its
    line (from 1)."""
    table: list[str] = []
    within, depth = "", 0  # the quotes of a multi-line string the line is in; the brackets of an array open
    for number, line in enumerate(text.split("\n"), 1):  # TOML's lines: splitlines() broke at U+2028 too
        stripped = line.lstrip()
        if within or depth > 0:  # a string's or an array's line: no header or key
            within, opened = _still_open(line, within)
            depth += opened
            continue
        if stripped.startswith("[["):
            table = ["[["]  # an array of tables: nothing of ours, its keys left unfound
        elif stripped.startswith("[") and (match := _TOML_DOTTED.match(stripped, 1)) and \
                stripped[match.end():].startswith("]"):
            table = _key_parts(match.group(1))
            yield table, number
        elif (match := _TOML_DOTTED.match(line)) and line[match.end():].startswith("="):
            if table[:1] != ["[["]:
                yield table + _key_parts(match.group(1)), number
            within, depth = _still_open(line[match.end() + 1:])


def _still_open(text: str, within: str = "") -> tuple[str, int]:
    """What a TOML line leaves open (``text``: a value, or a line inside a multi-line string ``within``): the quotes
    of a multi-line string it ends inside, else "", and the brackets it opens less those it closes, outside its
    strings and comment. A one-line string holding three quotes ends on its line; a multi-line string opened
    inside an inline table was missed, and an array's string holding a bracket miscounted: the keys after either
    were given the wrong lines, or none."""
    i, depth = 0, 0
    while i < len(text):
        if within:  # a backslash escapes in a basic string, not in a literal one
            if within == '"""' and text[i] == "\\":
                i += 2
            elif text.startswith(within, i):  # up to two more quotes are the string's own, before its end
                i += 3
                while i < len(text) and text[i] == within[0]:
                    i += 1
                within = ""
            else:
                i += 1
        elif text[i] == "#":
            break
        elif text.startswith(('"""', "'''"), i):
            within, i = text[i:i + 3], i + 3
        elif text[i] in "\"'":  # a one-line string
            quote, i = text[i], i + 1
            while i < len(text) and text[i] != quote:
                i += 2 if quote == '"' and text[i] == "\\" else 1
            i += 1
        else:
            depth += (text[i] == "[") - (text[i] == "]")
            i += 1
    return within, depth


def _key_parts(dotted: str) -> list[str]:
    """'train . "max_steps"' -> ['train', 'max_steps']."""
    return [part.strip().strip("\"'") for part in re.findall(_TOML_KEY, dotted)]


def check_strings(values: object, what: str) -> None:
    """ConfigError where a list of strings is meant and something else came: one string above all, a sequence
    too, which was read one character an item (``Translator.translate("A dog runs.")`` answered 11 lines)."""
    if isinstance(values, (str, bytes)):
        raise ConfigError(f"{what}: a list of strings, not one string ({values[:40]!r}): put it in a list")
    check_sequence(values, what, "a list of strings")
    for i, v in enumerate(values, 1):
        if not isinstance(v, str):
            raise ConfigError(f"{what}: a list of strings, holding {type(v).__name__} {v!r}")
        try:  # a lone surrogate (os.fsdecode's, errors="surrogateescape"'s) is no character: sentencepiece raised
            v.encode("utf-8")
        except UnicodeEncodeError as e:
            raise ConfigError(f"{what}: item {i} is not Unicode text: a lone surrogate (U+{ord(v[e.start]):04X}) at "
                              f"character {e.start + 1}") from None


def check_sequence(values: object, what: str, wanted: str) -> None:
    """ConfigError unless ``values`` is a list, a tuple, a NumPy array or a column of a table: in order and
    counted; not a string, a mapping, a set or an iterator. ``wanted`` says what is meant, for the message."""
    if isinstance(values, (str, bytes, Mapping, AbstractSet)) or not (hasattr(values, "__len__")
                                                                     and hasattr(values, "__iter__")):
        raise ConfigError(f"{what}: {wanted}, not {type(values).__name__}")


def check_count(value: object, what: str, minimum: int) -> int:
    """``value`` as an int, where a whole number of at least ``minimum`` is meant (NumPy's integers too); else a
    ConfigError naming ``what`` (a bool is no count: True counted 1)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < minimum:
        raise ConfigError(f"{what}: a whole number >= {minimum}, not {value!r}")
    return int(value)


def check_bools(**values: object) -> None:
    """A ConfigError naming the first of ``values`` that is not True or False ("no" is true: resume="no" resumed)."""
    for name, value in values.items():
        if not isinstance(value, bool):
            raise ConfigError(f"{name}: True or False, not {type(value).__name__} {value!r}")


def as_path(value: object, what: str) -> Path:
    """A path argument of the Python API as a Path: a ConfigError naming ``what`` for anything else, where
    pathlib raised a TypeError of its own (None, a number) or took "" for the current folder."""
    if isinstance(value, (str, os.PathLike)) and os.fspath(value) not in ("", b""):
        return Path(value)
    raise ConfigError(f"{what}: a path (str or pathlib.Path), not {type(value).__name__} {value!r}")


def load_config(name_or_path: str | None = None, overrides: list[str] | None = None) -> Config:
    """Defaults, then one TOML file (a preset name or a path), then --set overrides; validated."""
    if name_or_path is not None:
        as_path(name_or_path, "load_config: the preset or file")
    if overrides is not None:
        check_strings(overrides, "overrides")
    data: dict[str, Any] = {}
    where = "defaults"
    lines: dict[str, int] = {}
    if name_or_path:
        path = resolve_config_path(name_or_path)
        text = toml_text(path)  # read once: parsed, and counted for the lines its errors name
        where, data, lines = str(path), read_toml(path, text), key_lines(text)
    cfg = config_from_dict(data, where, lines)
    given = {f"{section}.{key}": at_line(where, lines, f"{section}.{key}") for section, values in data.items()
             for key in values}
    for text in overrides or []:
        section, key, value = _parse_override(text)
        _apply(cfg, section, key, value, f"--set {text}")
        given[f"{section}.{key}"] = f"--set {text}"
    try:
        return cfg.validate()
    except ConfigError as e:  # say where the value came from, as the type checks do: of the fields a rule
        # names, the one given last (a --set over the file), which is the one the user just changed
        def fields(text: str) -> list[str]:
            return [name for name in re.findall(r"\b[a-z]+\.[a-z0-9_]+\b", text) if name in given]

        order = {f"--set {text}": i for i, text in enumerate(overrides or [])}
        last = max(fields(str(e)), key=lambda name: order.get(given[name], -1), default=None)
        # the rule's fields of one file, each its line (its advice after ";" not): the first named was said, where
        # the edit may be the other's
        at = sorted({lines[name] for name in fields(str(e).split(";")[0])
                     if name in lines and not given[name].startswith("--set ")})
        if last and not given[last].startswith("--set ") and len(at) > 1:
            raise ConfigError(f"{where}, lines {', '.join(map(str, at[:-1]))} and {at[-1]}: {e}") from None
        raise ConfigError(f"{given[last]}: {e}" if last else str(e)) from None


def read_toml(path: Path, text: str | None = None) -> dict[str, Any]:
    """A TOML file's tables; a file that is not TOML (or not UTF-8: the line and byte) is a one-line error
    naming it. Read as the text inputs are (a byte-order mark, an editor's on Windows, read past).
    ``text``: the file's ``toml_text`` where the caller has read it already."""
    text = toml_text(path) if text is None else text
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        # a name given twice: tomllib says "Cannot overwrite a value (at line 4, column 14)", naming neither
        at = re.search(r"\(at line (\d+), column \d+\)$", str(e))
        number = int(at[1]) if at and str(e).startswith("Cannot ") else 0
        named = list(_named_lines(text)) if number else []
        parts = next((p for p, n in named if n == number), None)
        # the nearest: an array of tables' elements each hold the names of the one before
        before = max((n for p, n in named if p == parts and n < number), default=0)
        if before:
            name, lines = ".".join(parts), text.split("\n")
            opened = [lines[n - 1].lstrip().startswith("[") for n in (before, number)]
            raise ConfigError(f"{path}, line {number}: " + (
                f"[{name}] is opened twice (first on line {before}): one [{name}] holds all its keys" if all(opened)
                else f"{name} is set twice (first on line {before}): keep one" if not any(opened)
                else f"{name} is given twice (first on line {before}, as a {'table' if opened[0] else 'value'}): "
                     "keep one")) from None
        raise ConfigError(f"{path}: invalid TOML: {e}") from None


def toml_text(path: Path) -> str:
    """A config file's text, each line ended: without the last one's newline an error there was "at end of
    document", no line named."""
    from .data import DataError, read_lines  # the one reader of text files; torch's import kept off --help's path

    try:
        return "".join(line + "\n" for line in read_lines(Path(path)))
    except DataError as e:  # a config's error, to those that take a ConfigError
        raise ConfigError(str(e)) from None


def dump_toml(cfg: Config) -> str:
    """The full resolved config as TOML (written into every run folder); read back by ``read_toml`` and
    ``config_from_dict`` it is the same config, whatever its strings hold."""
    return tomli_w.dumps(cfg.to_dict())

