"""Shared fixtures: real Multi30k slices (TRANSFORMER_DATA, default ../shared/data beside the checkout)."""

import os
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Sequence
from pathlib import Path

import pytest
import torch

# Without a CUDA GPU the Triton kernels (transformer/fused_loss.py, benchmarks/postnorm_kernel.py) run under
# Triton's interpreter. It must be chosen before Triton is first imported in the process, by any module
# (torch's compiler imports it too): Triton's own library (tl.rand's Philox, ...) is made for one mode then
if not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"

from transformer.data import read_lines  # noqa: E402

DATA = Path(os.environ.get("TRANSFORMER_DATA", Path(__file__).resolve().parents[2] / "shared" / "data"))
MULTI30K = DATA / "multi30k"


@pytest.fixture(scope="session")
def multi30k() -> Path:
    if not (MULTI30K / "train.en.gz").exists():
        pytest.skip(f"Multi30k not found under {DATA} (set TRANSFORMER_DATA)")
    return MULTI30K


def write_slice(multi30k: Path, out: Path, split: str, start: int, n: int) -> tuple[Path, Path]:
    """First n pairs of a Multi30k split from line `start`, as plain files: (src.en, tgt.de)."""
    paths = []
    for lang in ("en", "de"):
        lines = read_lines(multi30k / f"{split}.{lang}.gz")[start:start + n]
        path = out / f"{split}{start}_{n}.{lang}"
        path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
        paths.append(path)
    return paths[0], paths[1]


def tiny_data(multi30k: Path, folder: Path) -> list[str]:
    """--set overrides that point the tiny preset at 600 training and 50 validation pairs (written into
    ``folder``)."""
    train_src, train_tgt = write_slice(multi30k, folder, "train", 0, 600)
    valid_src, valid_tgt = write_slice(multi30k, folder, "val", 0, 50)
    return [f'data.train_src="{train_src}"', f'data.train_tgt="{train_tgt}"',
            f'data.valid_src="{valid_src}"', f'data.valid_tgt="{valid_tgt}"', "data.vocab_size=500",
            "train.save_minutes=0", "train.threads=1"]


@pytest.fixture
def tiny_overrides(multi30k: Path, tmp_path: Path) -> list[str]:
    return tiny_data(multi30k, tmp_path)


@pytest.fixture(scope="session")
def tiny_run(multi30k: Path, tmp_path_factory) -> Path:
    """A tiny model trained for 30 steps on 600 pairs: a real run folder for figure and server tests."""
    from transformer.config import load_config
    from transformer.train import train

    tmp = tmp_path_factory.mktemp("tiny_run")
    cfg = load_config("tiny", tiny_data(multi30k, tmp) + ["train.max_steps=30", "train.save_every=10",
                                                          "train.log_every=5", "train.eval_every=10",
                                                          "train.bleu_every=15", "train.bleu_sentences=20"])
    train(cfg, tmp / "run", quiet=True)
    return tmp / "run"


@pytest.fixture(scope="session")
def trained_tiny(multi30k: Path, tmp_path_factory):
    """trained_tiny(norm): a tiny model trained for 200 steps, post-norm (§3.1) or pre-norm (model.norm =
    "pre"), at transformers' LayerNorm ε 1e-5, each once for the session: the export tests share them, and
    exporting or decoding leaves a run folder as it was. At a quarter of the tiny preset's rate: at its own,
    the post-norm model collapsed on one machine's arithmetic (an AVX-512 CPU: one output for every input,
    val perplexity 135), where the export tests need outputs that differ."""
    from transformer.config import load_config
    from transformer.train import train

    runs: dict[str, Path] = {}

    def run(norm: str) -> Path:
        if norm not in runs:
            tmp = tmp_path_factory.mktemp(f"trained_{norm}")
            cfg = load_config("tiny", tiny_data(multi30k, tmp) + [
                "train.max_steps=200", "train.save_every=100", "decode.average_last=2", f'model.norm="{norm}"',
                "model.ln_eps=1e-5", "train.lr_scale=0.5"])
            train(cfg, tmp / "run", quiet=True)
            runs[norm] = tmp / "run"
        return runs[norm]
    return run


@pytest.fixture(scope="session")
def tiny_parse_run(tmp_path_factory) -> Path:
    """A parsing run (§6.3) trained for 4 steps on the WSJ sample, beam 4 and outputs of at most the
    input + 20 pieces: untrained, but its beam writes only trees of the input (trees.TreeConstraint)."""
    from transformer.config import load_config
    from transformer.prepare import write_ptb_splits
    from transformer.train import train

    if not (DATA / "ptb-sample").is_dir():
        pytest.skip(f"ptb-sample not found under {DATA} (set TRANSFORMER_DATA)")
    tmp = tmp_path_factory.mktemp("tiny_parse_run")
    write_ptb_splits(DATA / "ptb-sample", tmp)
    data = [f'data.{split}_{side}="{tmp}/{split}.{suffix}"' for split in ("train", "valid")
            for side, suffix in (("src", "words"), ("tgt", "wlin"))]
    cfg = load_config("configs/ptb_sample_parse.toml", data + [
        "data.vocab_size=1000", "model.n_enc_layers=1", "model.n_dec_layers=1", "model.d_model=32", "model.d_ff=64",
        "train.max_steps=4", "train.max_minutes=0", "train.save_every=2", "train.eval_every=2", "train.log_every=2",
        "train.threads=1", "decode.beam_size=4", "decode.max_len_offset=20"])
    train(cfg, tmp / "run", quiet=True)
    return tmp / "run"


def start_server(run_dir: Path, options: Sequence[str] = (), timeout: float = 120) -> tuple[subprocess.Popen, str]:
    """`transformer serve RUN_DIR` as a child process on a free loopback port, as a user runs it, returned
    once GET /health answers: (process, base URL). For the tests and benchmarks/serve_load.py; the caller terminates it.
    The server's warnings go to this process's stderr."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen([sys.executable, "-m", "transformer", "serve", str(run_dir), "--port", str(port),
                             *options], stdout=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + timeout
    while True:
        try:
            with urllib.request.urlopen(url + "/health", timeout=1):
                return proc, url
        except OSError:
            if proc.poll() is not None or time.monotonic() > deadline:
                proc.kill()
                raise RuntimeError(f"`transformer serve {run_dir}` did not start (exit status {proc.wait()}; "
                                   "its stderr is above)") from None
            time.sleep(0.2)


def compile_for_sm90(script: str) -> dict:
    """What ``script`` prints last (JSON) when run in a process of its own without Triton's interpreter, this
    checkout's package and benchmarks/ importable: it compiles kernels for sm_90 (an H100 or H200), or traces
    them as torch.compile would for one, without a GPU, as a test process running the interpreter cannot. It prints {"skip": why} where this Triton lacks
    the NVIDIA backend's tools; the test is then skipped, as where Triton has no CUDA target at all."""
    import json

    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env.setdefault("TRITON_DEFAULT_FP_FUSION", "1")
    root = Path(__file__).resolve().parents[1]  # this checkout's package, installed or not
    env["PYTHONPATH"] = os.pathsep.join([str(root), str(root / "benchmarks"), *filter(None, [env.get("PYTHONPATH")])])
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300)
    if done.returncode and "No module named 'triton.backends" in done.stderr:
        pytest.skip("this Triton cannot compile for a CUDA target without a GPU")
    assert done.returncode == 0, done.stderr[-2000:]
    found = json.loads(done.stdout.strip().splitlines()[-1])
    if "skip" in found:
        pytest.skip(f"Triton cannot compile for sm_90 here: {found['skip']}")
    return found
