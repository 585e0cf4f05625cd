"""A trained model ready to translate: rebuilt from a run folder's checkpoints alone (§6.1).

By default the weights are the average of the run's last ``decode.average_last`` checkpoints, as
the paper decodes (§6.1: last 5 for base, last 20 for big); ``checkpoint`` picks one file instead
(a training checkpoint or a file written by ``transformer average``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path

import torch

from .checkpoint import CheckpointError, average_checkpoints, checkpoints_to_average, list_checkpoints, load_checkpoint
from .config import config_from_dict
from .data import encode_for_decoding
from .decode import translate_ids
from .model import Transformer
from .runtime import keep_freed_memory
from .tokenizer import Tokenizer


def quantize_int8(model: Transformer) -> Transformer:
    """int8 dynamic quantization for CPU inference: every linear layer, the pre-softmax projection
    included, keeps int8 weights and quantizes its input per batch (activations stay fp32 between
    layers). A speed option, not part of the paper; benchmarks/speed.py measures its BLEU cost."""
    import warnings

    from torch.ao.quantization import quantize_dynamic

    if "output_proj" not in model._modules:  # tied (§3.4): give the projection its own copy to quantize
        weight = model.target_embedding.weight.detach()
        model.output_proj = torch.nn.Linear(weight.size(1), weight.size(0), bias=False)
        model.output_proj.weight = torch.nn.Parameter(weight.clone(), requires_grad=False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch's deprecation notice for its eager quantization API
        return quantize_dynamic(model, {torch.nn.Linear}, dtype=torch.qint8)


class Translator:
    """Model + vocabulary + decoding settings; ``translate`` maps lines to lines, one for one."""

    def __init__(self, run_dir: Path, checkpoint: Path | None = None, log: Callable[[str], None] = print,
                 int8: bool = False, device: str | None = None, decode: dict[str, object] | None = None):
        """``device``: where the model decodes ("cpu", "cuda", "cuda:1"); default a GPU when there is
        one. int8 quantization runs on the CPU only. ``decode``: ``decode.*`` fields that replace the
        run's own (the command line's --beam, --early-stop, ...)."""
        run_dir = Path(run_dir)
        keep_freed_memory()
        if device is None:
            device = "cuda" if torch.cuda.is_available() and not int8 else "cpu"
        try:
            self.device = torch.device(device)
        except RuntimeError as e:
            raise CheckpointError(f"--device {device!r}: {e}") from None
        if int8 and self.device.type != "cpu":
            raise CheckpointError(f"--int8 runs on the CPU only; got --device {device}")
        if self.device.type == "cuda" and not torch.cuda.is_available():
            raise CheckpointError(f"--device {device}: no CUDA GPU is visible to torch {torch.__version__}")
        spm_path = run_dir / "spm.model"
        if not spm_path.is_file():
            raise CheckpointError(f"{run_dir}: not a run folder (no spm.model); train one with `transformer train`")
        self.tokenizer = Tokenizer(spm_path)
        if checkpoint is None:
            paths = list_checkpoints(run_dir)
            if not paths:
                raise CheckpointError(f"{run_dir}/checkpoints: no checkpoints to translate with")
            newest = load_checkpoint(paths[-1], with_state=False)
            meta = newest.meta
        else:
            ckpt = load_checkpoint(Path(checkpoint), with_state=False)
            meta = ckpt.meta
        if meta.get("vocab_sha256") not in (None, self.tokenizer.sha256):
            raise CheckpointError(f"{checkpoint or run_dir}: trained with another vocabulary than {spm_path}")
        self.cfg = config_from_dict(meta["config"], f"{checkpoint or run_dir} (config)")
        self.cfg.decode = dataclasses.replace(self.cfg.decode, **(decode or {}))
        self.cfg.validate()  # the overrides too, before any work: one set of checks for the run's values and ours
        if checkpoint is None:
            paths = checkpoints_to_average(run_dir, self.cfg.decode.average_last)
            log(f"averaging the last {len(paths)} checkpoint(s): {', '.join(p.stem for p in paths)}")
            weights = average_checkpoints(paths) if len(paths) > 1 else load_checkpoint(paths[0]).weights
        else:
            weights = ckpt.weights
        self.model = Transformer(self.cfg.model, self.tokenizer.vocab_size)
        try:
            missing, unexpected = self.model.load_state_dict(weights, strict=False)
        except RuntimeError as e:  # a tensor of the wrong shape
            first = str(e).split("\n\t")[1] if "\n\t" in str(e) else str(e)
            raise CheckpointError(f"{checkpoint or run_dir}: weights do not fit the config ({first})") from None
        if missing or unexpected:
            raise CheckpointError(f"{checkpoint or run_dir}: weights do not fit the config "
                                  f"(missing {missing[:3]}, unexpected {unexpected[:3]})")
        self.model.eval()
        if int8:
            self.model = quantize_int8(self.model)
        self.model.to(self.device)
        self.constraint = None
        if self.cfg.data.task == "parse" and self.cfg.decode.constrained:
            from .trees import TreeConstraint

            self.constraint = TreeConstraint(self.tokenizer.vocabulary())

    def translate(self, lines: list[str], beam_size: int | None = None, alpha: float | None = None,
                  batch_size: int | None = None, progress: bool = False) -> list[str]:
        """One output line per input line, in order; an empty line gives an empty line. The beam, α
        and batch size given replace the config's for this call (the server's per-request values)."""
        d = self.cfg.decode
        sources = encode_for_decoding(lines, self.tokenizer)
        with torch.inference_mode():
            outputs = translate_ids(self.model, sources, beam_size or d.beam_size,
                                    d.alpha if alpha is None else alpha,
                                    d.max_len_offset,
                                    batch_size or d.batch_size, progress, self.constraint,
                                    d.early_stop)
        return ["" if not line.strip() else self.tokenizer.decode(ids) for line, ids in zip(lines, outputs)]
