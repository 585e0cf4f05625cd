"""The training loop (§5): token-budget batches, Adam + eq. (3), label smoothing, checkpoints, resume.

A run folder holds everything needed to continue or to use the model: ``config.toml`` (the resolved
config), ``spm.model`` (the joint BPE vocabulary), ``checkpoints/`` (safetensors + JSON),
``train.log`` (plain text), ``metrics.jsonl`` (one JSON record per log line) and ``tb/``
(TensorBoard). Resuming restores weights, optimizer moments, the step counter, the position in the
epoch and the RNG state, so a resumed run reproduces an uninterrupted one.
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from tqdm import tqdm

from .checkpoint import latest_checkpoint, save_checkpoint
from .config import Config, ConfigError, config_from_dict, dump_toml
from .data import (Batch, BatchOrder, DataError, Example, collate, encode_pairs, make_batches, padding_fraction,
                   read_parallel, resolve_data_path)
from .loss import label_smoothed_loss
from .model import Transformer, count_parameters
from .optim import learning_rate, make_optimizer
from .tokenizer import PAD_ID, Tokenizer


class TrainError(RuntimeError):
    """A user-facing problem with a run (its folder, its resume state); one-line message."""


@dataclass
class TrainState:
    """Where training stands; saved in every checkpoint's JSON."""

    step: int = 0  # optimizer steps taken
    epoch: int = 0
    batch_in_epoch: int = 0  # position in this epoch's batch order
    elapsed_s: float = 0.0  # training wall time before this process
    tgt_tokens: int = 0  # non-pad target tokens trained on


@dataclass
class Run:
    """A run folder's fixed parts: config, vocabulary, data."""

    cfg: Config
    out: Path
    tokenizer: Tokenizer
    train: list[Example]
    valid: list[Example]
    batches: list[list[int]]


def run_logger(out: Path, quiet: bool = False):
    """Returns log(msg): appends to train.log and prints above the progress bar."""
    path = out / "train.log"

    def log(msg: str) -> None:
        with path.open("a", encoding="utf-8") as f:
            f.write(f"{time.strftime('%Y-%m-%d %H:%M:%S')} {msg}\n")
        if not quiet:
            tqdm.write(msg)
    return log


def prepare_run(cfg: Config, out: Path, resume: bool, log) -> Run:
    """Creates or re-opens the run folder, trains or loads the BPE vocabulary, reads the data."""
    out.mkdir(parents=True, exist_ok=True)
    config_path = out / "config.toml"
    has_checkpoints = any((out / "checkpoints").glob("*.json")) if (out / "checkpoints").exists() else False
    if has_checkpoints and not resume:
        raise TrainError(f"{out} already holds checkpoints: pass --resume to continue, or choose another --out")
    if config_path.exists() and resume:
        import tomllib
        saved = config_from_dict(tomllib.loads(config_path.read_text(encoding="utf-8")), str(config_path))
        if saved.model != cfg.model or saved.data.vocab_size != cfg.data.vocab_size:
            raise TrainError(f"--resume with a config whose model or vocabulary differs from {config_path}")
    config_path.write_text(dump_toml(cfg), encoding="utf-8")

    d = cfg.data
    for name in ("train_src", "train_tgt", "valid_src", "valid_tgt"):
        if not getattr(d, name):
            raise ConfigError(f"data.{name} is not set")
    train_src, train_tgt = resolve_data_path(d.train_src), resolve_data_path(d.train_tgt)
    spm_path = out / "spm.model"
    if spm_path.exists():
        tokenizer = Tokenizer(spm_path)
    else:
        log(f"training a joint BPE vocabulary of {d.vocab_size} pieces on {train_src.name} + {train_tgt.name}")
        tokenizer = Tokenizer.train([train_src, train_tgt], spm_path, d.vocab_size, d.spm_input_sentences,
                                    seed=cfg.train.seed)
    train, stats = encode_pairs(read_parallel(train_src, train_tgt), tokenizer, d.max_len)
    log(f"train: {len(train)} pairs used of {stats.n_pairs}; skipped {stats.skipped_empty} with an empty side, "
        f"{stats.skipped_long} longer than {d.max_len} pieces")
    if not train:
        raise DataError(f"{train_src}: no usable training pairs")
    valid, _ = encode_pairs(read_parallel(resolve_data_path(d.valid_src), resolve_data_path(d.valid_tgt)),
                            tokenizer, max_len=10**9)
    batches = make_batches(train, cfg.train.max_tokens)
    log(f"{len(batches)} batches of <= {cfg.train.max_tokens} tokens per side; "
        f"padding {100 * padding_fraction(train, batches):.1f}% of positions")
    return Run(cfg, out, tokenizer, train, valid, batches)


def batch_loss(model: Transformer, batch: Batch, eps_ls: float) -> torch.Tensor:
    """Label-smoothed loss summed over the batch's non-pad target tokens (ε_ls = 0: the NLL)."""
    memory, src_mask = model.encode(batch.src)
    hidden = model.decode(batch.tgt_in, memory, src_mask)
    keep = batch.tgt_out != PAD_ID
    # the output projection is the largest matmul: compute it only where there is a target
    return label_smoothed_loss(model.project(hidden[keep]), batch.tgt_out[keep], eps_ls)


def train_step(model: Transformer, optimizer: torch.optim.Optimizer, batches: list[Batch], eps_ls: float,
               lr: float, clip_norm: float = 0.0) -> tuple[float, int]:
    """One optimizer step over accumulated batches; returns (loss sum, non-pad target tokens).

    The loss is normalised by the non-pad target tokens of the whole step (A3), so accumulating
    batches gives the same update as one batch holding them all.
    """
    n_tokens = sum(b.n_tgt_tokens for b in batches)
    for group in optimizer.param_groups:
        group["lr"] = lr
    total = 0.0
    for batch in batches:
        loss = batch_loss(model, batch, eps_ls)
        (loss / n_tokens).backward()
        total += loss.item()
    if clip_norm:
        torch.nn.utils.clip_grad_norm_(model.parameters(), clip_norm)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return total, n_tokens


@torch.inference_mode()
def validate(model: Transformer, examples: list[Example], max_tokens: int) -> dict[str, float]:
    """Per-token NLL and perplexity without smoothing (Table 3's PPL is per word-piece; A3)."""
    model.eval()
    nll_sum, n = 0.0, 0
    for indices in make_batches(examples, max_tokens):
        batch = collate(examples, indices)
        nll = batch_loss(model, batch, 0.0)
        nll_sum, n = nll_sum + nll.item(), n + batch.n_tgt_tokens
    model.train()
    nll = nll_sum / max(n, 1)
    return {"valid_nll": nll, "valid_ppl": math.exp(min(nll, 50.0))}


def optimizer_tensors(optimizer: torch.optim.Optimizer) -> tuple[dict[str, torch.Tensor], list[dict[str, Any]]]:
    """Adam's state as flat tensors (for safetensors) and its JSON-able param groups."""
    sd = optimizer.state_dict()
    tensors = {f"optim.{i}.{k}": torch.as_tensor(v) for i, s in sd["state"].items() for k, v in s.items()}
    return tensors, sd["param_groups"]


def load_optimizer_tensors(optimizer: torch.optim.Optimizer, tensors: dict[str, torch.Tensor],
                           groups: list[dict[str, Any]]) -> None:
    state: dict[int, dict[str, torch.Tensor]] = {}
    for name, value in tensors.items():
        if name.startswith("optim."):
            _, i, k = name.split(".", 2)
            state.setdefault(int(i), {})[k] = value
    optimizer.load_state_dict({"state": state, "param_groups": groups})


def train(cfg: Config, out: Path, resume: bool = False, quiet: bool = False) -> dict[str, Any]:
    """Trains until train.max_steps or train.max_minutes; returns a summary of the run."""
    if cfg.train.threads:
        torch.set_num_threads(cfg.train.threads)
    # Adam's second moments of rarely seen embedding rows decay into denormal floats, which make
    # CPU arithmetic (sqrt in the update) tens of times slower; flushing them to zero costs nothing.
    torch.set_flush_denormal(True)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    log = run_logger(out, quiet)
    run = prepare_run(cfg, out, resume, log)
    t = cfg.train
    torch.manual_seed(t.seed)
    model = Transformer(cfg.model, run.tokenizer.vocab_size)
    optimizer = make_optimizer(model, t)
    state = TrainState()
    meta_base = {"config": cfg.to_dict(), "vocab_sha256": run.tokenizer.sha256, "model_hash": cfg.model_hash(),
                 "vocab_size": run.tokenizer.vocab_size}
    if resume:
        ckpt = latest_checkpoint(out, warn=log)
        if ckpt is None:
            log(f"--resume: no checkpoint in {out}/checkpoints; starting from scratch")
        else:
            if ckpt.meta.get("vocab_sha256") != run.tokenizer.sha256:
                raise TrainError(f"{ckpt.path}: trained with another vocabulary than {out / 'spm.model'}")
            model.load_state_dict(ckpt.weights)
            load_optimizer_tensors(optimizer, ckpt.state, ckpt.meta["optim_param_groups"])
            torch.set_rng_state(ckpt.state["rng.torch"])
            state = TrainState(**ckpt.meta["train_state"])
            log(f"resumed from {ckpt.path.name} at step {state.step}")
    model.train()
    log(f"model: {count_parameters(model):,} parameters; vocabulary {run.tokenizer.vocab_size}; "
        f"{t.max_tokens} tokens per batch x update_freq {t.update_freq}")

    from torch.utils.tensorboard import SummaryWriter  # imported late: it is slow to import
    writer = SummaryWriter(str(out / "tb"))
    order = BatchOrder(len(run.batches), t.seed)
    epoch_order = order.epoch_order(state.epoch)

    def next_batch() -> Batch:
        nonlocal epoch_order
        if state.batch_in_epoch >= len(epoch_order):
            state.epoch, state.batch_in_epoch = state.epoch + 1, 0
            epoch_order = order.epoch_order(state.epoch)
        indices = run.batches[epoch_order[state.batch_in_epoch]]
        state.batch_in_epoch += 1
        return collate(run.train, indices)

    def save() -> None:
        tensors, groups = optimizer_tensors(optimizer)
        tensors["rng.torch"] = torch.get_rng_state()
        meta = dict(meta_base, optim_param_groups=groups,
                    train_state={**state.__dict__, "elapsed_s": elapsed()})
        save_checkpoint(out, state.step, model.state_dict(), tensors, meta, t.keep_last)

    start = time.monotonic()
    elapsed = lambda: state.elapsed_s + time.monotonic() - start  # noqa: E731
    last_save, window = time.monotonic(), {"loss": 0.0, "tokens": 0, "t0": time.monotonic()}
    bar = tqdm(total=t.max_steps, initial=state.step, desc="train", unit="step", disable=quiet,
               dynamic_ncols=True, mininterval=1.0)
    metrics_path = out / "metrics.jsonl"
    while state.step < t.max_steps and not (t.max_minutes and elapsed() >= 60 * t.max_minutes):
        lr = learning_rate(state.step + 1, cfg.model.d_model, t.warmup_steps, t.lr_scale)  # eq. (3)
        step_loss, n_tokens = train_step(model, optimizer, [next_batch() for _ in range(t.update_freq)],
                                         t.eps_ls, lr, t.clip_norm)
        state.step += 1
        state.tgt_tokens += n_tokens
        window["loss"] += step_loss
        window["tokens"] += n_tokens
        bar.update(1)
        if state.step % t.log_every == 0 or state.step == t.max_steps:
            dt = time.monotonic() - window["t0"]
            rec = {"step": state.step, "epoch": state.epoch, "minutes": elapsed() / 60, "lr": lr,
                   "train_loss": window["loss"] / window["tokens"], "tokens_per_s": window["tokens"] / dt}
            bar.set_postfix(loss=f"{rec['train_loss']:.3f}", lr=f"{lr:.2e}", tok_s=f"{rec['tokens_per_s']:.0f}")
            if state.step % t.eval_every == 0:
                rec.update(validate(model, run.valid, t.max_tokens))
            for key, value in rec.items():
                if key not in ("step", "epoch"):
                    writer.add_scalar(key, value, state.step)
            with metrics_path.open("a", encoding="utf-8") as f:
                f.write(json.dumps(rec) + "\n")
            log(" ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in rec.items()))
            window = {"loss": 0.0, "tokens": 0, "t0": time.monotonic()}
        if (t.save_every and state.step % t.save_every == 0) or (
                t.save_minutes and time.monotonic() - last_save >= 60 * t.save_minutes):
            save()
            last_save = time.monotonic()
    bar.close()
    save()
    writer.close()
    result = validate(model, run.valid, t.max_tokens)
    summary = {"step": state.step, "train_minutes": elapsed() / 60, "tgt_tokens": state.tgt_tokens,
               "tokens_per_s": state.tgt_tokens / max(elapsed(), 1e-9), **result}
    log(f"done: {json.dumps(summary)}")
    return summary
