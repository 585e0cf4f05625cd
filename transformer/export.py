"""Export a trained run to CTranslate2, a C++ inference engine for the same architecture.

The exported model computes what ``Translator`` computes: post-norm layers (§3.1), embeddings
scaled by √d_model (§3.4), our positional table (§3.5), LayerNorm ε of the run's config. Two details
of this project need care:

- PAD (id 0) is also the decoder's start symbol and its embedding is zero at lookup (A5). The
  exported embedding tables have row 0 zeroed and ``decoder_start_token`` is the PAD piece, so the
  first decoder input is PE(0), as ours.
- With tied weights our pre-softmax projection still uses row 0 of the shared matrix. The exported
  projection is therefore its own copy of the full matrix, with a bias of -1e9 on PAD so it is never
  output (our search sets PAD's log-probability to -inf).

CTranslate2's beam search normalises scores by length^α, not GNMT's ((5+|Y|)/6)^α (§6.1), so beam
outputs can differ from ours on a few sentences; greedy outputs are identical.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from .errors import UserError
from .model import Transformer
from .tokenizer import PAD_ID
from .translator import Translator


class ExportError(UserError):
    """An export that cannot be done (missing optional dependency, unsupported configuration)."""


def _numpy(t: torch.Tensor) -> np.ndarray:
    return t.detach().float().contiguous().numpy()


def _positions(model: Transformer, table: str, length: int) -> np.ndarray:
    return _numpy(model.positions(length, 0, table, torch.device("cpu")))


def ctranslate2_spec(model: Transformer, pieces: list[str], max_positions: int = 1024):
    """A ``ctranslate2.specs.TransformerSpec`` holding ``model``'s weights; ``pieces`` = id -> piece."""
    try:
        from ctranslate2.specs import common_spec, transformer_spec
        from ctranslate2.converters import utils
    except ImportError:
        raise ExportError("CTranslate2 is not installed: pip install 'transformer[export]'") from None
    cfg = model.cfg
    if cfg.d_model % cfg.n_heads or cfg.head_dims != (cfg.d_model // cfg.n_heads,) * 2:
        raise ExportError(f"CTranslate2 needs d_k = d_v = d_model / h; this model has d_k, d_v = {cfg.head_dims}, "
                          f"d_model {cfg.d_model}, h {cfg.n_heads}")
    if cfg.positional == "learned":
        max_positions = cfg.max_positions
    spec = transformer_spec.TransformerSpec.from_config((cfg.n_enc_layers, cfg.n_dec_layers), cfg.n_heads,
                                                        pre_norm=cfg.norm == "pre")

    def linear(target, module: torch.nn.Module) -> None:
        target.weight = _numpy(module.weight)
        if module.bias is not None:
            target.bias = _numpy(module.bias)

    def norm(target, module: torch.nn.LayerNorm) -> None:
        target.gamma, target.beta = _numpy(module.weight), _numpy(module.bias)

    def attention(target, module, self_attention: bool) -> None:
        split = [common_spec.LinearSpec() for _ in range(3)]
        for s, m in zip(split, (module.q_proj, module.k_proj, module.v_proj)):
            linear(s, m)
        if self_attention:  # CTranslate2 fuses Q, K, V of self-attention; K, V of cross-attention
            utils.fuse_linear(target.linear[0], split)
        else:
            target.linear[0] = split[0]
            utils.fuse_linear(target.linear[1], split[1:])
        linear(target.linear[-1], module.out_proj)

    def ffn(target, layer) -> None:
        linear(target.linear_0, layer.ffn.w1)
        linear(target.linear_1, layer.ffn.w2)

    def embeddings(target, weight: torch.Tensor, table: str) -> None:
        rows = _numpy(weight).copy()
        rows[PAD_ID] = 0.0  # zero at lookup (A5)
        (target.embeddings[0] if isinstance(target.embeddings, list) else target.embeddings).weight = rows
        target.scale_embeddings = True  # §3.4: × √d_model
        target.position_encodings.encodings = _positions(model, table, max_positions)

    embeddings(spec.encoder, model.source_embedding.weight, "src_pos")
    for target, layer in zip(spec.encoder.layer, model.encoder):
        attention(target.self_attention, layer.self_attn, True)
        norm(target.self_attention.layer_norm, layer.norm1)
        ffn(target.ffn, layer)
        norm(target.ffn.layer_norm, layer.norm2)
    embeddings(spec.decoder, model.target_embedding.weight, "tgt_pos")
    for target, layer in zip(spec.decoder.layer, model.decoder):
        attention(target.self_attention, layer.self_attn, True)
        norm(target.self_attention.layer_norm, layer.norm1)
        attention(target.attention, layer.cross_attn, False)
        norm(target.attention.layer_norm, layer.norm2)
        ffn(target.ffn, layer)
        norm(target.ffn.layer_norm, layer.norm3)
    if cfg.norm == "pre":  # the stacks' closing LayerNorms
        norm(spec.encoder.layer_norm, model.enc_norm)
        norm(spec.decoder.layer_norm, model.dec_norm)
    out_weight = model.target_embedding.weight if cfg.share_output else model.output_proj.weight
    spec.decoder.projection.weight = _numpy(out_weight)
    bias = np.zeros(out_weight.size(0), dtype=np.float32)
    bias[PAD_ID] = -1e9  # PAD is never an output
    spec.decoder.projection.bias = bias

    spec.register_source_vocabulary(pieces)
    spec.register_target_vocabulary(pieces)
    c = spec.config
    c.unk_token, c.eos_token = pieces[2], pieces[1]
    c.bos_token = c.decoder_start_token = pieces[PAD_ID]  # the start symbol is PAD (A5)
    c.add_source_eos = True  # sources end with EOS, as in training
    c.layer_norm_epsilon = cfg.ln_eps
    return spec


def export_ctranslate2(run_dir: Path, out: Path, checkpoint: Path | None = None, quantization: str | None = None,
                       force: bool = False, log=print) -> Path:
    """Write the run's decoding weights (the same average ``Translator`` uses) as a CTranslate2 model.

    The sentencepiece model is copied beside it, so the folder is all a user needs.
    """
    out = Path(out)
    if out.exists() and any(out.iterdir()) and not force:
        raise ExportError(f"{out}: exists and is not empty (use --force to overwrite)")
    translator = Translator(run_dir, checkpoint, log=log, device="cpu")
    spec = ctranslate2_spec(translator.model, translator.tokenizer.vocabulary())
    from ctranslate2.converters.converter import Converter

    class _Loaded(Converter):
        def _load(self):
            return spec

    try:
        _Loaded().convert(str(out), quantization=quantization, force=force)
    except ValueError as e:
        raise ExportError(f"{out}: {e}") from None
    (out / "spm.model").write_bytes((Path(run_dir) / "spm.model").read_bytes())
    log(f"exported {run_dir} to {out} (CTranslate2, {quantization or 'float32'}; tokenize with {out}/spm.model)")
    return out

