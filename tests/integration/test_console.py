"""The operator's console (`web/console/`, issue 23) in a real browser against a real tree:
Debian's headless Chromium driven by Selenium through Debian's chromedriver (Selenium Manager
never runs: it would download a browser). A question appears and is answered with its button,
recorded as `token:NAME`; a SIGKILLed shard's next generation shows; a read token sees no
button; a refused token and a stopped tree are said plainly.

Screenshots at 1280x800 and 390x844 go to `$ORCHESTRA_SUP_SCREENSHOTS` (else the test's tmp).
"""

from __future__ import annotations

import json
import os
import signal
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.integration.harness import Tree
from tests.integration.test_hitl_ctl import APPROVE_PLAN
from tests.integration.test_hitl_ctl import ctl as ctl_cli
from tests.integration.test_http_api import Http, token

CHROMIUM = Path("/usr/bin/chromium")
CHROMEDRIVER = Path("/usr/bin/chromedriver")
if not (CHROMIUM.is_file() and CHROMEDRIVER.is_file()):
    pytest.skip(
        f"no {CHROMIUM} or {CHROMEDRIVER} (Debian's chromium and chromium-driver; make installs "
        "them as root)",
        allow_module_level=True,
    )

from selenium import webdriver  # noqa: E402  (after the skip: needs no browser to import)
from selenium.common.exceptions import StaleElementReferenceException  # noqa: E402
from selenium.webdriver.chrome.service import Service  # noqa: E402
from selenium.webdriver.common.by import By  # noqa: E402
from selenium.webdriver.remote.webdriver import WebDriver  # noqa: E402
from selenium.webdriver.remote.webelement import WebElement  # noqa: E402
from selenium.webdriver.support.ui import WebDriverWait  # noqa: E402

pytestmark = pytest.mark.integration

WAIT_S = 30.0
"""Seconds the page has to show what a test waits for."""
FLAGS = (
    "--headless=new",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--window-size=1280,800",
)
SIZES = ((1280, 800, False), (390, 844, True))
"""The screens the console must be usable on: (width, height, a phone)."""


@pytest.fixture
def browser(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[webdriver.Chrome]:
    """A headless Chromium with a fresh profile, its console log kept."""
    # Selenium Manager, were it called, would fail on this path instead of downloading
    monkeypatch.setenv("SE_MANAGER_PATH", str(tmp_path / "no-selenium-manager"))
    options = webdriver.ChromeOptions()
    options.binary_location = str(CHROMIUM)
    for flag in (*FLAGS, f"--user-data-dir={tmp_path / 'chromium'}"):
        options.add_argument(flag)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    service = Service(executable_path=str(CHROMEDRIVER), log_output=str(tmp_path / "driver.log"))
    driver = webdriver.Chrome(service=service, options=options)
    try:
        yield driver
    finally:
        driver.quit()


@pytest.fixture
def console_tree(
    tree_factory: Callable[..., Tree], repo: Path, tmp_path: Path
) -> tuple[Tree, str, str]:
    """A one-shard tree serving the API and the console, and an operate and a read token."""
    state = tmp_path / "state"
    ops, viewer = token(state, "ops"), token(state, "viewer", "read")
    tree = tree_factory(workspace=repo, shards=1, extra_args=["--http", "127.0.0.1:0"])
    return tree, ops, viewer


def console_url(tree: Tree) -> str:
    """The console's address as `ctl status` shows it to an operator."""
    lines = ctl_cli(tree, "status", "--wide").stdout.splitlines()
    (url,) = [line.removeprefix("console ") for line in lines if line.startswith("console ")]
    return url


def wait(driver: WebDriver, what: str, until: Callable[[WebDriver], object]) -> object:
    """`until(driver)`'s first truthy value within `WAIT_S` (an element the page redrew
    meanwhile is looked for again)."""
    waiting = WebDriverWait(driver, WAIT_S, ignored_exceptions=[StaleElementReferenceException])
    return waiting.until(until, f"the console to show {what}")


def click(driver: WebDriver, css: str, what: str) -> None:
    """Click the element `css` finds once it is shown, again if the page redrew it first."""

    def clicked(d: WebDriver) -> bool:
        found = _shown(d, css)
        if found is None:
            return False
        found.click()
        return True

    wait(driver, what, clicked)


def sign_in(driver: WebDriver, url: str, bearer: str) -> None:
    """Open the console at `url` and give it `bearer` in its token form."""
    driver.get(url)
    field = wait(driver, "its token form", lambda d: _shown(d, "#token-input"))
    assert isinstance(field, WebElement)
    field.send_keys(bearer)
    driver.find_element(By.ID, "token-submit").click()


def signed_in(driver: WebDriver, url: str, bearer: str) -> None:
    sign_in(driver, url, bearer)
    wait(driver, "its event stream live", lambda d: _shown(d, '#link[data-link="live"]'))


def _shown(driver: WebDriver, css: str) -> WebElement | None:
    """The first element `css` finds when it is displayed, else None."""
    found = driver.find_elements(By.CSS_SELECTOR, css)
    return found[0] if found and found[0].is_displayed() else None


def question(driver: WebDriver, plan_id: str) -> WebElement:
    card = wait(
        driver, f"plan {plan_id}'s question", lambda d: _shown(d, f'[data-plan="{plan_id}"]')
    )
    assert isinstance(card, WebElement)
    return card


def submit_gated(http: Http) -> str:
    status, body, _ = http.call("POST", "/v1/plans", APPROVE_PLAN.encode())
    assert status == 201, body
    return str(body["id"])


def screenshots(driver: WebDriver, where: Path) -> list[Path]:
    """The page at each of `SIZES`, saved as PNG in `where`; at each, nothing wider than the
    screen (no sideways scrolling of the page itself)."""
    where.mkdir(parents=True, exist_ok=True)
    taken = []
    for width, height, phone in SIZES:
        metrics = {"width": width, "height": height, "deviceScaleFactor": 1, "mobile": phone}
        driver.execute_cdp_cmd("Emulation.setDeviceMetricsOverride", metrics)
        inner = driver.execute_script("return [window.innerWidth, window.innerHeight]")
        assert inner == [width, height]
        wide = driver.execute_script("return document.documentElement.scrollWidth")
        assert wide <= width, f"the page is {wide} px wide on a {width} px screen"
        path = where / f"console-{width}x{height}.png"
        assert driver.save_screenshot(str(path))
        taken.append(path)
    driver.execute_cdp_cmd("Emulation.clearDeviceMetricsOverride", {})
    return taken


def test_an_operator_answers_while_a_shard_is_killed(
    console_tree: tuple[Tree, str, str], browser: webdriver.Chrome, tmp_path: Path
) -> None:
    """The question of an `approve = true` task appears; the shard SIGKILLed meanwhile shows
    its next generation; the Approve button answers it, recorded as `token:ops`; the plan is
    shown succeeded and its lane's transcript has the task's output. No error in the page's
    console (a CSP violation would be one)."""
    tree, ops, _ = console_tree
    url = console_url(tree)
    http = Http(url, ops)
    signed_in(browser, url, ops)
    plan_id = submit_gated(http)
    card = question(browser, plan_id)
    assert "approve task deploy of plan gate" in card.text

    shard = tree.child("shard-0")
    assert shard.pid is not None
    os.kill(shard.pid, signal.SIGKILL)
    wait(
        browser,
        f"shard-0 past generation {shard.generation}",
        lambda d: _shown(
            d,
            f'[data-child="shard-0"][data-state="running"]'
            f':not([data-generation="{shard.generation}"])',
        ),
    )
    row = browser.find_element(By.CSS_SELECTOR, '[data-child="shard-0"]')
    assert int(row.get_attribute("data-generation") or 0) > shard.generation
    shots = screenshots(browser, Path(os.environ.get("ORCHESTRA_SUP_SCREENSHOTS") or tmp_path))
    assert all(p.stat().st_size > 10_000 for p in shots)

    click(browser, f'[data-plan="{plan_id}"] [data-verb="approve"]', "the Approve button")
    wait(
        browser,
        f"plan {plan_id} succeeded",
        lambda d: _shown(d, f'[data-plan-id="{plan_id}"][data-state="succeeded"]'),
    )
    status, report, _ = http.call("GET", f"/v1/plans/{plan_id}")
    assert status == 200 and report["ok"], report
    (answer,) = report["tasks"][0]["answers"]
    assert (answer["verdict"], answer["responder"]) == ("approve", "token:ops")
    assert not browser.find_elements(By.CSS_SELECTOR, ".question")

    lane = report["tasks"][0]["lane"]
    click(browser, f'#plans [data-show-lane="{lane}"]', f"lane {lane} in its plan")
    wait(
        browser,
        f"lane {lane}'s transcript",
        lambda d: "deployed" in d.find_element(By.ID, "transcript").text,
    )
    errors = [e for e in browser.get_log("browser") if e["level"] == "SEVERE"]
    assert errors == [], json.dumps(errors, indent=1)


def test_a_read_token_sees_the_question_and_no_button(
    console_tree: tuple[Tree, str, str], browser: WebDriver
) -> None:
    tree, ops, viewer = console_tree
    url = console_url(tree)
    plan_id = submit_gated(Http(url, ops))
    signed_in(browser, url, viewer)
    card = question(browser, plan_id)
    assert "may read, not answer" in card.text
    assert card.find_elements(By.CSS_SELECTOR, "button, textarea") == []
    assert browser.find_element(By.ID, "who").text == "token viewer (read)"


def test_a_refused_token_and_a_stopped_tree_are_shown_plainly(
    console_tree: tuple[Tree, str, str], browser: WebDriver
) -> None:
    """A token the tree does not know: "token refused" and the form again; a good one, then the
    tree stopped: "tree unreachable — retrying", the stream shown down."""
    tree, ops, _ = console_tree
    url = console_url(tree)
    sign_in(browser, url, "osup_ops_" + "x" * 43)
    refused = wait(
        browser, "the token refused", lambda d: _shown(d, '#banner[data-kind="refused"]')
    )
    assert isinstance(refused, WebElement) and "token refused" in refused.text
    assert _shown(browser, "#token-input") and not _shown(browser, "#panels")

    signed_in(browser, url, ops)
    assert not _shown(browser, "#banner")
    tree.stop()
    banner = wait(
        browser, "the tree unreachable", lambda d: _shown(d, '#banner[data-kind="unreachable"]')
    )
    assert isinstance(banner, WebElement)
    assert banner.text.startswith("tree unreachable — retrying")
    assert _shown(browser, '#link[data-link="down"]')
