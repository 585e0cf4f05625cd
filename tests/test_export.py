"""CTranslate2 export: the exported model translates as ours does."""

import re
import stat
from pathlib import Path

import pytest

from transformer.data import encode_for_decoding, read_lines
from transformer.export import ExportError, export_ctranslate2
from transformer.request import DecodeRequest
from transformer.translator import Translator

ctranslate2 = pytest.importorskip("ctranslate2")


@pytest.fixture(params=["post", "pre"])
def run(request, trained_tiny):
    """A tiny run, post-norm (§3.1) or pre-norm: tests/conftest.py trains each once for the session."""
    return trained_tiny(request.param)


def ctranslate2_outputs(model_dir, translator, lines, beam, length_penalty=0.0):
    """CTranslate2's translations of ``lines`` as ids, with our maximum length (input + offset)."""
    tok = translator.tokenizer
    pieces = tok.vocabulary()
    engine = ctranslate2.Translator(str(model_dir), device="cpu", intra_threads=1)
    sources = [[pieces[i] for i in ids[:-1]] for ids in encode_for_decoding(lines, tok)]  # EOS added by the model
    offset = translator.cfg.decode.max_len_offset
    outputs = []
    for src in sources:  # one at a time: the length limit is per sentence, as in our search
        # ours: at most |src + EOS| + offset outputs, EOS included; CTranslate2 does not count EOS
        result = engine.translate_batch([src], beam_size=beam, max_decoding_length=len(src) + offset,
                                        min_decoding_length=0,  # its default, 1, never writes an empty output
                                        length_penalty=length_penalty)
        outputs.append(tok.decode([pieces.index(p) for p in result[0].hypotheses[0]]))
    return outputs


def test_exported_model_translates_as_ours_greedy(run, tmp_path, multi30k):
    lines = read_lines(multi30k / "val.en.gz")[:40]
    out = export_ctranslate2(run, tmp_path / "ct2", log=lambda m: None)
    assert (out / "model.bin").is_file() and (out / "spm.model").is_file()
    translator = Translator(run, log=lambda m: None)
    ours = translator.translate(lines, DecodeRequest(beam_size=1))
    # not vacuous: the model stops on its own on some sentences and runs to the length limit on others
    assert len({len(o) for o in ours}) > 5
    assert ctranslate2_outputs(out, translator, lines, beam=1) == ours


def test_exported_model_translates_as_ours_beam4(tmp_path, trained_tiny, multi30k):
    """Beam 4, α 0.6 (the paper's decoding), as `benchmarks/speed.py` times it: most outputs are the
    same. Some may differ, and the count is reported: CTranslate2 normalises a hypothesis's score by
    length^α where we use GNMT's ((5 + length) / 6)^α, and it stops a sentence once the step's best
    candidate ends, where we stop by the exact bound (§6.1). Pre-norm: after 200 updates the tiny
    post-norm model's beam ends every sentence at once (empty outputs), which would compare nothing."""
    run = trained_tiny("pre")
    lines = read_lines(multi30k / "val.en.gz")[:40]
    out = export_ctranslate2(run, tmp_path / "ct2", log=lambda m: None)
    translator = Translator(run, log=lambda m: None)
    ours = translator.translate(lines, DecodeRequest(beam_size=4, alpha=0.6))
    assert len({len(o) for o in ours}) > 5  # not vacuous: outputs of many lengths
    theirs = ctranslate2_outputs(out, translator, lines, beam=4, length_penalty=0.6)
    differ = sum(a != b for a, b in zip(ours, theirs, strict=True))
    print(f"beam 4, α 0.6: {differ} of {len(lines)} outputs differ from CTranslate2's")
    assert differ <= len(lines) // 4


def test_export_refuses_a_non_empty_folder(tmp_path):
    (tmp_path / "ct2").mkdir()
    (tmp_path / "ct2" / "keep.txt").write_text("x")
    with pytest.raises(ExportError, match=r"ct2: exists, and it has no config.json, .* \(--overwrite replaces an "
                                          r"earlier export only\)"):  # no export here: --overwrite is not offered
        export_ctranslate2(tmp_path / "run", tmp_path / "ct2", log=lambda m: None)


def test_overwrite_replaces_an_earlier_export_only(trained_tiny, tmp_path):
    """--overwrite deleted whatever --out named: the run being exported, a folder of runs, the run's
    checkpoints, a corpus. It replaces a folder of files with config.json, an earlier export, only, and one that
    holds no file this export does not write: a user's notes beside an earlier export were deleted with it."""
    import shutil

    run = tmp_path / "runs" / "mine"
    shutil.copytree(trained_tiny("post"), run)
    (tmp_path / "corpus").mkdir()
    (tmp_path / "corpus" / "train.en").write_text("a dog\n")
    for out, why in ((run, "it holds folders (checkpoints, tb)"), (tmp_path / "runs", "it holds folders (mine)"),
                     (run / "checkpoints", "it has no config.json"), (tmp_path / "corpus", "it has no config.json")):
        before = sorted(p.name for p in out.iterdir())
        for overwrite in (True, False):  # without it, --overwrite was offered, and then refused
            with pytest.raises(ExportError, match=rf"exists, and {re.escape(why)}.* \(--overwrite replaces an earlier "
                                                  r"export only\)"):
                export_ctranslate2(run, out, overwrite=overwrite, log=lambda m: None)
        assert sorted(p.name for p in out.iterdir()) == before
    earlier = tmp_path / "earlier"
    export_ctranslate2(run, earlier, log=lambda m: None)
    (earlier / "notes.txt").write_text("mine\n")
    before = {p.name: p.read_bytes() for p in earlier.iterdir()}
    with pytest.raises(ExportError, match=r"exists, and it holds notes\.txt, which this command does not write"):
        export_ctranslate2(run, earlier, overwrite=True, log=lambda m: None)
    assert {p.name: p.read_bytes() for p in earlier.iterdir()} == before
    (earlier / "notes.txt").unlink()
    export_ctranslate2(run, earlier, overwrite=True, log=lambda m: None)
    assert (earlier / "model.bin").is_file() and not list(earlier.parent.glob(".earlier*"))


def test_the_command_replaces_an_export_with_overwrite_and_its_old_name_force(trained_tiny, tmp_path, capsys):
    """export named the idea --force, preprocess --overwrite: one name now, the old one understood with a note."""
    from transformer.cli import main

    run, out = trained_tiny("post"), tmp_path / "ct2"
    export = ["export", str(run), "--out", str(out)]
    assert main(export) == 0
    assert main(export) == 1 and capsys.readouterr().err.endswith(", files an export writes (an earlier export?): "
                                                                  "use --overwrite to replace them\n")
    # a user's own folder whose files bear an export's names was called "an earlier export": they are named
    mine = tmp_path / "mine"
    mine.mkdir()
    for name in ("config.json", "README.md"):
        (mine / name).write_text("mine\n")
    assert main(["export", str(run), "--out", str(mine)]) == 1
    assert capsys.readouterr().err.endswith(f"error: {mine}: holds README.md, config.json, files an export writes "
                                            "(an earlier export?): use --overwrite to replace them\n")
    for given, note in (("--overwrite", False), ("--force", True)):
        (out / "model.bin").write_bytes(b"")
        assert main([*export, given]) == 0 and (out / "model.bin").stat().st_size > 0
        assert ("note: --force is now --overwrite" in capsys.readouterr().err) == note


def test_an_out_that_is_a_link_or_the_current_folder_is_refused_before_the_work(tmp_path, monkeypatch):
    """--overwrite onto a link to an earlier export: rmtree refused the link after the whole export, an internal
    error; --out . in an empty folder: the staging folder was the temporary folder itself ("File exists"), and
    replacing the current folder whole would leave the shell in a deleted one. A user's file beside an earlier
    export was refused only after the model was converted. Each is refused first, before the run is read."""
    (earlier := tmp_path / "earlier").mkdir()
    (earlier / "config.json").write_text("{}")
    (earlier / "notes.txt").write_text("mine\n")
    (link := tmp_path / "link").symlink_to(earlier)
    (tmp_path / "gone").symlink_to(tmp_path / "nowhere")
    run = tmp_path / "no-run"  # never read: each refusal comes before
    for out, said in ((link, rf"{re.escape(str(link))}: a symbolic link; give the folder itself \({re.escape(str(earlier))}\)"),
                      (tmp_path / "gone", "a symbolic link; give the folder itself, or a new one"),
                      (earlier, "it holds notes.txt, which this command does not write")):
        with pytest.raises(ExportError, match=said):
            export_ctranslate2(run, out, overwrite=True, log=lambda m: None)
    (empty := tmp_path / "empty").mkdir()
    monkeypatch.chdir(empty)
    for out in (Path("."), Path("..")):
        with pytest.raises(ExportError, match=rf"^{re.escape(str(out))}: the current folder, or one above it"):
            export_ctranslate2(run, out, overwrite=True, log=lambda m: None)
    assert sorted(p.name for p in earlier.iterdir()) == ["config.json", "notes.txt"] and not list(empty.iterdir())


def test_the_exported_projection_keeps_row_0_and_never_outputs_pad():
    """With tied weights our projection multiplies by the whole shared matrix, row 0 (PAD) included, though
    PAD's embedding is zero at lookup (A5); and our search never outputs PAD. The CTranslate2 spec must
    hold the same: embeddings with row 0 zeroed, a projection with it kept, and a bias of -1e4 on PAD
    alone (without it CTranslate2 could write PAD wherever its logit wins); and the run's LayerNorm ε."""
    import numpy as np
    import torch

    from transformer.config import ModelConfig
    from transformer.export import ctranslate2_spec
    from transformer.model import Transformer
    from transformer.tokenizer import PAD_ID

    torch.manual_seed(0)
    model = Transformer(ModelConfig(n_enc_layers=1, n_dec_layers=1, d_model=16, d_ff=32, n_heads=2, p_drop=0.0), 12)
    spec = ctranslate2_spec(model, ["<pad>", "</s>", "<unk>", *(f"p{i}" for i in range(9))])
    shared = model.target_embedding.weight.detach().numpy()
    assert np.abs(shared[PAD_ID]).sum() > 0  # a row the projection reads
    assert np.array_equal(spec.decoder.projection.weight, shared)
    assert not spec.decoder.embeddings.weight[PAD_ID].any()
    assert np.array_equal(spec.decoder.embeddings.weight[1:], shared[1:])
    bias = spec.decoder.projection.bias
    assert bias[PAD_ID] == -1e4 == np.float16(bias[PAD_ID]) and not bias[1:].any()  # finite in float16 too
    assert spec.config.layer_norm_epsilon == model.cfg.ln_eps == 1e-6  # the run's ε (A7), not CTranslate2's default


def test_an_empty_out_folder_is_written_into(tiny_run, tmp_path):
    """--out must be "empty or new" (the command's help): CTranslate2's converter refused an existing empty
    folder without its force, an internal error (RuntimeError) where the export should have been written."""
    out = tmp_path / "ct2"
    out.mkdir()
    out.chmod(0o2770)  # a group's folder: it stays one (the staged folder that replaced it was 0755)
    export_ctranslate2(tiny_run, out, log=lambda m: None)
    assert (out / "model.bin").is_file() and (out / "spm.model").is_file()
    assert stat.S_IMODE(out.stat().st_mode) == 0o2770
