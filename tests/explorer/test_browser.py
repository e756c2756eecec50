"""A real browser on the explorer: Playwright drives Debian's Chromium against `memstore serve`
(a real server process) over the demo store, checks what a person sees and follows the links,
and saves screenshots (the path is printed; set MEMSTORE_SCREENSHOTS to choose it).

Chromium is found at $MEMSTORE_CHROMIUM or /usr/bin/chromium (`apt-get install -y chromium`).
Without Playwright or Chromium the test is skipped, except in CI (CI=true), where it fails.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from memstore.demo import write_demo_store

# A real Chromium driven through every page.
pytestmark = pytest.mark.slow

CHROMIUM = os.environ.get("MEMSTORE_CHROMIUM", "/usr/bin/chromium")
ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


def _requirements():
    missing = []
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        missing.append("playwright (pip install -e '.[test]')")
    if not os.access(CHROMIUM, os.X_OK):
        missing.append(f"{CHROMIUM} (apt-get install -y chromium)")
    if missing:
        message = "browser test needs " + " and ".join(missing)
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    _requirements()
    root = tmp_path_factory.mktemp("browser") / "store"
    write_demo_store(root)
    port = _free_port()
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    proc = subprocess.Popen(
        [sys.executable, "-m", "memstore", "serve", "--root", str(root), "--port", str(port)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        env=env,
    )
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                with urllib.request.urlopen(base + "/-/memstore.json", timeout=2) as response:
                    if response.status == 200:
                        break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"memstore serve did not start: {proc.stdout.read().decode()[-2000:]}") from None
                time.sleep(0.2)
        yield base
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


SCREENSHOTS = Path(__file__).resolve().parents[2] / "docs" / "screenshots"


def _no_page_overflow(page) -> bool:
    return page.evaluate("document.documentElement.scrollWidth <= window.innerWidth")


def test_a_person_browses_the_demo_store(server, tmp_path):
    from playwright.sync_api import sync_playwright

    shots = Path(os.environ.get("MEMSTORE_SCREENSHOTS") or tmp_path / "screenshots")
    shots.mkdir(parents=True, exist_ok=True)
    print(f"\nscreenshots: {shots}")
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        try:
            page = browser.new_page(viewport={"width": 1280, "height": 900})
            requests = []
            page.on("request", lambda r: requests.append(r.url))
            errors = []
            page.on("pageerror", lambda e: errors.append(str(e)))

            # Home: totals, cost, the chart, the list of sessions.
            page.goto(server + "/-/memstore")
            assert page.title().startswith("Sessions")
            assert page.locator("h1").inner_text() == "Sessions"
            assert "30" in page.locator(".card").first.inner_text()
            assert "estimated" in page.locator(".card.cost").inner_text()
            chart = page.locator("svg.ms-chart")
            assert chart.count() == 1 and chart.locator("rect").count() > 20
            assert chart.locator("text.unit").all_text_contents() == ["tokens", "day (UTC, MM-DD)"]
            rows = page.locator("table.sessions tbody tr")
            assert rows.count() == 30
            page.screenshot(path=str(shots / "home.png"), full_page=True)

            # Filters: an agent, then a directory; each one is in the URL.
            page.select_option("select[name=agent]", "codex")
            page.click("form.filters button[type=submit]")
            assert page.locator("table.sessions tbody tr").count() == 1
            assert "agent=codex" in page.url
            page.goto(server + "/-/memstore")
            page.select_option("select[name=agent]", "vtcode")
            page.fill("input[name=since]", "2026-11-10")
            page.click("form.filters button[type=submit]")
            assert "agent=vtcode" in page.url and "since=2026-11-10" in page.url
            filtered = page.locator("table.sessions tbody tr").count()
            assert 0 < filtered < 30
            # Sorting by a column: click its header, twice for the other way.
            page.click("table.sessions th a >> text=Turns")
            counts = [int(t) for t in page.locator("table.sessions tbody tr td:nth-child(4)").all_inner_texts()]
            assert counts == sorted(counts, reverse=True) and "sort=turns" in page.url and "agent=vtcode" in page.url
            page.click("table.sessions th a >> text=Turns")
            counts = [int(t) for t in page.locator("table.sessions tbody tr td:nth-child(4)").all_inner_texts()]
            assert counts == sorted(counts) and "order=asc" in page.url
            # Keyboard: j moves to the first row, Enter opens it.
            page.keyboard.press("j")
            page.keyboard.press("j")
            current = page.locator("tr.nav-current")
            assert current.count() == 1
            expected = current.locator("a").first.get_attribute("href")
            page.keyboard.press("Enter")
            page.wait_for_url("**" + expected)

            # The cost chart, in dollars with its price table.
            page.goto(server + "/-/memstore?chart=cost")
            assert "USD (estimated)" in page.locator("svg.ms-chart").inner_html()
            page.goto(server + "/-/memstore")

            # A VT Code session: each turn's prompt, and the command that resumes it.
            page.click("table.sessions a[href*='/sessions/vt-']")
            assert all(p.strip() for p in page.locator("table.turns tbody tr td.prompt").all_inner_texts())
            assert page.locator("#resume-command").inner_text().startswith("cd ")
            assert "vtcode --resume vt-" in page.locator("#resume-command").inner_text()
            page.goto(server + "/-/memstore")

            # A session: follow its link from the list.
            page.click("table.sessions a[href$='/sessions/demo']")
            assert page.locator("h1").inner_text() == "Session demo"
            assert page.locator("table.turns tbody tr").count() == 3
            assert page.locator("svg.ms-chart").count() == 1
            page.screenshot(path=str(shots / "session.png"), full_page=True)

            # A turn: the failing test run, its output and exit code.
            page.click("table.turns a >> text='1'")
            assert page.locator("h1").inner_text() == "Turn 1"
            command = page.locator("article.kind-command")
            assert "$ cargo test" in command.inner_text() and "exit 101" in command.inner_text()
            assert "append_roundtrip ... FAILED" in command.locator("pre").inner_text()
            page.screenshot(path=str(shots / "turn.png"), full_page=True)

            # The event page: the exact line.
            page.click("article.kind-command a.seq")
            assert page.locator("h1").inner_text().startswith("Event 6")
            assert '"command":"cargo test"' in page.locator("#line").inner_text()
            page.screenshot(path=str(shots / "event.png"), full_page=True)

            # The fix's diff reads line for line: as many lines of text as the diff has, no blank ones.
            page.goto(server + "/-/memstore/sessions/demo/turns/2")
            diff = page.locator("pre.diff").first
            lines = diff.inner_text().rstrip("\n").split("\n")
            assert len(lines) == diff.locator("span.dl").count() and "" not in lines
            line_height = float(
                page.evaluate("parseFloat(getComputedStyle(document.querySelector('pre.diff')).lineHeight)")
            )
            box = diff.bounding_box()
            assert box is not None and box["height"] < (len(lines) + 2) * line_height

            # Search from the nav bar, page through the hits, filter them, follow one to its turn.
            page.fill("nav.ms-nav input[name=q]", "cargo test")
            page.press("nav.ms-nav input[name=q]", "Enter")
            page.wait_for_selector(".search-result")
            summary = page.locator("p.muted", has_text="hits").first.inner_text()
            total = int(summary.split(" hits")[0].replace(",", ""))
            assert total > 20 and page.locator(".search-result").count() == 20
            first_page = page.locator(".search-result").all_inner_texts()
            page.click(".pager a[rel=next]")
            assert "page=2" in page.url and page.locator(".search-result").count() > 0
            assert not set(page.locator(".search-result").all_inner_texts()) & set(first_page)
            page.select_option("select[name=agent]", "codex")
            page.click("form.filters button[type=submit]")
            assert "agent=codex" in page.url
            assert all(
                t.startswith("codex-")
                for t in page.locator(".search-result > div:first-child a").first.all_inner_texts()
            )
            page.goto(server + "/-/memstore/search?q=clippy")
            assert page.locator(".search-result mark").count() >= 1
            page.screenshot(path=str(shots / "search.png"), full_page=True)
            page.keyboard.press("j")
            page.keyboard.press("Enter")
            page.wait_for_load_state()
            assert page.locator("h1").inner_text().startswith("Turn")
            assert "clippy" in page.locator("section.content").inner_text()

            # Nothing was fetched from anywhere but the server, and no script failed.
            assert all(url.startswith(server) for url in requests), [u for u in requests if not u.startswith(server)]
            assert not errors
            page.close()

            # Dark mode follows the browser's preference.
            dark = browser.new_page(viewport={"width": 1280, "height": 900}, color_scheme="dark")
            dark.goto(server + "/-/memstore/sessions/demo/turns/2")
            background = dark.evaluate("getComputedStyle(document.body).backgroundColor")
            assert background == "rgb(22, 24, 28)", background
            dark.screenshot(path=str(shots / "dark.png"), full_page=False)
            dark.close()

            # At phone width (390 px) no page scrolls sideways: wide tables scroll in their box.
            phone = browser.new_page(viewport={"width": 390, "height": 844}, is_mobile=True)
            for path in (
                "/-/memstore",
                "/-/memstore/sessions/demo",
                "/-/memstore/sessions/demo/turns/2",
                "/-/memstore/search?q=cargo+test",
                "/-/memstore/sessions/demo/events/6",
            ):
                phone.goto(server + path)
                assert _no_page_overflow(phone), path
            phone.goto(server + "/-/memstore")
            phone.screenshot(path=str(shots / "phone.png"), full_page=False)
            phone.close()
        finally:
            browser.close()
    for name in ("home", "session", "turn", "event", "search", "dark", "phone"):
        assert (shots / f"{name}.png").stat().st_size > 10_000
