"""Translating from a run folder: averaging by default, refusing weights that do not fit."""

import json
import re
from pathlib import Path
from types import MappingProxyType

import pytest
import torch

from transformer.checkpoint import CheckpointError, list_checkpoints, load_checkpoint, write_model
from transformer.config import ConfigError, load_config
from transformer.request import CLI, DecodeRequest
from transformer.train import train
from transformer.translator import ModelOverflow, Translator


@pytest.fixture
def run(tmp_path, tiny_overrides):
    out = tmp_path / "run"
    train(load_config("tiny", tiny_overrides + ["train.max_steps=6", "train.save_every=2"]), out, quiet=True)
    return out


def test_default_is_the_average_of_the_last_checkpoints(run):
    messages = []
    translator = Translator(run, log=messages.append)
    assert "averaging the last 3 checkpoint(s) (of decode.average_last 5): " in messages[0]  # 3 exist
    weights = [load_checkpoint(p).weights["embed.weight"] for p in list_checkpoints(run)]
    torch.testing.assert_close(translator.model.embed.weight.detach().cpu(), torch.stack(weights).mean(0))
    outputs = translator.translate(["A dog runs.", "", "   "], DecodeRequest(beam_size=2))
    assert len(outputs) == 3 and outputs[1] == "" and outputs[2] == ""


def test_weights_that_do_not_fit_are_refused(run, tmp_path):
    ckpt = load_checkpoint(list_checkpoints(run)[-1], with_state=False)
    bad = dict(ckpt.weights, **{"embed.weight": torch.zeros(3, 64)})
    path = tmp_path / "bad.safetensors"
    write_model(path, bad, {k: ckpt.meta[k] for k in ("config", "vocab_sha256")})
    with pytest.raises(CheckpointError, match="do not fit the config"):
        Translator(run, path)
    missing = {k: v for k, v in ckpt.weights.items() if k != "embed.weight"}
    write_model(path, missing, {k: ckpt.meta[k] for k in ("config", "vocab_sha256")})
    with pytest.raises(CheckpointError, match="missing"):
        Translator(run, path)


def test_weights_of_another_dtype_or_not_finite_are_refused(run, tmp_path):
    """load_state_dict casts what it is given: a file whose weights were integers (their sha256 sums redone)
    translated with rc 0, as did one of NaNs; neither is a model training writes."""
    ckpt = load_checkpoint(list_checkpoints(run)[-1], with_state=False)
    path = tmp_path / "bad.safetensors"
    meta = {k: ckpt.meta[k] for k in ("config", "vocab_sha256")}
    write_model(path, {k: v.long() for k, v in ckpt.weights.items()}, meta)
    with pytest.raises(CheckpointError, match=r"do not fit the config \(\S+ is torch.int64, not a float tensor"):
        Translator(run, path)
    write_model(path, dict(ckpt.weights, **{"embed.weight": torch.full_like(ckpt.weights["embed.weight"],
                                                                             float("nan"))}), meta)
    with pytest.raises(CheckpointError, match=r"do not fit the config \(embed.weight is not finite"):
        Translator(run, path)


def test_not_a_run_folder(tmp_path):
    with pytest.raises(CheckpointError, match="not a run folder"):
        Translator(tmp_path)


def test_int8_quantizes_every_linear_layer_and_stays_close(run):
    fp32 = Translator(run, log=lambda m: None, device="cpu")  # int8 runs on the CPU: compare there
    int8 = Translator(run, log=lambda m: None, int8=True)
    kinds = {type(m) for m in int8.model.modules()}
    assert torch.ao.nn.quantized.dynamic.Linear in kinds
    assert torch.nn.Linear not in kinds  # every one, the tied projection too
    src = torch.tensor([[5, 6, 7, 8, 1]])
    tgt = torch.tensor([[0, 9, 10, 11]])
    with torch.inference_mode():
        a, b = fp32.model(src, tgt), int8.model(src, tgt)
    assert not torch.equal(a, b)  # it is quantized ...
    torch.testing.assert_close(b.log_softmax(-1), a.log_softmax(-1), atol=0.1, rtol=0.05)  # ... and close
    assert len(int8.translate(["A dog runs.", ""], DecodeRequest(beam_size=2))) == 2
    # the quantized output layer has no weight tensor: prefixes and constraints still work on it
    hyps = int8.decode(["A dog runs.", "A cat."], DecodeRequest(beam_size=4, prefixes=["Ein", ""], constraints=[["Hund"], []]))
    assert len(hyps) == 2 and all(hyps)


def test_bf16_decodes_with_bf16_weights_close_to_fp32(run, monkeypatch):
    """--bf16: every weight, the packed copies oneDNN reads, the positions and a decoding step's cache in bf16,
    the step still the model's own forward at that position, its log-probabilities near fp32's; on a processor
    that would emulate bf16 products loading says so, once."""
    import transformer.translator as translator_module
    from transformer.tokenizer import PAD_ID

    fp32 = Translator(run, log=lambda m: None, device="cpu")
    said: list[str] = []
    monkeypatch.setattr(translator_module, "native_bf16", lambda device: True)
    bf16 = Translator(run, log=said.append, device="cpu", bf16=True)
    assert {p.dtype for p in bf16.model.parameters()} == {torch.bfloat16} and bf16.setup.bf16
    assert all(w._onednn.dtype == torch.bfloat16 for m in bf16.model.modules() if type(m) is torch.nn.Linear
               for w in [m.weight] if hasattr(w, "_onednn"))
    src, tgt = torch.tensor([[5, 6, 7, 8, 1]]), torch.tensor([[PAD_ID, 9, 10, 11]])
    with torch.inference_mode():
        full = bf16.model(src, tgt)
        memory, mask = bf16.model.encode(src)
        cache = bf16.model.init_cache(memory, mask)
        steps = torch.stack([bf16.model.decode_step(tgt[:, t], cache) for t in range(tgt.size(1))], 1)
        reference = fp32.model(src, tgt)
    assert full.dtype == steps.dtype == cache.self_k.dtype == torch.bfloat16
    assert bf16.model.positions(3, 0, "src_pos", src.device).dtype == torch.bfloat16
    torch.testing.assert_close(steps.float(), full.float(), atol=0.1, rtol=0.05)
    torch.testing.assert_close(full.float().log_softmax(-1), reference.log_softmax(-1), atol=0.1, rtol=0.05)
    assert len(bf16.translate(["A dog runs.", ""], DecodeRequest(beam_size=2))) == 2
    assert not [m for m in said if "--bf16" in m]
    monkeypatch.setattr(translator_module, "native_bf16", lambda device: False)
    said.clear()
    Translator(run, log=said.append, device="cpu", bf16=True)
    assert [m for m in said if "--bf16" in m] == [
        "--bf16: this CPU has no bf16 arithmetic of its own (AVX512-BF16 or AMX; a GPU since Ampere): emulated, "
        "slower than fp32 here"]
    with pytest.raises(ConfigError, match="^--int8 with --bf16: int8 quantizes the fp32 weights; give one of the two$"):
        Translator(run, int8=True, bf16=True)


def test_device_choice_is_checked(run):
    assert Translator(run, device="cpu").device == torch.device("cpu")
    assert Translator(run, int8=True).device == torch.device("cpu")  # int8 decodes on the CPU, GPU or not
    with pytest.raises(ConfigError, match="--int8 with --device cuda: int8 kernels run on the CPU only"):
        Translator(run, int8=True, device="cuda")
    for other in ("gpu0", "foo", "cuda:x"):  # torch's message listed its twenty device types, xpu and opengl among them
        with pytest.raises(CheckpointError, match=f"^--device {other}: give cpu, cuda or cuda:N$"):
            Translator(run, device=other)
    for other in ("mps", "meta"):  # devices torch names, which this package does not decode on: internal errors
        with pytest.raises(CheckpointError, match=f"^--device {other}: give cpu, cuda or cuda:N$"):
            Translator(run, device=other)
    if not torch.cuda.is_available():
        with pytest.raises(CheckpointError, match="no CUDA GPU"):
            Translator(run, device="cuda")


@pytest.mark.parametrize("config, problem", [([], ": its config: must be a table of [sections], not list"),
                                             ({"decode": {"beam_size": 0}}, ": its config: decode.beam_size must be "
                                                                            "positive, got 0")])
def test_a_checkpoint_records_own_bad_config_names_the_record(tmp_path, config, problem):
    """A record edited by hand: a config that is no table was an internal error, and one that breaks a rule
    read as if the user's own config or options were at fault."""
    import shutil

    run = tmp_path / "run"
    shutil.copytree(Path(__file__).parent / "data" / "decode_reference", run)
    record = sorted((run / "checkpoints").glob("*.json"))[-1]
    meta = json.loads(record.read_text())
    meta["config"] = config if isinstance(config, list) else {**meta["config"], **{
        k: {**meta["config"][k], **v} for k, v in config.items()}}
    record.write_text(json.dumps(meta))
    with pytest.raises(CheckpointError, match=f"^{re.escape(str(record) + problem)}"):
        Translator(run, log=lambda m: None)


def test_a_gpu_that_is_not_there_is_refused_before_loading(monkeypatch):
    """--device cuda:3 where torch sees one GPU is named in one line, not a failure inside .to()."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    with pytest.raises(CheckpointError, match=r"^--device cuda:3: torch sees 1 CUDA GPU \(cuda:0\)$"):
        Translator(Path(__file__).parent / "data" / "decode_reference", device="cuda:3", log=lambda m: None)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_gpu_decodes_like_the_cpu(run):
    lines = ["A dog runs.", "Two men are talking on a bench.", ""]
    cpu = Translator(run, device="cpu").translate(lines, DecodeRequest(beam_size=4))
    gpu = Translator(run, device="cuda")
    assert next(gpu.model.parameters()).is_cuda
    assert gpu.translate(lines, DecodeRequest(beam_size=4)) == cpu


def test_an_ensemble_needs_one_vocabulary(run, tmp_path, tiny_overrides):
    """A run with itself translates as the run alone; a run trained with another vocabulary is refused."""
    lines = ["A dog runs.", "Two men talk on a street."]
    alone = Translator(run, log=lambda m: None).translate(lines)
    assert Translator(run, log=lambda m: None, ensemble=[run]).translate(lines) == alone
    other = tmp_path / "other"
    train(load_config("tiny", tiny_overrides + ["train.max_steps=2", "data.vocab_size=400"]), other, quiet=True)
    with pytest.raises(CheckpointError, match="another vocabulary"):
        Translator(run, log=lambda m: None, ensemble=[other])
    theirs = list_checkpoints(other)[-1]  # named as --checkpoint's other refusals are (the file alone, it was)
    with pytest.raises(CheckpointError, match=f"^--checkpoint {re.escape(str(theirs))}: trained with another "
                                              f"vocabulary than {re.escape(str(run / 'spm.model'))}$"):
        Translator(run, checkpoint=theirs, log=lambda m: None)
    import shutil

    mixed = tmp_path / "mixed"  # one run's checkpoints in another's folder: the run folder was named, not a file
    shutil.copytree(other, mixed)
    shutil.rmtree(mixed / "checkpoints")
    shutil.copytree(run / "checkpoints", mixed / "checkpoints")
    newest = list_checkpoints(mixed)[-1]
    with pytest.raises(CheckpointError, match=f"^{re.escape(str(newest))}: trained with another vocabulary than"):
        Translator(mixed, log=lambda m: None)


def test_an_ensemble_needs_one_task_and_direction(run, tmp_path):
    """A joint vocabulary trained on both sides is the same spm.model for EN->DE and DE->EN: such a pair was
    averaged into one model without a word, and its outputs were noise."""
    import shutil

    reverse = tmp_path / "reverse"
    shutil.copytree(run, reverse)
    for record in (reverse / "checkpoints").glob("*.json"):  # the model's own hash covers no data setting
        meta = json.loads(record.read_text())
        meta["config"]["data"] |= {"src_lang": "de", "tgt_lang": "en"}
        record.write_text(json.dumps(meta))
    with pytest.raises(CheckpointError, match=rf"^--ensemble {re.escape(str(reverse))}: trained for de->en "
                                              rf"translation, {re.escape(str(run))} for en->de translation; "):
        Translator(run, log=lambda m: None, ensemble=[reverse])
    with pytest.raises(CheckpointError, match=r"^--ensemble .*nope: "):
        Translator(run, log=lambda m: None, ensemble=[tmp_path / "nope"])


def test_an_ensemble_bounds_the_output_length_by_its_fewest_positions(run, tmp_path, tiny_overrides):
    """--max-len-offset beyond a model's positions is refused; in an ensemble it was checked against the
    first run's alone, so the same two runs refused it in one order and capped it silently in the other."""
    learned = tmp_path / "learned"
    train(load_config("tiny", tiny_overrides + ["train.max_steps=2", "model.positional=learned",
                                                "model.max_positions=60", "data.max_len=60"]), learned, quiet=True)
    for first, other in ((learned, run), (run, learned)):
        ensemble = Translator(first, log=lambda m: None, ensemble=[other])
        with pytest.raises(ConfigError, match=r"^--max-len-offset 100: more than the model's 60 positions"):
            ensemble.check(DecodeRequest(max_len_offset=100), None, CLI)
        assert ensemble.check(DecodeRequest(max_len_offset=60), None, CLI).max_len_offset == 60


def test_a_parse_prefix_that_cannot_start_a_tree_is_refused_before_decoding(tiny_parse_run):
    """The tree constraint would leave such a prefix no token to continue with (an empty n-best list, an
    IndexError): it is refused up front, naming the line and the piece. Unconstrained, it is decoded."""
    from transformer.trees import delinearize

    parser = Translator(tiny_parse_run, log=lambda m: None)
    lines = ["The dog barked .", "Stocks fell ."]
    for prefix, piece in (["The dog", r"1, 'The'"], [")S", r"1, '\)S'"], ["(S Stocks )S", r"\d+, '\)S'"],
                          ["(S fell", r"2, '\w+'"],  # "fell" may be more than one piece
                          ["x", r"1, a word's start \('\u2581'\)"]):  # "x" as "\u2581", "x": the first was ''
            # (\u2581 is sentencepiece's word start; a prefix the vocabulary spells with it alone named nothing)
        with pytest.raises(ConfigError, match=f"^--prefix line 2 on a parsing run: its piece {piece}, cannot continue"):
            parser.decode(lines, DecodeRequest(prefixes=["", prefix]))
    outputs = parser.decode(lines, DecodeRequest(prefixes=["(S (NP The", ""], nbest=2))
    assert all(text.startswith("(S (NP The") and delinearize(text.split(), lines[0].split())[1]
               for text, _ in outputs[0])
    free = Translator(tiny_parse_run, log=lambda m: None, decode={"constrained": False})
    assert free.setup.parse is False
    assert free.translate(lines, DecodeRequest(prefixes=["The dog", ""]))[0].startswith("The dog")


def test_a_prefix_of_characters_without_a_piece_names_those_alone(tiny_parse_run):
    """A parsing run's vocabulary spells "(" only inside "(S", "(NP", ...: each character looked up alone,
    the refusal of "(S \u00e9" named "(" too, which the prefix "(S" alone shows is written fine."""
    parser = Translator(tiny_parse_run, log=lambda m: None)
    assert parser.tokenizer.unknown("(S (NP \u00e9t\u00e9 x") == ["\u00e9"]
    assert parser.tokenizer.unknown("(S \x85 x") == ["\x85"]  # a space to Python, no piece to sentencepiece: it was
    # left out, and the refusal named nothing ("has no piece for , so")
    with pytest.raises(ConfigError, match="^--prefix line 1: the model's vocabulary has no piece for '\u00e9', so no"):
        parser.decode(["The dog barked ."], DecodeRequest(prefixes=["(S \u00e9"]))
    free = Translator(tiny_parse_run, log=lambda m: None, decode={"constrained": False})  # constraints allowed
    with pytest.raises(ConfigError, match="^--constraints line 1: the model's vocabulary has no piece for "
                                          "'\u00e9', '\u00eb', so no"):
        free.decode(["The dog barked ."], DecodeRequest(constraints=[["(S \u00e9", "Zo\u00eb \u00e9"]]))


def test_the_translator_says_what_was_fixed_at_load(run):
    assert Translator(run, log=lambda m: None).setup.options() == set()
    assert Translator(run, log=lambda m: None, int8=True, ensemble=[run]).setup.options() == {"int8", "ensemble"}


def test_a_loaded_model_keeps_its_step_weights_and_a_model_in_training_does_not(run):
    """A Translator-loaded model gathers its decoder's step weights once (every batch's cache reuses
    them) and decodes as when each batch gathers its own; a model handed over in memory (training's
    dev BLEU) keeps none, so its updates reach every batch."""
    from transformer.tokenizer import Tokenizer

    loaded = Translator(run, log=lambda m: None)
    model = loaded.model
    with torch.inference_mode():
        memory, mask = model.encode(torch.tensor([[5, 6, 2]]))
        assert model.init_cache(memory, mask, 2).layers is model._step_weights is not None
    lines = ["A dog runs.", "Two men play football in the park."]
    kept = loaded.translate(lines, DecodeRequest(beam_size=3))
    model._step_weights = None
    assert loaded.translate(lines, DecodeRequest(beam_size=3)) == kept
    from transformer.model import Transformer

    tokenizer, cfg = Tokenizer(run / "spm.model"), load_config(str(run / "config.toml"))
    in_training = Transformer(cfg.model, len(tokenizer.vocabulary()))
    assert Translator.of_model(in_training, tokenizer, cfg).model._step_weights is None


def test_int8_steps_of_few_rows_multiply_by_the_kept_float_weights(run):
    """An int8 copy's decoder projections keep their float weights: a step of a few rows (batch 1)
    multiplies by them (Q/K/V as one product), a step of many rows by the int8 layers."""
    import torch.nn.functional as F

    from transformer.model import Int8Projection, ONEDNN_MIN_MACS, project

    model = Translator(run, log=lambda m: None, int8=True).model
    layer, weights = model.decoder[0], model._step_weights[0]
    assert type(weights.qkv) is Int8Projection and len(weights.qkv.layers) == 3
    attn = layer.self_attn
    w = torch.cat([m.float_weights.weight for m in (attn.q_proj, attn.k_proj, attn.v_proj)])
    b = torch.cat([m.float_weights.bias for m in (attn.q_proj, attn.k_proj, attn.v_proj)])
    few = torch.randn(4, w.size(1))
    many = torch.randn(ONEDNN_MIN_MACS // w.numel() + 1, w.size(1))
    with torch.inference_mode():
        assert torch.equal(project(weights.qkv, few), F.linear(few, w, b))
        int8 = torch.cat([m(many) for m in (attn.q_proj, attn.k_proj, attn.v_proj)], -1)
        assert torch.equal(project(weights.qkv, many), int8)
        assert not torch.allclose(int8, F.linear(many, w, b), atol=1e-6)  # quantized: not the float product


def test_pieces_after_counts_what_a_phrase_adds_to_a_prefix():
    from transformer.translator import pieces_after

    assert pieces_after([5, 6, 7], [6, 7]) == 0  # held by the prefix
    assert pieces_after([5, 6, 7], [7, 8, 9]) == 2  # starts on the prefix's last piece
    assert pieces_after([5, 6, 7], [6, 7, 8]) == 1
    assert pieces_after([5, 6, 7], [8, 5]) == 2  # the prefix comes first: a phrase cannot end on its start
    assert pieces_after([], [4, 4]) == 2 and pieces_after([4], [4, 4]) == 1


def test_a_prefix_and_constraints_that_fit_alone_but_not_together_are_refused(run):
    """Each fits the output's room alone; together they do not, and the constraint would be dropped for the
    prefix without a word. Refused as either alone is; one piece more room and both are in the output."""
    from transformer.translator import encode_for_decoding, pieces_after

    translator = Translator(run, log=lambda m: None)
    prefix, phrase = translator.tokenizer.encode("ein Hund"), translator.tokenizer.encode("Katze")
    assert pieces_after(prefix, phrase) == len(phrase)
    source, room = "A.", len(prefix) + len(phrase) - 1  # the output's pieces without EOS: input with EOS + offset - 1
    pieces = len(encode_for_decoding([source], translator.tokenizer)[0])
    offset = room + 1 - pieces
    assert offset >= 0 and len(prefix) <= room and len(phrase) <= room  # each alone fits

    def request(offset: int) -> DecodeRequest:
        return DecodeRequest(prefixes=["ein Hund"], constraints=[["Katze"]], max_len_offset=offset)
    with pytest.raises(ConfigError, match=rf"^--prefix line 1 and --constraints line 1: the prefix's {len(prefix)} "
                                          rf"pieces and the {len(phrase)} the constraints add after it need "
                                          rf"{room + 1}, but outputs of this input hold at most {room} \(input length"):
        translator.translate([source], request(offset))
    out = translator.decode([source], request(offset + 1))[0][0][0]
    assert out.startswith("ein Hund") and "Katze" in out, out
    held = DecodeRequest(prefixes=["ein Hund"], constraints=[["Hund"]], max_len_offset=len(prefix) + 1 - pieces)
    assert translator.translate([source], held)[0].startswith("ein Hund")  # the prefix holds the phrase


def test_a_prefix_past_a_learned_position_table_names_the_table_not_the_offset(run, monkeypatch):
    """Where a learned position table (Table 3 row E) is the tighter bound, the refusal said "(input length +
    max_len_offset)", a sum larger than the room it named."""
    translator = Translator(run, log=lambda m: None)
    monkeypatch.setattr(type(translator.model), "max_output_length", property(lambda model: 6))
    request = DecodeRequest(prefixes=["ein Hund läuft durch den tiefen Schnee"], max_len_offset=50)
    with pytest.raises(ConfigError, match=r"^--prefix line 1: \d+ pieces, but outputs of this input hold at most 5 "
                                          r"\(the model's learned positions, model.max_positions = 6\)$"):
        translator.check(request, lines=["A dog."])


def test_a_beam_no_wider_than_the_vocabulary_is_the_bound(run):
    """The first step offers the vocabulary's pieces and no more: a beam as wide is taken, one piece wider is
    refused before decoding (the bound itself, not only far beyond it)."""
    translator = Translator(run, log=lambda m: None)
    vocab = translator.tokenizer.vocab_size
    assert translator.check(DecodeRequest(beam_size=vocab)).beam_size == vocab
    with pytest.raises(ConfigError, match=rf"^--beam {vocab + 1}: wider than the vocabulary \({vocab} pieces\)"):
        translator.check(DecodeRequest(beam_size=vocab + 1))


def test_a_blank_source_with_a_target_is_scored_not_taken_as_certain(run):
    """Only an empty source *with an empty target* scores 0 (its EOS certain, as decode answers it); a blank
    source given a real target is scored by the model, whose log-probs of its pieces are below 0."""
    translator = Translator(run, log=lambda m: None)
    empty, given = translator.score(["", "  "], ["", "ein Hund"])
    assert empty.score == empty.log_prob == 0.0 and empty.token_log_probs == [0.0]
    pieces = len(translator.tokenizer.encode("ein Hund"))
    assert given.log_prob < 0 and len(given.token_log_probs) == pieces + 1  # its pieces and its EOS


def test_a_checkpoint_of_another_vocabulary_is_refused(run, tmp_path):
    """A weights file whose record names another spm.model than the run's: its ids would index other pieces."""
    ckpt = load_checkpoint(list_checkpoints(run)[-1], with_state=False)
    path = tmp_path / "other.safetensors"
    write_model(path, ckpt.weights, {"config": ckpt.meta["config"], "vocab_sha256": "0" * 64})
    with pytest.raises(CheckpointError, match="trained with another vocabulary"):
        Translator(run, path)


def test_a_constraint_the_vocabulary_normalises_to_nothing_is_refused(run):
    """A phrase of a zero-width space encodes to no piece: it was dropped, and the request answered as if it had
    none, though no output could show that it was met (serve answered 200)."""
    translator = Translator(run, log=lambda m: None)
    with pytest.raises(ConfigError, match=r"^--constraints line 2: '\\u200b' is nothing once the vocabulary "
                                          r"normalises it"):
        translator.translate(["A dog runs.", "A cat sits."], DecodeRequest(constraints=[["Hund"], ["Katze", "\u200b"]]))
    out = translator.translate(["A dog runs."], DecodeRequest(constraints=[["Hund"]]))[0]
    assert "Hund" in out


def test_a_model_whose_scores_are_not_numbers_is_said_to_be_so(run):
    """Weights that overflow the arithmetic (a run trained at train.lr_scale 1e30 finished with rc 0): the beam
    ranked nothing and translate ended in an IndexError; greedy search wrote an empty line and exited 0."""
    from transformer.model import Transformer

    loaded = Translator(run, log=lambda m: None)
    model = Transformer(loaded.cfg.model, loaded.tokenizer.vocab_size)
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(1e30)
    overflowing = Translator.of_model(model.eval(), loaded.tokenizer, loaded.cfg)
    for beam in (1, 4):
        with pytest.raises(CheckpointError, match=r"^line 1: the model's scores are not finite \(NaN or inf\)"):
            overflowing.translate(["A dog runs."], DecodeRequest(beam_size=beam))
    # a draw was torch.multinomial's RuntimeError on NaN probabilities (an internal error, a server's 500 "decoding
    # failed"); a forced score was NaN, printed as a score and written into JSON
    for sampled in (DecodeRequest(sample=True, seed=1), DecodeRequest(sample=True, seed=1, topk=5, nbest=2)):
        with pytest.raises(ModelOverflow, match=r"^line 2: the model's scores are not finite"):
            overflowing.decode(["", "A dog runs."], sampled)
    with pytest.raises(ModelOverflow, match=r"^pair 1: the model's scores are not finite"):
        overflowing.score(["A dog runs."], ["Ein Hund rennt."])
    # in int8, the quantization of values that are not finite failed first: torch's RuntimeError, an internal error
    from transformer.translator import quantize_int8

    int8 = Translator.of_model(quantize_int8(model), loaded.tokenizer, loaded.cfg)
    with pytest.raises(ModelOverflow, match=r"^lines 1 to 2: the model's scores are not finite"):
        int8.translate(["A dog runs.", "A cat."])
    with pytest.raises(ModelOverflow, match=r"^pairs 1 to 1: the model's scores are not finite"):
        int8.score(["A dog runs."], ["Ein Hund rennt."])


def test_numpy_values_are_taken_alike_by_every_option(run):
    """NumPy arrays were lines and prefixes but not constraints ("a list of phrases a line, not array(...)"), and
    numpy's whole numbers were a beam size but not score's max_tokens."""
    np = pytest.importorskip("numpy")
    translator = Translator(run, log=lambda m: None)
    lines = np.array(["A dog runs.", "A cat."])
    as_lists = translator.decode(list(lines), DecodeRequest(beam_size=2, prefixes=["Ein", ""],
                                                           constraints=[["Hund"], []]))
    as_arrays = translator.decode(lines, DecodeRequest(beam_size=np.int64(2), prefixes=np.array(["Ein", ""]),
                                                      constraints=np.array([["Hund"], []], dtype=object)))
    assert as_arrays == as_lists
    assert translator.score(["A dog."], ["Ein Hund."], max_tokens=np.int64(64)) == \
        translator.score(["A dog."], ["Ein Hund."], max_tokens=64)
    with pytest.raises(ConfigError, match=r"^--constraints: a list of phrases a line, not set$"):
        translator.decode(["A dog."], DecodeRequest(constraints={"Hund"}))


def test_what_the_api_is_given_wrong_is_one_line_of_the_packages_own(run, tmp_path):
    """Raw TypeErrors, AttributeErrors, IndexErrors and ValueErrors from deep inside, or a wrong answer without a
    word (blank("abc") one line a character, average_last(run, 0) every checkpoint, resume="no" resumed)."""
    from transformer import checkpoint, figures
    from transformer.errors import UserError

    translator = Translator(run, log=lambda m: None)
    refused = [
        (lambda: Translator(run, ensemble=5), r"^ensemble: a list of run folders, not int"),
        (lambda: translator.blank(None), r"^lines: a list of strings, not NoneType"),
        (lambda: translator.blank("abc"), r"^lines: a list of strings, not one string"),
        (lambda: translator.blank([1]), r"^lines: a list of strings, holding int 1"),
        (lambda: translator.decode(["A dog."], stop=True), r"^stop: a function of no argument"),
        (lambda: translator.check(DecodeRequest(prefixes=["a", "b", "c"]), lines="abc"),
         r"^lines: a list of strings, not one string"),
        (lambda: translator.stream([["A dog."]], total=-1), r"^total: the number of input lines"),
        (lambda: Translator.of_model(None, translator.tokenizer, translator.cfg), r"^of_model: model a Module"),
        (lambda: figures.attention_maps(translator, "A dog.", None), r"^tgt: one sentence \(str\), not NoneType"),
        (lambda: figures.align(translator, None, "x"), r"^src: one sentence"),
        (lambda: checkpoint.load_checkpoint(None), r"^checkpoint: a path"),
        (lambda: checkpoint.list_checkpoints(None), r"^run_dir: a path"),
        (lambda: checkpoint.average_checkpoints([]), r"^paths: no checkpoint to average"),
        (lambda: checkpoint.average_checkpoints(str(list_checkpoints(run)[-1])), r"^paths: a list of checkpoint"),
        (lambda: checkpoint.average_last(run, 0), r"^how many checkpoints to average: a whole number >= 1, not 0"),
        (lambda: checkpoint.average_last(run, "2"), r"not '2'"),
        (lambda: train(load_config("tiny"), tmp_path / "r", resume="no"), r"^resume: True or False, not str 'no'"),
    ]
    for call, message in refused:
        with pytest.raises(UserError, match=message):
            call()
    assert not (tmp_path / "r").exists()


@pytest.mark.parametrize("translators", [1, 2])
def test_a_model_under_training_decoded_from_several_threads_is_left_training(run, monkeypatch, translators):
    """Each call set the model to evaluation mode and back as it found it: a second thread found it in evaluation
    mode, the first gave it back to training while the second still decoded (dropout on), and the last left it in
    evaluation mode (a notebook training on trained without dropout). Two translators over one model (``of_model``
    twice) counted their calls each on their own, and raced so still."""
    import threading

    import transformer.translator as T

    loaded = Translator(run, log=lambda m: None)
    model = T._load_model(run, None, loaded.tokenizer, None, lambda m: None)[1].train()
    of_model = [Translator.of_model(model, loaded.tokenizer, loaded.cfg) for _ in range(translators)]
    translator = dict(zip(("first", "second"), of_model * (3 - translators)))
    inside, first_out, seen = threading.Barrier(2), threading.Event(), {}
    real = T.decode_ids

    def decode(*args, **kwargs):
        inside.wait(30)  # both calls in their evaluation mode
        name = threading.current_thread().name
        if name == "second":
            first_out.wait(30)  # the first call has given the model back
            seen["second"] = model.training
        return real(*args, **kwargs)

    monkeypatch.setattr(T, "decode_ids", decode)

    def call(name: str) -> None:
        translator[name].translate(["A dog runs."], DecodeRequest(beam_size=1))
        if name == "first":
            first_out.set()

    threads = [threading.Thread(target=call, args=(name,), name=name) for name in ("first", "second")]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert seen == {"second": False} and model.training  # evaluated throughout; given back as it was


def test_one_string_where_a_list_is_meant_is_refused_not_read_a_character_a_line(run):
    """A str is a sequence: translate("A dog runs.") answered 11 lines, a prefix "Ei" forced "E" on line 1 and
    "i" on line 2, constraints ["Hund"] became the phrases H, u, n, d; wrong types failed deep in torch."""
    translator = Translator(run, log=lambda m: None)
    refused = [
        (lambda: translator.translate("A dog runs."), r"^lines: a list of strings, not one string \('A dog runs.'\)"),
        (lambda: translator.decode(["A dog.", "A cat."], DecodeRequest(prefixes="Ei")),
         r"^--prefix \(one string a line\): a list of strings, not one string"),
        (lambda: translator.decode(["A dog."], DecodeRequest(constraints=["Hund"])),
         r"^--constraints line 1 \(a list of phrases\): a list of strings, not one string \('Hund'\)"),
        (lambda: translator.translate(["A dog.", 3]), r"^lines: a list of strings, holding int 3"),
        # os.fsdecode's and errors="surrogateescape"'s lone surrogates: sentencepiece's TypeError, pybind's RuntimeError
        (lambda: translator.translate(["A dog.", "A \udcff cat."]),
         r"^lines: item 2 is not Unicode text: a lone surrogate \(U\+DCFF\) at character 3"),
        (lambda: translator.decode(["A dog."], DecodeRequest(prefixes=["Ein \udcff"])),
         r"^--prefix .*item 1 is not Unicode"),
        (lambda: translator.decode(["A dog."], DecodeRequest(constraints=[["\ud800"]])),
         r"^--constraints .* not Unicode"),
        (lambda: translator.score(["A dog."], ["\udcff"]), r"^targets: item 1 is not Unicode text"),
        (lambda: translator.translate(["A dog."], DecodeRequest(beam_size=2.5)), r"^--beam 2.5: must be a whole number"),
        (lambda: translator.translate(["A dog."], DecodeRequest(alpha="0.6")), r"^--alpha '0.6': must be a number"),
        (lambda: translator.score("A dog", "Ein Hund"), r"^sources: a list of strings, not one string"),
        (lambda: translator.score(["A dog."], ["Ein Hund.", "x"]), r"^1 sources but 2 targets"),
        (lambda: translator.score(["A dog."], ["Ein Hund."], length_norm="foo"), r"^length_norm foo: must be one of"),
        (lambda: translator.score(["A dog."], ["Ein Hund."], alpha=1e6), r"^alpha 1000000.0: must be a finite"),
        (lambda: Translator(run, ensemble=str(run)), r"^ensemble: a list of run folders, not one"),
        (lambda: translator.score(["A dog."], ["Ein Hund."], max_tokens="8"), r"^max_tokens: a whole number >= 1"),
        (lambda: translator.score(["A dog."], ["Ein Hund."], max_tokens=0), r"^max_tokens: a whole number >= 1"),
        (lambda: Translator(run, int8="yes"), r"^int8: True or False, not str 'yes'"),
        (lambda: translator.translate(["A dog."], progress="no"), r"^progress: True or False, not str 'no'"),  # a bar
        # the decode overrides are typed as a config file's values are, not set as given; named as the command
        # line spells them where it has them (a type's error said decode.beam_size, a value's --beam)
        (lambda: Translator(run, decode={"beam": 2}), r"^decode: unknown key decode.beam; did you mean "
                                                      r"decode.beam_size\?"),
        # the hint stays the field's with the field given too ("did you mean --beam?" named no key to write)
        (lambda: Translator(run, decode={"beam": 2, "beam_size": 3}), r"^decode: unknown key decode.beam; did you "
                                                                      r"mean decode.beam_size\?"),
        # a mapping of another type named as a dict's errors are
        (lambda: Translator(run, decode=MappingProxyType({"beam_size": 0})), r"^--beam must be positive, got 0"),
        (lambda: Translator(run, decode={"beam_size": "4"}), r"^decode: --beam must be int, got str"),
        (lambda: Translator(run, decode={"length_norm": "foo"}), r"^decode: --length-norm must be one of"),
        # a value holding the words of an unknown key's error: its field was left unrenamed
        (lambda: Translator(run, decode={"length_norm": "unknown key"}), r"^decode: --length-norm must be one of"),
        (lambda: Translator(run, decode={"average_last": 2.5}), r"^decode: decode.average_last must be int"),
        (lambda: Translator(run, decode=[1]), r"^decode: a dict of decode.\* fields, not list"),
        (lambda: load_config("tiny", "train.max_steps=5"), r"^overrides: a list of strings, not one string"),
    ]
    for call, said in refused:
        with pytest.raises(ConfigError, match=said):
            call()
    assert translator.translate(["A dog runs."], DecodeRequest(beam_size=torch.tensor(2).item(), alpha=1))
    # a NumPy array (a table's column) is a list of lines too, as it was; an iterator has no count to check
    import numpy as np

    both = ["A dog runs.", "Two men."]
    assert translator.translate(np.array(both)) == translator.translate(both)
    with pytest.raises(ConfigError, match=r"^lines: a list of strings, not generator"):
        translator.translate(line for line in ["A dog runs."])


def test_loading_leaves_the_hosts_random_generator_be(run):
    """The model's initial draws, which its weights overwrite, moved torch's global generator: a host that seeded
    torch drew other numbers after loading a Translator than without."""
    torch.manual_seed(0)
    expected = torch.rand(3)
    for options in ({}, {"int8": True}):  # int8's copy of the tied projection drew its initial weights too
        torch.manual_seed(0)
        Translator(run, log=lambda m: None, **options)
        assert torch.equal(torch.rand(3), expected), options


def test_a_model_in_training_mode_decodes_as_the_loaded_run_does(run):
    """Translator.of_model of a model in training mode decoded with dropout: two calls answered differently, and
    neither as the run's folder, loaded, would. Decoding and scoring are in eval mode, and the mode comes back."""
    loaded = Translator(run, log=lambda m: None)
    lines = ["A dog runs through the snow.", "Two men are talking."]
    expected, scored = loaded.decode(lines), loaded.score(lines, loaded.translate(lines))
    model = loaded.model.train()
    training = Translator.of_model(model, loaded.tokenizer, loaded.cfg)
    for _ in range(2):
        assert training.decode(lines) == expected and model.training
        assert training.score(lines, loaded.translate(lines)) == scored and model.training


def test_the_weights_read_are_named_and_a_checkpoint_pruned_while_read_is_read_again(run, monkeypatch):
    """A run still training prunes its checkpoints: one removed between listing and reading failed the load (a
    plain retry would have worked), and evaluate --json listed the checkpoints again after decoding, naming newer
    ones than it had decoded with."""
    import transformer.checkpoint as C

    real, calls = C.average_checkpoints, []

    def pruned_once(paths):
        calls.append(list(paths))
        if len(calls) == 1:  # the trainer's prune, between the listing and the read
            paths[0].with_suffix(".safetensors").unlink()
            paths[0].unlink()
            raise CheckpointError(f"{paths[0].with_suffix('.safetensors').name}: cannot read weights file")
        return real(paths)
    monkeypatch.setattr(C, "average_checkpoints", pruned_once)
    translator = Translator(run, log=lambda m: None)
    assert len(calls) == 2 and calls[0][0] not in calls[1]
    assert translator.weights_from == [p.with_suffix(".safetensors").resolve() for p in calls[1]]
    assert Translator(run, checkpoint=calls[1][-1], log=lambda m: None).weights_from == [
        calls[1][-1].with_suffix(".safetensors").resolve()]


def test_a_checkpoint_rewritten_while_read_is_read_again_and_real_damage_still_refused(run, monkeypatch):
    """best.safetensors rewritten by a run still training (its tensors replaced a moment before its record) was
    refused as "sha256 mismatch (file corrupt or modified)", though a plain retry read it."""
    import transformer.translator as T

    real, calls = T.load_checkpoint, []

    def rewritten_once(path, with_state=True):
        calls.append(path)
        if len(calls) == 1:
            raise CheckpointError(f"{Path(path).name}: sha256 mismatch (file corrupt or modified)")
        return real(path, with_state=with_state)
    monkeypatch.setattr(T, "load_checkpoint", rewritten_once)
    monkeypatch.setattr(T.time, "sleep", lambda s: None)
    newest = list_checkpoints(run)[-1]
    assert Translator(run, checkpoint=newest, log=lambda m: None).weights_from and len(calls) == 2
    def damaged(path, with_state=True):
        raise CheckpointError(f"{Path(path).name}: sha256 mismatch (file corrupt or modified)")
    monkeypatch.setattr(T, "load_checkpoint", damaged)  # every read: damage, which retrying does not mend
    with pytest.raises(CheckpointError, match=r"^--checkpoint .*: sha256 mismatch"):
        Translator(run, checkpoint=newest, log=lambda m: None)


def test_a_damaged_checkpoint_is_named_by_its_path_with_the_way_out(tiny_run, tmp_path):
    """Both `translate RUN --ensemble DAMAGED` and `translate DAMAGED --ensemble RUN` said
    "step_00000030.safetensors: sha256 mismatch": which run was damaged, and what to do, went unsaid."""
    import re
    import shutil

    from transformer.checkpoint import list_checkpoints

    damaged = tmp_path / "damaged"
    shutil.copytree(tiny_run, damaged)
    newest = list_checkpoints(damaged)[-1].with_suffix(".safetensors")
    data = bytearray(newest.read_bytes())
    data[-1] ^= 1
    newest.write_bytes(bytes(data))
    said = (rf"^{re.escape(str(newest))}: sha256 mismatch \(file corrupt or modified, or a write stopped between it "
            r"and its record\); to decode with the others, "
            rf"give --checkpoint one that is intact, or move the damaged one out of {re.escape(str(damaged))}/checkpoints$")
    for run, ensemble in ((tiny_run, [damaged]), (damaged, [tiny_run])):
        with pytest.raises(CheckpointError, match=said):
            Translator(run, log=lambda m: None, ensemble=ensemble)
    for older in list_checkpoints(damaged)[:-1]:  # the only checkpoint: "decode with the others" said of none
        for path in older.parent.glob(older.stem + ".*"):
            path.unlink()
    with pytest.raises(CheckpointError, match=rf"^{re.escape(str(newest))}: sha256 mismatch .* and its record\) "
                                              r"\(the run's only checkpoint\)$"):
        Translator(damaged, log=lambda m: None)


def test_api_misuse_is_a_config_error(tiny_parse_run, run):
    """`decode(lines, None)` (docs/python.md: a field left None takes the run's value) and a dict for the
    request were an AttributeError; `trees` cut the longer of its lists, read one string a character a line and
    made trees of a translation run's sentences."""
    parser = Translator(tiny_parse_run, log=lambda m: None)
    for request in (None, {"beam_size": 2}):
        with pytest.raises(ConfigError, match=f"^request: a DecodeRequest, not {type(request).__name__}"):
            parser.decode(["The dog barked ."], request)  # type: ignore[arg-type]
        with pytest.raises(ConfigError, match="^request: a DecodeRequest"):
            parser.check(request)  # type: ignore[arg-type]
    lines = ["The dog barked ."]
    outputs = parser.translate(lines)
    assert parser.trees(lines, outputs)[0][0] is not None
    for args, message in (((lines, outputs + ["x"]), "^trees: 1 lines but 2 outputs"),
                          (("The dog", "x"), "^lines: a list of strings, not one string"),
                          (([None], [None]), "^lines: a list of strings, holding NoneType")):
        with pytest.raises(ConfigError, match=message):
            parser.trees(*args)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match=r"^trees: a translation run \(data.task = 'translate'\)"):
        Translator(run, log=lambda m: None).trees(lines, ["Ein Hund."])
    for kwargs, message in (({"run_dir": 123}, "^run_dir: a path .*, not int 123"),
                            ({"run_dir": None}, "^run_dir: a path .*, not NoneType"),
                            ({"run_dir": run, "checkpoint": 5}, "^checkpoint: a path .*, not int 5"),
                            ({"run_dir": run, "ensemble": [None]}, "^ensemble: a run folder: a path"),
                            ({"run_dir": run, "log": 5}, r"^log: a function of one message \(str\), not int 5")):
        with pytest.raises(ConfigError, match=message):
            Translator(**kwargs)  # type: ignore[arg-type]


def test_a_phrase_given_twice_is_met_once_and_counted_once(run):
    """One "Hund" meets "Hund" given sixty times (the search's phrases are met where the output ends with them),
    but the room check counted every copy: the line was refused as needing 60 pieces of a 55-piece output."""
    translator = Translator(run, log=lambda m: None)
    once = translator.decode(["A dog runs."], DecodeRequest(constraints=[["Hund"]]))
    assert "Hund" in once[0][0][0]
    assert translator.decode(["A dog runs."], DecodeRequest(constraints=[["Hund"] * 60])) == once


@pytest.mark.parametrize("chunks", [None, "A dog.", 3])
def test_stream_refuses_what_is_no_iterable_of_chunks_at_once(run, chunks):
    """stream(None) returned a generator that failed with a TypeError when first read, not a ConfigError."""
    with pytest.raises(ConfigError, match=r"^chunks: an iterable of lists of lines, not "):
        Translator(run, log=lambda m: None).stream(chunks)


def test_another_runs_weights_are_decoded_with_a_note(tiny_run, tmp_path):
    """--checkpoint of another run of the same vocabulary is decoded, as asked, with its own record's model: it was
    decoded without a word, the run folder named being another model's."""
    ckpt = load_checkpoint(list_checkpoints(tiny_run)[-1], with_state=False)
    record = {k: ckpt.meta[k] for k in ("config", "vocab_sha256")}
    for name, run_id, noted in (("theirs", "another", True), ("ours", ckpt.meta["run_id"], False)):
        write_model(tmp_path / f"{name}.safetensors", ckpt.weights, record | {"run_id": run_id})
        said: list[str] = []
        translator = Translator(tiny_run, checkpoint=tmp_path / f"{name}.safetensors", log=said.append)
        assert any(f"{name}.safetensors is of another run than {tiny_run}" in m for m in said) == noted, said
        assert translator.weights_of_another_run == noted  # what the export's card reads


def test_a_newer_weights_file_without_its_record_is_named(tiny_run, tmp_path, capsys):
    """A record deleted by hand: its weights were left out of the average without a word (as an unfinished write
    must be), the user thinking the newest checkpoint decoded."""
    import shutil

    from transformer.cli import main

    run = tmp_path / "run"
    shutil.copytree(tiny_run, run)
    newest = list_checkpoints(run)[-1]
    newest.unlink()
    said: list[str] = []
    Translator(run, log=said.append)
    note = (f"note: {newest.with_suffix('.safetensors').name} in {run / 'checkpoints'} has no JSON record (a write "
            "under way, or the record lost): left out")
    assert any(m.startswith(note) for m in said), said
    assert main(["average", str(run), "--last", "2", "--out", str(tmp_path / "avg.safetensors")]) == 0
    assert note in capsys.readouterr().err


def test_translate_refuses_an_nbest_request(tiny_run):
    """translate gives one output a line: an n-best request was searched and its lists dropped without a word
    (decode gives them)."""
    translator = Translator(tiny_run, log=lambda m: None)
    with pytest.raises(ConfigError, match=r"^translate: nbest 2: one output a line; decode gives each line's n-best"):
        translator.translate(["a dog"], DecodeRequest(beam_size=2, nbest=2))
    with pytest.raises(ConfigError, match="must be a whole number"):  # the request's own checks come first
        translator.translate(["a dog"], DecodeRequest(nbest="2"))
    assert translator.translate(["a dog"], DecodeRequest(nbest=1)) == translator.translate(["a dog"])
