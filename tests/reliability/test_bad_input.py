"""Bad data and arbitrary text, end to end: a clear error or a counted skip, never a lost or shifted line."""

import gzip
import os
import subprocess
import sys
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from transformer.data import read_parallel
from transformer.request import DecodeRequest

ENV = os.environ | {"OMP_NUM_THREADS": "1"}
GOOD = ["a dog runs .", "two men sit on a bench .", "a girl in red plays .", "people walk in a park ."] * 30
GUT = ["ein hund rennt .", "zwei männer sitzen auf einer bank .", "ein mädchen in rot spielt .",
       "leute gehen in einem park ."] * 30


def write(path: Path, data: bytes) -> Path:
    path.write_bytes(data)
    return path


def lines(text: list[str]) -> bytes:
    return "".join(t + "\n" for t in text).encode()


def train_cli(tmp_path: Path, src: Path, tgt: Path, extra: list[str] = ()) -> subprocess.CompletedProcess:
    valid_src, valid_tgt = write(tmp_path / "v.en", lines(GOOD[:8])), write(tmp_path / "v.de", lines(GUT[:8]))
    sets = [f'data.train_src="{src}"', f'data.train_tgt="{tgt}"', f'data.valid_src="{valid_src}"',
            f'data.valid_tgt="{valid_tgt}"', "data.vocab_size=60", "train.max_steps=2", "train.threads=1",
            "data.max_len=40", *extra]
    return subprocess.run([sys.executable, "-m", "transformer", "train", "tiny", "--out", str(tmp_path / "run"),
                           "--quiet", *[x for s in sets for x in ("--set", s)]], env=ENV, capture_output=True,
                          text=True, timeout=300)


def assert_clear_error(proc: subprocess.CompletedProcess, *needles: str) -> None:
    assert proc.returncode == 1, proc.stderr[-1500:]
    assert "Traceback" not in proc.stderr
    last = proc.stderr.strip().splitlines()[-1]
    for needle in needles:
        assert needle in last, last


def test_mismatched_line_counts(tmp_path, ledger):
    src, tgt = write(tmp_path / "t.en", lines(GOOD)), write(tmp_path / "t.de", lines(GUT[:-1]))
    with ledger.damage("training files of different lengths"):
        assert_clear_error(train_cli(tmp_path, src, tgt), "t.en has 120 lines", "t.de has 119")


def test_invalid_utf8_names_file_and_line(tmp_path, ledger):
    src = write(tmp_path / "t.en", lines(GOOD[:5]) + b"caf\xe9\n" + lines(GOOD[6:]))
    tgt = write(tmp_path / "t.de", lines(GUT))
    with ledger.damage("invalid UTF-8 in a training file"):
        assert_clear_error(train_cli(tmp_path, src, tgt), "t.en:6", "invalid UTF-8")


def test_a_gzip_file_cut_short(tmp_path, ledger):
    data = gzip.compress(lines(GOOD))
    src = write(tmp_path / "t.en.gz", data[: len(data) // 2])
    with ledger.damage("gzip training file cut short"):
        assert_clear_error(train_cli(tmp_path, src, write(tmp_path / "t.de", lines(GUT))), "t.en.gz",
                           "corrupt or truncated gzip")


def test_empty_sides_and_overlong_lines_are_skipped_whole_and_counted(tmp_path, ledger):
    src_lines, tgt_lines = list(GOOD), list(GUT)
    src_lines[3], tgt_lines[7] = "", "   "  # one side empty
    src_lines[10] = " ".join(["word"] * 200)  # longer than data.max_len pieces
    src, tgt = write(tmp_path / "t.en", lines(src_lines)), write(tmp_path / "t.de", lines(tgt_lines))
    with ledger.damage("empty sides and over-long lines in training data"):
        proc = train_cli(tmp_path, src, tgt)
        assert proc.returncode == 0, proc.stderr[-1500:]
        log = (tmp_path / "run" / "train.log").read_text()
        assert "117 pairs used of 120; skipped 2 with an empty side, 1 longer than 40 pieces" in log


def test_nul_crlf_and_unicode_separators_keep_pairs_aligned(tmp_path, ledger):
    src_lines = list(GOOD)
    src_lines[1] = "a dog\u2028runs\x85fast\x0cnow\x00 ."  # separators and NUL inside one line
    src = write(tmp_path / "t.en", "".join(s + "\r\n" for s in src_lines).encode())  # CRLF
    tgt = write(tmp_path / "t.de", lines(GUT))
    with ledger.damage("NUL, CRLF, U+2028, U+0085 and form feed in training lines"):
        pairs = read_parallel(src, tgt)
        assert len(pairs) == 120 and pairs[1][1] == GUT[1] and pairs[2] == (GOOD[2], GUT[2])
        assert pairs[1][0] == src_lines[1]  # nothing split off, nothing lost, no "\r"
        proc = train_cli(tmp_path, src, tgt)
        assert proc.returncode == 0, proc.stderr[-1500:]


def nasty_lines() -> list[str]:
    """A fixed corpus of hostile lines, ~1,000: every control character, Unicode's separators, invisibles
    and bidirectional controls, combining-mark floods, emoji sequences, astral and private-use code
    points, a sample of every block of the Basic Multilingual Plane, long words and lines, and text
    that means something to shells, SQL, HTML and format strings."""
    lines = [f"a{chr(c)}b" for c in range(0x20) if c != 0x0A] + [f"a{chr(c)}b" for c in range(0x7F, 0xA0)]
    lines += [f"x{ch}y z" for ch in "\u2028\u2029\u200b\u200c\u200d\u2060\ufeff\u00ad\u180e\u3000\u00a0\u202f\u205f\u3164"]
    lines += [f"{ch}abc def" for ch in "\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069\u200e\u200f\u061c"]
    lines += ["e" + "\u0301" * n for n in (1, 10, 100, 500)] + ["\u0301 start", "\ufeff", "\ufeff\ufeff a"]
    lines += ["\U0001F469\u200d\U0001F469\u200d\U0001F467", "\U0001F44D\U0001F3FD", "\U0001F3F3\ufe0f\u200d\U0001F308",
              "\U0001F600" * 200, "\U0001F1E9\U0001F1EA flags \U0001F1FA\U0001F1F8"]
    lines += [chr(cp) * 3 for cp in (0x10000, 0x1D11E, 0x20000, 0x2A6D6, 0xE0001, 0xE0041, 0xF0000, 0x10FFFD, 0xFFFD)]
    lines += [chr(block) * 2 + " " + "".join(chr(block + j) for j in range(half, half + 8))
              for block in range(0x100, 0xD800, 0x80) for half in (0, 0x40)]  # two samples of every block
    lines += ["x" * n for n in (1, 255, 256, 257, 999)] + [" ".join(["word"] * n) for n in (100, 300)]
    lines += ["a" * 200 + " " + "b" * 200, "0" * 500, "1e309 -1e309 NaN Infinity", "3.14159" * 50]
    lines += ["$(rm -rf /)", "`reboot`", "; DROP TABLE t; --", "' OR '1'='1", "../../../etc/passwd", "%s %d %n {0} {{x}}",
              "<script>alert(1)</script>", "</script><!--", "&amp;&lt;&#0;", "]]><![CDATA[", "{{DATA}} /*{{SCRIPT}}*/",
              "null", "None", "[]", "{}", '"', "'", "\\", "\\n", "\t\t\t", " leading", "trailing ", "  inner   spaces  "]
    return list(dict.fromkeys(lines))


NASTY = nasty_lines()


def test_a_fixed_corpus_of_nasty_lines_translates_line_for_line(fuzz_translator, ledger):
    for start in range(0, len(NASTY), 64):
        inputs = NASTY[start: start + 64]
        with ledger.translation(inputs) as outputs:
            outputs.extend(fuzz_translator.translate(inputs, DecodeRequest(beam_size=2)))
        assert len(outputs) == len(inputs)
        assert all("\n" not in o for o in outputs)
        assert all(o == "" for t, o in zip(inputs, outputs) if not t.strip())


TEXT = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\n"), max_size=60)
# arbitrary lines (no newline inside: a line is what the input file's reader gives), with emoji, RTL,
# control characters, blank and very long lines drawn often; the server test draws from it too
LINES = st.lists(st.one_of(TEXT, st.sampled_from(["", "   ", "🙂🙂 👍", "مرحبا بالعالم", "x" * 300, "\t\x00\x1b"])),
                 min_size=1, max_size=6)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(LINES)
def test_translation_never_loses_or_reorders_a_line(fuzz_translator, ledger, inputs):
    with ledger.translation(inputs) as outputs:
        outputs.extend(fuzz_translator.translate(inputs, DecodeRequest(beam_size=2)))
    assert len(outputs) == len(inputs)
    assert all("\n" not in o for o in outputs)  # one output line per input line
    for text, out in zip(inputs, outputs):
        if not text.strip():
            assert out == ""
    # in order: each sentence alone gives what it gave in the batch
    assert [fuzz_translator.translate([t], DecodeRequest(beam_size=2))[0] for t in inputs] == outputs


def test_a_sentence_longer_than_any_seen_in_training_still_decodes(fuzz_translator):
    very_long = " ".join(["a dog runs in the park"] * 80)  # ~480 words, positions far past training
    (out,) = fuzz_translator.translate([very_long], DecodeRequest(beam_size=1))
    # decoded as a sentence of its own: the same beside a short one that pads to it (positions, masks, limits)
    assert isinstance(out, str) and fuzz_translator.translate([very_long, "a dog ."], DecodeRequest(beam_size=1))[0] == out


def test_translate_command_keeps_every_line(tmp_path, fuzz_run, ledger):
    inputs = ["a dog .", "", "\u2028 odd \x85 separators", "🙂", "x" * 300, "last line"]
    path = write(tmp_path / "in.txt", lines(inputs))
    with ledger.translation(inputs, hostile=False) as out:  # a failed run, or output cut mid-line: all lost
        proc = subprocess.run([sys.executable, "-m", "transformer", "translate", str(fuzz_run),
                               "--input", str(path), "--beam", "2"], env=ENV, capture_output=True, text=True,
                              timeout=300)
        assert proc.returncode == 0 and proc.stdout.endswith("\n"), proc.stderr[-1500:]
        out.extend(proc.stdout.split("\n")[:-1])
    assert len(out) == len(inputs)
    assert out[1] == ""
