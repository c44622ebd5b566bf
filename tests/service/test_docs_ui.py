"""``/docs`` in a real headless Chromium against ``kestrel serve --demo``, as a new user meets it.

The page must render from the server's own assets (the machine may have no internet access, and
CI has none): every request the page makes goes to the server. A user then scores the demo model
through Swagger UI's "Try it out". The docs routes are also checked over plain HTTP: readable
without the admin token, and counted in ``/metrics`` under their route template.

Needs Debian's ``chromium`` and ``chromium-driver``: ``bash .ci/install-tools chromium``.
"""

from __future__ import annotations

import json
import re
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

import pytest
from selenium import webdriver
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.common.keys import Keys
from selenium.webdriver.remote.webdriver import WebDriver
from selenium.webdriver.remote.webelement import WebElement
from selenium.webdriver.support.wait import WebDriverWait

from tests.service.live import LiveServer

CHROMIUM = Path("/usr/bin/chromium")
CHROMEDRIVER = Path("/usr/bin/chromedriver")
# Nothing in the background may reach for the network (there is none to reach on CI).
CHROMIUM_FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
)
# Upper bounds on waiting for the page and the demo model, never expectations.
PAGE_WAIT_S = 60
DEMO_WAIT_S = 120
IRIS_ROW = {"sepal_length": 5.1, "sepal_width": 3.5, "petal_length": 1.4, "petal_width": 0.2}
PREDICT = "/models/{name}/predict"


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    """``kestrel serve --demo`` (with an admin token, which the docs must not need), its iris
    model READY."""
    live = LiveServer(tmp_path_factory.mktemp("docs-ui"), KESTREL_DEMO_MODEL="true").start()
    try:
        deadline = time.monotonic() + DEMO_WAIT_S
        while live.client.get("/v2/models/iris/ready").status_code != 200:
            assert time.monotonic() < deadline, f"the demo model is not READY:\n{live.logs()}"
            time.sleep(0.1)
        yield live
    finally:
        live.stop()


@pytest.fixture
def browser(tmp_path: Path) -> Iterator[WebDriver]:
    """Headless Chromium with a new empty profile, logging every request it sends."""
    missing = [str(p) for p in (CHROMIUM, CHROMEDRIVER) if not p.exists()]
    if missing:
        pytest.fail(
            f"{' and '.join(missing)} not found: install Debian's chromium and chromium-driver "
            "with `bash .ci/install-tools chromium`"
        )
    options = webdriver.ChromeOptions()
    options.binary_location = str(CHROMIUM)
    for flag in CHROMIUM_FLAGS:
        options.add_argument(flag)
    options.add_argument(f"--user-data-dir={tmp_path / 'chromium-profile'}")
    options.add_argument("--window-size=1280,2000")
    options.set_capability("goog:loggingPrefs", {"performance": "ALL"})
    driver = webdriver.Chrome(options=options, service=Service(str(CHROMEDRIVER)))
    try:
        yield driver
    finally:
        driver.quit()


def requested_urls(driver: WebDriver) -> list[str]:
    """The http(s) URLs the browser requested since the last call (the DevTools network log)."""
    urls = []
    for entry in driver.get_log("performance"):
        message = json.loads(entry["message"])["message"]
        if message["method"] == "Network.requestWillBeSent":
            url = message["params"]["request"]["url"]
            if urlsplit(url).scheme in ("http", "https"):
                urls.append(url)
    return urls


def visible(driver: WebDriver, css: str, within: WebElement | None = None) -> WebElement:
    """The first element matching ``css`` once it is displayed."""
    root = within or driver
    return WebDriverWait(driver, PAGE_WAIT_S).until(
        lambda _: next(
            (e for e in root.find_elements(By.CSS_SELECTOR, css) if e.is_displayed()), False
        ),
        message=f"nothing displayed matches {css!r}",
    )


def test_docs_render_from_the_servers_own_assets(demo: LiveServer, browser: WebDriver) -> None:
    browser.get(f"{demo.url}/docs")
    visible(browser, ".opblock")
    paths = {
        e.get_attribute("data-path")
        for e in browser.find_elements(By.CSS_SELECTOR, ".opblock-summary-path")
    }
    assert {"/healthz", "/models", PREDICT, "/v2/models/{name}/infer"} <= paths, paths
    assert browser.find_elements(By.CSS_SELECTOR, ".swagger-ui .errors-wrapper") == []

    urls = requested_urls(browser)
    elsewhere = [url for url in urls if not url.startswith(f"{demo.url}/")]
    assert not elsewhere, f"/docs reached beyond the server: {elsewhere}"
    assert f"{demo.url}/docs/static/swagger-ui-bundle.js" in urls
    assert f"{demo.url}/openapi.json" in urls


def test_try_it_out_scores_the_demo_model(demo: LiveServer, browser: WebDriver) -> None:
    scored = demo.metric("kestrel_requests_total", route=PREDICT, status="200")
    browser.get(f"{demo.url}/docs")
    summary = visible(browser, f'.opblock-post .opblock-summary-path[data-path="{PREDICT}"]')
    operation = summary.find_element(By.XPATH, "./ancestor::div[contains(@class, 'opblock ')]")
    summary.click()  # expand the operation

    visible(browser, "button.try-out__btn", operation).click()
    name = visible(browser, 'tr[data-param-name="name"] input', operation)
    name.send_keys("iris")
    body = visible(browser, "textarea.body-param__text", operation)
    body.send_keys(Keys.CONTROL, "a")
    body.send_keys(Keys.DELETE)
    body.send_keys(json.dumps([IRIS_ROW]))
    visible(browser, "button.execute", operation).click()

    status = visible(browser, ".live-responses-table .response .response-col_status", operation)
    answer = visible(browser, ".live-responses-table .response-col_description pre", operation)
    assert status.text.strip() == "200", answer.text
    assert json.loads(answer.text)["outputs"]["predict"] == ["setosa"]
    url = visible(browser, ".request-url pre", operation).text
    assert url == f"{demo.url}/models/iris/predict"
    # The server scored it (through the scoring fast path; the route label is the template).
    assert demo.metric("kestrel_requests_total", route=PREDICT, status="200") == scored + 1


DOCS_ROUTES = {
    "/docs": "/docs",
    "/docs/oauth2-redirect": "/docs/oauth2-redirect",
    "/openapi.json": "/openapi.json",
    "/docs/static/swagger-ui-bundle.js": "/docs/static/{path}",
    "/docs/static/swagger-ui.css": "/docs/static/{path}",
    "/docs/static/favicon.png": "/docs/static/{path}",
}


def test_docs_routes_are_public_offline_and_counted_by_template(demo: LiveServer) -> None:
    fetches = Counter(DOCS_ROUTES.values())
    before = {
        route: demo.metric("kestrel_requests_total", route=route, status="200") for route in fetches
    }
    unmatched = demo.metric("kestrel_requests_total", route="unmatched")
    for path in DOCS_ROUTES:
        r = demo.client.get(path)  # no token: the server has an admin token, the docs need none
        assert r.status_code == 200, (path, r.text[:200])
        if r.headers["content-type"].startswith("text/html"):
            hosts = re.findall(r"(?:src|href)=[\"']?(\w+:)?//", r.text)
            assert not hosts, f"{path} loads from another host: {r.text}"
    for route, count in fetches.items():
        after = demo.metric("kestrel_requests_total", route=route, status="200")
        assert after == before[route] + count, route
    assert demo.metric("kestrel_requests_total", route="unmatched") == unmatched
    # Not served: ReDoc's bundle loads its logo from its CDN.
    assert demo.client.get("/redoc").status_code == 404
