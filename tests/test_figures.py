"""Attention figures (appendix Figures 3-5) and training curves: the weights drawn are the model's."""

import html
import json
import re
import shutil
import warnings

import pytest
import torch

from transformer.cli import main
from transformer.errors import UserError
from transformer.figures import AttentionMaps, FigureError, attention_html, attention_maps, plot_training
from transformer.model import record_attention
from transformer.tokenizer import BOS_ID, EOS_ID
from transformer.translator import Translator

SRC, TGT = "A little girl climbs into a wooden playhouse.", "Ein kleines Mädchen klettert in ein Spielhaus."


@pytest.fixture(scope="module")
def translator(tiny_run):
    return Translator(tiny_run, log=lambda m: None)


def test_weights_are_the_models_own(translator):
    maps = attention_maps(translator, SRC, TGT)
    tok, cfg = translator.tokenizer, translator.cfg.model
    src_ids, tgt_ids = tok.encode(SRC) + [EOS_ID], tok.encode(TGT)
    with torch.inference_mode(), record_attention(translator.model) as records:
        translator.model(torch.tensor([src_ids], device=translator.device),
                         torch.tensor([[BOS_ID, *tgt_ids]], device=translator.device))
    for kind, n_layers in (("enc_self", cfg.n_enc_layers), ("dec_self", cfg.n_dec_layers), ("cross", cfg.n_dec_layers)):
        w = maps.weights[kind]
        rows, cols = maps.axes(kind)
        assert w.shape == (n_layers, cfg.n_heads, len(rows), len(cols))
        for layer in range(n_layers):
            torch.testing.assert_close(w[layer], records[kind][layer][0][0].cpu())
        torch.testing.assert_close(w.sum(-1), torch.ones(w.shape[:-1]))  # every row is a distribution
    assert len(maps.src) == len(src_ids) and len(maps.tgt_in) == len(maps.tgt_out) == len(tgt_ids) + 1
    assert maps.tgt_in[0] == "<s>" and maps.tgt_out[-1] == "</s>" and maps.tgt_in[1:] == maps.tgt_out[:-1]
    causal = torch.ones(len(maps.tgt_in), len(maps.tgt_in), dtype=torch.bool).triu(1)
    assert torch.all(maps.weights["dec_self"][..., causal] == 0)  # masked positions get exactly 0


def test_maps_of_a_model_under_training_are_its_evaluation_modes(translator):
    """A model in training mode (``Translator.of_model`` during training) drew dropout into every map, two calls
    giving two pictures; translate and score switched it to evaluation mode, the maps did not."""
    model = translator.model
    model.train()
    try:
        under_training = Translator.of_model(model, translator.tokenizer, translator.cfg)
        first, second = (attention_maps(under_training, SRC, TGT).weights["cross"] for _ in range(2))
        assert model.training  # given back as it was
    finally:
        model.eval()
    torch.testing.assert_close(first, second)
    torch.testing.assert_close(first, attention_maps(translator, SRC, TGT).weights["cross"])


def test_an_ensembles_attention_is_refused(tiny_run):
    """Its models attend each their own way: the maps ended in "'Ensemble' object has no attribute 'encoder'"."""
    ensemble = Translator(tiny_run, log=lambda m: None, ensemble=[tiny_run])
    with pytest.raises(FigureError, match="^attention of an ensemble: .* no one attention to draw"):
        attention_maps(ensemble, SRC, TGT)


def test_the_models_own_translation_is_drawn_and_aligned_in_the_pieces_it_wrote():
    """The model's translation was segmented again: where the beam spelt a word in other pieces than the
    vocabulary's own ("li la u te" for "lilaute"), the figure and the alignment showed a pass the model never
    made."""
    from pathlib import Path

    from transformer.figures import align, word_alignment
    from transformer.translator import Output

    line = "A pretty woman plays a harpsichord."
    translator = Translator(Path(__file__).parent / "data" / "decode_reference", log=lambda m: None)
    out = translator.translate([line])[0]
    tok = translator.tokenizer
    assert isinstance(out, Output) and tok.decode(out.ids) == out
    assert tok.encode(out) != list(out.ids)  # this line's beam writes a word in pieces of its own
    maps = attention_maps(translator, line, out)
    assert maps.tgt_out == [*tok.id_pieces(out.ids), "</s>"] and maps.tgt_in[1:] == maps.tgt_out[:-1]
    src_ids = tok.encode(line) + [EOS_ID]
    with torch.inference_mode(), record_attention(translator.model) as records:
        translator.model(torch.tensor([src_ids], device=translator.device),
                         torch.tensor([[BOS_ID, *out.ids]], device=translator.device))
    torch.testing.assert_close(maps.weights["cross"][-1], records["cross"][-1][0][0].cpu())
    again = attention_maps(translator, line, str(out))  # a text of the user's: the vocabulary's segmentation
    assert again.tgt_out == [*tok.pieces(out), "</s>"] != maps.tgt_out
    assert align(translator, line, out) == word_alignment(maps)
    import copy
    import pickle

    for kept in (pickle.loads(pickle.dumps(out)), copy.deepcopy(out), copy.copy(out)):  # a user's saved results
        assert kept == out and isinstance(kept, Output) and kept.ids == out.ids
    assert json.loads(json.dumps([out])) == [str(out)]
    # an unknown piece the beam wrote is the word " ⁇ " of the text: alignments count the printed words
    from transformer.tokenizer import UNK_ID

    ids = tok.encode("Ein Hund rennt")
    unknown = Output(tok.decode(ids[:2] + [UNK_ID] + ids[2:]), ids[:2] + [UNK_ID] + ids[2:])
    links = align(translator, "A dog runs", unknown)
    assert max(t for _, t in links) < len(unknown.split()) == 4 and any(t == 3 for _, t in links)
    # another run's Output (other pieces for its text) or ids no vocabulary has: drawn as wrong maps, or an IndexError
    # PAD and EOS, which its text drops, were forced as pieces
    from transformer.tokenizer import PAD_ID

    for foreign in (Output(str(out), ids[:2]), Output("x", [10 ** 6]), Output("x", [-5]),
                    Output(str(out), [*out.ids, EOS_ID]), Output(str(out), [PAD_ID, *out.ids])):
        with pytest.raises(FigureError, match="^tgt: an Output whose pieces are not its text in this run's"):
            align(translator, line, foreign)
    import numpy as np  # its own ids as NumPy's integers, or a tensor (its elements were refused): the same figure

    for ids in (np.array(out.ids), np.array(out.ids, dtype=np.uint16), torch.tensor(out.ids)):
        assert attention_maps(translator, line, Output(str(out), ids)).tgt_out == maps.tgt_out
    for wrong in (torch.tensor(out.ids, dtype=torch.float32), [True] * len(out.ids)):
        with pytest.raises(FigureError, match="^tgt: an Output whose pieces"):
            attention_maps(translator, line, Output(str(out), wrong))


def test_alignment_counts_the_words_the_line_prints():
    """A beam's lone "▁" before a word's start, or at the end, prints as a doubled or trailing space: counted as a
    word of its own, the Pharaoh indices ran past the line's words."""
    from transformer.figures import word_alignment

    tgt = ["▁Ein", "▁", "▁Hund", "▁"]  # "Ein  Hund ": two words
    cross = torch.zeros(1, 1, len(tgt) + 1, 3)
    for t, s in enumerate([0, 1, 1, 0]):
        cross[0, 0, t, s] = 1.0
    maps = AttentionMaps(["▁A", "▁dog", "</s>"], ["<s>", *tgt], [*tgt, "</s>"], {"cross": cross})
    assert word_alignment(maps) == [(0, 0), (0, 1), (1, 1)]
    lone = AttentionMaps(["▁A", "▁dog", "</s>"], ["<s>", "▁"], ["▁", "</s>"], {"cross": cross[:, :, :2]})
    assert word_alignment(lone) == []  # a line of a space alone: no word to link


def test_words_merge_pieces_and_keep_rows_distributions():
    maps = AttentionMaps(["▁play", "house", "▁now", "</s>"], ["<s>", "▁ja"], ["▁ja", "</s>"],
                         {"enc_self": torch.softmax(torch.randn(1, 2, 4, 4), -1),
                          "dec_self": torch.softmax(torch.randn(1, 2, 2, 2), -1),
                          "cross": torch.softmax(torch.randn(1, 2, 2, 4), -1)})
    words = maps.merged()
    assert words.src == ["playhouse", "now", "</s>"] and words.tgt_in == ["<s>", "ja"]
    w, m = maps.weights["enc_self"], words.weights["enc_self"]
    torch.testing.assert_close(m[..., 0, 0], (w[..., 0, 0] + w[..., 0, 1] + w[..., 1, 0] + w[..., 1, 1]) / 2)
    torch.testing.assert_close(m[..., 2, 1], w[..., 3, 2])
    for kind in words.weights:
        torch.testing.assert_close(words.weights[kind].sum(-1), torch.ones(words.weights[kind].shape[:-1]))


def unflatten(data: dict, kind: str) -> torch.Tensor:
    """A kind's weights from the compact form (figures.AttentionMaps.to_json) as [L, H, Tq, Tk]."""
    return torch.tensor(data["weights"][kind], dtype=torch.float32).view(data["shape"][kind]) / data["scale"]


# the page's one call: its data, then the view it opens at (None, or an object of the menus' values)
PAGE_CALL = r"renderAttention\(document.getElementById\(\"attention\"\), (.*), (null|\{[^{}]*\})\);\n</script>"


def test_html_embeds_the_weights_and_needs_no_network(translator):
    maps = attention_maps(translator, SRC, TGT)
    page = attention_html(maps, "a </script> title")
    assert not re.search(r"""(src|href)=["']?https?:""", page) and "fetch(" not in page
    payload = re.search(PAGE_CALL, page).group(1)
    data = json.loads(payload)
    # rounded to 1/scale: within half of it, and float32's rounding of w * SCALE and of the quotient (5.0000101e-4 was
    # met, where some weights fell on a half)
    torch.testing.assert_close(unflatten(data, "cross"), maps.weights["cross"], atol=0.5 / data["scale"] + 1e-6, rtol=0)
    assert data["src"] == maps.src and data["tgt_out"] == maps.tgt_out
    assert page.count("</script>") == 1  # the title cannot close the script


HOSTILE = ["</script><script>document.title='pwned'</script>", "<!--<script>", "/*{{DATA}}*/null", "{{TITLE}}",
           "/*{{VIEW}}*/null",
           "&amp; &lt;b&gt;", "]]> <![CDATA[", "\u2028\u2029 end"]


@pytest.mark.parametrize("text", HOSTILE)
def test_user_text_cannot_leave_its_place_in_the_page(text):
    """The title is HTML-escaped and the data is JSON with <, > and & escaped, filled in one pass: the
    page holds exactly one script, the data reads back as written, and the heading is the text."""
    maps = AttentionMaps([text, "</s>"], ["<s>", text], [text, "</s>"],
                         {k: torch.full((1, 1, 2, 2), 0.5) for k in ("enc_self", "dec_self", "cross")})
    page = attention_html(maps, text)
    assert page.count("<script>") == 1 and page.count("</script>") == 1 and "<!--" not in page
    payload = re.search(PAGE_CALL, page).group(1)
    assert json.loads(payload)["src"][0] == text
    assert f"<h1>{html.escape(text)}</h1>" in page


@pytest.mark.parametrize("kind", ["enc-self", "dec-self", "cross"])
def test_cli_draws_png_and_html_for_each_kind(tiny_run, tmp_path, kind, capsys):
    png, html = tmp_path / f"{kind}.png", tmp_path / f"{kind}.html"
    assert main(["attention", str(tiny_run), "--src", SRC, "--kind", kind, "--layer", "2", "--heads", "1,2",
                 "--out", str(png)]) == 0
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000
    assert main(["attention", str(tiny_run), "--src", SRC, "--tgt", TGT, "--words", "--out", str(html)]) == 0
    assert "note:" not in capsys.readouterr().err
    assert '}, {"kind": "enc_self", "layer": 0, "style": "links", "head": "all", "unit": "words"});' in \
        html.read_text(encoding="utf-8")  # --words was ignored by the page (it opened at sub-words)
    # the page opens at the options' choices, where a note said they shape a PNG only
    assert main(["attention", str(tiny_run), "--src", SRC, "--tgt", TGT, "--kind", kind, "--layer", "2", "--heads",
                 "2", "--style", "heatmap", "--out", str(html)]) == 0
    assert "note:" not in capsys.readouterr().err
    view = f'{{"kind": "{kind.replace("-", "_")}", "layer": 1, "style": "heatmap", "head": 1, "unit": "pieces"}}'
    assert f"}}, {view});" in html.read_text(encoding="utf-8")
    assert main(["attention", str(tiny_run), "--src", SRC, "--tgt", TGT, "--heads", "1,2", "--out", str(html)]) == 0
    assert "note: --heads 1,2: the HTML page shows one head or all; it opens at all" in capsys.readouterr().err
    assert main(["attention", str(tiny_run), "--src", SRC, "--tgt", TGT, "--layer", "9", "--out", str(html)]) == 1
    assert "--layer 9: the model has" in capsys.readouterr().err  # refused for a page too, before any decoding
    if kind != "cross":
        return
    # the search's options with --tgt: taken without a word, though there is no translation of the model's to search
    assert main(["attention", str(tiny_run), "--src", SRC, "--tgt", TGT, "--beam", "7", "--batch-size", "3",
                 "--out", str(html)]) == 0
    assert "note: --beam, --batch-size shape the model's own translation; with --tgt there is none to search" in \
        capsys.readouterr().err
    assert main(["attention", str(tiny_run), "--src", SRC, "--out", str(html)]) == 0
    err = capsys.readouterr().err.splitlines()
    assert err[0].startswith("averaging ") and err[1].startswith("translation: "), err  # in the order they happen


def test_characters_the_font_lacks_are_named_once_not_warned_of_glyph_by_glyph(tiny_run, tmp_path, capsys):
    """matplotlib warned of each missing glyph, with its source path, four times over; one note says it."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a warning that escapes fails the test
        assert main(["attention", str(tiny_run), "--src", "A \U000f0000 runs \U000f0001 .", "--tgt", "Ein \U000f0000 .",
                     "--kind", "cross", "--out", str(tmp_path / "a.png")]) == 0  # private use: no font has them
    err = capsys.readouterr().err
    assert f"note: the font has no glyph for {chr(0xF0000)!r}, {chr(0xF0001)!r}: drawn as boxes" in err
    # nor has the vocabulary a piece: the model read its unknown piece (translate's --prefix refuses such a text)
    assert (f"note: --src: the model's vocabulary has no piece for {chr(0xF0000)!r}, {chr(0xF0001)!r}: the model "
            "reads each as its unknown piece") in err
    assert f"note: --tgt: the model's vocabulary has no piece for {chr(0xF0000)!r}: the model" in err


def test_cli_refuses_bad_requests(tiny_run, tmp_path, capsys):
    assert main(["attention", str(tiny_run), "--src", SRC, "--layer", "9", "--out", str(tmp_path / "a.png")]) == 1
    assert "--layer 9: the model has 2 layers" in (err := capsys.readouterr().err)
    assert "translation:" not in err  # refused before decoding
    assert main(["attention", str(tiny_run), "--src", SRC, "--kind", "cross", "--heads", "2,9",
                 "--out", str(tmp_path / "a.png")]) == 1
    assert (err := capsys.readouterr().err).endswith("--heads 9: the model has 4 heads (1..4)\n") and "translation:" not in err
    assert main(["attention", str(tiny_run), "--src", SRC, "--heads", "x", "--out", str(tmp_path / "a.png")]) == 1
    assert capsys.readouterr().err.startswith("error: --heads 'x'")
    assert main(["attention", str(tiny_run), "--src", SRC, "--tgt", " ", "--out", str(tmp_path / "a.png")]) == 1
    assert capsys.readouterr().err.startswith("error: --tgt is empty")
    assert main(["attention", str(tiny_run), "--src", "dog " * 300, "--out", str(tmp_path / "a.png")]) == 1
    assert (err := capsys.readouterr().err).startswith("error: --src: ") and "pieces with EOS, more than the 128 a " \
        "figure draws" in err  # 800 words drew until the machine's memory ran out
    assert main(["attention", str(tiny_run), "--src", SRC, "--tgt", "Hund " * 200, "--out", str(tmp_path / "a.html")]) == 1
    assert capsys.readouterr().err.startswith("error: --tgt: ")
    assert main(["attention", str(tiny_run), "--src", SRC, "--out", str(tmp_path / "a.jpg")]) == 1
    assert "give a .png or .html" in capsys.readouterr().err


def test_a_translation_too_long_to_draw_is_not_blamed_on_the_source(tiny_run, tmp_path, capsys, monkeypatch):
    """A short source whose translation ran on (a length penalty that rewards length) was told to be shorter."""
    import transformer.cli

    monkeypatch.setattr(transformer.cli, "_translate_lines", lambda *a: ["Hund " * 200])
    assert main(["attention", str(tiny_run), "--src", "A dog .", "--out", str(tmp_path / "a.png")]) == 1
    assert capsys.readouterr().err.endswith("a figure draws: give the translation to draw with --tgt, or bound it "
                                            "with a smaller --max-len-offset\n")
    monkeypatch.setattr(transformer.cli, "_translate_lines", lambda *a: [""])  # said as a bare "translation: "
    assert main(["attention", str(tiny_run), "--src", "A dog .", "--out", str(tmp_path / "a.png")]) == 0
    assert "translation: (empty: the model wrote its end at once)\n" in capsys.readouterr().err


def test_a_long_word_is_shortened_in_the_png(tmp_path, monkeypatch):
    """A URL of 90 characters ran over the heatmaps and the other labels, and matplotlib warned (with its source
    path) that the layout collapsed."""
    from transformer import figures

    url = "https://example.com/a/very/long/path/that/goes/on/and/on/forever/index.html"
    maps = AttentionMaps([f"▁{url}", "▁now", "</s>"], ["<s>", "▁ja"], ["▁ja", "</s>"],
                         {"enc_self": torch.softmax(torch.randn(1, 2, 3, 3), -1),
                          "dec_self": torch.softmax(torch.randn(1, 2, 2, 2), -1),
                          "cross": torch.softmax(torch.randn(1, 2, 2, 3), -1)})
    drawn, save = [], figures._save_png
    monkeypatch.setattr(figures, "_save_png", lambda fig, out, dpi: (drawn.append(fig), save(fig, out, dpi)))
    for style in ("links", "heatmap"):
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # the layout's warning fails the test
            figures.draw_attention(maps.merged(), "enc-self", 1, None, tmp_path / f"{style}.png", style=style)
        texts = [t.get_text() for ax in drawn[-1].axes for t in [*ax.texts, *ax.get_xticklabels()]]
        assert url[:figures.MAX_LABEL - 1] + "\u2026" in texts and url not in texts, texts


def test_dollar_signs_are_drawn_as_text_not_read_as_tex(tiny_run, tmp_path, capsys):
    """Labels went through matplotlib's mathtext: "$\\frac$" was an internal error (ValueError), "$5-$10" lost its
    dollar signs; a run folder so named failed `plot` too."""
    for style in ("links", "heatmap"):
        assert main(["attention", str(tiny_run), "--src", "It costs $\\frac$ , $5-$10 .", "--tgt", "x_1 $",
                     "--words", "--style", style, "--out", str(tmp_path / f"{style}.png")]) == 0, capsys.readouterr().err
    folder = tmp_path / "$\\frac$"
    folder.mkdir()
    shutil.copy(tiny_run / "metrics.jsonl", folder / "metrics.jsonl")
    assert plot_training(folder / "metrics.jsonl", tmp_path / "curves.png")


def test_a_parsing_runs_figure_reads_brackets_as_the_parse_does(tiny_parse_run):
    """The parse reads "(" as the treebank's word -LRB-; the figure encoded it as it came, unknown pieces the model
    never read, beside a translation that held -LRB-."""
    from transformer.translator import Translator

    parser = Translator(tiny_parse_run, log=lambda m: None)
    src = "He said ( hi ) ."
    maps = attention_maps(parser, src, parser.translate([src])[0])
    assert maps.src == parser.tokenizer.pieces("He said -LRB- hi -RRB- .") + ["</s>"]
    assert not any(p in ("\u2581(", "(", "\u2581)", ")") for p in maps.src)


def test_figures_leave_the_process_matplotlib_backend_and_refuse_what_they_cannot_draw(translator, tiny_run,
                                                                                       tmp_path):
    """draw_attention and plot_training called matplotlib.use("Agg"): a notebook's inline figures stopped showing
    for the rest of its session. A layer past the model's was an IndexError, a kind of the command line's spelling
    a KeyError, an unknown style drew both; plot_training took no str path."""
    import matplotlib

    from transformer.figures import draw_attention

    before = matplotlib.get_backend()
    matplotlib.use("svg")
    try:
        maps = attention_maps(translator, SRC, TGT)
        assert draw_attention(maps, "enc-self", 1, None, tmp_path / "a.png") == []
        assert plot_training(str(tiny_run / "metrics.jsonl"), str(tmp_path / "curves.png"))
        assert matplotlib.get_backend() == "svg"
    finally:
        matplotlib.use(before)
    layers = translator.cfg.model.n_dec_layers
    for call, said in (
            (lambda: draw_attention(maps, "cross", layers + 1, None, tmp_path / "b.png"),
             f"--layer {layers + 1}: the model has {layers} layers"),
            (lambda: draw_attention(maps, "self", 1, None, tmp_path / "b.png"), "kind 'self': one of enc-self, "),
            (lambda: draw_attention(maps, "cross", 1, None, tmp_path / "b.png", style="bogus"), "style 'bogus': one of"),
            (lambda: draw_attention(maps, "cross", 1, None, tmp_path / "missing" / "b.png"), "does not exist"),
            (lambda: plot_training(None, tmp_path / "c.png"), "metrics_path: a path")):
        with pytest.raises(UserError, match=re.escape(said)):
            call()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.png", "curves.png"]


def test_plot_draws_the_runs_own_log(tiny_run, tmp_path, capsys):
    drawn = plot_training(tiny_run / "metrics.jsonl", tmp_path / "curves.png")
    assert {"train_loss", "valid_nll", "valid_ppl", "lr", "valid_bleu"} <= set(drawn)
    assert (tmp_path / "curves.png").stat().st_size > 10_000
    bad = tmp_path / "metrics.jsonl"
    bad.write_text('{"step": 1, "lr": 0.1}\nnot json\n')
    with pytest.raises(FigureError, match=r"metrics.jsonl:2: not a JSON record"):
        plot_training(bad, tmp_path / "x.png")
    assert main(["plot", str(tmp_path / "nowhere")]) == 1
    (tmp_path / "folder" / "metrics.jsonl").mkdir(parents=True)  # "no metrics.jsonl" of one that is there
    assert main(["plot", str(tmp_path / "folder")]) == 1
    assert capsys.readouterr().err.endswith(f"{tmp_path / 'folder' / 'metrics.jsonl'}: a folder, not the run's log of "
                                            "metrics\n")


GOOD_RECORD = b'{"step": 5, "minutes": 0.5, "lr": 0.001, "train_loss": 6.5}\n'


@pytest.mark.parametrize("line, said", [
    (b"5", "a record must be a JSON object {...}, not a number"),
    (b"null", "a record must be a JSON object {...}, not null"),
    (b'"step train_loss"', "a record must be a JSON object {...}, not a string"),
    (b'{"train_loss": 6.1}', 'no "step"'),
    (b'{"step": -10}', '"step" must be a non-negative integer, not -10'),
    (b'{"step": 10.5}', '"step" must be a non-negative integer, not 10.5'),
    (b'{"step": true}', '"step" must be a non-negative integer, not true'),
    (b'{"step": 1%s}' % (b"0" * 60), '"step" is 1%s…, beyond any value a run logs' % ("0" * 38)),
    (b'{"step": 10, "train_loss": {"a": 1}}', '"train_loss" must be a number, not an object {"a": 1}'),
    (b'{"step": 10, "lr": "0.1"}', '"lr" must be a number, not a string "0.1"'),
    (b'{"step": 10, "train_loss": 1e308}', '"train_loss" is 1e+308, beyond any value a run logs (±3.4e+38)'),
    (b'{"step": 10, "valid_ppl": -1e300}', '"valid_ppl" is -1e+300, beyond any value a run logs'),
    (b'{"step": 10, "minutes": NaN}', '"minutes" must be a non-negative finite number, not NaN'),
    (b'{"step": 10, "minutes": -1}', '"minutes" must be a non-negative finite number, not -1'),
    (b'{"step": 10, "minutes": 1e300}', '"minutes" is 1e+300, beyond any value a run logs'),
    (b'{"step": 10, "train_loss": 6\xff}', "invalid UTF-8 (byte 0xff at byte column 29)"),
    pytest.param(b"[" * 10_000, "not a JSON record (maximum recursion depth exceeded", id="deeply-nested"),
])
def test_plot_names_the_line_it_cannot_draw(tmp_path, capsys, line, said):
    """A damaged metrics.jsonl ended in "internal error" (TypeError, "arange: cannot compute length",
    UnicodeDecodeError): every record is now checked before anything is drawn, and refused by its line."""
    run = tmp_path / "run"
    run.mkdir()
    (run / "metrics.jsonl").write_bytes(GOOD_RECORD + line + b"\n" + GOOD_RECORD)
    assert main(["plot", str(run), "--out", str(tmp_path / "x.png")]) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"error: {run / 'metrics.jsonl'}:2: ") and said in err
    assert err.count("\n") == 1 and not (tmp_path / "x.png").exists()


def test_plot_leaves_out_a_last_line_cut_short_and_refuses_a_log_of_nothing_to_draw(tmp_path):
    """A run killed mid-write (or one writing now) leaves its last line cut short: plot refused the whole file
    ("not a JSON record"), where a resume leaves that line out. A whole last line without its newline (a
    file written by hand) is kept. Records with no metric drew an empty figure, said as "wrote x.png ()"."""
    log = tmp_path / "metrics.jsonl"
    log.write_bytes(GOOD_RECORD + b'{"step": 10, "minutes": 1.0, "lr": 0.002, "train_lo')
    assert plot_training(log, tmp_path / "cut.png") == ["train_loss", "lr"]
    log.write_bytes(GOOD_RECORD + b'{"step": 10, "valid_ppl": 9.5}')
    assert plot_training(log, tmp_path / "whole.png") == ["train_loss", "valid_ppl", "lr"]
    log.write_bytes(GOOD_RECORD + b'{"step": 10, "minutes": 1.0, "lr": 0.002, "train_lo\n' + GOOD_RECORD)
    with pytest.raises(FigureError, match=r"metrics.jsonl:2: not a JSON record"):  # damage inside: still named
        plot_training(log, tmp_path / "x.png")
    log.write_bytes(b'{"step": 5, "minutes": 0.5}\n{"step": 10, "tokens_per_s": 900}\n')
    with pytest.raises(FigureError, match=r"metrics.jsonl: no record holds a metric to draw \(train_loss, valid_nll, "):
        plot_training(log, tmp_path / "x.png")
    assert not (tmp_path / "x.png").exists()


def test_plot_draws_a_diverged_run_with_gaps(tmp_path):
    """NaN and Infinity are what train.py logs when a loss overflows (json reads them back): a gap in the
    line, not a refusal, since a diverged run is the one to look at."""
    bad = tmp_path / "metrics.jsonl"
    bad.write_text('{"step": 5, "minutes": 0.5, "lr": 0.001, "train_loss": 6.5, "valid_nll": NaN, "valid_ppl": NaN}\n'
                   '{"step": 10, "minutes": 1.0, "lr": 0.002, "train_loss": Infinity, "valid_nll": 5.1, '
                   '"valid_ppl": Infinity}\n{"step": 15, "minutes": 1.5, "lr": 0.002, "train_loss": -Infinity}\n')
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # nor a warning of matplotlib's
        assert plot_training(bad, tmp_path / "curves.png") == ["train_loss", "valid_nll", "valid_ppl", "lr"]
    assert (tmp_path / "curves.png").stat().st_size > 10_000


def test_the_plots_legend_says_the_training_loss_is_smoothed(tiny_run, tmp_path, monkeypatch):
    """train_loss is label-smoothed and valid_nll is not: drawn on one axis under the bare keys, validation
    looked better than training."""
    import matplotlib.figure

    legends = []
    save = matplotlib.figure.Figure.savefig

    def recording(fig, *args, **kwargs):
        legends.extend(t.get_text() for ax in fig.axes if ax.get_legend() for t in ax.get_legend().get_texts())
        return save(fig, *args, **kwargs)

    monkeypatch.setattr(matplotlib.figure.Figure, "savefig", recording)
    plot_training(tiny_run / "metrics.jsonl", tmp_path / "curves.png")
    assert "train_loss (label-smoothed, §5.4)" in legends and "valid_nll (no smoothing)" in legends


@pytest.mark.parametrize("ppl, shown", [((450.0, 380.0, 310.0), {"400"}),
                                        ((3.2e4, 800.0, 30.0, 5.0), {"10", "100", "1000", "10000"}),
                                        ((4e6, 2e3), {"10000", "100000", "1000000"})])
def test_the_perplexity_axis_reads_plain_numbers(tmp_path, monkeypatch, ppl, shown):
    """Perplexities within a decade (300 to 450) were labelled "3 × 10^2", "4 × 10^2" on the log axis. Over
    decades (a run's 32,000 to 5) the decades alone are labelled, as matplotlib chooses; 10^6 is 1000000."""
    import matplotlib.figure

    labels = []
    save = matplotlib.figure.Figure.savefig

    def recording(fig, *args, **kwargs):
        fig.canvas.draw()
        ax = next(ax for ax in fig.axes if ax.get_ylabel() == "perplexity")
        low, high = ax.get_ylim()
        labels.extend(t.get_text() for minor in (False, True) for t in ax.get_yticklabels(minor=minor)
                      if t.get_text() and low <= t.get_position()[1] <= high)
        return save(fig, *args, **kwargs)

    monkeypatch.setattr(matplotlib.figure.Figure, "savefig", recording)
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps({"step": s, "minutes": s / 10, "valid_ppl": p}) + "\n"
                                                    for s, p in enumerate(ppl, 1)))
    plot_training(tmp_path / "metrics.jsonl", tmp_path / "curves.png")
    assert labels and all(re.fullmatch(r"\d+", t) for t in labels), labels
    assert shown <= set(labels) and (len(shown) < 3 or set(labels) == shown), labels  # over decades: decades alone


def test_words_of_pieces_drop_a_lone_word_start():
    """sentencepiece writes "A ." as "▁A", "▁", ".": the figure's word was "▁."."""
    from transformer.figures import _word_groups

    assert _word_groups(["▁A", "▁", ".", "</s>"]) == (["A", ".", "</s>"], [[0], [1, 2], [3]])
    assert _word_groups(["<s>", "▁"]) == (["<s>", "▁"], [[0], [1]])


def test_word_alignment_on_a_hand_built_case():
    """Source "▁the ▁hou se </s>" (words 0, 1), target "▁das ▁Ha us </s>" (words 0, 1). The penultimate
    of 3 layers decides (layer 1); the other layers point elsewhere, and EOS links to nothing."""
    from transformer.figures import word_alignment

    src, tgt_out = ["▁the", "▁hou", "se", "</s>"], ["▁das", "▁Ha", "us", "</s>"]
    cross = torch.full((3, 2, 4, 4), 0.25)
    # layer 1, averaged over its 2 heads: das -> the, Ha -> se (house), us -> hou (house), EOS -> EOS
    cross[1, 0] = torch.tensor([[.7, .1, .1, .1], [.1, .2, .6, .1], [.1, .5, .3, .1], [0, 0, 0, 1.]])
    cross[1, 1] = torch.tensor([[.5, .2, .2, .1], [.1, .3, .4, .2], [.2, .6, .1, .1], [0, 0, 0, 1.]])
    cross[0, :, :, 3] = cross[2, :, :, 3] = 0.9  # the other layers look at EOS: ignored
    maps = AttentionMaps(src, ["<s>", *tgt_out[:-1]], tgt_out, {"cross": cross})
    assert word_alignment(maps) == [(0, 0), (1, 1)]
    # a source word no piece attends to is unaligned; two target words can share a source word
    cross[1, :, 1] = torch.tensor([.8, .1, .05, .05])
    cross[1, :, 2] = torch.tensor([.8, .1, .05, .05])
    assert word_alignment(maps) == [(0, 0), (0, 1)]
    one_layer = AttentionMaps(src, ["<s>", *tgt_out[:-1]], tgt_out, {"cross": cross[1:2]})
    assert word_alignment(one_layer) == [(0, 0), (0, 1)]
    empty = AttentionMaps(src, ["<s>"], ["</s>"], {"cross": cross[:, :, :1]})
    assert word_alignment(empty) == []


def test_layers_and_heads_are_counted_from_one():
    """--layer and --heads count from 1, as the figures name them: 0 is no head (as an index it would draw the
    last head under another's number) and no layer, and neither is one past the last."""
    from transformer.figures import chosen_heads

    assert chosen_heads(2, 4, 1, None) == [1, 2, 3, 4] and chosen_heads(2, 4, 2, [4, 1]) == [4, 1]
    for heads in ([0, 2], [5]):
        with pytest.raises(FigureError, match=rf"^--heads {heads[0]}: the model has 4 heads \(1..4\)$"):
            chosen_heads(2, 4, 1, heads)
    for layer in (0, 3):
        with pytest.raises(FigureError, match=rf"^--layer {layer}: the model has 2 layers \(1..2\)$"):
            chosen_heads(2, 4, layer, None)
    # a head given twice was drawn twice, with two legend entries of one head
    with pytest.raises(FigureError, match=r"^--heads 1,3,1,3,2: head 1,3 given twice; give each once$"):
        chosen_heads(2, 4, 1, [1, 3, 1, 3, 2])


def test_a_piece_after_a_special_token_starts_a_word():
    """A translation may begin with a piece that has no ▁ (sentencepiece writes "(" or a digit so): it is a word of
    its own, not glued onto "<s>", which would drop the start symbol's row and column from the words view."""
    from transformer.figures import _word_groups

    assert _word_groups(["<s>", "ja", "hr"]) == (["<s>", "jahr"], [[0], [1, 2]])
    assert _word_groups(["▁a", "</s>", "b"]) == (["a", "</s>", "b"], [[0], [1], [2]])


def test_word_alignment_passes_over_the_source_eos():
    """A target piece that attends most to the source's EOS (common for punctuation and in small models) is linked
    to the source word it attends to most besides: EOS is no word, and has no index in the Pharaoh pairs."""
    from transformer.figures import word_alignment

    src, tgt_out = ["▁the", "▁house", "</s>"], ["▁das", "▁Haus", "</s>"]
    cross = torch.zeros(1, 1, 3, 3)
    cross[0, 0] = torch.tensor([[.2, .1, .7], [.1, .3, .6], [0, 0, 1.]])
    maps = AttentionMaps(src, ["<s>", *tgt_out[:-1]], tgt_out, {"cross": cross})
    assert word_alignment(maps) == [(0, 0), (1, 1)]


def test_script_json_holds_no_markup_characters():
    """script_json escapes <, > and & alike, so the data is inert in the page however it is parsed (an HTML
    script element, or XHTML, where a raw & starts an entity), and reads back as written."""
    from transformer.figures import script_json

    text = script_json({"s": "a & b <c> &amp;"})
    assert not set("<>&") & set(text) and json.loads(text) == {"s": "a & b <c> &amp;"}


def test_plot_draws_a_record_of_step_zero(tmp_path):
    """"step" is a non-negative integer: a record at update 0 (a log written before the first update, or by
    another tool counting from 0) is drawn, not refused as damage."""
    log = tmp_path / "metrics.jsonl"
    log.write_text('{"step": 0, "minutes": 0, "lr": 0.0, "train_loss": 9.1}\n' + GOOD_RECORD.decode())
    assert plot_training(log, tmp_path / "curves.png") == ["train_loss", "lr"]


def test_plot_refuses_infinite_minutes(tmp_path):
    """"minutes" is an x axis read off a clock: Infinity is damage, named by its line, where a metric's Infinity
    (a diverged loss) is a gap."""
    log = tmp_path / "metrics.jsonl"
    log.write_text(GOOD_RECORD.decode() + '{"step": 10, "minutes": Infinity}\n')
    with pytest.raises(FigureError, match=r'metrics.jsonl:2: "minutes" must be a non-negative finite number, not Inf'):
        plot_training(log, tmp_path / "curves.png")


def test_an_empty_source_aligns_nothing(translator):
    """`translate --alignment` and the server align every line, an empty one included: it has no word to link,
    so it aligns nothing rather than failing as the attention figure of an empty sentence does."""
    from transformer.figures import align

    assert align(translator, "", "") == [] and align(translator, "  ", "Ein Haus.") == []
    with pytest.raises(FigureError, match="empty"):
        attention_maps(translator, "  ", "Ein Haus.")


def test_plot_refuses_a_metric_that_is_true_or_false(tmp_path):
    """JSON's true is no number, although Python's bool is an int: drawn, it would be a point at 1.0 on the loss
    or learning-rate axis, so it is refused by its line and field as any other non-number."""
    log = tmp_path / "metrics.jsonl"
    log.write_text(GOOD_RECORD.decode() + '{"step": 10, "lr": true}\n')
    with pytest.raises(FigureError, match=r'metrics.jsonl:2: "lr" must be a number, not true$'):  # "true true"
        plot_training(log, tmp_path / "curves.png")


def test_figures_are_written_into_a_pipe(tiny_run):
    """`attention --out /dev/stdout | ...` and `plot --out /dev/stdout`, taken as streams by the output check, were
    internal errors: the PNG writer seeks back in its file, which a pipe cannot."""
    import os
    import threading

    for argv in (["attention", str(tiny_run), "--src", SRC], ["plot", str(tiny_run)]):
        read, write = os.pipe()
        got = []
        reader = threading.Thread(target=lambda: got.append(os.fdopen(read, "rb").read()))
        reader.start()
        try:
            assert main([*argv, "--out", f"/dev/fd/{write}"]) == 0, argv
        finally:
            os.close(write)
            reader.join()
        assert got[0][:8] == b"\x89PNG\r\n\x1a\n" and len(got[0]) > 10_000, argv


def test_the_title_keeps_clear_of_the_heads_legend_for_a_long_sentence(translator, tmp_path, monkeypatch):
    """From about 30 pieces, the layout drew the figure's title over the heads' legend above the links."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    from transformer import figures

    drawn, save = [], figures._save_png
    monkeypatch.setattr(figures, "_save_png", lambda fig, out, dpi: (drawn.append(fig), save(fig, out, dpi)))
    sentence = " ".join(["A little girl climbs into a wooden playhouse ."] * 4)
    maps = attention_maps(translator, sentence, sentence)
    for style in ("both", "links"):
        figures.draw_attention(maps, "enc-self", 1, None, tmp_path / f"{style}.png", style=style)
        fig = drawn[-1]
        renderer = FigureCanvasAgg(fig).get_renderer()  # of the layout the PNG was drawn in
        title, legend = fig.get_suptitle(), fig.axes[0].get_legend()
        assert len(maps.axes("enc_self")[0]) >= 30 and title and legend
        assert not fig._suptitle.get_window_extent(renderer).overlaps(legend.get_window_extent(renderer)), style


def test_a_parsing_runs_brackets_are_not_noted_as_unknown(tiny_parse_run, tmp_path, capsys):
    """attention on a parsing run noted "(" and ")" of --src as unknown characters, where the model reads them as
    -LRB- and -RRB-, words of its vocabulary, and the figure labels them so."""
    from transformer.cli import main

    out = tmp_path / "p.png"
    assert main(["attention", str(tiny_parse_run), "--src", "The dog ( barked ) .", "--out", str(out)]) == 0
    assert "no piece for" not in capsys.readouterr().err and out.is_file()


def test_a_figure_at_the_piece_limit_stays_an_image_readers_open(tmp_path, monkeypatch):
    """128 pieces a side and 8 heads drew a 12,628 x 7,183 PNG (90 million pixels, which Pillow warns of as a
    decompression bomb) in 30 s: the resolution is lowered as far as keeps a figure within MAX_PIXELS."""
    from transformer import figures

    saved = []
    monkeypatch.setattr(figures, "_save_png", lambda fig, out, dpi: saved.append((*fig.get_size_inches(), dpi)))
    n, heads = 128, 4  # the links over a row of 4 heatmaps: 94 million pixels at 110 dpi
    tokens = [f"w{i}" for i in range(n - 1)] + ["</s>"]
    weights = torch.softmax(torch.randn(1, heads, n, n, generator=torch.Generator().manual_seed(0)), -1)
    maps = AttentionMaps(tokens, ["<s>"] + tokens[:-1], tokens, {k: weights for k in ("enc_self", "dec_self", "cross")})
    figures.draw_attention(maps, "cross", 1, None, tmp_path / "a.png")
    (width, height, dpi), = saved
    assert (width * dpi) * (height * dpi) <= figures.MAX_PIXELS and min(width, height) * dpi > 4000
    assert figures.png_dpi(8, 6) == 110  # a sentence's figure as before


def test_a_perplexity_of_zero_is_left_out_without_matplotlibs_warning(tmp_path):
    """A hand-edited valid_ppl of 0 printed matplotlib's "Data has no positive values, and therefore cannot be
    log-scaled" with its source path, and the series was said to be drawn where no point of it was."""
    records = [{"step": 1, "minutes": 0.1, "train_loss": 5.0, "lr": 1e-3, "valid_ppl": 0, "valid_bleu": 0.0},
               {"step": 2, "minutes": 0.2, "train_loss": 4.0, "lr": 1e-3, "valid_ppl": -1, "valid_bleu": 0.0}]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        drawn = plot_training(tmp_path / "metrics.jsonl", tmp_path / "c.png")
    assert "valid_ppl" not in drawn and "valid_bleu" in drawn


def test_a_parsing_runs_brackets_are_not_unknown_to_score_or_the_server(tiny_parse_run, tmp_path, capsys):
    """score and /v1/attention read a parsing run's source as the model does: "(" is the word -LRB-, no unknown
    character (attention's note said otherwise)."""
    pytest.importorskip("fastapi")
    from fastapi.testclient import TestClient

    from transformer.cli import main
    from transformer.serve import Limits, create_app
    from transformer.translator import Translator

    (tmp_path / "src").write_text("The dog ( barked ) .\n")
    (tmp_path / "tgt").write_text("(S (NP The dog )NP (VP barked )VP . )S\n")
    assert main(["score", str(tiny_parse_run), "--src", str(tmp_path / "src"), "--tgt", str(tmp_path / "tgt")]) == 0
    assert "no piece for" not in capsys.readouterr().err
    with TestClient(create_app(Translator(tiny_parse_run, log=lambda m: None), Limits())) as client:
        answer = client.post("/v1/attention", json={"text": "The dog ( barked ) .",
                                                    "translation": "(S (NP The dog )NP (VP barked )VP . )S"})
    assert answer.status_code == 200 and answer.json()["unknown"] == []
