"""Parsing as translation (§6.3): treebank reading, linearization, repair, EVALB-style scoring."""

import json

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.conftest import DATA
from transformer.data import read_lines
from transformer.errors import UserError
from transformer.cli import main
from transformer.config import ModelConfig
from transformer.search import beam_search
from transformer.model import Transformer
from transformer.tokenizer import EOS_ID
from transformer.prepare import PTB_SPLITS, write_ptb_splits
from transformer.trees import (MAX_DEPTH, Tree, TreeConstraint, TreeError, delinearize, linearize, normalize,
                               parse_brackets, ptb_escape, read_normalized, read_trees, tree_symbols, with_tags)

PTB = DATA / "ptb-sample"


def tree(text: str) -> Tree:
    (t,) = parse_brackets(text)
    return t


def test_normalisation_removes_traces_function_tags_and_the_outer_bracket():
    raw = tree("( (S (NP-SBJ-1 (-NONE- *T*-1)) (NP-SBJ=2 (DT The) (NN dog)) (VP (VBD barked) "
               "(NP (-NONE- *)) (-LRB- -LRB-) (ADVP-TMP (RB now)) (-RRB- -RRB-)) (. .)) )")
    assert str(normalize(raw)) == ("(S (NP (DT The) (NN dog)) (VP (VBD barked) (-LRB- -LRB-) (ADVP (RB now)) "
                                   "(-RRB- -RRB-)) (. .))")
    assert normalize(tree("(X (-NONE- *))")) is None
    # a gapping index alone ("=" without a function tag before it) is stripped too
    assert str(normalize(tree("(S (NP=2 (DT The) (NN dog)) (VP=3 (VBD barked)))"))) == \
        "(S (NP (DT The) (NN dog)) (VP (VBD barked)))"


def test_a_word_without_its_part_of_speech_node_is_refused_naming_the_tree(tmp_path, capsys):
    """Scoring reads each word's tag: normalisation dropped such a word without a word, so evaluate-parse
    scored two trees short of it as equal (and evaluate died on it, exit 70)."""
    with pytest.raises(TreeError, match=r"^the word 'barked' stands in \(S \.\.\.\) without a part-of-speech node"):
        normalize(tree("(S (NP (DT The) (NN dog)) barked)"))
    with pytest.raises(TreeError, match=r"^\(NN x y\) holds 2 words without a part-of-speech node each: a treebank"):
        normalize(tree("(S (VP (VBZ rains) (NP (NN x y))))"))  # "the word 'x' stands in (NN ...) without a tag"
    with pytest.raises(TreeError, match=r"^\(NN\) holds no word: a treebank tree tags every word"):  # it was dropped
        normalize(tree("(S (NP (NN)) (VP (VBD ran)))"))  # with its NP, the tree scored a bracket short
    gold = tmp_path / "g.mrg"
    gold.write_text("(S (NP (DT A) (NN cat))\n   (VP (VBD sat)))\n\n(S (NP (DT The) (NN dog)) barked)\n")
    assert main(["evaluate-parse", "--gold", str(gold), "--test", str(gold)]) == 1
    # and where it is: the line a tree starts on (other errors of a file named it already)
    assert capsys.readouterr().err.startswith(f"error: --gold {gold}: tree 2 (line 4): the word 'barked' stands in "
                                              "(S ...)")
    assert [t.line for t in parse_brackets(gold.read_text())] == [1, 4]


def test_linearised_trees_read_as_bracketed_ones_are_named(tmp_path, capsys):
    """A .wlin file (the training targets; `translate`'s output on a parsing run) given where bracketed trees go:
    `evaluate --ref` said so, `evaluate-parse` and `linearize` only "word 'S' outside any bracket"."""
    gold, wlin = tmp_path / "g.mrg", tmp_path / "t.wlin"
    gold.write_text("(S (NP (DT The) (NN dog)) (VP (VBD barked)))\n")
    wlin.write_text("(S (NP The dog )NP (VP barked )VP )S\n")
    hint = "(linearised trees, closed as \")NP\": give them bracketed as the treebank writes them"
    for argv in (["evaluate-parse", "--gold", str(gold), "--test", str(wlin)],
                 ["evaluate-parse", "--gold", str(wlin), "--test", str(gold)], ["linearize", str(wlin), "--out",
                                                                                str(tmp_path / "x")]):
        assert main(argv) == 1
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and hint in err and str(wlin) in err, err
    assert main(["evaluate-parse", "--gold", str(gold), "--test", str(gold)]) == 0  # bracketed: no hint needed
    assert "linearised" not in capsys.readouterr().err


def test_evaluate_reads_gold_trees_as_evaluate_parse_does(tiny_parse_run, tmp_path, capsys, monkeypatch):
    """`evaluate` of a parsing run and `evaluate-parse` score one parse against treebank gold (function tags,
    a trace, the outer bracket) alike: both normalise the gold. evaluate compared NP-SBJ with NP (F1 50
    for a perfect parse) and refused a gold tree with a trace for its words ("*")."""
    import transformer.cli as cli

    gold_text = ["( (S (NP-SBJ (DT The) (NN dog)) (VP (VBD barked) (ADVP-TMP (RB today))) (. .)) )",
                 "( (S (NP-SBJ (-NONE- *)) (VP (VBD Run)) (. !)) )"]
    gold, test, src = tmp_path / "gold.mrg", tmp_path / "test.txt", tmp_path / "src.txt"
    gold.write_text("".join(line + "\n" for line in gold_text))
    parses = [normalize(tree(line)) for line in gold_text]  # a perfect parser
    test.write_text("".join(str(t) + "\n" for t in parses))
    src.write_text("The dog barked today .\nRun !\n")
    monkeypatch.setattr(cli, "_parse_lines", lambda translator, lines, request: parses)
    assert main(["evaluate", str(tiny_parse_run), "--src", str(src), "--ref", str(gold)]) == 0
    out = capsys.readouterr().out
    assert main(["evaluate-parse", "--gold", str(gold), "--test", str(test), "--json"]) == 0
    scores = json.loads(capsys.readouterr().out)
    assert scores["f1"] == 100.0 and f"F1 = 100.00  precision 100.00  recall 100.00  ({scores['matched']} of " in out


def test_linearization_is_vinyals_et_al():
    t = tree("(S (NP (DT The) (NN dog)) (VP (VBD barked)) (. .))")
    assert linearize(t) == ["(S", "(NP", "XX", "XX", ")NP", "(VP", "XX", ")VP", "XX", ")S"]


def test_tree_symbols_are_the_brackets_and_the_placeholder():
    """What the parsing vocabulary keeps whole (train_vocabulary): every "(L", ")L" and XX, no word."""
    lines = ["(S (NP XX XX )NP (VP XX )VP XX )S", "(S (-LRB- XX )-LRB- XX )S"]
    assert tree_symbols(lines) == {"(S", ")S", "(NP", ")NP", "(VP", ")VP", "XX", "(-LRB-", ")-LRB-"}


@pytest.mark.skipif(not PTB.is_dir(), reason="ptb-sample not found (set TRANSFORMER_DATA)")
def test_linearize_then_delinearize_is_the_identity_on_every_tree_of_the_sample():
    n = 0
    for path in sorted(PTB.glob("wsj_*.mrg")):
        for raw in read_trees(path):
            t = normalize(raw)
            for words in (False, True):  # XX leaves (Vinyals et al.'s) and the words themselves
                back, well_formed = delinearize(linearize(t, words), t.words())
                assert well_formed, (path.name, str(t))
                assert str(with_tags(back, t.tags())) == str(t), (path.name, str(t))
            n += 1
    assert n > 3500


@settings(max_examples=300, deadline=None)
@given(st.lists(st.sampled_from(["(S", "(NP", "(VP", ")NP", ")VP", ")S", ")", "XX", "XX", "junk", "("]),
                max_size=30),
       st.lists(st.sampled_from(["a", "b", "c", "."]), min_size=1, max_size=8))
def test_repair_always_gives_a_well_formed_tree_with_the_input_words(tokens, words):
    t, _ = delinearize(tokens, words)
    assert t.words() == words
    assert not t.is_preterminal

    def check(node):
        assert node.is_preterminal or (node.children and all(isinstance(c, Tree) for c in node.children))
        for c in node.children:
            if isinstance(c, Tree):
                check(c)
    check(t)
    assert str(tree(str(t))) == str(t)  # prints as a bracketing that reads back the same


def test_well_formed_flag():
    words = ["a", "b"]
    assert delinearize(["(S", "XX", "XX", ")S"], words) == (tree("(S (XX a) (XX b))"), True)
    assert not delinearize(["(S", "XX", ")NP"], words)[1]  # label mismatch and a missing XX
    assert not delinearize(["(S", "XX", "XX", ")NP"], words)[1]  # the label mismatch alone
    assert not delinearize(["(S", "XX", "XX"], words)[1]  # never closed
    assert not delinearize(["(S", "XX", ")S", "(S", "XX", ")S"], words)[1]  # two roots
    assert not delinearize(["(S", "(NP", ")NP", "XX", "XX", ")S"], words)[1]  # an empty constituent
    assert not delinearize(["(S", "XX", "XX", "XX", ")S"], words)[1]  # an XX too many
    assert delinearize(["(S", "a", "b", ")S"], words) == (tree("(S (XX a) (XX b))"), True)  # words as leaves
    assert delinearize(["(S", "a", "XX", ")S"], words)[1]
    # the leaves matched with the words as the model writes them (an unknown character as \u2047), not as given
    shape = ["(S", "(NP", "Zo\u2047", ")NP", "(VP", "\u2047", ")VP", ")S"]
    assert delinearize(shape, ["Zo\u00eb", "\u00f1"], written=[["Zo\u2047"], ["\u2047"]]) == (
        tree("(S (NP (XX Zo\u00eb)) (VP (XX \u00f1)))"), True)
    assert not delinearize(shape, ["Zo\u00eb", "\u00f1"])[1]
    # a word the model writes as two ("don\u00b4t": normalised to "don \u0301t"): its leaves merge into the first,
    # and a constituent left empty goes
    split = ["(S", "(NP", "I", ")NP", "(VP", "don", "(ADVP", "\u2047t", ")ADVP", "know", ")VP", ")S"]
    assert delinearize(split, ["I", "don\u00b4t", "know"], written=[["I"], ["don", "\u2047t"], ["know"]]) == (
        tree("(S (NP (XX I)) (VP (XX don\u00b4t) (XX know)))"), True)
    assert delinearize(["(S", "a", "c", ")S"], words) == (tree("(S (XX a) (XX b))"), False)  # not the input's


def test_a_skipped_or_repeated_word_costs_only_its_own_brackets():
    """Word leaves are aligned with the input: the words after a slip keep their constituents."""
    words = "a b c d e".split()
    skipped = "(S (NP a b )NP (VP d e )VP )S".split()  # c left out: it joins b's constituent
    assert delinearize(skipped, words) == (tree("(S (NP (XX a) (XX b) (XX c)) (VP (XX d) (XX e)))"), False)
    repeated = "(S (NP a b b )NP (VP c d e )VP )S".split()  # the second b is dropped
    assert delinearize(repeated, words) == (tree("(S (NP (XX a) (XX b)) (VP (XX c) (XX d) (XX e)))"), False)
    first = "(S (NP b c )NP (VP d e )VP )S".split()  # a word missing at the start joins the next one's
    assert delinearize(first, words)[0] == tree("(S (NP (XX a) (XX b) (XX c)) (VP (XX d) (XX e)))")
    # with XX leaves nothing can be aligned: words in order, the rest after the last leaf
    assert delinearize("(S (NP XX XX )NP )S".split(), ["a", "b", "c"])[0] == tree("(S (NP (XX a) (XX b) (XX c)))")


def test_linearize_with_words():
    t = tree("(S (NP (DT The) (NN dog)) (VP (VBD barked)) (. .))")
    assert " ".join(linearize(t)) == "(S (NP XX XX )NP (VP XX )VP XX )S"
    assert " ".join(linearize(t, words=True)) == "(S (NP The dog )NP (VP barked )VP . )S"
    assert tree_symbols([" ".join(linearize(t, words=True))]) == {"(S", ")S", "(NP", ")NP", "(VP", ")VP"}


def test_unbalanced_text_is_refused_with_its_place():
    with pytest.raises(TreeError, match="never closed"):
        parse_brackets("(S (A a)", "x.mrg")
    with pytest.raises(TreeError, match=r"x.mrg: tree 1 \(line 1\)"):
        parse_brackets("(S (A a)) )", "x.mrg")


def test_a_tree_nested_past_any_parse_is_refused_in_one_line(tmp_path, capsys):
    """Trees 600 brackets deep ended evaluate-parse in a RecursionError (an internal error); 300 open at once
    are scored, one more is refused where it is read, naming the file, tree and line."""
    from transformer.cli import main

    deep = {n: tmp_path / f"d{n}.mrg" for n in (299, 300, 600)}  # S brackets, and NN
    for n, path in deep.items():
        path.write_text("(X y)\n" + "(S " * n + "(NN x)" + ")" * n + "\n")
    assert main(["evaluate-parse", "--gold", str(deep[299]), "--test", str(deep[299])]) == 0
    assert "brackets: 299 matched" in capsys.readouterr().out
    for n in (300, 600):
        assert main(["evaluate-parse", "--gold", str(deep[n]), "--test", str(deep[299])]) == 1
        assert capsys.readouterr().err == (f"error: --gold {deep[n]}: tree 2 (line 2): more than 300 brackets open at "
                                           "once; no parse tree nests so deep\n")


def test_a_bracket_too_many_is_placed_in_its_own_tree_and_line(tmp_path, capsys):
    """The ')' too many closes line 1's tree early and the rest reads as trees of their own: the error
    is still tree 1, line 1 (it said tree 4). An empty gold or test file is an error, not F1 0."""
    good = "(S (NP (DT The) (NN dog)) (VP (VBD barked)) (. .))"
    extra = "(S (NP (DT The) (NN dog))) (VP (VBD barked)) (. .))"
    with pytest.raises(TreeError, match=r"^t2.txt: tree 1 \(line 1\): '\)' without an open bracket$"):
        parse_brackets(f"{extra}\n{good}\n", "t2.txt")
    with pytest.raises(TreeError, match=r"^t2.txt: tree 2 \(line 2\): '\)'"):
        parse_brackets(f"{good}\n{extra}\n{good}\n", "t2.txt")
    mrg = "( (S (NP (DT The) (NN dog))\n    (VP (VBD barked)) ) )\n( (S (NP (NN dog))) ))\n"  # a tree on two lines
    with pytest.raises(TreeError, match=r"^x.mrg: tree 2 \(line 3\): '\)'"):
        parse_brackets(mrg, "x.mrg")
    with pytest.raises(TreeError, match=r"^x.mrg: tree 2 \(from line 2\): 1 bracket\(s\) never closed$"):
        parse_brackets(f"{good}\n(S (NP (DT The) (NN dog))\n(S (NP (DT A) (NN cat)))\n", "x.mrg")
    with pytest.raises(TreeError, match=r"^x.mrg: tree 2 \(line 2\): word 'x' outside any bracket$"):
        parse_brackets(f"{good}\nx {good}\n", "x.mrg")
    (tmp_path / "gold.txt").write_text(f"{good}\n")
    (tmp_path / "empty.txt").write_text("\n")
    assert main(["evaluate-parse", "--gold", str(tmp_path / "gold.txt"), "--test", str(tmp_path / "gold.txt")]) == 0
    for gold, test in (("empty.txt", "empty.txt"), ("gold.txt", "empty.txt")):
        capsys.readouterr()
        assert main(["evaluate-parse", "--gold", str(tmp_path / gold), "--test", str(tmp_path / test)]) == 1
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and f"{tmp_path / 'empty.txt'}: no trees" in err, err
    (tmp_path / "holes.txt").write_text(f"{good}\n()\n(S (-NONE- *T*))\n")  # scored as EVALB would, but said
    assert main(["evaluate-parse", "--gold", str(tmp_path / "holes.txt"), "--test", str(tmp_path / "holes.txt")]) == 0
    assert capsys.readouterr().out.rstrip().endswith("; 2 skipped, without a word once traces are removed")


def test_bracket_words_are_written_as_the_treebank_writes_them():
    """`parse` on "The ( dog ) barked ." wrote (XX () and (XX )), which no tree reader reads back: a word
    that is or holds a bracket is written -LRB- -RRB- -LCB- -RCB-, as the treebank (and the training data)."""
    assert [ptb_escape(w) for w in ["(", ")", "{", "}", "dog", "(s)", "-LRB-"]] == [
        "-LRB-", "-RRB-", "-LCB-", "-RCB-", "dog", "-LRB-s-RRB-", "-LRB-"]
    assert str(Tree("S", [Tree("XX", ["("]), Tree("XX", ["a)"]), Tree("XX", ["}"])])) == \
        "(S (XX -LRB-) (XX a-RRB-) (XX -RCB-))"
    words = "The ( dog ) barked .".split()
    escaped = ["The", "-LRB-", "dog", "-RRB-", "barked", "."]
    # the model writes the treebank's tokens for its input's brackets: a well-formed tree of that input
    t, well_formed = delinearize("(S (NP The -LRB- dog -RRB- )NP (VP barked )VP . )S".split(), words)
    assert well_formed and str(t) == "(S (NP (XX The) (XX -LRB-) (XX dog) (XX -RRB-)) (VP (XX barked)) (XX .))"
    # a model that copied the bare brackets: repaired, and still a tree that reads back with every word
    for tokens in ("(S (NP The ( dog ) )NP (VP barked )VP . )S", "", "(S The ) ( )S"):
        t, _ = delinearize(tokens.split(), words)
        assert t.words() == escaped and tree(str(t)) == t, (tokens, str(t))


@pytest.mark.skipif(not PTB.is_dir(), reason="ptb-sample not found (set TRANSFORMER_DATA)")
def test_splits_and_evaluate_parse_command(tmp_path, capsys):
    counts = write_ptb_splits(PTB, tmp_path)
    assert set(counts) == set(PTB_SPLITS) and counts["train"] > 3000 and min(counts.values()) > 100
    words = (tmp_path / "test.words").read_text().splitlines()
    lin = (tmp_path / "test.lin").read_text().splitlines()
    wlin = (tmp_path / "test.wlin").read_text().splitlines()
    assert len(words) == len(lin) == len(wlin) == counts["test"]
    assert [w for w in wlin[0].split() if w[0] not in "()"] == words[0].split()
    # a "parse" that flattens every tree: words under S only
    flat = tmp_path / "flat.txt"
    flat.write_text("".join(str(delinearize([], w.split())[0]) + "\n" for w in words))
    assert main(["evaluate-parse", "--gold", str(tmp_path / "test.gold"), "--test", str(flat), "--json"]) == 0
    import json
    scores = json.loads(capsys.readouterr().out)
    assert scores["sentences"] == counts["test"] and 0 < scores["f1"] < 30 and scores["precision"] > 80
    assert main(["evaluate-parse", "--gold", str(tmp_path / "test.gold"), "--test",
                 str(tmp_path / "test.gold")]) == 0
    assert "F1        = 100.00" in capsys.readouterr().out


# --------------------------------------------------------------------------------- constrained decoding
class PieceVocabulary:
    """A sentencepiece-like vocabulary for tests: brackets and XX whole, a word of more than five
    letters split in two pieces ("\u2581barke", "d"), as BPE splits rare words."""

    def __init__(self, symbols, words):
        self.pieces = ["<pad>", "</s>", "<unk>", *sorted({"\u2581" + s for s in symbols})]
        for w in sorted(set(words)):
            for p in self.split(w):
                if p not in self.pieces:
                    self.pieces.append(p)
        self.id = {p: i for i, p in enumerate(self.pieces)}

    @staticmethod
    def split(word):
        whole = len(word) <= 5 or word[0] in "()"
        return ["\u2581" + word] if whole else ["\u2581" + word[:5], word[5:]]

    def encode(self, tokens):
        return [self.id[p] for t in tokens for p in self.split(t)]

    def decode(self, ids):
        return "".join(self.pieces[i] for i in ids).replace("\u2581", " ").split()


def walk(constraint, ids):
    """Feeds ``ids`` to a constraint (one row); asserts each was allowed, then that EOS is."""
    for token in ids:
        assert constraint.allowed()[0, token], constraint.states[0]
        constraint.advance(torch.tensor([0]), torch.tensor([token]))
    return bool(constraint.allowed()[0, EOS_ID])


@pytest.mark.skipif(not PTB.is_dir(), reason="ptb-sample not found (set TRANSFORMER_DATA)")
def test_the_tree_constraint_allows_every_tree_of_the_sample():
    """Never forbids a correct tree, with words or with XX leaves, multi-piece words included."""
    trees = [t for path in sorted(PTB.glob("wsj_*.mrg")) for raw in read_trees(path) if (t := normalize(raw))]
    vocab = PieceVocabulary(tree_symbols(" ".join(linearize(t)) for t in trees), [w for t in trees for w in t.words()])
    constraint = TreeConstraint(vocab.pieces)
    for t in trees[::5]:
        src = torch.tensor([vocab.encode(t.words()) + [EOS_ID]])
        for words in (True, False):
            constraint.begin(src, beam=1, max_len=torch.tensor([1000]))
            assert walk(constraint, vocab.encode(linearize(t, words))), str(t)


def test_the_tree_constraint_refuses_what_is_not_a_tree_of_the_input():
    vocab = PieceVocabulary(["(S", ")S", "(NP", ")NP", "XX"], ["dogs", "barked"])
    constraint = TreeConstraint(vocab.pieces)
    src = torch.tensor([vocab.encode(["dogs", "barked"]) + [EOS_ID]])
    ok = ["(S", "(NP", "dogs", ")NP", "barked", ")S"]
    for bad in (["(S", "(NP", "dogs", ")S"],  # closing bracket of another label
                ["(S", "(NP", ")NP"],  # empty constituent
                ["(S", "barked"],  # a word out of order
                ["dogs"],  # a word outside any constituent
                ["(S", "dogs", ")S"],  # the root closed before the last word
                ["(S", "(NP", "(NP", "(NP", "(NP", "(NP", "(NP"]):  # 7 opening brackets in a row
        constraint.begin(src, beam=1, max_len=torch.tensor([1000]))
        with pytest.raises(AssertionError):
            walk(constraint, vocab.encode(bad))
    constraint.begin(src, beam=1, max_len=torch.tensor([1000]))
    assert walk(constraint, vocab.encode(ok))
    constraint.begin(src, beam=1, max_len=torch.tensor([1000]))  # inside "barked" (two pieces) only its second piece may follow
    walk(constraint, vocab.encode(["(S", "dogs"]) + vocab.encode(["barked"])[:1])
    assert constraint.allowed()[0].nonzero().flatten().tolist() == vocab.encode(["barked"])[1:]
    constraint.begin(src, beam=1, max_len=torch.tensor([1000]))
    assert not walk(constraint, vocab.encode(["(S", "dogs", "barked"]))  # EOS only once the root is closed


def test_the_tree_constraint_opens_a_bracket_exactly_while_the_tree_still_fits_the_limit():
    """An opening bracket is allowed while the words left, the brackets to close and EOS still fit the output
    limit, up to its last token: the smallest tree of "dogs barked" (three pieces) is 6 tokens with EOS, so a
    limit of 6 takes it and 5 none; after "(S", another bracket needs 8."""
    vocab = PieceVocabulary(["(S", ")S", "(NP", ")NP", "XX"], ["dogs", "barked"])
    constraint = TreeConstraint(vocab.pieces)
    source = vocab.encode(["dogs", "barked"]) + [EOS_ID]
    assert constraint.refuses(source, [], 6) is None
    assert constraint.refuses(source, [], 5) == "no tree of the input fits the length limit"
    assert constraint.refuses(source, vocab.encode(["(S", "(NP"]), 8) is None
    assert constraint.refuses(source, vocab.encode(["(S", "(NP"]), 7).startswith("its piece 2, '(NP', cannot")


@pytest.mark.parametrize("seed", range(3))
def test_constrained_beam_search_writes_well_formed_trees_of_the_input_even_untrained(seed):
    """An untrained model wants anything; under the constraint every output is still a tree with the
    input's words, that needs no repair, even with a length limit that leaves few brackets."""
    words = ["the", "old", "dogs", "barked", "loudly", "at", "strangers", "."]
    vocab = PieceVocabulary(["(S", ")S", "(NP", ")NP", "(VP", ")VP", "(PP", ")PP", "XX"], words)
    torch.manual_seed(seed)
    model = Transformer(ModelConfig(n_enc_layers=1, n_dec_layers=1, d_model=32, d_ff=64, n_heads=4, p_drop=0.0),
                        len(vocab.pieces)).eval()
    sentences = [words[: 2 + (seed + k) % 7] for k in range(6)]
    src = torch.zeros(len(sentences), max(len(vocab.encode(w)) for w in sentences) + 1, dtype=torch.long)
    for row, w in enumerate(sentences):
        ids = vocab.encode(w) + [EOS_ID]
        src[row, : len(ids)] = torch.tensor(ids)
    outputs = beam_search(model, src, beam_size=4, alpha=0.3, max_len_offset=12,
                          constraint=TreeConstraint(vocab.pieces))
    for w, out in zip(sentences, outputs):
        tree, well_formed = delinearize(vocab.decode(out), w)
        assert well_formed and tree.words() == w, (w, vocab.decode(out))


@pytest.mark.slow
@pytest.mark.skipif(not PTB.is_dir(), reason="ptb-sample not found (set TRANSFORMER_DATA)")
def test_parse_and_evaluate_commands_on_a_briefly_trained_parsing_run(tmp_path, capsys):
    """The parsing recipe, shrunk: every output of `transformer parse` is a tree of its input's words,
    constrained or not, and `transformer evaluate` on the run reports F1."""
    write_ptb_splits(PTB, tmp_path)
    data = {f"data.{split}_{side}": f'"{tmp_path / f"{name}.{suffix}"}"'
            for split, name in (("train", "train"), ("valid", "valid"))
            for side, suffix in (("src", "words"), ("tgt", "wlin"))}
    sets = [f"{k}={v}" for k, v in data.items()] + [
        f'data.test_src="{tmp_path / "test.words"}"', f'data.test_tgt="{tmp_path / "test.gold"}"',
        "data.vocab_size=1500", "model.n_enc_layers=1", "model.n_dec_layers=1", "model.d_model=32", "model.d_ff=64",
        "train.max_steps=20", "train.max_minutes=0", "train.save_every=10", "train.eval_every=10", "train.log_every=5",
        "train.threads=1"]
    run = tmp_path / "run"
    assert main(["train", "configs/ptb_sample_parse.toml", "--out", str(run), "--quiet",
                 *[a for s in sets for a in ("--set", s)]]) == 0
    sentences = (tmp_path / "test.words").read_text().splitlines()[:6]
    (tmp_path / "in.txt").write_text("".join(s + "\n" for s in sentences))
    for extra in ([], ["--unconstrained"]):
        capsys.readouterr()
        assert main(["parse", str(run), "--input", str(tmp_path / "in.txt"), "--beam", "4", *extra]) == 0
        trees = [tree(line) for line in capsys.readouterr().out.splitlines()]
        assert [t.words() for t in trees] == [s.split() for s in sentences]
    gold = tmp_path / "gold6.txt"
    gold.write_text("".join(line + "\n" for line in (tmp_path / "test.gold").read_text().splitlines()[:6]))
    assert main(["evaluate", str(run), "--beam", "2", "--src", str(tmp_path / "in.txt"), "--ref", str(gold)]) == 0
    assert "F1 = " in capsys.readouterr().out


def test_a_parsing_run_reads_bracket_words_as_the_treebank_writes_them(tiny_parse_run, tmp_path, capsys):
    """`parse` of "The ( dog ) barked ." gives the model the pieces of "-LRB-" and "-RRB-", as it was trained
    (the treebank's words), not of bare brackets; the tree it writes reads back with those words. The parse
    evaluation names the files when a tree's words differ."""
    from transformer.request import CLI, DecodeRequest
    from transformer.translator import Translator

    translator = Translator(tiny_parse_run, log=lambda m: None)
    raw, escaped = "The ( dog ) barked .", "The -LRB- dog -RRB- barked ."
    sources = translator._checked(DecodeRequest(), [raw, escaped], CLI)[1][0]
    assert sources[0] == sources[1]
    src = tmp_path / "in.txt"
    src.write_text(raw + "\n")
    assert main(["parse", str(tiny_parse_run), "--input", str(src), "--output", str(tmp_path / "out.txt")]) == 0
    (tree,) = parse_brackets((tmp_path / "out.txt").read_text())
    assert tree.words() == escaped.split()
    gold = tmp_path / "gold.txt"
    gold.write_text("(S (NP (DT A) (NN cat)) (VP (VBD sat)) (. .))\n")
    (tmp_path / "test.txt").write_text("(S (NP (DT A) (NN dog)) (VP (VBD sat)) (. .))\n")
    capsys.readouterr()
    assert main(["evaluate-parse", "--gold", str(gold), "--test", str(tmp_path / "test.txt")]) == 1
    assert f"--test {tmp_path / 'test.txt'} against --gold {gold}: tree 1: the test tree's words differ" in \
        capsys.readouterr().err


def test_a_treebank_not_in_utf8_is_named_with_its_line(tmp_path):
    """A tree file in Latin-1: the error named the byte's offset in the file, which an editor does not show."""
    path = tmp_path / "gold.mrg"
    path.write_bytes("(S (NP (DT the)) (VP (VBD ran)))\n(S (NP (NN café)) (VP (VBD ran)))\n".encode("latin-1"))
    with pytest.raises(UserError, match=r"gold\.mrg:2: invalid UTF-8 \(byte 0xe9 at byte column 15\)"):
        read_trees(path)


def test_a_tree_as_deep_as_reading_allows_is_written_and_linearized(tmp_path):
    """A tree 299 levels deep is read (MAX_DEPTH 300), but writing it ran out of Python's stack from 249 levels
    (two frames a level): `linearize` ended in an internal error (RecursionError), as would a parse that deep."""
    from transformer.trees import MAX_DEPTH, parse_brackets

    depth = MAX_DEPTH - 1
    text = "( (S " + "(NP " * (depth - 2) + "(NN w)" + ")" * (depth - 2) + ") )"
    tree = parse_brackets(text, "deep")[0]
    assert str(parse_brackets(str(tree), "again")[0]) == str(tree)  # (== on the trees recurses too)
    (tmp_path / "deep.mrg").write_text(text + "\n")
    assert main(["linearize", str(tmp_path / "deep.mrg"), "--out", str(tmp_path / "deep")]) == 0


def test_a_tree_never_closed_is_not_read_as_one_with_the_next():
    """A ')' missing at the end of one tree and one too many at the end of the next: the file balanced, the two
    trees were read as one (one training pair of both sentences, without a word). A bracket without a label,
    a tree's start, inside an open tree now names the tree that was not closed."""
    from transformer.trees import TreeError, parse_brackets

    text = "( (S (NP (NN a)) (VP (VB b)))\n\n( (S (NP (NN c)) (VP (VB d)))))\n"
    with pytest.raises(TreeError, match=r"^f.mrg: tree 1 \(from line 1\): not closed where line 3 opens a bracket "
                                        "without a label"):
        parse_brackets(text, "f.mrg")


@pytest.mark.parametrize("tree, said", [("( (NN Yes) )", "a part-of-speech node (NN Yes): a one-word tree"),
                                        ("( (NP (NN a)) (VP (VB b)) )", "unlabelled, with 2 constituents")])
def test_linearize_refuses_a_root_the_sequences_cannot_hold(tmp_path, capsys, tree, said):
    """A one-word tree was linearized as its bare word, an unlabelled root of two constituents as bare
    brackets: both read back as other trees (F1 93.33 against themselves in a file with four ordinary ones)."""
    (tmp_path / "odd.mrg").write_text("( (S (NP (NN c)) (VP (VB d))) )\n" + tree + "\n")
    assert main(["linearize", str(tmp_path / "odd.mrg"), "--out", str(tmp_path / "odd")]) == 1
    assert capsys.readouterr().err == f"error: {tmp_path / 'odd.mrg'}: tree 2: its root is {said}, which the task's " \
                                      "sequences cannot hold: give it one labelled root, e.g. (S ...)\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["odd.mrg"]  # nothing written


def test_blank_lines_of_a_file_of_one_tree_a_line_are_placed_only_where_that_is_its_layout(tmp_path):
    """parse writes a blank input line's tree as an empty line: with ``expect``, such a file's trees keep their
    lines' places; a treebank's layout (a tree over several lines, blank lines between) is read as before."""
    def read(name: str, expect: int | None = None) -> list:
        return read_normalized(tmp_path / name, expect, read_lines(tmp_path / name))

    (tmp_path / "lines").write_text("(S (NN x))\n\n(S (NN y))\n\n")
    assert [t and t.words() for t in read("lines", expect=4)] == [["x"], None, ["y"], None]
    assert [t.words() for t in read_normalized(tmp_path / "lines")] == [["x"], ["y"]]
    assert len(read("lines", expect=2)) == 2  # as many trees as expected: as they are
    assert len(read("lines", expect=5)) == 2  # a line short: a file cut short, not placed
    (tmp_path / "mrg").write_text("( (S\n  (NN x)))\n\n( (S (NN y)))\n")
    assert len(read("mrg", expect=4)) == 2
    (tmp_path / "two").write_text("(S (NN x)) (S (NN z))\n\n(S (NN y))\n")  # two trees on a line
    assert len(read("two", expect=3)) == 3


@pytest.mark.parametrize("opened", [MAX_DEPTH - 3, 340, 3000])
def test_a_decoders_tree_nested_past_reading_depth_is_cut_to_one_that_reads_back(tmp_path, opened):
    """A model that grows a unary chain to the length limit: from 310 open brackets the tree written was refused
    by evaluate-parse ("more than 300 brackets open at once"), and from 340 building it ran out of Python's stack
    (RecursionError). The constituents past MAX_DEPTH - 2 open ones are dropped, and the tree reads back and
    scores."""
    line = ["The", "dog", "barked", "."]
    # "dog" written as two words (an unknown character): its second leaf goes, and that walk recurses too
    written = [["The"], ["do", "g"], ["barked"], ["."]]
    closed = ["(S", *["(NP"] * opened, "The", "do", "g", "barked", ".", *[")NP"] * opened, ")S"]
    for tokens in (closed, closed[:opened + 6]):  # the chain closed, or left open to the length limit
        tree, well_formed = delinearize(tokens, line, written=written)
        assert well_formed is (opened < MAX_DEPTH - 2 and tokens is closed)
        again = parse_brackets(str(tree), "written")[0]
        assert again.words() == line and str(again) == str(tree)
    (tmp_path / "test.txt").write_text(f"{tree}\n")
    (tmp_path / "gold.txt").write_text("(S (NP (DT The) (NN dog)) (VP (VBD barked)) (. .))\n")
    assert main(["evaluate-parse", "--gold", str(tmp_path / "gold.txt"), "--test", str(tmp_path / "test.txt")]) == 0
