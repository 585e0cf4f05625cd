"""The web page of `transformer serve` in a real headless Chromium (Debian's chromium + chromedriver,
installed by scripts/test.sh): type a sentence, translate it, see the translation and the attention."""

import json
import os
import shutil
import urllib.request
from pathlib import Path

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.browser]
ARTIFACTS = Path(os.environ.get("TRANSFORMER_TEST_ARTIFACTS", Path(__file__).resolve().parents[1] / "test-artifacts"))


@pytest.fixture
def server(tiny_run):
    """The page served from the tiny test model, or from TRANSFORMER_PAGE_RUN: the README's screenshot is
    `TRANSFORMER_PAGE_RUN=runs/bench_en_de TRANSFORMER_TEST_ARTIFACTS=docs pytest tests/test_browser.py`."""
    from tests.conftest import start_server

    proc, url = start_server(Path(os.environ.get("TRANSFORMER_PAGE_RUN", tiny_run)), timeout=60)
    yield url
    proc.terminate()
    proc.wait(10)


@pytest.fixture
def browser():
    if os.environ.get("TRANSFORMER_SKIP_BROWSER"):
        pytest.skip("chromium could not be installed (scripts/test.sh said why)")
    webdriver = pytest.importorskip("selenium.webdriver")
    chromium, driver = shutil.which("chromium"), shutil.which("chromedriver")
    if not (chromium and driver):
        pytest.fail("chromium and chromedriver are needed: apt-get install chromium chromium-driver "
                    "(scripts/test.sh does it), or set TRANSFORMER_SKIP_BROWSER=1")
    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--disable-quic",
                 "--no-first-run", "--disable-background-networking", "--disable-component-update",
                 "--disable-sync", "--window-size=1200,1400"):
        options.add_argument(flag)
    b = webdriver.Chrome(options=options, service=webdriver.ChromeService(executable_path=driver))
    yield b
    b.quit()


def test_page_translates_and_shows_attention(server, browser):
    from selenium.webdriver.common.action_chains import ActionChains
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    browser.get(server + "/")
    browser.find_element(By.ID, "source").send_keys("A dog runs on the beach.")
    browser.find_element(By.ID, "go").click()
    wait = WebDriverWait(browser, 60)
    wait.until(lambda b: b.find_elements(By.CSS_SELECTOR, "#attention svg line"))
    translation = browser.find_element(By.ID, "translation").text
    expected = json.loads(urllib.request.urlopen(urllib.request.Request(
        server + "/v1/translate", data=b'{"text": ["A dog runs on the beach."]}',
        headers={"content-type": "application/json"})).read())["translations"][0]
    assert translation == expected.strip()
    assert browser.find_element(By.ID, "error").text == ""
    def shown_lines() -> int:
        return len(browser.find_elements(By.CSS_SELECTOR, "#attention svg line:not([display='none'])"))

    n_all = shown_lines()
    token = browser.find_elements(By.CSS_SELECTOR, "#attention text.attn-token[data-side='q']")[1]
    ActionChains(browser).move_to_element(token).perform()  # hover: only that token's links stay
    wait.until(lambda b: 0 < shown_lines() < n_all)
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    assert browser.save_screenshot(str(ARTIFACTS / "serve_page.png"))
    # leaving it shows every link again: the view was redrawn under the pointer, the token replaced, its
    # mouseleave never came, and the view stayed on the one token until a menu changed
    ActionChains(browser).move_to_element(browser.find_element(By.TAG_NAME, "h1")).perform()
    wait.until(lambda b: shown_lines() == n_all)
    assert browser.execute_script("return arguments[0].isConnected", token)
    # heatmap view of another attention kind: hovering a row dims the others, leaving it undims them
    browser.find_element(By.CSS_SELECTOR, "select[name='style'] option[value='heatmap']").click()
    dimmed = "#attention figure.attn-heatmap rect[fill-opacity='0.15']"
    row = browser.find_elements(By.CSS_SELECTOR, "#attention figure.attn-heatmap text.attn-token[data-side='q']")[0]
    ActionChains(browser).move_to_element(row).perform()  # the source's rows (the translation may be empty)
    wait.until(lambda b: b.find_elements(By.CSS_SELECTOR, dimmed))
    ActionChains(browser).move_to_element(browser.find_element(By.TAG_NAME, "h1")).perform()
    wait.until(lambda b: not b.find_elements(By.CSS_SELECTOR, dimmed))
    browser.find_element(By.CSS_SELECTOR, "select[name='kind'] option[value='cross']").click()
    assert browser.find_elements(By.CSS_SELECTOR, "#attention figure.attn-heatmap rect")

    def shown():
        return (browser.find_element(By.ID, "translation").text, browser.find_element(By.ID, "error").text,
                len(browser.find_elements(By.CSS_SELECTOR, "#attention svg")))

    def enter(field, value):
        browser.find_element(By.ID, field).clear()
        browser.find_element(By.ID, field).send_keys(value)

    def last_results():  # the tiny model's translation may be empty: a stand-in makes a stale one visible
        browser.execute_script("document.getElementById('translation').textContent = 'the last translation'")
        assert shown()[2] > 0

    # the requests the page sends, recorded: [path, body]
    browser.execute_script("window.sent = []; const f = window.fetch;"
                           "window.fetch = (path, options) => { sent.push([path, options.body]); return f(path, options); };")
    # a beam or α that is no number the server takes is refused in the page, and the last results go with it
    last_results()
    for field, value, message in (("beam", "2.5", "beam must be a whole number from 1 to 16"),
                                  ("beam", "99", "beam must be a whole number from 1 to 16"),
                                  ("alpha", "1e", "α must be a number")):
        enter(field, value)
        browser.find_element(By.ID, "go").click()
        assert shown() == ("", message + " (empty: the run's default)", 0)
        browser.find_element(By.ID, field).clear()
    assert browser.execute_script("return sent") == []
    # empty fields mean the run's defaults: the keys are left out (not alpha 0); clicks during a round are
    # ignored (the button is off until it ends), so one round's error never sits beside another's figure
    assert browser.execute_script("const go = document.getElementById('go');"
                                  "for (let i = 0; i < 4; i++) go.click(); return go.disabled;")
    wait.until(lambda b: b.find_element(By.ID, "go").is_enabled())
    assert shown() == (expected.strip(), "", 1)
    sent = browser.execute_script("return sent")
    assert [path for path, _ in sent] == ["/v1/translate", "/v1/attention"]
    assert json.loads(sent[0][1]) == {"text": ["A dog runs on the beach."]}
    # a request the server refuses shows its error, and not the last input's translation and attention
    last_results()
    enter("alpha", "50")
    browser.find_element(By.ID, "go").click()
    wait.until(lambda b: b.find_element(By.ID, "go").is_enabled())
    translation, error, figures = shown()
    assert (translation, figures) == ("", 0) and error.startswith("alpha 50.0: must be a finite number")


def test_words_view_merges_pieces_as_the_png_figures_do(server, browser, tiny_run):
    """The page merges sub-words itself (the API sends pieces only): its word labels and weights are
    figures.AttentionMaps.merged's, which draws the PNG figures."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    from transformer.figures import _word_groups, attention_maps
    from transformer.translator import Translator

    source = "A dog runs on the beach with its owner."
    browser.get(server + "/")
    browser.find_element(By.ID, "source").send_keys(source)
    browser.find_element(By.ID, "go").click()
    WebDriverWait(browser, 60).until(lambda b: b.find_elements(By.CSS_SELECTOR, "#attention svg line"))
    for option in ("select[name='unit'] option[value='words']", "select[name='style'] option[value='heatmap']",
                   "select[name='kind'] option[value='cross']", "select[name='head'] option[value='0']"):
        browser.find_element(By.CSS_SELECTOR, option).click()
    translation = browser.find_element(By.ID, "translation").text
    words = attention_maps(Translator(tiny_run, log=lambda m: None), source, translation).merged()
    rows = [t.text for t in browser.find_elements(By.CSS_SELECTOR, "#attention text.attn-token[data-side='q']")]
    assert rows == words.tgt_out
    cells = [float(r.get_attribute("data-weight")) for r in browser.find_elements(By.CSS_SELECTOR, "#attention rect")]
    expected = words.weights["cross"][0, 0].flatten().tolist()  # layer 1, head 1
    assert len(cells) == len(expected) and max(abs(a - b) for a, b in zip(cells, expected)) < 2e-3
    # SentencePiece's lone "▁" (before "(" or digits) starts a word of the pieces after it, not shown itself
    for tokens in (["▁", "(", "on", ")", "</s>"], ["<s>", "▁", "1", "2", "▁x", "▁", "</s>"]):
        assert browser.execute_script("return wordGroups(arguments[0])", tokens) == list(_word_groups(tokens))


def test_page_notes_unknown_characters_and_shows_an_answer_that_is_not_json(server, browser):
    """A character the vocabulary has no piece for is labelled as typed: the page says the model read its unknown
    piece. An answer that is not the server's JSON (a proxy's 502 page) showed as a JSON parse error, not as what
    it was."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    wait = WebDriverWait(browser, 60)
    browser.get(server + "/")
    browser.find_element(By.ID, "source").send_keys("A dog \u2603 runs.")
    browser.find_element(By.ID, "go").click()
    wait.until(lambda b: b.find_elements(By.CSS_SELECTOR, "#attention svg line"))
    note = browser.find_element(By.CSS_SELECTOR, "#attention > p").text
    assert note.startswith('note: the model\'s vocabulary has no piece for "\u2603": the model reads each as its')
    browser.execute_script("window.fetch = () => Promise.resolve(new Response('<html>bad gateway</html>', "
                           "{status: 502, statusText: 'Bad Gateway'}));")
    browser.find_element(By.ID, "go").click()
    wait.until(lambda b: b.find_element(By.ID, "error").text)
    assert browser.find_element(By.ID, "error").text == "502 Bad Gateway: <html>bad gateway</html>"


HOSTILE = "</script><script>window.pwned = 1</script><!--<script> & &amp; /*{{DATA}}*/null {{TITLE}}"


def test_hostile_text_shows_as_written_and_runs_nothing(server, browser, tiny_run, tmp_path):
    """A sentence made to break out of its place, in the HTML figure (title and data) and through the
    server's page: no script of its own runs, and the text shows as written."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    from transformer.figures import attention_html, attention_maps
    from transformer.translator import Translator

    figure = tmp_path / "attention.html"
    maps = attention_maps(Translator(tiny_run, log=lambda m: None), HOSTILE, HOSTILE)
    figure.write_text(attention_html(maps, HOSTILE), encoding="utf-8")
    browser.get(figure.as_uri())
    assert browser.execute_script("return window.pwned") is None
    assert browser.find_element(By.TAG_NAME, "h1").text == HOSTILE
    assert browser.title == HOSTILE
    assert browser.find_elements(By.CSS_SELECTOR, "#attention svg line")  # the viewer ran on the data

    browser.get(server + "/")
    browser.find_element(By.ID, "source").send_keys(HOSTILE)
    browser.find_element(By.ID, "go").click()
    WebDriverWait(browser, 60).until(lambda b: b.find_elements(By.CSS_SELECTOR, "#attention svg line")
                                     or b.find_element(By.ID, "error").text)
    assert browser.find_element(By.ID, "error").text == ""
    assert browser.execute_script("return window.pwned") is None


@pytest.fixture
def parse_server(multi30k, tmp_path):
    """A tiny parsing run (§6.3: beam 21, beyond the server's default --max-beam of 16) being served."""
    from transformer.config import load_config
    from tests.conftest import start_server
    from transformer.train import train

    cfg = load_config("configs/ptb_sample_parse.toml", [
        "model.n_enc_layers=1", "model.n_dec_layers=1", "model.d_model=32", "model.d_ff=64", "data.vocab_size=800",
        "train.max_steps=20", "train.max_minutes=0", "train.save_every=10", "train.threads=1", "train.eval_every=1000",
        "decode.max_len_offset=40"])
    train(cfg, tmp_path / "parse", quiet=True)
    proc, url = start_server(tmp_path / "parse", timeout=60)
    yield url
    proc.terminate()
    proc.wait(10)


def test_the_page_serves_a_parsing_run_with_its_own_beam(parse_server, browser):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    browser.get(parse_server + "/")
    assert browser.find_element(By.ID, "beam").get_attribute("value") == "21"
    browser.find_element(By.ID, "source").send_keys("The dog barked .")
    browser.find_element(By.ID, "go").click()
    WebDriverWait(browser, 120).until(lambda b: b.find_elements(By.CSS_SELECTOR, "#attention svg line")
                                      or b.find_element(By.ID, "error").text)
    assert browser.find_element(By.ID, "error").text == ""
    tree = browser.find_element(By.ID, "translation").text
    assert tree.startswith("(") and all(word in tree for word in ("The", "dog", "barked"))


@pytest.mark.parametrize("enc, dec", [(2, 3), (3, 2)])
def test_the_layer_menu_follows_the_kind_of_attention(browser, tmp_path, enc, dec):
    """The encoder and the decoder may have other depths: the layer menu listed the encoder's for every
    kind, so a third decoder layer could not be chosen (2 + 3), and the encoder's third, then cross-attention,
    drew nothing and threw (3 + 2)."""
    import torch
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select

    from transformer.figures import AttentionMaps, attention_html

    src, tgt_in, tgt_out = ["▁A", "▁dog", "</s>"], ["<s>", "▁Ein"], ["▁Ein", "</s>"]

    def rows(layers: int, queries: int, keys: int) -> torch.Tensor:
        return torch.full((layers, 2, queries, keys), 1.0 / keys)
    maps = AttentionMaps(src, tgt_in, tgt_out, {"enc_self": rows(enc, 3, 3), "dec_self": rows(dec, 2, 2),
                                                "cross": rows(dec, 2, 3)})
    page = tmp_path / "attention.html"
    page.write_text(attention_html(maps), encoding="utf-8")
    browser.get(page.as_uri())
    layer = lambda: Select(browser.find_element(By.NAME, "layer"))  # noqa: E731  (redrawn with each choice)
    assert [o.text for o in layer().options] == [str(i + 1) for i in range(enc)]
    layer().select_by_index(enc - 1)
    Select(browser.find_element(By.NAME, "kind")).select_by_value("cross")
    assert [o.text for o in layer().options] == [str(i + 1) for i in range(dec)]
    assert layer().first_selected_option.text == str(min(enc, dec))  # the nearest layer the stack has
    assert browser.find_elements(By.CSS_SELECTOR, "svg line")  # drawn
    assert not [e for e in browser.get_log("browser") if e["level"] == "SEVERE"]


def test_the_page_opens_at_the_view_it_is_given(browser, tmp_path):
    """`attention --out FILE.html` with --kind, --layer, --heads, --style or --words: the page ignored them
    (a note said they shape a PNG only; --words not even that) and opened at its first choices."""
    import torch
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select

    from transformer.figures import AttentionMaps, attention_html

    src, tgt_in, tgt_out = ["▁A", "▁do", "g", "</s>"], ["<s>", "▁Ein"], ["▁Ein", "</s>"]
    maps = AttentionMaps(src, tgt_in, tgt_out, {"enc_self": torch.full((2, 2, 4, 4), 0.25),
                                                "dec_self": torch.full((2, 2, 2, 2), 0.5),
                                                "cross": torch.full((2, 2, 2, 4), 0.25)})
    page = tmp_path / "attention.html"
    view = {"kind": "cross", "layer": 1, "style": "heatmap", "head": 1, "unit": "words"}
    page.write_text(attention_html(maps, view=view), encoding="utf-8")
    browser.get(page.as_uri())
    chosen = {name: Select(browser.find_element(By.NAME, name)).first_selected_option.get_attribute("value")
              for name in ("kind", "layer", "head", "style", "unit")}
    assert chosen == {"kind": "cross", "layer": "1", "head": "1", "style": "heatmap", "unit": "words"}
    assert "dog" in browser.find_element(By.CLASS_NAME, "attn-view").text  # drawn in words
    assert not [e for e in browser.get_log("browser") if e["level"] == "SEVERE"]
