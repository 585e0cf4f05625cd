"""transformers / ONNX export: the exported model computes our logits, its tokenizer gives our ids, and
generate, ONNX Runtime and CTranslate2 (converted from the export) translate as we do."""

import json
import os
import shutil
import stat
import warnings
from pathlib import Path

import pytest
import torch

from transformer.config import ModelConfig, load_config
from transformer.data import read_lines
from transformer.export import ExportError, export_ctranslate2, export_huggingface, export_onnx, huggingface_model
from transformer.model import Transformer
from transformer.request import DecodeRequest
from transformer.tokenizer import EOS_ID, PAD_ID
from transformer.translator import Translator


transformers = pytest.importorskip("transformers")


@pytest.fixture(scope="module", params=["post", "pre"])
def run(request, trained_tiny):
    """A tiny model trained at transformers' LayerNorm ε (1e-5): post-norm (Marian), pre-norm (Pegasus)."""
    return trained_tiny(request.param)


@pytest.fixture(scope="module")
def exported(run, tmp_path_factory):
    return export_huggingface(run, tmp_path_factory.mktemp("hf") / "out", log=lambda m: None)


def quiet(run):
    return Translator(run, log=lambda m: None, device="cpu")


def test_the_exported_model_computes_our_logits(run, exported, multi30k):
    ours = quiet(run)
    hf = transformers.AutoModelForSeq2SeqLM.from_pretrained(exported).eval()
    expected = "MarianMTModel" if ours.cfg.model.norm == "post" else "PegasusForConditionalGeneration"
    assert type(hf).__name__ == expected
    src_lines, tgt_lines = read_lines(multi30k / "val.en.gz")[:32], read_lines(multi30k / "val.de.gz")[:32]

    def padded(rows: list[list[int]]) -> torch.Tensor:
        out = torch.full((len(rows), max(map(len, rows))), PAD_ID)
        for i, r in enumerate(rows):
            out[i, :len(r)] = torch.tensor(r)
        return out

    src = padded([ours.tokenizer.encode(s) + [EOS_ID] for s in src_lines])
    tgt_in = padded([[PAD_ID] + ours.tokenizer.encode(t) for t in tgt_lines])  # the start symbol is PAD (A5)
    with torch.no_grad():
        want = ours.model(src, tgt_in)
        got = hf(input_ids=src, attention_mask=(src != PAD_ID).long(), decoder_input_ids=tgt_in).logits
    vocab = want.size(-1)
    real = torch.cat([torch.ones(len(tgt_lines), 1, dtype=torch.bool), tgt_in[:, 1:] != PAD_ID], 1)
    assert (got[..., 1:vocab] - want[..., 1:])[real].abs().max() < 1e-4  # fp32, summation order aside
    probs = torch.softmax(got, -1)  # never an output, as ours: a probability of exactly 0
    assert not probs[..., PAD_ID].any() and not probs[..., vocab:].any()


def test_the_tokenizer_gives_our_ids_and_text(run, exported, multi30k):
    ours = quiet(run).tokenizer
    tok = transformers.AutoTokenizer.from_pretrained(exported)
    lines = read_lines(multi30k / "train.en.gz")[1000:2000] + read_lines(multi30k / "train.de.gz")[1000:2000]
    assert tok(lines)["input_ids"] == [ours.encode(s) + [EOS_ID] for s in lines]
    ids = [ours.encode(s) for s in lines[:200]]
    assert tok.batch_decode(ids, skip_special_tokens=True) == [ours.decode(i) for i in ids]


def test_special_pieces_written_in_the_text_are_text(run, exported):
    """Ours reads "</s>", "<unk>" or "<s>" in a sentence as the characters they are; the exported tokenizer read
    them as its special tokens: an EOS, UNK or the start symbol (PAD) in the middle of the source."""
    ours = quiet(run).tokenizer
    tok = transformers.AutoTokenizer.from_pretrained(exported)
    lines = ["A man writes </s> on a wall.", "<unk> and <s> and <pad> are not words."]
    assert tok(lines)["input_ids"] == [ours.encode(s) + [EOS_ID] for s in lines]


class EndAtTheLimit(transformers.LogitsProcessor):
    """Our search's rule at the length limit (search.next_log_probs, DEVIATION(§6.1)): only EOS may come last,
    scored by the model's own log P(EOS). generate's forced_eos_token_id scores it log 1 instead, which ranks
    a beam at the limit higher than ours does."""

    def __init__(self, limit: int) -> None:
        self.limit = limit

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        if input_ids.size(1) < self.limit - 1:
            return scores
        return torch.full_like(scores, float("-inf")).index_copy_(1, torch.tensor([EOS_ID]), scores[:, [EOS_ID]])


def generate_each(model, tok, lines, offset, **options):
    """``model.generate`` one sentence at a time with our length limit (|source + EOS| + offset outputs) and our
    rule at it."""
    outputs = []
    for line in lines:
        batch = tok([line], return_tensors="pt")
        limit = batch["input_ids"].size(1) + offset + 1  # + 1: the decoder's start symbol
        ids = model.generate(**batch, max_length=limit, do_sample=False, forced_eos_token_id=None,
                             logits_processor=transformers.LogitsProcessorList([EndAtTheLimit(limit)]), **options)
        outputs.append(tok.batch_decode(ids, skip_special_tokens=True)[0])
    return outputs


@pytest.mark.parametrize("beam,alpha", [(1, 0.0), (4, 0.0)])
def test_generate_translates_as_ours(run, exported, multi30k, beam, alpha):
    ours = quiet(run)
    lines = read_lines(multi30k / "val.en.gz")[:24]
    want = ours.translate(lines, DecodeRequest(beam_size=beam, alpha=alpha))
    hf = transformers.AutoModelForSeq2SeqLM.from_pretrained(exported).eval()
    tok = transformers.AutoTokenizer.from_pretrained(exported)
    got = generate_each(hf, tok, lines, ours.cfg.decode.max_len_offset, num_beams=beam, length_penalty=alpha)
    # the two compute the same logits within 1e-4, not bit for bit: where a step's candidates nearly tie, generate's
    # search may keep another (on one CPU's model, 1 of 24 sentences, its output 0.08 below ours in log P). Allowed
    # once, for a near tie alone: the two outputs within 0.25 in log P under our model and a piece in length (a
    # truncated or mis-penalised output of a broken export is far from ours)
    differ = [i for i, (g, w) in enumerate(zip(got, want, strict=True)) if g != w]
    assert len(differ) <= 1, [(got[i], want[i]) for i in differ]
    for i in differ:
        theirs, mine = ours.score([lines[i]] * 2, [got[i], want[i]], alpha=alpha)
        assert abs(mine.score - theirs.score) <= 0.25, (got[i], theirs.score, want[i], mine.score)
        assert abs(len(mine.token_log_probs) - len(theirs.token_log_probs)) <= 1, (got[i], want[i])


def test_onnx_runtime_translates_as_ours(run, tmp_path, multi30k, capfd):
    """ONNX Runtime translates the ONNX export as we do, and the export says only its own lines: optimum's and transformers' notes on their own calls (a
    check that wants accelerate, a deprecated argument) went to the user's terminal."""
    pytest.importorskip("optimum.onnxruntime")
    from optimum.onnxruntime import ORTModelForSeq2SeqLM

    capfd.readouterr()
    out = export_onnx(run, tmp_path / "onnx", log=lambda m: None)
    assert capfd.readouterr().err == ""
    assert {"encoder_model.onnx", "decoder_model.onnx", "decoder_with_past_model.onnx"} <= {p.name for p in out.iterdir()}
    ours = quiet(run)
    lines = read_lines(multi30k / "val.en.gz")[:16]
    got = generate_each(ORTModelForSeq2SeqLM.from_pretrained(out), transformers.AutoTokenizer.from_pretrained(out),
                        lines, ours.cfg.decode.max_len_offset, num_beams=1)
    assert got == ours.translate(lines, DecodeRequest(beam_size=1))


def test_the_export_warns_of_nothing(tiny_run, tmp_path):
    """The model's config held forced_eos_token_id, a generation setting: transformers warned at every export
    that it moved it to the generation config, which holds it already."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = export_huggingface(tiny_run, tmp_path / "hf", log=lambda m: None)
    assert [str(w.message) for w in caught] == []
    assert json.loads((out / "generation_config.json").read_text())["forced_eos_token_id"] == EOS_ID


def test_every_exported_file_is_readable_as_the_umask_allows(tiny_run, tmp_path):
    """model.safetensors, written by safetensors through its own temporary file, was 0600 under umask 022 where
    every other file is 0644 (docs/exports.md): another account could not load the model."""
    old = os.umask(0o022)
    try:
        out = export_huggingface(tiny_run, tmp_path / "hf", log=lambda m: None)
    finally:
        os.umask(old)
    modes = {p.name: stat.S_IMODE(p.stat().st_mode) for p in out.iterdir()}
    assert "model.safetensors" in modes and modes == {name: 0o644 for name in modes}


def test_onnx_export_passes_on_the_layernorm_note(tiny_run, tmp_path, monkeypatch):
    """The ONNX graphs come from the transformers folder, so a run trained at another LayerNorm ε drifts in them
    as much; the ONNX export said nothing of it (the transformers export does). Its graphs are not built here."""
    pytest.importorskip("optimum.exporters.onnx")
    import optimum.exporters.onnx

    monkeypatch.setattr(optimum.exporters.onnx, "main_export", lambda *a, **k: None)
    said = []
    export_onnx(tiny_run, tmp_path / "onnx", log=said.append)
    assert len(said) == 2 and said[1].startswith("note: the run was trained with LayerNorm ε 1e-06"), said
    assert said[0].startswith(f"exported {tiny_run} to {tmp_path / 'onnx'} (ONNX")
    # the folder's card says how to load what it holds: transformers' Auto class finds no weights in it
    card = (tmp_path / "onnx" / "README.md").read_text(encoding="utf-8")
    assert "model = ORTModelForSeq2SeqLM.from_pretrained(\"PATH\")" in card and "AutoModelForSeq2SeqLM" not in card
    assert ", onnx]" in card and "to ONNX." in card
    assert "library_name" not in card  # a hub offered transformers' Auto class, which cannot load the folder


def test_ctranslate2_reads_the_export_as_our_own_ctranslate2_export(run, exported, tmp_path, multi30k):
    ctranslate2 = pytest.importorskip("ctranslate2")
    from ctranslate2.converters import TransformersConverter

    from_hf = TransformersConverter(str(exported)).convert(str(tmp_path / "from_hf"))
    own = export_ctranslate2(run, tmp_path / "own", log=lambda m: None)
    ours = quiet(run)
    pieces, offset = ours.tokenizer.vocabulary(), ours.cfg.decode.max_len_offset
    lines = read_lines(multi30k / "val.en.gz")[:24]
    outputs = {}
    for name, folder, eos in (("from_hf", from_hf, ["</s>"]), ("own", own, [])):
        engine = ctranslate2.Translator(str(folder), device="cpu", intra_threads=1)
        outputs[name] = []
        for line in lines:  # the converted model takes the tokenizer's EOS; ours adds it itself
            src = [pieces[i] for i in ours.tokenizer.encode(line)]
            result = engine.translate_batch([src + eos], beam_size=1, max_decoding_length=len(src) + offset)
            outputs[name].append(result[0].hypotheses[0])
    assert outputs["from_hf"] == outputs["own"]
    assert [ours.tokenizer.decode([pieces.index(p) for p in h]) for h in outputs["own"]] == \
        ours.translate(lines, DecodeRequest(beam_size=1))


def test_the_folder_says_what_it_holds(run, exported):
    config = json.loads((exported / "config.json").read_text(encoding="utf-8"))
    generation = json.loads((exported / "generation_config.json").read_text(encoding="utf-8"))
    cfg = load_config(str(run / "config.toml"))
    assert config["d_model"] == cfg.model.d_model and config["scale_embedding"] is True
    assert config["decoder_start_token_id"] == PAD_ID and generation["forced_eos_token_id"] == EOS_ID
    # the model's padding id is the tokenizer's: Marian's (post-norm) a "<pad>" row after our vocabulary, which
    # no logit test sees (generate pads finished beams with it; fine-tuning's embedding keeps it at zero)
    pad, marian = transformers.AutoTokenizer.from_pretrained(exported).pad_token_id, config["model_type"] == "marian"
    assert marian == (cfg.model.norm == "post")
    assert config["pad_token_id"] == pad == (config["vocab_size"] - 1 if marian else PAD_ID)
    assert (generation["num_beams"], generation["length_penalty"]) == (cfg.decode.beam_size, cfg.decode.alpha)
    card = (exported / "README.md").read_text(encoding="utf-8")
    assert "AutoModelForSeq2SeqLM" in card and f"d_model {cfg.model.d_model}" in card
    assert card.startswith("---\nlibrary_name: transformers\n")
    valid = Path(cfg.data.valid_src)  # absolute here: the card, which may be published, shows the name alone
    assert valid.is_absolute() and f"validated on `{valid.name}`" in card and str(valid.parent) not in card
    assert (exported / "model.safetensors").is_file()
    with pytest.raises(ExportError, match=r"out: holds .*, files an export writes \(an earlier export\?\): use "
                                          r"--overwrite to replace them$"):
        export_huggingface(run, exported, log=lambda m: None)


@pytest.mark.parametrize("fields,reason", [
    ({"positional": "learned"}, "learned positions"),
    ({"d_k": 16}, "splits d_model evenly"),
    ({"norm": "pre", "share_embeddings": False}, "share one embedding"),
])
def test_models_the_architectures_cannot_hold_are_refused(fields, reason):
    cfg = ModelConfig(n_enc_layers=1, n_dec_layers=1, d_model=32, d_ff=64, n_heads=4, **fields)
    with pytest.raises(ExportError, match=reason):
        huggingface_model(Transformer(cfg, 50))


@pytest.mark.parametrize("fields,option", [
    ({"positional": "learned"}, 'model.positional = "learned"'),
    ({"d_k": 16}, "model.d_k, model.d_v = (16, 8)"),
    ({"norm": "pre", "share_embeddings": False}, "model.share_embeddings = false"),
    ({"d_model": 33, "n_heads": 3}, "model.d_model 33"),
])
def test_a_refusal_names_the_config_option(fields, option):
    """The refusal is one line that names the run's config field to change: learned positions, d_k, d_v and an odd
    d_model were named as the paper names them, not as model.positional, model.d_k, model.d_v, model.d_model."""
    import re

    from transformer.export import ctranslate2_spec

    cfg = ModelConfig(**{**dict(n_enc_layers=1, n_dec_layers=1, d_model=32, d_ff=64, n_heads=4), **fields})
    with pytest.raises(ExportError) as refused:
        huggingface_model(Transformer(cfg, 50))
    assert option in str(refused.value) and "\n" not in str(refused.value)
    if "d_k" in fields:
        pytest.importorskip("ctranslate2")
        with pytest.raises(ExportError, match=re.escape(option)):
            ctranslate2_spec(Transformer(cfg, 50), [f"p{i}" for i in range(50)])


def test_overwrite_replaces_the_folder_and_a_failed_export_leaves_it(run, exported, tmp_path):
    pytest.importorskip("optimum.onnxruntime")
    out = tmp_path / "out"
    shutil.copytree(exported, out)
    export_onnx(run, out, overwrite=True, log=lambda m: None)
    assert (out / "encoder_model.onnx").is_file()
    assert not (out / "model.safetensors").exists()  # nothing of the folder's old export is left beside the new
    before = sorted(p.name for p in out.iterdir())
    with pytest.raises(Exception):
        export_huggingface(run, out, checkpoint=run / "missing.safetensors", overwrite=True, log=lambda m: None)
    assert sorted(p.name for p in out.iterdir()) == before  # a failed export keeps what was there
    (out / "pytorch_model.bin").write_bytes(b"a user's")  # beside an earlier export: not ours to delete
    with pytest.raises(ExportError, match=r"it holds pytorch_model\.bin, which this command does not write"):
        export_huggingface(run, out, overwrite=True, log=lambda m: None)
    assert (out / "pytorch_model.bin").read_bytes() == b"a user's" and (out / "encoder_model.onnx").is_file()


@pytest.mark.parametrize("summary", ['{"valid_ppl": 3}', '{"step": 30, "valid_ppl": 3.2', '[1]', '{"step": "x", "valid_ppl": 1}'])
def test_a_summary_edited_by_hand_does_not_stop_the_model_card(tmp_path, summary):
    """A summary.json without its step, truncated or of another shape ended the export in an internal error."""
    from transformer.export import _model_card

    (tmp_path / "summary.json").write_text(summary)
    card = _model_card(tmp_path, load_config("tiny"), "Marian", 500)
    assert "(the run's summary.json could not be read)" in card


def test_the_model_card_names_the_checkpoint_it_was_exported_from(tmp_path):
    """--checkpoint exports one checkpoint's weights: the card said they were the default average."""
    from transformer.export import _model_card

    average = _model_card(tmp_path, load_config("tiny"), "Marian", 500)
    one = _model_card(tmp_path, load_config("tiny"), "Marian", 500, tmp_path / "checkpoints" / "step_00000080.json")
    (tmp_path / "best.safetensors").touch()  # train.keep_best wrote it
    best = _model_card(tmp_path, load_config("tiny"), "Marian", 500, Path("best"))
    assert "the average of the last 5 checkpoints (these weights)" in average
    # what was averaged, where the exporter says: a run of 3 checkpoints was carded as "the last 5"
    three = [tmp_path / "checkpoints" / f"step_000000{s}.safetensors" for s in (10, 20, 33)]
    assert ("the average of the run's last 3 checkpoints, step_00000010, step_00000020, step_00000033 (these "
            "weights)") in _model_card(tmp_path, load_config("tiny"), "Marian", 500, None, three).replace("\n", " ")
    assert "the run's last checkpoint, step_00000010 (these weights)" in _model_card(  # not "1 checkpoint(s)"
        tmp_path, load_config("tiny"), "Marian", 500, None, three[:1]).replace("\n", " ")
    assert "these weights are `step_00000080.json`, the file --checkpoint named" in one and "(these weights)" not in one
    assert "these weights are `best.safetensors`, the file --checkpoint named" in best
    # the run's summary is of its last update: the card now says which update the weights given are of
    at = _model_card(tmp_path, load_config("tiny"), "Marian", 500, tmp_path / "checkpoints" / "step_00000080.json",
                     [], {"step": 80})
    assert "these weights are `step_00000080.json` (update 80), the file --checkpoint named" in at
    best_at = _model_card(tmp_path, load_config("tiny"), "Marian", 500, Path("best"), [], {"best": {"step": 1500}})
    assert "`best.safetensors` (update 1,500)" in best_at
    # a file `average` wrote: its record names the checkpoints it is the mean of (the card gave no step, no average)
    mean = _model_card(tmp_path, load_config("tiny"), "Marian", 500, tmp_path / "avg2.safetensors", [],
                       {"averaged": ["step_00000060.safetensors", "step_00000080.safetensors"]})
    assert ("these weights are `avg2.safetensors` (the average of 2 checkpoint(s), step_00000060, step_00000080), "
            "the file --checkpoint named") in mean.replace("\n", " ")
    # the run's own decoding averages the checkpoints it chooses: a run that kept 5 was carded "the last 5" beside
    # a file, its end-of-budget checkpoint 2 updates after step 40 taking 40's place in translate's average of 4
    from transformer.checkpoint import save_checkpoint

    for step in (10, 20, 30, 40, 42):
        meta = {"config": {"model": {"d_model": 8}, "train": {"save_every": 10, "save_minutes": 0}},
                "vocab_sha256": "ab" * 32, "train_state": {"step": step, "elapsed_s": step}}
        save_checkpoint(tmp_path, step, {"w": torch.full((2,), float(step))}, {}, meta, keep_last=5)
    kept = _model_card(tmp_path, load_config("tiny"), "Marian", 500, Path("best"))
    assert "the average of the last 4 checkpoints; these weights are `best.safetensors`" in kept.replace("\n", " ")
    for stale in (10, 20, 30):  # two left, one of them with a record that cannot be read: not "the last 5"
        for path in (tmp_path / "checkpoints").glob(f"step_{stale:08d}*"):
            path.unlink()
    (tmp_path / "checkpoints" / "step_00000042.json").write_text("{")
    cut = _model_card(tmp_path, load_config("tiny"), "Marian", 500, Path("best"))
    assert "the average of the last 2 checkpoints; these weights are `best.safetensors`" in cut.replace("\n", " ")


def test_the_model_card_of_another_runs_weights_tells_not_this_runs_training(tmp_path):
    """--checkpoint may name another run's file of the same vocabulary: the card gave this run's updates and
    perplexity, and "the average of the last 2 checkpoints", true of neither. It also named the optimizer
    state's file that --checkpoint gave, where the weights beside it were exported."""
    from transformer.checkpoint import save_checkpoint
    from transformer.export import _model_card

    meta = {"config": {"model": {"d_model": 8}}, "vocab_sha256": "ab" * 32, "run_id": "ours",
            "train_state": {"step": 10, "elapsed_s": 1}}
    save_checkpoint(tmp_path, 10, {"w": torch.zeros(2)}, {}, meta, keep_last=5)
    (tmp_path / "summary.json").write_text('{"step": 10, "valid_ppl": 9.5}')
    given = tmp_path / "other" / "checkpoints" / "step_00000007.state.safetensors"
    read = [given.with_name("step_00000007.safetensors")]
    own = _model_card(tmp_path, load_config("tiny"), "Marian", 500, given, read, {"run_id": "ours", "step": 7})
    assert "10 updates, validation perplexity 9.50" in own
    assert "these weights are `step_00000007.safetensors` (update 7), the file --checkpoint named" in own
    other = _model_card(tmp_path, load_config("tiny"), "Marian", 500, given, read, {"run_id": "theirs", "step": 7},
                        foreign=True)
    assert "validation perplexity" not in other and "the last checkpoint" not in other
    assert f"(of another run than `{tmp_path.name}`, whose training this card cannot tell)" in other
    assert (f"these weights are `step_00000007.safetensors` (update 7), the file --checkpoint named, of another run "
            f"than `{tmp_path.name}`") in other.replace("\n", " ")


def test_the_model_card_bounds_generate_as_the_run_does(tmp_path):
    """The card's example called generate() without a bound: a model that loops wrote 1,024 pieces."""
    from transformer.export import _model_card

    card = _model_card(tmp_path, load_config("tiny", ["decode.max_len_offset=30"]), "Marian", 500)
    assert 'limit = batch["input_ids"].shape[1] + 30' in card and "generate(**batch, max_new_tokens=limit)" in card



def test_a_greedy_run_is_exported(tiny_overrides, tmp_path):
    """A run that decodes with decode.beam_size = 1: transformers refuses a generation config with one beam and
    the beam's length penalty and early stopping, and the export ended in an internal error."""
    from transformer.train import train

    train(load_config("tiny", tiny_overrides + ["train.max_steps=2", "decode.beam_size=1"]), tmp_path / "run",
          quiet=True)
    export_huggingface(tmp_path / "run", tmp_path / "hf", log=lambda m: None)
    config = transformers.GenerationConfig.from_pretrained(tmp_path / "hf")
    assert config.num_beams == 1 and config.forced_eos_token_id == 1


@pytest.mark.parametrize("export", [export_huggingface, export_onnx, export_ctranslate2])
def test_a_refused_export_leaves_no_folder(tiny_overrides, tmp_path, export):
    """A model the format cannot hold (here d_k other than d_model / h, Table 3 row A) is refused, and leaves
    nothing behind: the folders made for --out (its parents) stayed, empty, after the refusal."""
    from transformer.train import train

    pytest.importorskip("optimum.exporters.onnx" if export is export_onnx else "ctranslate2")
    cfg = load_config("tiny", tiny_overrides + [
        "model.d_model=32", "model.d_ff=64", "model.d_k=16", "model.n_enc_layers=1", "model.n_dec_layers=1",
        "train.max_steps=2", "train.save_every=2", "train.eval_every=2", "train.log_every=1"])
    train(cfg, tmp_path / "run", quiet=True)
    before = sorted(tmp_path.iterdir())
    with pytest.raises(ExportError, match="d_k"):
        export(tmp_path / "run", tmp_path / "exports" / "en-de" / "model", log=lambda m: None)
    assert sorted(tmp_path.iterdir()) == before


@pytest.mark.parametrize("export", [export_huggingface, export_onnx, export_ctranslate2])
def test_a_parsing_run_is_exported_with_a_note_on_what_translate_adds(tiny_parse_run, tmp_path, monkeypatch, export):
    """A parsing run's translate escapes the input's brackets (-LRB-, ...) and writes only trees of the input
    (decode.constrained): the exported model does neither, and its outputs differed from ours on every line
    without a word. Its ONNX graphs are not built here."""
    library = pytest.importorskip("optimum.exporters.onnx" if export is export_onnx else "ctranslate2")
    if export is export_onnx:
        monkeypatch.setattr(library, "main_export", lambda *a, **k: None)
    said = []
    export(tiny_parse_run, tmp_path / "out", log=said.append)
    notes = [m for m in said if m.startswith("note: a parsing run")]
    assert len(notes) == 1 and "-LRB-" in notes[0] and "(decode.constrained)" in notes[0], said
    if export is export_huggingface:  # the card travels without the log: it was a translation model's, "en→de"
        card = (tmp_path / "out" / "README.md").read_text(encoding="utf-8")
        assert "pipeline_tag: text2text-generation" in card and "language:" not in card
        assert "the exported model does not, so escape the input yourself" in card and '["The dog barked ."]' in card


def test_the_model_card_says_when_the_runs_layernorm_eps_drifts(tmp_path):
    """transformers fixes LayerNorm's ε at 1e-5: a run trained at the authors' 1e-6 (our default) is exported with a
    small drift, and the card, which travels without the export's log, says so; a run at 1e-5 has no such note."""
    from transformer.export import _model_card

    drifts = _model_card(tmp_path, load_config("tiny"), "Marian", 500)
    exact = _model_card(tmp_path, load_config("tiny", ["model.ln_eps=1e-5"]), "Marian", 500)
    assert "Trained with LayerNorm ε 1e-06; transformers fixes ε at 1e-05" in drifts
    assert "LayerNorm ε" not in exact


def test_a_run_that_stops_by_the_top_rule_is_exported_with_a_note(tmp_path, monkeypatch):
    """generate has no rule like decode.early_stop "top": the export stops as "bound" does (early_stopping
    "never"), and said nothing where a few of its outputs differ from the run's own. A run given as "." was
    "exported from ``"."""
    from transformer.export import _early_stop_note, _model_card

    top = load_config("tiny", ['decode.early_stop="top"'])
    assert _early_stop_note(load_config("tiny")) is None and _early_stop_note(top).startswith("note: the run decodes")
    assert _early_stop_note(load_config("tiny", ['decode.early_stop="top"', "decode.beam_size=1"])) is None
    assert 'The run decodes with decode.early_stop "top", which generate has not' in _model_card(tmp_path, top,
                                                                                                 "Marian", 500)
    monkeypatch.chdir(tmp_path)
    assert f"exported from\n`{tmp_path.name}`." in _model_card(Path("."), top, "Marian", 500)


def test_the_model_card_quotes_the_runs_summary(tmp_path):
    """A well-formed summary.json gives the card its updates and validation perplexity; one without valid_ppl
    (training writes one at the end of each budget) says so, not that there is none or that it is damaged."""
    from transformer.export import _model_card

    (tmp_path / "summary.json").write_text('{"step": 3000, "valid_ppl": 4.567}')
    assert "Training: 3,000 updates, validation perplexity 4.57." in _model_card(tmp_path, load_config("tiny"),
                                                                                 "Marian", 500)
    (tmp_path / "summary.json").write_text('{"step": 30}')
    assert "(the run's summary.json holds no validation perplexity)" in _model_card(tmp_path, load_config("tiny"),
                                                                                    "Marian", 500)
    # a fine-tune's updates came after its parent's: the card named the fine-tune's alone
    (tmp_path / "summary.json").write_text('{"step": 40, "valid_ppl": 9.5, "init_from": {"path": "/data/runs/base", '
                                           '"weights": ["step_00000400"]}}')
    assert ("Training: 40 updates, validation perplexity 9.50, fine-tuned from `base` (step_00000400)."
            in _model_card(tmp_path, load_config("tiny"), "Marian", 500))
    (tmp_path / "summary.json").write_text('{"step": 40, "valid_ppl": 9.5, "init_from": {"path": '
                                           '"/data/runs/base/best.safetensors", "weights": ["best"]}}')
    card = _model_card(tmp_path, load_config("tiny"), "Marian", 500)
    assert "fine-tuned from `base/best.safetensors` (best)." in card


def test_generate_stops_as_our_search_does(exported):
    """generation_config's early_stopping is "never": transformers' beam search then ends when no hypothesis can
    improve, as ours does (§6.1 search); True would stop at the first beam_size finished hypotheses and can
    return a worse output than ours."""
    generation = json.loads((exported / "generation_config.json").read_text(encoding="utf-8"))
    assert generation["early_stopping"] == "never"


def test_the_parse_note_warns_of_non_trees_only_where_translate_constrains_them():
    """The note on a parsing run names what `transformer translate` adds beyond the weights: the bracket escapes
    always, the tree-only beam (and so "outputs that are not trees" from the export) only with decode.constrained;
    the paper's free search (parse.toml) writes non-trees in both, and a translation run gets no note."""
    from transformer.export import _parse_note

    free = _parse_note(load_config("parse"))
    constrained = _parse_note(load_config("parse", ["decode.constrained=true"]))
    assert "-LRB-" in free and "trees" not in free
    assert "(decode.constrained)" in constrained and "expect outputs that are not trees" in constrained
    assert _parse_note(load_config("tiny")) is None


def test_a_greedy_runs_model_card_names_no_length_penalty(tmp_path):
    """At beam 1 the card said "beam 1, length penalty α 0.6 (GNMT's; `generate` divides by length^α instead)":
    a greedy search ranks one hypothesis, so the penalty and its difference from generate's mean nothing."""
    from transformer.export import _model_card

    greedy = _model_card(tmp_path, load_config("tiny", ["decode.beam_size=1"]), "Marian", 500)
    beam = _model_card(tmp_path, load_config("tiny", ["decode.beam_size=4"]), "Marian", 500)
    assert "Decoding as trained: greedy (beam 1)," in greedy and "length penalty" not in greedy
    assert "Decoding as trained: beam 4, length penalty α 0.6 (GNMT's;" in beam
