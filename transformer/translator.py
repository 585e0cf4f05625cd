"""A trained model ready to translate: rebuilt from a run folder's checkpoints alone (§6.1).

By default the weights are the average of the run's last ``decode.average_last`` checkpoints, as
the paper decodes (§6.1: last 5 for base, last 20 for big); ``checkpoint`` picks one file instead
(a training checkpoint or a file written by ``transformer average``).
"""

from __future__ import annotations

import contextlib
import math
import sys
import threading
import time
import weakref
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from pathlib import Path

import torch
from tqdm import tqdm

from .checkpoint import (Checkpoint, CheckpointError, CheckpointMismatch, average_last, checkpoint_record,
                         chosen_weights, list_checkpoints, load_checkpoint, load_weights, of_another_run,
                         record_config, run_folder, unrecorded_note)
from .config import (Config, ConfigError, LengthNorm, as_path, check_bools, check_count, check_sequence,
                     check_strings, set_section)
from .data import encode_for_decoding
from .errors import OutOfMemory, out_of_memory
from .decode import Scored, decode_ids, score_ids
from .ensemble import Ensemble
from .model import FloatWeights, Transformer, pack_for_inference
from .request import API, CLI, DecodeRequest, Setup, line_of, refuse_pairs
from .runtime import keep_freed_memory, native_bf16
from .tokenizer import UNK_ID, Tokenizer
from .trees import Tree, TreeConstraint, delinearize, ptb_escape


# ``Translator.evaluating``'s count of the calls decoding with each model, and the mode it had before them
_MODES = threading.Lock()
_DECODING: weakref.WeakKeyDictionary[torch.nn.Module, tuple[int, bool]] = weakref.WeakKeyDictionary()


def quantize_int8(model: Transformer) -> Transformer:
    """int8 dynamic quantization for CPU inference: every linear layer, the pre-softmax projection
    included, keeps int8 weights and quantizes its input per batch (activations stay fp32 between
    layers). A speed option, not part of the paper; benchmarks/speed.py measures its BLEU cost. ``model``
    itself is changed (its tied projection given a frozen copy of its own, as the quantized one needs): pass a
    copy to keep it.

    The decoder layers' projections also keep their float weights (``model.FloatWeights``): a decoding
    step of a few rows (batch 1) multiplies by those, where quantizing the input at every call costs
    more than the int8 product saves (``model.project``)."""
    import warnings

    from torch.ao.quantization import quantize_dynamic

    if "output_proj" not in model._modules:  # tied (§3.4): give the projection its own copy to quantize
        weight = model.target_embedding.weight.detach()
        with torch.random.fork_rng(devices=[]):  # its initial draws, replaced below, leave the host's generator be
            model.output_proj = torch.nn.Linear(weight.size(1), weight.size(0), bias=False)
        model.output_proj.weight = torch.nn.Parameter(weight.clone(), requires_grad=False)
    floats = {name: FloatWeights(m.weight.detach(), None if m.bias is None else m.bias.detach())
              for name, m in model.named_modules() if type(m) is torch.nn.Linear and name.startswith("decoder.")}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch's deprecation notice for its eager quantization API
        quantized = quantize_dynamic(model, {torch.nn.Linear}, dtype=torch.qint8)
    for name, weights in floats.items():
        quantized.get_submodule(name).float_weights = weights
    return quantized


class ModelOverflow(CheckpointError):
    """The model's scores are not finite whatever it is asked: weights that overflow the arithmetic (a server
    answers 500, not a request's 422)."""

    def __init__(self, where: str):
        super().__init__(f"{where}: the model's scores are not finite (NaN or inf), so no output could be ranked: its "
                         "weights overflow the arithmetic (a run trained at too high a rate, train.lr_scale?)")


class Output(str):
    """An output's text that keeps the pieces the search wrote, ``ids`` (no EOS): attention figures and word
    alignments of the model's own translation teacher-force these, where the text segmented again gives other
    pieces (the beam may spell a word in pieces that are not the vocabulary's own segmentation of it: "li la u
    te" for "lilaute"), or a parsing run's words where it wrote a tree. Anywhere else it is the str it reads as."""

    ids: tuple[int, ...]

    def __new__(cls, text: str, ids: Sequence[int]) -> Output:
        out = super().__new__(cls, text)
        out.ids = tuple(ids)
        return out

    def __reduce__(self) -> tuple:  # pickled and copied with its ids (str's own rebuilt it from the text alone)
        return Output, (str(self), self.ids)


class Translator:
    """Model + vocabulary + the run's decoding defaults, and what was fixed when loading them (int8 or bf16,
    an ensemble, the device, a parsing run's tree constraint: ``setup``); ``decode`` answers a
    ``request.DecodeRequest`` for lines, ``translate`` maps lines to lines, one for one."""

    def __init__(self, run_dir: Path, checkpoint: Path | None = None, log: Callable[[str], None] | None = None,
                 int8: bool = False, device: str | None = None, decode: dict[str, object] | None = None,
                 ensemble: Sequence[Path] = (), bf16: bool = False):
        """``device``: where the model decodes ("cpu", "cuda", "cuda:1"); default a GPU when there is
        one. int8 quantization runs on the CPU only. ``bf16``: the weights, and so every product and the
        keys and values kept, in bf16 (not in the paper; the search's scores stay fp32): half the bytes a
        step reads, for a GPU's bf16 products (on a CPU with bf16 instructions but no AMX its many small
        bf16 calls cost more than fp32's: benchmarks/bf16_decode.py); a processor without bf16 arithmetic
        emulates it, and loading says so. ``decode``: ``decode.*`` fields that replace the
        run's own (the server's --beam, --alpha, ...: the defaults of its requests; --unconstrained).
        ``ensemble``: more run folders whose models decode together with this one (``ensemble.Ensemble``),
        each from its own averaged weights; they must have been trained with the same vocabulary, for the same
        task and languages. The decoding defaults are this run's. ``log``: what loading does (default: to
        stderr). Loading sets the whole process's allocator to keep freed memory (``runtime.keep_freed_memory``),
        as decoding's repeated allocations want: a host program's freed memory stays mapped too."""
        run_dir = as_path(run_dir, "run_dir")
        checkpoint = None if checkpoint is None else as_path(checkpoint, "checkpoint")
        if log is not None and not callable(log):  # else an error at the first thing loading says
            raise ConfigError(f"log: a function of one message (str), not {type(log).__name__} {log!r}")
        if log is None:  # what loading did, on stderr as the command line says it: stdout is for translations
            def log(message: str) -> None:
                print(message, file=sys.stderr)
        check_bools(int8=int8, bf16=bf16)
        if isinstance(ensemble, (str, Path)):  # one folder, read one character a folder
            raise ConfigError(f"ensemble: a list of run folders, not one ({str(ensemble)!r}): put it in a list")
        check_sequence(ensemble, "ensemble", "a list of run folders")
        keep_freed_memory()
        if device is None:
            device = "cuda" if torch.cuda.is_available() and not int8 else "cpu"
        try:
            torch_device = torch.device(device)
        except RuntimeError:  # torch's message lists some twenty device types, which this package does not decode on
            raise CheckpointError(f"--device {device}: give cpu, cuda or cuda:N") from None
        if torch_device.type not in ("cpu", "cuda"):  # mps, meta, xpu...: this package decodes on neither
            raise CheckpointError(f"--device {device}: give cpu, cuda or cuda:N")
        refuse_pairs(Setup(int8, bool(ensemble), device=device, bf16=bf16).options(),
                     CLI | {"device": f"--device {device}"})
        gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if torch_device.type == "cuda" and not gpus:
            raise CheckpointError(f"--device {device}: no CUDA GPU is visible to torch {torch.__version__}")
        if torch_device.type == "cuda" and (torch_device.index or 0) >= gpus:
            visible = "1 CUDA GPU (cuda:0)" if gpus == 1 else f"{gpus} CUDA GPUs (cuda:0 .. cuda:{gpus - 1})"
            raise CheckpointError(f"--device {device}: torch sees {visible}")
        tokenizer = _tokenizer(run_dir)
        cfg, model, self.weights_from, self.weights_record, self.weights_of_another_run = _load_model(
            run_dir, checkpoint, tokenizer, decode, log)
        models = [model]
        self.ensemble_from: list[tuple[Path, list[Path]]] = []  # each --ensemble run and its weight files
        for other in (as_path(member, "ensemble: a run folder") for member in ensemble):
            try:
                theirs = _tokenizer(other)
            except CheckpointError as e:  # "x: no such folder", said with the option that named it
                raise CheckpointError(f"--ensemble {e}") from None
            if theirs.sha256 != tokenizer.sha256:
                raise CheckpointError(f"--ensemble {other}: trained with another vocabulary than {run_dir} "
                                      "(spm.model differs); an ensemble's models must share theirs")
            own, member, read, *_ = _load_model(other, None, tokenizer, None, lambda m, o=other: log(f"{o}: {m}"))
            # a joint vocabulary is the same file both ways: the task and direction say what a model computes
            task, mine = (_task(c.data.task, c.data.src_lang, c.data.tgt_lang) for c in (own, cfg))
            if task != mine:
                raise CheckpointError(f"--ensemble {other}: trained for {task}, {run_dir} for {mine}; an "
                                      "ensemble's models must do the same task")
            models.append(member)
            self.ensemble_from.append((other.resolve(), read))
        if bf16:
            if not native_bf16(torch_device):
                log(f"--bf16: this {'CPU' if torch_device.type == 'cpu' else 'GPU'} has no bf16 arithmetic of its own "
                    "(AVX512-BF16 or AMX; a GPU since Ampere): emulated, slower than fp32 here")
            models = [m.to(torch.bfloat16) for m in models]
        if int8:
            models = [quantize_int8(m) for m in models]
        elif torch_device.type == "cpu":  # loaded to decode, never trained: the weights can be packed once
            for m in models:
                pack_for_inference(m)
        self._hold(models[0] if len(models) == 1 else Ensemble(models), tokenizer, cfg, torch_device, int8)
        for m in models:  # on their device now, and never trained again
            m.keep_step_weights()

    @classmethod
    def of_model(cls, model: Transformer, tokenizer: Tokenizer, cfg: Config) -> Translator:
        """A model in memory with its run's vocabulary and config (training's dev BLEU): it decodes
        requests as the run's folder, loaded, would."""
        for name, value, kind in (("model", model, torch.nn.Module), ("tokenizer", tokenizer, Tokenizer),
                                  ("cfg", cfg, Config)):
            if not isinstance(value, kind):
                raise ConfigError(f"of_model: {name} a {kind.__name__}, not {type(value).__name__} {value!r:.60}")
        translator = cls.__new__(cls)
        translator.weights_from, translator.ensemble_from, translator.weights_record = [], [], None  # from no file
        translator.weights_of_another_run = False
        translator._hold(model, tokenizer, cfg, next(model.parameters()).device, int8=False)
        return translator

    def _hold(self, model: torch.nn.Module, tokenizer: Tokenizer, cfg: Config, device: torch.device,
              int8: bool) -> None:
        self.model, self.tokenizer, self.cfg, self.device = model.to(device), tokenizer, cfg, device
        self.constraint = None
        if cfg.data.task == "parse" and cfg.decode.constrained:
            self.constraint = TreeConstraint(tokenizer.vocabulary())
        bf16 = next(model.parameters()).dtype == torch.bfloat16
        self.setup = Setup(int8, isinstance(model, Ensemble), self.constraint is not None, str(device), bf16)

    @contextlib.contextmanager
    def evaluating(self) -> Iterator[None]:
        """The model in evaluation mode while it decodes or scores, then as it was: a model in training
        (``of_model``'s, under training) drew dropout masks at every step, and answered at random. Calls from
        several threads, of one translator or of two over one model: the first sets it, the last gives it back
        (each its own restore left a model in training as it was before, or in evaluation mode)."""
        model = self.model
        with _MODES:
            count, was_training = _DECODING.get(model, (0, model.training))
            _DECODING[model] = count + 1, was_training
            model.eval()
        try:
            yield
        finally:
            with _MODES:
                count, was_training = _DECODING.pop(model)
                if count > 1:
                    _DECODING[model] = count - 1, was_training
                else:
                    model.train(was_training)

    def as_read(self, line: str) -> str:
        """A source line as the model reads it: on a parsing run, its brackets as the treebank writes them, the
        words it was trained on (§6.3: "(" is the word -LRB-)."""
        if self.cfg.data.task == "parse":
            return " ".join(map(ptb_escape, line.split()))
        return line

    def unknown(self, text: str, *, source: bool) -> list[str]:
        """The characters of a source or target text that the vocabulary has no piece for (each once, in order):
        a source's as the model reads it (``as_read``), so that a parsing run's brackets are not among them."""
        return self.tokenizer.unknown((self.as_read(text) if source else text).strip())

    def text_of(self, ids: Sequence[int]) -> str:
        """An output's text; a parsing run's as its words (``Tokenizer.words``), which ``trees`` matches with
        its input's."""
        if self.cfg.data.task == "parse":
            return " ".join(self.tokenizer.words(list(ids)))
        return self.tokenizer.decode(list(ids))

    def trees(self, lines: list[str], outputs: list[str]) -> list[tuple[Tree | None, bool]]:
        """A parsing run's trees of decoded ``outputs``, with the words of their input ``lines`` (§6.3), each with
        whether its output was a well-formed tree of them (``trees.delinearize``, which repairs the others): the
        leaves are matched with the words as the model writes them (``Tokenizer.words``). A blank line has no
        tree (None)."""
        if self.cfg.data.task != "parse":  # its outputs are sentences: "trees" of them would be made up
            raise ConfigError(f"trees: a translation run (data.task = {self.cfg.data.task!r}); trees are a parsing "
                              "run's")
        check_strings(lines, "lines")
        check_strings(outputs, "outputs")
        if len(lines) != len(outputs):  # zip would cut the longer
            raise ConfigError(f"trees: {len(lines)} lines but {len(outputs)} outputs (one output a line)")
        trees = []
        for line, out in zip(lines, outputs):
            words = line.split()
            pieces = self.tokenizer.encode_batch([self.as_read(w) for w in words]) if words else []
            if not any(pieces):  # a blank line to the model (zero-width spaces alone): no tree, as ``blank`` says
                words, pieces = [], []
            trees.append(delinearize(out.split(), words, written=[self.tokenizer.words(ids) for ids in pieces]))
        return trees

    def translate(self, lines: list[str], request: DecodeRequest = DecodeRequest(),
                  progress: bool = False) -> list[str]:
        """One output line per input line, in order (``decode``'s first output of each); an empty line
        gives an empty line. An n-best request is refused (its lists would be searched, then dropped): ``decode``
        gives them."""
        check_strings(lines, "lines")  # a generator or one string: refused as decode refuses them
        if self.check(request, total=len(lines)).nbest not in (None, 1):  # the request's own checks first
            raise ConfigError(f"translate: nbest {request.nbest}: one output a line; decode gives each line's "
                              "n-best list, best first (decode(lines, request)[i][0] is line i's best)")
        return [hyps[0][0] for hyps in self.decode(lines, request, progress)]

    def blank(self, lines: list[str]) -> list[bool]:
        """Which lines hold nothing to translate: no piece once the vocabulary's normalisation has run (empty,
        spaces, or characters it makes spaces, such as zero-width spaces). ``decode`` answers them with empty
        outputs, the ``score`` command leaves them out of its perplexity, and a prefix or constraint for one is
        refused."""
        check_strings(lines, "lines")
        return [not ids for ids in self.tokenizer.encode_batch([line.strip() for line in lines])]

    def decode(self, lines: list[str], request: DecodeRequest = DecodeRequest(),
               progress: bool = False, stop: Callable[[], bool] | None = None) -> list[list[tuple[str, float]]]:
        """For each input line, in order, its outputs with their scores (log P / lp(|Y|), as the beam
        ranks them), best first: ``request.nbest`` of them (one without), by beam search (greedy at beam
        1) or, with ``request.sample``, drawn; each starts with its line's prefix and holds its line's
        constraints. The request is checked first (``check``). A blank line's (``blank``) outputs are all ("", 0.0).
        ``progress`` shows a bar of sentences on stderr. ``stop`` is asked before each batch and search step;
        True ends the work with ``search.Stopped`` (the server's request whose client has gone)."""
        check_strings(lines, "lines")
        return next(self.stream([lines], request, progress, total=len(lines), stop=stop))[1]

    def stream(self, chunks: Iterable[list[str]], request: DecodeRequest = DecodeRequest(),
               progress: bool = False, total: int | None = None, checked: Callable[[], None] | None = None,
               stop: Callable[[], bool] | None = None) -> Iterator[tuple[list[str], list[list[tuple[str, float]]]]]:
        """``decode`` for input that comes a chunk of lines at a time (a long file, a terminal): each chunk
        with its outputs as soon as it is decoded, so that the caller writes them while the rest is read. The
        request's prefixes and constraints run on through the chunks (line i of the input has the i-th), and
        so does one generator of draws (a seed gives one sequence of draws, not the same again in every
        chunk). ``total``: the number of input lines when it is known; the request is checked against it
        here, before anything is read or decoded. Otherwise the prefixes and constraints are counted as the
        lines come, and a line without its own, or fewer lines than them, is a ConfigError then.
        ``checked`` is called once the first chunk has passed its checks, before it is decoded (or once the
        input turns out empty): the command line says then what it loaded, so that an error in the first
        lines comes alone. ``stop``: as ``decode``'s."""
        if not isinstance(chunks, Iterable) or isinstance(chunks, (str, bytes)):  # None: a TypeError when first read
            raise ConfigError(f"chunks: an iterable of lists of lines, not {type(chunks).__name__}")
        check_bools(progress=progress)  # "no" drew a bar
        if stop is not None and not callable(stop):  # a TypeError between two batches
            raise ConfigError(f"stop: a function of no argument that says whether to stop, not {stop!r}")
        self._checked(request, None, CLI, total)
        return self._stream(chunks, request, progress, total, checked or (lambda: None), stop)

    def _stream(self, chunks: Iterable[list[str]], request: DecodeRequest, progress: bool, total: int | None,
                checked: Callable[[], None], stop: Callable[[], bool] | None
                ) -> Iterator[tuple[list[str], list[list[tuple[str, float]]]]]:
        sampling = request.sampling(self.device)
        done = 0  # input lines decoded so far
        with self.evaluating(), tqdm(total=total, desc="translate", unit="sent", disable=not progress,
                                      mininterval=1.0) as bar:
            for lines in chunks:
                check_strings(lines, f"lines {done + 1} on")
                part = request.lines(done, done + len(lines))
                for key, given in part.per_line().items():
                    if len(given) < len(lines):
                        raise ConfigError(f"{CLI[key]}: {done + len(given)} given, for more input lines (line "
                                          f"{done + len(given) + 1} has none)")
                part, (sources, prefixes, phrases) = self._checked(part, lines, CLI, first=done)  # type: ignore[misc]
                if not done:
                    checked()
                search = {} if part.sample else {"beam_size": part.beam_size, "early_stop": part.early_stop}
                # blank lines (EOS alone) are answered without decoding, as the server leaves them out: in a
                # batch they would take its places and draws of the sampling generator from the other lines
                keep = [i for i, src in enumerate(sources) if len(src) > 1]
                kept = set(keep)
                with torch.inference_mode(), _int8_overflow(f"lines {done + 1} to {done + len(lines)}"), \
                        naming_the_longest([len(src) if i in kept else 0 for i, src in enumerate(sources)], done):
                    decoded = decode_ids(self.model, [sources[i] for i in keep], alpha=part.alpha,
                                         length_norm=part.length_norm, max_len_offset=part.max_len_offset,
                                         batch_size=part.batch_size, bar=bar, constraint=self.constraint,
                                         nbest=part.nbest or 1, sampling=sampling, stop=stop,
                                         prefixes=None if prefixes is None else [prefixes[i] for i in keep],
                                         constraints=None if phrases is None else [phrases[i] for i in keep],
                                         **search)
                bar.update(len(lines) - len(keep))
                outputs: list[list[tuple[str, float]]] = [[(Output("", ()), 0.0)] * (part.nbest or 1) for _ in lines]
                for i, hyps in zip(keep, decoded):
                    if not hyps or any(math.isnan(h.score) for h in hyps):  # else ranked: the scores are not numbers
                        raise ModelOverflow(f"line {done + i + 1}")
                    outputs[i] = [(Output(self.text_of(h.tokens), h.tokens), h.score) for h in hyps]
                done += len(lines)
                yield lines, outputs
        if not done:
            checked()
        for key, given in request.per_line().items():
            if len(given) != done:
                raise ConfigError(f"{CLI[key]}: {len(given)} given for {done} input line{'s' * (done != 1)}")

    def check(self, request: DecodeRequest, lines: list[str] | None = None,
              names: Mapping[str, str] = CLI, total: int | None = None) -> DecodeRequest:
        """ConfigError (one line, options spelt as ``names`` spells them) for what ``decode`` would refuse,
        before any decoding: the request against the table of options with this translator's ``setup``
        (``DecodeRequest.verify``) and, given ``lines`` (or only their number, ``total``), its prefixes and
        constraints against them. Returns the request with the run's defaults filled in
        (``DecodeRequest.resolve``)."""
        return self._checked(request, lines, names, total)[0]

    def _checked(self, request: DecodeRequest, lines: list[str] | None, names: Mapping[str, str],
                 total: int | None = None, first: int = 0
                 ) -> tuple[DecodeRequest, tuple[list[list[int]], list[list[int]] | None,
                                                 list[list[list[int]]] | None] | None]:
        """``check``, and the lines encoded (``_encode``; ``first``: the input line number of lines[0] less
        one, for its errors) when given. Beyond ``DecodeRequest.verify``, what the model bounds: a beam no
        wider than the vocabulary (all that the first step can offer: a wider one only costs), outputs no
        longer than the model's positions beyond their input."""
        if not isinstance(request, DecodeRequest):  # None or a dict: `request.verify` was an AttributeError
            raise ConfigError(f"request: a DecodeRequest, not {type(request).__name__} (leave it out for the run's "
                              "own settings, or give DecodeRequest(...) with the fields to change)")
        if lines is not None:  # a str was its characters' lines
            check_strings(lines, "lines")
        if total is not None:
            check_count(total, "total: the number of input lines", 0)
        request.verify(self.setup, self.cfg.decode, total if lines is None else len(lines), names)
        members = self.model.models if isinstance(self.model, Ensemble) else [self.model]
        # an ensemble's fewest: its first run's alone accepted an offset in one order and refused it in another
        vocab, positions = self.tokenizer.vocab_size, min(m.cfg.max_positions for m in members)
        if request.beam_size is not None and request.beam_size > vocab:
            raise ConfigError(f"{names['beam']} {request.beam_size}: wider than the vocabulary ({vocab} pieces), "
                              "all that the first step can offer")
        if request.max_len_offset is not None and request.max_len_offset > positions:
            raise ConfigError(f"{names['max_len_offset']} {request.max_len_offset}: more than the model's "
                              f"{positions} positions (model.max_positions)")
        request = request.resolve(self.cfg.decode)
        return request, None if lines is None else self._encode(lines, request, names, first)

    def _encode(self, lines: list[str], request: DecodeRequest, names: Mapping[str, str], first: int = 0
                ) -> tuple[list[list[int]], list[list[int]] | None, list[list[list[int]]] | None]:
        """Sources (with EOS), prefixes and constraint phrases as piece ids, checked to fit the outputs'
        maximum length (input length + max_len_offset, EOS included) and, on a parsing run, each line's
        tree (after its prefix) to fit it: ConfigError naming the line (``request.line_of``)."""
        sources = encode_for_decoding([self.as_read(line) for line in lines], self.tokenizer)
        forced = None if request.prefixes is None else [self.tokenizer.encode(p.strip()) for p in request.prefixes]
        phrases = None if request.constraints is None else [  # a phrase given twice is met once, and counted once
            [list(p) for p in dict.fromkeys(tuple(self.tokenizer.encode(c.strip())) for c in cs if c.strip())]
            for cs in request.constraints]
        limit = self.model.max_output_length  # a learned position table's rows (Table 3 row E), else None

        def at(i: int, key: str = "") -> str:  # line i, or its prefix or constraints, as an error names it
            return line_of(names, first + i, key)

        for i, src in enumerate(sources):  # room for the EOS is needed too
            if limit is not None and len(src) > limit:
                raise ConfigError(f"{at(i)}: {len(src)} pieces with EOS, more than the model's learned "
                                  f"positions (model.max_positions = {limit}): give a shorter sentence")
            if len(src) == 1:  # blank (EOS alone): answered with an empty line, a prefix or constraint dropped
                for key, given in (("prefix", forced), ("constraints", phrases)):
                    if given is not None and given[i]:
                        raise ConfigError(f"{at(i, key)}: its input line is empty or blank, and such a line gets "
                                          f"an empty output, which cannot hold its {key}")
                continue
            end = len(src) + request.max_len_offset  # search.max_lengths: the output's positions, EOS included
            room = (end if limit is None else min(end, limit)) - 1
            bound = ("input length + max_len_offset" if limit is None or end <= limit
                     else f"the model's learned positions, model.max_positions = {limit}")
            for key, texts, given in (("prefix", request.prefixes, forced and [forced[i]]),
                                      ("constraints", request.constraints, phrases and phrases[i])):
                if given and any(UNK_ID in ids for ids in given):  # the output would hold "⁇", not the text
                    parts = [texts[i]] if key == "prefix" else texts[i]  # each as it was encoded
                    lacking = dict.fromkeys(c for part in parts for c in self.unknown(part, source=False))
                    raise ConfigError(f"{at(i, key)}: the model's vocabulary has no piece for "
                                      f"{', '.join(map(repr, lacking))}, so no output can hold the {key} as written: "
                                      "leave these characters out or replace them")
            if phrases is not None and [] in phrases[i]:  # else dropped, and the request answered without it
                gone = [c for c in request.constraints[i] if c.strip() and not self.tokenizer.encode(c.strip())]
                raise ConfigError(f"{at(i, 'constraints')}: {', '.join(map(repr, gone))} is nothing once "
                                  "the vocabulary normalises it (no output could show that it was met): leave it out")
            if forced is not None and len(forced[i]) > room:
                raise ConfigError(f"{at(i, 'prefix')}: {len(forced[i])} pieces, but outputs of this "
                                  f"input hold at most {room} ({bound})")
            if phrases is not None and sum(map(len, phrases[i])) > room:
                raise ConfigError(f"{at(i, 'constraints')}: {sum(map(len, phrases[i]))} pieces "
                                  f"together, but outputs of this input hold at most {room} ({bound})")
            if forced and phrases and forced[i] and phrases[i]:
                after = sum(pieces_after(forced[i], p) for p in phrases[i])
                if len(forced[i]) + after > room:
                    raise ConfigError(f"{at(i, 'prefix')} and {at(i, 'constraints')}: the prefix's {len(forced[i])} "
                                      f"pieces and the {after} the constraints add after it need "
                                      f"{len(forced[i]) + after}, but outputs of this input hold at most {room} "
                                      f"({bound})")
            if self.constraint is not None:
                prefix = [] if forced is None else forced[i]
                why = self.constraint.refuses(src, prefix, room + 1)
                if why is not None and prefix:
                    raise ConfigError(f"{at(i, 'prefix')} on a parsing run: {why}")
                if why is not None:
                    raise ConfigError(f"{at(i)} on a parsing run: {why}, {room + 1} pieces with EOS "
                                      f"(its input's length + {names['max_len_offset']} {request.max_len_offset})")
        return sources, forced, phrases

    def score(self, sources: list[str], targets: list[str], alpha: float | None = None,
              max_tokens: int = 8192, length_norm: LengthNorm | None = None) -> list[Scored]:
        """How the model scores given translations (forced decoding), pair by pair: ``Scored`` with the
        beam's length-normalised score (the run's ``alpha`` and ``length_norm`` unless given), log
        P(target | source) and each piece's log-prob (EOS last); ``max_tokens`` target positions at most
        per batch (``decode.score_ids``). An empty source with an empty target scores 0, its EOS certain,
        as ``decode`` answers an empty line: score(line, translate(line)) is translate's score for every line
        whose output's pieces are the vocabulary's own segmentation of its text (in fp32, to about 1e-5: the
        kernels follow the batch's shape; an int8 model's products
        depend on how many rows a step has: ``model.project``); the text is segmented again here, and an output
        the beam spelt in other pieces (about 1% of lines) scores lower. Empty
        here and there is blank (``blank``): no piece once the vocabulary's normalisation has run."""
        check_strings(sources, "sources")
        check_strings(targets, "targets")
        max_tokens = check_count(max_tokens, "max_tokens", 1)  # numpy's too, as the request's whole numbers are taken
        if len(sources) != len(targets):
            raise ConfigError(f"{len(sources)} sources but {len(targets)} targets")
        # checked as the command line checks them: a length_norm of another name was gnmt without a word
        DecodeRequest(alpha=alpha, length_norm=length_norm).verify(names=API)
        ids = encode_for_decoding([self.as_read(s) for s in sources], self.tokenizer)  # as decode reads them
        target_ids = [self.tokenizer.encode(t.strip()) for t in targets]
        with self.evaluating(), _int8_overflow(f"pairs 1 to {len(sources)}"):
            scored = score_ids(self.model, ids, target_ids, self.cfg.decode.alpha if alpha is None else alpha,
                               max_tokens, length_norm or self.cfg.decode.length_norm)
        if (bad := next((i for i, s in enumerate(scored) if math.isnan(s.log_prob)), None)) is not None:
            raise ModelOverflow(f"pair {bad + 1}")  # printed, "nan" was taken for a score
        return [Scored(0.0, 0.0, [0.0]) if len(src) == 1 and not tgt else s
                for src, tgt, s in zip(ids, target_ids, scored)]


def _task(task: str, src_lang: str, tgt_lang: str) -> str:
    """What a run's model computes, as an error says it: "en->de translation", "words->tree parsing"."""
    return f"{src_lang}->{tgt_lang} " + ("translation" if task == "translate" else "parsing")


@contextlib.contextmanager
def _int8_overflow(where: str) -> Iterator[None]:
    """An int8 model's quantization of values that are not finite (weights that overflow the arithmetic) as the
    ModelOverflow fp32 and bf16 raise: torch's own error was an internal error."""
    try:
        yield
    except RuntimeError as e:
        if "ChooseQuantizationParams" not in str(e):
            raise
        raise ModelOverflow(where) from None


@contextlib.contextmanager
def naming_the_longest(lengths: list[int], done: int, doing: str = "decoding", unit: str = "pieces",
                       lower: str | None = "the batch (--batch-size)") -> Iterator[None]:
    """An allocation the machine cannot make while these lines (input lines ``done`` + 1 on, each of ``lengths``
    ``unit``; 0: not at work) are worked on (a very long one: attention over it asks for terabytes) as one line
    that names the longest of them, the line to shorten or split."""
    try:
        yield
    except Exception as e:
        if (asked := out_of_memory(e)) is None or not any(lengths):
            raise
        i = max(range(len(lengths)), key=lengths.__getitem__)
        raise OutOfMemory(f"out of memory{f' ({asked})' if asked else ''}: more than this machine can give, {doing} "
                          f"input lines {done + 1}-{done + len(lengths)}, whose longest is line {done + i + 1} "
                          f"({lengths[i]:,} {unit}): shorten or split that line"
                          + (f", or lower {lower}" if lower else "")) from None


def pieces_after(prefix: list[int], phrase: list[int]) -> int:
    """The fewest pieces an output starting with ``prefix`` needs after it to hold ``phrase`` whole: none
    when the prefix holds it, else the phrase less the longest end of the prefix that starts it."""
    n = len(phrase)
    if any(prefix[j:j + n] == phrase for j in range(len(prefix) - n + 1)):
        return 0
    return n - max((k for k in range(1, min(n, len(prefix) + 1)) if prefix[-k:] == phrase[:k]), default=0)


def _tokenizer(run_dir: Path) -> Tokenizer:
    spm_path = run_folder(run_dir) / "spm.model"
    if not spm_path.is_file():
        raise CheckpointError(f"{run_dir}: not a run folder (no spm.model); train one with `transformer train`")
    return Tokenizer(spm_path)


def _read_settled(path: Path, tries: int = 3) -> Checkpoint:
    """``path``'s checkpoint, read again where it did not match its record: best.safetensors rewritten by a run
    still training (its tensors replaced a moment before its record) read as "corrupt" one load in a thousand."""
    for _ in range(tries - 1):
        try:
            return load_checkpoint(path, with_state=False)
        except CheckpointError as e:
            if "sha256 mismatch" not in str(e):
                raise
            time.sleep(0.2)  # the writer's next rename
    return load_checkpoint(path, with_state=False)


def _load_model(run_dir: Path, checkpoint: Path | None, tokenizer: Tokenizer, decode: dict[str, object] | None,
                log: Callable[[str], None]) -> tuple[Config, Transformer, list[Path], dict | None, bool]:
    """The run's config (with the ``decode`` overrides, validated), its model in eval mode, with the weights of
    ``checkpoint`` or else the average of its last ``decode.average_last`` checkpoints (§6.1), the weight
    files those were (a run still training prunes and writes them: what was read is said, not listed again),
    and ``checkpoint``'s record as read (best.safetensors is rewritten as the run goes on: its step and hash
    say which it was), None for an average; and whether ``checkpoint`` is of another run than ``run_dir`` (the
    export's card says so)."""
    checkpoint = chosen_weights(run_dir, checkpoint)
    if checkpoint is None:
        paths = list_checkpoints(run_dir)
        if not paths:
            raise CheckpointError(f"{run_dir}/checkpoints: no checkpoints (train the run first, or give --checkpoint)")
        meta = checkpoint_record(paths[-1])  # its weights are verified as they are averaged
    else:
        try:
            ckpt = _read_settled(Path(checkpoint))
        except CheckpointError as e:  # its messages name the file: say which option gave it
            said = str(e).removeprefix(f"{checkpoint}: ")  # the option names it already
            raise CheckpointError(f"--checkpoint {checkpoint}: {said}") from None
        meta = ckpt.meta
    if meta.get("vocab_sha256") not in (None, tokenizer.sha256):
        # --checkpoint as its other refusals name it; else the newest checkpoint, whose record was read (the run
        # folder named no file to remove)
        named = paths[-1] if checkpoint is None else f"--checkpoint {checkpoint}"
        raise CheckpointError(f"{named}: trained with another vocabulary than {run_dir / 'spm.model'}")
    foreign = checkpoint is not None and of_another_run(run_dir, meta)
    if foreign:  # of the same vocabulary: decoded, as asked
        log(f"note: --checkpoint {checkpoint} is of another run than {run_dir} (its record's run_id): decoded with "
            "the model its record describes")
    record = ckpt.path if checkpoint is not None else paths[-1]  # the .json (a .state.safetensors names its own)
    cfg = record_config(meta, record)
    try:  # the overrides typed as a config file's values are, and checked before any work: one set of checks for
        set_section(cfg, "decode", decode or {}, "decode")  # the run's values and ours
        cfg.validate()
    except ConfigError as e:  # an override's error, the run's values having passed: named as its option (serve's)
        said = str(e)
        # a field's error (an unknown key's and its hint stay a config's: "did you mean --beam?" named no field;
        # told by where it stands, not by its words: a value holding "unknown key" was not renamed)
        unknown = said.startswith("decode: unknown key ")
        for key in decode if isinstance(decode, Mapping) and not unknown else ():
            if isinstance(key, str) and hasattr(cfg.decode, key):
                said = said.replace(f"decode.{key}", CLI.get("beam" if key == "beam_size" else key, f"decode.{key}"))
        raise ConfigError(said) from None
    if checkpoint is None:
        try:  # one path: its weights exactly, without the optimizer state
            paths, weights = average_last(run_dir, cfg.decode.average_last)
        except CheckpointMismatch as e:  # each intact: not to be moved away as damaged
            raise CheckpointError(f"{e}; give --checkpoint one of them") from None
        except CheckpointError as e:
            if len(list_checkpoints(run_dir)) < 2:  # no other to decode with
                raise CheckpointError(f"{e} (the run's only checkpoint)") from None
            raise CheckpointError(f"{e}; to decode with the others, give --checkpoint one that is intact, or "
                                  f"move the damaged one out of {run_dir / 'checkpoints'}") from None
        fewer = f" (of decode.average_last {cfg.decode.average_last})" if len(paths) < cfg.decode.average_last else ""
        log(f"averaging the last {len(paths)} checkpoint(s){fewer}: {', '.join(p.stem for p in paths)}")
        if note := unrecorded_note(run_dir, paths[-1]):
            log(note)
        read = [p.with_suffix(".safetensors").resolve() for p in paths]
    else:
        # the weights file its record names: given the optimizer state's, that was recorded as the weights read
        weights, read = ckpt.weights, [(ckpt.path.parent / ckpt.meta["files"]["weights"]["name"]).resolve()]
    with torch.random.fork_rng(devices=[]):  # the initial draws, overwritten by the weights, leave the host's own be
        model = Transformer(cfg.model, tokenizer.vocab_size).float()  # a host's float64 default: the weights' fp32
    load_weights(model, weights, str(checkpoint or run_dir))
    return cfg, model.eval(), read, None if checkpoint is None else ckpt.meta, foreign
