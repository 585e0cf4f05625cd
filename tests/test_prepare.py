"""`transformer prepare` (prepare.py) against fake WMT archives served on 127.0.0.1; never the internet."""

from __future__ import annotations

import functools
import gzip
import hashlib
import http.server
import io
import json
import re
import socket
import tarfile
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from transformer.data import DataError, read_lines
from transformer.files import DownloadError, download
from transformer import prepare as prepare_module
from transformer.prepare import (ARCHIVES, DATASETS, Pinned, find_data_root, prepare, read_sgm,
                                 resolve_data_path)

EUROPARL_EN = ["Resumption of the session", "I declare resumed the session.", ""]
EUROPARL_DE = ["Wiederaufnahme der Sitzungsperiode", "Ich erkläre die Sitzung für wiederaufgenommen.", ""]
CRAWL_EN, CRAWL_DE = ["Click here.", "a\u2028b"], ["Hier klicken.", "c\u0085d"]
NC_EN, NC_DE = ["Gold at $10,000?"], ["Gold für 10.000 Dollar?"]


def text(lines: list[str], newline: str = "\n") -> bytes:
    return "".join(line + newline for line in lines).encode()


def sgm(kind: str, lang: str, segs: list[str]) -> bytes:
    body = "".join(f'<seg id="{i}">{s}</seg>\n' for i, s in enumerate(segs, 1))
    return (f'<{kind} setid="newstest2014" srclang="any" trglang="{lang}">\n<doc sysid="ref" docid="1" '
            f'genre="news" origlang="en">\n<p>\n{body}</p>\n</doc>\n</{kind}>\n').encode()


# The member names of the real archives (statmt.org), written out here so that a typo in the
# module's table fails this test; decoys stand for the other languages the archives hold.
EN_DE = {
    "wmt13/training-parallel-europarl-v7.tgz": {
        "training/europarl-v7.fr-en.fr": text(["Reprise de la session"]),
        "training/europarl-v7.de-en.en": text(EUROPARL_EN),
        "training/europarl-v7.de-en.de": text(EUROPARL_DE)},
    "wmt13/training-parallel-commoncrawl.tgz": {
        "commoncrawl.de-en.annotation": b"x\ny\n",
        "commoncrawl.de-en.de": text(CRAWL_DE, "\r\n"),
        "commoncrawl.de-en.en": text(CRAWL_EN)},
    "wmt14/training-parallel-nc-v9.tgz": {
        "training/news-commentary-v9.de-en.en": text(NC_EN),
        "training/news-commentary-v9.de-en.de": text(NC_DE)},
    "wmt14/dev.tgz": {
        "dev/newstest2013.fr": text(["Un", "Deux"]),
        "dev/newstest2013.en": text(["One", "Two"]),
        "dev/newstest2013.de": text(["Eins", "Zwei"])},
    "wmt14/test-full.tgz": {
        "test-full/newstest2014-deen-src.de.sgm": sgm("srcset", "de", ["Nein"]),
        "test-full/newstest2014-deen-src.en.sgm": sgm("srcset", "en", ["Tom &amp; Jerry &quot;say&quot;  &lt;hi&gt;",
                                                                      "AT&T &#233;t&#xE9;"]),
        "test-full/newstest2014-deen-ref.de.sgm": sgm("refset", "de", ["Tom &amp; Jerry „sagen“ &lt;hallo&gt;",
                                                                      " Mehr "])},
}


def tar_bytes(members: dict[str, bytes], gz: bool = True) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz" if gz else "w") as tar:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


def publish(folder: Path, archives: dict[str, dict[str, bytes]]) -> dict[str, Pinned]:
    """Writes the archives under ``folder``; returns them pinned, as ARCHIVES pins the real ones."""
    pins = {}
    for path, members in archives.items():
        (folder / path).parent.mkdir(parents=True, exist_ok=True)
        data = tar_bytes(members, gz=not path.endswith(".tar"))
        (folder / path).write_bytes(data)
        pins[path] = Pinned(len(data), hashlib.sha256(data).hexdigest(), hashlib.md5(data).hexdigest())
    return pins


class _Handler(http.server.SimpleHTTPRequestHandler):
    """Serves files; a path containing 'short' announces 1000 bytes and sends 10 (a cut connection)."""

    def do_GET(self) -> None:
        if "short" in self.path:
            self.send_response(200)
            self.send_header("Content-Length", "1000")
            self.end_headers()
            self.wfile.write(b"\x1f\x8b" + b"0" * 8)
            self.close_connection = True
            return
        super().do_GET()

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def server(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[str, Path]]:
    for var in ("http_proxy", "HTTP_PROXY", "https_proxy", "HTTPS_PROXY", "all_proxy", "ALL_PROXY"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("no_proxy", "*")
    served = tmp_path / "served"
    served.mkdir()
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(_Handler, directory=str(served)))
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}/", served
    httpd.shutdown()
    httpd.server_close()


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_wmt14_en_de(server: tuple[str, Path], tmp_path: Path) -> None:
    url, served = server
    pins = publish(served, EN_DE)
    dest, messages = tmp_path / "wmt14", []
    manifest = prepare("wmt14-en-de", dest, mirror=url, log=messages.append, pinned=pins)
    assert read_lines(dest / "train.en") == EUROPARL_EN + CRAWL_EN + NC_EN  # fixed order, CRLF removed
    assert read_lines(dest / "train.de") == EUROPARL_DE + CRAWL_DE + NC_DE
    assert read_lines(dest / "valid.en") == ["One", "Two"] and read_lines(dest / "valid.de") == ["Eins", "Zwei"]
    assert read_lines(dest / "test.en") == ['Tom & Jerry "say" <hi>', "AT&T été"]  # XML entities unescaped
    assert read_lines(dest / "test.de") == ["Tom & Jerry „sagen“ <hallo>", "Mehr"]
    assert manifest["corpora"]["train"] == {"europarl-v7": 3, "commoncrawl": 2, "news-commentary-v9": 1}
    for name, entry in manifest["outputs"].items():
        assert entry == {"lines": len(read_lines(dest / name)), "sha256": sha256(dest / name)}
    assert sorted(manifest["outputs"]) == [f"{s}.{lang}" for s in ("test", "train", "valid") for lang in ("de", "en")]
    for file, entry in manifest["archives"].items():
        assert entry["sha256"] == sha256(dest / "downloads" / file) and entry["url"].startswith(url)
    assert json.loads((dest / "MANIFEST.json").read_text()) == manifest
    assert sorted(p.name for p in dest.iterdir()) == sorted(["downloads", "MANIFEST.json", *manifest["outputs"]])

    for path in EN_DE:  # a second run downloads nothing
        (served / path).unlink()
    messages.clear()
    assert prepare("wmt14-en-de", dest, mirror=url, log=messages.append, pinned=pins) == manifest
    assert sum("already downloaded and checked" in m for m in messages) == 5


def test_misaligned_corpus_names_the_members(server: tuple[str, Path], tmp_path: Path) -> None:
    url, served = server
    archives = {k: dict(v) for k, v in EN_DE.items()}
    archives["wmt13/training-parallel-commoncrawl.tgz"]["commoncrawl.de-en.de"] = text(CRAWL_DE + ["extra"])
    pins = publish(served, archives)
    with pytest.raises(DataError, match=r"training-parallel-commoncrawl\.tgz/commoncrawl\.de-en\.en has 2 lines, "
                                        r".*/commoncrawl\.de-en\.de has 3$"):
        prepare("wmt14-en-de", tmp_path / "wmt14", mirror=url, log=lambda m: None, pinned=pins)
    assert sorted(p.name for p in (tmp_path / "wmt14").iterdir()) == ["downloads"]  # no half-written outputs


def test_truncated_archive_and_cut_download(server: tuple[str, Path], tmp_path: Path) -> None:
    url, served = server
    pins = publish(served, EN_DE)
    europarl = served / "wmt13/training-parallel-europarl-v7.tgz"
    big = dict(EN_DE["wmt13/training-parallel-europarl-v7.tgz"])
    big["training/europarl-v7.de-en.de"] = text([f"Satz {i} " + hashlib.sha256(b"%d" % i).hexdigest()
                                                 for i in range(2000)])
    europarl.write_bytes(tar_bytes(big)[:30_000])  # served whole, but the archive itself is cut
    cut = europarl.read_bytes()  # pinned as it is: what extraction makes of it is under test here
    pins["wmt13/training-parallel-europarl-v7.tgz"] = Pinned(len(cut), hashlib.sha256(cut).hexdigest(), None)
    with pytest.raises(DataError, match=r"training-parallel-europarl-v7\.tgz: corrupt or truncated archive") as e:
        prepare("wmt14-en-de", tmp_path / "a", mirror=url, log=lambda m: None, pinned=pins)
    assert "\n" not in str(e.value)

    with pytest.raises(DataError, match=r"short/wmt13/training-parallel-europarl-v7\.tgz: download cut short: "
                                        r"received 10 bytes of 1000 \(Content-Length\)"):
        prepare("wmt14-en-de", tmp_path / "b", mirror=url + "short/", log=lambda m: None, pinned=pins)
    assert list((tmp_path / "b" / "downloads").iterdir()) == []  # no .part, nothing taken as complete

    with pytest.raises(DataError, match=r"missing/wmt13/training-parallel-europarl-v7\.tgz: download failed "
                                        r"after 0 bytes .*404"):
        prepare("wmt14-en-de", tmp_path / "c", mirror=url + "missing/", log=lambda m: None, pinned=pins)
    with pytest.raises(DataError, match="unknown dataset 'wmt14-en-xx'; known: wmt14-en-de, wmt14-en-fr"):
        prepare("wmt14-en-xx", tmp_path / "d")


@pytest.mark.parametrize("name", sorted(DATASETS))
def test_every_dataset_from_a_local_mirror(name: str, tmp_path: Path) -> None:
    """Archives built from the table itself (plain .tar and gzip members included), read from a folder."""
    import gzip

    dataset, archives = DATASETS[name], {}
    for split, corpora in (("train", dataset.train), ("valid", (dataset.valid,)), ("test", (dataset.test,))):
        for c in corpora:
            for member, lang in ((c.src, dataset.src_lang), (c.tgt, dataset.tgt_lang)):
                lines = [f"{c.name} {lang} {i}" for i in range(2)]
                data = sgm("refset", lang, lines) if member.endswith(".sgm") else text(lines)
                archives.setdefault(c.archive, {})[member] = gzip.compress(data) if member.endswith(".gz") else data
    pins = publish(tmp_path / "mirror", archives)
    manifest = prepare(name, tmp_path / "out", mirror=str(tmp_path / "mirror"), log=lambda m: None, pinned=pins)
    assert read_lines(tmp_path / "out" / f"train.{dataset.tgt_lang}") == \
        [f"{c.name} {dataset.tgt_lang} {i}" for c in dataset.train for i in range(2)]
    assert manifest["outputs"][f"test.{dataset.src_lang}"]["lines"] == 2


def test_a_mirror_folder_that_is_missing_or_a_file_is_named(tmp_path: Path) -> None:
    (tmp_path / "notes.txt").write_text("mine")
    for given, said in (("gone", "no such folder"), ("notes.txt", "a file, not a folder")):
        with pytest.raises(DataError, match=rf"^--mirror {re.escape(str(tmp_path / given))}: {said} \(give a folder"):
            prepare("wmt14-en-de", tmp_path / "out", mirror=str(tmp_path / given), log=lambda m: None)
    # a folder not holding the archives: said before any work, each archive it lacks named (it was "download
    # failed after 0 bytes ...; run prepare again to retry", the first archive only, and downloads/ left behind)
    (empty := tmp_path / "empty").mkdir()
    (empty / "wmt14").mkdir()
    (empty / "wmt14" / "dev.tgz").write_bytes(b"")
    with pytest.raises(DataError, match=rf"^--mirror {re.escape(str(empty))}: has no wmt13/training-parallel-"
                                        r"commoncrawl\.tgz, wmt13/training-parallel-europarl-v7\.tgz, "
                                        r"wmt14/test-full\.tgz, "
                                        r"wmt14/training-parallel-nc-v9\.tgz \(a mirror holds each archive at its path "
                                        r"under https://www\.statmt\.org/\)$"):
        prepare("wmt14-en-de", tmp_path / "out", mirror=str(empty), log=lambda m: None)
    assert not (tmp_path / "out").exists()


def test_read_sgm_cleans_like_sacrebleu(tmp_path: Path) -> None:
    f = tmp_path / "x.sgm"
    f.write_bytes(sgm("refset", "de", ["  a \t b  ", "x&#10;y", "&amp;lt; &bogus; &#99999999;"]))
    assert list(read_sgm(f)) == ["a b", "x y", "&lt; &bogus; &#99999999;"]  # one level of unescaping


def test_archives_are_checked_against_their_pins(server: tuple[str, Path], tmp_path: Path) -> None:
    """A download that is not the pinned archive (a mirror's other file, a cut without Content-Length)
    is removed and refused; an archive already on disk is checked again, and downloaded again when
    it differs."""
    url, served = server
    pins = publish(served, EN_DE)
    wrong = dict(pins)
    nc = "wmt14/training-parallel-nc-v9.tgz"
    wrong[nc] = Pinned(None, "0" * 64, None)
    dest = tmp_path / "wmt14"
    with pytest.raises(DataError, match=rf"{nc}: not the archive expected \(sha256 [0-9a-f]{{64}}, expected 0{{64}}\); "
                                        "removed it"):
        prepare("wmt14-en-de", dest, mirror=url, log=lambda m: None, pinned=wrong)
    assert not (dest / "downloads" / "training-parallel-nc-v9.tgz").exists()

    europarl = dest / "downloads" / "training-parallel-europarl-v7.tgz"
    europarl.write_bytes(europarl.read_bytes()[:-1])  # cut on disk after an earlier run
    messages = []
    prepare("wmt14-en-de", dest, mirror=url, log=messages.append, pinned=pins)
    assert any(f"{europarl}: {europarl.stat().st_size - 1:,} bytes, expected {europarl.stat().st_size:,}: not the "
               "archive expected; downloading it again" in m for m in messages)
    assert europarl.read_bytes() == (served / "wmt13/training-parallel-europarl-v7.tgz").read_bytes()


def test_every_archive_is_pinned() -> None:
    archives = {c.archive for d in DATASETS.values() for c in (*d.train, d.valid, d.test)}
    assert archives == set(ARCHIVES)
    assert all(p.sha256 or p.md5 for p in ARCHIVES.values())


# --- finding and downloading data ------------------------------------------------------------------

@pytest.fixture
def isolated(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """No TRANSFORMER_DATA, an empty cwd and HOME in tmp_path, no proxies."""
    for var in ("TRANSFORMER_DATA", "TRANSFORMER_MULTI30K_URL", "http_proxy", "HTTP_PROXY",
                "https_proxy", "HTTPS_PROXY", "all_proxy", "ALL_PROXY"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("no_proxy", "*")
    (tmp_path / "home").mkdir()
    (tmp_path / "cwd").mkdir()
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.chdir(tmp_path / "cwd")
    monkeypatch.setattr(prepare_module, "_CHECKOUT", tmp_path / "checkout" / "main")
    (tmp_path / "checkout" / "main").mkdir(parents=True)
    (tmp_path / "checkout" / "main" / "pyproject.toml").touch()  # a checkout's
    return tmp_path


def test_an_installed_package_has_no_shared_data_beside_it(isolated: Path) -> None:
    """Installed from a wheel, the package's parent is site-packages: "../shared/data beside the checkout" named a
    folder inside the venv in every "searched ..." message."""
    (isolated / "checkout" / "main" / "pyproject.toml").unlink()
    (isolated / "checkout" / "shared" / "data").mkdir(parents=True)
    assert find_data_root() is None


def test_find_data_root_order(isolated: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert find_data_root() is None
    home_cache = isolated / "home" / ".cache" / "transformer"
    home_cache.mkdir(parents=True)
    assert find_data_root() == home_cache
    shared = isolated / "checkout" / "shared" / "data"
    shared.mkdir(parents=True)
    assert find_data_root() == shared
    (isolated / "cwd" / "data").mkdir()
    assert find_data_root() == isolated / "cwd" / "data"
    monkeypatch.setenv("TRANSFORMER_DATA", str(isolated / "missing"))
    assert find_data_root() == isolated / "cwd" / "data"  # a missing env folder is skipped
    (isolated / "env").mkdir()
    monkeypatch.setenv("TRANSFORMER_DATA", str(isolated / "env"))
    assert find_data_root() == isolated / "env"


def test_resolve_data_path_searches_roots_in_order(isolated: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for root in ("env", "checkout/shared/data"):
        (isolated / root / "multi30k").mkdir(parents=True)
        (isolated / root / "multi30k" / "x.txt").write_text(root)
    assert resolve_data_path("multi30k/x.txt") == isolated / "checkout/shared/data/multi30k/x.txt"
    monkeypatch.setenv("TRANSFORMER_DATA", str(isolated / "env"))
    assert resolve_data_path("multi30k/x.txt") == isolated / "env/multi30k/x.txt"
    absolute = isolated / "checkout/shared/data/multi30k/x.txt"
    assert resolve_data_path(str(absolute)) == absolute
    with pytest.raises(DataError, match=r"not found: multi30k/y\.txt.*env"):
        resolve_data_path("multi30k/y.txt")


def test_a_missing_data_file_lists_each_folder_searched_once(isolated: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """TRANSFORMER_DATA is ../shared/data beside the checkout: "searched ./ and D, ./data, D, ~/.cache/transformer"."""
    monkeypatch.setenv("TRANSFORMER_DATA", str(isolated / "checkout" / "main" / ".." / "shared" / "data"))
    with pytest.raises(DataError) as err:
        resolve_data_path("nosuch.en")
    roots = [isolated / "checkout" / "main" / ".." / "shared" / "data", isolated / "cwd" / "data",
             isolated / "home" / ".cache" / "transformer"]
    assert f"(searched ./ = {isolated / 'cwd'}, and {', '.join(map(str, roots))};" in str(err.value)
    with pytest.raises(DataError) as err:  # a config's: read from ./, where a file beside the config was looked for
        resolve_data_path("nosuch.en", "data.train_src")
    assert str(err.value).startswith(f"data.train_src: data file not found: nosuch.en (searched ./ = "
                                     f"{isolated / 'cwd'}, not from the config file's, and ")


FAKE = gzip.compress("Ein Hund.\nZwei Katzen.\n".encode())


def test_download_success(isolated: Path, server: tuple[str, Path], monkeypatch: pytest.MonkeyPatch) -> None:
    url, served = server
    (served / "raw").mkdir()
    (served / "raw" / "fake.de.gz").write_bytes(FAKE)
    monkeypatch.setattr(prepare_module, "MULTI30K_SHA256", {"fake.de.gz": hashlib.sha256(FAKE).hexdigest()})
    monkeypatch.setenv("TRANSFORMER_MULTI30K_URL", url)
    path = resolve_data_path("multi30k/fake.de.gz")
    assert path == isolated / "home" / ".cache" / "transformer" / "multi30k" / "fake.de.gz"
    assert read_lines(path) == ["Ein Hund.", "Zwei Katzen."]
    assert [p.name for p in path.parent.iterdir()] == ["fake.de.gz"]  # no temp file left
    (served / "raw" / "fake.de.gz").unlink()
    assert resolve_data_path("multi30k/fake.de.gz") == path  # found in the cache, not fetched again


def test_a_tokenized_reference_is_downloaded_as_published_and_kept_gzipped(
        isolated: Path, server: tuple[str, Path], monkeypatch: pytest.MonkeyPatch) -> None:
    """The quick start's --tok-ref (multi30k/tok/...lc.norm.tok.de.gz) was found only in a data folder that
    held it: a fresh machine trained for ten minutes and then stopped at "data file not found". The dataset
    publishes it as plain text, checked against that text's sha256 and kept gzipped under the asked name."""
    url, served = server
    text = "ein hund .\nzwei katzen .\n".encode()
    (served / "tok").mkdir()
    (served / "tok" / "fake.lc.norm.tok.de").write_bytes(text)
    monkeypatch.setattr(prepare_module, "MULTI30K_TOK_SHA256", {"fake.lc.norm.tok.de": hashlib.sha256(text).hexdigest()})
    monkeypatch.setenv("TRANSFORMER_MULTI30K_URL", url)
    path = resolve_data_path("multi30k/tok/fake.lc.norm.tok.de.gz")
    assert path == isolated / "home" / ".cache" / "transformer" / "multi30k" / "tok" / "fake.lc.norm.tok.de.gz"
    assert gzip.decompress(path.read_bytes()) == text and read_lines(path) == ["ein hund .", "zwei katzen ."]
    assert [p.name for p in path.parent.iterdir()] == [path.name]  # neither the plain file nor a temp file left
    (served / "tok" / "fake.lc.norm.tok.de").unlink()
    assert resolve_data_path("multi30k/tok/fake.lc.norm.tok.de.gz") == path  # from the cache
    (served / "tok" / "fake.lc.norm.tok.de").write_bytes(text + b"changed\n")  # not what was published
    with pytest.raises(DataError, match="sha256") as e:
        resolve_data_path("multi30k/tok/fake.lc.norm.tok.de")
    assert "\n" not in str(e.value) and "multi30k/tok/fake.lc.norm.tok.de is missing" in str(e.value)
    assert [p.name for p in path.parent.iterdir()] == [path.name]
    path.unlink()  # asked for gzipped: the line says to gzip what it names, under the asked name
    with pytest.raises(DataError, match=r"tok/fake\.lc\.norm\.tok\.de into .*tok, gzipped as fake\.lc\.norm\.tok\.de\.gz"):
        resolve_data_path("multi30k/tok/fake.lc.norm.tok.de.gz")


def test_every_tokenized_reference_a_recipe_names_can_be_downloaded() -> None:
    """Each config's data.test_tok_ref is one the downloader knows (a fresh machine can evaluate every recipe)."""
    from transformer.config import load_config

    configs = sorted((Path(__file__).parents[1] / "configs").glob("*.toml"))
    refs = {load_config(str(c)).data.test_tok_ref for c in configs} - {""}
    assert refs and all(prepare_module._published_multi30k(Path(ref)) for ref in refs), refs


def test_download_sha_mismatch_keeps_nothing(isolated: Path, server: tuple[str, Path],
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    url, served = server
    (served / "raw").mkdir()
    (served / "raw" / "fake.de.gz").write_bytes(FAKE)
    monkeypatch.setattr(prepare_module, "MULTI30K_SHA256", {"fake.de.gz": "0" * 64})
    monkeypatch.setenv("TRANSFORMER_MULTI30K_URL", url)
    monkeypatch.setenv("TRANSFORMER_DATA", str(isolated / "env"))
    with pytest.raises(DataError, match="sha256") as e:
        resolve_data_path("multi30k/fake.de.gz")
    assert "\n" not in str(e.value)
    assert list((isolated / "env" / "multi30k").iterdir()) == []


def test_download_unreachable_says_where_to_put_files(isolated: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with socket.socket() as s:  # a port that was free a moment ago: connections are refused
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    monkeypatch.setenv("TRANSFORMER_MULTI30K_URL", f"http://127.0.0.1:{port}/")
    with pytest.raises(DataError) as e:
        resolve_data_path("multi30k/train.en.gz")
    message = str(e.value)
    folder = isolated / "home" / ".cache" / "transformer" / "multi30k"
    assert "\n" not in message and "multi30k/train.en.gz" in message and str(folder) in message
    assert list(folder.iterdir()) == []


@pytest.mark.parametrize("url", ["http://[::1", "htp://example.org/"])
def test_a_url_that_is_none_is_a_download_error_naming_it(url: str, tmp_path: Path) -> None:
    """`prepare --mirror "http://[::1"` ended in an internal error (urllib's ValueError)."""
    with pytest.raises(DownloadError, match=rf"^{re.escape(url)}train\.en\.gz: download failed after 0 bytes of an "
                                            r"unknown size \(.+\)$"):
        download(url + "train.en.gz", tmp_path / "train.en.gz")
    assert list(tmp_path.iterdir()) == []


def test_only_known_multi30k_files_are_downloaded(isolated: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRANSFORMER_MULTI30K_URL", "http://127.0.0.1:9/")
    with pytest.raises(DataError, match="not found: multi30k/train.xx.gz"):
        resolve_data_path("multi30k/train.xx.gz")


def test_the_parsing_splits_take_every_file_of_their_range_and_no_other(tmp_path: Path) -> None:
    """The WSJ sample is split by file number (PTB_SPLITS, both ends included), as the treebank by section: with
    one tree per file whose word is its number, each split holds exactly its files' trees, in order, and no
    file is in two splits or in none."""
    from transformer.prepare import PTB_SPLITS, write_ptb_splits

    for number in range(1, 190):
        (tmp_path / f"wsj_{number:04d}.mrg").write_text(f"( (S (NP-SBJ (CD w{number})) (. .)) )\n")
    counts = write_ptb_splits(tmp_path, tmp_path / "out")
    taken = []
    for split, (first, last) in PTB_SPLITS.items():
        words = read_lines(tmp_path / "out" / f"{split}.words")
        assert words == [f"w{n} ." for n in range(first, last + 1)] and counts[split] == len(words)
        taken += words
    assert sorted(taken) == sorted(f"w{n} ." for n in range(1, 190))  # each file in one split exactly
    assert read_lines(tmp_path / "out" / "valid.gold")[0] == "(S (NP (CD w160)) (. .))"


def test_linearize_writes_the_task_files_of_any_trees(tmp_path: Path, capsys) -> None:
    """configs/parse.toml asks for the user's own WSJ splits in the task's form, and no command wrote them:
    `transformer linearize` does, as the sample's splits are written (the same bytes for the same trees)."""
    from transformer.cli import main
    from transformer.prepare import PTB_SPLITS, TREE_FILES, write_ptb_splits

    for number in range(1, 190):
        (tmp_path / f"wsj_{number:04d}.mrg").write_text(f"( (S (NP-SBJ (CD w{number})) (VP (VBZ runs)) (. .)) )\n")
    write_ptb_splits(tmp_path, tmp_path / "splits")
    first, last = PTB_SPLITS["valid"]
    files = [str(tmp_path / f"wsj_{n:04d}.mrg") for n in range(first, last + 1)]
    assert main(["linearize", *files, "--out", str(tmp_path / "mine" / "valid")]) == 1  # its folder is not there
    assert "--out" in capsys.readouterr().err and not (tmp_path / "mine").exists()
    assert main(["linearize", *files, "--out", str(tmp_path / "valid")]) == 0
    for suffix in TREE_FILES:
        assert (tmp_path / f"valid.{suffix}").read_bytes() == (tmp_path / "splits" / f"valid.{suffix}").read_bytes()
    assert read_lines(tmp_path / "valid.wlin")[0] == "(S (NP w160 )NP (VP runs )VP . )S"
    (tmp_path / "none.mrg").write_text("( (-NONE- *T*) )\n")
    assert main(["linearize", str(tmp_path / "none.mrg"), "--out", str(tmp_path / "none")]) == 1
    assert "no tree with a word" in capsys.readouterr().err
    # a tree left without a word among others was dropped without a word, and a test split's lines no longer
    # numbered the file's trees
    (tmp_path / "mix.mrg").write_text("( (S (NP (NN a)) (. .)) )\n( (S (NP-SBJ (-NONE- *T*-1)) ) )\n"
                                      "( (S (NP (NN b)) (. .)) )\n")
    assert main(["linearize", str(tmp_path / "mix.mrg"), "--out", str(tmp_path / "mix")]) == 0
    err = capsys.readouterr().err
    mix = tmp_path / "mix"
    assert err == (f"left out 1 tree without a word once traces are removed ({mix}.mrg: tree 2): score the parses "
                   f"of {mix}.words against {mix}.gold, which leaves them out too, not against the trees read\n"), err
    assert len(read_lines(tmp_path / "mix.words")) == 2
    # the trees in a file named as one of the outputs: `linearize x.words --out x` replaced them
    (tmp_path / "x.words").write_text("( (S (NP (NN a)) (. .)) )\n")
    assert main(["linearize", str(tmp_path / "x.words"), "--out", str(tmp_path / "x")]) == 1
    assert capsys.readouterr().err == (f"error: --out {tmp_path / 'x'}: would write {tmp_path / 'x.words'}, which is "
                                       f"{tmp_path / 'x.words'}, read as trees: give another prefix\n")
    assert (tmp_path / "x.words").read_text() == "( (S (NP (NN a)) (. .)) )\n" and not (tmp_path / "x.lin").exists()


def test_a_home_where_the_parsing_files_cannot_be_written_is_a_data_error(tmp_path: Path, monkeypatch) -> None:
    """The parsing task's files are built under $HOME/.cache on first use; a HOME that cannot hold them (a file,
    /proc) was an internal error, not the one line that names the folder."""
    from transformer.prepare import resolve_data_path

    (tmp_path / "data" / "ptb-sample").mkdir(parents=True)
    for number in range(1, 190):
        (tmp_path / "data" / "ptb-sample" / f"wsj_{number:04d}.mrg").write_text("( (S (NP-SBJ (CD w)) (. .)) )\n")
    (tmp_path / "home").write_text("a file, no folder\n")
    monkeypatch.setenv("TRANSFORMER_DATA", str(tmp_path / "data"))
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.chdir(tmp_path)
    with pytest.raises(DataError, match=r"ptb-sample-parse/train.words: cannot write the parsing task's files into "
                                        + re.escape(str(tmp_path / "home" / ".cache"))):
        resolve_data_path("ptb-sample-parse/train.words")


def test_a_path_whose_backslashes_were_read_as_escapes_is_said_so(tmp_path, monkeypatch):
    """"multi30k\\train.en.gz" in a TOML "..." string holds a tab: the error printed the tab as it is, and said
    nothing of why (--set's own check says it)."""
    monkeypatch.chdir(tmp_path)
    with pytest.raises(DataError, match=re.escape("data.train_src: data file not found: 'multi30k\\train.en.gz' (")
                       + r".*; in a TOML \"...\" string a backslash escapes: write the path with / or in '...'$"):
        prepare_module.resolve_data_path("multi30k\train.en.gz", "data.train_src")
    with pytest.raises(DataError, match=r"^--src: data file not found: 'x\\x7fy' \(searched [^;]*; set [^;]*\)$"):
        prepare_module.resolve_data_path("x\x7fy", "--src")  # typed, not escaped: no TOML to blame
