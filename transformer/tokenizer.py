"""Joint source-target BPE vocabulary (§5.1), via sentencepiece.

§5.1: "Sentences were encoded using byte-pair encoding, which has a shared source-target vocabulary
of about 37000 tokens." One model is trained on source and target text together, so the three tied
embedding matrices of §3.4 index the same pieces.

The special ids are defined here and nowhere else. They follow the authors' code (IMPLEMENTATION-NOTES
A5): PAD = 0, EOS = 1, and no learned start symbol: the decoder input is the target shifted right
with a zero vector, which ``model.Embedding`` gives PAD (zeroed at lookup) when the start symbol *is* PAD.
"""

from __future__ import annotations

import hashlib
import io
import random
import re
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path

import sentencepiece as spm

from .errors import UserError
from .files import write_bytes

PAD_ID = 0  # also the decoder's start symbol: targets are shifted right with a zero vector (A5)
BOS_ID = PAD_ID
EOS_ID = 1
UNK_ID = 2

# sentencepiece stores every trainer flag in the model file, so a machine-dependent thread count
# would change the vocabulary hash of an otherwise identical model; 16 is sentencepiece's default.
_SPM_THREADS = 16


class TokenizerError(UserError, ValueError):
    """A user error with a tokenizer model or its training; the message names the file."""


SPM_SENTENCE_BYTES = 4192  # sentencepiece's default max_sentence_length: given only where a line is longer, since
# a flag given is stored in the model file, and a vocabulary is known by that file's sha256 (the same pieces from
# a file that differs in this field alone were refused as "another vocabulary" by --ensemble and token stores)


def _sample(sentences: Iterable[str], k: int, seed: int) -> list[str]:
    """Reservoir sample (Algorithm R) of k sentences, kept in input order.

    Done here rather than by sentencepiece's ``input_sentence_size`` because its sampler ignores
    ``set_random_generator_seed`` for iterator input (sentencepiece 0.2): the seed would do nothing.
    """
    rng = random.Random(seed)
    reservoir: list[tuple[int, str]] = []
    for i, s in enumerate(sentences):
        if i < k:
            reservoir.append((i, s))
        elif (j := rng.randrange(i + 1)) < k:
            reservoir[j] = (i, s)
    return [s for _, s in sorted(reservoir)]


def _spm_message(e: Exception) -> str:
    """sentencepiece's message without its 'INTERNAL: src/x.cc(744) [condition]' prefix."""
    message = re.sub(r"^\w+: \S+\(\d+\) \[.*?\]\s*", "", str(e).strip())
    return " ".join(message.split()) or "unreadable"


class Tokenizer:
    """A loaded sentencepiece BPE model with the project's special ids checked."""

    def __init__(self, model_path: Path) -> None:
        self.path = Path(model_path)
        try:
            blob = self.path.read_bytes()
        except OSError as e:
            raise TokenizerError(f"{self.path}: cannot read sentencepiece model ({e.strerror})") from None
        self._sp = spm.SentencePieceProcessor()
        try:
            self._sp.LoadFromSerializedProto(blob)
        except (RuntimeError, OSError) as e:
            raise TokenizerError(f"{self.path}: not a valid sentencepiece model ({_spm_message(e)})") from None
        ids = (self._sp.pad_id(), self._sp.eos_id(), self._sp.unk_id())
        if ids != (PAD_ID, EOS_ID, UNK_ID):
            raise TokenizerError(
                f"{self.path}: special ids (pad, eos, unk) are {ids}, expected {(PAD_ID, EOS_ID, UNK_ID)}; "
                "retrain it with Tokenizer.train")
        self._sha256 = hashlib.sha256(blob).hexdigest()

    @classmethod
    def train(cls, sentences: Iterable[str], model_path: Path, vocab_size: int, input_sentence_size: int,
              seed: int = 1, *, symbols: Sequence[str] = (), named: str = "the training text") -> Tokenizer:
        """Trains one joint BPE model (§5.1) on ``sentences`` (the lines of the training source and
        target files: ``data.iter_lines`` reads them; blank ones are left out).

        At most ``input_sentence_size`` non-empty sentences are used, sampled with ``seed``, so the model is a
        deterministic function of (data, vocab_size, input_sentence_size, seed). The model is
        written to a temporary file beside ``model_path`` and renamed, so a crash never leaves a
        half-written vocabulary that a later run would load. ``symbols`` are whitespace-delimited
        words kept whole, one piece each (the parsing task's brackets, which BPE would otherwise split
        at the change of script between "(" and the label). ``named``: what the sentences are, for the
        error when there are none.
        """
        given = 0  # non-empty sentences, sampled or not

        def counted() -> Iterator[str]:
            nonlocal given
            for s in sentences:
                if s.strip():
                    given += 1
                    yield s

        sample = _sample(counted(), input_sentence_size, seed)
        if not sample:
            raise TokenizerError(f"cannot train a tokenizer: {named} is empty (every line is blank)")
        spm.set_random_generator_seed(seed)
        writer = io.BytesIO()  # no model_prefix: the file path would otherwise be stored in the model
        # sentencepiece leaves out, without a word, sentences of more bytes than max_sentence_length (4,192 by
        # default): their characters became unknown pieces, and a file of such lines alone was "unreadable"
        longest = max(len(s.encode("utf-8")) for s in sample)
        long_lines = {"max_sentence_length": longest} if longest > SPM_SENTENCE_BYTES else {}
        try:
            spm.SentencePieceTrainer.train(
                sentence_iterator=iter(sample), model_writer=writer, model_type="bpe",
                vocab_size=vocab_size, pad_id=PAD_ID, eos_id=EOS_ID, unk_id=UNK_ID, bos_id=-1,
                character_coverage=1.0, input_sentence_size=0, num_threads=_SPM_THREADS, **long_lines,
                user_defined_symbols=sorted({"\u2581" + s for s in symbols}), minloglevel=2)
        except RuntimeError as e:
            message = _spm_message(e)
            if limit := re.search(r"value <= (\d+)", message):
                sampled = given > len(sample)  # the vocabulary is learnt from data.spm_input_sentences of them
                raise TokenizerError(
                    f"vocab_size {vocab_size} is too large for this training text ({len(sample)} "
                    f"sentence{'s' * (len(sample) != 1)}"
                    + (f", a sample of its {given} (data.spm_input_sentences)" if sampled else "")
                    + f"): sentencepiece allows at most {limit.group(1)}; lower data.vocab_size"
                    + (" or raise data.spm_input_sentences" if sampled else "")) from None
            if chars := re.search(r"smaller than required_chars\. \d+ vs (\d+)", message):  # its remedy is an option
                raise TokenizerError(  # of sentencepiece's, fixed here (character_coverage 1.0)
                    f"vocab_size {vocab_size} is too small for this training text: sentencepiece needs {chars.group(1)} "
                    "pieces for its characters alone; raise data.vocab_size (the BPE merges come on top)") from None
            raise TokenizerError(f"cannot train a tokenizer with vocab_size {vocab_size}: {message}") from None
        model_path = Path(model_path)
        model_path.parent.mkdir(parents=True, exist_ok=True)
        write_bytes(model_path, writer.getvalue())
        return cls(model_path)

    @property
    def vocab_size(self) -> int:
        """Number of pieces, the special ones included: the rows of the embedding matrix (§3.4)."""
        return self._sp.get_piece_size()

    @property
    def sha256(self) -> str:
        """Hash of the model file's bytes: checkpoints record it so a mismatched vocabulary is refused."""
        return self._sha256

    def encode(self, text: str) -> list[int]:
        """Piece ids of one sentence, without EOS (callers that feed the model append it)."""
        return self._sp.encode(text, out_type=int)

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        """``encode`` for many sentences at once, in sentencepiece's threads."""
        return self._sp.encode(list(texts), out_type=int)

    def decode(self, ids: Sequence[int]) -> str:
        """Text of a model output: PAD ids are dropped and everything from the first EOS on is cut."""
        return self._sp.decode(_kept(ids))

    def words(self, ids: Sequence[int]) -> list[str]:
        """The words of a model output (``decode``'s ids) as its pieces group them: a piece that starts with
        "\u2581" starts a word, and an unknown piece stays inside its word as "\u2047", where ``decode``'s
        text sets it apart with spaces. A parse's leaves are matched with its input's words so (§6.3): in
        text, "Zo\u00eb" written back as "Zo \u2047" was two words."""
        words: list[str] = []
        for i in _kept(ids):
            piece = "\u2047" if i == UNK_ID else self._sp.id_to_piece(i)
            if piece.startswith("\u2581") or not words:
                words.append(piece.removeprefix("\u2581"))
            else:
                words[-1] += piece
        return [w for w in words if w]

    def unknown(self, text: str) -> list[str]:
        """The characters of ``text`` that the vocabulary has no piece for (each once, in order), as its
        segmentation of the whole text finds them: on its own a character may lack a piece that it has inside
        a longer one (a parsing run's "(" exists only in "(S", "(NP", ...)."""
        ids = self._sp.encode(text, out_type=int)
        if UNK_ID not in ids:  # most texts: one segmentation, not two (score asks it of every pair)
            return []
        pieces = self._sp.encode(text, out_type=str)
        # the piece's own space marker aside; not every character Python calls a space (U+0085 has no piece)
        return list(dict.fromkeys(c for i, piece in zip(ids, pieces) if i == UNK_ID
                                  for c in piece.removeprefix("\u2581") if c not in " \u2581"))

    def vocabulary(self) -> list[str]:
        """Every piece, by id (PAD, EOS, UNK first): what an exported model's vocabulary file lists."""
        return [self._sp.id_to_piece(i) for i in range(self.vocab_size)]

    def pieces(self, text: str) -> list[str]:
        """Sub-word strings of one sentence (labels for attention figures)."""
        return self._sp.encode(text, out_type=str)

    def id_pieces(self, ids: Sequence[int]) -> list[str]:
        """The sub-word strings of ``ids`` (an output's own pieces, as labels); the unknown piece as the word
        ``decode`` writes for it, " ⁇ " (a word of its own: word alignments count the output's words)."""
        return ["\u2581\u2047" if i == UNK_ID else self._sp.id_to_piece(i) for i in ids]

    def dropout(self) -> BPEDropout:
        """A sampler of this vocabulary's segmentations (subword regularization in training)."""
        return BPEDropout(self._sp)


def _kept(ids: Sequence[int]) -> list[int]:
    """A model output's ids up to its first EOS, without PAD."""
    kept: list[int] = []
    for i in ids:
        i = int(i)
        if i == EOS_ID:
            break
        if i != PAD_ID:
            kept.append(i)
    return kept


class BPEDropout:
    """BPE-dropout (Provilkov et al., 2020) with this project's own seeded random numbers.

    sentencepiece samples segmentations too (``encode(enable_sampling=True)``), but its seed does not
    carry across processes (sentencepiece 0.2.3: ``set_random_generator_seed(5)`` gives another
    segmentation in every new process), so a resumed run could not replay its epochs. Here the words
    come from sentencepiece's own segmentation (its normalization and whitespace handling included) and
    are merged again as sentencepiece's BPE merges them: repeatedly the adjacent pair whose joined piece
    scores highest (the leftmost on ties), except that each chosen merge is dropped with probability
    ``alpha`` and never made at that place again. ``alpha`` = 0 gives sentencepiece's segmentation.
    """

    def __init__(self, sp: spm.SentencePieceProcessor) -> None:
        normal = [i for i in range(sp.get_piece_size())
                  if not (sp.is_control(i) or sp.is_unknown(i) or sp.is_unused(i) or sp.is_byte(i))]
        self._ids = {sp.id_to_piece(i): i for i in normal}
        self._score = {sp.id_to_piece(i): sp.get_score(i) for i in normal}
        self._paths: dict[str, list[tuple[tuple[str, ...], tuple[int, ...], int]]] = {}
        self._sp = sp

    def encode_batch(self, texts: list[str], alpha: float, rng: random.Random) -> list[list[int]]:
        """Sampled piece ids of each sentence; the draws come from ``rng`` in order, so the result is a
        function of (texts, alpha, the state of rng)."""
        out = []
        for pieces in self._sp.encode(list(texts), out_type=str):
            ids: list[int] = []
            for word in _words(pieces):
                for i in (self._ids.get(p, UNK_ID) for p in self._merge(word, alpha, rng)):
                    if not (i == UNK_ID and ids and ids[-1] == UNK_ID):  # a run of unknown characters is one
                        ids.append(i)  # UNK, as sentencepiece writes it
            out.append(ids)
        return out

    def _merge(self, word: str, alpha: float, rng: random.Random) -> list[str]:
        path = self._paths.get(word)
        if path is None:
            path = self._path(word)
            if len(self._paths) < _MAX_CACHED_WORDS:
                self._paths[word] = path
        *steps, final = path
        for symbols, starts, best in steps:  # sentencepiece's merges, as long as none is dropped
            if alpha and rng.random() < alpha:
                dropped = {(starts[best], len(symbols[best]), len(symbols[best]) + len(symbols[best + 1]))}
                return self._merge_from(list(symbols), list(starts), dropped, alpha, rng)
        return list(final[0])

    def _path(self, word: str) -> list[tuple[tuple[str, ...], tuple[int, ...], int]]:
        """The deterministic merges of ``word``: (symbols, their start offsets, the pair merged) before
        each, then the final symbols. Replaying it while no merge is dropped draws exactly what
        ``_merge_from`` would, so the cache changes the speed, never the result."""
        symbols, starts, path = list(word), list(range(len(word))), []
        while (best := self._best(symbols, starts, set())) >= 0:
            path.append((tuple(symbols), tuple(starts), best))
            symbols[best:best + 2] = [symbols[best] + symbols[best + 1]]
            del starts[best + 1]
        path.append((tuple(symbols), tuple(starts), -1))
        return path

    def _merge_from(self, symbols: list[str], starts: list[int], dropped: set[tuple[int, int, int]], alpha: float,
                    rng: random.Random) -> list[str]:
        """BPE-dropout from a state: each chosen merge is dropped with probability alpha, for good."""
        while (best := self._best(symbols, starts, dropped)) >= 0:
            if alpha and rng.random() < alpha:
                dropped.add((starts[best], len(symbols[best]), len(symbols[best]) + len(symbols[best + 1])))
                continue
            symbols[best:best + 2] = [symbols[best] + symbols[best + 1]]
            del starts[best + 1]
        return symbols

    def _best(self, symbols: list[str], starts: list[int], dropped: set[tuple[int, int, int]]) -> int:
        """The adjacent pair sentencepiece merges next: its joined piece scores highest, the leftmost on
        ties, among those not dropped (-1: none left)."""
        best, best_score = -1, 0.0
        for i in range(len(symbols) - 1):
            score = self._score.get(symbols[i] + symbols[i + 1])
            if score is not None and (best < 0 or score > best_score) and \
                    (starts[i], len(symbols[i]), len(symbols[i]) + len(symbols[i + 1])) not in dropped:
                best, best_score = i, score
        return best


_MAX_CACHED_WORDS = 1_000_000  # word types whose merges BPEDropout keeps (a few hundred bytes each)


def _words(pieces: list[str]) -> list[str]:
    """The whitespace-delimited words of a segmented sentence, each with its leading "\u2581"."""
    words: list[str] = []
    for piece in pieces:
        if piece.startswith("\u2581") or not words:
            words.append(piece)
        else:
            words[-1] += piece
    return words
