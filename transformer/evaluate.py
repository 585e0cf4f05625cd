"""Translation quality: sacreBLEU and chrF, and the two tokenized BLEUs others report (§6.1, A13).

Three numbers that must never be mixed up, so each has its own function:
- sacrebleu_scores: detokenized, cased sacreBLEU (and chrF) with its signature; comparable across papers.
- tok_lc_bleu: the Multi30k literature's number, tokenized lowercased BLEU against the dataset's own
  preprocessed references (multi30k/tok/*.lc.norm.tok.*).
- paper_bleu: what the authors' get_ende_bleu.sh computed for Table 2 (Moses tokenization, ##AT##
  compound splitting, multi-bleu.perl).
Tokenized BLEUs are scored like multi-bleu.perl: whitespace tokens, no smoothing.
"""

from __future__ import annotations

import re
from functools import lru_cache

import sacrebleu
from sacremoses import MosesPunctNormalizer, MosesTokenizer


def _check_lengths(hyps: list[str], refs: list[str]) -> None:
    if len(hyps) != len(refs):
        raise ValueError(f"{len(hyps)} hypotheses but {len(refs)} references")


def sacrebleu_scores(hyps: list[str], refs: list[str]) -> dict[str, float | str]:
    """Detokenized, cased BLEU and chrF with sacreBLEU's defaults (13a tokenization, exp smoothing)."""
    _check_lengths(hyps, refs)
    bleu, chrf = sacrebleu.BLEU(), sacrebleu.CHRF()
    return {"bleu": bleu.corpus_score(hyps, [refs]).score, "chrf": chrf.corpus_score(hyps, [refs]).score,
            "signature": str(bleu.get_signature()), "chrf_signature": str(chrf.get_signature())}


@lru_cache(maxsize=None)
def _normalizer(lang: str) -> MosesPunctNormalizer:
    # perl_parity: reproduce normalize-punctuation.perl's own quirks (e.g. French "d’" -> d ").
    return MosesPunctNormalizer(lang=lang, perl_parity=True)


@lru_cache(maxsize=None)
def _tokenizer(lang: str) -> MosesTokenizer:
    return MosesTokenizer(lang=lang)


def moses_tokenize_lc(lines: list[str], lang: str) -> list[str]:
    """Multi30k's scripts/task1-tokenize.sh: lowercase | normalize-punctuation -l L | tokenizer -l L.

    tokenizer.perl's defaults: XML-escaped (&quot; &apos; ...), no aggressive dash splitting. The
    "\\n" is what the perl script sees on each line: its rule moving a period past a closing quote
    (`."` -> `".`) needs a character after the quote, which at the end of a line is the newline.
    """
    norm, tok = _normalizer(lang), _tokenizer(lang)
    return [tok.tokenize(norm.normalize(line.rstrip("\n").lower() + "\n"), escape=True, return_str=True)
            for line in lines]


def _multi_bleu(hyps: list[str], refs: list[str]) -> float:
    """multi-bleu.perl: whitespace-split tokens, BLEU 0 when any n-gram order has no match."""
    _check_lengths(hyps, refs)
    return sacrebleu.BLEU(tokenize="none", smooth_method="none", force=True).corpus_score(hyps, [refs]).score


def tok_lc_bleu(hyps: list[str], tok_refs: list[str], lang: str) -> float:
    """Tokenized lowercased BLEU of detokenized hypotheses against Multi30k's tokenized references."""
    return _multi_bleu(moses_tokenize_lc(hyps, lang), tok_refs)


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
    return _multi_bleu(prep, [_split_compounds(tok.tokenize(r, escape=True, return_str=True)) for r in refs])
