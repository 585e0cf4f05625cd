"""Figures: attention weights drawn as the paper's appendix (Figures 3-5) and training curves.

The paper argues that self-attention "could yield more interpretable models" (§4) and shows heads
that follow long-distance dependencies (Figure 3), resolve anaphora (Figure 4) and mirror sentence
structure (Figure 5), each drawn as coloured links per head between two copies of the sentence.
``attention_maps`` runs one teacher-forced pass with ``record_attention`` and keeps every layer's
weights; ``draw_attention`` draws them with matplotlib; ``attention_html`` writes a self-contained
interactive page (the same renderer the server's page uses).

Which token labels which axis. Queries are rows, keys are columns. Encoder self-attention: source
pieces on both axes (EOS included). Decoder positions read ``tgt_in`` = <s> y1 .. yn and predict
``tgt_out`` = y1 .. yn </s>: a decoder row is labelled by the token it predicts (what cross-
attention aligns with), a decoder self-attention column by the token that position reads.
"""

from __future__ import annotations

import html
import io
import json
import math
import operator
import re
import warnings
from dataclasses import dataclass
from pathlib import Path

import torch

from . import files
from .config import as_path
from .errors import UserError
from .model import record_attention
from .tokenizer import BOS_ID, EOS_ID

KINDS = ("enc_self", "dec_self", "cross")
SCALE = 1000  # attention weights travel as integers in thousandths (AttentionMaps.to_json)
KIND_NAMES = {"enc-self": "enc_self", "dec-self": "dec_self", "cross": "cross"}  # CLI spelling -> key
# as the HTML page (web/attention.js) and the paper name them
KIND_TITLES = {"enc_self": "encoder self-attention", "dec_self": "decoder self-attention",
               "cross": "encoder-decoder attention"}
MAX_PIXELS = 50_000_000  # a PNG's most (a 128-piece figure of 8 heads was 90 million, which image readers refuse)
WEB = Path(__file__).parent / "web"


class FigureError(UserError, ValueError):
    """A figure request that cannot be drawn (unknown layer or head, bad output name)."""


@dataclass
class AttentionMaps:
    """Attention weights of one sentence pair: weights[kind] is [layers, heads, queries, keys]."""

    src: list[str]  # source pieces + "</s>"
    tgt_in: list[str]  # "<s>" + target pieces: what each decoder position reads
    tgt_out: list[str]  # target pieces + "</s>": what each decoder position predicts
    weights: dict[str, torch.Tensor]

    def axes(self, kind: str) -> tuple[list[str], list[str]]:
        """(row labels, column labels) of ``kind``."""
        return {"enc_self": (self.src, self.src), "dec_self": (self.tgt_out, self.tgt_in),
                "cross": (self.tgt_out, self.src)}[kind]

    def merged(self) -> AttentionMaps:
        """The same maps over words instead of sub-word pieces (a word = a piece starting with ▁ and
        the pieces after it): a word's column is the sum of its pieces' columns (so a row still sums
        to 1) and its row the mean of its pieces' rows, as Clark et al. (2019) merge BERT's pieces."""
        groups = {name: _word_groups(tokens) for name, tokens in
                  (("src", self.src), ("tgt_in", self.tgt_in), ("tgt_out", self.tgt_out))}
        rows_of = {"enc_self": "src", "dec_self": "tgt_out", "cross": "tgt_out"}
        cols_of = {"enc_self": "src", "dec_self": "tgt_in", "cross": "src"}
        weights = {}
        for kind, w in self.weights.items():
            rows, cols = groups[rows_of[kind]][1], groups[cols_of[kind]][1]
            w = torch.stack([w[..., :, g].sum(-1) for g in cols], -1)  # sum over a word's key pieces
            weights[kind] = torch.stack([w[..., g, :].mean(-2) for g in rows], -2)  # mean over its query pieces
        return AttentionMaps(groups["src"][0], groups["tgt_in"][0], groups["tgt_out"][0], weights)

    def to_json(self) -> dict:
        """The compact form of the web page and the API: {"src", "tgt_in", "tgt_out", "scale": 1000,
        "shape": {kind: [L, H, Tq, Tk]}, "weights": {kind: one flat list of integers}}, each weight in
        thousandths (divide by "scale"), row-major over [layer, head, query, key]. Words are merged in
        the page, not sent twice."""
        return {"src": self.src, "tgt_in": self.tgt_in, "tgt_out": self.tgt_out, "scale": SCALE,
                "shape": {k: list(w.shape) for k, w in self.weights.items()},
                "weights": {k: torch.round(w * SCALE).to(torch.int32).flatten().tolist()
                            for k, w in self.weights.items()}}


def _word_groups(tokens: list[str]) -> tuple[list[str], list[list[int]]]:
    """Words and the piece indices of each: a piece starting with ▁, or a special token, starts a word."""
    words: list[str] = []
    groups: list[list[int]] = []
    for i, tok in enumerate(tokens):
        special = tok in ("<s>", "</s>")
        if not groups or special or tok.startswith("▁") or words[-1] in ("<s>", "</s>"):
            words.append(tok if special else tok.removeprefix("▁"))  # a lone "▁" starts a word of what follows
            groups.append([i])
        else:
            words[-1] += tok
            groups[-1].append(i)
    return [w or "▁" for w in words], groups  # a "▁" with nothing after it is shown as itself


def _whole(value: object) -> int:
    """``value`` as a piece id when it is a whole number of any kind (Python's, NumPy's, a tensor's element), else
    -1, which no piece has: a tensor's elements were taken for no whole number, and a bool is no id."""
    if isinstance(value, bool):
        return -1
    try:
        return operator.index(value)
    except TypeError:
        return -1


def attention_maps(translator, src: str, tgt: str) -> AttentionMaps:
    """Every layer's attention weights for ``src`` and ``tgt``, teacher-forced in one pass. The model's own
    translation (an ``Output`` of the translator's) is forced in the pieces it wrote, so the maps are what it
    attended to while translating; any other text in the vocabulary's own segmentation."""
    _sentences(src, tgt)
    if translator.setup.ensemble:  # as the server refuses it: its models' attentions are not one
        raise FigureError("attention of an ensemble: its models attend each their own way, and there is no one "
                          "attention to draw; draw one run's")
    tok = translator.tokenizer
    src = translator.as_read(src)  # a parsing run's brackets as the words it reads (-LRB-), not as unknown pieces
    if not (src_ids := tok.encode(src.strip())):  # no piece: blank, or zero-width spaces alone (Translator.blank)
        raise FigureError("the source sentence is empty")
    src_ids = src_ids + [EOS_ID]
    written = getattr(tgt, "ids", None)
    if written is not None:  # whole numbers of any kind (NumPy's, a tensor's), no padding, start or end among them
        # (text_of drops those, and they were forced as pieces), spelling its text: else drawn as other pieces
        written = [_whole(i) for i in written]
        if not (all(EOS_ID < i < tok.vocab_size for i in written) and translator.text_of(written) == str(tgt)):
            raise FigureError("tgt: an Output whose pieces are not its text in this run's vocabulary (another run's "
                              "translation?): give its text as a str, segmented by this run's vocabulary")
    tgt_ids = list(written) if written is not None else tok.encode(tgt.strip())
    tgt_pieces = tok.id_pieces(tgt_ids) if written is not None else tok.pieces(tgt.strip())
    model = translator.model
    # in evaluation mode, as translate and score run it: a model under training drew dropout into the weights
    with translator.evaluating(), torch.inference_mode(), record_attention(model) as records:
        device = next(model.parameters()).device
        model(torch.tensor([src_ids], device=device), torch.tensor([[BOS_ID, *tgt_ids]], device=device))
    # one call per layer: [1, H, Tq, Tk] -> [L, H, Tq, Tk]
    weights = {kind: torch.cat([calls[0] for calls in records[kind]]).float().cpu() for kind in KINDS}
    return AttentionMaps(tok.pieces(src.strip()) + ["</s>"], ["<s>", *tgt_pieces], [*tgt_pieces, "</s>"], weights)


def word_alignment(maps: AttentionMaps) -> list[tuple[int, int]]:
    """Word alignment from cross-attention (not in the paper; Marian's --alignment, fairseq's
    --print-alignment): each target piece is linked to the source piece it attends to most in the
    penultimate decoder layer, averaged over heads (Garg et al. 2019 found that layer's attention the
    best aligned; the last layer of a 1-layer model), and the links are lifted to words, 0-based
    (source, target) pairs in Pharaoh order. EOS is linked to nothing and nothing to EOS."""
    cross = maps.weights["cross"]  # [L, H, T + 1, S + 1]
    layer = max(cross.size(0) - 2, 0)
    links = cross[layer].mean(0)[:-1, :-1]  # [T, S] without EOS on either side
    if links.numel() == 0:
        return []
    src_word, tgt_word = _printed_words(maps.src[:-1]), _printed_words(maps.tgt_out[:-1])
    if src_word is None or tgt_word is None:  # a side of spaces alone: no word to link
        return []
    return sorted({(src_word[s], tgt_word[t]) for t, s in enumerate(links.argmax(-1).tolist())})


def _printed_words(pieces: list[str]) -> list[int] | None:
    """Each piece's word in the text as printed (``text.split()``'s index), None where it has none: as
    ``_word_groups`` groups them, but a word of a lone "▁" alone (the beam's space before a word's start, or at
    the end, which the text shows as a doubled or trailing space) is part of the next word, or of the last one at
    the end: counted as its own, the indices ran past the line's words."""
    words, groups = _word_groups(pieces)
    if not (total := sum(word != "▁" for word in words)):
        return None
    numbers, n = [], total  # from the end: each word's number, a lone "▁"'s the next word's (the last's at the end)
    for word in reversed(words):
        n -= word != "▁"
        numbers.append(min(n, total - 1))
    return [number for number, group in zip(reversed(numbers), groups) for _ in group]


def align(translator, src: str, tgt: str) -> list[tuple[int, int]]:
    """``word_alignment`` of ``src`` and its translation ``tgt`` (one teacher-forced pass); a blank source
    (``Translator.blank``: zero-width characters alone too) aligns nothing. What `translate --alignment` and
    the server's "alignment" answer."""
    _sentences(src, tgt)
    return [] if translator.blank([src])[0] else word_alignment(attention_maps(translator, src, tgt))


def target_pieces(translator, tgt: str) -> int:
    """How many pieces ``attention_maps`` forces for ``tgt`` (the model's own translation: those it wrote; a
    parsing run's, its tree's, which its text of words alone does not show), EOS not counted."""
    written = getattr(tgt, "ids", None)
    return len(written) if written is not None else len(translator.tokenizer.pieces(tgt.strip()))


def _sentences(src: object, tgt: object) -> None:
    """A FigureError unless ``src`` and ``tgt`` are one sentence each (an AttributeError deep inside, else)."""
    for name, value in (("src", src), ("tgt", tgt)):
        if not isinstance(value, str):
            raise FigureError(f"{name}: one sentence (str), not {type(value).__name__} {value!r:.60}")


def chosen_heads(n_layers: int, n_heads: int, layer: int, heads: list[int] | None) -> list[int]:
    """The heads to draw (all when ``heads`` is None); a FigureError for a layer or head the model has not,
    so that the command checks them before it decodes."""
    if not 1 <= layer <= n_layers:
        raise FigureError(f"--layer {layer}: the model has {n_layers} layers (1..{n_layers})")
    heads = heads or list(range(1, n_heads + 1))
    bad = [h for h in heads if not 1 <= h <= n_heads]
    if bad:
        raise FigureError(f"--heads {','.join(map(str, bad))}: the model has {n_heads} heads (1..{n_heads})")
    if twice := sorted({h for h in heads if heads.count(h) > 1}):  # drawn twice, two legend entries for one head
        raise FigureError(f"--heads {','.join(map(str, heads))}: head {','.join(map(str, twice))} given twice; give "
                          "each once")
    return heads


STYLES = ("links", "heatmap", "both")
MAX_LABEL = 24  # characters of a token a PNG draws (the HTML page shows it whole)


def _select(maps: AttentionMaps, kind: str, layer: int,
            heads: list[int] | None) -> tuple[str, torch.Tensor, list[int]]:
    """``kind`` as KINDS spell it (the command line's spelling too), its ``layer``'s weights and the heads."""
    kind = KIND_NAMES.get(kind, kind)
    if kind not in KINDS:
        raise FigureError(f"kind {kind!r}: one of {', '.join(KIND_NAMES)}")
    heads = chosen_heads(*maps.weights[kind].shape[:2], layer, heads)  # the layer checked before it is read
    return kind, maps.weights[kind][layer - 1], heads


def _figure(width: float, height: float, layout: str = "tight"):
    """A matplotlib figure of its own, drawn without pyplot: pyplot's backend is the process's (a notebook's
    inline one), which ``matplotlib.use("Agg")`` switched for the rest of the session. ``layout``: matplotlib's
    layout engine, applied as the figure is saved."""
    from matplotlib.figure import Figure

    return Figure(figsize=(width, height), layout=layout)


def _plain_log_labels(axis) -> None:
    """A log axis labelled in plain numbers (300, 400; 10000): within a decade matplotlib labels its minor ticks
    "3.4 × 10²". Which ticks are labelled stays its choice (LogFormatter's: minor ones within a decade or two)."""
    from matplotlib.ticker import LogFormatter

    class Plain(LogFormatter):
        def _num_to_string(self, x: float, vmin: float, vmax: float) -> str:
            return f"{x:.0f}" if x >= 1 else f"{x:g}"

    axis.set_major_formatter(Plain())
    axis.set_minor_formatter(Plain(labelOnlyBase=False))


def png_dpi(width: float, height: float, dpi: int = 110) -> int:
    """``dpi`` for a figure of ``width`` x ``height`` inches, lowered as far as keeps it within MAX_PIXELS."""
    return min(dpi, int((MAX_PIXELS / (width * height)) ** 0.5))


def _save_png(fig, out: Path, dpi: int) -> None:
    """``fig`` as a PNG at ``out``, whole or not at all, as every file the package writes. Drawn in memory
    first: the PNG writer seeks back in its file, which a pipe (`--out /dev/stdout | ...`) cannot."""
    image = io.BytesIO()
    fig.savefig(image, dpi=dpi, format="png")
    with files.atomic_path(out) as tmp:
        tmp.write_bytes(image.getvalue())


def draw_attention(maps: AttentionMaps, kind: str, layer: int, heads: list[int] | None, out: Path,
                   style: str = "both") -> list[str]:
    """A PNG of one layer's attention: per-head coloured links from each query token to the keys it
    attends to, line opacity = weight (as Figures 3-5), and/or one heatmap per head (ours: the same weights as
    matrices); ``kind`` one of KINDS (or the command line's spelling), ``style`` one of STYLES. Returns the
    characters the font has no glyph for (drawn as boxes), which matplotlib would warn of one by one."""
    from matplotlib import colormaps

    if style not in STYLES:
        raise FigureError(f"style {style!r}: one of {', '.join(STYLES)}")
    kind, w, heads = _select(maps, kind, layer, heads)
    out = files.check_output(as_path(out, "out"), "out", suffixes=(".png",))
    # a long word (a URL) ran over the heatmaps and the other labels, and matplotlib warned that it could not lay
    # the figure out: shortened, its end marked
    rows, cols = ([t if len(t) <= MAX_LABEL else t[:MAX_LABEL - 1] + "\u2026" for t in side]
                  for side in maps.axes(kind))
    colours = colormaps["tab10" if len(heads) <= 10 else "tab20"]
    n_maps = len(heads) if style != "links" else 0
    n_cols = min(4, max(n_maps, 1))
    n_grid = math.ceil(n_maps / n_cols) if n_maps else 0
    link_h = 0.28 * max(len(rows), len(cols)) + 1 if style != "heatmap" else 0
    cell = 0.22 * max(len(rows), len(cols)) + 1.2
    # constrained: room is kept for the title and, above the links, the heads' legend (tight_layout drew the
    # title over the legend from about 30 pieces)
    fig = _figure(max(6.0, cell * n_cols), link_h + cell * n_grid + 0.6, layout="constrained")
    grid = fig.add_gridspec(int(bool(link_h)) + n_grid, n_cols,
                            height_ratios=([link_h] if link_h else []) + [cell] * n_grid)
    fig.suptitle(f"{KIND_TITLES[kind]}, layer {layer}")
    if link_h:
        ax = fig.add_subplot(grid[0, :])
        ax.set_axis_off()
        n = max(len(rows), len(cols))
        ax.set_xlim(-0.6, 1.6)
        ax.set_ylim(n, -1)
        for i, t in enumerate(rows):
            ax.text(0, i, t, ha="right", va="center", fontsize=9, parse_math=False)  # "$5-$10" is text, not TeX
        for j, t in enumerate(cols):
            ax.text(1, j, t, ha="left", va="center", fontsize=9, parse_math=False)
        for c, h in enumerate(heads):
            hw = w[h - 1]
            for i in range(len(rows)):
                for j in range(len(cols)):
                    if hw[i, j] > 0.02:  # invisible links are not drawn
                        ax.plot([0.03, 0.97], [i, j], color=colours(c), alpha=float(hw[i, j]) / len(heads) ** 0.5,
                                linewidth=2)
        for c, h in enumerate(heads):
            ax.plot([], [], color=colours(c), label=f"head {h}")
        # above the links, not over the top tokens of the right-hand column
        ax.legend(loc="lower center", bbox_to_anchor=(0.5, 1.0), fontsize=8, ncols=min(len(heads), 8), frameon=False)
    for k, h in enumerate(heads if n_maps else []):
        ax = fig.add_subplot(grid[int(bool(link_h)) + k // n_cols, k % n_cols])
        ax.imshow(w[h - 1].numpy(), cmap="Blues", vmin=0.0, vmax=1.0, aspect="auto")
        ax.set_title(f"head {h}", fontsize=9)
        ax.set_xticks(range(len(cols)), cols, rotation=90, fontsize=7, parse_math=False)
        ax.set_yticks(range(len(rows)), rows, fontsize=7, parse_math=False)
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        _save_png(fig, out, dpi=png_dpi(*fig.get_size_inches()))
    missing = {int(m[1]) for w in said if (m := re.match(r"Glyph (\d+) .*missing from font", str(w.message)))}
    for w in said:  # any other warning is not ours to hold back
        if not re.match(r"Glyph \d+ .*missing from font", str(w.message)):
            warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)
    return [chr(c) for c in sorted(missing)]


def attention_html(maps: AttentionMaps, title: str = "attention", view: dict | None = None) -> str:
    """A self-contained interactive page (no network): pick kind, layer, head, links or heatmaps,
    pieces or words; hover a token to isolate its attention. ``view``: what it opens at, the page's own
    names for its menus ({"kind": "cross", "layer": 0, "head": "all" or 0-based, "style": "links" or
    "heatmap", "unit": "pieces" or "words"}; each left out opens at the first)."""
    fields = {"{{TITLE}}": html.escape(title), "/*{{DATA}}*/null": script_json(maps.to_json()),
              "/*{{VIEW}}*/null": script_json(view)}
    return web_page("attention.html", fields)


def script_json(data: object) -> str:
    """JSON that can sit inside a <script> element whatever its strings hold: <, > and & as \\u escapes,
    so no "</script>", "<!--" or "]]>" of a user's sentence ends or changes the script."""
    return json.dumps(data).replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


def web_page(name: str, fields: dict[str, str]) -> str:
    """A page of ``web/`` with the attention viewer's style and script inlined (no network) and
    ``fields`` filled in, all in one pass: a value holding another field's placeholder stays as it
    is. Values are inserted as given: the caller escapes them for where they go (``html.escape``,
    ``script_json``). The HTML figure and the server's page are built the same way."""
    page = (WEB / name).read_text(encoding="utf-8")
    fields = {"/*{{STYLE}}*/": (WEB / "attention.css").read_text(encoding="utf-8"),
              "/*{{SCRIPT}}*/": (WEB / "attention.js").read_text(encoding="utf-8"), **fields}
    pattern = re.compile("|".join(re.escape(key) for key in fields))
    return pattern.sub(lambda m: fields[m.group(0)], page)


# the legend's words for a series whose key alone would mislead: the training loss is label-smoothed (§5.4), so
# it sits above the validation NLL of the same model without any overfitting
SERIES_NAMES = {"train_loss": "train_loss (label-smoothed, §5.4)", "valid_nll": "valid_nll (no smoothing)"}


# every value train.py logs comes from a float32 tensor or a clock: a finite one beyond float32's range is damage,
# and matplotlib cannot lay out an axis near float64's limit ("arange: cannot compute length" at 1e308)
_LARGEST = float(torch.finfo(torch.float32).max)
# plot_training's rows: (y label, the metrics drawn in it), each against "step" and "minutes"
_PANELS = [("loss (nats/token)", ["train_loss", "valid_nll"]), ("perplexity", ["valid_ppl"]),
           ("learning rate", ["lr"]), ("dev BLEU", ["valid_bleu"])]


def _json_kind(value: object) -> str:
    """``value``'s JSON type, as the file spells it."""
    if value is None or isinstance(value, bool):
        return json.dumps(value)
    return {dict: "an object", list: "an array", str: "a string"}.get(type(value), "a number")


def _shown(value: object) -> str:
    """``value`` as JSON, cut short: the error stays one line whatever the file holds."""
    text = json.dumps(value)
    return text if len(text) <= 40 else text[:39] + "…"


def metrics_record(line: str, where: str) -> dict:
    """One record of metrics.jsonl with the fields the plot draws checked, or a FigureError naming ``where``
    (file:line) and the field. A metric may be NaN or ±Infinity (what train.py logs when a loss overflows,
    and Python's json reads back): drawn as a gap, so a diverged run can still be plotted."""
    try:
        record = json.loads(line)
    except (ValueError, RecursionError) as e:  # bad JSON; also an integer of over 4300 digits, or deep nesting
        reason = e.msg if isinstance(e, json.JSONDecodeError) else e
        raise FigureError(f"{where}: not a JSON record ({reason})") from None
    if not isinstance(record, dict):
        raise FigureError(f"{where}: a record must be a JSON object {{...}}, not {_json_kind(record)}")
    if "step" not in record:
        raise FigureError(f'{where}: no "step" (every record train.py writes has one)')
    step = record["step"]
    if isinstance(step, bool) or not isinstance(step, int) or step < 0:
        raise FigureError(f'{where}: "step" must be a non-negative integer, not {_shown(step)}')
    for key in ("step", "minutes", *(key for _, keys in _PANELS for key in keys)):
        if key not in record:
            continue  # not logged at this step (validation and BLEU are logged every so many)
        value = record[key]
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            shown = f" {_shown(value)}" if isinstance(value, (dict, list, str)) else ""  # true, null: said by the kind
            raise FigureError(f'{where}: "{key}" must be a number, not {_json_kind(value)}{shown}')
        finite = not isinstance(value, float) or math.isfinite(value)  # math.isfinite overflows on a huge int
        if key == "minutes" and not (finite and value >= 0):  # an x axis, read off a clock: never NaN or negative
            raise FigureError(f'{where}: "minutes" must be a non-negative finite number, not {_shown(value)}')
        if finite and abs(value) > _LARGEST:
            raise FigureError(f'{where}: "{key}" is {_shown(value)}, beyond any value a run logs (±{_LARGEST:.2g})')
    return record


def plot_training(metrics_path: Path, out: Path) -> list[str]:
    """Training and validation loss, perplexity, learning rate and dev BLEU against steps and minutes,
    from a run's ``metrics.jsonl``. Returns the names of the series that were drawn. A record that cannot
    be drawn is a FigureError naming its line and field (``metrics_record``)."""
    from .data import read_lines  # the one reader of text files: invalid UTF-8 is named with its line

    metrics_path = as_path(metrics_path, "metrics_path")
    out = files.check_output(as_path(out, "out"), "out", suffixes=(".png",))
    lines = read_lines(metrics_path)
    if lines and not metrics_path.read_bytes().endswith(b"\n"):  # its last line may be being written
        try:
            metrics_record(lines[-1], "")  # whole after all (a file written by hand): kept
        except FigureError:  # cut short (a run killed mid-write, one writing it now): left out, as a resume does
            lines.pop()
    records = [metrics_record(line, f"{metrics_path}:{n}") for n, line in enumerate(lines, 1) if line.strip()]
    if not records:
        raise FigureError(f"{metrics_path}: no records yet (the first is written after train.log_every steps)")
    if not any(key in r for r in records for _, keys in _PANELS for key in keys):
        raise FigureError(f"{metrics_path}: no record holds a metric to draw ("
                          f"{', '.join(key for _, keys in _PANELS for key in keys)})")
    drawn = []
    fig = _figure(11, 3 * len(_PANELS))
    axes = fig.subplots(len(_PANELS), 2, squeeze=False)
    for row, (label, keys) in enumerate(_PANELS):
        for col, x_key in enumerate(("step", "minutes")):
            ax = axes[row][col]
            for key in keys:
                # a log axis draws no value <= 0 (a hand-edited log): left out here, not warned of by matplotlib
                points = [(r[x_key], r[key]) for r in records if key in r and x_key in r
                          and (label != "perplexity" or r[key] > 0)]
                if points:
                    xs, ys = zip(*points)
                    ax.plot(xs, ys, marker="o" if len(points) < 30 else None, markersize=3,
                            label=SERIES_NAMES.get(key, key))
                    if col == 0:
                        drawn.append(key)
            if label == "perplexity":
                ax.set_yscale("log")
                _plain_log_labels(ax.yaxis)
            ax.set_xlabel("update" if x_key == "step" else "wall-clock minutes")
            ax.set_ylabel(label)
            if ax.lines:
                ax.legend(fontsize=8)
                if "BLEU" in label:  # all 0 (an early run): the axis ran from -0.04
                    ax.set_ylim(bottom=0)
            else:  # not yet (before the first validation), or never (train.bleu_every 0)
                ax.text(0.5, 0.5, "none in this run's log" + (" (train.bleu_every)" if "BLEU" in label else ""),
                        ha="center", va="center", transform=ax.transAxes, color="grey")
            ax.grid(alpha=0.3)
    fig.suptitle(str(metrics_path.parent.name), parse_math=False)  # a folder's name, "$\frac$" too
    _save_png(fig, out, dpi=100)
    return drawn
