"""Scores: translation quality (sacreBLEU, chrF, and the two tokenized BLEUs others report; §6.1, A13)
and parse quality (labelled bracket F1, §6.3).

Three numbers that must never be mixed up, so each has its own function:
- sacrebleu_scores: detokenized, cased sacreBLEU (and chrF) with its signature; comparable across papers.
- tok_lc_bleu: the Multi30k literature's number, tokenized lowercased BLEU against the dataset's own
  preprocessed references (multi30k/tok/*.lc.norm.tok.*).
- paper_bleu: what the authors' get_ende_bleu.sh computed for Table 2 (Moses tokenization, ##AT##
  compound splitting, multi-bleu.perl).
Tokenized BLEUs are scored like multi-bleu.perl: whitespace tokens, no smoothing.

Parse trees (§6.3): ``score_trees`` is EVALB with COLLINS.prm, the standard for that task: labelled
brackets (label, first word, last word) over all constituents except part-of-speech nodes; words
whose gold tag is punctuation (``,`` ``:`` ``` `` ``` ``''`` ``.``) are removed before spans are
counted; ADVP and PRT are the same label; brackets are matched one to one (unary chains count each
bracket); precision, recall and F1 are summed over the corpus (micro-averaged). The model predicts
no tags, so a parsed tree carries the placeholder, and scoring reads the gold tree's tags for
punctuation, as EVALB reads both trees' tags with the same words (the gold tags are put in the
parse's preterminals).
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import sacrebleu
from sacrebleu.metrics.bleu import BLEUScore
from sacremoses import MosesPunctNormalizer, MosesTokenizer
from sacremoses.corpus import NonbreakingPrefixes

from .config import ConfigError, check_strings, primary_language
from .trees import Tree, TreeError, with_tags


def _check_lengths(hyps: list[str], refs: list[str]) -> None:
    """ConfigError for what sacreBLEU would score wrongly or fail on inside: one string (scored a character a
    line), lists of other lengths, none at all (its IndexError), an item that is no string."""
    check_strings(hyps, "hypotheses")
    check_strings(refs, "references")
    if len(hyps) != len(refs):
        raise ConfigError(f"{len(hyps)} hypotheses but {len(refs)} references")
    if not hyps:
        raise ConfigError("no hypotheses to score (and no references)")


# ISO 639-2/3 codes of the languages sacreBLEU tokenizes by their own rules, as its two-letter codes
_SACREBLEU_CODES = {"zho": "zh", "chi": "zh", "jpn": "ja", "kor": "ko"}
# languages written without spaces between words (Korean's spaces set off phrases, not words): Moses splits none
UNSPACED = {"zh", "ja", "th", "lo", "km", "my", "yue", "zho", "chi", "jpn", "tha", "lao", "khm", "mya", "bur"}


def bleu_metric(lang: str = "") -> sacrebleu.BLEU:
    """sacreBLEU's BLEU for text in ``lang`` with its defaults for that language: 13a tokenization, except
    Chinese, Japanese and Korean, written without spaces between words, which 13a would score as one word a
    sentence (BLEU about 0); Japanese and Korean need sacreBLEU's extras (MeCab), a ConfigError without."""
    if not isinstance(lang, str):  # None: an AttributeError in primary_language
        raise ConfigError(f"lang: a language code such as 'de' ('' for sacreBLEU's 13a tokenizer), not "
                          f"{type(lang).__name__} {lang!r}")
    code = primary_language(lang)
    code = _SACREBLEU_CODES.get(code, code)
    try:
        return sacrebleu.BLEU(trg_lang=code)
    except RuntimeError:  # its message is a paragraph; the remedy is one install
        raise ConfigError(f"BLEU of '{code}' text needs sacreBLEU's tokenizer for it, whose packages are not "
                          f"installed: pip install 'sacrebleu[{code}]'") from None


def sacrebleu_scores(hyps: list[str], refs: list[str], lang: str = "") -> dict[str, float | str]:
    """Detokenized, cased BLEU and chrF with sacreBLEU's defaults (exp smoothing; its tokenizer for the
    target language ``lang``, 13a for most: ``bleu_metric``)."""
    _check_lengths(hyps, refs)
    bleu, chrf = bleu_metric(lang), sacrebleu.CHRF()
    return {"bleu": bleu.corpus_score(hyps, [refs]).score, "chrf": chrf.corpus_score(hyps, [refs]).score,
            "signature": str(bleu.get_signature()), "chrf_signature": str(chrf.get_signature())}


@lru_cache(maxsize=None)
def _normalizer(lang: str) -> MosesPunctNormalizer:
    # perl_parity: reproduce normalize-punctuation.perl's own quirks (e.g. French "d’" -> d ").
    return MosesPunctNormalizer(lang=lang, perl_parity=True)


@lru_cache(maxsize=None)
def _tokenizer(lang: str) -> MosesTokenizer:
    return MosesTokenizer(lang=lang)


def moses_language_warning(lang: str) -> str | None:
    """A warning when Moses has no rules of its own for ``lang`` (its nonbreaking prefixes): sacremoses then
    tokenizes with English abbreviations and no language's apostrophe rules without a word, so a mistyped
    language ("dee" for "de") changes the tokenized scores silently. A language Moses has no rules for
    (Turkish, say) is still scored so, after the warning."""
    if primary_language(lang) in UNSPACED:  # Moses has abbreviations for zh, and splits no word of it
        return (f"warning: {lang!r} is written without spaces between words, which Moses does not split: the "
                "tokenized scores count each run of characters between spaces or punctuation as one word (sacreBLEU's "
                "BLEU, the first score, splits Chinese and Japanese by its own rules)")
    known = sorted(set(NonbreakingPrefixes().available_langs.values()))
    if lang in known:
        return None
    return (f"warning: Moses has no rules for language {lang!r}: the tokenized scores use its defaults (English "
            f"abbreviations); it has rules for {', '.join(known)}")


def writes_tokenized(train_tgt: str) -> bool:
    """Whether a run trained on ``train_tgt`` writes Moses-tokenized lowercased text: trained on files in a tok/
    folder, as Multi30k's (multi30k/tok/train.lc.norm.tok.de.gz). Its outputs are scored against tokenized
    references as they are (``tok_lc_bleu``'s ``pretokenized``): tokenized again, their escapes are escaped
    again (&apos; -> &amp; apos ;), and the score fell to a fifth. The file's own folder alone: any tok/ above it
    (/home/tok/corpus/train.de) scored a cased run's outputs untokenized, near 0."""
    return Path(train_tgt).parent.name == "tok"


def moses_tokenize_lc(lines: list[str], lang: str) -> list[str]:
    """Multi30k's scripts/task1-tokenize.sh: lowercase | normalize-punctuation -l L | tokenizer -l L.

    tokenizer.perl's defaults: XML-escaped (&quot; &apos; ...), no aggressive dash splitting. The
    "\\n" is what the perl script sees on each line: its rule moving a period past a closing quote
    (`."` -> `".`) needs a character after the quote, which at the end of a line is the newline.
    """
    norm, tok = _normalizer(lang), _tokenizer(lang)
    return [tok.tokenize(norm.normalize(line.rstrip("\n").lower() + "\n"), escape=True, return_str=True)
            for line in lines]


def _multi_bleu(hyps: list[str], refs: list[str]) -> BLEUScore:
    """multi-bleu.perl: whitespace-split tokens, BLEU 0 when any n-gram order has no match."""
    _check_lengths(hyps, refs)
    return sacrebleu.BLEU(tokenize="none", smooth_method="none", force=True).corpus_score(hyps, [refs])


def tok_lc_bleu_score(hyps: list[str], tok_refs: list[str], lang: str, pretokenized: bool = False) -> BLEUScore:
    """Tokenized lowercased BLEU of detokenized hypotheses against Multi30k's tokenized references, with
    its parts (n-gram precisions, brevity penalty, lengths: whether a gap is in the words or the length);
    ``pretokenized``: the hypotheses are in the references' form already (a model trained on the
    tokenized lowercased files), scored as they are."""
    return _multi_bleu(hyps if pretokenized else moses_tokenize_lc(hyps, lang), tok_refs)


def tok_lc_bleu(hyps: list[str], tok_refs: list[str], lang: str, pretokenized: bool = False) -> float:
    """``tok_lc_bleu_score``'s BLEU."""
    return tok_lc_bleu_score(hyps, tok_refs, lang, pretokenized).score


_COMPOUND = re.compile(r"(\S)-(\S)")


def _split_compounds(line: str) -> str:
    """get_ende_bleu.sh's s{(\\S)-(\\S)}{$1 ##AT##-##AT## $2}g; like perl, matches do not overlap."""
    return _COMPOUND.sub(r"\1 ##AT##-##AT## \2", line)


def paper_bleu(hyps: list[str], refs: list[str], lang: str) -> float:
    """A13: the authors' get_ende_bleu.sh, cased: Moses tokenizer, ##AT## compound split, multi-bleu.

    Follows the script as of the paper (2017-06-29): the replace-unicode-punctuation step on the
    hypotheses was only added in November 2017.
    """
    tok = _tokenizer(lang)
    prep = [_split_compounds(tok.tokenize(x, escape=True, return_str=True)) for x in hyps]
    return _multi_bleu(prep, [_split_compounds(tok.tokenize(r, escape=True, return_str=True)) for r in refs]).score


# -------------------------------------------------------------------------------------------- parse trees (§6.3)
PUNCTUATION_TAGS = frozenset({",", ":", "``", "''", "."})  # COLLINS.prm DELETE_LABEL
EQUAL_LABELS = {"PRT": "ADVP"}  # COLLINS.prm EQ_LABEL ADVP PRT


def brackets(tree: Tree) -> Counter:
    """EVALB's labelled brackets (label, start, end) of a tree whose tags are the gold tags."""
    out: Counter = Counter()
    position = 0

    def walk(node: Tree) -> tuple[int, int]:
        nonlocal position
        if node.is_preterminal:
            start = position
            if node.label not in PUNCTUATION_TAGS and node.label != "-NONE-":
                position += 1
            return start, position
        start = position
        for child in node.children:
            walk(child)
        if position > start and node.label not in ("TOP", ""):
            out[(EQUAL_LABELS.get(node.label, node.label), start, position)] += 1
        return start, position
    walk(tree)
    return out


@dataclass
class ParseScore:
    matched: int = 0
    gold: int = 0
    test: int = 0
    sentences: int = 0
    skipped: int = 0  # pairs without a word once normalised (traces alone, "()"): not scored, as EVALB skips them

    @property
    def precision(self) -> float:
        return 100.0 * self.matched / self.test if self.test else 0.0

    @property
    def recall(self) -> float:
        return 100.0 * self.matched / self.gold if self.gold else 0.0

    @property
    def f1(self) -> float:
        p, r = self.precision, self.recall
        return 2 * p * r / (p + r) if p + r else 0.0

    def as_dict(self) -> dict:
        return {"f1": round(self.f1, 2), "precision": round(self.precision, 2), "recall": round(self.recall, 2),
                "matched": self.matched, "gold_brackets": self.gold, "test_brackets": self.test,
                "sentences": self.sentences, "skipped_empty": self.skipped}


def score_trees(gold: list[Tree | None], test: list[Tree | None]) -> ParseScore:
    """Labelled bracket precision / recall / F1 as EVALB with COLLINS.prm (module docstring). A pair whose
    trees normalisation left empty (None: a tree of traces alone) is skipped; errors name the tree by its
    place in the files."""
    if len(gold) != len(test):
        raise TreeError(f"{len(gold)} gold trees but {len(test)} test trees")
    score = ParseScore()
    for i, (g, t) in enumerate(zip(gold, test), 1):
        if g is None and t is None:
            score.skipped += 1
            continue
        if g is None or t is None:
            raise TreeError(f"tree {i}: the {'gold' if g is None else 'test'} tree is empty (a blank line, or "
                            f"traces alone), where the {'test' if g is None else 'gold'} tree has words")
        if g.words() != t.words():
            raise TreeError(f"tree {i}: the test tree's words differ from the gold tree's "
                            f"({' '.join(t.words()[:8])} ... vs {' '.join(g.words()[:8])} ...)")
        # DEVIATION(§6.3): the model writes no part-of-speech tags (Vinyals et al.'s placeholder XX, or
        # the word itself), so the parse's preterminals take the gold tags before EVALB's rules read them
        gb, tb = brackets(g), brackets(with_tags(t, g.tags()))
        score.matched += sum((gb & tb).values())
        score.gold += sum(gb.values())
        score.test += sum(tb.values())
        score.sentences += 1
    return score
