"""cost: Table 2's training cost recomputed, and a run's time and memory on given hardware."""

import pytest

from transformer.config import load_config
from transformer.cost import cost_report, training_cost

VOCAB = 37_000  # WMT14 EN-DE's shared BPE vocabulary (§5.1)


def test_weights_take_16_bytes_a_parameter_on_every_device():
    """fp32 weights, their gradients and Adam's two moments: four 4-byte copies of every parameter, whatever the
    device count (data parallelism replicates them). An estimate short of it lets a run that cannot fit look as
    if it would."""
    for devices in (1, 8):
        c = training_cost(load_config("base"), VOCAB, devices)
        assert c.weights_bytes_per_device == 16 * c.parameters


def test_activations_are_korthikantis_count_split_over_the_devices():
    """Per target token: (34·d_model + 5·h·length) bytes a layer over N encoder layers and 1.5·N decoder layers (a
    second attention), plus 6·V bytes of logits; the global batch is split over the devices, so each holds its
    share. Base (d 512, h 8, 6 + 6 layers) at 27-token sentences, by hand: (17408 + 1080) × 15 + 222000."""
    cfg = load_config("base")
    per_token = (34 * 512 + 5 * 8 * 27) * (6 + 1.5 * 6) + 6 * VOCAB
    assert per_token == 499_320
    for devices in (1, 8):
        c = training_cost(cfg, VOCAB, devices)
        assert c.activation_bytes_per_device == pytest.approx(cfg.train.max_tokens / devices * per_token)


def test_a_runs_hours_are_its_step_time_times_its_steps():
    """The report's hours per device count are the time of one step times the steps (at the same MFU), and its
    memory is weights and activations in GiB (2**30 bytes): the table's columns agree with one another."""
    cfg = load_config("base")
    report = cost_report(cfg, "base", VOCAB, [1, 8], mfu=0.4)
    for row in report["per_devices"]:
        c = training_cost(cfg, VOCAB, row["devices"])
        assert row["hours"] == pytest.approx(row["step_seconds"] * report["steps"] / 3600)
        memory = (c.weights_bytes_per_device + c.activation_bytes_per_device) / 2**30
        assert row["memory_gib_per_device"] == pytest.approx(memory)


def test_table_2s_big_model_is_3_5_days_on_8_p100s():
    """Table 2: the big model's 2.3e19 FLOPs are 8 P100 × 3.5 days (§5.2) × 9.5 TFLOPS."""
    report = cost_report(load_config("wmt14_en_de_big"), "wmt14_en_de_big", VOCAB, [8], mfu=0.4)
    assert report["table2"]["model"] == "big"
    assert report["table2"]["paper_flops"] == pytest.approx(2.3e19, rel=0.01)


def test_a_table_3_row_of_other_head_sizes_is_not_compared_with_table_2():
    """Table 3 row B changes d_k alone: base's layers, widths and heads, but another model, which Table 2 did not
    train; comparing it with the base model's cost would quote the paper for a run it never made."""
    report = cost_report(load_config("base", ["model.d_k=16"]), "B", VOCAB, [8], mfu=0.4)
    assert "table2" not in report


def test_the_table_splits_the_global_batch_over_the_devices():
    """The recipes keep the global batch whatever the device count, so each device takes its share: §5.1's
    25,000 tokens are 3,125 on each of 8 devices."""
    from transformer.cost import format_cost_report

    report = cost_report(load_config("wmt14_en_de_base"), "wmt14_en_de_base", VOCAB, [1, 8], mfu=0.4)
    rows = [line.split("|") for line in format_cost_report(report).splitlines()[-2:]]
    assert [(int(r[0]), int(r[1].replace(",", ""))) for r in rows] == [(1, 25_000), (8, 3_125)]
