"""The run's vocabulary (§5.1): one joint BPE model trained on the training source + target, and
the record beside it of what it was trained from, so that a run folder never reuses a vocabulary
trained for other data or settings."""

from __future__ import annotations

import itertools
import json
from pathlib import Path
from typing import Any

from . import files
from .config import Config
from .data import DataError, iter_lines, pair_named, read_lines
from .tokenizer import Tokenizer


def train_vocabulary(cfg: Config, src: Path, tgt: Path, path: Path, log) -> Tokenizer:
    """§5.1: one joint BPE vocabulary of data.vocab_size pieces on the training source + target.

    For parsing (§6.3) every bracket symbol of the training trees ("(NP", ")NP") and the tag
    placeholder are single pieces, so one decision of the decoder is one symbol of the tree.
    """
    d = cfg.data
    symbols: set[str] = set()
    if d.task == "parse":
        from .trees import tree_symbols  # only parsing needs trees

        targets = read_lines(tgt)
        check_tree_targets(tgt, targets)
        symbols = tree_symbols(targets)
    log(f"training a joint BPE vocabulary of {d.vocab_size} pieces on {pair_named(src, tgt)}"
        + (f" ({len(symbols)} tree symbols kept whole)" if symbols else ""))
    # the record first: a run stopped between the two writes (Ctrl-C) leaves a record without a vocabulary, which
    # is trained anew, not a vocabulary without its record, which a later run would reuse whatever its inputs
    files.write_text(path.with_suffix(".json"), json.dumps(vocabulary_inputs(cfg, src, tgt), indent=2) + "\n")
    return Tokenizer.train(itertools.chain(iter_lines(src), iter_lines(tgt)), path, d.vocab_size,
                           d.spm_input_sentences, seed=cfg.train.seed, symbols=sorted(symbols), named=f"{src} + {tgt}")


def check_tree_targets(path: Path, targets: list[str], role: str = "training") -> None:
    """A DataError where a parsing run's target file (``path``, its lines ``targets``; ``role``: "training" or
    "validation") holds no linearized trees: text, or trees as the treebank brackets them. Trained on either, the
    parser wrote no tree or "(XX The)", and was refused only once trained."""
    if (plain := sum(not line.lstrip().startswith("(") for line in targets)) * 2 > len(targets):
        raise DataError(f"{path}: data.task is \"parse\", and {plain:,} of its {len(targets):,} lines are no "
                        "linearized tree (each begins with \"(\", as `transformer linearize` writes them): give "
                        f"the {role} trees, or set data.task = \"translate\"")

    # a tree as the treebank brackets it ends its constituents with ")" after a word ("dog)", "))", or apart:
    # "dog )"); a linearized one with closing symbols (")NP")
    def bracketed_tree(tokens: list[str]) -> bool:
        closings = [t for t in tokens if len(t) > 1 and t[0] == ")"]  # ")NP"
        return bool(tokens) and tokens[0][:1] == "(" and (
            any(len(t) > 1 and t.endswith(")") for t in tokens) or not closings)

    if (bracketed := sum(bracketed_tree(line.split()) for line in targets)) * 2 > len(targets):
        raise DataError(f"{path}: {bracketed:,} of its {len(targets):,} lines are trees bracketed as the treebank "
                        "writes them (\"(NP (DT the) (NN dog))\", as a .gold file holds them, for `evaluate "
                        f"--ref`): a parsing run's {role} trees are linearized, \"(NP the dog )NP\" (the .wlin file "
                        "`transformer linearize` writes)")


def check_tree_symbols(tokenizer: Tokenizer, path: Path, targets: list[str], log, role: str = "training") -> None:
    """A parsing run's target trees (``path``, its lines ``targets``, of ``role``) are linearized
    (``check_tree_targets``), and its vocabulary holds their bracket symbols as pieces (``train_vocabulary`` keeps
    them whole; one inherited by --init-from, or reused, may not): with none, a DataError before training (its
    parser is refused only once trained: ``trees.TreeConstraint``); with some missing, a warning naming them (the
    beam cannot write those constituents)."""
    from .trees import tree_symbols

    check_tree_targets(path, targets, role)  # a reused or inherited vocabulary: none was trained on them here
    pieces = set(tokenizer.vocabulary())
    symbols = tree_symbols(targets)
    missing = sorted(s for s in symbols if "\u2581" + s not in pieces)
    if not missing:
        return
    if not any(s.startswith("(") and "\u2581" + s in pieces for s in symbols):
        raise DataError(f"data.task is \"parse\", and the vocabulary {tokenizer.path} has none of the {role} "
                        "trees' bracket symbols ((NP, )NP, ...) as a piece: it is no parsing vocabulary (--init-from a "
                        "translation run?); fine-tune a parsing run, or train a new vocabulary")
    log(f"warning: the vocabulary {tokenizer.path} lacks {len(missing)} of the {role} trees' {len(symbols)} "
        f"symbols as a piece ({', '.join(missing[:8])}{', ...' if len(missing) > 8 else ''}): the parser cannot "
        "write those constituents")


def vocabulary_inputs(cfg: Config, src: Path, tgt: Path) -> dict[str, Any]:
    """What a vocabulary is a function of (``Tokenizer.train``): the training files' contents, the
    size, the sentences sampled, the seed, and the task (parsing keeps its tree symbols whole)."""
    d = cfg.data
    return {"train_src_sha256": files.file_sha256(src), "train_tgt_sha256": files.file_sha256(tgt),
            "vocab_size": d.vocab_size, "spm_input_sentences": d.spm_input_sentences, "seed": cfg.train.seed,
            "task": d.task}


def open_vocabulary(cfg: Config, src: Path, tgt: Path, path: Path, log, resuming: bool,
                    write: bool = True) -> Tokenizer:
    """The run folder's vocabulary: ``path`` when it was trained from what ``cfg`` asks for (the record
    beside it says), a new one when there is none. A vocabulary left by an earlier attempt with other
    data or settings (one that failed before its first checkpoint) is trained anew, saying what changed: no
    checkpoint was trained with it, and it is never reused for a model it does not fit.
    ``resuming`` a run with checkpoints: its vocabulary is the checkpoints' (their records hold its
    sha256), whatever changes --allow-config-change let through. ``write=False`` (a data-parallel rank but
    the first): rank 0's, which must be there and of this rank's inputs; such a rank trained and wrote its own
    where it found none (another --out) or found other inputs (its own copy of the data), over rank 0's."""
    record = path.with_suffix(".json")
    if not write:
        if not path.exists():  # a fine-tune's too: rank 0 copied its parent's there
            raise DataError(f"{path}: not there, where rank 0 wrote the run's vocabulary: every rank's --out must be "
                            "the one folder, on a file system they all see")
        try:  # rank 0 wrote it, or trained anew where it was unreadable
            recorded = json.loads(record.read_text(encoding="utf-8")) if record.exists() and not resuming else {}
        except (OSError, ValueError):
            recorded = {}
        recorded = recorded if isinstance(recorded, dict) else {}
        if changed := [k for k, v in vocabulary_inputs(cfg, src, tgt).items() if recorded.get(k, v) != v]:
            raise DataError(f"{path}: rank 0 trained it from other inputs than this rank's ({', '.join(changed)}): "
                            "every rank must read the same training files, with the same config")
        return Tokenizer(path)
    if not path.exists():
        return train_vocabulary(cfg, src, tgt, path, log)
    if resuming:
        return Tokenizer(path)
    if not record.exists():
        log(f"{path}: no record of what it was trained from ({record.name}); using it as it is")
        return Tokenizer(path)
    try:
        recorded = json.loads(record.read_text(encoding="utf-8"))
        if not isinstance(recorded, dict):
            raise ValueError(f"not a JSON object but {type(recorded).__name__}")
    except (OSError, ValueError) as e:
        log(f"{record}: unreadable ({e}); no checkpoint was trained with {path.name}: training a new one in its place")
        return train_vocabulary(cfg, src, tgt, path, log)
    wanted = vocabulary_inputs(cfg, src, tgt)
    if changed := [f"{k}: {recorded.get(k)!r} -> {v!r}" for k, v in wanted.items() if recorded.get(k) != v]:
        log(f"{path} was trained from other inputs than this config asks for ({'; '.join(changed)}); no checkpoint "
            "was trained with it: training a new one in its place")
        return train_vocabulary(cfg, src, tgt, path, log)
    return Tokenizer(path)
