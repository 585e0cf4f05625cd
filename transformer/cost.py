"""Training cost (Table 2) and what a run needs on given hardware: FLOPs, time, memory.

The paper estimated training FLOPs as "training time × number of GPUs × sustained single-precision
capacity of each GPU" (Table 2, footnote: 9.5 TFLOPS for a P100). Here the model's own matmul FLOPs
per target token (``flops_per_token``) × tokens per step × steps give the useful work; dividing it by
the paper's estimate gives the utilisation the authors' runs implicitly had, and dividing it by a
device's peak × an assumed MFU gives the time a run takes.
"""

from __future__ import annotations

from dataclasses import dataclass

from .config import Config, ModelConfig, load_config
from .model import FLOPS_SENTENCE_LEN, count_parameters, flops_per_token, on_meta

P100_FP32_FLOPS = 9.5e12  # Table 2's footnote
PAPER_HOURS = {"base": 12.0, "big": 3.5 * 24}  # §5.2: 8 P100 GPUs
PAPER_TOKENS_PER_STEP = 25_000  # §5.1: "approximately 25000 source tokens and 25000 target tokens" a batch
H100_BF16_FLOPS = 989e12  # H100 SXM dense bf16 tensor-core peak (NVIDIA datasheet)
DEFAULT_MFU = 0.4  # the share of the peak FLOPs a step is assumed to reach (params --cost --mfu)


@dataclass
class Cost:
    parameters: int
    flops_per_token: float  # training (3 × forward) matmul FLOPs per target token
    tokens_per_step: int  # target tokens per optimizer step, all devices together
    steps: int
    total_flops: float
    weights_bytes_per_device: int  # fp32 weights + gradients + Adam's two moments
    activation_bytes_per_device: float  # estimate, bf16 autocast

    def days(self, devices: int, peak_flops: float = H100_BF16_FLOPS, mfu: float = DEFAULT_MFU) -> float:
        """Wall-clock days at ``mfu`` of ``devices`` × ``peak_flops``."""
        return self.total_flops / (devices * peak_flops * mfu) / 86400

    def step_seconds(self, devices: int, peak_flops: float = H100_BF16_FLOPS, mfu: float = DEFAULT_MFU) -> float:
        return self.flops_per_token * self.tokens_per_step / (devices * peak_flops * mfu)


def training_cost(cfg: Config, vocab_size: int, devices: int = 1, src_len: float = FLOPS_SENTENCE_LEN,
                  tgt_len: float = FLOPS_SENTENCE_LEN) -> Cost:
    """Cost of ``cfg``'s run: tokens per step = max_tokens × update_freq, one process's step (the trainer's is
    that × the processes), taken as the global batch and split over ``devices`` (each process's max_tokens ×
    update_freq set to that / devices), train.max_steps steps, at sentences of FLOPS_SENTENCE_LEN pieces unless
    given."""
    n = count_parameters(on_meta(cfg.model, vocab_size))
    f = flops_per_token(cfg.model, vocab_size, src_len, tgt_len)
    tokens = cfg.train.max_tokens * cfg.train.update_freq
    m = cfg.model
    # activations kept for the backward pass, per token and layer: ~34·d bytes in 16-bit plus the
    # attention maps, 5·h·L bytes (Korthikanti et al. 2022's count for a transformer layer);
    # the decoder's layers hold about 1.5 encoder layers' worth (a second attention), the
    # logits 6·V bytes per target token (bf16 logits + fp32 log-probs)
    per_token_layer = 34 * m.d_model + 5 * m.n_heads * tgt_len
    layers = m.n_enc_layers + 1.5 * m.n_dec_layers
    activations = tokens / devices * (per_token_layer * layers + 6 * vocab_size)
    return Cost(n, f, tokens, cfg.train.max_steps, f * tokens * cfg.train.max_steps, 16 * n, activations)


def cost_report(cfg: Config, preset: str, vocab: int, devices: list[int], mfu: float) -> dict:
    """What `transformer params --cost` reports: the run's FLOPs, its share of Table 2's estimate, and
    for each device count the step time, hours and memory per H100 at ``mfu``."""
    rows = []
    for n in devices:
        c = training_cost(cfg, vocab, n)
        rows.append({"devices": n, "step_seconds": c.step_seconds(n, mfu=mfu), "hours": 24 * c.days(n, mfu=mfu),
                     "memory_gib_per_device": (c.weights_bytes_per_device + c.activation_bytes_per_device) / 2**30})
    report = {"preset": preset, "parameters": c.parameters, "vocab": vocab,
              "flops_per_token": c.flops_per_token, "tokens_per_step": c.tokens_per_step, "steps": c.steps,
              "flops_per_step": c.flops_per_token * c.tokens_per_step, "total_flops": c.total_flops,
              "mfu": mfu, "peak_flops": H100_BF16_FLOPS, "per_devices": rows}
    # Table 2 gives the training cost of the base and the big model alone (the big's shape with EN-FR's dropout
    # included): another shape (a Table 3 row, say) is compared with none
    def shape(m: ModelConfig) -> tuple:
        return m.n_enc_layers, m.n_dec_layers, m.d_model, m.d_ff, m.n_heads, m.head_dims  # d_k 0: d_model / h

    kind = next((k for k in PAPER_HOURS if shape(cfg.model) == shape(load_config(k).model)), None)
    if kind is not None:
        paper = 8 * P100_FP32_FLOPS * PAPER_HOURS[kind] * 3600
        report["table2"] = {"model": kind, "paper_flops": paper, "model_flops_share": c.total_flops / paper,
                            "paper_tokens_per_step": PAPER_TOKENS_PER_STEP,
                            "paper_steps": load_config(kind).train.max_steps}
    return report


def format_cost_report(r: dict) -> str:
    """``cost_report`` as the lines a terminal shows: a summary, Table 2's comparison, a table per device count."""
    lines = [f"{r['preset']}: {r['parameters']:,} parameters (vocabulary {r['vocab']}); "  # as `params` says it
             f"{r['flops_per_token'] / 1e9:.3g} GFLOP per target token "
             f"(training, {FLOPS_SENTENCE_LEN:g}-token sentences); "
             f"{r['tokens_per_step']:,} tokens per step x {r['steps']:,} steps = {r['total_flops']:.3g} FLOPs"]
    if (t2 := r.get("table2")) is None:
        lines.append("Table 2 gives the training cost of the base and the big model only: nothing to compare")
    else:
        kind, paper = t2["model"], t2["paper_flops"]
        lines.append(f"Table 2 ({kind}): 8 P100 x {PAPER_HOURS[kind]:g} h x 9.5 TFLOPS = {paper:.3g} FLOPs; "
                     f"the model's own FLOPs are {r['total_flops'] / paper:.0%} of that")
        if (r["tokens_per_step"], r["steps"]) != (t2["paper_tokens_per_step"], t2["paper_steps"]):
            lines.append(f"  (the paper trained {t2['paper_steps']:,} steps of ~{t2['paper_tokens_per_step']:,} tokens "
                         f"(§5.1-5.2), this config {r['steps']:,} of {r['tokens_per_step']:,}: the WMT recipes, "
                         f"configs/wmt14_en_de_{kind}.toml, hold the paper's batch)")
    # the config's batch is one process's; the trainer's step is that x the processes: each row keeps the batch
    lines += [f"on H100 (bf16 dense peak {H100_BF16_FLOPS / 1e12:.0f} TFLOPS) at MFU {r['mfu']:.0%}, "
              f"{r['tokens_per_step']:,} tokens a step on any number of devices (on N, set max_tokens and "
              "update_freq, a process's, so that max_tokens x update_freq x N is that):",
             "devices | tokens per device | step (ms) | hours | memory per device (GiB, estimate)"]
    lines += [f"{d['devices']:>7} | {r['tokens_per_step'] // d['devices']:>17,} | {_figure(1000 * d['step_seconds'], 1):>9} | "
              f"{_figure(d['hours'], 2):>5} | {_figure(d['memory_gib_per_device'], 1)}" for d in r["per_devices"]]
    return "\n".join(lines)


def _figure(x: float, decimals: int) -> str:
    """``x`` with ``decimals`` places, or two significant digits where those places would show a small model's
    step, hours or memory as 0.0."""
    if x <= 0 or x >= 10 ** -decimals:
        return f"{x:.{decimals}f}"
    return f"{x:.2g}"
