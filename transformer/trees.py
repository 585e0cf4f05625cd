"""English constituency parsing as translation (§6.3): Penn Treebank trees in, bracket sequences out.

§6.3 trains the same Transformer to map a sentence to its linearized parse tree, as Vinyals et al.
(2015, "Grammar as a Foreign Language", the paper's [37]) did: the source is the word sequence, the
target the tree's brackets with every part-of-speech tag replaced by one placeholder ``XX`` and each
closing bracket labelled, e.g. ``(S (NP XX XX )NP (VP XX )VP XX )S`` for "The dog barked .". The
parsing recipe writes the words in place of XX (``linearize(words=True)``, a documented deviation):
``(S (NP The dog )NP (VP barked )VP . )S``.

Normalisation of a treebank tree (documented, and undone by nothing: it defines the task):
- ``-NONE-`` elements (traces, empty subjects) are removed, and so is every constituent left empty;
- function tags and indices are stripped: ``NP-SBJ-1`` -> ``NP``, ``PP-LOC=2`` -> ``PP`` (labels that
  start with "-", such as the tags ``-LRB-`` and ``-RRB-``, are kept as they are);
- the treebank's unlabelled outermost bracket ``( (S ...) )`` is dropped: the tree is its child.

Words that are brackets are written as the treebank writes them, ``(`` ``)`` ``{`` ``}`` as -LRB- -RRB- -LCB-
-RCB- (``ptb_escape``): the training words are so, and a bare bracket in a tree would not read back.

Scoring these trees against gold ones is in evaluate.py (EVALB's rules); the task's files are
built by prepare.py.
"""

from __future__ import annotations

import copy
import difflib
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import NamedTuple

import torch
from torch import Tensor

from .data import read_lines, shown
from .errors import UserError
from .tokenizer import EOS_ID, PAD_ID

PLACEHOLDER = "XX"  # every part-of-speech tag in the target sequence (Vinyals et al. 2015)
_TOKEN = re.compile(r"\(|\)|[^\s()]+")
MAX_DEPTH = 300  # brackets open at once: the treebank's trees nest a few dozen deep; the walks here recurse
_BRACKET = re.compile(r"[(){}]")
_PTB_BRACKETS = {"(": "-LRB-", ")": "-RRB-", "{": "-LCB-", "}": "-RCB-"}  # the treebank's tokens for them


class TreeError(UserError, ValueError):
    """A bracketed tree that cannot be read, with the file and tree number."""


@dataclass
class Tree:
    """A constituent: a label and children; a part-of-speech node has exactly one child, the word."""

    label: str
    children: list[Tree | str] = field(default_factory=list)
    line: int = field(default=0, compare=False, repr=False)  # where a tree read from text starts (0: not read)
    end: int = field(default=0, compare=False, repr=False)  # and the line its last bracket closes on

    @property
    def is_preterminal(self) -> bool:
        return len(self.children) == 1 and isinstance(self.children[0], str)

    def words(self) -> list[str]:
        return [w for c in self.children for w in ([c] if isinstance(c, str) else c.words())]

    def tags(self) -> list[str]:
        if self.is_preterminal:
            return [self.label]
        return [t for c in self.children if isinstance(c, Tree) for t in c.tags()]

    def __str__(self) -> str:
        """Penn Treebank bracketing on one line: (S (NP (DT The) (NN dog)) (VP (VBD barked)) (. .)); words
        are escaped (``ptb_escape``), so that the line reads back. Written without recursion: two frames a
        level ran out of Python's stack at 249 levels, below the MAX_DEPTH that reading allows."""
        out: list[str] = []
        todo: list[Tree | str | bool] = [self]  # False: a closing bracket; True: the space before a child
        while todo:
            item = todo.pop()
            if item is False:
                out.append(")")
            elif item is True:
                out.append(" ")
            elif isinstance(item, Tree):
                out.append(f"({item.label}" + ("" if item.children else " "))
                todo.append(False)
                for child in reversed(item.children):
                    todo += [child, True]
            else:
                out.append(ptb_escape(item))
        return "".join(out)


def ptb_escape(word: str) -> str:
    """``word`` with its brackets as the Penn Treebank writes them: "(" -> -LRB-, ")" -> -RRB-, "{" -> -LCB-,
    "}" -> -RCB-. A bare "(" or ")" would open or close a constituent when the tree is read back, and the
    parsing model was trained on the treebank's tokens, not on the brackets."""
    return _BRACKET.sub(lambda m: _PTB_BRACKETS[m.group()], word)


def parse_brackets(text: str, where: str = "<text>") -> list[Tree]:
    """All trees of a bracketed text (a .mrg file, or one tree per line); an error names the tree and its line.

    Trees are numbered by the lines they start on: what starts on the line where the tree before it closed
    is counted as that tree. A ')' too many in a tree written on one line closes it early and leaves the
    rest to read as further trees; the error is still in the line's tree, not in the third or fourth.
    """
    tokens, line, seen = [], 1, 0
    for m in _TOKEN.finditer(text):
        line += text.count("\n", seen, m.start())
        tokens.append((m.group(), line))
        seen = m.start()
    trees, stack = [], []
    number, start, last = 0, 0, 0  # the tree's number, its first line; the line the tree before ended on
    i = 0
    while i < len(tokens):
        tok, line = tokens[i]
        if not stack and (number == 0 or line > last):
            number, start = number + 1, line
        if tok == "(":
            label = ""
            if i + 1 < len(tokens) and tokens[i + 1][0] not in "()":
                label, i = tokens[i + 1][0], i + 1
            if stack and not label:  # only a tree's root is unlabelled ("( (S" in .mrg): the tree before never closed,
                raise TreeError(f"{where}: tree {number} (from line {start}): not closed where line {line} opens a "
                                "bracket without a label, a tree's start")  # and two trees were read as one
            stack.append(Tree(label, line=0 if stack else start))
            if len(stack) > MAX_DEPTH:
                raise TreeError(f"{where}: tree {number} (line {line}): more than {MAX_DEPTH} brackets open at once; "
                                "no parse tree nests so deep")
        elif tok == ")":
            if not stack:
                raise TreeError(f"{where}: tree {number} (line {line}): ')' without an open bracket")
            node = stack.pop()
            if stack:
                stack[-1].children.append(node)
            else:
                trees.append(node)
                last = node.end = line
        else:
            if not stack:
                raise TreeError(f"{where}: tree {number} (line {line}): word {tok!r} outside any bracket")
            stack[-1].children.append(tok)
        i += 1
    if stack:
        raise TreeError(f"{where}: tree {number} (from line {start}): {len(stack)} bracket(s) never closed")
    return trees


def linearised_hint(lines: list[str]) -> str:
    """What to say beside a tree file's error where its lines are linearised trees (closings as ")NP": the training
    targets, or ``translate``'s output on a parsing run) read in place of bracketed ones; else ""."""
    if any(t[:1] == ")" and t[1:2].isalpha() for line in lines[:100] for t in line.split()):
        return (" (linearised trees, closed as \")NP\": give them bracketed as the treebank writes them, as a .gold "
                "file or `parse`'s output holds them)")
    return ""


def read_trees(path: Path, lines: list[str] | None = None) -> list[Tree]:
    """The bracketed trees in a file (``lines``: its lines, read already); one that cannot be read, or holds no
    tree, is a TreeError naming it (an empty gold or test file would score F1 0 as if parsed)."""
    path = Path(path)
    if lines is None:
        lines = read_lines(path)  # a file not UTF-8: the line and byte named
    try:
        trees = parse_brackets("\n".join(lines), shown(path))
    except TreeError as e:
        raise TreeError(f"{e}{linearised_hint(lines)}") from None
    if not trees:
        raise TreeError(f"{shown(path)}: no trees in it (the file "
                        f"{'is empty' if not lines else 'holds blank lines alone'})")
    return trees


def _strip_label(label: str) -> str:
    if label.startswith("-"):
        return label  # -NONE-, -LRB-, -RRB-
    return re.split(r"[-=]", label, maxsplit=1)[0] or label


def normalize(tree: Tree) -> Tree | None:
    """The documented normalisation (module docstring); None if nothing is left. A word beside other
    children, under no part-of-speech node of its own, is a TreeError: scoring reads each word's tag."""
    if tree.label == "" and len(tree.children) == 1 and isinstance(tree.children[0], Tree):
        return normalize(tree.children[0])
    if tree.is_preterminal:
        return None if tree.label == "-NONE-" else Tree(tree.label, list(tree.children))
    if not tree.children and tree.label:  # dropped with the constituents it left empty, without a word
        raise TreeError(f"({tree.label}) holds no word: a treebank tree tags every word, as (NN dog), and marks an "
                        "empty element (-NONE- *)")
    if len(bare := [c for c in tree.children if isinstance(c, str)]) == len(tree.children) > 1:  # two words, no tag
        raise TreeError(f"({tree.label} {' '.join(bare[:3])}{' ...' if len(bare) > 3 else ''}) holds {len(bare)} "
                        "words without a part-of-speech node each: a treebank tree tags every word, as (NN dog)")
    if bare:
        raise TreeError(f"the word {bare[0]!r} stands in ({tree.label} ...) without a part-of-speech node of its "
                        "own; a treebank tree tags every word, as (NN dog)")
    children = [n for c in tree.children if (n := normalize(c)) is not None]
    return Tree(_strip_label(tree.label), children) if children else None


def read_normalized(path: Path, expect: int | None = None, lines: list[str] | None = None) -> list[Tree | None]:
    """``read_trees`` (of ``lines`` where given), each tree normalised (None: nothing left once traces are
    removed); a tree that cannot be is a TreeError naming the file and the tree's place in it. ``expect``: how many
    trees the caller pairs them with; ``lines`` of that many, holding fewer trees one a line, have None for each
    blank line (``parse`` writes a blank input line's tree as an empty line; a file cut short stays short)."""
    trees, out = read_trees(path, lines), []
    for i, tree in enumerate(trees, 1):
        try:
            out.append(normalize(tree))
        except TreeError as e:  # the file's lines again (a file of trees is read whole): an error is said once
            hint = linearised_hint(lines if lines is not None else read_lines(path))
            raise TreeError(f"{shown(path)}: tree {i} (line {tree.line}): {e}{hint}") from None
    starts = [tree.line for tree in trees]
    if (expect is not None and lines is not None and len(out) < expect == len(lines)
            and all(tree.end == tree.line for tree in trees) and len(set(starts)) == len(trees)):
        placed: list[Tree | None] = [None] * expect
        for start, normal in zip(starts, out):
            placed[start - 1] = normal
        return placed
    return out


def linearize(tree: Tree, words: bool = False) -> list[str]:
    """Vinyals et al.'s target sequence: "(L" ... ")L" per constituent, XX per word.

    DEVIATION(§6.3, A14): §6.3 cites Vinyals et al. and names no format; the authors' code wrote each
    part-of-speech tag as an opening symbol of its own and the closings as "/L".
    Vinyals et al.'s sequences are what ``TreeConstraint`` and ``delinearize`` read, and scoring puts
    the gold tags back (``evaluate.score_trees``).

    DEVIATION(§6.3): ``words=True`` writes each word itself instead of XX ("(S (NP The dog )NP ...").
    The decoder then copies the sentence as it brackets it, so it always knows which word it is at:
    with XX it must count the words it has placed, which a few thousand training trees do not teach.
    """
    if tree.is_preterminal:
        return [str(tree.children[0]) if words else PLACEHOLDER]
    inner = [t for c in tree.children if isinstance(c, Tree) for t in linearize(c, words)]
    return [f"({tree.label}", *inner, f"){tree.label}"]


def tree_symbols(lines: Iterable[str]) -> set[str]:
    """Every bracket symbol ("(NP", ")NP") and the placeholder in linearized trees, one per line (the
    words of targets that carry them are not symbols)."""
    return {tok for line in lines for tok in line.split() if tok == PLACEHOLDER or tok[:1] in "()"}


def delinearize(tokens: list[str], words: list[str], root_label: str = "S",
                written: list[list[str]] | None = None) -> tuple[Tree | None, bool]:
    """The tree a target sequence describes, with ``words`` at its leaves; and whether the sequence
    was well-formed (balanced, matching labels, one leaf per word, one root, no empty constituent).
    A leaf is XX or a word (targets written with ``linearize(words=True)``); a word must be the
    input's word at that place.

    Anything else is repaired deterministically, so every sentence gets a tree with its words:
    a closing bracket closes the innermost open constituent whatever its label (none open: ignored);
    a bare "(" is dropped; constituents left open are closed; a constituent opened inside ``MAX_DEPTH`` - 2
    open ones is dropped with its closing bracket, so that the tree, with a root and its leaves' tags, reads
    back (a model that grows a unary chain to the length limit wrote trees `evaluate-parse` refused, and a
    deeper one ran out of Python's stack here). Leaves take the input's words in order
    when there are as many as words, or when they are all XX (a leaf beyond the last word is dropped).
    Otherwise the leaves' words are aligned with the input's (``difflib``: the longest matching runs):
    a leaf no input word aligns with is dropped, and an input word no leaf aligns with joins the
    constituent of the word before it, right after it. So a word the decoder skipped or repeated
    costs the brackets around it, not every bracket after it. Constituents left empty are removed;
    several top-level pieces, or none, are wrapped in one ``root_label`` constituent. ``words`` are taken
    escaped (``ptb_escape``), as the model reads and writes them: "(" is the word -LRB-. ``written``: each
    word as the model writes it, where that differs (``Tokenizer.words``: an unknown character is "\u2047";
    a character the vocabulary's normalisation makes a space and an accent splits a word in two, "don\u00b4t"
    written as "don" and "\u2047t"), which the leaves are matched with: a word written as several has as many
    leaves, merged into its first (constituents left empty go). The tree holds ``words``; no words, no tree
    (None, as ``normalize`` gives for a tree that holds none).
    """
    words = [ptb_escape(w) for w in words]
    written = [[w] for w in words] if written is None else written
    if len(written) != len(words):
        raise ValueError(f"{len(written)} written words for {len(words)} words")
    # the words as the model writes them, one after another; a word it writes as none (zero-width characters
    # alone) stands as "", which no leaf says: the repair places it
    owner = [i for i, parts in enumerate(written) for _ in (parts or [""])]
    given, words = words, [part for parts in written for part in (parts or [""])]
    well_formed = True
    top: list[Tree] = []
    stack: list[Tree] = []
    leaves: list[tuple[Tree, list]] = []  # each leaf with the child list that holds it
    too_deep = 0  # constituents dropped inside MAX_DEPTH - 2 open ones, still open
    for tok in tokens:
        siblings = stack[-1].children if stack else top
        if tok.startswith("(") and len(tok) > 1:
            if len(stack) >= MAX_DEPTH - 2:
                too_deep += 1
                well_formed = False
                continue
            node = Tree(tok[1:])
            siblings.append(node)
            stack.append(node)
        elif tok.startswith(")"):
            if too_deep:
                too_deep -= 1
                continue
            if not stack:
                well_formed = False
                continue
            node = stack.pop()
            if tok[1:] and tok[1:] != node.label:
                well_formed = False
        elif tok == "(":
            well_formed = False
        else:  # a leaf: XX, or the word itself
            leaf = Tree(PLACEHOLDER, [tok])
            siblings.append(leaf)
            leaves.append((leaf, siblings))
    if stack:
        well_formed = False
    said = [str(leaf.children[0]) for leaf, _ in leaves]
    if len(said) != len(words) or any(x not in (PLACEHOLDER, w) for x, w in zip(said, words)):
        well_formed = False
    _place_words(leaves, said, words, top)

    def prune(node: Tree) -> Tree | None:
        if node.is_preterminal:
            return node
        kept = [p for c in node.children if isinstance(c, Tree) and (p := prune(c)) is not None]
        return Tree(node.label, kept) if kept else None

    pieces = [p for t in top if (p := prune(t)) is not None]
    if len(pieces) != len(top) or any(_has_empty(t) for t in top):
        well_formed = False
    if len(pieces) == 1 and not pieces[0].is_preterminal:
        return _owned(pieces[0], owner, given), well_formed
    if pieces:  # several pieces at the top (or bare words): one root holds them
        well_formed = False
    return _owned(Tree(root_label, pieces or [Tree(PLACEHOLDER, [w]) for w in words]), owner, given), well_formed


def _owned(tree: Tree, owner: list[int], words: list[str]) -> Tree | None:
    """``tree``, whose leaves are the written words in order (``owner``: the input word each is of), with one leaf
    per input word: its first written word's, holding the word; the leaves of its later ones go, and the
    constituents they leave empty with them."""
    leaves, last = iter(owner), -1

    def walk(node: Tree) -> Tree | None:
        nonlocal last
        if node.is_preterminal:
            k = next(leaves)
            if k == last:
                return None
            last = k
            return Tree(node.label, [words[k]])
        kept = [k for c in node.children if isinstance(c, Tree) and (k := walk(c)) is not None]  # 2 frames a level
        return Tree(node.label, kept) if kept else None
    return walk(tree)


def _place_words(leaves: list[tuple[Tree, list]], said: list[str], words: list[str], top: list) -> None:
    """Puts ``words`` at the leaves, in place (``delinearize``'s repair of the leaves)."""
    if len(said) == len(words) or all(x == PLACEHOLDER for x in said):
        pairs = [(i, i) for i in range(min(len(said), len(words)))]
    else:
        pairs = []
        for tag, i1, i2, j1, j2 in difflib.SequenceMatcher(None, said, words, autojunk=False).get_opcodes():
            if tag in ("equal", "replace"):  # a replaced run: position by position, the rest unmatched
                pairs += zip(range(i1, i2), range(j1, j2))
    word_of = dict(pairs)
    for i, (leaf, siblings) in enumerate(leaves):
        if i in word_of:
            leaf.children[0] = words[word_of[i]]
        else:
            del siblings[_index(siblings, leaf)]
    # input words no leaf took: after the leaf of the word before them (none: before the next one's)
    leaf_of = {j: leaves[i] for i, j in pairs}
    for j, word in enumerate(words):
        if j in leaf_of:
            continue
        leaf, later = Tree(PLACEHOLDER, [word]), min((k for k in leaf_of if k > j), default=None)
        if j - 1 in leaf_of:
            before, siblings = leaf_of[j - 1]
            siblings.insert(_index(siblings, before) + 1, leaf)
        elif later is not None:
            after, siblings = leaf_of[later]
            siblings.insert(_index(siblings, after), leaf)
        else:
            siblings = top
            top.append(leaf)
        leaf_of[j] = (leaf, siblings)


def _index(siblings: list, node: Tree) -> int:
    """Where ``node`` itself is in ``siblings`` (another leaf may be equal to it)."""
    return next(k for k, c in enumerate(siblings) if c is node)


def _has_empty(node: Tree) -> bool:
    if node.is_preterminal:
        return False
    return not node.children or any(_has_empty(c) for c in node.children if isinstance(c, Tree))


def with_tags(tree: Tree, tags: list[str]) -> Tree:
    """``tree`` with its part-of-speech nodes relabelled by ``tags``, left to right."""
    it = iter(tags)

    def walk(node: Tree) -> Tree:
        if node.is_preterminal:
            return Tree(next(it), list(node.children))
        return Tree(node.label, [walk(c) for c in node.children])
    return walk(tree)


class _Hypothesis(NamedTuple):
    """Where a hypothesis of ``TreeConstraint`` stands."""

    sentence: int  # its row in the batch
    pos: int  # the next input piece to write
    stack: tuple[int, ...]  # the closing id each open constituent expects, innermost last
    holds: bool  # the innermost open constituent holds a word or a constituent
    opens_in_row: int  # opening brackets since the last word or closing bracket
    rooted: bool  # the root is open (or closed)


class TreeConstraint:
    """Lets beam search (``constraints.Constraint``) write only well-formed linearized trees of its input.

    DEVIATION(§6.3): the paper decodes freely and a tree that does not close, mislabels a closing bracket or
    skips a word has to be repaired afterwards (``delinearize``). Here, at each step a hypothesis may
    write only: an opening bracket "(L" (while input words remain, and at the top only as the root);
    the closing bracket of its innermost open constituent, labelled alike, once that constituent holds
    a word (the root's only after the last word); the next piece of the input, inside a constituent
    (a word's later pieces follow its first at once); the placeholder XX in place of the next whole
    word (for targets written without words); EOS once the root is closed. The input's pieces are the
    target's pieces of the same words: the vocabulary is shared and words are split alike in both.
    An opening bracket is also refused when the words left and the brackets to close would no longer
    fit in the length limit, so every output, EOS forced at the limit or not, is a tree of the input.
    At most ``max_opens`` opening brackets follow one another (6 is the longest run in the WSJ
    sample's training trees): without a bound, a hypothesis that the model would rather end otherwise
    (a word out of order, another label) finds its least bad way on in opening brackets, a unary chain
    that grows until the length limit.
    """

    def __init__(self, vocabulary: list[str], max_opens: int = 6):
        ids = {piece: i for i, piece in enumerate(vocabulary)}
        self.vocab_size, self.max_opens = len(vocabulary), max_opens
        self.close_of = {i: ids["\u2581)" + p[2:]] for p, i in ids.items()
                         if p.startswith("\u2581(") and len(p) > 2 and "\u2581)" + p[2:] in ids}
        if not self.close_of:
            raise TreeError("the vocabulary has no bracket symbols (\u2581(NP, \u2581)NP, ...): not a parsing model")
        self.open_ids = torch.tensor(sorted(self.close_of))
        self.leaf_id = ids.get("\u2581" + PLACEHOLDER)
        self.starts_word = [p.startswith("\u2581") for p in vocabulary]
        self.pieces = vocabulary

    def begin(self, src: Tensor, beam: int, max_len: Tensor) -> None:
        self.device = src.device
        self.sources = [[t for t in row if t not in (PAD_ID, EOS_ID)] for row in src.tolist()]
        self.max_len = max_len.tolist()
        self.word_end = []  # per sentence: for each piece position, where the next word starts
        for pieces in self.sources:
            ends, nxt = [0] * len(pieces), len(pieces)
            for k in range(len(pieces) - 1, -1, -1):
                ends[k] = nxt
                if k == 0 or self.starts_word[pieces[k]]:
                    nxt = k
            self.word_end.append(ends)
        self.states = [_Hypothesis(i, 0, (), False, 0, False) for i in range(len(self.sources)) for _ in range(beam)]
        self.written = 0  # tokens each row has written: the same for all, one per step

    def allowed(self) -> Tensor:
        allowed = torch.zeros(len(self.states), self.vocab_size, dtype=torch.bool)
        opens, rows, tokens = [], [], []
        for r, h in enumerate(self.states):
            pieces = self.sources[h.sentence]
            if 0 < h.pos < len(pieces) and not self.starts_word[pieces[h.pos]]:
                rows.append(r), tokens.append(pieces[h.pos])  # inside a word: its next piece
                continue
            if h.pos < len(pieces):
                # after this bracket: the words left, every bracket closed, EOS
                needed = self.written + 1 + (len(pieces) - h.pos) + len(h.stack) + 1 + 1
                if (h.stack or not h.rooted) and h.opens_in_row < self.max_opens and needed <= self.max_len[h.sentence]:
                    opens.append(r)
                if h.stack:
                    rows.append(r), tokens.append(pieces[h.pos])
                    if self.leaf_id is not None:
                        rows.append(r), tokens.append(self.leaf_id)
            if h.stack and h.holds and (len(h.stack) > 1 or h.pos == len(pieces)):
                rows.append(r), tokens.append(h.stack[-1])
            if not h.stack and h.pos == len(pieces) and (h.rooted or not pieces):
                rows.append(r), tokens.append(EOS_ID)
        if opens:
            allowed[torch.tensor(opens)[:, None], self.open_ids] = True
        if rows:
            allowed[torch.tensor(rows), torch.tensor(tokens)] = True
        return allowed.to(self.device)

    def advance(self, rows: Tensor, tokens: Tensor) -> None:
        states = []
        for r, token in zip(rows.tolist(), tokens.tolist()):
            h = self.states[r]
            pieces = self.sources[h.sentence]
            if h.pos < len(pieces) and token == pieces[h.pos]:
                h = h._replace(pos=h.pos + 1, holds=True, opens_in_row=0)
            elif token in self.close_of:
                h = h._replace(stack=(*h.stack, self.close_of[token]), holds=False, opens_in_row=h.opens_in_row + 1,
                               rooted=True)
            elif h.stack and token == h.stack[-1]:
                h = h._replace(stack=h.stack[:-1], holds=True, opens_in_row=0)
            elif token == self.leaf_id and h.pos < len(pieces):
                h = h._replace(pos=self.word_end[h.sentence][h.pos], holds=True, opens_in_row=0)
            # anything else is a dead row's filler (all its candidates were -inf): its state stays
            states.append(h)
        self.states, self.written = states, self.written + 1

    def refuses(self, source: list[int], prefix: list[int], max_len: int) -> str | None:
        """Why ``prefix`` (target piece ids, possibly none) cannot start a tree of ``source`` (piece ids,
        EOS last) whose output holds at most ``max_len`` tokens, EOS included; None if it can. A search
        forced into such a prefix, or given a limit no tree fits in, would find no allowed token and no
        hypothesis at all, so it is refused before decoding. Walked on a copy: a search that uses this
        constraint meanwhile is not disturbed."""
        walker = copy.copy(self)
        walker.begin(torch.tensor([source]), 1, torch.tensor([max_len]))
        for k, token in enumerate(prefix):
            if not walker.allowed()[0, token]:
                piece = self.pieces[token].replace("\u2581", "")  # a word's start alone ("x" as "\u2581", "x"): said so
                shown = repr(piece) if piece else "a word's start ('\u2581')"
                return (f"its piece {k + 1}, {shown}, cannot continue a tree of "
                        "the input (a tree starts with an opening bracket, holds the input's words in order, closes "
                        "what it opens, and fits the length limit)")
            walker.advance(torch.tensor([0]), torch.tensor([token]))
        if not walker.allowed()[0].any():
            return "no tree of the input fits the length limit"
        return None
