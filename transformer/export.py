"""Export a trained run to CTranslate2 (a C++ inference engine for the same architecture), to
Hugging Face ``transformers`` (Marian for post-norm runs, Pegasus for pre-norm ones) and, through
that, to ONNX.

The exported model computes what ``Translator`` computes: post-norm layers (§3.1) or pre-norm ones, embeddings
scaled by √d_model (§3.4), our positional table (§3.5), LayerNorm ε of the run's config (Hugging Face's at
1e-5: below). Two details
of this project need care:

- PAD (id 0) is also the decoder's start symbol and its embedding is zero at lookup (A5). The
  exported embedding tables have row 0 zeroed and ``decoder_start_token`` is the PAD piece, so the
  first decoder input is PE(0), as ours.
- With tied weights our pre-softmax projection still uses row 0 of the shared matrix. The exported
  projection is therefore its own copy of the full matrix, with a bias of -1e4 on PAD so it is never
  output (our search sets PAD's log-probability to -inf).

CTranslate2's beam search normalises scores by length^α, not GNMT's ((5+|Y|)/6)^α (§6.1), so beam
outputs can differ from ours on a few sentences; greedy outputs are identical.

``transformers``' Marian and Pegasus compute the same layers (post-norm and pre-norm with a closing
LayerNorm per stack), scale embeddings by √d_model and add a sinusoid of the same frequencies, laid out
as [sin | cos] halves where ours interleaves them (§3.5). Permuting the d_model basis of every weight
that reads or writes the residual stream (embedding columns, the input columns of Q/K/V, FFN and the
output projection, the output rows of attention and FFN, LayerNorm's γ and β) gives the same function.
The same PAD and projection treatment as above applies: row 0 of the embeddings zeroed, an untied full
projection, and ``final_logits_bias`` -1e4 on PAD. A Marian export has one row more, a "<pad>" at the
end that nothing outputs or reads (zero, -1e4): CTranslate2's converter takes a Marian model's last
token for OPUS-MT's padding and drops it; our PAD, id 0, stays the decoder's start symbol, named
"<s>" there. Ids 0 .. V-1 are ours, so the tokenizer gives our ids. Both fix LayerNorm's ε at 1e-5 (no config field),
so a run trained at another ε (ours defaults to the authors' 1e-6) is exported with a small drift.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import logging
import shutil
import stat
import tempfile
import warnings
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import torch

from . import files
from .checkpoint import CheckpointError, checkpoints_to_average, chosen_weights, list_checkpoints, weights_step
from .config import Config
from .errors import UserError, install_extra
from .model import Transformer
from .tokenizer import EOS_ID, PAD_ID, UNK_ID
from .translator import Translator

# the logit bias of a piece never output (PAD): exp(-1e4) is 0 in every float type, and it stays finite in float16
# (at most 65,504), where -1e9 became -inf (numpy's overflow warning at a float16 CTranslate2 export; an infinite
# label-smoothed loss to a fine-tune in float16)
NEVER = -1e4


class ExportError(UserError):
    """An export that cannot be done (missing optional dependency, unsupported configuration)."""


def _numpy(t: torch.Tensor) -> np.ndarray:
    return t.detach().float().contiguous().numpy()


def _positions(model: Transformer, table: str, length: int) -> np.ndarray:
    return _numpy(model.positions(length, 0, table, torch.device("cpu")))


def ctranslate2_spec(model: Transformer, pieces: list[str], max_positions: int = 1024):
    """A ``ctranslate2.specs.TransformerSpec`` holding ``model``'s weights; ``pieces`` = id -> piece."""
    _require("ctranslate2.specs", "CTranslate2", "export")
    from ctranslate2.specs import common_spec, transformer_spec
    from ctranslate2.converters import utils
    cfg = model.cfg
    if cfg.d_model % cfg.n_heads or cfg.head_dims != (cfg.d_model // cfg.n_heads,) * 2:
        raise ExportError(f"CTranslate2 needs d_k = d_v = d_model / h; this model has model.d_k, model.d_v = "
                          f"{cfg.head_dims}, d_model {cfg.d_model}, h {cfg.n_heads}")
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
    bias[PAD_ID] = NEVER  # PAD is never an output
    spec.decoder.projection.bias = bias

    spec.register_source_vocabulary(pieces)
    spec.register_target_vocabulary(pieces)
    c = spec.config
    c.unk_token, c.eos_token = pieces[UNK_ID], pieces[EOS_ID]
    c.bos_token = c.decoder_start_token = pieces[PAD_ID]  # the start symbol is PAD (A5)
    c.add_source_eos = True  # sources end with EOS, as in training
    c.layer_norm_epsilon = cfg.ln_eps
    return spec


def _empty_out(out: Path, overwrite: bool) -> Path:
    """``out`` as a Path, refused when it holds files and ``overwrite`` is not given, or when it is no earlier
    export (``files.not_replaceable``): --overwrite replaced any folder, the run being exported included."""
    out = Path(out)
    if out.is_symlink():  # --overwrite removed the link after the whole export, an internal error
        named = f" ({out.resolve()})" if out.exists() else ""
        raise ExportError(f"{out}: a symbolic link; give the folder itself{named}, or a new one")
    if Path.cwd().resolve().is_relative_to(out.resolve()):  # the export replaces its folder whole
        raise ExportError(f"{out}: the current folder, or one above it: give the export a folder of its own, e.g. "
                          f"{out / 'export'}")
    if out.exists() and any(out.iterdir()):
        # before the work (_staged asks again, knowing the export's own files), and before --overwrite is offered:
        # a folder it may not replace was answered "use --overwrite", which then refused it
        _refuse_unreplaceable(out)
        if not overwrite:  # named: a user's config.json and README.md alone pass for an export's
            held = sorted(p.name for p in out.iterdir())
            raise ExportError(f"{out}: holds {', '.join(held[:4])}{', ...' if len(held) > 4 else ''}, files an export "
                              "writes (an earlier export?): use --overwrite to replace them")
    return out


def _refuse_unreplaceable(out: Path, written: frozenset[str] = frozenset()) -> None:
    """Refuses a non-empty ``out`` that --overwrite may not replace: a folder that is no earlier export, or one
    holding a file that no export (nor this one, ``written``) writes, a user's beside it."""
    ours = EXPORT_FILES | written | {p.name for p in out.iterdir() if p.name.endswith((".onnx", ".onnx_data"))}
    if why := files.not_replaceable(out, "config.json", ours):
        raise ExportError(f"{out}: exists, and {why} (--overwrite replaces an earlier export only): give a new "
                          "folder, or remove this one yourself")


def _early_stop_note(cfg: Config) -> str | None:
    """A beam run that stops by decode.early_stop "top": `generate` has no such rule, so its export stops as the
    paper's "bound" rule does (early_stopping "never"), and a few outputs differ from the run's own. None: else."""
    if cfg.decode.early_stop != "top" or cfg.decode.beam_size == 1:
        return None
    return ('note: the run decodes with decode.early_stop "top", which generate has not: the exported model stops '
            'as the "bound" rule does (early_stopping "never"), so a few of its beam outputs differ from the run\'s')


def _parse_note(cfg: Config) -> str | None:
    """What ``translate`` does for a parsing run (§6.3) beyond the weights an export holds: it escapes the
    input's brackets and, with decode.constrained, writes only trees of the input. An exported model does
    neither, and the export said nothing of it where outputs differ from ours on every line. None: a
    translation run."""
    if cfg.data.task != "parse":
        return None
    tree = " and its beam writes only well-formed trees of the input (decode.constrained)"
    return ("note: a parsing run: `transformer translate` writes the input's brackets as the treebank does "
            "(-LRB-, -RRB-, -LCB-, -RCB-)" + (tree if cfg.decode.constrained else "") +
            "; the exported model does not, so escape the input yourself" +
            (", and expect outputs that are not trees" if cfg.decode.constrained else ""))


def export_ctranslate2(run_dir: Path, out: Path, checkpoint: Path | None = None, quantization: str | None = None,
                       overwrite: bool = False, log=print) -> Path:
    """Write the run's decoding weights (the same average ``Translator`` uses) as a CTranslate2 model.

    The sentencepiece model is copied beside it, so the folder is all a user needs. It is written into a
    staging folder, as the other formats are: CTranslate2's converter refuses any existing folder without
    its force, an empty ``out`` included, and with it deletes an earlier export before writing the new one.
    """
    out = Path(out)
    _require("ctranslate2", "CTranslate2", "export")
    with _staged(out, overwrite) as folder:
        translator = Translator(run_dir, checkpoint, log=log, device="cpu")
        spec = ctranslate2_spec(translator.model, translator.tokenizer.vocabulary())
        from ctranslate2.converters.converter import Converter

        class _Loaded(Converter):
            def _load(self):
                return spec

        try:
            _Loaded().convert(str(folder), quantization=quantization, force=True)  # the staging folder exists
        except ValueError as e:
            raise ExportError(f"{out}: {e}") from None
        (folder / "spm.model").write_bytes((Path(run_dir) / "spm.model").read_bytes())
    log(f"exported {run_dir} to {out} (CTranslate2, {quantization or 'float32'}; tokenize with {out}/spm.model)")
    if note := _parse_note(translator.cfg):
        log(note)
    return out


HF_LN_EPS = 1e-5  # LayerNorm ε of transformers' Marian and Pegasus layers (not configurable there)


def huggingface_model(model: Transformer, max_positions: int = 1024):
    """``model`` as a ``transformers`` MarianMTModel (post-norm) or PegasusForConditionalGeneration
    (pre-norm) in eval mode, computing the same logits (PAD's aside: NEVER there, never an output)."""
    _require("transformers", "transformers", "hf")
    from transformers import MarianConfig, MarianMTModel, PegasusConfig, PegasusForConditionalGeneration
    cfg, vocab = model.cfg, model.vocab_size
    if cfg.positional != "sinusoidal":
        raise ExportError("learned positions (model.positional = \"learned\", Table 3 row E) cannot be expressed: "
                          "Marian and Pegasus add §3.5's sinusoid, recomputed when the model is loaded")
    if cfg.head_dims != (cfg.d_model // cfg.n_heads,) * 2 or cfg.d_model % cfg.n_heads:
        raise ExportError(f"model.d_k, model.d_v = {cfg.head_dims} with d_model {cfg.d_model} and {cfg.n_heads} heads "
                          "cannot be expressed: transformers' attention splits d_model evenly over the heads (Table 3 "
                          "rows A, B)")
    if cfg.d_model % 2:
        raise ExportError(f"model.d_model {cfg.d_model} is odd: the [sin | cos] layout of transformers' sinusoid has "
                          "no permutation onto ours")
    if cfg.norm == "pre" and not cfg.share_embeddings:
        raise ExportError("a pre-norm run maps onto Pegasus, whose encoder and decoder share one embedding "
                          "matrix; this run has two (model.share_embeddings = false)")
    marian = cfg.norm == "post"
    rows = vocab + 1 if marian else vocab  # Marian: a trailing "<pad>" row (module docstring)
    common = dict(vocab_size=rows, d_model=cfg.d_model, encoder_layers=cfg.n_enc_layers,
                  decoder_layers=cfg.n_dec_layers, encoder_attention_heads=cfg.n_heads,
                  decoder_attention_heads=cfg.n_heads, encoder_ffn_dim=cfg.d_ff, decoder_ffn_dim=cfg.d_ff,
                  activation_function="relu", dropout=cfg.p_drop, attention_dropout=cfg.p_drop_attn,
                  activation_dropout=cfg.p_drop_relu, max_position_embeddings=max_positions,
                  scale_embedding=True, pad_token_id=vocab if marian else PAD_ID, eos_token_id=EOS_ID,
                  decoder_start_token_id=PAD_ID, tie_word_embeddings=False, is_encoder_decoder=True,
                  forced_eos_token_id=None)  # a generation setting: _write_huggingface's generation config holds it
    if marian:
        hf = MarianMTModel(MarianConfig(**common, decoder_vocab_size=rows,
                                        share_encoder_decoder_embeddings=cfg.share_embeddings))
    else:
        # the two legacy flags Pegasus checkpoints carry, which CTranslate2's converter reads
        hf = PegasusForConditionalGeneration(PegasusConfig(**common, normalize_before=True, normalize_embedding=False))
    hf.eval()
    perm = torch.cat([torch.arange(0, cfg.d_model, 2), torch.arange(1, cfg.d_model, 2)])  # ours -> [sin | cos]

    def reads(target: torch.nn.Linear, source: torch.nn.Linear) -> None:  # input columns on the residual stream
        target.weight.copy_(source.weight[:, perm])
        target.bias.copy_(source.bias if source.bias is not None else torch.zeros_like(target.bias))

    def writes(target: torch.nn.Linear, source: torch.nn.Linear) -> None:  # output rows on the residual stream
        target.weight.copy_(source.weight[perm])
        target.bias.copy_(source.bias[perm] if source.bias is not None else torch.zeros_like(target.bias))

    def norm(target: torch.nn.LayerNorm, source: torch.nn.LayerNorm) -> None:
        target.weight.copy_(source.weight[perm])
        target.bias.copy_(source.bias[perm])

    def attention(target, source) -> None:
        for name in ("q_proj", "k_proj", "v_proj"):
            reads(getattr(target, name), getattr(source, name))
        writes(target.out_proj, source.out_proj)

    def ffn(target, source) -> None:
        reads(target.fc1, source.ffn.w1)
        writes(target.fc2, source.ffn.w2)

    def embedding(target: torch.nn.Embedding, source: torch.Tensor) -> None:
        target.weight.zero_()  # Marian's trailing row stays zero
        target.weight[:vocab] = source[:, perm]
        target.weight[PAD_ID] = 0.0  # zero at lookup (A5): the decoder's start symbol is PE(0) alone

    with torch.no_grad():
        inner = hf.model
        embedding(inner.encoder.embed_tokens, model.source_embedding.weight)
        embedding(inner.decoder.embed_tokens, model.target_embedding.weight)
        for target, layer in zip(inner.encoder.layers, model.encoder):
            attention(target.self_attn, layer.self_attn)
            norm(target.self_attn_layer_norm, layer.norm1)
            ffn(target, layer)
            norm(target.final_layer_norm, layer.norm2)
        for target, layer in zip(inner.decoder.layers, model.decoder):
            attention(target.self_attn, layer.self_attn)
            norm(target.self_attn_layer_norm, layer.norm1)
            attention(target.encoder_attn, layer.cross_attn)
            norm(target.encoder_attn_layer_norm, layer.norm2)
            ffn(target, layer)
            norm(target.final_layer_norm, layer.norm3)
        if cfg.norm == "pre":
            norm(inner.encoder.layer_norm, model.enc_norm)
            norm(inner.decoder.layer_norm, model.dec_norm)
        hf.lm_head.weight.zero_()
        hf.lm_head.weight[:vocab] = model.output_weight[:, perm]  # untied: row 0 kept, as our projection has it
        hf.final_logits_bias.zero_()
        hf.final_logits_bias[0, PAD_ID] = NEVER  # PAD is never an output
        hf.final_logits_bias[0, vocab:] = NEVER  # nor Marian's trailing "<pad>"
    return hf


def _shown(path: str) -> str:
    """A data path as a model card, which may be published, shows it: an absolute path by its file name alone
    (it would tell the exporting machine's folders, and means nothing elsewhere)."""
    return Path(path).name if Path(path).is_absolute() else path


def _parent_shown(path: Path) -> str:
    """A fine-tune's parent as its card shows it: the run folder's name, with the weights file where one was given
    (a file alone, "best.safetensors", named no run)."""
    if not path.suffix:
        return path.name
    run = path.parent.parent if path.parent.name == "checkpoints" else path.parent
    return f"{run.name}/{path.name}"


def _averaged_by_decoding(run_dir: Path, cfg) -> int:
    """How many checkpoints `translate` averages from the run: those `checkpoints_to_average` chooses, fewer
    than decode.average_last where the run kept fewer or some are off its save clock (a card said "the last 5"
    of a run of 4); decode.average_last where none can be read (no checkpoints beside a weights file)."""
    n = cfg.decode.average_last
    try:
        return len(checkpoints_to_average(run_dir, n)) or n
    except CheckpointError:  # a record that cannot be read (translate refuses the run): at most those there
        with contextlib.suppress(CheckpointError):
            return min(n, len(list_checkpoints(run_dir))) or n
        return n


def _model_card(run_dir: Path, cfg, architecture: str, vocab_size: int, checkpoint: Path | None = None,
                averaged: list[Path] | None = None, record: dict | None = None, onnx: bool = False,
                foreign: bool = False) -> str:
    """README.md of an exported folder: what the model is, how it was trained and scored, and which of the
    run's weights it holds (``checkpoint``, as --checkpoint gave it, with its ``record``, ``averaged`` naming the
    weights file read; None: the average decoding takes, of the files ``averaged`` names where given: a run of
    fewer checkpoints than decode.average_last averages fewer). A parsing run's card says what its exported model
    does not (§6.3). ``onnx``: the ONNX folder's card, whose model optimum's ORTModelForSeq2SeqLM loads
    (transformers' Auto class finds no weights there: the card copied from the transformers export said to use it).
    ``foreign``: ``checkpoint`` is of another run (of the same vocabulary), whose training this run's folder
    cannot tell (``Translator.weights_of_another_run``)."""
    m, d = cfg.model, cfg.data
    if checkpoint is None and averaged:
        weights = ("the run's last checkpoint" if len(averaged) == 1 else
                   f"the average of the run's last {len(averaged)} checkpoints") + (
            f", {', '.join(p.stem for p in averaged)} (these weights)")
    else:
        step, mean_of = weights_step(record or {}), (record or {}).get("averaged")
        at = f" (update {step:,})" if isinstance(step, int) and not isinstance(step, bool) else ""
        if isinstance(mean_of, list) and mean_of and all(isinstance(p, str) for p in mean_of):  # `average`'s file
            at = f" (the average of {len(mean_of)} checkpoint(s), {', '.join(Path(p).stem for p in mean_of)})"
        n = _averaged_by_decoding(run_dir, cfg)
        # the file read: given the optimizer state's or the record's name, the weights beside them
        name = (averaged[0] if averaged else chosen_weights(run_dir, checkpoint)).name if checkpoint else ""
        weights = (f"these weights are `{name}`{at}, the file --checkpoint named, of another run than "
                   f"`{run_dir.resolve().name}`" if foreign else
                   ("the last checkpoint" if n == 1 else f"the average of the last {n} checkpoints") + (
                       " (these weights)" if checkpoint is None else
                       f"; these weights are `{name}`{at}, the file --checkpoint named"))
    summary_path = run_dir / "summary.json"
    try:
        summary = json.loads(summary_path.read_text(encoding="utf-8")) if summary_path.is_file() and not foreign else {}
        if not isinstance(summary, dict):
            raise TypeError(f"a JSON {type(summary).__name__}")
        if "valid_ppl" in summary:
            trained = f"{int(summary['step']):,} updates, validation perplexity {float(summary['valid_ppl']):.2f}"
        elif foreign:
            trained = f"(of another run than `{run_dir.resolve().name}`, whose training this card cannot tell)"
        else:
            trained = ("(the run's summary.json holds no validation perplexity)" if summary_path.is_file() else
                       "(no training summary in the run folder)")
        parent = summary.get("init_from") if isinstance(summary, dict) and "valid_ppl" in summary else None
        if isinstance(parent, dict) and isinstance(parent.get("path"), str):  # --init-from: its updates came first
            trained += f", fine-tuned from `{_parent_shown(Path(parent['path']))}`" + (
                f" ({', '.join(map(str, parent['weights']))})" if isinstance(parent.get("weights"), list) else "")
    except (ValueError, KeyError, TypeError):  # a summary edited by hand: the card says so, the export goes on
        trained = "(the run's summary.json could not be read)"
    drift = ("" if m.ln_eps == HF_LN_EPS else
             f"\nTrained with LayerNorm ε {m.ln_eps:g}; transformers fixes ε at {HF_LN_EPS:g}, so the exported "
             "model's outputs differ slightly from the run's own.\n")
    norm = ("score / length^α, as `generate` divides" if cfg.decode.length_norm == "length" else
            "GNMT's; `generate` divides by length^α instead")
    # at beam 1 the penalty ranks nothing (a greedy search has one hypothesis): not named
    searched = ("greedy (beam 1)" if cfg.decode.beam_size == 1 else
                f"beam {cfg.decode.beam_size}, length penalty α {cfg.decode.alpha} ({norm})")
    if (stop_note := _early_stop_note(cfg)) is not None:
        said = stop_note.removeprefix("note: ")
        drift += f"\n{said[0].upper()}{said[1:]}.\n"
    tags = f"transformer, {architecture.lower()}" + (", onnx" if onnx else "")
    model_class = "ORTModelForSeq2SeqLM" if onnx else "AutoModelForSeq2SeqLM"
    imports = ("from optimum.onnxruntime import ORTModelForSeq2SeqLM\nfrom transformers import AutoTokenizer" if onnx
               else "from transformers import AutoModelForSeq2SeqLM, AutoTokenizer")
    if (parse_note := _parse_note(cfg)) is None:
        head = (f"pipeline_tag: translation\nlanguage: [{d.src_lang}, {d.tgt_lang}]\n"
                f"tags: [translation, {tags}]")
        title, example = f"{d.src_lang}→{d.tgt_lang} Transformer", "A man is riding a bike."
    else:  # its "languages" are words and trees: no language codes, and a parsing example
        head = f"pipeline_tag: text2text-generation\ntags: [constituency-parsing, {tags}]"
        title, example = "English constituency parser (§6.3 of Vaswani et al., 2017)", "The dog barked ."
        drift += "\nA parsing run: " + parse_note.removeprefix("note: a parsing run: ") + ".\n"
    # an ONNX folder is no transformers model: a hub that read "library_name: transformers" offered the Auto class
    library = "" if onnx else "library_name: transformers\n"
    return f"""---
{library}{head}
---
# {title} ({architecture} layout)

A Transformer (Vaswani et al., 2017) trained with the `transformer` toolkit and exported from
`{run_dir.resolve().name}`{" to ONNX" if onnx else ""}.

- Model: {m.n_enc_layers}+{m.n_dec_layers} layers, d_model {m.d_model}, d_ff {m.d_ff}, {m.n_heads} heads,
  {m.norm}-norm, a joint vocabulary of {vocab_size:,} sentencepiece BPE pieces.
- Data: `{_shown(d.train_src)}` / `{_shown(d.train_tgt)}`; validated on `{_shown(d.valid_src)}`.
- Training: {trained}.
- Decoding as trained: {searched},
  {weights}.
{drift}
```python
{imports}
tokenizer = AutoTokenizer.from_pretrained("PATH")
model = {model_class}.from_pretrained("PATH")
batch = tokenizer(["{example}"], return_tensors="pt", padding=True)
# the run's own length limit, the source's length + {cfg.decode.max_len_offset}: without it, up to 1,024 pieces
limit = batch["input_ids"].shape[1] + {cfg.decode.max_len_offset}
print(tokenizer.batch_decode(model.generate(**batch, max_new_tokens=limit), skip_special_tokens=True))
```
"""


# the files an export writes, in any of its formats (CTranslate2's, Hugging Face's, ONNX's besides its *.onnx
# graphs), and the tokenizer files other versions of transformers write: --overwrite replaces a folder of these alone
EXPORT_FILES = {"config.json", "model.bin", "shared_vocabulary.json", "shared_vocabulary.txt", "spm.model",
                "README.md", "generation_config.json", "model.safetensors", "source.spm", "target.spm",
                "special_tokens_map.json", "tokenizer_config.json", "vocab.json", "added_tokens.json", "tokenizer.json"}


@contextlib.contextmanager
def _staged(out: Path, overwrite: bool) -> Iterator[Path]:
    """A new folder beside ``out`` to write the export into; when the block ends without an error it
    replaces ``out`` (with ``overwrite``, whatever was there), else it is removed and ``out`` stays as it was,
    as do its parents: the folders made for it are removed again, so a refused export leaves nothing."""
    out = _empty_out(out, overwrite)
    made = [p for p in (out.parent, *out.parent.parents) if not p.exists()]  # the deepest first
    out.parent.mkdir(parents=True, exist_ok=True)
    try:
        with files.staging(out.parent, out.name, directory=True) as tmp:  # a killed export's goes first
            staged = tmp / out.name
            staged.mkdir()
            try:
                yield staged
            except Exception as e:  # the libraries' writers name the file they copied from, or none at all
                if (told := files.staged_write_error(e, staged, out)) is not None:
                    raise told from None
                raise
            for path in staged.rglob("*"):
                if path.is_file():  # the libraries' own writers do not all honour the umask (safetensors: 0600)
                    files.share(path)
            if out.exists():  # an earlier export, of any format: a file beside it (a user's) is not lost with it
                if any(out.iterdir()):
                    _refuse_unreplaceable(out, frozenset(p.name for p in staged.iterdir()))
                staged.chmod(stat.S_IMODE(out.stat().st_mode))  # a group's folder (0770, setgid) stays the group's
                shutil.rmtree(out)
            staged.rename(out)
    except BaseException:
        for folder in made:
            with contextlib.suppress(OSError):  # one that something else wrote into meanwhile stays
                folder.rmdir()
        raise


def export_huggingface(run_dir: Path, out: Path, checkpoint: Path | None = None, overwrite: bool = False,
                       log=print) -> Path:
    """Write the run's decoding weights (the same average ``Translator`` uses) as a ``transformers`` model
    folder: config.json, model.safetensors, generation_config.json, a MarianTokenizer that gives our
    ids (source.spm, target.spm, vocab.json, tokenizer_config.json) and README.md."""
    out = Path(out)
    _require("transformers", "transformers", "hf")
    with _staged(out, overwrite) as folder:
        architecture, ln_eps = _write_huggingface(Path(run_dir), checkpoint, folder, log)
    log(f"exported {run_dir} to {out} (transformers {architecture}; AutoModelForSeq2SeqLM.from_pretrained)")
    _ln_eps_note(architecture, ln_eps, log)
    return out


def _ln_eps_note(architecture: str, ln_eps: float, log) -> None:
    """Says that ``architecture``'s fixed LayerNorm ε is not the run's, where it is not."""
    if ln_eps != HF_LN_EPS:
        log(f"note: the run was trained with LayerNorm ε {ln_eps:g}; {architecture} fixes it at {HF_LN_EPS:g}, so "
            "the exported model's outputs differ slightly from the run's own")


def _write_huggingface(run_dir: Path, checkpoint: Path | None, out: Path, log, onnx: bool = False
                       ) -> tuple[str, float]:
    """``export_huggingface``'s files, written into the folder ``out`` (``onnx``: as the ONNX export's source,
    its model card the ONNX folder's); returns the architecture's name and the run's LayerNorm ε."""
    translator = Translator(run_dir, checkpoint, log=log, device="cpu")
    hf = huggingface_model(translator.model)
    for note in (_parse_note(translator.cfg), _early_stop_note(translator.cfg)):
        if note:
            log(note)
    from transformers import MarianTokenizer

    d = translator.cfg.decode
    g = hf.generation_config
    g.num_beams, g.max_length, g.forced_eos_token_id = d.beam_size, hf.config.max_position_embeddings, EOS_ID
    if d.beam_size > 1:  # a greedy config with the beam's settings is refused by GenerationConfig's own check
        g.length_penalty, g.early_stopping = d.alpha, "never"  # the search ends when no hypothesis can improve
    hf.save_pretrained(out, safe_serialization=True)
    architecture = "Pegasus" if translator.cfg.model.norm == "pre" else "Marian"
    pieces = translator.tokenizer.vocabulary()
    names = {"pad_token": pieces[PAD_ID]}
    if architecture == "Marian":  # our PAD is the start symbol "<s>"; the padding is the trailing "<pad>"
        start = next(n for n in ("<s>", "<start>", "<decoder_start>") if n not in pieces)
        pieces = [start, *pieces[1:], "<pad>"]
        names = {"bos_token": start, "pad_token": "<pad>"}
    with tempfile.TemporaryDirectory() as tmp:
        vocab = Path(tmp) / "vocab.json"
        vocab.write_text(json.dumps({p: i for i, p in enumerate(pieces)}, ensure_ascii=False), encoding="utf-8")
        spm_model = run_dir / "spm.model"
        tokenizer = MarianTokenizer(str(spm_model), str(spm_model), str(vocab), unk_token=pieces[UNK_ID],
                                    eos_token=pieces[EOS_ID], **names,
                                    model_max_length=hf.config.max_position_embeddings,
                                    clean_up_tokenization_spaces=False,
                                    split_special_tokens=True)  # "</s>" in a text is text, as ours reads it
        tokenizer.save_pretrained(out)
    card = _model_card(run_dir, translator.cfg, architecture, translator.tokenizer.vocab_size, checkpoint,
                       translator.weights_from, translator.weights_record, onnx, translator.weights_of_another_run)
    (out / "README.md").write_text(card, encoding="utf-8")
    return architecture, translator.cfg.model.ln_eps


@contextlib.contextmanager
def _libraries_quiet() -> Iterator[None]:
    """transformers' and optimum's log warnings held back: during the ONNX conversion they speak of their own
    calls (a deprecated argument one passes the other, a check that wants accelerate), nothing the user can
    act on; errors still show."""
    loggers = [logging.getLogger(name) for name in ("transformers", "optimum")]
    levels = [logger.level for logger in loggers]
    for logger in loggers:
        logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        for logger, level in zip(loggers, levels):
            logger.setLevel(level)


def _require(module: str, what: str, extra: str) -> None:
    """ExportError saying how to install ``module`` where it cannot be imported: before the work (the run's
    average, minutes for a big model), not after it."""
    try:
        importlib.import_module(module)
    except ImportError:
        raise ExportError(f"{what} is not installed: " + install_extra(extra)) from None


def export_onnx(run_dir: Path, out: Path, checkpoint: Path | None = None, overwrite: bool = False, log=print) -> Path:
    """The ``transformers`` export converted by ``optimum``'s ONNX exporter: encoder and decoder (with past
    keys and values) graphs, config and tokenizer, for ``optimum.onnxruntime.ORTModelForSeq2SeqLM``."""
    out = Path(out)
    _require("optimum.exporters.onnx", "optimum's ONNX exporter", "hf")
    from optimum.exporters.onnx import main_export
    for module in ("onnx", "onnxruntime"):  # optimum asks for them only once its export is done (to fix the graphs'
        _require(module, f"{module}, which optimum's ONNX export needs,", "hf")  # dynamic shapes)
    _require("transformers", "transformers", "hf")
    with _staged(out, overwrite) as folder, tempfile.TemporaryDirectory() as tmp:
        hf_dir = Path(tmp) / "hf"
        hf_dir.mkdir()
        architecture, ln_eps = _write_huggingface(Path(run_dir), checkpoint, hf_dir, onnx=True,
                                                  log=lambda m: log(m) if m.startswith("note:") else None)
        with warnings.catch_warnings(), _libraries_quiet():
            warnings.simplefilter("ignore")  # the tracer's notes on Python branches of transformers' code
            main_export(str(hf_dir), output=folder, task="text2text-generation-with-past", device="cpu",
                        do_validation=False)
        for name in ("README.md", "generation_config.json"):
            shutil.copy(hf_dir / name, folder / name)
    log(f"exported {run_dir} to {out} (ONNX; optimum.onnxruntime.ORTModelForSeq2SeqLM.from_pretrained)")
    _ln_eps_note(architecture, ln_eps, log)  # it holds for the ONNX graphs too
    return out
