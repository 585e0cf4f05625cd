"""Training: exact resume, checkpoint cadence, overfitting a few pairs, loss normalisation."""

import json
from pathlib import Path

import pytest
import torch

from transformer.checkpoint import list_checkpoints, load_checkpoint
from transformer.config import load_config
from transformer.decode import translate_ids
from transformer.model import Transformer
from transformer.tokenizer import Tokenizer
from transformer.train import TrainError, train, train_step


def losses(run: Path) -> dict[int, float]:
    return {r["step"]: r["train_loss"] for r in map(json.loads, (run / "metrics.jsonl").read_text().splitlines())}


def test_resume_reproduces_an_uninterrupted_run(tmp_path, tiny_overrides):
    common = tiny_overrides + ["train.log_every=5", "train.eval_every=1000", "train.save_every=10"]
    full = tmp_path / "full"
    train(load_config("tiny", common + ["train.max_steps=30"]), full, quiet=True)
    part = tmp_path / "part"
    train(load_config("tiny", common + ["train.max_steps=10"]), part, quiet=True)
    with pytest.raises(TrainError, match="--resume"):
        train(load_config("tiny", common + ["train.max_steps=30"]), part, quiet=True)
    train(load_config("tiny", common + ["train.max_steps=30"]), part, resume=True, quiet=True)
    assert losses(part) == losses(full)
    a, b = load_checkpoint(list_checkpoints(full)[-1]), load_checkpoint(list_checkpoints(part)[-1])
    assert a.meta["step"] == b.meta["step"] == 30
    for name, tensor in a.weights.items():
        assert torch.equal(tensor, b.weights[name]), name
    for name, tensor in a.state.items():
        assert torch.equal(tensor, b.state[name]), name
    assert [p.name for p in list_checkpoints(full)] == [f"step_000000{s}.json" for s in (10, 20, 30)]


def test_resume_refuses_another_model(tmp_path, tiny_overrides):
    run = tmp_path / "run"
    train(load_config("tiny", tiny_overrides + ["train.max_steps=2"]), run, quiet=True)
    with pytest.raises(TrainError, match="differs"):
        train(load_config("tiny", tiny_overrides + ["model.d_ff=96"]), run, resume=True, quiet=True)


def test_accumulated_batches_normalise_by_all_tokens_of_the_step():
    """Two accumulated batches give the same update as one batch holding both (A3)."""
    import copy
    from transformer.data import Example, collate
    examples = [Example([5, 6, 7, 1], [8, 9, 1]), Example([5, 1], [8, 9, 10, 11, 12, 13, 1]),
                Example([7, 7, 7, 7, 7, 1], [9, 1])]
    cfg = load_config("tiny", ["model.p_drop=0.0"]).model
    torch.manual_seed(0)
    a = Transformer(cfg, 20)
    b = copy.deepcopy(a)
    opt_a, opt_b = torch.optim.SGD(a.parameters(), lr=1.0), torch.optim.SGD(b.parameters(), lr=1.0)
    loss_a, n_a = train_step(a, opt_a, [collate(examples, [0, 1]), collate(examples, [2])], 0.1, lr=1.0)
    loss_b, n_b = train_step(b, opt_b, [collate(examples, [0, 1, 2])], 0.1, lr=1.0)
    assert n_a == n_b == 12
    assert loss_a == pytest.approx(loss_b, rel=1e-5)
    for (name, pa), pb in zip(a.named_parameters(), b.parameters()):
        torch.testing.assert_close(pa, pb, atol=1e-6, rtol=1e-5, msg=name)


def test_tiny_model_overfits_twenty_pairs(tmp_path, multi30k):
    from tests.conftest import write_slice
    src, tgt = write_slice(multi30k, tmp_path, "train", 0, 20)
    spm_src, spm_tgt = write_slice(multi30k, tmp_path, "train", 0, 2000)
    run = tmp_path / "run"
    run.mkdir()
    Tokenizer.train([spm_src, spm_tgt], run / "spm.model", vocab_size=300, input_sentence_size=10000)
    cfg = load_config("tiny", [f'data.train_src="{src}"', f'data.train_tgt="{tgt}"', f'data.valid_src="{src}"',
                               f'data.valid_tgt="{tgt}"', "data.vocab_size=300", "model.p_drop=0.0",
                               "train.eps_ls=0.0", "train.max_steps=200", "train.warmup_steps=50",
                               "train.lr_scale=0.5", "train.log_every=50", "train.eval_every=200",
                               "train.save_minutes=0", "train.threads=1"])
    summary = train(cfg, run, quiet=True)
    assert summary["valid_nll"] < 0.05
    tok = Tokenizer(run / "spm.model")
    ckpt = load_checkpoint(list_checkpoints(run)[-1], with_state=False)
    model = Transformer(cfg.model, tok.vocab_size).eval()
    model.load_state_dict(ckpt.weights)
    sources = [tok.encode(line) + [1] for line in src.read_text().splitlines()]
    outputs = translate_ids(model, sources, beam_size=1, alpha=0.6, max_len_offset=50, batch_size=8)
    expected = [tok.encode(line) for line in tgt.read_text().splitlines()]
    assert outputs == expected
