"""Training and translation speed, side by side with fairseq and CTranslate2 on this machine.

    python benchmarks/speed.py [--train-minutes 15] [--run runs/speed_small] [--no-peers]

The setup of ../shared/peers, run by this script itself so that every number comes from one run on
one machine: Multi30k EN→DE, one joint sentencepiece BPE of 8,000 pieces, the `small` preset
("bench-small": 3+3 layers, d_model 256, d_ff 1024, 4 heads, shared embeddings, post-norm), batches
of at most 4096 tokens per side, 2 threads, fp32.

1. Peak: the fp32 matmul FLOP/s torch reaches here (2048³ `torch.mm`, median of 11).
2. Training: our trainer for --train-minutes (log every 10 updates), then fairseq for
   --fairseq-updates; target tokens/s = median over 10-update intervals after the first 30 updates;
   MFU = tokens/s × training FLOPs per target token (`flops_per_token` at the data's mean lengths) / peak.
3. Translation of test2016 (1,000 sentences; the first --b1-sentences at batch 1), beam 4, α 0.6,
   maximum length input + 50, with the weights our run ended with, in every system: ours (fp32, and
   int8 dynamic quantization; and fp32 with CTranslate2's stopping rule, `--early-stop top`),
   CTranslate2 fp32 and int8 (`transformer export`), fairseq (the weights converted into a fairseq
   checkpoint whose learned position table holds our sinusoids, so the three systems compute the
   same function; fairseq and CTranslate2 normalise by length^α, we by
   GNMT's ((5+|Y|)/6)^α). Each timing is the best of --repeat runs, systems interleaved.

fairseq (fairseq-fixed 0.12.3.1 with torch 2.13.0 CPU) lives in its own virtual environment, built on
first use under $TRANSFORMER_PEER_VENV (default ~/.cache/transformer-bench/fairseq); CTranslate2
comes with our `[dev]` / `[export]` extra. Neither is a dependency of the package.

Writes benchmarks/results/speed.json and speed.md. Run it alone on the machine.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path

import sacrebleu
import torch

from transformer.checkpoint import list_checkpoints, load_checkpoint
from transformer.config import load_config
from transformer.data import encode_for_decoding, read_lines, resolve_data_path
from transformer.decode import translate_ids
from transformer.model import flops_per_token, sinusoidal_positions
from transformer.tokenizer import EOS_ID, UNK_ID, Tokenizer
from transformer.train import train
from transformer.translator import Translator

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"
PEER_VENV = Path(os.environ.get("TRANSFORMER_PEER_VENV", Path.home() / ".cache" / "transformer-bench" / "fairseq"))
SPLITS = {"train": "train", "valid": "val", "test": "test_2016_flickr"}
FAIRSEQ_MODEL = ["--arch", "transformer", "--encoder-layers", "3", "--decoder-layers", "3",
                 "--encoder-embed-dim", "256", "--decoder-embed-dim", "256", "--encoder-ffn-embed-dim", "1024",
                 "--decoder-ffn-embed-dim", "1024", "--encoder-attention-heads", "4",
                 "--decoder-attention-heads", "4", "--activation-fn", "relu", "--dropout", "0.1",
                 "--attention-dropout", "0.0", "--activation-dropout", "0.0"]
FAIRSEQ_OPTIM = ["--criterion", "label_smoothed_cross_entropy", "--label-smoothing", "0.1", "--optimizer", "adam",
                 "--adam-betas", "(0.9, 0.98)", "--adam-eps", "1e-9", "--clip-norm", "0.0", "--lr", "1e-3",
                 "--lr-scheduler", "inverse_sqrt", "--warmup-updates", "4000", "--warmup-init-lr", "1e-7",
                 "--max-tokens", "4096", "--cpu", "--num-workers", "0", "--seed", "1", "--log-format", "simple",
                 "--log-interval", "10"]


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def sh(cmd: list[str], out: Path | None = None, env: dict | None = None) -> str:
    """Run a command; its output goes to ``out`` (and is returned). Fails loudly with the log's tail."""
    env = {**os.environ, "OMP_NUM_THREADS": "2", "MKL_NUM_THREADS": "2", **(env or {})}
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
    text = proc.stdout + proc.stderr
    if out:
        out.write_text(text, encoding="utf-8")
    if proc.returncode:
        raise RuntimeError(f"{' '.join(cmd[:3])} ... failed ({proc.returncode}):\n{text[-3000:]}")
    return text


# ---------------------------------------------------------------------------------------------- setup
def fairseq_venv() -> Path:
    """The peer environment's bin/ folder, built on first use (~5 minutes: fairseq compiles)."""
    bin_dir = PEER_VENV / "bin"
    if (bin_dir / "fairseq-train").exists():
        return bin_dir
    log(f"building the fairseq environment in {PEER_VENV} (once)")
    sh([sys.executable, "-m", "venv", str(PEER_VENV)])
    pip = [str(bin_dir / "python"), "-m", "pip", "install", "-q"]
    sh(pip + ["torch==2.13.0"])
    sh(pip + ["numpy<2", "cffi", "cython", "setuptools", "wheel", "hydra-core==1.3.2", "omegaconf==2.3.0",
              "regex", "sacrebleu", "tqdm", "bitarray", "scikit-learn", "packaging", "sentencepiece", "safetensors"])
    # --no-deps: its torchaudio requirement would pull another torch; built against the torch above
    sh(pip + ["--no-deps", "--no-build-isolation", "fairseq-fixed==0.12.3.1"], env={"MAX_JOBS": "2"})
    return bin_dir


def matmul_peak(n: int = 2048, reps: int = 11) -> float:
    """fp32 GFLOP/s of torch.mm on n×n matrices (2n³ FLOPs), median of ``reps``."""
    a, b = torch.randn(n, n), torch.randn(n, n)
    torch.mm(a, b)
    times = []
    for _ in range(reps):
        t = time.perf_counter()
        torch.mm(a, b)
        times.append(time.perf_counter() - t)
    return 2 * n**3 / statistics.median(times) / 1e9


def write_pieces(tok: Tokenizer, out: Path) -> dict[str, float]:
    """Piece files of every split for fairseq, the fairseq dictionary, and mean lengths (with EOS)."""
    out.mkdir(parents=True, exist_ok=True)
    vocab = tok.vocabulary()
    means = {}
    for split, name in SPLITS.items():
        for lang in ("en", "de"):
            lines = read_lines(resolve_data_path(f"multi30k/{name}.{lang}.gz"))
            ids = tok.encode_batch(lines)
            (out / f"{split}.{lang}").write_text("".join(" ".join(vocab[i] for i in s) + "\n" for s in ids),
                                                 encoding="utf-8")
            if split == "test":  # the batch-1 subset
                (out / f"test1.{lang}").write_text("".join(" ".join(vocab[i] for i in s) + "\n" for s in ids[:200]),
                                                   encoding="utf-8")
            if split == "train":
                means[lang] = sum(len(s) + 1 for s in ids) / len(ids)
    # fairseq adds <s> <pad> </s> <unk> itself; every other piece keeps our order (id = ours + 1)
    (out / "dict.txt").write_text("".join(f"{p} 1\n" for p in vocab[3:]), encoding="utf-8")
    return means


def interval_median(rates: list[tuple[int, float]], skip: int = 30) -> tuple[float, int]:
    """Median of per-interval tokens/s for intervals ending after update ``skip``; and their count."""
    kept = [r for step, r in rates if step > skip]
    if not kept:
        raise RuntimeError("no training intervals after warm-up were logged")
    return statistics.median(kept), len(kept)


# ---------------------------------------------------------------------------------------------- training
def train_ours(run: Path, minutes: float) -> tuple[dict, list[tuple[int, float]]]:
    cfg = load_config("small", [
        'data.train_src="multi30k/train.en.gz"', 'data.train_tgt="multi30k/train.de.gz"',
        'data.valid_src="multi30k/val.en.gz"', 'data.valid_tgt="multi30k/val.de.gz"',
        f"train.max_minutes={minutes}", "train.max_steps=1000000", "train.threads=2", "train.log_every=10",
        "train.eval_every=1000000", "train.save_every=0", "train.save_minutes=0", "decode.average_last=1",
        # a short warmup so the translation model of a short run is a real one (peers: 30.6 BLEU in 30 min)
        "train.warmup_steps=400", "train.lr_scale=0.32"])
    summary = train(cfg, run, quiet=True)
    rates = [(r["step"], r["tokens_per_s"]) for r in map(json.loads, (run / "metrics.jsonl").open())
             if "tokens_per_s" in r]
    return summary, rates


def train_fairseq(bin_dir: Path, data_bin: Path, work: Path, updates: int) -> list[tuple[int, float]]:
    text = sh([str(bin_dir / "fairseq-train"), str(data_bin), *FAIRSEQ_MODEL, "--share-all-embeddings",
               *FAIRSEQ_OPTIM, "--max-update", str(updates), "--no-save", "--disable-validation",
               "--save-dir", str(work / "unused")], work / "fairseq_train.log")
    rates = []
    for line in text.splitlines():
        m = re.search(r"wps=([\d.]+).*num_updates=(\d+)", line)
        if m and "train_inner" in line:
            rates.append((int(m.group(2)), float(m.group(1))))
    return rates


# ---------------------------------------------------------------------------------------------- fairseq model
def fairseq_checkpoint(bin_dir: Path, data_bin: Path, weights: dict[str, torch.Tensor], work: Path) -> Path:
    """A fairseq checkpoint computing our model: fairseq writes one of the right architecture (one
    update), then its tensors are replaced by ours, remapped to fairseq's names and vocabulary."""
    ckpt_dir = work / "fairseq_ckpt"
    sh([str(bin_dir / "fairseq-train"), str(data_bin), *FAIRSEQ_MODEL, "--encoder-learned-pos",
        "--decoder-learned-pos", *FAIRSEQ_OPTIM, "--max-update", "1", "--disable-validation",
        "--no-epoch-checkpoints", "--save-dir", str(ckpt_dir)], work / "fairseq_convert.log")
    from safetensors.torch import save_file

    emb = weights["embed.weight"]  # [V, D] shared (the small preset ties all three)
    V, D = emb.shape

    def table(start_row: torch.Tensor | None) -> torch.Tensor:
        """fairseq ids: <s>=0 <pad>=1 </s>=2 <unk>=3, then our pieces 3.. at +1."""
        t = torch.zeros(V + 1, D)
        t[2] = emb[EOS_ID] if start_row is None else start_row
        t[3] = emb[UNK_ID]
        t[4:] = emb[3:]
        return t

    pos = torch.zeros(1024 + 2, D)
    pos[2:] = sinusoidal_positions(1024, D, 0, torch.device("cpu"))  # fairseq position i sits at row i + 2
    out = {"encoder.embed_tokens.weight": table(None),
           # the decoder's first input is </s> in fairseq and the zero vector in ours (A5)
           "decoder.embed_tokens.weight": table(torch.zeros(D)),
           "decoder.output_projection.weight": table(None),
           "encoder.embed_positions.weight": pos, "decoder.embed_positions.weight": pos.clone()}
    names = {"self_attn.q_proj": "self_attn.q_proj", "self_attn.k_proj": "self_attn.k_proj",
             "self_attn.v_proj": "self_attn.v_proj", "self_attn.out_proj": "self_attn.out_proj",
             "cross_attn.q_proj": "encoder_attn.q_proj", "cross_attn.k_proj": "encoder_attn.k_proj",
             "cross_attn.v_proj": "encoder_attn.v_proj", "cross_attn.out_proj": "encoder_attn.out_proj",
             "ffn.w1": "fc1", "ffn.w2": "fc2"}
    for key, value in weights.items():
        part, _, rest = key.partition(".")
        if part not in ("encoder", "decoder"):
            continue
        layer, _, name = rest.partition(".")
        module, _, kind = name.rpartition(".")
        norms = {"norm1": "self_attn_layer_norm", "norm2": "final_layer_norm" if part == "encoder"
                 else "encoder_attn_layer_norm", "norm3": "final_layer_norm"}
        module = names.get(module, norms.get(module, module))
        out[f"{part}.layers.{layer}.{module}.{kind}"] = value.float().contiguous()
    save_file(out, str(work / "fairseq_weights.safetensors"))
    patch = (
        "import sys, torch; from safetensors.torch import load_file\n"
        "ck = torch.load(sys.argv[1], map_location='cpu', weights_only=False)\n"  # our own file, just written
        "new = load_file(sys.argv[2]); model = ck['model']\n"
        "for k, v in new.items():\n"
        "    assert k in model and model[k].shape == v.shape, (k, tuple(v.shape), tuple(model[k].shape) if k in model else None)\n"
        "    model[k] = v\n"
        "left = [k for k in model if k not in new and not k.endswith('version') and '_float_tensor' not in k]\n"
        "assert not left, left\n"
        "torch.save(ck, sys.argv[1])\n")
    sh([str(bin_dir / "python"), "-c", patch, str(ckpt_dir / "checkpoint_last.pt"),
        str(work / "fairseq_weights.safetensors")])
    return ckpt_dir / "checkpoint_last.pt"


def fairseq_translate(bin_dir: Path, data_bin: Path, ckpt: Path, subset: str, batch: int, work: Path,
                      vocab_index: dict[str, int], tok: Tokenizer) -> dict:
    text = sh([str(bin_dir / "fairseq-generate"), str(data_bin), "--cpu", "--source-lang", "en", "--target-lang",
               "de", "--path", str(ckpt), "--gen-subset", subset, "--beam", "4", "--lenpen", "0.6",
               "--max-len-a", "1", "--max-len-b", "50", "--batch-size", str(batch), "--num-workers", "0"],
              work / f"fairseq_generate_{subset}_b{batch}.log", env={"TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD": "1"})
    m = re.search(r"Translated ([\d,]+) sentences \(([\d,]+) tokens\) in ([\d.]+)s", text)
    if not m:
        raise RuntimeError(f"fairseq-generate: no timing line in {work}")
    n, seconds = int(m.group(1).replace(",", "")), float(m.group(3))
    hyps: dict[int, list[str]] = {}
    for line in text.splitlines():
        if line.startswith("H-"):
            head, _, pieces = line.split("\t")
            hyps[int(head[2:])] = pieces.split()
    outputs = [hyps.get(i, []) for i in range(max(hyps) + 1)] if hyps else []
    tokens = sum(len(h) for h in outputs)  # EOS is not printed
    texts = [tok.decode([vocab_index.get(p, UNK_ID) for p in h]) for h in outputs]
    return {"sents_per_s": n / seconds, "tgt_tokens_per_s": tokens / seconds, "seconds": seconds,
            "sentences": n, "hyps": texts}


# ---------------------------------------------------------------------------------------------- translation
def translate_ours(translator: Translator, sources: list[list[int]], batch: int, repeat: int,
                   early_stop: str = "bound") -> dict:
    best, outputs = float("inf"), []
    for _ in range(repeat):
        t = time.perf_counter()
        with torch.inference_mode():
            outputs = translate_ids(translator.model, sources, 4, 0.6, 50, batch, early_stop=early_stop)
        best = min(best, time.perf_counter() - t)
    tokens = sum(len(o[:o.index(EOS_ID)] if EOS_ID in o else o) for o in outputs)
    return {"sents_per_s": len(sources) / best, "tgt_tokens_per_s": tokens / best, "seconds": best,
            "sentences": len(sources), "hyps": [translator.tokenizer.decode(o) for o in outputs]}


def translate_ct2(model_dir: Path, sources: list[list[str]], batch: int, repeat: int, tok: Tokenizer,
                  vocab_index: dict[str, int]) -> dict:
    import ctranslate2

    engine = ctranslate2.Translator(str(model_dir), device="cpu", intra_threads=2, inter_threads=1)
    order = sorted(range(len(sources)), key=lambda i: len(sources[i]))
    chunks = [order[i:i + batch] for i in range(0, len(order), batch)]
    best, outputs = float("inf"), [None] * len(sources)
    for _ in range(repeat):
        t = time.perf_counter()
        for chunk in chunks:
            # ours allows |source + EOS| + 50 outputs, EOS included; CTranslate2 does not count EOS
            results = engine.translate_batch([sources[i] for i in chunk], beam_size=4, length_penalty=0.6,
                                             max_decoding_length=max(len(sources[i]) for i in chunk) + 50,
                                             max_batch_size=batch)
            for i, r in zip(chunk, results):
                outputs[i] = r.hypotheses[0]
        best = min(best, time.perf_counter() - t)
    tokens = sum(len(o) for o in outputs)
    return {"sents_per_s": len(sources) / best, "tgt_tokens_per_s": tokens / best, "seconds": best,
            "sentences": len(sources), "hyps": [tok.decode([vocab_index.get(p, UNK_ID) for p in o]) for o in outputs]}


def bleu(hyps: list[str], refs: list[str]) -> float:
    return round(sacrebleu.corpus_bleu(hyps, [refs[:len(hyps)]]).score, 2)


# ---------------------------------------------------------------------------------------------- main
def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--run", type=Path, default=ROOT / "runs" / "speed_small",
                        help="our run folder; an existing one is reused (no training, no training numbers)")
    parser.add_argument("--train-minutes", type=float, default=15.0)
    parser.add_argument("--fairseq-updates", type=int, default=230)
    parser.add_argument("--b1-sentences", type=int, default=200, help="sentences translated at batch 1")
    parser.add_argument("--repeat", type=int, default=2, help="timings per translation setting (best kept)")
    parser.add_argument("--no-peers", action="store_true", help="measure ours only")
    args = parser.parse_args()
    torch.set_num_threads(2)
    torch.set_flush_denormal(True)
    work = args.run / "speed"
    result: dict = {"date": datetime.date.today().isoformat(),
                    "command": " ".join([os.path.relpath(sys.argv[0], ROOT), *sys.argv[1:]]),
                    "machine": f"{os.cpu_count()} CPU cores, {platform.processor() or platform.machine()}, 2 threads",
                    "versions": {"python": platform.python_version(), "torch": torch.__version__,
                                 "sacrebleu": sacrebleu.__version__}}

    log("fp32 matmul peak")
    peak = matmul_peak()
    result["matmul_peak_gflops"] = round(peak, 1)
    log(f"peak {peak:.0f} GFLOP/s")

    trained_here = not list_checkpoints(args.run)
    if trained_here:
        log(f"training ours for {args.train_minutes} min into {args.run}")
        summary, rates = train_ours(args.run, args.train_minutes)
    tok = Tokenizer(args.run / "spm.model")
    work.mkdir(parents=True, exist_ok=True)
    means = write_pieces(tok, work / "pieces")
    cfg = load_config(str(args.run / "config.toml"))
    flops = flops_per_token(cfg.model, tok.vocab_size, means["en"], means["de"])
    result["flops_per_tgt_token"] = round(flops)
    result["mean_lengths"] = {k: round(v, 2) for k, v in means.items()}
    if trained_here:
        ours_tps, n_int = interval_median(rates)
        result["train"] = {"ours": {"tokens_per_s": round(ours_tps), "intervals": n_int, "updates": summary["step"],
                                    "mfu": round(ours_tps * flops / (peak * 1e9), 4)}}
        result["mfu"] = result["train"]["ours"]["mfu"]
        log(f"ours: {ours_tps:.0f} target tokens/s, MFU {result['mfu']:.1%}")

    bin_dir = None if args.no_peers else fairseq_venv()
    vocab = tok.vocabulary()
    vocab_index = {p: i for i, p in enumerate(vocab)}
    data_bin = work / "fairseq_bin"
    if bin_dir and not (data_bin / "dict.en.txt").exists():
        p = work / "pieces"
        sh([str(bin_dir / "fairseq-preprocess"), "--source-lang", "en", "--target-lang", "de",
            "--trainpref", str(p / "train"), "--validpref", str(p / "valid"), "--testpref",
            f"{p / 'test'},{p / 'test1'}", "--destdir", str(data_bin), "--srcdict", str(p / "dict.txt"),
            "--joined-dictionary", "--workers", "2"], work / "fairseq_preprocess.log")
    if bin_dir and trained_here:
        log(f"fairseq training, {args.fairseq_updates} updates")
        fs_tps, n_int = interval_median(train_fairseq(bin_dir, data_bin, work, args.fairseq_updates))
        result["train"]["fairseq"] = {"tokens_per_s": round(fs_tps), "intervals": n_int,
                                      "mfu": round(fs_tps * flops / (peak * 1e9), 4)}
        log(f"fairseq: {fs_tps:.0f} target tokens/s")

    # ---- translation: the same weights everywhere
    last = list_checkpoints(args.run)[-1]
    translator = Translator(args.run, last, log=log)
    lines = read_lines(resolve_data_path("multi30k/test_2016_flickr.en.gz"))
    refs = read_lines(resolve_data_path("multi30k/test_2016_flickr.de.gz"))
    sources = encode_for_decoding(lines, tok)
    piece_sources = [[vocab[i] for i in s[:-1]] for s in sources]
    int8 = Translator(args.run, last, log=log, int8=True)
    from transformer.export import export_ctranslate2
    for q in ("float32", "int8"):
        export_ctranslate2(args.run, work / f"ct2_{q}", last, None if q == "float32" else "int8", force=True, log=log)
    fs_ckpt = fairseq_checkpoint(bin_dir, data_bin, load_checkpoint(last, with_state=False).weights, work) \
        if bin_dir else None

    runs: dict[str, dict] = {}
    for batch, n, subset in ((64, len(sources), "test"), (1, args.b1_sentences, "test1")):
        systems = {
            "ours": lambda: translate_ours(translator, sources[:n], batch, args.repeat),
            "ours_int8": lambda: translate_ours(int8, sources[:n], batch, args.repeat),
            "ours_top_stop": lambda: translate_ours(translator, sources[:n], batch, args.repeat, "top"),
            "ctranslate2": lambda: translate_ct2(work / "ct2_float32", piece_sources[:n], batch, args.repeat, tok,
                                                 vocab_index),
            "ctranslate2_int8": lambda: translate_ct2(work / "ct2_int8", piece_sources[:n], batch, args.repeat,
                                                      tok, vocab_index),
        }
        if fs_ckpt:
            systems["fairseq"] = lambda: min(
                (fairseq_translate(bin_dir, data_bin, fs_ckpt, subset, batch, work, vocab_index, tok)
                 for _ in range(args.repeat)), key=lambda r: r["seconds"])
        for name, fn in systems.items():
            r = fn()
            r["bleu"] = bleu(r.pop("hyps"), refs)
            runs[f"{name}_b{batch}"] = {k: round(v, 2) if isinstance(v, float) else v for k, v in r.items()}
            log(f"{name} batch {batch}: {r['sents_per_s']:.1f} sentences/s, BLEU {r['bleu']}")
    result["translate"] = runs

    def ratio(a: str, b: str) -> float | None:
        return round(runs[a]["sents_per_s"] / runs[b]["sents_per_s"], 3) if a in runs and b in runs else None

    tr = result.get("train", {})
    result["ratios"] = {
        "train_vs_fairseq": round(tr["ours"]["tokens_per_s"] / tr["fairseq"]["tokens_per_s"], 3)
        if "fairseq" in tr else None,
        "translate_b64_vs_fairseq": ratio("ours_b64", "fairseq_b64"),
        "translate_b64_vs_ctranslate2": ratio("ours_b64", "ctranslate2_b64"),
        "translate_b1_vs_ctranslate2": ratio("ours_b1", "ctranslate2_b1"),
    }
    result["int8"] = {"sents_per_s": runs["ours_int8_b64"]["sents_per_s"],
                      "vs_ctranslate2_int8": ratio("ours_int8_b64", "ctranslate2_int8_b64"),
                      "bleu_delta": round(runs["ours_int8_b64"]["bleu"] - runs["ours_b64"]["bleu"], 2)}
    # not a target: our search with the stopping rule OpenNMT-py and CTranslate2 use (--early-stop top)
    result["top_stop"] = {"b64_vs_ctranslate2": ratio("ours_top_stop_b64", "ctranslate2_b64"),
                          "b64_vs_fairseq": ratio("ours_top_stop_b64", "fairseq_b64"),
                          "b64_vs_bound": ratio("ours_top_stop_b64", "ours_b64"),
                          "bleu_delta": round(runs["ours_top_stop_b64"]["bleu"] - runs["ours_b64"]["bleu"], 2)}
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "speed.json").write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    (RESULTS / "speed.md").write_text(markdown(result), encoding="utf-8")
    print(json.dumps(result, indent=2))


def markdown(r: dict) -> str:
    rows = "\n".join(f"| {name} | {v['sents_per_s']} | {v['tgt_tokens_per_s']} | {v['sentences']} | {v['bleu']} |"
                     for name, v in r["translate"].items())
    train_rows = "\n".join(f"| {name} | {v['tokens_per_s']} | {v['mfu']:.1%} |" for name, v in r.get("train", {}).items())
    return f"""# Speed: ours vs fairseq and CTranslate2 (bench-small, Multi30k EN→DE, CPU)

`{r['command']}` — {r['date']}, {r['machine']}; torch {r['versions']['torch']}.
fp32 matmul peak {r['matmul_peak_gflops']} GFLOP/s; {r['flops_per_tgt_token'] / 1e6:.2f} MFLOP per target token.

## Training (target tokens/s, median over 10-update intervals after update 30)

| system | tokens/s | MFU |
|---|---|---|
{train_rows}

## Translation (test2016, beam 4, α 0.6, max length input + 50; same weights in every system)

| system, batch | sentences/s | target tokens/s | sentences | BLEU |
|---|---|---|---|---|
{rows}

Ratios (ours ÷ theirs): {json.dumps(r['ratios'])}; int8: {json.dumps(r['int8'])}

`ours` stops a sentence by the paper's exact bound (§6.1, A11: no alive beam can beat the best
finished one). `ours_top_stop` (`--early-stop top`, not the paper's) also stops it once the step's
best candidate is EOS, the rule of OpenNMT-py and CTranslate2 (fairseq waits for 4 finished
hypotheses): fewer decoder steps, not exact. Not a target; ratios: {json.dumps(r['top_stop'])}
"""


if __name__ == "__main__":
    main()
