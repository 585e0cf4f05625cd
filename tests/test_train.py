"""Training: exact resume, checkpoint cadence, overfitting a few pairs, loss normalisation."""

import json
import math
import os
import re
import shutil
import signal
import sys
import time
from pathlib import Path

import pytest
import torch

from transformer.checkpoint import checkpoint_record, list_checkpoints, load_checkpoint
from transformer.config import ConfigError, load_config, read_toml
from transformer.data import BatchOrder, DataError, Example, ShapeBuckets, collate, read_lines, read_parallel
from transformer.decode import translate_ids
from transformer.model import Transformer
from transformer.tokenizer import BOS_ID, Tokenizer
from transformer import runtime, train as training
from transformer.runtime import emulated_on_cpu
from transformer.train import TrainError, budget_used, keeping, native_bf16, resolved_precision, train, train_step
from transformer.errors import UserError


def losses(run: Path) -> dict[int, float]:
    return {r["step"]: r["train_loss"] for r in map(json.loads, (run / "metrics.jsonl").read_text().splitlines())}


@pytest.fixture
def deterministic(monkeypatch):
    """Deterministic kernels on a GPU, where exact reproduction needs them (the CPU's already are)."""
    if not torch.cuda.is_available():
        yield
        return
    monkeypatch.setenv("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    torch.use_deterministic_algorithms(True)
    yield
    torch.use_deterministic_algorithms(False)


def test_the_log_names_the_data_files_read_and_a_mistyped_data_folder(tmp_path, tiny_overrides, monkeypatch):
    """TRANSFORMER_DATA mistyped: training read ../shared/data beside the checkout without a word, and the log named
    the files by their names alone (train.en + train.de), not which copy."""
    monkeypatch.setenv("TRANSFORMER_DATA", str(tmp_path / "typo"))
    cfg = load_config("tiny", tiny_overrides + ["train.max_steps=1"])
    train(cfg, tmp_path / "run", quiet=True)
    log = (tmp_path / "run" / "train.log").read_text()
    train_src = Path(cfg.data.train_src).resolve()
    assert f"longer than 256 pieces with EOS ({train_src} + {Path(cfg.data.train_tgt).name})" in log
    assert f"longer than 256 pieces with EOS ({Path(cfg.data.valid_src).resolve()} + " in log
    assert f"note: TRANSFORMER_DATA {tmp_path / 'typo'} is no folder (the files above were found without it)" in log
    assert "ends in" not in log  # train.de is German, as data.tgt_lang says


def test_a_training_file_named_in_another_language_than_the_config_says_is_noted(tmp_path, tiny_overrides):
    """Sides swapped (train.de as the source of an en->de run), or a file misnamed (.jp for ja): the file's name is
    taken as its language (BLEU's tokenizer, an export's card), without a word."""
    cfg = load_config("tiny", tiny_overrides + ["train.max_steps=1"])
    swapped = load_config("tiny", tiny_overrides + ["train.max_steps=1", f"data.train_src={cfg.data.train_tgt}",
                                                    f"data.train_tgt={cfg.data.train_src}"])
    train(swapped, tmp_path / "run", quiet=True)
    log = (tmp_path / "run" / "train.log").read_text()
    assert ("note: data.train_src ends in 'de' and data.train_tgt in 'en', where data.src_lang is 'en' and "
            "data.tgt_lang 'de': the sides look swapped") in log
    from transformer.train import prepare_run

    said: list[str] = []
    misnamed = load_config("tiny", tiny_overrides + ["data.tgt_lang=\"ja\""])
    prepare_run(misnamed, tmp_path / "other", resume=False, log=said.append)
    assert (f"note: data.train_tgt {Path(cfg.data.train_tgt).name} ends in 'de', and data.tgt_lang is 'ja': the "
            "file's name is taken as its language (by the BLEU tokenizers of training and evaluate; an export's card "
            "takes data.tgt_lang); rename the file, or correct data.tgt_lang") in said


def test_data_files_given_from_the_current_folder_are_recorded_whole(tmp_path, tiny_overrides, monkeypatch):
    """`--set data.test_src=mydata/test.en` was kept as written: `evaluate RUN` from another folder scored whatever
    mydata/test.en was there (another test set, without a word), or found none. Recorded absolute, the run's
    files are its own from anywhere; a resume spelling them as before, from the same folder, is no change."""
    monkeypatch.chdir(tmp_path)
    relative = [re.sub(r'"(.*)"', lambda m: '"' + os.path.relpath(m.group(1), tmp_path) + '"', o)
                for o in tiny_overrides]
    assert 'data.train_src="train0_600.en"' in relative
    train(load_config("tiny", relative + ["train.max_steps=2"]), tmp_path / "run", quiet=True)
    data = checkpoint_record(list_checkpoints(tmp_path / "run")[-1])["config"]["data"]
    assert data["train_src"] == str(tmp_path / "train0_600.en") and data["valid_tgt"] == str(tmp_path / "val0_50.de")
    assert read_toml(tmp_path / "run" / "config.toml")["data"]["train_src"] == str(tmp_path / "train0_600.en")
    assert train(load_config("tiny", relative + ["train.max_steps=3"]), tmp_path / "run", resume=True,
                 quiet=True)["step"] == 3


def test_data_files_given_from_home_are_recorded_whole(tmp_path, monkeypatch):
    """`--set data.train_src="~/my data/train.en"` was read, and recorded as "~/...": the run's records then named
    another file for another $HOME."""
    from transformer.train import anchored

    monkeypatch.setenv("HOME", str(tmp_path))
    (tmp_path / "test.en").write_text("A dog.\n")
    cfg = anchored(load_config("tiny", ['data.test_src="~/test.en"', 'data.test_tgt="~/missing.de"']))
    assert (cfg.data.test_src, cfg.data.test_tgt) == (str(tmp_path / "test.en"), "~/missing.de")


def test_a_folder_of_other_files_is_no_run_folder(tmp_path, tiny_overrides):
    """`train --out data`, or into a folder of the user's own config.toml: the run wrote its files over theirs without
    a word. Refused, naming some of them; an empty folder, a run's (even one stopped before its first checkpoint) and
    a run's checkpoints folder are told apart."""
    own = tmp_path / "mine"
    own.mkdir()
    (own / "config.toml").write_text("[model]\n")
    (own / "notes.txt").write_text("x\n")
    cfg = load_config("tiny", tiny_overrides + ["train.max_steps=2", "train.save_every=2"])
    with pytest.raises(TrainError, match=rf"^{re.escape(str(own))}: a folder of other files "
                                         r"\(config.toml, notes.txt\), not a run folder"):
        train(cfg, own, quiet=True)
    assert (own / "config.toml").read_text() == "[model]\n" and sorted(p.name for p in own.iterdir()) == [
        "config.toml", "notes.txt"]
    (tmp_path / "empty").mkdir()
    train(cfg, tmp_path / "empty", quiet=True)
    with pytest.raises(TrainError, match="a folder of other files .*not a run folder"):
        train(cfg, tmp_path / "empty" / "checkpoints", quiet=True)
    train(load_config("tiny", tiny_overrides + ["train.max_steps=4", "train.save_every=2"]), tmp_path / "empty",
          resume=True, quiet=True)


@pytest.mark.parametrize("precision, extra", [("fp32", []), ("fp16", []), ("fp32", ["train.shape_buckets=8"])],
                         ids=["fp32", "fp16", "fp32-shape-buckets"])
def test_resume_reproduces_an_uninterrupted_run(tmp_path, tiny_overrides, deterministic, precision, extra):
    """Weights, optimizer state, losses and (fp16) the loss scaler's state: equal after a resume, on the
    CPU and, where there is one, on a GPU; also with the batches padded to shape buckets."""
    common = tiny_overrides + extra + ["train.log_every=5", "train.eval_every=1000", "train.save_every=10",
                                       f"train.precision={precision!r}".replace("'", '"')]
    full = tmp_path / "full"
    train(load_config("tiny", common + ["train.max_steps=20"]), full, quiet=True)
    part = tmp_path / "part"
    train(load_config("tiny", common + ["train.max_steps=10"]), part, quiet=True)
    with pytest.raises(TrainError, match="--resume"):
        train(load_config("tiny", common + ["train.max_steps=20"]), part, quiet=True)
    train(load_config("tiny", common + ["train.max_steps=20"]), part, resume=True, quiet=True)
    assert losses(part) == losses(full)
    assert "training batches differ" not in (part / "train.log").read_text()
    a, b = load_checkpoint(list_checkpoints(full)[-1]), load_checkpoint(list_checkpoints(part)[-1])
    assert a.meta["step"] == b.meta["step"] == 20
    assert a.meta["scaler"] == b.meta["scaler"] and (a.meta["scaler"] is None) == (precision == "fp32")
    if precision == "fp16" and not a.meta["train_state"]["skipped_steps"]:  # steps since the last overflow:
        assert a.meta["scaler"]["_growth_tracker"] == 20  # the resumed run went on counting from step 10
    for name, tensor in a.weights.items():
        assert torch.equal(tensor, b.weights[name]), name
    for name, tensor in a.state.items():
        assert torch.equal(tensor, b.state[name]), name
    assert [p.name for p in list_checkpoints(full)] == [f"step_000000{s}.json" for s in (10, 20)]


def test_resume_refuses_another_model(tmp_path, tiny_overrides):
    run = tmp_path / "run"
    train(load_config("tiny", tiny_overrides + ["train.max_steps=2"]), run, quiet=True)
    with pytest.raises(TrainError, match="--resume cannot take model changes .*model.d_ff: 128 -> 96"):
        train(load_config("tiny", tiny_overrides + ["model.d_ff=96"]), run, resume=True, quiet=True)
    # a dropout rate changes no weight: said among the other differences, not as a change the weights cannot fit
    with pytest.raises(TrainError, match=r"--resume cannot take model changes that change the weights' shapes, "
                                         r"model\.d_ff: 128 -> 96: .*\(the config differs also in: "
                                         r"model\.p_drop: 0\.1 -> 0\.3\)"):
        train(load_config("tiny", tiny_overrides + ["model.d_ff=96", "model.p_drop=0.3"]), run, resume=True,
              quiet=True, allow_config_change=True)


def test_another_budget_on_resume_is_logged_not_refused(tmp_path, tiny_overrides, multi30k):
    """Continuing a finished run for longer is a budget change, not a config change: no flag needed, and
    said in the log; anything else (the warmup here) is still refused. Another validation set needs no flag
    either, but is said: the validation curve measures something else from there on (it was not said)."""
    run = tmp_path / "run"
    train(load_config("tiny", tiny_overrides + ["train.max_steps=2"]), run, quiet=True)
    train(load_config("tiny", tiny_overrides + ["train.max_steps=4", "train.max_minutes=5"]), run, resume=True,
          quiet=True)
    assert load_checkpoint(list_checkpoints(run)[-1], with_state=False).meta["step"] == 4
    log = (run / "train.log").read_text()
    assert "resuming with another budget: train.max_steps: 2 -> 4; train.max_minutes: 0.0 -> 5.0" in log
    with pytest.raises(TrainError, match="train.warmup_steps"):
        train(load_config("tiny", tiny_overrides + ["train.max_steps=6", "train.warmup_steps=7"]), run, resume=True,
              quiet=True)
    from tests.conftest import write_slice

    src, tgt = write_slice(multi30k, tmp_path, "val", 50, 50)
    train(load_config("tiny", tiny_overrides + ["train.max_steps=6", f'data.valid_src="{src}"',
                                                f'data.valid_tgt="{tgt}"']), run, resume=True, quiet=True)
    assert (f"resuming with another validation set: data.valid_src: '{tmp_path}/val0_50.en' -> '{src}'; "
            f"data.valid_tgt: '{tmp_path}/val0_50.de' -> '{tgt}'; validation figures from here on are of it"
            ) in (run / "train.log").read_text()
    # a folder whose run stopped before its first checkpoint starts from scratch: it said "resuming with another
    # budget" first
    early = tmp_path / "early"
    early.mkdir()
    shutil.copy(run / "config.toml", early / "config.toml")
    (early / ".lock").touch()  # an attempt's first file: the folder is a run's
    train(load_config("tiny", tiny_overrides + ["train.max_steps=2", f'data.valid_src="{src}"',
                                                f'data.valid_tgt="{tgt}"']), early, resume=True, quiet=True)
    log = (early / "train.log").read_text()
    assert "starting from scratch" in log and "resuming with another" not in log, log


def test_a_resume_from_another_folder_names_the_same_files_otherwise(tmp_path, tiny_overrides, monkeypatch):
    """A run trained from its data folder (`train.en`) and resumed from elsewhere (`/data/train.en`, as a job script
    does) was refused as a data change, and with --allow-config-change said "another validation set". The files'
    content, recorded in the checkpoint, says they are the same; another file's content is still a change."""
    names = {o.split("=", 1)[0]: Path(o.split("=", 1)[1].strip('"')) for o in tiny_overrides if o.startswith("data.")
             and o.split("=", 1)[0].endswith(("_src", "_tgt"))}
    folder = next(iter(names.values())).parent
    relative = [o for o in tiny_overrides if o.split("=", 1)[0] not in names]
    relative += [f'{key}="{path.name}"' for key, path in names.items()]
    monkeypatch.chdir(folder)
    run = tmp_path / "run"
    train(load_config("tiny", relative + ["train.max_steps=2"]), run, quiet=True)
    monkeypatch.chdir(tmp_path.parent)
    assert train(load_config("tiny", tiny_overrides + ["train.max_steps=3"]), run, resume=True, quiet=True)["step"] == 3
    assert "another validation set" not in (run / "train.log").read_text()
    (folder / "other.en").write_text("".join(line + "\n" for line in read_lines(names["data.train_src"])[::-1]))
    moved = [o for o in tiny_overrides if not o.startswith("data.train_src=")]
    with pytest.raises(TrainError, match=r"--resume with a config that differs from .* in: data.train_src: "):
        train(load_config("tiny", moved + [f'data.train_src="{folder / "other.en"}"', "train.max_steps=4"]), run,
              resume=True, quiet=True)


def test_other_numerics_on_resume_are_said(tmp_path, tiny_overrides):
    """A run may be resumed in another precision, with other threads or compiled (moved to another machine, say):
    the same batches, other rounding. The log says that its weights are no longer bit for bit those of a run never
    stopped (it said nothing)."""
    run = tmp_path / "run"
    train(load_config("tiny", tiny_overrides + ["train.max_steps=2", "train.threads=1"]), run, quiet=True)
    train(load_config("tiny", tiny_overrides + ["train.max_steps=3", "train.threads=2"]), run, resume=True,
          quiet=True)
    assert ("resuming with other numerics: train.threads: 1 -> 2; the same batches, other rounding"
            in (run / "train.log").read_text())
    # another save clock is allowed too, and said (the docs warn against averaging checkpoints of two clocks)
    train(load_config("tiny", tiny_overrides + ["train.max_steps=4", "train.threads=2", "train.save_minutes=5"]),
          run, resume=True, quiet=True)
    assert ("resuming with another save clock: train.save_minutes: 0.0 -> 5.0; until decode.average_last checkpoints "
            "of it are written" in (run / "train.log").read_text())
    # the rest a resume may change was taken without a word (train.interval_unit turned every interval to epochs)
    train(load_config("tiny", tiny_overrides + ["train.max_steps=5", "train.threads=2", "train.save_minutes=5",
                                                "train.log_every=1", "decode.beam_size=2"]), run, resume=True,
          quiet=True)
    assert ("resuming with other settings: train.log_every: 10 -> 1; decode.beam_size: 4 -> 2\n"
            in (run / "train.log").read_text())


def test_a_resume_that_draws_other_batches_says_so(tmp_path, tiny_overrides):
    """A checkpoint records its run's batch plan: resumed with other batches (another train.max_tokens here;
    other data, or a version that batched otherwise, alike) the run goes on and the log says that its data
    order is no longer an uninterrupted run's."""
    run = tmp_path / "run"
    train(load_config("tiny", tiny_overrides + ["train.max_steps=2"]), run, quiet=True)
    record = load_checkpoint(list_checkpoints(run)[-1], with_state=False).meta
    assert re.fullmatch(r"[0-9a-f]{64}", record["batches_sha256"])
    train(load_config("tiny", tiny_overrides + ["train.max_steps=4", "train.max_tokens=700"]), run, resume=True,
          quiet=True, allow_config_change=True)
    log = (run / "train.log").read_text()
    assert "the training batches differ from those step_00000002.json's run drew" in log
    changed = load_checkpoint(list_checkpoints(run)[-1], with_state=False).meta
    assert changed["step"] == 4 and changed["batches_sha256"] != record["batches_sha256"]


def test_a_resume_that_batches_otherwise_keeps_its_share_of_the_epoch(tmp_path, tiny_overrides):
    """Resumed with half the tokens per batch (twice the batches in an epoch), the run kept its batch index, so
    its place in the epoch jumped back (or, the other way, skipped a part of the epoch's new order)."""
    from transformer.checkpoint import epochs_into

    run = tmp_path / "run"
    train(load_config("tiny", tiny_overrides + ["train.max_steps=6", "train.save_every=2"]), run, quiet=True)
    train(load_config("tiny", tiny_overrides + ["train.max_steps=8", "train.save_every=2", "train.max_tokens=512"]),
          run, resume=True, quiet=True, allow_config_change=True)
    states = {int(p.stem[5:]): load_checkpoint(p, with_state=False).meta["train_state"] for p in list_checkpoints(run)}
    before, after = epochs_into(states[6]), epochs_into(states[8])
    assert states[8]["epoch_batches"] > states[6]["epoch_batches"]
    assert 0 < after - before < 3 / states[8]["epoch_batches"], (before, after)  # 2 steps, and rounding


def test_a_log_lines_tokens_per_second_are_its_own_steps(tmp_path, tiny_overrides, monkeypatch):
    """On a CPU a step is computed as it is queued, before the step before it is booked: a log line's time
    runs from the end of the line before's last step to the end of its own, never into the step queued
    after it. Steps of 0.02 s and 0.2 s in turn: each line's tokens over its tokens/s is its own step's."""
    seconds, tokens = {}, {}

    def timed_step(model, optimizer, batches, *args, **kwargs):
        k = len(seconds) + 1
        seconds[k], tokens[k] = 0.02 if k % 2 else 0.2, sum(b.n_tgt_tokens for b in batches)
        time.sleep(seconds[k])
        return training.QueuedStep(torch.tensor([float(tokens[k]), 1.0, 1.0]), tokens[k])

    monkeypatch.setattr(training, "queue_step", timed_step)
    run = tmp_path / "run"
    train(load_config("tiny", tiny_overrides + ["train.max_steps=6", "train.log_every=1", "train.eval_every=3"]),
          run, quiet=True)
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == list(range(1, 7))
    for r in records:  # a step's own time and the trainer's bookkeeping, not the validation at steps 3 and 6
        assert seconds[r["step"]] <= tokens[r["step"]] / r["tokens_per_s"] < seconds[r["step"]] + 0.08, r


def test_the_summary_takes_the_last_steps_validation_rather_than_validating_again(tmp_path, tiny_overrides,
                                                                                     monkeypatch):
    """A run whose last step validated validated the same weights again for summary.json: on a large validation
    set (50k pairs, 26 s for the tiny model) that doubled the last validation. A run whose last step did not
    validate still validates for its summary."""
    from transformer import train as training

    calls, validate = [], training.validate

    def counted(*args, **kwargs):
        calls.append(1)
        return validate(*args, **kwargs)

    monkeypatch.setattr(training, "validate", counted)
    for steps, validations in ((4, 2), (5, 3)):  # validated at 2 and 4; at 2, 4, and for the summary of 5
        calls.clear()
        run = tmp_path / f"run{steps}"
        summary = train(load_config("tiny", tiny_overrides + [f"train.max_steps={steps}", "train.log_every=1",
                                                              "train.eval_every=2"]), run, quiet=True)
        assert len(calls) == validations
        last = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()][-1]
        assert (summary["valid_nll"] == last.get("valid_nll")) == (steps == 4)
        assert summary["valid_ppl"] == pytest.approx(math.exp(summary["valid_nll"]))


def test_encoding_a_large_training_text_is_said_first(tmp_path, tiny_overrides, monkeypatch):
    """A million pairs took ~30 s to encode with nothing in the log before the "train:" line: a start-up that looked
    hung. From LARGE_TEXT pairs (here lowered to the slice's), the log says it encodes them, and of the store."""
    from transformer import train as training

    for large, said in ((10**9, False), (1, True)):
        monkeypatch.setattr(training, "LARGE_TEXT", large)
        run = tmp_path / f"run{large}"
        train(load_config("tiny", tiny_overrides + ["train.max_steps=1"]), run, quiet=True)
        log = (run / "train.log").read_text()
        assert ("train: encoding " in log and "transformer preprocess" in log) == said
        if said:
            assert log.index("train: encoding ") < log.index(" pairs used of ")  # before, not after


def test_the_progress_bar_says_when_it_stands_still_for_a_validation(tmp_path, tiny_overrides, monkeypatch):
    """A validation (minutes on a large set, or a dev BLEU) left the bar standing with nothing said: it now reads
    "validating" meanwhile, and "train" again after, as a terminal shows it ("train: :  10%" was drawn, tqdm's
    set_description adding a second ": " to the bar's own)."""
    import io

    from tqdm import tqdm

    from transformer import train as training

    seen = []

    class Bar(tqdm):
        def set_description_str(self, desc=None, refresh=True):
            seen.append(desc)
            super().set_description_str(desc, refresh)

    class Terminal(io.StringIO):
        def isatty(self):
            return True

    terminal = Terminal()
    monkeypatch.setattr(training, "tqdm", Bar)
    monkeypatch.setattr(sys, "stderr", terminal)
    monkeypatch.setattr(training.Trainer, "evaluate", lambda self: seen.append("evaluated") or {"valid_nll": 1.0,
                                                                                             "valid_ppl": math.e})
    train(load_config("tiny", tiny_overrides + ["train.max_steps=4", "train.log_every=1", "train.eval_every=2"]),
          tmp_path / "run", quiet=False)
    assert seen == ["train", "train (validating)", "evaluated", "train"] * 2  # steps 1 and 2, then 3 and 4
    drawn = [line for line in re.split(r"[\r\n]", terminal.getvalue()) if "%|" in line]
    assert drawn and all(re.match(r"train( \(validating\))?: +\d+%\|", line) for line in drawn), drawn[-3:]


def test_save_every_is_the_one_save_clock_where_set(tmp_path, tiny_overrides):
    """save_every with the default save_minutes kept both clocks: checkpoints of either (33, 40, 46, 50, 54...),
    and the average of the last N took them unevenly spaced. save_every, where set, is the one clock."""
    from transformer.checkpoint import list_checkpoints

    run = tmp_path / "run"
    train(load_config("tiny", tiny_overrides + ["train.max_steps=9", "train.save_every=4",
                                                "train.save_minutes=0.00001"]), run, quiet=True)
    assert [int(p.stem.split("_")[1]) for p in list_checkpoints(run)] == [4, 8, 9]


def test_the_progress_bar_counts_down_the_budget_that_ends_first():
    # the quick start: 893 of 8,000 updates after 9 min 40 s of 10 minutes is 97% done, not 11%
    assert budget_used(893, 8000, 580.0, 10.0) == 966
    assert budget_used(893, 1000, 60.0, 10.0) == 893  # the updates end first
    assert budget_used(500, 1000, 10_000.0, 0.0) == 500  # no minute budget
    assert budget_used(1000, 1000, 700.0, 10.0) == 1000  # never past the end


def test_accumulated_batches_normalise_by_all_tokens_of_the_step():
    """Two accumulated batches give the same update as one batch holding both (A3)."""
    import copy
    from transformer.data import Example, collate
    examples = [Example([5, 6, 7, 1], [8, 9, 1]), Example([5, 1], [8, 9, 10, 11, 12, 13, 1]),
                Example([7, 7, 7, 7, 7, 1], [9, 1])]
    cfg = load_config("tiny", ["model.p_drop=0.0"]).model
    torch.manual_seed(0)
    a = Transformer(cfg, 20)
    b, before = copy.deepcopy(a), copy.deepcopy(a)
    opt_a, opt_b = torch.optim.SGD(a.parameters(), lr=1.0), torch.optim.SGD(b.parameters(), lr=1.0)
    step_a = train_step(a, opt_a, [collate(examples, [0, 1]), collate(examples, [2])], 0.1, lr=1.0)
    step_b = train_step(b, opt_b, [collate(examples, [0, 1, 2])], 0.1, lr=1.0)
    assert step_a.n_tokens == step_b.n_tokens == 12 and step_a.applied and step_b.applied
    assert step_a.loss == pytest.approx(step_b.loss, rel=1e-5)
    for (name, pa), pb in zip(a.named_parameters(), b.parameters()):
        torch.testing.assert_close(pa, pb, atol=1e-6, rtol=1e-5, msg=name)
    # SGD at rate 1 moves the parameters by the gradient: the step's reported norm is its length
    moved = torch.cat([(p0 - p1).flatten() for p0, p1 in zip(before.parameters(), a.parameters())]).norm()
    assert step_a.grad_norm == pytest.approx(moved.item(), rel=1e-4) and step_a.grad_norm > 0
    assert step_b.grad_norm == pytest.approx(step_a.grad_norm, rel=1e-4)


def _smoothed_loss_by_hand(model: Transformer, examples: list[Example], eps: float) -> tuple[float, int]:
    """Σ over every target token of -Σ_v q_v log p_v (q: 1 - ε on the reference, ε/(V-1) elsewhere, A3), from
    the model's full logits one example at a time, and the count of target tokens."""
    total, n = 0.0, 0
    with torch.no_grad():
        for ex in examples:
            src, tgt = torch.tensor([ex.src]), torch.tensor([[BOS_ID] + ex.tgt[:-1]])  # shifted right (§3.1)
            lp = torch.log_softmax(model(src, tgt).double(), -1)[0]
            v = lp.size(-1)
            for position, y in enumerate(ex.tgt):
                total -= (1 - eps - eps / (v - 1)) * lp[position, y].item() + eps / (v - 1) * lp[position].sum().item()
                n += 1
    return total, n


@pytest.mark.parametrize("eps", [0.0, 0.1])
def test_the_trainers_loss_and_validation_score_the_model_as_section_5_4_says(eps):
    """The loss a step minimises is the label-smoothed cross-entropy at train.eps_ls, and validation's NLL and
    perplexity are per target token (Table 3's PPL, per word-piece), each against the model's own logits by
    hand: a trainer that dropped ε_ls, or counted source tokens, would still train and validate."""
    examples = [Example([5, 6, 7, 8, 9, 1], [8, 9, 1]), Example([5, 1], [8, 9, 10, 11, 12, 13, 1]),
                Example([7, 7, 7, 7, 7, 7, 7, 1], [9, 1])]
    torch.manual_seed(0)
    model = Transformer(load_config("tiny", ["model.p_drop=0.0"]).model, 20).eval()
    by_hand, n = _smoothed_loss_by_hand(model, examples, eps)
    batch = collate(examples, [0, 1, 2])
    assert batch.n_tgt_tokens == n == 12
    assert training.batch_loss(model, batch, eps).item() == pytest.approx(by_hand, rel=1e-5)
    step = train_step(model, torch.optim.SGD(model.parameters(), lr=0.0), [batch], eps, lr=0.0)
    assert step.loss == pytest.approx(by_hand, rel=1e-5) and step.n_tokens == n  # summed, as logged
    nll, _ = _smoothed_loss_by_hand(model, examples, 0.0)
    scores = training.validate(model, examples, max_tokens=10, eps_ls=eps)  # several batches of 10 tokens
    assert scores["valid_nll"] == pytest.approx(nll / n, rel=1e-5)
    assert scores["valid_ppl"] == pytest.approx(math.exp(nll / n), rel=1e-5)
    assert scores["valid_smoothed_loss"] == pytest.approx(by_hand / n, rel=1e-5)


def test_training_text_with_no_pair_short_enough_says_why(tmp_path, tiny_overrides):
    """data.max_len 2 keeps no pair of these (each side of one piece at most): the error said only "no usable
    training pairs", where the validation's and the token store's count what was left out, and why. data.max_len
    1, which can keep no pair of any text (a piece and EOS are 2), is refused as the config loads, not after the
    vocabulary is trained."""
    with pytest.raises(DataError, match=r"\.en: no usable training pairs of 600 \(0 with an empty side, 600 "
                                        r"longer than data\.max_len 2 pieces with EOS\)$"):
        train(load_config("tiny", tiny_overrides + ["data.max_len=2"]), tmp_path / "run", quiet=True)
    with pytest.raises(ConfigError, match=r"data.max_len 1: a sentence of one piece with its EOS is 2 pieces"):
        load_config("tiny", tiny_overrides + ["data.max_len=1"])


def test_clip_norm_scales_the_step_to_that_global_norm():
    """train.clip_norm (0 in the paper's code, A2; an option here) rescales the step's gradients to that global
    L2 norm when they are longer, keeping their direction; the reported grad_norm is the norm before clipping."""
    import copy
    examples = [Example([5, 6, 7, 1], [8, 9, 1]), Example([5, 1], [8, 9, 10, 11, 1])]
    cfg = load_config("tiny", ["model.p_drop=0.0"]).model
    torch.manual_seed(0)
    free = Transformer(cfg, 20)
    clipped, before = copy.deepcopy(free), copy.deepcopy(free)
    batch = [collate(examples, [0, 1])]
    step_free = train_step(free, torch.optim.SGD(free.parameters(), lr=1.0), batch, 0.1, lr=1.0)
    limit = step_free.grad_norm / 4
    step_clipped = train_step(clipped, torch.optim.SGD(clipped.parameters(), lr=1.0), batch, 0.1, lr=1.0,
                              clip_norm=limit)
    assert step_clipped.grad_norm == pytest.approx(step_free.grad_norm, rel=1e-5) and step_clipped.applied

    def moved(model):  # SGD at rate 1: the parameters move by the (clipped) gradient
        return torch.cat([(p0 - p1).flatten() for p0, p1 in zip(before.parameters(), model.parameters())])

    assert moved(clipped).norm().item() == pytest.approx(limit, rel=1e-4)
    torch.testing.assert_close(moved(clipped) * 4, moved(free), atol=1e-6, rtol=1e-4)


@pytest.mark.parametrize("clip", [0.0, 0.25, 1e6])
def test_fused_adam_clips_as_it_reads_the_gradients(clip):
    """The trainer's fused Adam takes clipping as a divisor of the gradients it reads (grad_scale), with no
    pass of its own over them: the update is the one Adam makes from gradients clip_grad_norm_ clipped first
    (clip 0: none; a limit above the norm: no change either), and the divisor is gone before the next step."""
    import copy
    from transformer.optim import make_optimizer
    examples = [Example([5, 6, 7, 1], [8, 9, 1]), Example([5, 1], [8, 9, 10, 11, 1])]
    cfg = load_config("tiny", ["model.p_drop=0.0"])
    torch.manual_seed(0)
    fused = Transformer(cfg.model, 20)
    reference = copy.deepcopy(fused)
    optimizer = make_optimizer(fused, cfg.train)
    assert optimizer.defaults["fused"]
    batch = [collate(examples, [0, 1])]
    step = train_step(fused, optimizer, batch, 0.1, lr=1e-3, clip_norm=clip)

    adam = torch.optim.Adam(reference.parameters(), lr=1e-3, betas=(cfg.train.beta1, cfg.train.beta2),
                            eps=cfg.train.adam_eps, foreach=False)
    loss = training.batch_loss(reference, batch[0], 0.1) / step.n_tokens
    loss.backward()
    norm = torch.nn.utils.clip_grad_norm_(reference.parameters(), clip or float("inf"))
    adam.step()
    assert step.applied and step.grad_norm == pytest.approx(norm.item(), rel=1e-5)
    assert clip != 0.25 or norm > 4 * clip  # the clipped case clips
    for (name, p), q in zip(fused.named_parameters(), reference.parameters()):
        torch.testing.assert_close(p, q, atol=1e-7, rtol=1e-5, msg=name)
    assert optimizer.grad_scale is None and optimizer.found_inf is None  # not applied to a later step


def test_the_trainer_steps_with_the_configured_clip_norm_smoothing_and_accumulation(tmp_path, tiny_overrides,
                                                                                    monkeypatch):
    """train.clip_norm, train.eps_ls and train.update_freq reach every optimizer step: a setting the config
    accepts and logs but the loop does not pass on trains as the default would, and no other test compares."""
    seen = []
    real = training.queue_step

    def spy(model, optimizer, batches, eps_ls, lr, clip_norm=0.0, *args, **kwargs):
        seen.append((len(batches), eps_ls, clip_norm))
        return real(model, optimizer, batches, eps_ls, lr, clip_norm, *args, **kwargs)

    monkeypatch.setattr(training, "queue_step", spy)
    sets = ["train.max_steps=2", "train.clip_norm=0.5", "train.eps_ls=0.2", "train.update_freq=2"]
    train(load_config("tiny", tiny_overrides + sets), tmp_path / "run", quiet=True)
    assert seen == [(2, 0.2, 0.5)] * 2


def test_tiny_model_overfits_twenty_pairs(tmp_path, multi30k):
    from tests.conftest import write_slice
    src, tgt = write_slice(multi30k, tmp_path, "train", 0, 20)
    spm_src, spm_tgt = write_slice(multi30k, tmp_path, "train", 0, 2000)
    run = tmp_path / "run"
    run.mkdir()
    Tokenizer.train(read_lines(spm_src) + read_lines(spm_tgt), run / "spm.model", vocab_size=300,
                    input_sentence_size=10000)
    cfg = load_config("tiny", [f'data.train_src="{src}"', f'data.train_tgt="{tgt}"', f'data.valid_src="{src}"',
                               f'data.valid_tgt="{tgt}"', "data.vocab_size=300", "model.p_drop=0.0",
                               "train.eps_ls=0.0", "train.max_steps=400", "train.warmup_steps=50",
                               "train.lr_scale=0.5", "train.log_every=50", "train.eval_every=400",
                               "train.save_minutes=0", "train.threads=1"])
    summary = train(cfg, run, quiet=True)
    # 300 steps (nll 0.003) left one greedy choice between a token and its repeat close enough to flip on another
    # CPU's kernels; 400 steps bring the nll to ~2e-4, memorised with margin.
    assert summary["valid_nll"] < 0.01
    tok = Tokenizer(run / "spm.model")
    ckpt = load_checkpoint(list_checkpoints(run)[-1], with_state=False)
    model = Transformer(cfg.model, tok.vocab_size).eval()
    model.load_state_dict(ckpt.weights)
    sources = [tok.encode(line) + [1] for line in src.read_text().splitlines()]
    outputs = translate_ids(model, sources, beam_size=1, alpha=0.6, max_len_offset=50, batch_size=8)
    expected = [tok.encode(line) for line in tgt.read_text().splitlines()]
    assert outputs == expected


@pytest.mark.parametrize("extra", [[], ["train.shape_buckets=8"]], ids=["plain", "shape-buckets"])
def test_training_from_a_token_store_equals_training_from_text(tmp_path, tiny_overrides, extra):
    from transformer.cli import main
    from transformer.checkpoint import list_checkpoints, load_checkpoint
    overrides = tiny_overrides + extra + ["train.max_steps=4", "train.save_every=4"]
    text = tmp_path / "text"
    train(load_config("tiny", overrides), text, quiet=True)
    store = tmp_path / "store"
    sets = [x for o in overrides for x in ("--set", o)]
    assert main(["preprocess", "tiny", "--out", str(store), "--spm", str(text / "spm.model"), *sets]) == 0
    assert (store / "spm.model").read_bytes() == (text / "spm.model").read_bytes()
    from_store = tmp_path / "from_store"
    train(load_config("tiny", overrides + [f'data.train_store="{store}"', 'data.train_src=""',
                                           'data.train_tgt=""']), from_store, quiet=True)
    a = load_checkpoint(list_checkpoints(text)[-1]).weights
    b = load_checkpoint(list_checkpoints(from_store)[-1]).weights
    for name in a:
        assert torch.equal(a[name], b[name]), name



def test_a_token_store_with_pairs_past_data_max_len_is_refused(tmp_path, tiny_overrides):
    """Text is cut at data.max_len as it is read, a store when it was written: training took the store's
    longer pairs as they were, and with a learned position table of data.max_len rows the first step of
    such a pair died. Refused before anything trains; a max_len the store's pairs fit is taken."""
    from transformer.cli import main
    from transformer.store import TokenStore
    store = tmp_path / "store"
    sets = [x for o in tiny_overrides for x in ("--set", o)]
    assert main(["preprocess", "tiny", "--out", str(store), *sets]) == 0
    opened = TokenStore(store)
    longest = int(max(opened.src_lengths.max(), opened.tgt_lengths.max()))
    from_store = tiny_overrides + [f'data.train_store="{store}"', 'data.train_src=""', 'data.train_tgt=""',
                                   "train.max_steps=1"]
    with pytest.raises(DataError, match=rf"^{re.escape(str(store))}: the token store holds pairs of up to {longest} "
                                        rf"pieces \(written with data.max_len 256\), longer than this run's "
                                        rf"data.max_len {longest - 1}: write it again"):
        train(load_config("tiny", from_store + [f"data.max_len={longest - 1}"]), tmp_path / "short", quiet=True)
    assert not (tmp_path / "short").exists()  # refused before the run's folder is made
    train(load_config("tiny", from_store + [f"data.max_len={longest}"]), tmp_path / "fits", quiet=True)
    # another corpus encoded into the same folder: a resume on it went on without a word (text_sha256 was null)
    for side in ("src", "tgt"):
        name = next(o for o in tiny_overrides if o.startswith(f"data.train_{side}=")).split("=", 1)[1].strip('"')
        (tmp_path / f"half.{side}").write_text("".join(line + "\n" for line in read_lines(name)[:300]))
    assert main(["preprocess", "tiny", "--out", str(store), "--overwrite", "--spm", str(tmp_path / "fits"), *sets,
                 "--set", f'data.train_src="{tmp_path / "half.src"}"', "--set",
                 f'data.train_tgt="{tmp_path / "half.tgt"}"']) == 0
    again = load_config("tiny", from_store + [f"data.max_len={longest}", "train.max_steps=2"])
    with pytest.raises(TrainError, match=r"^--resume: data.train_store changed since step_00000001.json was written"):
        train(again, tmp_path / "fits", resume=True, quiet=True)
    assert train(again, tmp_path / "fits", resume=True, quiet=True, allow_config_change=True)["step"] == 2
    # another data.vocab_size than the store's vocabulary: the run's config.toml said 499 of a 500-piece model
    with pytest.raises(ConfigError, match=rf"^data.vocab_size 499: the token store {re.escape(str(store))} was "
                                          "written with a vocabulary of 500 pieces; set data.vocab_size = 500"):
        train(load_config("tiny", from_store + ["data.vocab_size=499"]), tmp_path / "other", quiet=True)
    assert not (tmp_path / "other").exists()


def test_a_token_store_run_leaves_no_vocabulary_a_text_run_would_take(tmp_path, tiny_overrides):
    """A store run refused for its data.vocab_size had copied the store's spm.model into the run folder, with no
    record of where it came from: a later run of text there took it for its own, a 300-piece vocabulary for
    a config of 400. The store's is copied once the store has passed its checks, its record naming the store
    (a run of text then trains its own), and it replaces one that an attempt that wrote no checkpoint left."""
    from transformer.cli import main
    store, out = tmp_path / "store", tmp_path / "run"
    assert main(["preprocess", "tiny", "--out", str(store), *[x for o in tiny_overrides for x in ("--set", o)],
                 "--set", "data.vocab_size=300"]) == 0
    from_store = [f'data.train_store="{store}"', 'data.train_src=""', 'data.train_tgt=""', "train.max_steps=1"]
    with pytest.raises(ConfigError, match=r"^data.vocab_size 400: the token store .* with a vocabulary of 300"):
        train(load_config("tiny", tiny_overrides + from_store + ["data.vocab_size=400"]), out, quiet=True)
    assert not out.exists()  # refused before the folder is made: it held config.toml and .lock
    train(load_config("tiny", tiny_overrides + ["data.vocab_size=400", "train.max_steps=1"]), out, quiet=True)
    assert Tokenizer(out / "spm.model").vocab_size == 400
    left = tmp_path / "left"  # an attempt of text that wrote its vocabulary and no checkpoint
    left.mkdir()
    for name in ("spm.model", "spm.json"):
        (left / name).write_bytes((out / name).read_bytes())
    train(load_config("tiny", tiny_overrides + from_store + ["data.vocab_size=300"]), left, quiet=True)
    assert (left / "spm.model").read_bytes() == (store / "spm.model").read_bytes()
    assert json.loads((left / "spm.json").read_text()) == {"train_store": str(store)}
    assert f"{left / 'spm.model'}: left by an earlier attempt" in (left / "train.log").read_text()


def test_a_fine_tune_on_a_token_store_of_another_vocabulary_is_refused_before_its_folder(tmp_path, tiny_overrides):
    """A fine-tune's store is read with its parent's vocabulary: one encoded with another was refused after the run
    folder was made (config.toml, spm.model, .lock left); one of the parent's trains, and its resume too, whatever
    data.vocab_size says (the parent's 400 pieces, the config's 500): that was refused, "set data.vocab_size = 400",
    where a fine-tune of text says that it does not apply."""
    from transformer.cli import main
    parent = tmp_path / "parent"
    train(load_config("tiny", tiny_overrides + ["train.max_steps=1", "data.vocab_size=400"]), parent, quiet=True)
    sets = [x for o in tiny_overrides for x in ("--set", o)]
    assert main(["preprocess", "tiny", "--out", str(tmp_path / "own"), "--spm", str(parent), *sets]) == 0
    assert main(["preprocess", "tiny", "--out", str(tmp_path / "other"), *sets, "--set", "data.vocab_size=300"]) == 0
    for store, out in (("other", "refused"), ("own", "tuned")):
        cfg = load_config("tiny", tiny_overrides + [f'data.train_store="{tmp_path / store}"', "train.max_steps=1"])
        if store == "other":
            with pytest.raises(DataError, match=rf"^{re.escape(str(tmp_path / 'other'))}/meta.json: encoded with "):
                train(cfg, tmp_path / out, quiet=True, init_from=parent)
            assert not (tmp_path / out).exists()
        else:
            assert train(cfg, tmp_path / out, quiet=True, init_from=parent)["step"] == 1
            again = load_config("tiny", tiny_overrides + [f'data.train_store="{tmp_path / store}"',
                                                           "train.max_steps=2"])
            assert train(again, tmp_path / out, quiet=True, resume=True)["step"] == 2
            assert (tmp_path / out / "train.log").read_text().count("data.vocab_size 500 does not apply") == 2


def test_a_token_store_of_the_other_task_is_refused(tmp_path, tiny_overrides, tiny_parse_run):
    """A parsing run trained on a translation store (and the reverse) without a word; its parser was refused only
    once trained ("not a parsing model"). The store now records its task; one written before that is checked, for
    a parsing run, by its vocabulary's bracket symbols."""
    from transformer.cli import main
    store = tmp_path / "store"
    assert main(["preprocess", "tiny", "--out", str(store), *[x for o in tiny_overrides for x in ("--set", o)]]) == 0
    meta = json.loads((store / "meta.json").read_text())
    assert meta["task"] == "translate"
    splits = tiny_parse_run.parent
    sets = [f'data.train_store="{store}"', 'data.train_src=""', 'data.train_tgt=""',
            f'data.valid_src="{splits}/valid.words"', f'data.valid_tgt="{splits}/valid.wlin"', "train.max_steps=1"]
    # the task is said first: with the preset's data.vocab_size, the run was told to change it, then the task
    assert load_config("configs/ptb_sample_parse.toml", sets).data.vocab_size != meta["vocab_size"]
    with pytest.raises(DataError, match=rf"^data.train_store {re.escape(str(store))}: pairs of data.task 'translate' "
                                        r"\(sentences\), and this run's data.task is 'parse' \(trees\)"):
        train(load_config("configs/ptb_sample_parse.toml", sets), tmp_path / "parse", quiet=True)
    assert not (tmp_path / "parse").exists()
    parse = load_config("configs/ptb_sample_parse.toml", sets + [f"data.vocab_size={meta['vocab_size']}"])
    (store / "meta.json").write_text(json.dumps({k: v for k, v in meta.items() if k != "task"}))  # an older store's
    # a store holds ids alone: the validation trees are what the vocabulary is checked against, and named so
    with pytest.raises(DataError, match=r"^data.task is \"parse\", and the vocabulary .* has none of the validation "):
        train(parse, tmp_path / "parse_older", quiet=True)
    (store / "meta.json").write_text(json.dumps(meta | {"task": "parse"}))
    with pytest.raises(DataError, match=r"pairs of data.task 'parse' \(trees\), and this run's data.task "
                                        r"is 'translate' \(sentences\)"):
        train(load_config("tiny", tiny_overrides + [f'data.train_store="{store}"', "train.max_steps=1"]),
              tmp_path / "translate", quiet=True)

def _snapshot(model, optimizer):
    import copy
    return copy.deepcopy(model.state_dict()), copy.deepcopy(optimizer.state_dict())


@pytest.mark.parametrize("precision", ["fp32", "fp16"])
def test_a_step_with_non_finite_gradients_changes_nothing(precision):
    from transformer.data import Example, collate
    from transformer.optim import make_optimizer
    examples = [Example([5, 6, 7, 1], [8, 9, 1]), Example([5, 1], [8, 9, 10, 1])]
    cfg = load_config("tiny", ["model.p_drop=0.0"])
    torch.manual_seed(0)
    model = Transformer(cfg.model, 20)
    optimizer = make_optimizer(model, cfg.train)
    scaler = torch.amp.GradScaler("cpu") if precision == "fp16" else None
    amp = torch.float16 if precision == "fp16" else None
    batch = [collate(examples, [0, 1])]
    assert train_step(model, optimizer, batch, 0.1, 1e-3, scaler=scaler, amp_dtype=amp).applied
    weights, state = _snapshot(model, optimizer)
    scale = scaler.get_scale() if scaler else None
    hook = model.encoder[0].ffn.w1.weight.register_hook(lambda g: g * float("nan"))
    result = train_step(model, optimizer, batch, 0.1, 1e-3, scaler=scaler, amp_dtype=amp)
    hook.remove()
    assert not result.applied
    for name, value in model.state_dict().items():
        assert torch.equal(value, weights[name]), name
    after = optimizer.state_dict()
    assert after["state"].keys() == state["state"].keys()
    for i in state["state"]:
        for k, v in state["state"][i].items():
            assert torch.equal(after["state"][i][k], v), (i, k)  # Adam's step count and moments too
    if scaler:
        assert scaler.get_scale() < scale  # the loss scale backs off after an overflow


def test_the_device_side_skip_equals_the_host_side_one():
    """fused Adam skips a non-finite step on the device (found_inf) without the host waiting for the
    norm first: over steps with a skip between them, the same weights and Adam state, bit for bit, as
    deciding on the host whether to call the optimizer at all."""
    from transformer.data import Example, collate
    from transformer.optim import make_optimizer
    examples = [Example([5, 6, 7, 1], [8, 9, 1]), Example([5, 1], [8, 9, 10, 1])]
    cfg = load_config("tiny", ["model.p_drop=0.0"])
    batch = [collate(examples, [0, 1])]
    runs = []
    for device_side in (True, False):
        torch.manual_seed(0)
        model = Transformer(cfg.model, 20)
        optimizer = make_optimizer(model, cfg.train)
        assert optimizer.defaults["fused"]
        optimizer.defaults["fused"] = device_side  # False: the optimizer (still fused) is called only when finite
        applied = []
        for poisoned in (False, True, False, False):
            hook = model.encoder[0].ffn.w1.weight.register_hook(lambda g: g * float("nan")) if poisoned else None
            applied.append(train_step(model, optimizer, batch, 0.1, 1e-3).applied)
            if hook:
                hook.remove()
        runs.append((applied, *_snapshot(model, optimizer)))
    (applied_a, weights_a, state_a), (applied_b, weights_b, state_b) = runs
    assert applied_a == applied_b == [True, False, True, True]
    assert all(torch.equal(weights_a[k], weights_b[k]) for k in weights_a)
    for i in state_b["state"]:
        for k, v in state_b["state"][i].items():
            assert torch.equal(state_a["state"][i][k], v), (i, k)


def test_skipped_steps_are_counted_not_taken_and_too_many_stop_training(tmp_path, tiny_overrides, monkeypatch,
                                                                         capsys):
    import transformer.train as T
    from transformer.checkpoint import list_checkpoints, load_checkpoint
    real, calls = T.label_smoothed_loss, {"n": 0}

    def poisoned(hidden, weight, target, eps_ls, bad=(2, 3)):
        calls["n"] += 1
        loss = real(hidden, weight, target, eps_ls)
        return loss * float("nan") if calls["n"] in bad else loss
    monkeypatch.setattr(T, "label_smoothed_loss", poisoned)
    run = tmp_path / "run"
    summary = train(load_config("tiny", tiny_overrides + ["train.max_steps=4", "train.save_every=1",
                                                          "train.eval_every=1000"]), run, quiet=True)
    assert summary["step"] == 4 and summary["skipped_steps"] == 2
    meta = load_checkpoint(list_checkpoints(run)[-1]).meta
    assert meta["train_state"]["step"] == 4 and meta["train_state"]["skipped_steps"] == 2
    for path in list_checkpoints(run):
        assert all(torch.isfinite(w).all() for w in load_checkpoint(path).weights.values())
    assert "gradients are not finite" in (run / "train.log").read_text()

    monkeypatch.setattr(T, "label_smoothed_loss", lambda *a: poisoned(*a, bad=range(3, 100)))
    calls["n"] = 0
    from transformer.cli import main

    sets = [a for o in tiny_overrides + ["train.max_steps=20", "train.max_bad_steps=3"] for a in ("--set", o)]
    capsys.readouterr()
    assert main(["train", "tiny", "--out", str(tmp_path / "run2"), *sets]) == 1
    said = capsys.readouterr()
    last = (tmp_path / "run2" / "train.log").read_text().splitlines()[-1]
    assert "error: 3 steps in a row had non-finite gradients" in last  # the log says why the run ended
    # in fp32 and before any checkpoint: the line said "the newest checkpoint holds finite weights" and "use
    # fp32/bf16 instead of fp16"
    assert "(no checkpoint was written yet). Lower train.lr_scale" in last and "fp16" not in last
    # and the terminal once, from the command line (the log's line went there too, before its own)
    assert (said.out + said.err).count("3 steps in a row had non-finite gradients") == 1, said


def test_weights_past_floats_range_are_never_written_and_the_stop_says_which_checkpoint_is_left(
        tmp_path, tiny_overrides, monkeypatch):
    """train.lr_scale 1e300 (now refused up front): the first step, its gradients finite, made every weight NaN,
    and the checkpoint of that step was written, averaged into translations and resumed from; the stop that
    followed said "the newest checkpoint holds finite weights". Before any update, a stop blamed the rate, which
    had played no part."""
    import transformer.train as T
    from transformer.checkpoint import list_checkpoints

    common = tiny_overrides + ["train.save_every=1", "train.eval_every=1000", "train.max_bad_steps=3"]
    with pytest.raises(ConfigError, match=r"train.lr_scale 1e\+300: eq. \(3\)'s peak rate .* beyond float32's range"):
        load_config("tiny", common + ["train.lr_scale=1e300"])
    step = training.queue_step

    def overflowing(model, *args, **kwargs):  # a step applied, its gradients finite, that leaves a weight inf
        queued = step(model, *args, **kwargs)
        with torch.no_grad():
            next(model.parameters()).fill_(float("inf"))
        return queued
    monkeypatch.setattr(training, "queue_step", overflowing)
    with pytest.raises(TrainError, match=r"^step 1: the weights are not finite \(a step at too high a rate overflowed "
                                         r"them\); no checkpoint written, none was written before\. Lower"):
        train(load_config("tiny", common + ["train.max_steps=5"]), tmp_path / "run", quiet=True)
    assert list_checkpoints(tmp_path / "run") == []
    assert (tmp_path / "run" / "train.log").read_text().count("step 1: the weights are not finite") == 1  # said once
    monkeypatch.setattr(training, "queue_step", step)

    real, calls = T.label_smoothed_loss, {"n": 0}

    def poisoned(hidden, weight, target, eps_ls):  # the gradients of the third step on are not finite
        calls["n"] += 1
        loss = real(hidden, weight, target, eps_ls)
        return loss * float("nan") if calls["n"] >= first_bad else loss
    monkeypatch.setattr(T, "label_smoothed_loss", poisoned)
    first_bad = 3
    with pytest.raises(TrainError, match=r"stopping at step 2 \(the newest checkpoint, of step 2, holds the weights "
                                         r"they started from\)\. Lower train.lr_scale"):
        train(load_config("tiny", common + ["train.max_steps=20"]), tmp_path / "run2", quiet=True)
    calls["n"], first_bad = 0, 1
    with pytest.raises(TrainError, match=r"stopping at step 0 \(no checkpoint was written yet\)\. The initial "
                                         r"model's gradients overflow: check the dropout rates"):
        train(load_config("tiny", common + ["train.max_steps=20"]), tmp_path / "run3", quiet=True)


def test_a_validation_that_is_not_a_number_is_never_the_best(tmp_path, tiny_overrides, monkeypatch):
    """A NaN valid_nll was kept as the best (no best yet): best.safetensors held the weights that gave it, no later
    value could beat it, and its NaN in the checkpoint's record made the run's own checkpoint refused on resume."""
    import transformer.train as T
    from transformer.checkpoint import list_checkpoints, load_checkpoint

    real, calls = T.validate, {"n": 0}

    def first_is_nan(*args, **kwargs):
        calls["n"] += 1
        return {k: float("nan") for k in real(*args, **kwargs)} if calls["n"] == 1 else real(*args, **kwargs)
    monkeypatch.setattr(T, "validate", first_is_nan)
    cfg = load_config("tiny", tiny_overrides + ["train.max_steps=4", "train.eval_every=2", "train.log_every=2",
                                                "train.save_every=2", 'train.keep_best="valid_loss"'])
    train(cfg, tmp_path / "run", quiet=True)
    log = (tmp_path / "run" / "train.log").read_text()
    assert "valid_loss is nan: not a best, counted as no improvement" in log
    state = load_checkpoint(list_checkpoints(tmp_path / "run")[-1], with_state=False).meta["train_state"]
    assert state["best_step"] == 4 and math.isfinite(state["best_value"])
    cfg = load_config("tiny", tiny_overrides + ["train.max_steps=6", "train.eval_every=2", "train.log_every=2",
                                                "train.save_every=2", 'train.keep_best="valid_loss"',
                                                "train.patience=1"])
    calls["n"] = 0
    with pytest.raises(TrainError, match="validation loss is nan"):  # its last validation is its summary's
        train(cfg, tmp_path / "run2", quiet=True)
    assert ("(train.patience); no evaluation had a finite value" in (tmp_path / "run2" / "train.log").read_text())


def test_cooldown_anneals_the_logged_rate_to_zero(tmp_path, tiny_overrides):
    """train.cooldown_fraction: eq. (3) until the last fraction of max_steps, then linear to 0."""
    from transformer.optim import learning_rate
    common = tiny_overrides + ["train.log_every=5", "train.eval_every=1000", "train.max_steps=20",
                               "train.warmup_steps=4"]
    train(load_config("tiny", common + ["train.cooldown_fraction=0.5"]), tmp_path / "run", quiet=True)
    logged = {r["step"]: r["lr"] for r in map(json.loads, (tmp_path / "run" / "metrics.jsonl").read_text().splitlines())}
    cfg = load_config("tiny", common)
    eq3 = lambda step: learning_rate(step, cfg.model.d_model, 4, cfg.train.lr_scale)  # noqa: E731
    assert logged[5] == pytest.approx(eq3(5))  # before the last half: eq. (3)
    assert logged[10] == pytest.approx(eq3(10))  # progress 9/20: still eq. (3)
    assert logged[15] == pytest.approx(eq3(15) * (1 - 14 / 20) / 0.5)
    assert 0 < logged[20] == pytest.approx(eq3(20) * (1 - 19 / 20) / 0.5)


@pytest.mark.parametrize("avx512_bf16, amx", [(False, False), (True, False), (False, True)])
def test_native_bf16_on_a_cpu_reads_its_bf16_instructions(monkeypatch, avx512_bf16, amx):
    """A CPU multiplies bf16 natively with AVX512-BF16 or AMX; without either it would emulate it."""
    monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: avx512_bf16)
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: amx)
    assert native_bf16(torch.device("cpu")) == (avx512_bf16 or amx)
    assert resolved_precision("auto", torch.device("cpu")) == ("bf16" if avx512_bf16 or amx else "fp32")
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda including_emulation=True: not including_emulation)
    assert native_bf16(torch.device("cuda")) and not native_bf16(torch.device("meta"))


@pytest.mark.parametrize("units", [False, True])
def test_a_precision_this_cpu_would_emulate_is_said_in_the_log(tmp_path, tiny_overrides, monkeypatch, units):
    """fp16 on a CPU without AMX-FP16 trained at a seventh of fp32's rate, the log saying only "fp16 on cpu";
    bf16 without bf16 units likewise. fp32 is never emulated."""
    monkeypatch.setattr(torch.cpu, "_is_amx_fp16_supported", lambda: units)
    monkeypatch.setattr(runtime, "native_bf16", lambda device: units)
    assert [emulated_on_cpu(p) for p in ("fp32", "bf16", "fp16")] == [False, not units, not units]
    train(load_config("tiny", tiny_overrides + ["train.max_steps=1", "train.eval_every=1000",
                                                 'train.precision="fp16"']), tmp_path / "run", quiet=True)
    said = "note: train.precision fp16 on this CPU, which has no fp16 matrix units: its products are emulated"
    assert (said in (tmp_path / "run" / "train.log").read_text()) == (not units)


def test_what_a_run_without_checkpoints_would_delete_or_replace_is_refused_or_set_aside(tmp_path, tiny_overrides):
    """With no checkpoint to resume: a checkpoints folder of tensor files alone (copied without their .json
    records) was deleted as debris at the first save; a best.safetensors kept when checkpoints/ was removed to
    make room was replaced by a worse model, without a word (--resume said "starting from scratch"). A new run
    there is refused; a resume (a job's relaunch: a first save killed midway leaves the same) moves them aside,
    kept and said, once nothing refuses it, and trains."""
    cfg = load_config("tiny", tiny_overrides + ["train.max_steps=2", "train.log_every=1", "train.eval_every=1",
                                                 'train.keep_best="valid_loss"'])
    run = tmp_path / "run"
    train(cfg, run, quiet=True)
    for record in (run / "checkpoints").glob("*.json"):
        record.unlink()
    kept = {p.name: p.read_bytes() for p in [*(run / "checkpoints").iterdir(), run / "best.safetensors",
                                              run / "best.json"]}
    with pytest.raises(TrainError, match=rf"^{re.escape(str(run))}: checkpoints/step_00000002.safetensors, .*: an "
                                         r"earlier training's .* or pass --resume to set them aside and train$"):
        train(cfg, run, quiet=True)
    wider = load_config("tiny", tiny_overrides + ["train.max_steps=2", "model.d_ff=96"])
    with pytest.raises(TrainError, match=r"^--resume cannot take model changes"):  # refused: nothing moved
        train(wider, run, resume=True, quiet=True)
    assert not list(run.glob("set_aside_*")) and (run / "best.safetensors").exists()
    assert train(cfg, run, resume=True, quiet=True)["step"] == 2
    (aside,) = run.glob("set_aside_*")
    assert {p.name: p.read_bytes() for p in aside.iterdir()} == kept
    assert f"{aside}: " in (run / "train.log").read_text()
    # kept as checkpoints/ is: no output is written over them, and its best model is the run's to fine-tune from
    from transformer.cli import main
    assert main(["average", str(run), "--last", "1", "--out", str(aside / "step_00000002.safetensors")]) == 1
    assert {p.name: p.read_bytes() for p in aside.iterdir()} == kept
    assert train(cfg, tmp_path / "tuned", quiet=True, init_from=aside / "best.safetensors")["step"] == 2


def test_a_resume_or_fine_tune_refuses_tensors_that_do_not_fit(tmp_path, tiny_overrides):
    """A checkpoint whose tensors were rewritten, their sha256 sums redone (a foreign file, a record rebuilt by a
    tool): weights cast to integers were resumed (the loss jumped: truncated weights) and fine-tuned, Adam's
    moments a row short ended the process in a segmentation fault, a moment missing in an internal KeyError.
    Each is refused in one line naming the file, as `translate --checkpoint` refuses such weights."""
    from transformer.checkpoint import save_checkpoint

    cfg = load_config("tiny", tiny_overrides + ["train.max_steps=2", "train.eval_every=100"])
    run = tmp_path / "run"
    train(cfg, run, quiet=True)
    ckpt = load_checkpoint(list_checkpoints(run)[-1])
    moment = next(k for k in ckpt.state if k.endswith(".exp_avg"))
    index = moment.split(".")[1]
    cases = {"int": (dict({k: v.long() for k, v in ckpt.weights.items()}), ckpt.state,
                     r"weights do not fit the config \(\S+ is torch.int64, not a float tensor"),
             "short": (ckpt.weights, dict(ckpt.state, **{moment: ckpt.state[moment][:-1]}),
                       rf"Adam's exp_avg of parameter {index} is not a finite float tensor of its shape"),
             "missing": (ckpt.weights, {k: v for k, v in ckpt.state.items() if k != moment},
                         rf"Adam's state of parameter {index} holds \['exp_avg_sq', 'step'\]"),
             # none at all past step 0: Adam went on from fresh moments, and the resume was not exact
             "none": (ckpt.weights, {k: v for k, v in ckpt.state.items() if not k.startswith("optim.")},
                      r"Adam's state of parameter 0 holds \[\]")}
    longer = load_config("tiny", tiny_overrides + ["train.max_steps=3", "train.eval_every=100"])
    for name, (weights, state, said) in cases.items():
        shutil.copytree(run, tmp_path / name)
        record = save_checkpoint(tmp_path / name, ckpt.meta["step"], weights, state, ckpt.meta, keep_last=5)
        with pytest.raises(TrainError, match=rf"^--resume: {re.escape(str(record))}: {said}.*; move it out of "):
            train(longer, tmp_path / name, resume=True, quiet=True)
    with pytest.raises(TrainError, match=rf"^--init-from {re.escape(str(tmp_path / 'int'))}: {cases['int'][2]}"):
        train(cfg, tmp_path / "tuned", quiet=True, init_from=tmp_path / "int")


def test_a_run_started_again_hides_the_tensorboard_steps_of_an_attempt_without_checkpoints(tmp_path, tiny_overrides):
    """An attempt that wrote no checkpoint leaves its events in tb/, and a new run there started from step 0 kept
    them: TensorBoard drew the dead attempt's curves (its validation, here) beside the new run's. They are hidden
    from step 1, as a resume hides those past its checkpoint; metrics.jsonl's records go (trim_metrics)."""
    import shutil

    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    out = tmp_path / "run"
    train(load_config("tiny", tiny_overrides + ["train.max_steps=3", "train.log_every=1", "train.eval_every=1"]),
          out, quiet=True)
    shutil.rmtree(out / "checkpoints")  # an attempt killed before its first checkpoint
    train(load_config("tiny", tiny_overrides + ["train.max_steps=2", "train.log_every=1", "train.eval_every=100"]),
          out, quiet=True)
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    events = EventAccumulator(str(out / "tb"))
    events.Reload()
    logged = {tag: [e.step for e in events.Scalars(tag)] for tag in events.Tags()["scalars"]}
    assert logged == {key: [r["step"] for r in records if key in r] for key in logged} and logged["lr"] == [1, 2]
    assert any(tag.startswith("val") and not steps for tag, steps in logged.items()), logged  # the attempt's alone


def test_a_tensorboard_log_that_cannot_be_written_stops_alone(tmp_path, tiny_overrides, monkeypatch):
    """tb/ removed to make room, or a full disk met first by TensorBoard's writer: its thread printed a traceback,
    and the next write ended the training as an internal error, without a checkpoint, though metrics.jsonl and
    train.log hold the same values. The TensorBoard log stops, said once; the training goes on."""
    import errno
    import threading

    from torch.utils.tensorboard import SummaryWriter

    def full(self, *args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device", b"/x/tb/events.out")
    monkeypatch.setattr(SummaryWriter, "add_scalar", full)
    out = tmp_path / "run"
    assert train(load_config("tiny", tiny_overrides + ["train.max_steps=4", "train.log_every=1"]), out,
                 quiet=True)["step"] == 4
    log = (out / "train.log").read_text()
    assert log.count("note: the TensorBoard log stopped: /x/tb/events.out: No space left on device; training goes "
                     "on") == 1 and "step=4 " in log
    # its writer thread's own traceback is not printed; any other thread's is, a host's own TensorBoard writer's
    # too, and the process's hook is as it was once the board is closed (however training ended)
    printed: list[str] = []
    host = lambda args: printed.append(args.thread.name)  # noqa: E731
    monkeypatch.setattr(threading, "excepthook", host)
    monkeypatch.undo()  # SummaryWriter's own add_scalar again
    monkeypatch.setattr(threading, "excepthook", host)
    board = training.Board(tmp_path / "tb", None, lambda message: None)
    own = next(t for t in threading.enumerate() if type(t).__module__.startswith("tensorboard."))
    assert threading.excepthook is not host
    for thread in (own, threading.Thread(name="host's")):
        threading.excepthook(threading.ExceptHookArgs((OSError, OSError(errno.ENOSPC, "full"), None, thread)))
    assert printed == ["host's"]
    board.close()
    assert threading.excepthook is host


def test_a_log_line_cut_short_does_not_swallow_the_next_runs_first(tmp_path, tiny_overrides):
    """A full disk cut train.log's last line; the next attempt's first line was glued onto the fragment."""
    out = tmp_path / "run"
    out.mkdir()
    (out / "train.log").write_text("2026-12-06 12:00:00 step=3 epoch=0 lr=0.0")
    train(load_config("tiny", tiny_overrides + ["train.max_steps=1"]), out, quiet=True)
    lines = (out / "train.log").read_text().splitlines()
    assert lines[0] == "2026-12-06 12:00:00 step=3 epoch=0 lr=0.0" and lines[1][:2] == "20", lines[:2]


def test_a_hosts_default_dtype_neither_trains_the_model_nor_is_lost(tmp_path, tiny_overrides):
    """torch.set_default_dtype(torch.float64), as notebooks do, built and trained the model in float64 whatever
    train.precision said, and a resume under float32 went on in another dtype without a word."""
    torch.set_default_dtype(torch.float64)
    try:
        train(load_config("tiny", tiny_overrides + ["train.max_steps=1"]), tmp_path / "run", quiet=True)
        assert torch.get_default_dtype() == torch.float64
    finally:
        torch.set_default_dtype(torch.float32)
    weights = load_checkpoint(list_checkpoints(tmp_path / "run")[-1]).weights
    assert {t.dtype for t in weights.values()} == {torch.float32}


def test_an_out_that_is_no_folder_is_a_user_error(tmp_path, tiny_overrides):
    """train(cfg, a file) raised FileExistsError, a path under a file NotADirectoryError: not the UserError
    docs/python.md promises for a user's mistake."""
    (tmp_path / "file").write_text("x")
    for out in (tmp_path / "file", tmp_path / "file" / "run"):
        with pytest.raises(UserError, match=rf"^out {re.escape(str(out))}: "):
            train(load_config("tiny", tiny_overrides + ["train.max_steps=1"]), out, quiet=True)


def test_more_threads_than_cores_is_said_in_the_log(tmp_path, tiny_overrides, monkeypatch):
    """train.threads 1000 on 2 cores trained 90 times slower, and the log said nothing of it."""
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0})
    for threads, said in ((1, False), (2, True)):
        out = tmp_path / str(threads)
        train(load_config("tiny", tiny_overrides + ["train.max_steps=1", "train.eval_every=1000",
                                                     f"train.threads={threads}"]), out, quiet=True)
        assert ("note: train.threads 2 x 1 rank(s), on 1 core(s)" in (out / "train.log").read_text()) == said


@pytest.mark.parametrize("precision", ["fp32", "bf16", "fp16"])
def test_an_explicit_precision_is_kept_whatever_the_device(monkeypatch, precision):
    monkeypatch.setattr(training, "native_bf16", lambda device: True)
    assert resolved_precision(precision, torch.device("cpu")) == precision


@pytest.mark.parametrize("native", [True, False])
def test_auto_precision_trains_in_what_it_resolved_to_and_says_so(tmp_path, tiny_overrides, monkeypatch, native):
    """train.precision = "auto": bf16 autocast where the device has bf16 units, fp32 elsewhere; the log
    names the precision it resolved to."""
    monkeypatch.setattr(training, "native_bf16", lambda device: native)
    dtypes = set()
    hook = torch.nn.modules.module.register_module_forward_hook(
        lambda module, args, out: dtypes.add(out.dtype) if isinstance(module, torch.nn.Linear) else None)
    try:
        train(load_config("tiny", tiny_overrides + ["train.max_steps=2", "train.eval_every=1000",
                                                     'train.precision="auto"']), tmp_path / "run", quiet=True)
    finally:
        hook.remove()
    want = "bf16" if native else "fp32"
    assert f"; {want} (auto) on cpu;" in (tmp_path / "run" / "train.log").read_text()
    assert torch.bfloat16 in dtypes if native else dtypes == {torch.float32}


@pytest.mark.parametrize("option", ["train.precision=\"bf16\"", "train.compile=true"])
def test_bf16_autocast_and_compile_train_like_fp32(tmp_path, tiny_overrides, option):
    """The GPU options run on CPU too, and do engage: under bf16 autocast (§5.2 at scale) the linear
    layers compute in bfloat16, and torch.compile compiles graphs; the losses are those of the plain
    fp32 run, to bf16's precision or to float rounding."""
    from torch._dynamo.utils import counters

    common = tiny_overrides + ["train.log_every=2", "train.eval_every=1000", "train.max_steps=4",
                               "model.p_drop=0.0"]
    runs = {}
    for name, extra in [("fp32", []), ("other", [option])]:
        dtypes = set()
        def record(module, args, out, dtypes=dtypes) -> None:
            if isinstance(module, torch.nn.Linear):
                dtypes.add(out.dtype)
        torch._dynamo.reset()
        counters.clear()
        # a global hook on a compiled module fires twice (torch warns): only the bf16 case needs it
        hook = torch.nn.modules.module.register_module_forward_hook(record) if "bf16" in option else None
        try:
            train(load_config("tiny", common + extra), tmp_path / name, quiet=True)
        finally:
            if hook:
                hook.remove()
        runs[name] = {"dtypes": dtypes, "graphs": counters["stats"]["unique_graphs"]}
    assert runs["fp32"]["graphs"] == 0
    if "bf16" in option:
        assert runs["fp32"]["dtypes"] == {torch.float32} and torch.bfloat16 in runs["other"]["dtypes"]
    else:
        assert runs["other"]["graphs"] > 0
    a, b = losses(tmp_path / "fp32"), losses(tmp_path / "other")
    assert a.keys() == b.keys() == {2, 4}
    tolerance = 0.05 if "bf16" in option else 1e-4
    for step in a:
        assert b[step] == pytest.approx(a[step], rel=tolerance), step
    assert a[4] != a[2]  # the run learned: not a comparison of two untrained models


def test_a_vocabulary_left_by_an_earlier_attempt_is_reused_only_for_the_same_inputs(tmp_path, tiny_overrides):
    """An attempt that stopped after writing spm.model but before any checkpoint: the next `train` in
    that folder reuses the vocabulary if it would train the same one, else trains a new one and says what
    changed (before, it was refused until the user deleted it: a failed first attempt blocked a retry with
    another data.vocab_size)."""
    run = tmp_path / "run"
    first = tiny_overrides + ["train.max_steps=1"]
    train(load_config("tiny", first), run, quiet=True)
    shutil.rmtree(run / "checkpoints")  # as if it had stopped before its first checkpoint
    vocabulary = (run / "spm.model").read_bytes()
    train(load_config("tiny", first), run, quiet=True)
    assert (run / "spm.model").read_bytes() == vocabulary
    assert (run / "train.log").read_text().count("training a joint BPE vocabulary") == 1  # reused, not retrained
    shutil.rmtree(run / "checkpoints")
    train(load_config("tiny", first + ["data.vocab_size=400"]), run, quiet=True)
    assert Tokenizer(run / "spm.model").vocab_size == 400
    assert re.search(r"spm.model was trained from other inputs .*vocab_size: 500 -> 400.*training a new one",
                     (run / "train.log").read_text())
    assert checkpoint_record(list_checkpoints(run)[-1])["vocab_size"] == 400


def test_a_vocabulary_written_just_before_ctrl_c_is_not_reused_for_other_inputs(tmp_path, tiny_overrides,
                                                                               monkeypatch):
    """Ctrl-C as the vocabulary is written (a KeyboardInterrupt just after spm.model): the next `train` in the
    folder, on other data, used the vocabulary of the first data ("using it as it is"); it must train one for
    the new data, saying what changed."""
    run = tmp_path / "run"
    written = Tokenizer.train

    def interrupted(*args, **kwargs):
        written(*args, **kwargs)
        raise KeyboardInterrupt

    monkeypatch.setattr(Tokenizer, "train", interrupted)
    with pytest.raises(KeyboardInterrupt):
        train(load_config("tiny", tiny_overrides + ["train.max_steps=1"]), run, quiet=True)
    monkeypatch.undo()
    first = (run / "spm.model").read_bytes()
    src = next(o for o in tiny_overrides if o.startswith("data.train_src=")).split("=", 1)[1].strip('"')
    Path(src).write_text(Path(src).read_text(encoding="utf-8").replace("dog", "cat"), encoding="utf-8")
    train(load_config("tiny", tiny_overrides + ["train.max_steps=1"]), run, quiet=True)
    assert re.search(r"train_src_sha256: '[0-9a-f]+' -> '[0-9a-f]+'", (run / "train.log").read_text())
    assert (run / "spm.model").read_bytes() != first


def test_a_finished_run_writes_its_summary(tmp_path, tiny_overrides):
    """summary.json is what `train` returned: the file benchmarks read a finished run's numbers from."""
    summary = train(load_config("tiny", tiny_overrides + ["train.max_steps=3"]), tmp_path / "run", quiet=True)
    assert json.loads((tmp_path / "run" / "summary.json").read_text()) == summary and summary["step"] == 3


def test_text_the_vocabulary_cannot_spell_is_warned_of(tmp_path, tiny_overrides, multi30k):
    """Fine-tuned onto French with a German run's vocabulary, a share of the target's characters (é, è, à, ç)
    became the unknown piece without a word: the model learnt to write \u2047, and its validation perplexity
    looked fine. Its own vocabulary, trained on the text, warns of nothing."""
    old = tmp_path / "old"
    train(load_config("tiny", tiny_overrides + ["train.max_steps=2"]), old, quiet=True)
    assert "unknown to the vocabulary" not in (old / "train.log").read_text()
    french = []
    for split, n in (("train", 600), ("val", 50)):
        path = tmp_path / f"{split}.fr"
        path.write_text("".join(line + "\n" for line in read_lines(multi30k / f"{split}.fr.gz")[:n]), encoding="utf-8")
        french.append(f'data.{"valid" if split == "val" else split}_tgt="{path}"')
    train(load_config("tiny", tiny_overrides + french + ["train.max_steps=1"]), tmp_path / "new", quiet=True,
          init_from=old)
    log = (tmp_path / "new" / "train.log").read_text()
    for split in ("train", "valid"):
        assert re.search(rf"warning: {split}: 0% of the source's pieces and [\d.]+% of the target's are unknown to the "
                         rf"vocabulary \({tmp_path / 'new' / 'spm.model'}\): characters it has no piece for", log), log


def test_a_parsing_fine_tune_of_a_translation_vocabulary_is_refused_before_training(tmp_path, tiny_overrides,
                                                                                    multi30k):
    """--init-from a translation run with data.task "parse": the inherited vocabulary has no bracket symbols, and
    the run trained its whole budget before `parse` refused it ("not a parsing model"). Refused before the run's
    folder is made: refused after, it held the parent's vocabulary, and a new run there was told to give
    --init-from again, which was refused again."""
    from transformer.prepare import write_ptb_splits

    ptb = multi30k.parent / "ptb-sample"  # beside Multi30k in the data folder
    if not ptb.is_dir():
        pytest.skip(f"{ptb} not found")
    old = tmp_path / "old"
    train(load_config("tiny", tiny_overrides + ["train.max_steps=2"]), old, quiet=True)
    write_ptb_splits(ptb, tmp_path)
    trees = [f'data.{split}_{side}="{tmp_path}/{split}.{suffix}"' for split in ("train", "valid")
             for side, suffix in (("src", "words"), ("tgt", "wlin"))]
    with pytest.raises(DataError, match=r'^data.task is "parse", and the vocabulary .*old/spm.model has none of the '
                                        r"training trees' bracket symbols"):
        train(load_config("tiny", tiny_overrides + trees + ['data.task="parse"', "train.max_steps=2"]),
              tmp_path / "new", quiet=True, init_from=old)
    assert not (tmp_path / "new").exists()


def test_a_fine_tune_stopped_before_its_first_checkpoint_stays_a_fine_tune(tmp_path, tiny_overrides):
    """A fine-tune that stopped after taking its parent's vocabulary, before any checkpoint (killed, or refused
    for its validation set): --resume without --init-from trained from random weights with the parent's
    vocabulary ("no checkpoint; starting from scratch"), and a new run in the folder reused that vocabulary as
    its own. The record beside it names the weights: --resume starts from them again; a new run is refused."""
    old = tmp_path / "old"
    train(load_config("tiny", tiny_overrides + ["train.max_steps=2"]), old, quiet=True)
    blank = tmp_path / "blank.txt"
    blank.write_text("\n\n")
    new = tmp_path / "new"
    with pytest.raises(DataError, match="no usable validation pairs"):
        train(load_config("tiny", tiny_overrides + [f'data.valid_src="{blank}"', f'data.valid_tgt="{blank}"',
                                                    "train.max_steps=2"]), new, quiet=True, init_from=old)
    assert (new / "spm.model").is_file() and not list_checkpoints(new)
    with pytest.raises(TrainError, match=rf"spm.model is the vocabulary of {old.resolve()}, taken by --init-from, and "
                                         rf"this run holds no checkpoint yet: give --init-from {old.resolve()} again"):
        train(load_config("tiny", tiny_overrides + ["train.max_steps=2", "data.vocab_size=400"]), new, quiet=True)
    summary = train(load_config("tiny", tiny_overrides + ["train.max_steps=2"]), new, quiet=True, resume=True)
    assert summary["init_from"]["path"] == str(old.resolve())
    assert (f"--resume: no checkpoint in {new}/checkpoints; starting again from the weights of --init-from "
            f"{old.resolve()}, which the run was started with") in (new / "train.log").read_text()
    shutil.rmtree(new / "checkpoints")  # stopped before its first checkpoint, and the parent gone since
    shutil.rmtree(old)
    with pytest.raises(TrainError, match=r"--resume: .*new is a fine-tune started with --init-from .*old, which is gone"):
        train(load_config("tiny", tiny_overrides + ["train.max_steps=2"]), new, quiet=True, resume=True)


def test_a_fine_tune_resumes_with_its_vocabularys_true_size_or_the_size_it_was_given(tmp_path, tiny_overrides):
    """A fine-tune keeps its parent's vocabulary (500 pieces) whatever data.vocab_size says (tiny's 1000):
    its resume with the true size was refused, even with --allow-config-change, as "cannot change how the
    vocabulary is made, data.vocab_size: 1000 -> 500: the run keeps spm.model" (which has 500)."""
    parent, tuned = tmp_path / "parent", tmp_path / "tuned"
    train(load_config("tiny", tiny_overrides + ["train.max_steps=2", "data.vocab_size=500"]), parent, quiet=True)
    train(load_config("tiny", tiny_overrides + ["train.max_steps=2"]), tuned, quiet=True, init_from=parent)
    for vocab_size, steps in ((500, 3), (1000, 4)):  # the true size, then the one the run was started with
        summary = train(load_config("tiny", tiny_overrides + [f"train.max_steps={steps}",
                                                               f"data.vocab_size={vocab_size}"]), tuned, resume=True,
                        quiet=True)
        assert summary["step"] == steps
    # --resume --init-from into a new folder: "starting from scratch", then "starting from the weights of"
    train(load_config("tiny", tiny_overrides + ["train.max_steps=1"]), tmp_path / "fresh", resume=True, quiet=True,
          init_from=parent)
    assert (f"--resume: no checkpoint in {tmp_path / 'fresh'}/checkpoints; starting from the weights of --init-from "
            f"{parent}\n") in (tmp_path / "fresh" / "train.log").read_text()
    # a run whose vocabulary is data.vocab_size's still refuses to change it on a resume
    with pytest.raises(TrainError, match=r"--resume cannot change how the vocabulary is made, data.vocab_size: "
                                         r"500 -> 600"):
        train(load_config("tiny", tiny_overrides + ["train.max_steps=3", "data.vocab_size=600"]), parent, resume=True,
              quiet=True)


def test_a_refusal_after_the_log_began_is_in_the_log_and_the_validation_files_are_read_first(tmp_path,
                                                                                                tiny_overrides):
    """A run refused once it had begun its train.log ended the log mid-sentence, the reason on stderr alone (a
    nohup job's lost); validation files of two lengths were found only after the vocabulary's training."""
    valid_tgt = next(o for o in tiny_overrides if o.startswith("data.valid_tgt=")).split("=", 1)[1].strip('"')
    (tmp_path / "short.de").write_text("".join(line + "\n" for line in read_lines(valid_tgt)[:49]))
    with pytest.raises(DataError, match="differ in length"):
        train(load_config("tiny", tiny_overrides + [f'data.valid_tgt="{tmp_path / "short.de"}"']), tmp_path / "short",
              quiet=True)
    assert not (tmp_path / "short").exists()  # refused before the folder, and its vocabulary, were made
    run = tmp_path / "run"
    with pytest.raises(DataError, match="no usable training pairs") as refused:  # after the vocabulary's training
        train(load_config("tiny", tiny_overrides + ["data.max_len=2"]), run, quiet=True)
    log = (run / "train.log").read_text()
    assert "training a joint BPE vocabulary" in log and log.endswith(f" error: {refused.value}\n")
    train(load_config("tiny", tiny_overrides + ["train.max_steps=2"]), tmp_path / "done", quiet=True)
    lines = (tmp_path / "done" / "train.log").read_text().count("\n")
    with pytest.raises(TrainError, match="--resume with a config that differs"):  # refused before it wrote a line
        train(load_config("tiny", tiny_overrides + ["train.max_steps=4", "train.lr_scale=3"]), tmp_path / "done",
              resume=True, quiet=True)
    assert (tmp_path / "done" / "train.log").read_text().count("\n") == lines  # not the finished run's: as it was


def test_init_from_takes_the_vocabulary_and_the_weights(tmp_path, tiny_overrides, capsys):
    """Fine-tuning: the new run's spm.model is the old one's bytes, its first weights the old run's
    averaged ones, so before any update its validation loss on the old data is the old run's; a model
    that does not fit, a missing run and a pickle are refused."""
    from transformer.train import Trainer, validate
    from transformer.translator import Translator

    old = tmp_path / "old"
    train(load_config("tiny", tiny_overrides + ["train.max_steps=6", "train.save_every=2"]), old, quiet=True)
    new = tmp_path / "new"
    cfg = load_config("tiny", tiny_overrides + ["train.max_steps=2", "train.warmup_steps=50", "model.p_drop=0.2"])
    from transformer import distributed
    trainer = Trainer(cfg, new, False, True, distributed.setup(60.0), False, old)
    assert (new / "spm.model").read_bytes() == (old / "spm.model").read_bytes()
    averaged = Translator(old, log=lambda m: None).model  # the weights translate uses: the last checkpoints' mean
    for name, tensor in averaged.state_dict().items():
        assert torch.equal(trainer.raw.state_dict()[name], tensor), name
    before = validate(trainer.raw, trainer.run_data.valid, 4096)["valid_nll"]
    assert before == pytest.approx(validate(averaged, trainer.run_data.valid, 4096)["valid_nll"], rel=1e-6)
    assert trainer.meta_base["init_from"]["weights"] == ["step_00000002", "step_00000004", "step_00000006"]
    summary = train(cfg, tmp_path / "tuned", quiet=True, init_from=old)
    assert summary["init_from"]["path"] == str(old) and summary["step"] == 2
    log = (tmp_path / "tuned" / "train.log").read_text()
    assert "starting from the weights of" in log and "model.p_drop: 0.1 -> 0.2" in log
    one = train(cfg, tmp_path / "one", quiet=True, init_from=list_checkpoints(old)[0].with_suffix(".safetensors"))
    assert one["init_from"]["weights"] == ["step_00000002"]
    with pytest.raises(TrainError, match=r"does not fit this config \(model.d_ff: 128 -> 96\)$"):  # not its p_drop
        train(load_config("tiny", tiny_overrides + ["model.d_ff=96", "model.p_drop=0.3"]), tmp_path / "wide",
              quiet=True, init_from=old)
    assert not (tmp_path / "wide").exists()  # refused from the records: no config.toml, spm.model, train.log there
    (tmp_path / "bare").mkdir()
    shutil.copy(old / "spm.model", tmp_path / "bare" / "spm.model")
    with pytest.raises(TrainError, match=r"--init-from .*bare: no checkpoints in .*bare/checkpoints"):
        train(cfg, tmp_path / "x", quiet=True, init_from=tmp_path / "bare")
    assert not (tmp_path / "x").exists()
    with pytest.raises(TrainError, match="no such run folder"):
        train(cfg, tmp_path / "x", quiet=True, init_from=tmp_path / "missing")
    with pytest.raises(TrainError, match=r"checkpoints: not a run folder \(no spm.model\) \(give the run folder"):
        train(cfg, tmp_path / "x", quiet=True, init_from=old / "checkpoints")  # "...and the file names no run"
    with pytest.raises(TrainError, match=r"train.init_qkv_gain = 0.5 sets how .* --init-from .*: give one of them"):
        train(load_config("tiny", tiny_overrides + ["train.max_steps=2", "train.init_qkv_gain=0.5"]),
              tmp_path / "drawn", quiet=True, init_from=old)
    assert not (tmp_path / "drawn").exists()
    (old / "model.pt").write_bytes(b"\x80\x04")
    with pytest.raises(UserError, match="pickle files are refused"):
        train(cfg, tmp_path / "y", quiet=True, init_from=old / "model.pt")
    (tmp_path / "model.pt").write_bytes(b"\x80\x04")  # outside a run folder: it was "not a run folder (no spm.model)"
    with pytest.raises(UserError, match=r"model\.pt: not a run folder or a weights file .*: pickle files are refused "
                                        r"unopened \(.pt, .bin\)"):
        train(cfg, tmp_path / "y", quiet=True, init_from=tmp_path / "model.pt")
    # the run's vocabulary was told as a pickle refused unopened
    with pytest.raises(UserError, match=rf"spm.model: not a run folder or a weights file of this package "
                                        rf"\(.safetensors, or its .json record\): give its run folder, {old}$"):
        train(cfg, tmp_path / "y", quiet=True, init_from=old / "spm.model")
    with pytest.raises(UserError, match=r"config.toml: .*\(.safetensors, or its .json record\)$"):
        train(cfg, tmp_path / "y", quiet=True, init_from=old / "config.toml")

    # the file `transformer average` writes elsewhere (as the docs show) takes the vocabulary of the run it names
    from transformer.cli import main

    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    assert main(["average", str(old), "--last", "10", "--out", str(elsewhere / "avg.safetensors")]) == 0
    assert "averaged 3 checkpoints (--last 10: the run holds 3) (step_" in capsys.readouterr().out
    tuned = train(cfg, tmp_path / "from_average", quiet=True, init_from=elsewhere / "avg.safetensors")
    assert tuned["init_from"]["weights"] == ["avg"] and tuned["step"] == 2

    # a parent whose weights differ from their records is refused before the new folder gets a file (it was left
    # with config.toml, spm.model and train.log)
    damaged = tmp_path / "damaged"
    shutil.copytree(old, damaged)
    steps = [p.with_suffix(".safetensors") for p in list_checkpoints(damaged)]
    shutil.copy(steps[0], steps[-1])
    for resume in (False, True):  # a resume into a folder not there yet starts from the parent as well
        with pytest.raises(UserError, match="sha256 mismatch"):
            train(cfg, tmp_path / "z", resume=resume, quiet=True, init_from=damaged)
        assert not (tmp_path / "z").exists()
    state_file = list_checkpoints(old)[-1].with_suffix(".state.safetensors")  # its step's weights, named as such
    assert train(cfg, tmp_path / "from_state", quiet=True, init_from=state_file)["init_from"]["weights"] == [
        list_checkpoints(old)[-1].stem]
    assert (tmp_path / "from_average" / "spm.model").read_bytes() == (old / "spm.model").read_bytes()
    old.rename(tmp_path / "moved")  # the run it names moved away: "the file names no run" said the opposite
    with pytest.raises(TrainError, match=rf"avg.safetensors: the run it names, {re.escape(str(old))}, is no run "
                                         r"folder now \(no spm.model: moved or removed\?\)"):
        train(cfg, tmp_path / "from_moved", quiet=True, init_from=elsewhere / "avg.safetensors")
    (tmp_path / "moved").rename(old)
    for suffix in (".safetensors", ".json"):  # a training checkpoint copied out names no run
        shutil.copy(list_checkpoints(old)[0].with_suffix(suffix), elsewhere / f"step{suffix}")
    with pytest.raises(TrainError, match="names no run whose vocabulary it was trained with: put it in its run"):
        train(cfg, tmp_path / "z", quiet=True, init_from=elsewhere / "step.safetensors")
    # beside another run's spm.model: refused from its record, before the new run folder takes that spm.model (a
    # corrected retry into the same --out was then refused too, its spm.model "differs")
    other = tmp_path / "other"
    train(load_config("tiny", tiny_overrides + ["train.max_steps=1", "data.vocab_size=400"]), other, quiet=True)
    shutil.copy(other / "spm.model", elsewhere / "spm.model")
    with pytest.raises(TrainError, match=r"step.safetensors: its weights were trained with another vocabulary than"):
        train(cfg, tmp_path / "z", quiet=True, init_from=elsewhere / "step.safetensors")
    assert not (tmp_path / "z").exists()


SCRIPT = {2: 5.0, 4: 4.0, 6: 4.5, 8: 3.0, 10: 3.5, 12: 3.2, 14: 3.1, 16: 2.0}  # validation NLL by step


@pytest.fixture
def scripted(monkeypatch):
    """The validation loss at each evaluation comes from SCRIPT, by step."""
    from transformer.train import Trainer

    monkeypatch.setattr(Trainer, "evaluate", lambda self: {"valid_nll": SCRIPT[self.state.step], "valid_ppl": 1.0})


def test_keep_best_keeps_the_best_and_patience_stops(tmp_path, tiny_overrides, scripted):
    """Best 3.0 at step 8; then 3.5, 3.2, 3.1 are three evaluations without improvement: patience 3 stops
    after step 14, before the 2.0 of step 16. Killed and resumed in between, the same happens."""
    common = tiny_overrides + ["train.log_every=2", "train.eval_every=2", "train.save_every=2", "train.max_steps=16",
                               'train.keep_best="valid_loss"', "train.patience=3"]
    whole = train(load_config("tiny", common), tmp_path / "whole", quiet=True)
    assert whole["step"] == 14 and whole["best"] == {"metric": "valid_loss", "step": 8, "value": 3.0,
                                                     "stopped_by_patience": True}
    best = load_checkpoint(tmp_path / "whole" / "best.safetensors", with_state=False)
    assert best.meta["best"] == {"metric": "valid_loss", "step": 8, "value": 3.0}
    eighth = load_checkpoint(tmp_path / "whole" / "checkpoints" / "step_00000008.json", with_state=False)
    for name, tensor in eighth.weights.items():
        assert torch.equal(best.weights[name], tensor), name
    assert "stopping: 3 evaluations of valid_loss without improvement" in (tmp_path / "whole" / "train.log").read_text()
    part = tmp_path / "part"
    train(load_config("tiny", [*common, "train.max_steps=10"]), part, quiet=True)  # a budget that ends at step 10
    resumed = train(load_config("tiny", common), part, resume=True, quiet=True)
    assert resumed["step"] == 14 and resumed["best"] == whole["best"]
    assert load_checkpoint(part / "best.safetensors", with_state=False).meta["best"]["step"] == 8
    kept = (part / "summary.json").read_text()
    again = train(load_config("tiny", common), part, resume=True, quiet=True)  # patience is spent: no more steps
    assert again["step"] == 14  # and the log says so (it went straight to "done", the reason in summary.json)
    # and the summary of the attempt that trained stands: rewritten, its minutes took this call's
    assert (part / "summary.json").read_text() == kept and again == json.loads(kept)
    assert (part / "train.log").read_text().count("train.patience 3: already run out at step 14 (3 evaluations of "
                                                  "valid_loss without improvement); nothing to train") == 1


def test_the_budgets_end_is_validated_and_kept_when_it_is_the_best(tmp_path, tiny_overrides, monkeypatch):
    """The budget's end was validated for the summary alone: a better loss there than at the last evaluation was
    not kept, and best.safetensors (translate --checkpoint best) held older, worse weights than summary.json's.
    Written after the end's checkpoint (here the clock's), it is taken on a resume as the newer: the checkpoint
    says step 6's 4.0, and 3.5 at step 9 would have replaced the end's 3.0."""
    from transformer.train import Trainer

    script = {3: 5.0, 6: 4.0, 8: 3.0, 9: 3.5, 12: 2.5}
    monkeypatch.setattr(Trainer, "evaluate", lambda self: {"valid_nll": script[self.state.step], "valid_ppl": 1.0})
    common = tiny_overrides + ["train.log_every=1", "train.eval_every=3", "train.save_every=4",
                               'train.keep_best="valid_loss"', "train.max_steps=8"]
    run = tmp_path / "run"
    done = train(load_config("tiny", common), run, quiet=True)
    assert done["best"]["step"] == 8 and done["best"]["value"] == done["valid_nll"] == 3.0
    best = load_checkpoint(run / "best.safetensors", with_state=False)
    end = load_checkpoint(run / "checkpoints" / "step_00000008.json", with_state=False)
    assert best.meta["best"] == {"metric": "valid_loss", "step": 8, "value": 3.0} and end.meta["on_clock"]
    for name, tensor in end.weights.items():
        assert torch.equal(best.weights[name], tensor), name
    assert "best valid_loss so far: 3 at step 8, the budget's end" in (run / "train.log").read_text()
    resumed = train(load_config("tiny", common + ["train.max_steps=12"]), run, resume=True, quiet=True)
    log = (run / "train.log").read_text()
    assert "best valid_loss 3 at step 8 taken from best.safetensors" in log and "so far: 3.5" not in log
    assert resumed["best"]["step"] == 12
    plain = train(load_config("tiny", common[:-2] + ["train.max_steps=8"]), tmp_path / "plain", quiet=True)
    assert "best" not in plain and plain["valid_nll"] == 3.0  # validated once at its end, for the summary


def test_ctrl_c_twice_in_the_budgets_end_validation_says_its_checkpoint_was_written(tmp_path, tiny_overrides,
                                                                                     monkeypatch):
    """The budget's end is validated after its checkpoint: a second Ctrl-C there is not "in step 9, without
    writing a checkpoint"."""
    import signal

    from transformer.train import Trainer, TrainInterrupted

    def evaluate(self):
        if self.state.step == 8:
            os.kill(os.getpid(), signal.SIGINT)
            os.kill(os.getpid(), signal.SIGINT)
        return {"valid_nll": 3.0, "valid_ppl": 1.0}

    monkeypatch.setattr(Trainer, "evaluate", evaluate)
    run = tmp_path / "run"
    with pytest.raises(TrainInterrupted, match=r"^SIGINT again: training stopped at once, after step 8, its "
                                               r"checkpoint written; --resume continues from the newest in "):
        train(load_config("tiny", tiny_overrides + ["train.log_every=1", "train.eval_every=3", "train.max_steps=8",
                                                    'train.keep_best="valid_loss"']), run, quiet=True)
    assert [checkpoint_record(p)["step"] for p in list_checkpoints(run)][-1] == 8


def test_a_best_newer_than_the_checkpoint_costs_no_patience(tmp_path, tiny_overrides, scripted):
    """Killed (or the disk full) between best.safetensors of step 8 and its checkpoint: resumed from checkpoint 4,
    the best of step 8 is taken from the file, and the evaluations replayed until step 8 (4.5, then 3.0, which
    is not better than itself) counted against the patience: patience 2 stopped the run at step 8 at once. They
    do not count: it stops where the run never interrupted stops, after step 12."""
    common = tiny_overrides + ["train.log_every=2", "train.eval_every=2", "train.save_every=4",
                               'train.keep_best="valid_loss"', "train.patience=2", "train.max_steps=16"]
    whole = train(load_config("tiny", common), tmp_path / "whole", quiet=True)
    assert whole["step"] == 12 and whole["best"]["step"] == 8
    run = tmp_path / "run"
    train(load_config("tiny", common + ["train.max_steps=10"]), run, quiet=True)
    for step in (8, 10):
        for path in (run / "checkpoints").glob(f"step_{step:08d}*"):
            path.unlink()
    resumed = train(load_config("tiny", common), run, resume=True, quiet=True)
    assert resumed["step"] == 12 and resumed["best"] == whole["best"]
    assert "best valid_loss 3 at step 8 taken from best.safetensors" in (run / "train.log").read_text()


@pytest.mark.parametrize("other_run", [["data.vocab_size=400"], ["train.seed=2"]])
def test_a_best_of_another_run_is_not_taken(tmp_path, tiny_overrides, scripted, other_run):
    """best.safetensors copied from a run of another vocabulary (its step newer than the checkpoint) was taken as
    this run's best: no evaluation of the run beat its value, so the run's own best was never written, and
    `translate --checkpoint best` refused the file at the end. It is said and left to be replaced. So is another
    run's of the same vocabulary and model (another seed: its record's run_id), which was taken."""
    common = tiny_overrides + ["train.log_every=2", "train.eval_every=2", "train.save_every=4",
                               'train.keep_best="valid_loss"']
    run, other = tmp_path / "run", tmp_path / "other"
    train(load_config("tiny", common + ["train.max_steps=4"]), run, quiet=True)
    train(load_config("tiny", common + ["train.max_steps=8"] + other_run), other, quiet=True)
    for suffix in (".safetensors", ".json"):
        shutil.copy(other / f"best{suffix}", run / f"best{suffix}")
    resumed = train(load_config("tiny", common + ["train.max_steps=8"]), run, resume=True, quiet=True)
    assert resumed["best"]["step"] == 8
    best = load_checkpoint(run / "best.safetensors", with_state=False).meta
    assert best["vocab_sha256"] == Tokenizer(run / "spm.model").sha256 and best["best"]["step"] == 8
    assert "best.safetensors (best valid_loss 3 at step 8) is of another run, vocabulary or model than this run's: " \
           "not taken" in (run / "train.log").read_text()
    assert best["run_id"] == checkpoint_record(list_checkpoints(run)[-1])["run_id"]


def test_the_best_moves_with_the_checkpoints(tmp_path, tiny_overrides, scripted, monkeypatch):
    """Evaluations every 2 steps, checkpoints every 4: best.safetensors is written with the checkpoint
    whose record holds it. Killed between the two writes (best.safetensors of step 8 on disk, checkpoint
    8 not), the run resumes from checkpoint 4; an evaluation after the resume that is worse than the
    best on disk (3.5 against 3.0) but better than checkpoint 4 knew (4.0) must not replace it."""
    from transformer.train import Trainer

    common = tiny_overrides + ["train.log_every=2", "train.eval_every=2", "train.save_every=4",
                               'train.keep_best="valid_loss"']
    run = tmp_path / "run"
    train(load_config("tiny", common + ["train.max_steps=10"]), run, quiet=True)
    assert load_checkpoint(run / "best.safetensors", with_state=False).meta["best"] == {
        "metric": "valid_loss", "step": 8, "value": 3.0}
    assert load_checkpoint(run / "checkpoints" / "step_00000008.json", with_state=False).meta["train_state"][
        "best_value"] == 3.0
    for step in (8, 10):
        for path in (run / "checkpoints").glob(f"step_{step:08d}*"):
            path.unlink()
    best = load_checkpoint(run / "best.safetensors", with_state=False).weights
    monkeypatch.setattr(Trainer, "evaluate", lambda self: {"valid_nll": {8: 3.5}.get(self.state.step, 9.0),
                                                           "valid_ppl": 1.0})
    resumed = train(load_config("tiny", common + ["train.max_steps=12"]), run, resume=True, quiet=True)
    assert resumed["best"]["step"] == 8 and resumed["best"]["value"] == 3.0
    after = load_checkpoint(run / "best.safetensors", with_state=False)
    assert after.meta["best"] == {"metric": "valid_loss", "step": 8, "value": 3.0}
    for name, tensor in best.items():
        assert torch.equal(after.weights[name], tensor), name



def test_a_resume_that_keeps_the_best_of_another_metric_starts_its_best_anew(tmp_path, tiny_overrides):
    """train.keep_best changed on --resume (valid_loss -> valid_smoothed_loss, which is larger by the
    uniform term): the best so far was a value of the other metric, and compared with it no value of the
    new one could improve, so patience stopped the run with an NLL reported as its best smoothed loss. (Whether
    the tiny model's smoothed loss falls below the old NLL anyway depends on the data: the best's reset itself is
    held by test_a_resume_that_keeps_a_best_of_the_other_direction_starts_its_best_anew.)"""
    common = tiny_overrides + ["train.log_every=2", "train.eval_every=2", "train.save_every=2"]
    run = tmp_path / "run"
    train(load_config("tiny", common + ["train.max_steps=4", 'train.keep_best="valid_loss"']), run, quiet=True)
    resumed = train(load_config("tiny", common + ["train.max_steps=8", 'train.keep_best="valid_smoothed_loss"',
                                                  "train.patience=1"]), run, resume=True, quiet=True)
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    smoothed = {r["step"]: r["valid_smoothed_loss"] for r in records if "valid_smoothed_loss" in r}
    assert min(smoothed) == 6 and resumed["best"]["metric"] == "valid_smoothed_loss"
    assert resumed["best"]["value"] == pytest.approx(smoothed[resumed["best"]["step"]])
    assert load_checkpoint(run / "best.safetensors", with_state=False).meta["best"]["metric"] == "valid_smoothed_loss"
    assert ("train.keep_best is valid_smoothed_loss, the run until step 4 kept valid_loss: the best so far and "
            "the patience count start anew") in (run / "train.log").read_text()


def test_translate_from_the_best_checkpoint(tmp_path, tiny_overrides, scripted):
    from transformer.checkpoint import CheckpointError
    from transformer.translator import Translator

    run = tmp_path / "run"
    train(load_config("tiny", tiny_overrides + ["train.log_every=2", "train.eval_every=2", "train.max_steps=4",
                                                'train.keep_best="valid_loss"']), run, quiet=True)
    assert Translator(run, "best", log=lambda m: None).translate(["A dog runs."])
    plain = tmp_path / "plain"
    train(load_config("tiny", tiny_overrides + ["train.max_steps=2"]), plain, quiet=True)
    with pytest.raises(CheckpointError, match="no best.safetensors"):
        Translator(plain, "best", log=lambda m: None)


@pytest.mark.parametrize("sets, message", [(["train.patience=2"], r"train.patience = 2 counts evaluations of "
                                                                  r"train.keep_best .* is not set: set it too"),
                                           (["train.patience=-1"], r": train.patience must be >= 0, got -1$"),
                                           (['train.keep_best="dev_bleu"'], "needs train.bleu_every"),
                                           (['train.keep_best="bleu"'], "keep_best")])
def test_keep_best_settings_are_checked(sets, message):
    from transformer.config import ConfigError

    with pytest.raises(ConfigError, match=message):
        load_config("tiny", sets)



def test_another_subword_alpha_on_resume_needs_the_flag_and_rescales_the_epoch(tmp_path, tiny_overrides):
    """data.subword_alpha changes the data a run draws, as train.max_tokens does: a resume with another
    needs --allow-config-change, and then keeps its share of the epoch (the sampled epoch's batches are
    not the deterministic ones its checkpoint's batches_sha256 describes)."""
    common = tiny_overrides + ["train.log_every=2", "train.eval_every=1000", "train.save_every=2"]
    run = tmp_path / "run"
    train(load_config("tiny", common + ["train.max_steps=2", "data.subword_alpha=0.1"]), run, quiet=True)
    plain = load_config("tiny", common + ["train.max_steps=4"])
    with pytest.raises(TrainError, match=r"in: data.subword_alpha: 0.1 -> 0.0 \(pass --allow-config-change"):
        train(plain, run, resume=True, quiet=True)
    train(plain, run, resume=True, quiet=True, allow_config_change=True)
    log = (run / "train.log").read_text()
    assert "the training batches differ from those step_00000002.json's run drew" in log
    assert load_checkpoint(list_checkpoints(run)[-1]).meta["train_state"]["step"] == 4

def test_subword_sampling_trains_and_resumes_exactly(tmp_path, tiny_overrides):
    """With data.subword_alpha, a run stopped and resumed across epochs equals an uninterrupted one, and
    differs from a run on the deterministic segmentation; validation uses the deterministic pieces."""
    common = tiny_overrides + ["train.log_every=5", "train.eval_every=1000", "train.save_every=10",
                               "data.subword_alpha=0.1"]
    full, part, plain = tmp_path / "full", tmp_path / "part", tmp_path / "plain"
    train(load_config("tiny", common + ["train.max_steps=30"]), full, quiet=True)
    train(load_config("tiny", common + ["train.max_steps=10"]), part, quiet=True)
    train(load_config("tiny", common + ["train.max_steps=30"]), part, resume=True, quiet=True)
    assert losses(part) == losses(full)
    assert load_checkpoint(list_checkpoints(full)[-1]).meta["train_state"]["epoch"] >= 1  # crossed an epoch
    train(load_config("tiny", tiny_overrides + ["train.log_every=5", "train.eval_every=1000", "train.max_steps=30"]),
          plain, quiet=True)
    assert losses(plain)[5] != losses(full)[5]
    assert "subword regularization" in (full / "train.log").read_text()
    # validation keeps the deterministic pieces, so its loss compares across runs with and without sampling
    from transformer.data import encode_pairs, read_parallel
    from transformer.train import prepare_run

    cfg = load_config("tiny", common + ["train.max_steps=30"])
    run = prepare_run(cfg, full, resume=True, log=lambda msg: None, write=False)
    valid = read_parallel(Path(cfg.data.valid_src), Path(cfg.data.valid_tgt))
    try:
        assert run.valid == encode_pairs(valid, run.tokenizer, 10**9)[0]
        assert run.sampled is not None and run.sampled(0)[0] != run.train
    finally:
        run.sampled.close()


@pytest.mark.parametrize("sets, message", [(["data.subword_alpha=1.0"], "subword_alpha must be in"),
                                           (["data.subword_alpha=-0.1"], "subword_alpha must be in"),
                                           (["data.subword_alpha=0.1", 'data.train_store="x"'], "train_store")])
def test_subword_settings_are_checked(sets, message):
    from transformer.config import ConfigError

    with pytest.raises(ConfigError, match=message):
        load_config("tiny", sets)


def test_allow_config_change_resumes_what_the_weights_fit_and_refuses_the_rest(tmp_path, tiny_overrides):
    """--allow-config-change accepts model changes that keep every weight's shape (dropout here) and refuses,
    naming the fields, those that do not (d_ff): the checkpoint's weights could not be loaded into them."""
    run = tmp_path / "run"
    with pytest.raises(TrainError, match=r"--allow-config-change is for a resume \(with --resume\)"):
        train(load_config("tiny", tiny_overrides + ["train.max_steps=2"]), run, quiet=True, allow_config_change=True)
    assert not run.exists()  # refused before anything is written
    train(load_config("tiny", tiny_overrides + ["train.max_steps=2"]), run, quiet=True)
    for allow in (True, False):  # without the option, the refusal did not say that it would not help
        with pytest.raises(TrainError, match=r"--resume cannot take .*model\.d_ff: 128 -> 96.* new run, with another "
                                             r"--out \(the config differs also in: train\.lr_scale: 2\.0 -> 1\.0\)"):
            train(load_config("tiny", tiny_overrides + ["train.max_steps=4", "model.d_ff=96", "train.lr_scale=1.0"]),
                  run, resume=True, quiet=True, allow_config_change=allow)
    # how the first weights were drawn: it was accepted, logged and recorded, and changed nothing; refused, as
    # --init-from refuses it
    with pytest.raises(TrainError, match=r"--resume cannot change train\.init_qkv_gain: 1\.0 -> 0\.7071: it sets how "
                                         r"a new model's first weights are drawn"):
        train(load_config("tiny", tiny_overrides + ["train.max_steps=4", "train.init_qkv_gain=0.7071"]), run,
              resume=True, quiet=True, allow_config_change=True)
    done = train(load_config("tiny", tiny_overrides + ["train.max_steps=4", "model.p_drop=0.2"]), run, resume=True,
                 quiet=True, allow_config_change=True)
    assert done["step"] == 4
    from transformer.translator import Translator  # the run translates: its checkpoints of either dropout average
    assert len(Translator(run).translate(["a dog runs ."])) == 1


def test_a_resume_applies_the_optimizer_settings_it_accepts(tmp_path, tiny_overrides):
    """--allow-config-change lets β2, ε and the weight decay change on a resume: the log and config.toml said so,
    but Adam kept the checkpoint's settings (they came back with its moments), and the losses were a plain
    resume's."""
    run = tmp_path / "run"
    train(load_config("tiny", tiny_overrides + ["train.max_steps=2"]), run, quiet=True)
    changes = ["train.beta2=0.9", "train.adam_eps=1e-6", "train.weight_decay=0.5"]
    train(load_config("tiny", tiny_overrides + ["train.max_steps=3"] + changes), run, resume=True, quiet=True,
          allow_config_change=True)
    group = load_checkpoint(list_checkpoints(run)[-1], with_state=False).meta["optim_param_groups"][0]
    assert (group["betas"], group["eps"], group["weight_decay"]) == ([0.9, 0.9], 1e-6, 0.5)


def test_a_resume_without_config_toml_compares_with_the_checkpoints_record(tmp_path, tiny_overrides):
    """config.toml deleted: a resume with another d_ff died with "internal error: RuntimeError: Error(s) in
    loading state_dict", and one with another learning rate went on without a word."""
    run = tmp_path / "run"
    train(load_config("tiny", tiny_overrides + ["train.max_steps=2"]), run, quiet=True)
    (run / "config.toml").unlink()
    with pytest.raises(TrainError, match=r"--resume cannot take model changes .*model\.d_ff: 128 -> 96"):
        train(load_config("tiny", tiny_overrides + ["train.max_steps=4", "model.d_ff=96"]), run, resume=True,
              quiet=True)
    with pytest.raises(TrainError, match=r"differs from .*step_00000002\.json in: train\.lr_scale"):
        train(load_config("tiny", tiny_overrides + ["train.max_steps=4", "train.lr_scale=9.0"]), run, resume=True,
              quiet=True)
    assert train(load_config("tiny", tiny_overrides + ["train.max_steps=4"]), run, resume=True, quiet=True)["step"] == 4


def test_a_resume_compares_with_what_the_checkpoints_were_trained_with(tmp_path, tiny_overrides, monkeypatch):
    """A resume with a change (--allow-config-change) stopped before its first step had written config.toml: the
    next resume compared with it, so the same change went on without the flag, and the original settings were
    refused as a change."""
    import transformer.train as T

    run = tmp_path / "run"
    train(load_config("tiny", tiny_overrides + ["train.max_steps=2"]), run, quiet=True)

    def stopped(self, epoch):
        raise KeyboardInterrupt  # Ctrl-C as the resumed run's data is read

    monkeypatch.setattr(T.Trainer, "start_epoch", stopped)
    with pytest.raises(KeyboardInterrupt):
        train(load_config("tiny", tiny_overrides + ["train.max_steps=4", "train.lr_scale=9.0"]), run, resume=True,
              quiet=True, allow_config_change=True)
    monkeypatch.undo()
    with pytest.raises(TrainError, match=r"differs from .*step_00000002\.json in: train\.lr_scale: 2\.0 -> 9\.0"):
        train(load_config("tiny", tiny_overrides + ["train.max_steps=4", "train.lr_scale=9.0"]), run, resume=True,
              quiet=True)
    assert train(load_config("tiny", tiny_overrides + ["train.max_steps=4"]), run, resume=True, quiet=True)["step"] == 4


def test_a_resume_from_an_older_checkpoint_logs_each_step_once(tmp_path, tiny_overrides):
    """Resumed from step 2 (the newest checkpoint lost) after steps 3 and 4 were logged, and a last line cut short
    (a disk that filled up): metrics.jsonl held steps 1 2 3 4 3 4 and a line `plot` refused. A line damaged by
    hand before the step resumed from was kept, the resumed run's records written after it, and `plot` refused the
    whole file."""
    run = tmp_path / "run"
    sets = tiny_overrides + ["train.max_steps=4", "train.save_every=2", "train.log_every=1"]
    train(load_config("tiny", sets), run, quiet=True)
    list_checkpoints(run)[-1].unlink()
    lines = (run / "metrics.jsonl").read_text().splitlines(keepends=True)
    (run / "metrics.jsonl").write_text(lines[0][:-9] + "\n" + '{"step": 1, "minutes": -1}\n' + "[" * 10**5 + "\n"
                                       + "".join(lines[1:]) + '{"step": 5, "train_lo')  # plot refuses each
    train(load_config("tiny", sets), run, resume=True, quiet=True)
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [2, 3, 4]
    assert ("metrics.jsonl: 2 record(s) after step 2, the step resumed from, left out (they are logged again); 4 "
            "line(s) that are no record (cut short, or damaged), left out") in (run / "train.log").read_text()


@pytest.mark.skipif(not hasattr(signal, "SIGHUP"), reason="no SIGHUP on Windows")
def test_a_closed_terminal_stops_training_after_its_step_with_a_checkpoint(tmp_path, tiny_overrides):
    """Training in a terminal that closes (a dropped ssh session): SIGHUP ended it at once without a word, and
    every step since the last checkpoint was lost. It now stops as on SIGTERM, with 129; its lines, which the
    closed terminal would refuse (EIO), go nowhere."""
    import fcntl
    import pty
    import select
    import subprocess
    import sys
    import termios

    master, slave = pty.openpty()

    def own_terminal() -> None:  # a session of its own, whose controlling terminal is the pty: as a login shell's
        os.setsid()
        fcntl.ioctl(0, termios.TIOCSCTTY, 0)
        signal.signal(signal.SIGHUP, signal.SIG_DFL)  # as a login shell's: a suite run under nohup ignores it

    run = tmp_path / "run"
    sets = [a for o in tiny_overrides + ["train.max_steps=100000", "train.log_every=1"] for a in ("--set", o)]
    proc = subprocess.Popen([sys.executable, "-m", "transformer", "train", "tiny", "--out", str(run), *sets],
                            stdin=slave, stdout=slave, stderr=slave, preexec_fn=own_terminal)
    os.close(slave)
    try:
        deadline = time.monotonic() + 120
        while not ((run / "metrics.jsonl").exists() and (run / "metrics.jsonl").read_text()):
            assert proc.poll() is None and time.monotonic() < deadline
            if select.select([master], [], [], 0.2)[0]:
                os.read(master, 1 << 16)  # what the terminal shows, drained
        os.close(master)  # the terminal hangs up: SIGHUP to the session
        assert proc.wait(timeout=120) == 128 + signal.SIGHUP, (run / "train.log").read_text()[-1500:]
    finally:
        proc.kill()
    log = (run / "train.log").read_text()
    assert list_checkpoints(run) and "SIGHUP: stopped after step" in log, log[-2000:]


def test_a_second_signal_stops_at_once_and_says_no_checkpoint_was_written(tmp_path, tiny_overrides, monkeypatch):
    """Ctrl-C twice: the command said only "interrupted" (exit 130, as a stop that wrote its checkpoint), and
    train.log nothing, though the steps since the last checkpoint were lost."""
    import signal

    from transformer.train import TrainInterrupted

    run, step, calls = tmp_path / "run", training.queue_step, []

    def twice_interrupted_step(*args, **kwargs):
        calls.append(1)
        if len(calls) == 3:
            os.kill(os.getpid(), signal.SIGINT)
            os.kill(os.getpid(), signal.SIGINT)
        return step(*args, **kwargs)

    monkeypatch.setattr(training, "queue_step", twice_interrupted_step)
    with pytest.raises(TrainInterrupted, match=r"SIGINT again: training stopped at once, in step \d+, without "
                                               r"writing a checkpoint; --resume continues") as stopped:
        try:
            train(load_config("tiny", tiny_overrides + ["train.max_steps=8", "train.save_every=2"]), run, quiet=True)
        except KeyboardInterrupt:  # as it was: not to end this test session
            pytest.fail("a bare KeyboardInterrupt, which the command line reports as 'interrupted' alone")
    assert stopped.value.exit_code == 130
    assert "SIGINT again: stopped at once" in (run / "train.log").read_text()


def test_a_second_signal_once_a_checkpoints_record_is_in_place_keeps_that_checkpoint(tmp_path, tiny_overrides,
                                                                                     monkeypatch):
    """Ctrl-C twice as the clock's checkpoint of step 2 was written, after its record's rename: its tensor files were
    deleted under the record, and the message said "in step 3, without writing a checkpoint"."""
    import signal

    from transformer import checkpoint
    from transformer.train import TrainInterrupted

    run, write = tmp_path / "run", checkpoint._write_record

    def interrupted(*args):
        write(*args)
        os.kill(os.getpid(), signal.SIGINT)
        os.kill(os.getpid(), signal.SIGINT)

    monkeypatch.setattr(checkpoint, "_write_record", interrupted)
    with pytest.raises(TrainInterrupted, match=r"SIGINT again: training stopped at once, as the checkpoint of step 2 "
                                               r"was written, that checkpoint whole; --resume continues"):
        train(load_config("tiny", tiny_overrides + ["train.max_steps=8", "train.save_every=2"]), run, quiet=True)
    assert [c.name for c in list_checkpoints(run)] == ["step_00000002.json"]
    assert load_checkpoint(list_checkpoints(run)[-1]).meta["step"] == 2  # its files verified


def test_a_stop_signal_then_the_other_ranks_gone_is_told_as_the_stop_not_a_crash(tmp_path, tiny_overrides,
                                                                                 monkeypatch):
    """A signal at a job's start: the rank still starting stopped at once, and this one, which took it as "stop
    after this step", lost it at the step's end: "lost the other processes ... a remote worker crashing", with a
    traceback file. It is now the stop it was, 143, naming what --resume does."""
    from transformer import cli, distributed
    from transformer.train import TrainInterrupted

    step, calls = training.queue_step, []

    def signalled_then_alone(*args, **kwargs):
        calls.append(1)
        if len(calls) == 2:
            os.kill(os.getpid(), signal.SIGTERM)
            raise RuntimeError("[gloo/transport/tcp/pair.cc:553] Connection closed by peer [127.0.0.1]:46314")
        return step(*args, **kwargs)

    monkeypatch.setattr(training, "queue_step", signalled_then_alone)
    monkeypatch.setattr(distributed, "lost_contact", lambda e: "Connection closed by peer" in str(e))
    with cli.sigterm_raises(), pytest.raises(TrainInterrupted, match=r"^SIGTERM: training stopped in step \d+, "
                                             r"without a checkpoint of it: another process of the job had stopped on "
                                             r"the signal before it; none was written before it, so --resume starts"):
        train(load_config("tiny", tiny_overrides + ["train.max_steps=8", "train.save_every=4"]), tmp_path / "run",
              quiet=True)
    calls.clear()  # without a signal first, the same error is still the lost peer it is (the command says so)
    with cli.sigterm_raises(), pytest.raises(RuntimeError, match="Connection closed by peer"):
        monkeypatch.setattr(training, "queue_step", lambda *a, **k: (_ for _ in ()).throw(
            RuntimeError("Connection closed by peer")))
        train(load_config("tiny", tiny_overrides + ["train.max_steps=8"]), tmp_path / "other", quiet=True)


def test_a_stop_its_launcher_sent_is_said_so(tmp_path, tiny_overrides, monkeypatch):
    """A rank whose launcher was killed (SIGKILL) sends itself SIGTERM (die_with_launcher): it said "SIGTERM:
    stopped after step 17", when no one had sent one."""
    import threading

    from transformer import cli, distributed
    from transformer.train import TrainInterrupted

    step, calls = training.queue_step, []
    monkeypatch.setattr(distributed, "LAUNCHER_GONE", gone := threading.Event())

    def launcher_gone(*args, **kwargs):
        calls.append(1)
        if len(calls) == 2:
            gone.set()
            os.kill(os.getpid(), signal.SIGTERM)
        return step(*args, **kwargs)

    monkeypatch.setattr(training, "queue_step", launcher_gone)
    with cli.sigterm_raises(), pytest.raises(TrainInterrupted, match=r"^SIGTERM \(its launcher is gone\): training "
                                             r"stopped after step 2 with its checkpoint written"):
        train(load_config("tiny", tiny_overrides + ["train.max_steps=8"]), tmp_path / "run", quiet=True)


def sigterm_while_saving(monkeypatch) -> None:
    """A SIGTERM to this process as each checkpoint is written, before its write."""
    save = training.save_checkpoint

    def signalled(*args, **kwargs):
        os.kill(os.getpid(), signal.SIGTERM)
        return save(*args, **kwargs)

    monkeypatch.setattr(training, "save_checkpoint", signalled)


def test_a_rank_whose_own_stop_signal_comes_while_it_writes_the_checkpoint_still_writes_it(tmp_path, tiny_overrides,
                                                                                           monkeypatch):
    """A job's ranks see a stop signal at different moments (a rank of a killed launcher looks for it every second):
    another rank's SIGTERM stopped this one, whose own came while it wrote the checkpoint. Its handler was already
    given back then: the SIGTERM ended the command ("terminated") and the checkpoint, and every step since the last
    one, was lost."""
    from transformer import cli, distributed
    from transformer.train import TrainInterrupted

    run, all_sum, told = tmp_path / "run", distributed.all_sum, []

    def stopped_elsewhere(d, values):
        if len(values) == 5:  # the loop's stop flags (out of time, SIGTERM, SIGINT, patience, time used)
            told.append(1)
            if len(told) == 4:
                values[1] = 1.0  # another rank's SIGTERM, before step 4
        return all_sum(d, values)

    monkeypatch.setattr(distributed, "all_sum", stopped_elsewhere)
    sigterm_while_saving(monkeypatch)  # this rank's own
    with cli.sigterm_raises(), pytest.raises(TrainInterrupted, match="SIGTERM: training stopped after step 3 with "
                                                                      "its checkpoint written"):
        train(load_config("tiny", tiny_overrides + ["train.max_steps=100"]), run, quiet=True)
    assert [c.name for c in list_checkpoints(run)] == ["step_00000003.json"]


def test_a_second_signal_while_the_last_checkpoint_is_written_says_where_it_stopped(tmp_path, tiny_overrides,
                                                                                     monkeypatch):
    """The last checkpoint is written with training's own handlers still in place: a second signal there stops at
    once (the write is atomic: nothing half written), and says so, not "in step 4", which never began."""
    from transformer import cli
    from transformer.train import TrainInterrupted

    run, step, calls = tmp_path / "run", training.queue_step, []

    def stopped_at_three(*args, **kwargs):
        calls.append(1)
        if len(calls) == 3:
            os.kill(os.getpid(), signal.SIGTERM)
        return step(*args, **kwargs)

    monkeypatch.setattr(training, "queue_step", stopped_at_three)
    sigterm_while_saving(monkeypatch)  # again
    with cli.sigterm_raises(), pytest.raises(TrainInterrupted, match="SIGTERM again: training stopped at once, while "
                                                                      "writing the checkpoint of step 3, without"):
        train(load_config("tiny", tiny_overrides + ["train.max_steps=100"]), run, quiet=True)
    assert not list_checkpoints(run)


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no named pipes here")
@pytest.mark.parametrize("field", ["train_src", "train_tgt"])
def test_a_named_pipe_as_training_text_is_refused_before_it_is_read(tmp_path, tiny_overrides, field):
    """The training text is read twice (the vocabulary, then the pairs): a named pipe gave it once, and the second
    read waited for ever for another writer. Refused in one line before the run folder is made, as preprocess does
    where it trains the vocabulary."""
    from transformer.data import DataError

    os.mkfifo(pipe := tmp_path / "pipe")
    cfg = load_config("tiny", tiny_overrides + [f'data.{field}="{pipe}"'])
    with pytest.raises(DataError, match=rf"^data\.{field} .*pipe: a pipe or device, not a file; the training text is "
                                        "read twice"):
        training.data_paths(cfg)


def test_training_text_changed_in_its_files_is_refused_at_a_resume(tmp_path, tiny_overrides):
    """The training files rewritten in place (300 of their 600 lines) between a stop and its resume: the config
    names the same files, so the resume went on with the new text and said only that the data order differed.
    It is refused as text of other files is, unless --allow-config-change."""
    from transformer.data import read_lines

    run = tmp_path / "run"
    train(load_config("tiny", tiny_overrides + ["train.max_steps=3"]), run, quiet=True)
    src = next(o.split("=", 1)[1].strip('"') for o in tiny_overrides if o.startswith("data.train_src="))
    tgt = next(o.split("=", 1)[1].strip('"') for o in tiny_overrides if o.startswith("data.train_tgt="))
    for path in (src, tgt):
        Path(path).write_text("".join(f"{line}\n" for line in read_lines(Path(path))[:300]), encoding="utf-8")
    more = load_config("tiny", tiny_overrides + ["train.max_steps=5"])
    with pytest.raises(TrainError, match=r"--resume: data.train_src, data.train_tgt changed since step_00000003.json "
                                         r"was written \(the files' content, their names the same\)"):
        train(more, run, resume=True, quiet=True)
    assert [c.name for c in list_checkpoints(run)] == ["step_00000003.json"]
    assert read_toml(run / "config.toml")["train"]["max_steps"] == 3  # the refused resume's budget not written
    assert train(more, run, resume=True, quiet=True, allow_config_change=True)["step"] == 5
    assert read_toml(run / "config.toml")["train"]["max_steps"] == 5


def test_a_resumed_run_says_what_it_will_not_do_and_drops_a_stale_summary(tmp_path, tiny_overrides, monkeypatch):
    """Resumed at a budget already spent, and with --init-from, the run said nothing of either; continued for
    longer and stopped midway, it kept the earlier budget's summary.json, which said the run was done."""
    run = tmp_path / "run"
    train(load_config("tiny", tiny_overrides + ["train.max_steps=2"]), run, quiet=True)
    rate = load_checkpoint(list_checkpoints(run)[-1]).meta["optim_param_groups"][0]["lr"]
    train(load_config("tiny", tiny_overrides + ["train.max_steps=1"]), run, resume=True, quiet=True,
          init_from=run)
    assert rate > 0 and load_checkpoint(list_checkpoints(run)[-1]).meta["optim_param_groups"][0]["lr"] == rate
    log = (run / "train.log").read_text()
    assert "train.max_steps 1: already reached at step 2; nothing to train" in log
    assert f"--init-from {run}: not used; the run goes on from its own checkpoint (step 2)" in log
    assert (run / "summary.json").exists()
    # and the summary the training wrote stands: rewritten, its minutes were those of each call with nothing to do;
    # tensor files an earlier attempt's last prune left without their record (killed between the two) go
    debris = [run / "checkpoints" / f"step_00000001{suffix}" for suffix in (".safetensors", ".state.safetensors")]
    for path in debris:
        path.write_bytes(b"x")
    kept = (run / "summary.json").read_text()
    assert train(load_config("tiny", tiny_overrides + ["train.max_steps=2"]), run, resume=True,
                 quiet=True) == json.loads(kept) and (run / "summary.json").read_text() == kept
    assert not any(path.exists() for path in debris)

    def failing_step(*args, **kwargs):
        raise RuntimeError("the machine went away")

    monkeypatch.setattr(training, "queue_step", failing_step)
    with pytest.raises(RuntimeError, match="went away"):
        train(load_config("tiny", tiny_overrides + ["train.max_steps=4"]), run, resume=True, quiet=True)
    assert not (run / "summary.json").exists()


def test_a_resume_refuses_vocabulary_settings_it_cannot_apply(tmp_path, tiny_overrides):
    """A resumed run keeps the vocabulary its checkpoints were trained with, so another data.vocab_size (or
    spm_input_sentences) is refused even with --allow-config-change: config.toml would record a size the model
    has not, and `params RUN/config.toml` would count another model."""
    run = tmp_path / "run"
    train(load_config("tiny", tiny_overrides + ["train.max_steps=2"]), run, quiet=True)
    recorded = (run / "config.toml").read_text()
    for change in ("data.vocab_size=400", "data.spm_input_sentences=5000"):
        with pytest.raises(TrainError, match=rf"--resume cannot change how the vocabulary is made, "
                                             rf"{change.split('=')[0]}: .* keeps .*spm.model"):
            train(load_config("tiny", tiny_overrides + ["train.max_steps=4", change]), run, resume=True, quiet=True,
                  allow_config_change=True)
    assert (run / "config.toml").read_text() == recorded


def test_validation_during_training_scores_the_weights_as_they_are(tmp_path, tiny_overrides):
    """The validation loss logged at a step equals the loss of that step's checkpoint validated afresh:
    nothing computed for inference (packed weight copies, say) may outlive an update of the weights."""
    from transformer.data import encode_pairs, read_parallel
    from transformer.train import validate

    run = tmp_path / "run"
    cfg = load_config("tiny", tiny_overrides + ["train.max_steps=30", "train.eval_every=10", "train.log_every=10",
                                                "train.save_every=10", "model.d_model=128", "model.d_ff=512"])
    train(cfg, run, quiet=True)
    logged = {r["step"]: r["valid_nll"] for r in map(json.loads, (run / "metrics.jsonl").read_text().splitlines())
              if "valid_nll" in r}
    ckpt = load_checkpoint(run / "checkpoints" / "step_00000030.json", with_state=False)
    model = Transformer(cfg.model, Tokenizer(run / "spm.model").vocab_size)
    model.load_state_dict(ckpt.weights)
    valid, _ = encode_pairs(read_parallel(cfg.data.valid_src, cfg.data.valid_tgt), Tokenizer(run / "spm.model"),
                            cfg.data.max_len)
    assert validate(model, valid, cfg.train.max_tokens)["valid_nll"] == pytest.approx(logged[30], rel=1e-4)


def test_keep_best_on_the_label_smoothed_validation_loss(tmp_path, tiny_overrides):
    """train.keep_best = "valid_smoothed_loss" (fairseq's --best-checkpoint-metric loss of its
    label-smoothed criterion): validation reports the loss that training minimises beside the NLL, and
    best.safetensors and patience follow it."""
    from transformer.train import validate

    cfg = load_config("tiny", tiny_overrides + ["train.max_steps=6", "train.log_every=2", "train.eval_every=2",
                                                "train.save_every=2", 'train.keep_best="valid_smoothed_loss"',
                                                "train.patience=5"])
    summary = train(cfg, tmp_path / "run", quiet=True)
    records = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert all(0 < r["grad_norm"] <= r["grad_norm_max"] for r in records)  # each log line's steps' mean and max
    evals = [r for r in records if "valid_smoothed_loss" in r]
    assert [r["step"] for r in evals] == [2, 4, 6]
    assert all(r["valid_smoothed_loss"] > r["valid_nll"] for r in evals)  # ε_ls 0.1 adds the uniform term
    best = min(evals, key=lambda r: r["valid_smoothed_loss"])
    assert summary["best"]["metric"] == "valid_smoothed_loss"
    assert summary["best"]["step"] == best["step"]
    assert summary["best"]["value"] == pytest.approx(best["valid_smoothed_loss"])
    # without the option, validation computes the NLL only (one forward pass)
    model = Transformer(cfg.model, 500)
    assert set(validate(model, [], cfg.train.max_tokens)) == {"valid_nll", "valid_ppl"}


def test_each_log_line_names_the_epochs_of_its_own_step(tmp_path, tiny_overrides):
    """A log line's epoch counts the batches its step trained, not the next step's: the host draws those
    before it books the step (it read one batch ahead on every line but the last)."""
    import re

    run = tmp_path / "run"
    train(load_config("tiny", tiny_overrides + ["train.log_every=1", "train.max_steps=5"]), run, quiet=True)
    per_epoch = int(re.search(r"(\d+) batches of", (run / "train.log").read_text()).group(1))
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["epoch"] for r in records] == [round(step / per_epoch, 3) for step in range(1, 6)]


def test_each_checkpoint_is_written_once(tmp_path, tiny_overrides, monkeypatch):
    """A budget that ends on a save_every multiple wrote its last checkpoint twice, the clock's and then the
    end's (weights and Adam's moments: 2.6 GB for big); resumed at its end, the run wrote it a third time."""
    written = []
    real = training.save_checkpoint
    monkeypatch.setattr(training, "save_checkpoint", lambda run, step, *a, **k: written.append(step) or
                        real(run, step, *a, **k))
    cfg = load_config("tiny", tiny_overrides + ["train.max_steps=4", "train.save_every=2"])
    train(cfg, tmp_path / "run", quiet=True)
    assert written == [2, 4]
    train(cfg, tmp_path / "run", resume=True, quiet=True)
    assert written == [2, 4]
    train(load_config("tiny", tiny_overrides + ["train.max_steps=5", "train.save_every=2"]), tmp_path / "run",
          resume=True, quiet=True)
    assert written == [2, 4, 5]  # the budget's end, off the clock


def test_an_epoch_the_ranks_finished_stays_finished_on_fewer_ranks(tmp_path, tiny_overrides):
    """A run of 2 ranks resumed on 1 at an epoch's end: its position was rescaled by world sizes (22 of 22 batches
    per rank as 44 of the one process's 45), and the epoch's last batch was trained as that epoch's end again,
    reported, validated and saved twice. The same share of the epoch is done: all of it."""
    common = tiny_overrides + ['train.interval_unit="epochs"', "train.log_every=1", "train.eval_every=1",
                               "train.save_every=1"]
    run = tmp_path / "run"
    train(load_config("tiny", common + ["train.max_steps=1"]), run, quiet=True)
    per_epoch = checkpoint_record(list_checkpoints(run)[-1])["train_state"]["epoch_batches"]
    shutil.rmtree(run)
    train(load_config("tiny", common + [f"train.max_steps={per_epoch}"]), run, quiet=True)
    (last,) = [p for p in list_checkpoints(run) if p.stem == f"step_{per_epoch:08d}"]
    record = json.loads(last.read_text())
    ranks = (per_epoch - 1) // 2  # each of 2 ranks' share of the epoch, all of it done (floor x 2 < per_epoch)
    record["train_state"].update(world_size=2, batch_in_epoch=ranks, epoch_batches=ranks)
    last.write_text(json.dumps(record))
    cfg = load_config("tiny", common + [f"train.max_steps={per_epoch + 1}"])
    train(cfg, run, resume=True, quiet=True)
    state = checkpoint_record(list_checkpoints(run)[-1])["train_state"]
    assert (state["step"], state["epoch"], state["batch_in_epoch"]) == (per_epoch + 1, 1, 1)
    tokens = cfg.train.max_tokens * cfg.train.update_freq  # the batch halved with the ranks: said, and how to keep it
    assert (f"resuming a run trained on 2 rank(s) with 1: tokens per step {2 * tokens:,} -> {tokens:,} (eq. 3's "
            f"schedule was set for the batch; to keep {2 * tokens:,}: --set train.update_freq="
            f"{2 * cfg.train.update_freq} --allow-config-change)") in (run / "train.log").read_text()
    assert [r["step"] for r in map(json.loads, (run / "metrics.jsonl").read_text().splitlines())] == [per_epoch,
                                                                                                        per_epoch + 1]


def test_the_batch_of_a_run_resumed_on_other_ranks_is_kept_by_a_whole_setting():
    """From 2 ranks to 1 a step keeps its tokens with twice the update_freq; from 1 to 2 no whole update_freq does
    (the log gave no way to keep them, where docs/scaling.md promises one): half the max_tokens does."""
    assert keeping(2 * 4096, 4096, 1, 1, 256) == "train.update_freq=2"
    assert keeping(4096, 4096, 1, 2, 256) == "train.max_tokens=2048"
    assert keeping(4096 * 3, 4096, 3, 2, 256) == "train.update_freq=2 --set train.max_tokens=3072"
    # 3 ranks to 2: never a rank's batch above its max_tokens (its memory), which 6,144 would be
    assert keeping(3 * 4096, 4096, 1, 2, 256) == "train.update_freq=2 --set train.max_tokens=3072"
    assert keeping(128 * 4096, 4096, 1, 1, 256) == "train.update_freq=128"  # 128 ranks to 1
    # nor below a longest pair (a batch of its own), nor an update_freq that train.cuda_graphs refuses
    assert keeping(4097, 4096, 1, 1, 256) is None and keeping(4097, 4096, 1, 2, 256) is None
    assert keeping(2 * 4096, 4096, 1, 1, 256, accumulate=False) is None


def test_a_run_resumes_with_the_batch_order_it_began_with(tmp_path, tiny_overrides, monkeypatch):
    """A new run records batch order 2; a checkpoint of before the record (no batch_order) resumes with the
    first order, which its epochs so far were drawn in, and keeps recording it. A record naming no known order
    is passed over for the one before it."""
    versions = []
    monkeypatch.setattr(training, "BatchOrder", lambda *a, **k: versions.append(a[4]) or BatchOrder(*a, **k))
    common = tiny_overrides + ["train.log_every=1", "train.save_every=2"]
    run = tmp_path / "run"
    train(load_config("tiny", common + ["train.max_steps=2"]), run, quiet=True)
    last = list_checkpoints(run)[-1]
    assert checkpoint_record(last)["train_state"]["batch_order"] == 2 and set(versions) == {2}
    record = json.loads(last.read_text())
    del record["train_state"]["batch_order"]
    last.write_text(json.dumps(record))
    versions.clear()
    train(load_config("tiny", common + ["train.max_steps=4"]), run, resume=True, quiet=True)
    last = list_checkpoints(run)[-1]
    assert checkpoint_record(last)["train_state"]["batch_order"] == 1 and set(versions) == {1}
    record = json.loads(last.read_text())
    record["train_state"]["batch_order"] = 7
    last.write_text(json.dumps(record))
    train(load_config("tiny", common + ["train.max_steps=6"]), run, resume=True, quiet=True)
    assert "train_state.batch_order is 7, none of the batch orders (1, 2)" in (run / "train.log").read_text()
    assert "resumed from step_00000002.json" in (run / "train.log").read_text()


def test_intervals_in_epochs(tmp_path, tiny_overrides):
    """train.interval_unit = "epochs" (fairseq's cadence): log lines, validations (and so patience) and
    checkpoints come at the step that ends an epoch; a checkpoint of the budget's end less than half an
    epoch after the last epoch's is not averaged beside it; killed and resumed, the run repeats itself."""
    import re

    from transformer.checkpoint import checkpoints_to_average

    common = tiny_overrides + ['train.interval_unit="epochs"', "train.log_every=1", "train.eval_every=1",
                               "train.save_every=1", "train.keep_last=10"]
    probe = tmp_path / "probe"
    train(load_config("tiny", common + ["train.max_steps=1"]), probe, quiet=True)
    per_epoch = int(re.search(r"(\d+) batches of", (probe / "train.log").read_text()).group(1))
    assert per_epoch >= 3
    steps = 2 * per_epoch + 1  # two epochs and one step: the last checkpoint is 1/per_epoch into the third
    whole = tmp_path / "whole"
    summary = train(load_config("tiny", common + [f"train.max_steps={steps}"]), whole, quiet=True)
    records = [json.loads(line) for line in (whole / "metrics.jsonl").read_text().splitlines()]
    assert [(r["step"], "valid_nll" in r) for r in records] == [(per_epoch, True), (2 * per_epoch, True),
                                                                (steps, False)]
    # the epochs trained: whole at an epoch's end (1-based, as fairseq numbers them), fractional after
    assert [r["epoch"] for r in records] == [1, 2, round(2 + 1 / per_epoch, 3)]
    assert [int(p.stem.split("_")[1]) for p in list_checkpoints(whole)] == [per_epoch, 2 * per_epoch, steps]
    # the third checkpoint is 1/per_epoch of an epoch after the second: it takes the second's place
    assert [p.stem for p in checkpoints_to_average(whole, 10)] == [f"step_{per_epoch:08d}", f"step_{steps:08d}"]
    part = tmp_path / "part"
    train(load_config("tiny", common + [f"train.max_steps={per_epoch + 1}"]), part, quiet=True)
    resumed = train(load_config("tiny", common + [f"train.max_steps={steps}"]), part, resume=True, quiet=True)
    assert resumed["step"] == summary["step"] and resumed["valid_nll"] == summary["valid_nll"]
    again = [json.loads(line) for line in (part / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in again if "valid_nll" in r] == [per_epoch, 2 * per_epoch]


@pytest.fixture
def ledger(monkeypatch):
    """What the trainer does, in order: ("queue", n, lr) for each step it queues, ("read", n) when it reads a
    step's outcome, ("validate" | "save", steps in flight) when it reads the weights."""
    import transformer.train as T

    events, counts = [], {"queued": 0, "read": 0}
    queue_step = T.queue_step

    def recorded(*args, **kwargs):
        counts["queued"] += 1
        n = counts["queued"]
        events.append(("queue", n, args[4]))
        queued = queue_step(*args, **kwargs)
        result = queued.result

        def read():
            counts["read"] += 1
            events.append(("read", n))
            return result()
        queued.result = read
        return queued

    def reading(name, real):
        def wrapper(*args, **kwargs):
            events.append((name, counts["queued"] - counts["read"]))
            return real(*args, **kwargs)
        return wrapper

    monkeypatch.setattr(T, "queue_step", recorded)
    monkeypatch.setattr(T, "validate", reading("validate", T.validate))
    monkeypatch.setattr(T.Trainer, "save", reading("save", T.Trainer.save))
    return events


def test_the_host_queues_a_step_ahead_and_reads_the_weights_only_with_none_in_flight(tmp_path, tiny_overrides,
                                                                                    ledger):
    """Step k + 1 is queued before step k's outcome is read (on a GPU the host collates and launches it while
    step k runs), except where booking step k reads the weights (a validation, a checkpoint) or ends the run;
    each step takes eq. (3)'s rate for its own number."""
    from transformer.optim import learning_rate

    cfg = load_config("tiny", tiny_overrides + ["train.max_steps=7", "train.save_every=3", "train.eval_every=3",
                                                "train.log_every=1", "train.warmup_steps=4"])
    assert train(cfg, tmp_path / "run", quiet=True)["step"] == 7
    flow = [e[:2] if e[0] == "queue" else e for e in ledger]
    assert flow == [("queue", 1), ("queue", 2), ("read", 1), ("queue", 3), ("read", 2), ("read", 3),
                    ("validate", 0), ("save", 0), ("queue", 4), ("queue", 5), ("read", 4), ("queue", 6), ("read", 5),
                    ("read", 6), ("validate", 0), ("save", 0), ("queue", 7), ("read", 7), ("save", 0),
                    ("validate", 0)]  # the last: the summary's
    eq3 = lambda step: learning_rate(step, cfg.model.d_model, 4, cfg.train.lr_scale)  # noqa: E731
    assert [e[2] for e in ledger if e[0] == "queue"] == [eq3(n) for n in range(1, 8)]


def test_a_skipped_step_read_after_the_next_was_queued_moves_that_one_rate_on(tmp_path, tiny_overrides, ledger,
                                                                             monkeypatch):
    """The step queued while a step whose gradients turn out not finite was in flight took the rate of one
    step further on (the skipped step counted as applied when it was chosen); the steps after it take their
    own, and the skipped step is counted, not taken."""
    import transformer.train as T
    from transformer.optim import learning_rate

    real, calls = T.label_smoothed_loss, {"n": 0}

    def poisoned(hidden, weight, target, eps_ls):
        calls["n"] += 1
        loss = real(hidden, weight, target, eps_ls)
        return loss * float("nan") if calls["n"] == 2 else loss
    monkeypatch.setattr(T, "label_smoothed_loss", poisoned)
    cfg = load_config("tiny", tiny_overrides + ["train.max_steps=4", "train.save_every=0", "train.eval_every=1000",
                                                "train.log_every=1", "train.warmup_steps=4"])
    summary = train(cfg, tmp_path / "run", quiet=True)
    assert summary["step"] == 4 and summary["skipped_steps"] == 1
    eq3 = lambda step: learning_rate(step, cfg.model.d_model, 4, cfg.train.lr_scale)  # noqa: E731
    # queued: 1, 2 (skipped), then with 2 in flight the next at 3's rate, then 3, 4 for applied steps 3 and 4
    assert [e[2] for e in ledger if e[0] == "queue"] == [eq3(1), eq3(2), eq3(3), eq3(3), eq3(4)]
    records = map(json.loads, (tmp_path / "run" / "metrics.jsonl").read_text().splitlines())
    logged = [(r["step"], r["lr"]) for r in records]
    assert logged == [(1, eq3(1)), (2, eq3(3)), (3, eq3(3)), (4, eq3(4))]


def test_a_bucketed_batch_has_the_loss_and_gradients_of_the_batch_itself():
    """Padded to its bucket's shape, rows added, a batch trains the model as it would unpadded: the same
    loss and the same gradient for every weight (float64, no dropout), nothing not finite (an added row
    whose every key were masked would make NaN, which the weights' gradients would sum)."""
    torch.manual_seed(0)
    model = Transformer(load_config("tiny").model, 60).double().eval()
    g = torch.Generator().manual_seed(1)
    examples = [Example(torch.randint(4, 60, (int(n),), generator=g).tolist() + [2],
                        torch.randint(4, 60, (int(m),), generator=g).tolist() + [2])
                for n, m in zip(torch.randint(1, 12, (5,), generator=g), torch.randint(1, 12, (5,), generator=g))]
    results = []
    for buckets in (None, ShapeBuckets(4, 400)):
        batch = collate(examples, list(range(5)), buckets)
        model.zero_grad()
        loss = training.batch_loss(model, batch, 0.1)
        loss.backward()
        results.append((batch.src.shape, loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}))
    (plain_shape, plain_loss, plain_grads), (shape, loss, grads) = results
    assert shape[0] > plain_shape[0] and shape[1] > plain_shape[1]  # rows and positions were added
    torch.testing.assert_close(loss, plain_loss, rtol=1e-12, atol=0)
    for name, grad in grads.items():
        assert torch.isfinite(grad).all(), name
        torch.testing.assert_close(grad, plain_grads[name], rtol=1e-9, atol=1e-12, msg=name)


def test_cuda_graphs_compile_for_them_and_mark_every_step(tmp_path, tiny_overrides, monkeypatch):
    """train.cuda_graphs: the model compiled in torch.compile's CUDA-graph mode, every step begun with
    ``cudagraph_mark_step_begin`` (the step before's graph outputs are free), the batches in shape buckets
    (the log counts their shapes). The compiler itself is stood in for: on a CPU it would run no graph."""
    modes, marks = [], []
    monkeypatch.setattr(training, "compiled", lambda model, raw, device, mode=None: modes.append(mode) or model)
    monkeypatch.setattr(torch.compiler, "cudagraph_mark_step_begin", lambda: marks.append(1))
    run = tmp_path / "run"
    train(load_config("tiny", tiny_overrides + ["train.max_steps=6", "train.log_every=2", "train.eval_every=1000",
                                                "train.compile=true", "train.cuda_graphs=true",
                                                "train.shape_buckets=8"]), run, quiet=True)
    assert modes == ["reduce-overhead"] and len(marks) == 6
    assert load_checkpoint(list_checkpoints(run)[-1], with_state=False).meta["step"] == 6
    log = (run / "train.log").read_text()
    assert re.search(r"batches of <= 1024 tokens per side in \d+ shapes; padding", log)
    assert ("no CUDA graphs on cpu" in log) == (not torch.cuda.is_available())


def test_shape_buckets_hold_for_subword_sampled_epochs_across_an_epoch(tmp_path, tiny_overrides, monkeypatch):
    """With data.subword_alpha every epoch is batched anew in a worker process: those batches too take the
    buckets' shapes (rows = budget // length, both sides one bucket length), in the first epoch and the next."""
    shapes = []
    collate = training.collate

    def recorded(examples, indices, buckets=None):
        batch = collate(examples, indices, buckets)
        if buckets:  # a training batch (validation's are not bucketed)
            shapes.append((*batch.src.shape, batch.tgt_in.size(1)))
        return batch
    monkeypatch.setattr(training, "collate", recorded)
    run = tmp_path / "run"
    train(load_config("tiny", tiny_overrides + ["data.subword_alpha=0.1", "train.shape_buckets=8", "train.max_steps=24",
                                                "train.log_every=4", "train.eval_every=1000"]), run, quiet=True)
    assert load_checkpoint(list_checkpoints(run)[-1]).meta["train_state"]["epoch"] >= 1  # crossed an epoch
    buckets = ShapeBuckets(8, 1024)
    assert len(shapes) == 24 and all(s == t == buckets.lengths([s])[0] and rows == 1024 // s for rows, s, t in shapes)


def _set(overrides: list[str], key: str, value: Path) -> list[str]:
    return [o for o in overrides if not o.startswith(f"data.{key}=")] + [f'data.{key}="{value}"']


def test_dev_bleu_translates_the_validation_pairs_validation_keeps(tmp_path, tiny_overrides, monkeypatch):
    """Dev BLEU read the validation files again, whole: it translated the pairs the validation loss leaves out (a
    line too long for memory, which crashed training at its first BLEU; a side of no piece), and a validation file
    given as a pipe gave nothing the second time (an internal error). It translates the pairs kept, read once."""
    src = next(Path(o.split("=", 1)[1].strip('"')) for o in tiny_overrides if o.startswith("data.valid_src="))
    tgt = next(Path(o.split("=", 1)[1].strip('"')) for o in tiny_overrides if o.startswith("data.valid_tgt="))
    pairs = read_parallel(src, tgt)[:6]
    pairs[1] = ("a dog " * 100, pairs[1][1])  # longer than data.max_len
    pairs[3] = (pairs[3][0], "\u200b")  # no piece
    (tmp_path / "v.en").write_text("".join(s + "\n" for s, _ in pairs))
    (tmp_path / "v.de").write_text("".join(t + "\n" for _, t in pairs))
    translated = []
    monkeypatch.setattr(training, "dev_bleu", lambda model, tok, given, cfg: translated.append(given) or 1.0)
    overrides = _set(_set(tiny_overrides, "valid_src", tmp_path / "v.en"), "valid_tgt", tmp_path / "v.de")
    train(load_config("tiny", overrides + ["train.max_steps=2", "train.log_every=2", "train.bleu_every=2",
                                           "data.max_len=64"]), tmp_path / "run", quiet=True)
    assert translated == [[pairs[i] for i in (0, 2, 4, 5)]]


def test_a_validation_set_without_usable_pairs_is_refused(tmp_path, tiny_overrides):
    """An empty or blank validation set gave valid_ppl 1 (0 / max(n, 1)), a "best" checkpoint at its first
    evaluation and a patience stop; with dev BLEU, an IndexError after training. Now: one line, before any step."""
    blank = tmp_path / "blank.txt"
    blank.write_text("\n \n")
    overrides = _set(_set(tiny_overrides, "valid_src", blank), "valid_tgt", blank)
    with pytest.raises(UserError, match=r"blank.txt: no usable validation pairs"):
        train(load_config("tiny", overrides + ["train.max_steps=2"]), tmp_path / "run", quiet=True)
    assert not list_checkpoints(tmp_path / "run")


def test_validation_pairs_keep_the_training_length_bound(tmp_path, tiny_overrides):
    """A stray long validation line (two joined lines, a document) is skipped and counted as in training:
    kept, it cost memory and time with the square of its length at every validation."""
    valid = next(Path(o.split("=", 1)[1].strip('"')) for o in tiny_overrides if o.startswith("data.valid_src="))
    long = tmp_path / "valid_long.en"
    lines = valid.read_text().splitlines()
    long.write_text("\n".join(lines[:3] + [" ".join(["word"] * 400)] + lines[4:]) + "\n")
    run = tmp_path / "run"
    train(load_config("tiny", _set(tiny_overrides, "valid_src", long) + ["train.max_steps=2", "data.max_len=64"]),
          run, quiet=True)
    log = (run / "train.log").read_text()
    assert f"valid: {len(lines) - 1} pairs used of {len(lines)}; skipped 0 with an empty side, 1 longer than 64" in log


def test_training_files_are_checked_before_a_vocabulary_is_trained(tmp_path, tiny_overrides):
    """Files of unequal lengths were refused after the BPE was trained on them, and that vocabulary then
    refused the corrected files ("trained from other inputs"): the user had to delete it by hand."""
    src = next(Path(o.split("=", 1)[1].strip('"')) for o in tiny_overrides if o.startswith("data.train_src="))
    short = tmp_path / "short.en"
    short.write_text("".join(src.read_text().splitlines(keepends=True)[:-1]))
    run = tmp_path / "run"
    with pytest.raises(UserError, match="differ in length"):
        train(load_config("tiny", _set(tiny_overrides, "train_src", short) + ["train.max_steps=1"]), run, quiet=True)
    assert not run.exists()  # nor the run folder made: it held config.toml alone, no log saying why
    shutil.copyfile(src, short)  # corrected in place: the same command now trains
    done = train(load_config("tiny", _set(tiny_overrides, "train_src", short) + ["train.max_steps=1"]), run, quiet=True)
    assert done["step"] == 1


def test_a_stop_signal_before_training_began_is_in_the_log(tmp_path, tiny_overrides, monkeypatch):
    """Ctrl-C during the vocabulary's training (minutes on WMT) printed "interrupted" and left train.log without
    a word: a later attempt's lines followed the earlier's with nothing between them."""
    from transformer.errors import Terminated

    for stop, said in ((KeyboardInterrupt(), "interrupted (SIGINT): stopped at once"),
                       (Terminated(), "SIGTERM: stopped at once")):
        def stopped(cfg, src, tgt, path, log, resuming, write):
            log("training the vocabulary")
            raise stop

        monkeypatch.setattr(training, "open_vocabulary", stopped)
        run = tmp_path / type(stop).__name__
        with pytest.raises(type(stop)):
            train(load_config("tiny", tiny_overrides), run, quiet=True)
        assert (run / "train.log").read_text().splitlines()[-1].endswith(f" {said}")


def test_one_training_writes_a_run_folder_at_a_time(tmp_path, tiny_overrides):
    """Two trainings started into one folder both ran: interleaved metrics.jsonl, each overwriting the other's
    checkpoints. The second is now refused at once, naming the holder; the lock goes with its holder."""
    from transformer import files

    run = tmp_path / "run"
    cfg = load_config("tiny", tiny_overrides + ["train.max_steps=2"])
    holder = files.hold_folder(run, "--out")  # as another process's training would
    try:
        with pytest.raises(UserError, match=rf"--out {run}: pid {os.getpid()} on .* is writing this folder"):
            train(cfg, run, quiet=True)
        assert not (run / "config.toml").exists()
    finally:
        holder.close()
    assert train(cfg, run, quiet=True)["step"] == 2
    assert train(load_config("tiny", tiny_overrides + ["train.max_steps=3"]), run, resume=True, quiet=True)["step"] == 3


def test_the_log_says_what_the_batch_and_length_bounds_did(tmp_path, tiny_overrides):
    """A max_tokens below some pairs' length logged "batches of <= 40 tokens" while longer pairs formed batches
    of their own; a max_len that leaves most pairs out trained on the rest without a word."""
    run = tmp_path / "run"
    train(load_config("tiny", tiny_overrides + ["train.max_steps=1", "train.max_tokens=18", "data.max_len=20"]),
          run, quiet=True)
    log = (run / "train.log").read_text()
    used, total, long = map(int, re.search(r"train: (\d+) pairs used of (\d+); .*, (\d+) longer than 20", log).groups())
    assert long > used and f"warning: most training pairs ({long} of {total}) are longer than data.max_len" in log
    alone = re.search(r"batches of <= 18 tokens per side \((\d+) pairs longer than that, each a batch of its own\)",
                      log)
    assert alone and int(alone.group(1)) > 0


def test_extending_a_cooled_down_run_says_the_rate_rises_again(tmp_path, tiny_overrides):
    """The cooldown is the budget's last part: a finished run given more steps goes back up to eq. (3)'s rate,
    which the log did not say."""
    run = tmp_path / "run"
    train(load_config("tiny", tiny_overrides + ["train.max_steps=2", "train.cooldown_fraction=0.5"]), run, quiet=True)
    train(load_config("tiny", tiny_overrides + ["train.max_steps=3", "train.cooldown_fraction=0.5"]), run,
          resume=True, quiet=True)
    assert "the cooldown (train.cooldown_fraction 0.5) is the new budget's last part" in (run / "train.log").read_text()


def test_data_not_set_says_what_to_do():
    """`train configs/tiny.toml` said only "data.train_src is not set"."""
    with pytest.raises(ConfigError) as err:
        training.data_paths(load_config("tiny"))
    assert str(err.value) == ("data.train_src is not set (nor data.train_tgt, data.valid_src, data.valid_tgt): name "
                              "the files in the config's [data] (as the complete recipe configs/multi30k_en_de.toml "
                              "does) or with --set data.train_src=FILE, one --set each")
    with pytest.raises(ConfigError, match=r"^data.valid_tgt is not set: "):
        training.data_paths(load_config("multi30k_en_de", ['data.valid_tgt=""']))


@pytest.mark.parametrize("signal_name", ["SIGTERM", "SIGINT"])
def test_a_stop_signal_whose_exception_was_lost_before_training_stops_training(signal_name):
    """SIGTERM raises ``Terminated`` (SIGINT KeyboardInterrupt) from a signal handler, wherever Python is: in Python
    code called back by C code that clears any error (as during `import torch`, a rank's first seconds) the
    exception was lost and the command went on, a rank of `train --nproc` training on and its launcher waiting for
    it. Training takes that signal as its own (it stops after its first step, with a checkpoint); once the command
    is over, it counts no more."""
    import signal

    from transformer import cli

    signum = getattr(signal, signal_name)
    with cli.sigterm_raises():
        assert signal.getsignal(signal.SIGTERM) is cli._terminate  # else the SIGTERM below would end pytest
        try:
            os.kill(os.getpid(), signum)
            time.sleep(5)  # the handler raises in here
        except BaseException:  # what such C code does with the handler's exception
            pass
        stop = training.StopSignals()
        stop.restore()
    assert stop.received == signum
    stop = training.StopSignals()
    stop.restore()
    assert stop.received is None


def test_a_command_that_fails_after_a_lost_stop_signal_stops_as_signalled():
    """A stop signal's exception lost in an import leaves that module half imported, and the command then failed
    as an internal error (numpy's, imported by torch's C code, recursed for ever): it is the signal's stop."""
    import signal

    from transformer import cli
    from transformer.errors import Terminated

    with pytest.raises(Terminated):
        with cli.sigterm_raises():
            try:
                os.kill(os.getpid(), signal.SIGTERM)
                time.sleep(5)
            except BaseException:
                pass
            raise RecursionError("maximum recursion depth exceeded")
    with pytest.raises(RecursionError):  # no signal: the error is the error
        with cli.sigterm_raises():
            raise RecursionError("maximum recursion depth exceeded")


def test_each_checkpoint_records_the_training_time_until_it(tmp_path, tiny_overrides):
    """train_state.elapsed_s of a checkpoint is the run's training time at it, this process's included: the
    clock of train.save_minutes (the checkpoints averaged are spaced by it) and of train.max_minutes on resume."""
    run = tmp_path / "run"
    train(load_config("tiny", tiny_overrides + ["train.max_steps=4", "train.save_every=2"]), run, quiet=True)
    elapsed = [load_checkpoint(p, with_state=False).meta["train_state"]["elapsed_s"] for p in list_checkpoints(run)]
    assert len(elapsed) == 2 and 0 < elapsed[0] < elapsed[1]


def test_the_save_minutes_clock_runs_on_across_resumes(tmp_path, tiny_overrides, monkeypatch):
    """train.save_minutes (0.6 s here) was timed from each process's start: a run stopped every 2 steps (< 0.6 s
    each, though > 1.8 s in all) never wrote a checkpoint of the clock, and ended with one checkpoint to average
    of decode.average_last 5. The clock runs on the run's training time, earlier attempts included."""
    import signal

    from transformer.checkpoint import checkpoints_to_average
    from transformer.train import TrainInterrupted

    sets = tiny_overrides + ["train.save_every=0", "train.save_minutes=0.01", "train.max_steps=12"]
    step, calls = training.queue_step, []

    def slow_and_stopped_every_second(*args, **kwargs):
        calls.append(1)
        time.sleep(0.16)
        if len(calls) % 2 == 0:
            os.kill(os.getpid(), signal.SIGTERM)
        return step(*args, **kwargs)

    monkeypatch.setattr(training, "queue_step", slow_and_stopped_every_second)
    run = tmp_path / "run"
    for attempt in range(6):
        with pytest.raises(TrainInterrupted, match=f"stopped after step {2 * attempt + 2}"):
            train(load_config("tiny", sets), run, resume=attempt > 0, quiet=True)
    records = [load_checkpoint(p, with_state=False).meta for p in list_checkpoints(run)]
    assert sum(record["on_clock"] for record in records) >= 2
    assert len(checkpoints_to_average(run, 5)) >= 2  # was 1: the signal's of step 12 alone


def test_a_resume_that_keeps_a_best_of_the_other_direction_starts_its_best_anew(tmp_path, tiny_overrides):
    """train.keep_best changed on --resume from valid_loss (lower is better, ~6.2 here) to dev_bleu (higher is
    better, ~0 for a tiny model): compared with the old loss no BLEU would improve, and patience would stop the
    run at its first evaluation with best.safetensors still the loss's. The best starts anew: the first BLEU
    after the resume is the best so far."""
    common = tiny_overrides + ["train.log_every=2", "train.eval_every=2", "train.save_every=2", "train.bleu_every=2",
                               "train.bleu_sentences=5"]
    run = tmp_path / "run"
    train(load_config("tiny", common + ["train.max_steps=4", 'train.keep_best="valid_loss"']), run, quiet=True)
    resumed = train(load_config("tiny", common + ["train.max_steps=8", 'train.keep_best="dev_bleu"',
                                                  "train.patience=2"]), run, resume=True, quiet=True)
    assert resumed["best"]["metric"] == "dev_bleu" and resumed["best"]["step"] >= 6
    assert load_checkpoint(run / "best.safetensors", with_state=False).meta["best"]["metric"] == "dev_bleu"


def test_a_log_line_across_a_stop_and_resume_averages_all_its_steps(tmp_path, tiny_overrides, monkeypatch):
    """SIGTERM after step 7, resumed: the line of step 10 (log_every 5) averaged the loss and gradient norms of
    steps 8-10 alone, those of 6 and 7 logged nowhere: an epoch's train loss (interval_unit "epochs") was of its
    part after the resume. The checkpoint keeps the line's steps so far, as it keeps the data order."""
    import signal

    from transformer.train import TrainInterrupted

    common = tiny_overrides + ["train.log_every=5", "train.eval_every=1000", "train.save_every=1000",
                               "train.max_steps=10"]
    full, part = tmp_path / "full", tmp_path / "part"
    train(load_config("tiny", common), full, quiet=True)
    step, calls = training.queue_step, []

    def stopped_at_seven(*args, **kwargs):
        calls.append(1)
        if len(calls) == 7:
            os.kill(os.getpid(), signal.SIGTERM)
        return step(*args, **kwargs)

    monkeypatch.setattr(training, "queue_step", stopped_at_seven)
    with pytest.raises(TrainInterrupted, match="stopped after step 7"):
        train(load_config("tiny", common), part, quiet=True)
    monkeypatch.setattr(training, "queue_step", step)
    train(load_config("tiny", common), part, resume=True, quiet=True)
    records = [[json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()] for run in (full, part)]
    assert [r["step"] for r in records[1]] == [r["step"] for r in records[0]] == [5, 10]
    for key in ("train_loss", "grad_norm", "grad_norm_max", "lr"):
        assert [r[key] for r in records[1]] == [r[key] for r in records[0]], key


def test_a_streak_of_non_finite_steps_is_counted_across_a_resume(tmp_path, tiny_overrides, monkeypatch):
    """train.max_bad_steps counts skipped steps in a row, those before a stop included: a run stopped in such a
    streak (a preempted fp16 job) and resumed began the count anew, so a run stopped often enough never stopped
    on it. Here every step from the 3rd on is not finite: 2 are skipped before SIGTERM, the resume skips 2 more
    and stops at 4 in a row (the step queued ahead of the signal's may be one more before it)."""
    import signal

    import transformer.train as T
    from transformer.train import TrainInterrupted

    real, calls = T.label_smoothed_loss, {"n": 0}

    def poisoned(hidden, weight, target, eps_ls):
        calls["n"] += 1
        loss = real(hidden, weight, target, eps_ls)
        return loss * float("nan") if calls["n"] >= 3 else loss

    def stop_after_two_bad(*args, **kwargs):
        if calls["n"] == 4:
            os.kill(os.getpid(), signal.SIGTERM)
        return step(*args, **kwargs)

    step = training.queue_step
    monkeypatch.setattr(T, "label_smoothed_loss", poisoned)
    monkeypatch.setattr(training, "queue_step", stop_after_two_bad)
    cfg = load_config("tiny", tiny_overrides + ["train.max_steps=20", "train.max_bad_steps=4", "train.save_every=0",
                                                "train.eval_every=1000"])
    run = tmp_path / "run"
    with pytest.raises(TrainInterrupted):
        train(cfg, run, quiet=True)
    state = load_checkpoint(list_checkpoints(run)[-1], with_state=False).meta["train_state"]
    streak = state["bad_in_a_row"]
    assert state["step"] == 2 and state["skipped_steps"] == streak in (2, 3)
    monkeypatch.setattr(training, "queue_step", step)
    skipped_before = (run / "train.log").read_text().count("gradients are not finite")
    with pytest.raises(TrainError, match="4 steps in a row had non-finite gradients; stopping at step 2"):
        train(cfg, run, resume=True, quiet=True)
    assert (run / "train.log").read_text().count("gradients are not finite") - skipped_before == 4 - streak


def test_a_run_continued_past_a_step_budget_that_ended_between_log_lines_logs_as_one_never_stopped(tmp_path,
                                                                                                    tiny_overrides):
    """A step budget that ends between two log lines logs its last step, and that line emptied the checkpoint's log
    window: continued for longer (--resume with more steps), the next line averaged its own steps alone (an epoch's
    train loss, with interval_unit "epochs", its part after the resume), and metrics.jsonl kept the earlier end's
    line beside it. The next line averages them all and takes the place of the earlier end's."""
    common = tiny_overrides + ["train.log_every=5", "train.eval_every=1000", "train.save_every=1000"]
    full, part = tmp_path / "full", tmp_path / "part"
    train(load_config("tiny", common + ["train.max_steps=10"]), full, quiet=True)
    train(load_config("tiny", common + ["train.max_steps=7"]), part, quiet=True)
    assert [json.loads(line)["step"] for line in (part / "metrics.jsonl").read_text().splitlines()] == [5, 7]
    train(load_config("tiny", common + ["train.max_steps=10"]), part, resume=True, quiet=True)
    records = [[json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()] for run in (full, part)]
    assert [r["step"] for r in records[1]] == [r["step"] for r in records[0]] == [5, 10]
    for key in ("train_loss", "grad_norm", "grad_norm_max", "lr"):
        assert [r[key] for r in records[1]] == [r[key] for r in records[0]], key


@pytest.mark.parametrize("stop", ["budget", "SIGTERM"])
def test_a_step_skipped_just_before_a_stop_leaves_the_next_its_uninterrupted_rate(tmp_path, tiny_overrides,
                                                                                 monkeypatch, stop):
    """The step queued while a step whose gradients turn out not finite is in flight takes the rate one step on.
    Where training stopped just after such a step (a signal; or the step budget about to end, which books its last
    step before queueing another), it was booked with nothing queued after it, and the next step, after the resume
    or within the budget, took the rate of its own number: the run went on with another rate, and other weights,
    than one never stopped."""
    import signal

    import transformer.train as T
    from transformer.train import TrainInterrupted

    real, calls = T.label_smoothed_loss, {"n": 0}

    def poisoned(hidden, weight, target, eps_ls):  # the fifth step's gradients are not finite
        calls["n"] += 1
        loss = real(hidden, weight, target, eps_ls)
        return loss * float("nan") if calls["n"] == 5 else loss

    monkeypatch.setattr(T, "label_smoothed_loss", poisoned)
    common = tiny_overrides + ["train.log_every=1", "train.eval_every=1000", "train.save_every=1000",
                               "train.warmup_steps=4"]
    full, part = tmp_path / "full", tmp_path / "part"
    train(load_config("tiny", common + ["train.max_steps=8"]), full, quiet=True)
    calls["n"] = 0
    if stop == "budget":  # the fifth step is skipped, the sixth is the budget's last
        train(load_config("tiny", common + ["train.max_steps=5"]), part, quiet=True)
    else:
        step = T.queue_step

        def stopped_at_the_fifth(*args, **kwargs):
            if calls["n"] == 4:
                os.kill(os.getpid(), signal.SIGTERM)
            return step(*args, **kwargs)

        monkeypatch.setattr(T, "queue_step", stopped_at_the_fifth)
        with pytest.raises(TrainInterrupted, match="stopped after step 4"):
            train(load_config("tiny", common + ["train.max_steps=8"]), part, quiet=True)
        monkeypatch.setattr(T, "queue_step", step)
    train(load_config("tiny", common + ["train.max_steps=8"]), part, resume=True, quiet=True)
    rates = [[(r["step"], r["lr"]) for r in map(json.loads, (run / "metrics.jsonl").read_text().splitlines())]
             for run in (full, part)]
    assert rates[1] == rates[0]
    a, b = load_checkpoint(list_checkpoints(full)[-1]), load_checkpoint(list_checkpoints(part)[-1])
    assert a.meta["train_state"]["skipped_steps"] == b.meta["train_state"]["skipped_steps"] == 1
    for name, tensor in a.weights.items():
        assert torch.equal(tensor, b.weights[name]), name


def test_an_epoch_that_ends_in_a_skipped_step_just_before_a_stop_is_reported_after_the_resume(tmp_path,
                                                                                            tiny_overrides,
                                                                                            monkeypatch):
    """With train.interval_unit = "epochs", an epoch whose last step is skipped (gradients not finite) is reported
    at the next applied step: its log line, validation and checkpoint. Stopped just after that skipped step, the
    resumed run counted the epoch as reported already (its last batch was drawn), and never logged, validated or
    saved it: the checkpoints, and so the average, were not those of a run never stopped."""
    import re
    import signal

    import transformer.train as T
    from transformer.train import TrainInterrupted

    real, calls = T.label_smoothed_loss, {"n": 0, "bad": 0}

    def poisoned(hidden, weight, target, eps_ls):  # the epoch's last step's gradients are not finite
        loss = real(hidden, weight, target, eps_ls)
        if torch.is_grad_enabled():  # training, not validation
            calls["n"] += 1
            return loss * float("nan") if calls["n"] == calls["bad"] else loss
        return loss

    common = tiny_overrides + ['train.interval_unit="epochs"', "train.log_every=1", "train.eval_every=1",
                               "train.save_every=1"]
    probe = tmp_path / "probe"
    train(load_config("tiny", common + ["train.max_steps=1"]), probe, quiet=True)
    per_epoch = int(re.search(r"(\d+) batches of", (probe / "train.log").read_text()).group(1))
    sets = common + [f"train.max_steps={per_epoch + 3}"]
    monkeypatch.setattr(T, "label_smoothed_loss", poisoned)
    calls.update(n=0, bad=per_epoch)
    full, part = tmp_path / "full", tmp_path / "part"
    train(load_config("tiny", sets), full, quiet=True)
    calls["n"] = 0
    step = T.queue_step

    def stopped_at_the_epochs_end(*args, **kwargs):
        if calls["n"] == per_epoch - 1:  # as the epoch's last step is queued
            os.kill(os.getpid(), signal.SIGTERM)
        return step(*args, **kwargs)

    monkeypatch.setattr(T, "queue_step", stopped_at_the_epochs_end)
    with pytest.raises(TrainInterrupted, match=f"stopped after step {per_epoch - 1}"):
        train(load_config("tiny", sets), part, quiet=True)
    monkeypatch.setattr(T, "queue_step", step)
    calls["bad"] = 0
    train(load_config("tiny", sets), part, resume=True, quiet=True)
    records = [[json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()] for run in (full, part)]
    reported = [[(r["step"], "valid_nll" in r) for r in run] for run in records]
    assert reported[1] == reported[0] == [(per_epoch, True), (per_epoch + 3, False)]
    assert [p.name for p in list_checkpoints(part)] == [p.name for p in list_checkpoints(full)]


def test_an_average_of_more_checkpoints_than_are_kept_is_refused_before_the_run_starts(tmp_path, tiny_overrides):
    """decode.average_last above train.keep_last: pruning kept fewer checkpoints than the run's decoding averages,
    so "the last 20" (big, §6.1) would quietly be an average of fewer. Refused before the run folder is made."""
    cfg = load_config("tiny", tiny_overrides + ["train.keep_last=3", "decode.average_last=5"])
    with pytest.raises(TrainError, match=r"^decode.average_last 5 averages more checkpoints than train.keep_last 3 "
                                         r"keeps: raise train.keep_last to at least 5$"):
        train(cfg, tmp_path / "run", quiet=True)
    assert not (tmp_path / "run").exists()


def test_a_closed_log_pipe_leaves_training_to_go_on_into_train_log(tmp_path, tiny_overrides):
    """`train ... | head -3`: the pipe's reader gone, the next log line raised EPIPE, and training ended at once
    with exit 141, no word on the terminal and no checkpoint. It trains on to its budget, its lines in train.log."""
    import subprocess
    import sys

    run = tmp_path / "run"
    sets = [a for o in tiny_overrides + ["train.max_steps=40", "train.log_every=1"] for a in ("--set", o)]
    proc = subprocess.Popen([sys.executable, "-m", "transformer", "train", "tiny", "--out", str(run), *sets],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        for _ in range(3):
            assert proc.stdout.readline()
        proc.stdout.close()  # as head does once it has its lines
        assert proc.wait(timeout=300) == 0, proc.stderr.read().decode()[-2000:]
    finally:
        proc.kill()
    log = (run / "train.log").read_text()
    assert "standard output: Broken pipe; the log goes on here alone" in log and "done: " in log, log[-2000:]
    assert load_checkpoint(list_checkpoints(run)[-1]).meta["train_state"]["step"] == 40


def test_a_run_that_ends_with_a_model_of_no_numbers_says_so(tmp_path, tiny_overrides):
    """train.lr_scale 1e30: one step, and the run finished with 0 and a validation loss of NaN, a model whose
    every translation failed. It ends with the reason, its records kept."""
    run = tmp_path / "run"
    with pytest.raises(TrainError, match=r"^the trained model's validation loss is nan: its weights overflow"):
        train(load_config("tiny", tiny_overrides + ["train.max_steps=1", "train.lr_scale=1e30"]), run, quiet=True)
    assert (run / "summary.json").is_file() and list_checkpoints(run)


def test_a_folder_named_as_training_text_is_called_a_folder(tmp_path, tiny_overrides):
    """data.train_src naming a folder was refused as "a pipe or device, not a file"."""
    cfg = load_config("tiny", tiny_overrides + [f'data.train_src="{tmp_path}"'])
    with pytest.raises(DataError, match=rf"^data\.train_src {re.escape(str(tmp_path))}: a folder; give the training "
                                        "text's file$"):
        training.data_paths(cfg)


def test_train_from_python_checks_its_arguments(tmp_path, tiny_overrides):
    """A Config edited after load_config was trained as it was (max_steps -5: a run of step 0) or failed deep in
    torch (a str for d_model); a preset's name for the config, or None for the folder, was an AttributeError or
    pathlib's TypeError. Each is now a ConfigError naming it, before anything is written."""
    def edited(section: str, key: str, value: object):
        cfg = load_config("tiny", tiny_overrides)
        setattr(getattr(cfg, section), key, value)
        return cfg

    out = tmp_path / "run"
    for cfg, where, message in ((edited("train", "max_steps", -5), out, "^train.max_steps must be positive, got -5"),
                                (edited("model", "d_model", "abc"), out, "^cfg: model.d_model must be int, got str"),
                                ("tiny", out, r"^cfg: a Config \(load_config\(PRESET or FILE\)\), not str 'tiny'"),
                                (load_config("tiny", tiny_overrides), None, "^out: a path .*, not NoneType None"),
                                (load_config("tiny", tiny_overrides), "", "^out: a path .*, not str ''")):
        with pytest.raises(ConfigError, match=message):
            train(cfg, where, quiet=True)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="^init_from: a path .*, not int 5"):
        train(load_config("tiny", tiny_overrides), out, quiet=True, init_from=5)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="^load_config: the preset or file: a path .*, not int 123"):
        load_config(123)  # type: ignore[arg-type]
    assert not out.exists()


def test_a_save_clock_in_minutes_beside_one_in_steps_is_said_to_be_unused(tmp_path, tiny_overrides):
    """`--set train.save_minutes=5` on a preset that saves every N steps was dropped without a word (the steps'
    clock wins, training.md: never both)."""
    run = tmp_path / "run"
    train(load_config("tiny", tiny_overrides + ["train.max_steps=2", "train.save_every=2", "train.save_minutes=5"]),
          run, quiet=True)
    assert ("note: train.save_minutes 5 is not used: train.save_every 2 sets the save clock (set train.save_every = 0 "
            "to save by time)") in (run / "train.log").read_text()
    quiet = tmp_path / "quiet"
    train(load_config("tiny", tiny_overrides + ["train.max_steps=2", "train.save_every=2"]), quiet, quiet=True)
    assert "save_minutes" not in (quiet / "train.log").read_text()


def test_what_two_ranks_disagree_in_is_named_whichever_holds_the_key():
    """A key only another rank's config holds (another package version there) was left out: "differs in ."."""
    from transformer.train import disagreement

    ours = {"config": {"model": {"d_ff": 64}}, "vocabulary": "a" * 64}
    assert disagreement(ours, {"config": {"model": {"d_ff": 64, "extra": 2}}, "vocabulary": "a" * 64}) == \
        "model.extra None (rank 0) vs 2"
    assert disagreement(ours, {"config": {"model": {"d_ff": 96}}, "vocabulary": "b" * 64}) == \
        f"model.d_ff 64 (rank 0) vs 96; the vocabulary (spm.model sha256 {'a' * 12} (rank 0) vs {'b' * 12})"
    assert disagreement({**ours, "data": {"train_src": "c" * 64}, "resume": False},
                        {**ours, "data": {"train_src": "d" * 64}, "resume": True}) == \
        f"data.train_src's file (sha256 {'c' * 12} (rank 0) vs {'d' * 12}); --resume False (rank 0) vs True"
