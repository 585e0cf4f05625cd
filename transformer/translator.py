"""A trained model ready to translate: rebuilt from a run folder's checkpoints alone (§6.1).

By default the weights are the average of the run's last ``decode.average_last`` checkpoints, as
the paper decodes (§6.1: last 5 for base, last 20 for big); ``checkpoint`` picks one file instead
(a training checkpoint or a file written by ``transformer average``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from pathlib import Path

import torch

from .checkpoint import CheckpointError, average_checkpoints, checkpoints_to_average, list_checkpoints, load_checkpoint
from .config import Config, ConfigError, config_from_dict
from .data import encode_for_decoding
from .decode import Scored, decode_ids, score_ids
from .ensemble import Ensemble
from .model import Transformer
from .runtime import keep_freed_memory
from .sampling import Sampling
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
                 int8: bool = False, device: str | None = None, decode: dict[str, object] | None = None,
                 ensemble: Sequence[Path] = ()):
        """``device``: where the model decodes ("cpu", "cuda", "cuda:1"); default a GPU when there is
        one. int8 quantization runs on the CPU only. ``decode``: ``decode.*`` fields that replace the
        run's own (the command line's --beam, --early-stop, ...). ``ensemble``: more run folders whose
        models decode together with this one (``ensemble.Ensemble``), each from its own averaged weights;
        they must have been trained with the same vocabulary. The decoding settings are this run's."""
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
        self.tokenizer = _tokenizer(run_dir)
        self.cfg, model = _load_model(run_dir, checkpoint, self.tokenizer, decode, log)
        models = [model]
        for other in map(Path, ensemble):
            if _tokenizer(other).sha256 != self.tokenizer.sha256:
                raise CheckpointError(f"--ensemble {other}: trained with another vocabulary than {run_dir} "
                                      "(spm.model differs); an ensemble's models must share theirs")
            models.append(_load_model(other, None, self.tokenizer, None, lambda m, o=other: log(f"{o}: {m}"))[1])
        if int8:
            models = [quantize_int8(m) for m in models]
        self.model = (models[0] if len(models) == 1 else Ensemble(models)).to(self.device)
        self.constraint = None
        if self.cfg.data.task == "parse" and self.cfg.decode.constrained:
            from .trees import TreeConstraint

            self.constraint = TreeConstraint(self.tokenizer.vocabulary())

    def translate(self, lines: list[str], beam_size: int | None = None, alpha: float | None = None,
                  batch_size: int | None = None, progress: bool = False) -> list[str]:
        """One output line per input line, in order; an empty line gives an empty line. The beam, α
        and batch size given replace the config's for this call (the server's per-request values)."""
        return [hyps[0][0] for hyps in self.hypotheses(lines, beam_size=beam_size, alpha=alpha,
                                                       batch_size=batch_size, progress=progress)]

    def hypotheses(self, lines: list[str], nbest: int = 1, prefixes: list[str] | None = None,
                   sampling: Sampling | None = None, beam_size: int | None = None, alpha: float | None = None,
                   batch_size: int | None = None, progress: bool = False,
                   constraints: list[list[str]] | None = None) -> list[list[tuple[str, float]]]:
        """For each input line, in order, its ``nbest`` outputs with their scores (log P / lp(|Y|), as
        the beam ranks them), best first; the first is what ``translate`` gives. ``prefixes``: one
        target prefix per line ("" for none) that each output starts with; ``sampling``: draw outputs
        instead of searching (``nbest`` draws); ``constraints``: per line, the phrases every output
        must contain. An empty line gives [("", 0.0)]."""
        d = self.cfg.decode
        sources, forced, phrases = self._encode(lines, prefixes, constraints)
        if phrases is not None and (sampling is not None or self.constraint is not None):
            raise ConfigError("constraints need beam search of a translation run: not with sampling or parsing")
        with torch.inference_mode():
            outputs = decode_ids(self.model, sources, beam_size or d.beam_size, d.alpha if alpha is None else alpha,
                                 d.max_len_offset, batch_size or d.batch_size, progress, self.constraint,
                                 d.early_stop, nbest, forced, sampling, phrases)
        return [[("", 0.0)] if not line.strip() else [(self.tokenizer.decode(h.tokens), h.score) for h in hyps]
                for line, hyps in zip(lines, outputs)]

    def _encode(self, lines: list[str], prefixes: list[str] | None = None, constraints: list[list[str]] | None = None
                ) -> tuple[list[list[int]], list[list[int]] | None, list[list[list[int]]] | None]:
        """Sources (with EOS), prefixes and constraint phrases as piece ids, checked to fit the outputs'
        maximum length (input length + max_len_offset, EOS included): ConfigError naming the line."""
        sources = encode_for_decoding(lines, self.tokenizer)
        forced = None if prefixes is None else [self.tokenizer.encode(p.strip()) for p in prefixes]
        phrases = None if constraints is None else [[self.tokenizer.encode(c.strip()) for c in cs if c.strip()]
                                                    for cs in constraints]
        for i, src in enumerate(sources):  # room for the EOS is needed too
            room = len(src) + self.cfg.decode.max_len_offset - 1
            if forced is not None and len(forced[i]) > room:
                raise ConfigError(f"prefix of line {i + 1}: {len(forced[i])} pieces, but outputs of this input hold "
                                  f"at most {room} (input length + max_len_offset)")
            if phrases is not None and sum(map(len, phrases[i])) > room:
                raise ConfigError(f"constraints of line {i + 1}: {sum(map(len, phrases[i]))} pieces together, but "
                                  f"outputs of this input hold at most {room} (input length + max_len_offset)")
        return sources, forced, phrases

    def check(self, lines: list[str], prefixes: list[str] | None = None,
              constraints: list[list[str]] | None = None) -> None:
        """ConfigError if a prefix or the constraints of a line cannot fit its output (what ``hypotheses``
        would refuse), before any decoding: the server checks a request with it before queueing it."""
        self._encode(lines, prefixes, constraints)

    def score(self, sources: list[str], targets: list[str], alpha: float | None = None) -> list[Scored]:
        """How the model scores given translations (forced decoding), pair by pair: ``Scored`` with the
        beam's length-normalised score, log P(target | source) and each piece's log-prob (EOS last)."""
        ids = encode_for_decoding(sources, self.tokenizer)
        return score_ids(self.model, ids, [self.tokenizer.encode(t.strip()) for t in targets],
                         self.cfg.decode.alpha if alpha is None else alpha)


def _tokenizer(run_dir: Path) -> Tokenizer:
    spm_path = run_dir / "spm.model"
    if not spm_path.is_file():
        raise CheckpointError(f"{run_dir}: not a run folder (no spm.model); train one with `transformer train`")
    return Tokenizer(spm_path)


def _load_model(run_dir: Path, checkpoint: Path | None, tokenizer: Tokenizer, decode: dict[str, object] | None,
                log: Callable[[str], None]) -> tuple[Config, Transformer]:
    """The run's config (with the ``decode`` overrides, validated) and its model in eval mode, with the
    weights of ``checkpoint`` or else the average of its last ``decode.average_last`` checkpoints (§6.1)."""
    if checkpoint is not None and str(checkpoint) == "best":  # train.keep_best's weights
        checkpoint = run_dir / "best.safetensors"
        if not checkpoint.is_file():
            raise CheckpointError(f"{run_dir}: no best.safetensors (the run was trained without train.keep_best)")
    if checkpoint is None:
        paths = list_checkpoints(run_dir)
        if not paths:
            raise CheckpointError(f"{run_dir}/checkpoints: no checkpoints to translate with")
        meta = load_checkpoint(paths[-1], with_state=False).meta
    else:
        ckpt = load_checkpoint(Path(checkpoint), with_state=False)
        meta = ckpt.meta
    if meta.get("vocab_sha256") not in (None, tokenizer.sha256):
        raise CheckpointError(f"{checkpoint or run_dir}: trained with another vocabulary than {run_dir / 'spm.model'}")
    cfg = config_from_dict(meta["config"], f"{checkpoint or run_dir} (config)")
    cfg.decode = dataclasses.replace(cfg.decode, **(decode or {}))
    cfg.validate()  # the overrides too, before any work: one set of checks for the run's values and ours
    if checkpoint is None:
        paths = checkpoints_to_average(run_dir, cfg.decode.average_last)
        log(f"averaging the last {len(paths)} checkpoint(s): {', '.join(p.stem for p in paths)}")
        weights = average_checkpoints(paths)  # one path: its weights exactly, without the optimizer state
    else:
        weights = ckpt.weights
    model = Transformer(cfg.model, tokenizer.vocab_size)
    try:
        missing, unexpected = model.load_state_dict(weights, strict=False)
    except RuntimeError as e:  # a tensor of the wrong shape
        first = str(e).split("\n\t")[1] if "\n\t" in str(e) else str(e)
        raise CheckpointError(f"{checkpoint or run_dir}: weights do not fit the config ({first})") from None
    if missing or unexpected:
        raise CheckpointError(f"{checkpoint or run_dir}: weights do not fit the config "
                              f"(missing {missing[:3]}, unexpected {unexpected[:3]})")
    return cfg, model.eval()
