"""Where data come from: the data folders, the small data sets fetched or built on first use
(Multi30k, downloaded and checked; the parsing task's files, built from the Penn Treebank sample),
and `transformer prepare`, which downloads and extracts the paper's WMT 2014 data (§5.1) as plain
parallel text.

``resolve_data_path`` finds a data file: as given, else under each data root in order
($TRANSFORMER_DATA, ./data, ../shared/data beside the checkout, ~/.cache/transformer).

§5.1: "We trained on the standard WMT 2014 English-German dataset consisting of about 4.5 million
sentence pairs ... For English-French, we used the significantly larger WMT 2014 English-French
dataset consisting of 36M sentences". The corpora are those of the WMT14 translation task;
newstest2013 is the development set (§6.2, Table 3) and newstest2014 the test set (§6.1, Table 2),
in its full version of 3,003 sentences (sacrebleu's "wmt14/full").

The archives and the member names inside them are listed once, in DATASETS; the corpora are
concatenated in the order listed there. Output: dest/{train,valid,test}.{src,tgt} (UTF-8, one
sentence per line) and dest/MANIFEST.json (line counts and sha256 of every output and archive).
"""

from __future__ import annotations

import gzip
import hashlib
import json
import os
import re
import shutil
import tarfile
import unicodedata
import zlib
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

from tqdm import tqdm

from .data import DataError, iter_lines, iter_parallel
from .files import DownloadError, atomic_path, download, write_text
from .trees import Tree, TreeError, linearize, read_normalized

# ---------------------------------------------------------------------------------------------- data folders
MULTI30K_URL = "https://github.com/multi30k/dataset/raw/master/data/task1/"  # raw/ and tok/ below it
MULTI30K_SHA256 = {  # task 1 raw files (raw/), as listed in the shared data README
    "train.de.gz": "726e39b2fa9eb9ffb6dc763fb35a179f80fae06ffc5d28b6ace5faa883de28a6",
    "train.en.gz": "d79cfa999dd4c51d2cb42499b6796d5a882c3a8a961923c25a898c90f8bbd56f",
    "train.fr.gz": "622e75069e9f4c577425c4f277116ce66e63a2401c0a2312d90073cb12379a3c",
    "val.de.gz": "f0cba2f995189cf5770f29a8a9a537a3ad3f51657ad873405082ff6863a5e75a",
    "val.en.gz": "14f7d25ddd868909a9213e361768460edcacdd6ab9d1e77b92560dc10c10dc28",
    "val.fr.gz": "ca3106f1a72390591d25f6c45cb4cd39dec4cd3f123e099748a3ce5256c160e9",
    "test_2016_flickr.de.gz": "9204244e408ccb38d2a55cfcd344df15005fc42a07a6e55ca6c52b6ababb8cc8",
    "test_2016_flickr.en.gz": "611d361c6334bc7246101d48097c13cf5c4413c5befc793cc629934359d532d9",
    "test_2016_flickr.fr.gz": "6d326e188d259fb1d04ac19eae3af956559b3a0b93d7635e56c90987c40c8b90",
}
# the dataset's lowercased, normalised, Moses-tokenized references (tok/) of the same sets, which published
# Multi30k results are scored against (evaluate --tok-ref, the recipes' data.test_tok_ref): published as plain
# text (these are its sha256), kept gzipped under the names the recipes give them (multi30k/tok/NAME.gz)
MULTI30K_TOK_SHA256 = {
    "test_2016_flickr.lc.norm.tok.de": "c6a33d39d48f9f510de147651316cd9d918e09ad0219df734a2f16b6baccacc4",
    "test_2016_flickr.lc.norm.tok.en": "5b7f32627cf99eced828311b955dae9800bb52bc8b91cf8b6526829e605b29d2",
    "test_2016_flickr.lc.norm.tok.fr": "1463bd5960f9bfe098ec3cd752d3df0c49c84dc646fb518964a29232658cd836",
    "val.lc.norm.tok.de": "97232bd273eceb7207f689527386a97e4be2616b18ada47576bdaf96c8ae1f00",
    "val.lc.norm.tok.en": "46573ce391ae227f1c72f873392436a20ef18e0a6d518098cfbd70b77c8572ec",
    "val.lc.norm.tok.fr": "b303e301aa21fe7822a846b2b3fb2d5a1121ec807cd5b1d006fb7b2b5507168a",
}
_CHECKOUT = Path(__file__).resolve().parent.parent


def _candidate_roots() -> list[Path]:
    """The data roots in order, each folder once (TRANSFORMER_DATA is often ../shared/data beside the checkout)."""
    env = os.environ.get("TRANSFORMER_DATA")
    roots: dict[Path, Path] = {}
    # ../shared/data beside a checkout; an installed package's parent is site-packages' (a folder in the venv)
    beside = [_CHECKOUT.parent / "shared" / "data"] if (_CHECKOUT / "pyproject.toml").is_file() else []
    for root in [*([Path(env).expanduser()] if env else []), Path.cwd() / "data", *beside,
                 Path.home() / ".cache" / "transformer"]:
        roots.setdefault(root.resolve(), root)
    return list(roots.values())


def find_data_root() -> Path | None:
    """First existing of $TRANSFORMER_DATA, ./data, <checkout>/../shared/data, ~/.cache/transformer."""
    return next((root for root in _candidate_roots() if root.is_dir()), None)


def _published_multi30k(given: Path) -> tuple[str, str] | None:
    """Where a Multi30k file as the recipes name it ("multi30k/FILE" raw, "multi30k/tok/NAME[.gz]" a tokenized
    reference) is published below MULTI30K_URL, and its sha256 there; None for any other path."""
    parts = given.parts
    if len(parts) == 2 and parts[0] == "multi30k" and parts[1] in MULTI30K_SHA256:
        return f"raw/{parts[1]}", MULTI30K_SHA256[parts[1]]
    if len(parts) == 3 and parts[:2] == ("multi30k", "tok") and parts[2].removesuffix(".gz") in MULTI30K_TOK_SHA256:
        name = parts[2].removesuffix(".gz")
        return f"tok/{name}", MULTI30K_TOK_SHA256[name]
    return None


def _download_multi30k(given: Path, published: str, sha256: str) -> Path:
    """Fetches one Multi30k file (``given``, relative to a data root) into the cache, verified against the
    sha256 of what is published; a reference published as plain text and asked for as .gz is gzipped."""
    env = os.environ.get("TRANSFORMER_DATA")
    path = (Path(env).expanduser() if env else Path.home() / ".cache" / "transformer") / given
    url = os.environ.get("TRANSFORMER_MULTI30K_URL", MULTI30K_URL).rstrip("/") + "/" + published
    plain = path.with_name(Path(published).name)  # the published file's own name
    where = path.parent if plain == path else f"{path.parent}, gzipped as {path.name}"
    hint = f"download {MULTI30K_URL}{published} into {where}, or set TRANSFORMER_DATA to a folder holding multi30k/"
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        download(url, plain, sha256)
        if plain != path:  # gzipped, as named: the recipes' and the shared data's reference files are .gz
            with atomic_path(path) as part:
                part.write_bytes(gzip.compress(plain.read_bytes(), mtime=0))
            plain.unlink()
    except (DownloadError, OSError) as e:  # offline, HTTP error, refused, not the file, no folder: one message
        raise DataError(f"{given.as_posix()} is missing and could not be downloaded: {e}; {hint}") from None
    return path


PTB_PARSE = "ptb-sample-parse"  # the parsing task's files (§6.3), built from ptb-sample/ on first use


def _build_ptb_parse(name: str, roots: list[Path]) -> Path:
    """Writes {train,valid,test}.{words,lin,wlin,gold} from the WSJ sample's .mrg files into the cache."""
    ptb = next((root / "ptb-sample" for root in roots if (root / "ptb-sample").is_dir()), None)
    if ptb is None:
        raise DataError(f"{PTB_PARSE}/{name}: built from ptb-sample/ (the Penn Treebank WSJ sample's .mrg files), "
                        f"which is in none of {', '.join(map(str, roots))}; set TRANSFORMER_DATA")
    folder = Path.home() / ".cache" / "transformer" / PTB_PARSE
    try:
        write_ptb_splits(ptb, folder)
    except OSError as e:  # an unusable HOME (ENOENT under /proc) was an internal error
        if e.filename is not None and not (Path(e.filename).is_relative_to(folder)  # reading the trees: not this
                                           or folder.is_relative_to(Path(e.filename))):  # a folder above it
            raise
        raise DataError(f"{PTB_PARSE}/{name}: cannot write the parsing task's files into {folder} "
                        f"({e.strerror or e}); they are built under $HOME/.cache/transformer") from None
    if not (folder / name).exists():
        raise DataError(f"{PTB_PARSE}/{name}: not a file of the parsing task (train|valid|test . words|lin|wlin|gold)")
    return folder / name


PTB_SPLITS = {"train": (1, 159), "valid": (160, 174), "test": (175, 189)}  # by file, as WSJ sections


def write_ptb_splits(ptb_dir: Path, dest: Path) -> dict[str, int]:
    """The parsing task's files from the WSJ sample's .mrg files, split by file number:
    ``{split}.words`` (source: words separated by spaces), ``{split}.lin`` (target: the linearized
    tree), ``{split}.wlin`` (the same with the words in place of XX) and ``{split}.gold`` (the
    normalised tree, PTB bracketing, one per line)."""
    ptb_dir, dest = Path(ptb_dir), Path(dest)
    dest.mkdir(parents=True, exist_ok=True)
    counts = {}
    for split, (first, last) in PTB_SPLITS.items():
        trees = []
        for number in range(first, last + 1):
            path = ptb_dir / f"wsj_{number:04d}.mrg"
            if not path.exists():
                raise TreeError(f"{path}: missing (expected wsj_0001.mrg ... wsj_0189.mrg in {ptb_dir})")
            trees.extend(t for t in read_normalized(path) if t is not None)
        write_tree_files(trees, dest / split)
        counts[split] = len(trees)
    return counts


TREE_FILES = ("words", "lin", "wlin", "gold")  # the parsing task's files of a set of trees, by suffix


def write_tree_files(trees: list[Tree], prefix: Path) -> list[Path]:
    """The parsing task's files of ``trees`` (§6.3), one line a tree, at PREFIX.SUFFIX for each of TREE_FILES:
    the source (its words, separated by spaces), the target linearized with XX at the leaves, and with the words
    in their place, and the tree itself (PTB bracketing, as `evaluate --ref` reads it)."""
    paths = []
    for suffix, lines in zip(TREE_FILES, ([" ".join(t.words()) for t in trees], [" ".join(linearize(t)) for t in trees],
                                          [" ".join(linearize(t, words=True)) for t in trees], [str(t) for t in trees])):
        paths.append(prefix.with_name(f"{prefix.name}.{suffix}"))
        write_text(paths[-1], "".join(line + "\n" for line in lines))
    return paths


def resolve_data_path(path: str, field: str = "") -> Path:
    """A data file: absolute or existing as given, else under each data root in order.

    A missing Multi30k raw file ("multi30k/<file>") or tokenized reference ("multi30k/tok/<file>") is
    downloaded, so the recipes run from a fresh checkout; anything else missing is an error that lists
    where it was looked for, and names ``field`` (the config field or option that gave the path) first.
    """
    given = Path(path).expanduser()
    if given.exists():
        return given
    if given.is_absolute():
        raise _not_found(str(given), field)
    roots = _candidate_roots()
    for root in roots:
        if (root / given).exists():
            return root / given
    if (published := _published_multi30k(given)) is not None:
        return _download_multi30k(given, *published)
    if len(given.parts) == 2 and given.parts[0] == PTB_PARSE:
        return _build_ptb_parse(given.name, roots)
    # a config's relative path is read from the current folder: a file beside the config, run from elsewhere, is
    # not found, and the message said "./" alone
    beside = ", not from the config file's" if field.startswith("data.") else ""
    raise _not_found(path, field, f" (searched ./ = {Path.cwd()}{beside}, and {', '.join(map(str, roots))}; set "
                                  "TRANSFORMER_DATA to the folder that holds it, or give the path from ./ or whole)")


def _not_found(path: str, field: str, searched: str = "") -> DataError:
    """``resolve_data_path``'s error: the path as given (quoted where it holds control characters), and, for a
    config's data path, why it may hold them: a Windows path in a TOML "..." string, whose backslashes were
    escapes ("multi30k\\train" holds a tab)."""
    controls = any(unicodedata.category(c) == "Cc" for c in path)
    escaped = controls and field.startswith("data.") and any(c in "\b\t\n\f\r" for c in path)
    hint = "; in a TOML \"...\" string a backslash escapes: write the path with / or in '...'" if escaped else ""
    named = f"{field}: " if field else ""
    return DataError(f"{named}data file not found: {repr(path) if controls else path}{searched}{hint}")


def read_twice(path: Path, field: str) -> Path:
    """``path`` (``field``'s), refused unless a file: a training corpus is read twice, for the vocabulary and then
    for the pairs, and a named pipe gives its text once (the second read waited for ever for another writer)."""
    if path.is_dir():
        raise DataError(f"{field} {path}: a folder; give the training text's file")
    if not path.is_file():
        raise DataError(f"{field} {path}: a pipe or device, not a file; the training text is read twice (the "
                        "vocabulary, then the pairs): write it to a file first")
    return path


BASE_URL = "https://www.statmt.org/"


@dataclass(frozen=True)
class Corpus:
    """One parallel corpus: an archive (a path under the base URL) and its source and target members."""

    name: str
    archive: str
    src: str
    tgt: str


@dataclass(frozen=True)
class Dataset:
    src_lang: str
    tgt_lang: str
    train: tuple[Corpus, ...]
    valid: Corpus
    test: Corpus  # SGML (.sgm): the <seg> texts are extracted


# The corpora both WMT 2014 pairs draw on: archive and member prefix, completed by the pair ("de-en").
SHARED = {"europarl-v7": ("wmt13/training-parallel-europarl-v7.tgz", "training/europarl-v7"),
          "commoncrawl": ("wmt13/training-parallel-commoncrawl.tgz", "commoncrawl"),
          "news-commentary-v9": ("wmt14/training-parallel-nc-v9.tgz", "training/news-commentary-v9")}


def _wmt14(lang: str, *train: str | Corpus) -> Dataset:
    """English→``lang`` as WMT 2014 shipped it: the training corpora in order (a name from SHARED, or a
    corpus of this pair alone), newstest2013 to validate, newstest2014 to test."""
    pair = f"{lang}-en"
    corpora = tuple(c if isinstance(c, Corpus) else Corpus(c, SHARED[c][0], f"{SHARED[c][1]}.{pair}.en",
                                                           f"{SHARED[c][1]}.{pair}.{lang}") for c in train)
    return Dataset("en", lang, train=corpora,
                   valid=Corpus("newstest2013", "wmt14/dev.tgz", "dev/newstest2013.en", f"dev/newstest2013.{lang}"),
                   test=Corpus("newstest2014", "wmt14/test-full.tgz", f"test-full/newstest2014-{lang}en-src.en.sgm",
                               f"test-full/newstest2014-{lang}en-ref.{lang}.sgm"))


DATASETS = {
    "wmt14-en-de": _wmt14("de", "europarl-v7", "commoncrawl", "news-commentary-v9"),
    # The paper's 36M EN-FR pairs (§5.1); giga-fren's members are gzip files inside a plain tar.
    "wmt14-en-fr": _wmt14("fr", "europarl-v7", "commoncrawl",
                          Corpus("un", "wmt13/training-parallel-un.tgz", "un/undoc.2000.fr-en.en",
                                 "un/undoc.2000.fr-en.fr"),
                          "news-commentary-v9",
                          Corpus("giga-fren", "wmt10/training-giga-fren.tar", "giga-fren.release2.fixed.en.gz",
                                 "giga-fren.release2.fixed.fr.gz")),
}


@dataclass(frozen=True)
class Pinned:
    """What an archive must be: its size and digests as published by others who downloaded it."""

    bytes: int | None
    sha256: str | None
    md5: str | None


# Every archive prepare reads, pinned: size and sha256 from TensorFlow Datasets' url_checksums
# (wmt13_translate.txt, wmt14_translate.txt, wmt15_translate.txt); md5 from Sockeye's autopilot
# (RAW_FILES) and, for test-full.tgz, sacrebleu's dataset table. dev.tgz and test-full.tgz have no
# published sha256 that we know of: their md5 is what is checked.
ARCHIVES = {
    "wmt13/training-parallel-europarl-v7.tgz": Pinned(
        657632379,
        "0224c7c710c8a063dfd893b0cc0830202d61f4c75c17eb8e31836103d27d96e7",
        "c52404583294a1b609e56d45b2ed06f5"),
    "wmt13/training-parallel-commoncrawl.tgz": Pinned(
        918311367,
        "c7a74e2ea01ac6c920123108627e35278d4ccb5701e15428ffa34de86fa3a9e5",
        "7e0acbe86b0d7816300e14650f5b2bd4"),
    "wmt14/training-parallel-nc-v9.tgz": Pinned(
        80418416,
        "cb8953f292298e6877ae433c98912b927cb0766b303f4540512ddd286c748485",
        "92e42b68f9d3c2ae9722e6d1c2623e21"),
    "wmt13/training-parallel-un.tgz": Pinned(
        2365634246,
        "29141b5c1eba149a94f7a59d3b1a834b2e47fe0f8758d68dcd77a3d3f497ee47",
        "bb25a213ba9140023e4cc82c778bef53"),
    "wmt10/training-giga-fren.tar": Pinned(
        2595102720,
        "3ff8319f6919393520559bfbc7ad6a747ec81b3abc7be9993b338d4b017b4d9a",
        "0b12e20027d5b5f0dfcca290c72c8953"),
    "wmt14/dev.tgz": Pinned(None, None, "88ba3fc60b2278d59277122e1c7dd6e7"),
    "wmt14/test-full.tgz": Pinned(None, None, "a8cd784e006feb32ac6f3d9ec7eb389a"),
}


def check_archive(file: Path, pinned: Pinned) -> tuple[str, str | None]:
    """(the file's sha256, what differs from ``pinned`` or None), in one read of the file."""
    size = file.stat().st_size
    if pinned.bytes is not None and size != pinned.bytes:
        return "", f"{size:,} bytes, expected {pinned.bytes:,}"
    sha256, md5 = hashlib.sha256(), hashlib.md5()
    with open(file, "rb") as f, tqdm(total=size, unit="B", unit_scale=True, desc=f"checking {file.name}",
                                     disable=None) as bar:
        while block := f.read(1 << 22):
            sha256.update(block)
            md5.update(block)
            bar.update(len(block))
    for name, digest, expected in (("sha256", sha256, pinned.sha256), ("md5", md5, pinned.md5)):
        if expected is not None and digest.hexdigest() != expected:
            return sha256.hexdigest(), f"{name} {digest.hexdigest()}, expected {expected}"
    return sha256.hexdigest(), None


_SEG = re.compile(r"\s*<seg[^>]*>(.*)</seg>")
_ENTITY = re.compile(r"&(?:(amp|lt|gt|quot|apos)|#([0-9]+)|#[xX]([0-9a-fA-F]+));")
_NAMED = {"amp": "&", "lt": "<", "gt": ">", "quot": '"', "apos": "'"}


def _unescape(text: str) -> str:
    """XML's five entities and numeric references; nothing else (a bare "&" in text stays)."""
    def one(m: re.Match) -> str:
        if m.group(1):
            return _NAMED[m.group(1)]
        try:
            return chr(int(m.group(2)) if m.group(2) else int(m.group(3), 16))
        except (ValueError, OverflowError):
            return m.group(0)
    return _ENTITY.sub(one, text)


def read_sgm(path: Path) -> Iterator[str]:
    """The <seg> texts of a WMT SGML file, one per segment, XML entities unescaped.

    Whitespace is stripped and runs of it collapsed to one space, as sacrebleu does for the same
    files, so the references match `sacrebleu -t wmt14/full`; this also keeps an escaped newline
    (&#10;) from splitting a segment across two lines.
    """
    for line in iter_lines(path):
        if m := _SEG.match(line):
            yield re.sub(r"\s+", " ", _unescape(m.group(1))).strip()


def _download(url: str, path: Path, mirror: str | None) -> None:
    """``url`` to ``path``, atomically; a failure or a short read keeps nothing."""
    try:
        download(url, path)
    except DownloadError as e:
        hint = (f"check that --mirror {mirror} holds {path.name} where {url} names it" if mirror else
                "or pass a mirror (--mirror)")
        raise DataError(f"{e}; run prepare again to retry, {hint}") from None


def _extract(archive: Path, members: set[str], folder: Path) -> dict[str, Path]:
    """The named members of a tar archive (any compression), in one pass; the rest is not written.

    Only names from DATASETS are written, under ``folder``, so a hostile member name cannot
    escape it.
    """
    found: dict[str, Path] = {}
    try:
        with tarfile.open(archive, "r|*") as tar:  # a stream: one sequential read of a 1.5 GB .tgz
            for member in tar:
                name = member.name.removeprefix("./")
                if name in members and member.isfile():
                    target = folder / name
                    target.parent.mkdir(parents=True, exist_ok=True)
                    with tar.extractfile(member) as f, open(target, "wb") as out:  # type: ignore[union-attr]
                        shutil.copyfileobj(f, out, 1 << 20)
                    found[name] = target
                    if len(found) == len(members):
                        break
    except (tarfile.TarError, EOFError, zlib.error) as e:
        raise DataError(f"{archive}: corrupt or truncated archive ({e}); delete it to download it again") from None
    if missing := sorted(members - found.keys()):
        raise DataError(f"{archive}: no member {', '.join(missing)}; is it the archive from {BASE_URL}?")
    return found


def _write_split(dest: Path, split: str, langs: tuple[str, str],
                 corpora: Iterable[tuple[Corpus, Iterator[tuple[str, str]]]], log: Callable[[str], None]) -> dict:
    """Concatenates the pairs of ``corpora`` into dest/split.{src,tgt}, atomically; returns counts and hashes."""
    paths = [dest / f"{split}.{lang}" for lang in langs]
    digests = [hashlib.sha256(), hashlib.sha256()]
    total, per_corpus = 0, {}
    with atomic_path(paths[0]) as src_part, atomic_path(paths[1]) as tgt_part:
        with open(src_part, "wb") as src_out, open(tgt_part, "wb") as tgt_out:
            for corpus, pairs in corpora:
                n = 0
                for pair in pairs:
                    for text, out, digest in zip(pair, (src_out, tgt_out), digests):
                        data = (text + "\n").encode("utf-8")
                        out.write(data)
                        digest.update(data)
                    n += 1
                per_corpus[corpus.name] = n
                total += n
                log(f"{split}: {corpus.name}: {n:,} pairs")
    return {"outputs": {p.name: {"lines": total, "sha256": d.hexdigest()} for p, d in zip(paths, digests)},
            "corpora": per_corpus}


def prepare(name: str, dest: Path, mirror: str | None = None, log: Callable[[str], None] = print,
            pinned: dict[str, Pinned] = ARCHIVES) -> dict:
    """Downloads, checks and extracts dataset ``name`` (a key of DATASETS) into ``dest``; returns the manifest.

    Archives go to dest/downloads/ and are kept: a second run downloads only what is missing. Every
    archive, downloaded now or found there, is checked against ``pinned`` (ARCHIVES: size, sha256,
    md5): one found that differs is downloaded again, a download that differs is removed and refused.
    ``mirror`` replaces BASE_URL (an http(s)/file URL or a local folder holding wmt13/, wmt14/, ...).
    Every corpus is checked pair by pair: a side with more lines than the other is an error naming
    both members, never a silent zip that would misalign everything after it.
    """
    if name not in DATASETS:
        raise DataError(f"unknown dataset {name!r}; known: {', '.join(DATASETS)}")
    dataset, dest = DATASETS[name], Path(dest)
    base, folder = mirror or BASE_URL, None
    if "://" not in base:
        folder = Path(base).expanduser().resolve()
        if not folder.is_dir():  # found before any download, not as the first archive missing from it
            raise DataError(f"--mirror {mirror}: {'a file, not a folder' if folder.exists() else 'no such folder'} "
                            "(give a folder or a URL holding wmt13/, wmt14/, ...)")
        base = folder.as_uri()
    base = base.rstrip("/") + "/"
    corpora = (*dataset.train, dataset.valid, dataset.test)
    if folder is not None and (absent := sorted({c.archive for c in corpora if not (folder / c.archive).is_file()
                                                 and not (dest / "downloads" / Path(c.archive).name).is_file()})):
        # a local mirror lacks them: said before any work, not as "download failed ... run prepare again to retry"
        raise DataError(f"--mirror {mirror}: has no {', '.join(absent)} (a mirror holds each archive at its path "
                        f"under {BASE_URL})")
    (dest / "downloads").mkdir(parents=True, exist_ok=True)

    archives: dict[str, dict] = {}
    for corpus in corpora:
        file = dest / "downloads" / Path(corpus.archive).name
        if corpus.archive in archives:
            continue
        url = base + corpus.archive
        sha256, problem = check_archive(file, pinned[corpus.archive]) if file.exists() else ("", "missing")
        if problem is None:
            log(f"{file.name}: already downloaded and checked")
        else:
            if problem != "missing":
                log(f"{file}: {problem}: not the archive expected; downloading it again")
                file.unlink()
            log(f"downloading {url}")
            _download(url, file, mirror)
            sha256, problem = check_archive(file, pinned[corpus.archive])
            if problem is not None:
                file.unlink()
                raise DataError(f"{url}: not the archive expected ({problem}); removed it: run prepare again, "
                                "or check the mirror")
        archives[corpus.archive] = {"file": file.name, "url": url, "bytes": file.stat().st_size, "sha256": sha256}

    work = dest / ".extract"
    shutil.rmtree(work, ignore_errors=True)
    try:
        members: dict[tuple[str, str], Path] = {}
        for archive in archives.values():
            wanted = {m for c in corpora if Path(c.archive).name == archive["file"] for m in (c.src, c.tgt)}
            log(f"extracting {len(wanted)} files from {archive['file']}")
            for member, path in _extract(dest / "downloads" / archive["file"], wanted,
                                         work / archive["file"]).items():
                members[archive["file"], member] = path

        def pairs(corpus: Corpus, read: Callable[[Path], Iterator[str]] = iter_lines) -> Iterator[tuple[str, str]]:
            file = Path(corpus.archive).name
            return iter_parallel(members[file, corpus.src], members[file, corpus.tgt], read)

        langs = (dataset.src_lang, dataset.tgt_lang)
        splits = {"train": _write_split(dest, "train", langs, ((c, pairs(c)) for c in dataset.train), log),
                  "valid": _write_split(dest, "valid", langs, [(dataset.valid, pairs(dataset.valid))], log),
                  "test": _write_split(dest, "test", langs, [(dataset.test, pairs(dataset.test, read_sgm))], log)}
    finally:
        shutil.rmtree(work, ignore_errors=True)

    manifest = {"dataset": name, "outputs": {k: v for s in splits.values() for k, v in s["outputs"].items()},
                "corpora": {split: s["corpora"] for split, s in splits.items()},
                "archives": {a["file"]: {k: a[k] for k in ("url", "bytes", "sha256")} for a in archives.values()}}
    write_text(dest / "MANIFEST.json", json.dumps(manifest, indent=2) + "\n")
    log(f"{name}: {splits['train']['outputs'][f'train.{dataset.src_lang}']['lines']:,} training pairs in {dest}")
    return manifest
