"""One system's translation timing, in a process of its own (started by benchmarks/speed.py).

    python speed_worker.py ours|ours_int8|ctranslate2 JOB.json
    python speed_worker.py ct2_file MODEL_DIR --input FILE --output FILE

JOB.json names the model, the source pieces (one line of pieces per sentence), the decoding
settings, the batch size, the number of untimed passes (``warmup``, default 0) and of timed ones
(``repeat``). The model is loaded first, outside the timing; then the whole list is translated
``warmup`` times untimed and ``repeat`` times timed, and the fastest is kept. Prints one JSON line:
seconds, the number of sentences translated, and the outputs as pieces.

ct2_file is what a CTranslate2 user runs on a file: sentencepiece in, ``translate_batch`` (beam 4,
length penalty 0.6, batches of 64, at most the longest input + 50 pieces), sentencepiece out. It
imports neither torch nor our package, as such a script would not.

speed.py starts every system's worker, fairseq's included (fairseq_worker.py, in fairseq's own
environment), with the same environment: 2 threads, and glibc's malloc told to keep freed memory
(the MALLOC_* variables equal to what transformer.runtime.keep_freed_memory sets). Python workers
also flush denormal floats to zero, as our trainer does.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path


def time_best(translate, repeat: int, warmup: int = 0) -> tuple[float, list[list[str]]]:
    """The fastest of ``repeat`` timed passes, after ``warmup`` untimed ones (caches, allocator, kernels)."""
    for _ in range(warmup):
        translate()
    best, outputs = float("inf"), []
    for _ in range(repeat):
        start = time.perf_counter()
        outputs = translate()
        best = min(best, time.perf_counter() - start)
    return best, outputs


def usage_unless(doc: str, fits: bool) -> None:
    """Print ``doc`` and exit unless the arguments ``fits``: these workers are started by speed.py, and a
    person who runs one by hand gets its usage, not an IndexError (``--help``: to stdout, exit 0)."""
    asked = bool({"-h", "--help"} & set(sys.argv[1:]))
    if fits and not asked:
        return
    print(doc.strip(), file=sys.stdout if asked else sys.stderr)
    sys.exit(0 if asked else 2)


def ours(job: dict, int8: bool) -> tuple[float, list[list[str]]]:
    import torch

    from transformer.decode import translate_ids
    from transformer.tokenizer import EOS_ID
    from transformer.translator import Translator

    translator = Translator(Path(job["run"]), Path(job["checkpoint"]), log=lambda m: None, int8=int8, device="cpu")
    pieces = translator.tokenizer.vocabulary()
    index = {p: i for i, p in enumerate(pieces)}
    sources = [[index[p] for p in line] + [EOS_ID] for line in job["sources"]]

    def translate() -> list[list[str]]:
        with torch.inference_mode():
            outputs = translate_ids(translator.model, sources, job["beam"], job["alpha"], job["max_len_offset"],
                                    job["batch"], early_stop=job.get("early_stop", "bound"),
                                    length_norm=job.get("length_norm", "gnmt"))
        return [[pieces[i] for i in o] for o in outputs]  # no EOS in them (decode.translate_ids)

    return time_best(translate, job["repeat"], job.get("warmup", 0))


def ctranslate2(job: dict) -> tuple[float, list[list[str]]]:
    import ctranslate2

    engine = ctranslate2.Translator(job["model"], device="cpu", intra_threads=job.get("threads", 2), inter_threads=1)
    sources, batch = job["sources"], job["batch"]
    order = sorted(range(len(sources)), key=lambda i: len(sources[i]))  # length-sorted batches, as ours
    chunks = [order[i:i + batch] for i in range(0, len(order), batch)]

    def translate() -> list[list[str]]:
        outputs: list[list[str]] = [[] for _ in sources]
        for chunk in chunks:
            # ours allows |source + EOS| + offset outputs, EOS included; CTranslate2 does not count EOS
            results = engine.translate_batch([sources[i] for i in chunk], beam_size=job["beam"],
                                             length_penalty=job["alpha"], max_batch_size=batch,
                                             max_decoding_length=max(len(sources[i]) for i in chunk)
                                             + job["max_len_offset"])
            for i, r in zip(chunk, results):
                outputs[i] = r.hypotheses[0]
        return outputs

    return time_best(translate, job["repeat"], job.get("warmup", 0))


def ct2_file(model_dir: str, source: str, target: str) -> None:
    import ctranslate2
    import sentencepiece

    sp = sentencepiece.SentencePieceProcessor(model_file=f"{model_dir}/spm.model")
    engine = ctranslate2.Translator(model_dir, device="cpu", intra_threads=2)
    with open(source, encoding="utf-8") as f:
        pieces = sp.encode(f.read().splitlines(), out_type=str)
    results = engine.translate_batch(pieces, beam_size=4, length_penalty=0.6, max_batch_size=64,
                                     max_decoding_length=max(map(len, pieces), default=0) + 50)
    with open(target, "w", encoding="utf-8") as f:
        f.writelines(sp.decode(r.hypotheses[0]) + "\n" for r in results)


def main() -> None:
    args = sys.argv[1:]
    usage_unless(__doc__, len(args) == 2 and args[0] in ("ours", "ours_int8", "ctranslate2")
                 or len(args) == 6 and args[0] == "ct2_file" and {"--input", "--output"} <= set(args[2::2]))
    if sys.argv[1] == "ct2_file":
        ct2_file(sys.argv[2], sys.argv[sys.argv.index("--input") + 1], sys.argv[sys.argv.index("--output") + 1])
        return
    import torch

    system, job = sys.argv[1], json.loads(Path(sys.argv[2]).read_text(encoding="utf-8"))
    torch.set_num_threads(2)
    torch.set_flush_denormal(True)
    if system == "ctranslate2":
        seconds, outputs = ctranslate2(job)
    else:
        seconds, outputs = ours(job, int8=system == "ours_int8")
    print(json.dumps({"seconds": seconds, "sentences": len(outputs), "outputs": outputs}))


if __name__ == "__main__":
    main()
