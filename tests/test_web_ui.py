"""The web page at / (docs/web-ui.md) in a real browser: Debian's chromium driven by
Playwright, against one server on loopback with an API key and two models: ``chat`` (the
default model under a template that reads tools and, with ``enable_thinking``, opens
``<think>``) and ``vision`` (the default model with a random-weight image projector).

``STRATA_SCREENSHOTS=DIR`` makes the run save the pictures docs/web-ui.md shows there."""

from __future__ import annotations

import json
import os
import re
import shutil
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from strata_core.ops.build import EngineBuild
from strata_core.testing.harness import Server
from strata_core.testing.projector import write_vision_projector

pytestmark = pytest.mark.slow

sync_api = pytest.importorskip("playwright.sync_api", reason="playwright is not installed (pip install playwright)")
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
if CHROMIUM is None:
    pytest.skip("no chromium on PATH to drive (Debian: apt-get install chromium)", allow_module_level=True)

KEY = "web-test-key"
# Playwright starts the system browser: `playwright install` cannot download one here.
BROWSER_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                "--disable-background-networking", "--disable-component-update", "--disable-sync"]  # fmt: skip
SHOTS = os.environ.get("STRATA_SCREENSHOTS")
WAIT_MS = 300_000


@pytest.fixture(scope="module")
def web_server(cpu_engine: EngineBuild, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    from test_tools_e2e import TOOLS_TEMPLATE

    d = tmp_path_factory.mktemp("web")
    (d / "thinks.jinja").write_text(TOOLS_TEMPLATE)
    write_vision_projector(d / "mmproj.gguf", 576)  # the default model's embedding width
    (d / "strata.toml").write_text(f"""
[server]
api_key = "{KEY}"
[engine]
backend = "cpu"
[models.chat]
path = "default"
chat_template = "{d / 'thinks.jinja'}"
parallel = 2
n_ctx = 2048
[models.vision]
path = "default"
mmproj = "{d / 'mmproj.gguf'}"
parallel = 1
n_ctx = 1024
""")
    with Server(["--config", str(d / "strata.toml")], d / "server.log") as srv:
        yield srv


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    with sync_api.sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=BROWSER_ARGS)
        yield b
        b.close()


@pytest.fixture(scope="module")
def context(browser: Any) -> Iterator[Any]:
    """One browser profile for the module (its storage keeps the conversations), holding the key."""
    ctx = browser.new_context(viewport={"width": 1200, "height": 800})
    ctx.add_init_script(f"localStorage.getItem('strata.apiKey') || localStorage.setItem('strata.apiKey', '{KEY}')")
    yield ctx
    ctx.close()


@pytest.fixture()
def page(context: Any, web_server: Server) -> Iterator[Any]:
    pg = context.new_page()
    pg.set_default_timeout(WAIT_MS)
    pg.goto(web_server.base + "/")
    pg.wait_for_selector("#model option[value=chat]", state="attached")
    yield pg
    pg.close()


def new_chat(page: Any, model: str = "chat", **settings: Any) -> None:
    """A new conversation with ``settings`` (the settings form's fields)."""
    page.click("#new-chat")
    page.select_option("#model", model)
    page.click("#settings summary")
    for name, value in {"temperature": "", "top_p": "", "max_tokens": "", "seed": "", "think": False, "extra": "", **settings}.items():
        if name == "think":
            page.set_checked("[name=think]", bool(value))
        else:
            page.fill(f"#settings-form [name={name}]", str(value))
    page.click("#settings summary")


def say(page: Any, text: str) -> None:
    page.fill("#prompt", text)
    page.press("#prompt", "Enter")


def last_reply(page: Any) -> Any:
    return page.locator(".msg.assistant").last


def wait_done(page: Any) -> None:
    page.wait_for_selector("#stop", state="hidden")


def chat_status(server: Server) -> dict[str, Any]:
    r = httpx.get(f"{server.base}/v1/strata/status", headers={"authorization": f"Bearer {KEY}"}, timeout=10)
    return next(m for m in r.json()["models"] if m["name"] == "chat")  # type: ignore[no-any-return]


def shot(page: Any, name: str) -> None:
    if SHOTS:
        Path(SHOTS).mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(Path(SHOTS) / name))


def test_web_ui_off_is_404_and_on_serves_the_page() -> None:
    from fastapi import FastAPI
    from fastapi.testclient import TestClient

    from strata_core.api import web

    for on in (True, False):
        app = FastAPI()
        web.add_web_routes(app, on)
        client = TestClient(app)
        r = client.get("/", headers={"accept": "text/html,application/xhtml+xml,*/*;q=0.8"})
        assert r.status_code == (200 if on else 404)
        assert client.get("/").text == "Ollama is running"  # what Ollama's clients look for, either way
        assert client.get("/web/app.js").status_code == (200 if on else 404)
        if on:
            assert "<title>Strata</title>" in r.text
            assert client.get("/web/app.js").headers["content-type"].startswith("text/javascript")
            assert client.get("/web/..%2Fapi%2Fweb.py").status_code == 404
            assert client.get("/web/nothing.js").status_code == 404


def test_the_page_asks_for_the_api_key(browser: Any, web_server: Server) -> None:
    ctx = browser.new_context()
    pg = ctx.new_page()
    pg.goto(web_server.base + "/")
    pg.wait_for_selector("#key-dialog[open]")
    assert "API key" in pg.inner_text("#key-why")
    pg.fill("#key", KEY)
    pg.click("#key-ok")
    pg.wait_for_selector("#model option[value=vision]", state="attached")
    assert pg.evaluate("localStorage.getItem('strata.apiKey')") == KEY
    ctx.close()


def test_a_reply_streams_in_and_its_seed_can_be_reused(page: Any) -> None:
    new_chat(page, max_tokens=24, temperature=0.8, extra='{"ignore_eos": true}')
    say(page, "Write a short story about a lighthouse keeper.")
    # streamed: text shows while the reply is still running
    page.wait_for_function("""() => document.querySelector('.msg.assistant:last-child .content').textContent.length > 0
                              && !document.getElementById('stop').hidden""")
    wait_done(page)
    reply = last_reply(page)
    assert len(reply.locator(".content").inner_text()) > 20
    assert "finish:" in reply.locator(".meta").inner_text()
    seed = reply.locator(".meta button", has_text="seed").inner_text().split()[-1]
    reply.locator(".meta button", has_text="seed").click()
    assert page.input_value("#settings-form [name=seed]") == seed
    with page.expect_request("**/v1/chat/completions") as sent:
        reply.locator(".regenerate").click()
    assert f'"seed":{seed}' in (sent.value.post_data or "")  # a 64-bit seed goes back digit for digit
    wait_done(page)
    assert last_reply(page).locator(".meta button", has_text="seed").inner_text() == f"seed {seed}"
    assert page.locator("#conversations li.current").inner_text().startswith("Write a short story")


def test_reasoning_is_shown_apart_and_folded(page: Any) -> None:
    new_chat(page, max_tokens=30, think=True)
    say(page, "Explain in detail why the sky is blue.")  # greedy, it reasons at length (test_reasoning_budget_e2e)
    wait_done(page)
    fold = last_reply(page).locator("details.reasoning")
    assert fold.count() == 1 and not fold.evaluate("d => d.open")
    assert fold.locator("summary").inner_text() == "Reasoning"
    assert len(fold.evaluate("d => d.querySelector('div').textContent")) > 10
    assert "<think>" not in last_reply(page).inner_text()
    fold.locator("summary").click()
    assert fold.evaluate("d => d.open")
    shot(page, "web-ui-chat.png")


def test_tool_calls_are_shown_as_calls(page: Any) -> None:
    tool = {"type": "function", "function": {"name": "get_weather", "description": "The weather in a city",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}  # fmt: skip
    new_chat(page, max_tokens=60, extra=json.dumps({"tools": [tool], "tool_choice": "required", "parallel_tool_calls": False}))
    say(page, "What is the weather in Paris?")
    wait_done(page)
    call = last_reply(page).locator(".tool-call")
    assert call.locator("code").inner_text() == "get_weather"
    assert "city" in call.locator("pre").inner_text()
    assert "finish: tool_calls" in last_reply(page).locator(".meta").inner_text()


def test_an_image_goes_to_the_vision_model(page: Any) -> None:
    from test_media_e2e import RED

    new_chat(page, model="chat", max_tokens=12)
    assert page.is_hidden("#attach")  # the chat model takes no images
    page.select_option("#model", "vision")
    assert page.is_visible("#attach")
    page.set_input_files("#files", files=[{"name": "red.png", "mimeType": "image/png", "buffer": RED}])
    page.wait_for_selector("#attachments img")
    with page.expect_request("**/v1/chat/completions") as sent:
        say(page, "What is in this picture?")
    body = sent.value.post_data_json
    assert body["model"] == "vision"
    assert body["messages"][-1]["content"][1]["image_url"]["url"].startswith("data:image/png;base64,")
    wait_done(page)
    assert page.locator(".msg.user img").count() == 1
    reply = last_reply(page)
    assert reply.locator(".error").count() == 0
    assert re.search(r"\b([1-9]|1[0-2]) tokens", reply.locator(".meta").inner_text())


def test_stop_ends_a_generation_and_frees_its_slot(page: Any, web_server: Server) -> None:
    new_chat(page, max_tokens=1500, temperature=1.0, extra='{"ignore_eos": true}')  # runs until stopped
    say(page, "Count from one to a thousand in words.")
    page.wait_for_function("""() => document.getElementById('stop').hidden
                              || document.querySelector('.msg.assistant:last-child .content')?.textContent.length > 10""")
    assert page.is_visible("#stop"), last_reply(page).inner_text()  # still running
    page.click("#stop")
    wait_done(page)
    assert "stopped" in last_reply(page).locator(".meta").inner_text()
    assert page.locator(".msg.assistant .regenerate").count() == 1
    # the server cancels the request once the page hangs up: its slot is free again
    deadline = time.monotonic() + 30
    while (chat := chat_status(web_server))["busy"] and time.monotonic() < deadline:
        time.sleep(0.2)
    assert chat["busy"] == 0, chat
    assert chat["requests"]["cancelled"] >= 1, chat


def test_a_reload_finds_the_conversation(page: Any) -> None:
    new_chat(page, max_tokens=8)
    say(page, "Remember the word marmalade.")
    wait_done(page)
    page.reload()
    item = page.locator("#conversations li", has_text="Remember the word marmalade")
    assert item.count() >= 1
    page.click("#new-chat")
    item.first.locator(".open").click()
    assert page.locator(".msg.user").first.inner_text() == "Remember the word marmalade."
    assert page.locator(".msg.assistant").count() == 1


def test_errors_show_their_message(page: Any) -> None:
    new_chat(page, temperature=5)
    say(page, "Hello")
    err = last_reply(page).locator(".error")
    err.wait_for()
    assert "temperature" in err.inner_text()
    # a stream that stops without [DONE] or an error event: the page says it was cut off
    chunk = '{"choices": [{"index": 0, "delta": {"content": "Half a rep"}, "finish_reason": null}]}'
    page.route("**/v1/chat/completions",
               lambda route: route.fulfill(status=200, content_type="text/event-stream", body=f"data: {chunk}\n\n"))  # fmt: skip
    new_chat(page)
    say(page, "Hello again")
    wait_done(page)
    assert last_reply(page).locator(".content").inner_text() == "Half a rep"
    assert "cut off" in last_reply(page).locator(".error").inner_text()


def test_the_server_view_shows_slots_filling_under_load(page: Any, web_server: Server) -> None:
    page.goto(web_server.base + "/#server")
    busy = page.locator(".model[data-model=chat] .slots-busy")
    busy.wait_for()
    page.wait_for_function("document.querySelector('.model[data-model=chat] .slots-busy').textContent === '0 / 2'")

    def load() -> None:  # seconds of work each: the page's 1 s poll sees the slots busy
        body = {"model": "chat", "messages": [{"role": "user", "content": "Tell me a long story."}],
                "max_tokens": 120, "temperature": 1.0, "ignore_eos": True}  # fmt: skip
        httpx.post(f"{web_server.base}/v1/chat/completions", json=body, timeout=300,
                   headers={"authorization": f"Bearer {KEY}"})  # fmt: skip

    threads = [threading.Thread(target=load) for _ in range(3)]
    for t in threads:
        t.start()
    page.wait_for_function("document.querySelector('.model[data-model=chat] .slots-busy').textContent === '2 / 2'")
    assert page.locator(".model[data-model=chat] .slot.busy").count() == 2
    page.wait_for_function("document.querySelector('.model[data-model=chat] h3').textContent.includes('queue 1')")
    page.wait_for_function("document.querySelector('.model[data-model=chat] .plot path').getAttribute('d').length > 0")
    if SHOTS:  # a picture with a few seconds of history in its plots
        page.wait_for_function("""(document.querySelector('.model[data-model=chat] .plot path')
                                  .getAttribute('d').match(/L/g) || []).length >= 2""")
        shot(page, "web-ui-server.png")
    for t in threads:
        t.join()
    page.wait_for_function("document.querySelector('.model[data-model=chat] .slots-busy').textContent === '0 / 2'")


def test_a_narrow_window_keeps_the_page_usable(browser: Any, web_server: Server) -> None:
    ctx = browser.new_context(viewport={"width": 360, "height": 720})
    ctx.add_init_script(f"localStorage.setItem('strata.apiKey', '{KEY}')")
    pg = ctx.new_page()
    pg.goto(web_server.base + "/")
    pg.wait_for_selector("#model option[value=chat]", state="attached")
    assert pg.evaluate("document.documentElement.scrollWidth <= window.innerWidth")
    assert pg.is_hidden("#sidebar") or pg.evaluate("document.getElementById('sidebar').getBoundingClientRect().right <= 0")
    assert pg.is_visible("#prompt") and pg.is_visible("#send")
    pg.click("#menu")
    pg.wait_for_function("document.getElementById('sidebar').getBoundingClientRect().left >= 0")
    pg.goto(web_server.base + "/#server")
    pg.wait_for_selector(".model[data-model=chat] .slots-busy")
    assert pg.evaluate("document.documentElement.scrollWidth <= window.innerWidth")
    ctx.close()


def test_the_status_route_reads_the_figures_metrics_exports(web_server: Server) -> None:
    auth = {"authorization": f"Bearer {KEY}"}
    body = {"model": "chat", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4}
    assert httpx.post(f"{web_server.base}/v1/chat/completions", json=body, headers=auth, timeout=120).status_code == 200
    chat = chat_status(web_server)
    text = httpx.get(f"{web_server.base}/metrics", params={"model": "chat"}, timeout=10).text
    series = dict(line.rsplit(" ", 1) for line in text.splitlines() if line.startswith("strata_") and "{" not in line)
    assert chat["requests"]["total"] == int(series["strata_requests_total"]) > 0
    assert chat["tokens_generated"] == int(series["strata_generation_tokens_total"]) > 0
    assert chat["prompt_cache"]["prompt_tokens"] == int(series["strata_prompt_tokens_total"])
    assert chat["prompt_cache"]["cached_tokens"] == int(series["strata_cached_prompt_tokens_total"])
    assert chat["requests"]["cancelled"] == int(series["strata_requests_cancelled_total"])
    assert (chat["busy"], chat["queue"]) == (int(series["strata_busy_slots"]), int(series["strata_queue_depth"]))
    assert len(chat["slots"]) == 2 and chat["state"] == "ready"
