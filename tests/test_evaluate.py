"""BLEU and chrF: sacreBLEU as the independent reference, hand-computed multi-bleu values, and the
Multi30k dataset's own tokenized files as the reference for our tokenization."""

from __future__ import annotations

import gzip
import math
import os
from pathlib import Path

import pytest
import sacrebleu

from transformer.config import ConfigError
from transformer.evaluate import (_split_compounds, bleu_metric, moses_language_warning, moses_tokenize_lc, paper_bleu,
                                  sacrebleu_scores, score_trees, tok_lc_bleu)
from transformer.trees import Tree, TreeError, parse_brackets

DATA = Path(os.environ.get("TRANSFORMER_DATA", Path(__file__).resolve().parents[2] / "shared" / "data"))
M30K = DATA / "multi30k"
needs_data = pytest.mark.skipif(not (M30K / "tok").is_dir(), reason=f"Multi30k not found under {DATA}")

HYPS = ["Ein Mann mit einem orangefarbenen Hut starrt etwas an.",
        "Ein Boston Terrier rennt über grünes Gras vor einem weißen Zaun.",
        "Ein Mädchen im Karateanzug zerbricht ein Brett mit einem Tritt."]
REFS = ["Ein Mann mit einem orangefarbenen Hut, der etwas anstarrt.",
        "Ein Boston Terrier läuft über saftig-grünes Gras vor einem weißen Zaun.",
        "Ein Mädchen in einem Karateanzug bricht ein Brett mit einem Tritt."]


def read(path: Path) -> list[str]:
    with gzip.open(path, "rt", encoding="utf-8") as f:
        return [line.rstrip("\n") for line in f]


def test_sacrebleu_scores_match_sacrebleu() -> None:
    s = sacrebleu_scores(HYPS, REFS)
    assert s["bleu"] == pytest.approx(sacrebleu.corpus_bleu(HYPS, [REFS]).score)
    assert s["chrf"] == pytest.approx(sacrebleu.corpus_chrf(HYPS, [REFS]).score)
    assert 0 < s["bleu"] < 100 and 0 < s["chrf"] < 100
    assert "nrefs:1|case:mixed" in s["signature"] and "tok:13a" in s["signature"]
    assert s["chrf_signature"].startswith("nrefs:1|case:mixed") and "nc:6" in s["chrf_signature"]
    same = sacrebleu_scores(REFS, REFS)
    assert same["bleu"] == pytest.approx(100.0) and same["chrf"] == pytest.approx(100.0)
    with pytest.raises(ConfigError, match="2 hypotheses but 3 references"):
        sacrebleu_scores(HYPS[:2], REFS)
    # sacreBLEU scored one string a character a line, and failed inside on no lines or an item that is no string
    for hyps, refs, message in (("abc", "abc", "hypotheses: a list of strings, not one string"),
                                ([], [], "no hypotheses to score"), ([None], ["a"], "holding NoneType None"),
                                (["a"], ("a", 1), "references: a list of strings, holding int 1")):
        with pytest.raises(ConfigError, match=message):
            sacrebleu_scores(hyps, refs)


def test_sacrebleu_tokenizes_by_the_target_language() -> None:
    """Chinese is written without spaces between words: 13a made each sentence one word, and a close
    translation scored 0. sacreBLEU's own tokenizer for the language is taken; 13a for the others."""
    refs = ["一只狗在雪地里奔跑。", "两个男人在街上踢足球。", "一个女孩在公园里骑自行车。"]
    hyps = ["一只狗在雪地上奔跑。", "两个男人在街道上踢足球。", "一个女孩在公园骑自行车。"]
    assert sacrebleu_scores(hyps, refs)["bleu"] < 1
    for lang in ("zh", "zho", "zh-CN", "ZH_tw"):
        scores = sacrebleu_scores(hyps, refs, lang)
        assert scores["bleu"] == pytest.approx(sacrebleu.BLEU(trg_lang="zh").corpus_score(hyps, [refs]).score)
        assert scores["bleu"] > 50
        assert "tok:zh" in scores["signature"]
    assert sacrebleu_scores(HYPS, REFS, "de") == sacrebleu_scores(HYPS, REFS)  # 13a, as before
    with pytest.raises(ConfigError, match=r"^lang: a language code such as 'de' \('' for sacreBLEU's 13a"):
        sacrebleu_scores(HYPS, REFS, None)  # an AttributeError in primary_language


def test_a_bleu_tokenizer_whose_packages_are_missing_is_one_line() -> None:
    try:
        import MeCab  # noqa: F401
        pytest.skip("MeCab is installed: sacreBLEU's Japanese tokenizer works")
    except ImportError:
        pass
    with pytest.raises(ConfigError, match=r"^BLEU of 'ja' text needs sacreBLEU's tokenizer for it, whose packages "
                                          r"are not installed: pip install 'sacrebleu\[ja\]'$"):
        bleu_metric("jpn")


def test_the_language_of_a_side_is_its_training_files(tmp_path) -> None:
    from transformer.config import DataConfig

    assert DataConfig(tgt_lang="de", train_tgt="mine/train.fr.gz").language("tgt") == "fr"
    assert DataConfig(tgt_lang="pt-BR", train_tgt="mine/target.txt").language("tgt") == "pt"
    assert DataConfig(src_lang="EN", train_src="").language("src") == "en"


def test_multi_bleu_hand_computed() -> None:
    # Tokens already lowercase and split: precisions 5/6, 3/5, 2/4, 1/3; equal length, so BP = 1.
    bleu = tok_lc_bleu(["The cat sat on the mat"], ["the cat sat on a mat"], "en")
    assert bleu == pytest.approx(100 * (5 / 6 * 3 / 5 * 2 / 4 * 1 / 3) ** 0.25)
    # Shorter hypothesis: BP = exp(1 - 6/5); precisions 4/5 ("the" clipped to its 1 use), 3/4, 2/3, 1/2.
    bleu = tok_lc_bleu(["the cat sat on the"], ["the cat sat on a mat"], "en")
    assert bleu == pytest.approx(100 * math.exp(1 - 6 / 5) * (4 / 5 * 3 / 4 * 2 / 3 * 1 / 2) ** 0.25)
    # multi-bleu.perl does not smooth: no matching 4-gram means BLEU 0 (sacreBLEU's default is > 0).
    assert tok_lc_bleu(["the cat sat on a mat"], ["the cat sits on a mat"], "en") == 0.0


def test_tokenization_steps() -> None:
    # lowercase, punctuation normalized (curly quotes -> ", then escaped), tokens split, no -a dashes.
    assert moses_tokenize_lc(["Er sagte: „Hallo, Baden-Württemberg.“"], "de") == [
        "er sagte : &quot; hallo , baden-württemberg &quot; ."]
    assert moses_tokenize_lc(["It's a dog's life."], "en") == ["it &apos;s a dog &apos;s life ."]


def test_a_language_moses_has_no_rules_for_is_warned_of() -> None:
    # a mistyped code is tokenized with Moses's defaults, which split German abbreviations: worth a warning
    assert moses_tokenize_lc(["ca. 5 Leute."], "de") == ["ca. 5 leute ."]
    assert moses_tokenize_lc(["ca. 5 Leute."], "dee") == ["ca . 5 leute ."]
    warning = moses_language_warning("dee")
    assert warning is not None and "'dee'" in warning and " de," in warning
    assert moses_language_warning("de") is None and moses_language_warning("fr") is None
    # Moses has abbreviations for Chinese, and splits none of its words: near-perfect outputs scored 49.6 against
    # sacreBLEU's zh 88.6, without a word
    for lang in ("zh", "ja", "zh-CN", "th", "lo", "km", "my", "yue", "lao", "khm", "mya", "jpn"):
        assert moses_language_warning(lang).startswith(f"warning: {lang!r} is written without spaces between words")


@needs_data
@pytest.mark.parametrize("split", ["test_2016_flickr", "val"])
@pytest.mark.parametrize("lang", ["de", "en", "fr"])
def test_tokenization_matches_multi30k_files(split: str, lang: str) -> None:
    """Every line, not just a high BLEU: val.fr holds the "d’" quirk, test2016 the `."` one."""
    raw = read(M30K / f"{split}.{lang}.gz")
    tok = read(M30K / "tok" / f"{split}.lc.norm.tok.{lang}.gz")
    assert len(raw) == len(tok) == {"val": 1014}.get(split, 1000)
    mine = moses_tokenize_lc(raw, lang)
    mismatches = [(i, a, b) for i, (a, b) in enumerate(zip(mine, tok)) if a != b]
    assert not mismatches, mismatches[:3]
    if split == "test_2016_flickr" and lang == "de":
        assert sum(len(t.split()) for t in tok) == 12_103  # Wu et al.'s reflen (benchmarks/results/published.json)
        assert tok_lc_bleu(raw, tok, lang) == pytest.approx(100.0)
        assert tok_lc_bleu(raw[1:] + raw[:1], tok, lang) < 5  # misaligned lines score near zero


def test_paper_bleu_splits_compounds() -> None:
    assert _split_compounds("a-b-c x - y") == "a ##AT##-##AT## b-c x - y"  # perl s///g never overlaps
    # perl's \S: any character but a space beside the hyphen, an escaped quote or a period as well as a letter
    assert _split_compounds("3.-4 &quot;-Zeit") == "3. ##AT##-##AT## 4 &quot; ##AT##-##AT## Zeit"
    hyp, ref = ["Er fährt nach Baden-Württemberg."], ["Er fährt nach Baden Württemberg."]
    # hyp tokens: Er fährt nach Baden ##AT##-##AT## Württemberg . (7) vs ref (6), so BP = 1;
    # precisions 6/7, 4/6, 2/5, 1/4. Without the split "Baden-Württemberg" would be one token.
    assert paper_bleu(hyp, ref, "de") == pytest.approx(100 * (6 / 7 * 4 / 6 * 2 / 5 * 1 / 4) ** 0.25)
    assert paper_bleu(hyp, hyp, "de") == pytest.approx(100.0)
    # Cased: the same sentence lowercased loses the capitalised tokens' matches.
    assert paper_bleu(REFS, REFS, "de") == pytest.approx(100.0)
    assert paper_bleu([h.lower() for h in REFS], REFS, "de") < 50
    # tokenizer.perl's escaping (&quot; &apos; &amp;) on both sides alike: a quoted sentence scores 100 against itself
    quoted = ['Er sagte: "Das ist Baden-Württembergs Sache & nicht unsere."']
    assert paper_bleu(quoted, quoted, "de") == pytest.approx(100.0)


# --- parse trees (§6.3) ------------------------------------------------------------------------------

def tree(text: str) -> Tree:
    (t,) = parse_brackets(text)
    return t


def f1(gold: str, test: str) -> tuple[float, float, float]:
    s = score_trees([tree(gold)], [tree(test)])
    return round(s.precision, 2), round(s.recall, 2), round(s.f1, 2)


# EVALB (COLLINS.prm) by hand: brackets exclude POS nodes, punctuation is removed by its gold tag.
def test_score_identical():
    t = "(S (NP (DT The) (NN dog)) (VP (VBD barked)) (. .))"
    assert f1(t, t) == (100.0, 100.0, 100.0)


def test_score_punctuation_attachment_does_not_count():
    gold = "(S (NP (DT The) (NN dog)) (VP (VBD barked)) (. .))"  # S(0,3) NP(0,2) VP(2,3)
    test = "(S (NP (XX The) (XX dog)) (VP (XX barked) (XX .)))"  # the period inside VP: VP(2,3) all the same
    assert f1(gold, test) == (100.0, 100.0, 100.0)


@pytest.mark.parametrize("tag", [",", ":", "``", "''", "."])
def test_score_removes_each_punctuation_tag_of_collins_prm(tag):
    """Each of COLLINS.prm's five DELETE_LABEL tags is removed before spans are counted: a word of that tag
    at the end of the gold NP and at the start of the test VP leaves the same brackets; one tag missing
    from the set, and its word would shift NP's end and VP's start."""
    gold = f"(S (NP (DT The) (NN dog) ({tag} w)) (VP (VBD barked)))"
    test = "(S (NP (XX The) (XX dog)) (VP (XX w) (XX barked)))"
    assert f1(gold, test) == (100.0, 100.0, 100.0)
    assert f1(gold.replace(f"({tag} w)", "(NN w)"), test) == (33.33, 33.33, 33.33)  # a word: the spans differ


def test_score_counts_no_unlabelled_or_top_bracket():
    """The treebank's unlabelled outermost bracket, kept where it holds more than one constituent, and a TOP
    node are no constituents of the parse: neither is counted, so the two trees score alike."""
    gold = "( (S (NP (A a) (B b)) (VP (C c))) (D d))"
    assert f1(gold, "(TOP (S (NP (XX a) (XX b)) (VP (XX c))) (XX d))") == (100.0, 100.0, 100.0)


def test_score_unary_chain_and_label_mismatch():
    assert f1("(S (VP (VB Go)))", "(S (VP (XX Go)))") == (100.0, 100.0, 100.0)
    assert f1("(S (VP (VB Go)))", "(S (NP (XX Go)))") == (50.0, 50.0, 50.0)  # S matches, NP != VP
    assert f1("(S (VP (VB Go)))", "(S (XX Go))") == (100.0, 50.0, 66.67)  # the unary VP is missing


def test_score_counts_no_word_for_an_empty_element():
    """A trace (-NONE-) is no word of the sentence: the constituent that holds only it spans nothing and is no
    bracket, and the words after it keep their places (the treebank's own text, read without normalising; the
    test tree takes the gold tags)."""
    assert f1("(S (NP (-NONE- *)) (VP (VB Go)))", "(S (NP (XX *)) (VP (XX Go)))") == (100.0, 100.0, 100.0)
    assert f1("(S (NP (-NONE- *)) (VP (VB Go)))", "(S (NP (XX *) (XX Go)))") == (50.0, 50.0, 50.0)  # S alone


def test_score_advp_equals_prt():
    assert f1("(S (VP (VB give) (PRT (RP up))))", "(S (VP (XX give) (ADVP (XX up))))") == (100.0, 100.0, 100.0)


def test_score_crossing_brackets():
    gold = "(S (NP (A a) (B b)) (VP (C c) (D d)))"  # S(0,4) NP(0,2) VP(2,4)
    test = "(S (X (A a) (B b) (C c)) (D d))"  # S(0,4) X(0,3): crosses VP
    assert f1(gold, test) == (50.0, 33.33, 40.0)


def test_score_duplicate_brackets_match_one_to_one_and_corpus_is_micro_averaged():
    assert f1("(S (NP (NP (A a))))", "(S (NP (A a)))") == (100.0, 66.67, 80.0)
    s = score_trees([tree("(S (A a) (B b))"), tree("(S (NP (A a) (B b)) (C c))")],
                    [tree("(S (A a) (B b))"), tree("(S (A a) (VP (B b) (C c)))")])
    assert (s.matched, s.gold, s.test) == (2, 3, 3)
    # a unary chain in both trees: each of its brackets matches its own copy, not one of them both
    assert f1("(S (NP (NP (A a))))", "(S (NP (NP (XX a))))") == (100.0, 100.0, 100.0)


def test_score_refuses_different_words():
    with pytest.raises(TreeError, match="words differ"):
        score_trees([tree("(S (A a))")], [tree("(S (A b))")])


def test_more_hypotheses_than_references_are_refused_by_name():
    """A translation file one line longer than its references (a stray line) is an error that counts both, in
    each of the scores; never a BLEU of the first lines, nor sacreBLEU's own message."""
    for score in (sacrebleu_scores, lambda h, r: tok_lc_bleu(h, r, "de"), lambda h, r: paper_bleu(h, r, "de")):
        with pytest.raises(ConfigError, match=r"^4 hypotheses but 3 references$"):
            score(HYPS + ["Ein Hund."], REFS)


def test_pretokenized_hypotheses_are_scored_as_they_are():
    """Hypotheses already in the references' tokenized, XML-escaped form (a model trained on the tok files) are
    not tokenized again: a second pass would escape the escapes (&quot; -> &amp;quot;) and split them."""
    refs = moses_tokenize_lc(['Ein Mann sagt "Hallo" zu einem Kind.', "Zwei Hunde, die spielen."], "de")
    assert "&quot;" in refs[0]
    assert tok_lc_bleu(refs, refs, "de", pretokenized=True) == pytest.approx(100.0)
    assert tok_lc_bleu(refs, refs, "de") < 99.0  # tokenized once more, they are no longer the references


def test_score_a_constituent_of_punctuation_alone_is_no_bracket():
    """EVALB removes the punctuation words first; a constituent that held nothing else then spans no word and
    is no bracket: the gold tree's (PRN (, ,)) is not one the parse must find."""
    gold = "(S (NP (DT The) (NN dog)) (PRN (, ,)) (VP (VBD barked)))"
    test = "(S (NP (XX The) (XX dog)) (XX ,) (VP (XX barked)))"
    assert f1(gold, test) == (100.0, 100.0, 100.0)
    assert score_trees([tree(gold)], [tree(test)]).gold == 3  # S, NP, VP
