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
    from transformer.serve import start_server

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
    n_all = len(browser.find_elements(By.CSS_SELECTOR, "#attention svg line"))
    token = browser.find_elements(By.CSS_SELECTOR, "#attention text.attn-token[data-side='q']")[1]
    ActionChains(browser).move_to_element(token).perform()  # hover: only that token's links stay
    wait.until(lambda b: 0 < len(b.find_elements(By.CSS_SELECTOR, "#attention svg line")) < n_all)
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    assert browser.save_screenshot(str(ARTIFACTS / "serve_page.png"))
    # heatmap view of another attention kind
    browser.find_element(By.CSS_SELECTOR, "select[name='style'] option[value='heatmap']").click()
    browser.find_element(By.CSS_SELECTOR, "select[name='kind'] option[value='cross']").click()
    assert browser.find_elements(By.CSS_SELECTOR, "#attention figure.attn-heatmap rect")
    # a bad request shows its error on the page, and the page keeps working
    browser.find_element(By.ID, "beam").clear()
    browser.find_element(By.ID, "beam").send_keys("99")
    browser.find_element(By.ID, "go").click()
    wait.until(lambda b: "beam: 99 is outside" in b.find_element(By.ID, "error").text)
