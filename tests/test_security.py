"""Issue 14, item 6: the API key (bearer or x-api-key), the warning for a server open to the
network without one, and chat templates kept in their sandbox."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from strata_core.ops.build import EngineBuild
from strata_core.ops.cli import exposure_warning
from strata_core.ops.config import load_config
from strata_core.text.chat import ChatTemplate, TemplateError

KEY = "sekret-key"
#: ChatML, but a message "escape" makes the template reach for Python's object graph.
ESCAPING_TEMPLATE = (
    "{% for message in messages %}"
    "{% if message['content'] == 'escape' %}{{ ''.__class__.__mro__[1].__subclasses__() }}{% endif %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


@pytest.mark.parametrize("source", [
    "{{ ''.__class__.__mro__ }}",
    "{{ messages.__class__.__init__.__globals__ }}",
])  # fmt: skip
def test_a_template_cannot_leave_its_sandbox(source: str) -> None:
    with pytest.raises(TemplateError) as exc:
        ChatTemplate(source).render([{"role": "user", "content": "hi"}])
    assert "<class" not in str(exc.value) and "<built-in" not in str(exc.value), exc.value


def test_an_unsafe_attribute_alone_renders_as_nothing() -> None:
    # As in transformers' sandbox: undefined, which prints empty; using it further raises.
    out = ChatTemplate("[{{ raise_exception.__globals__ }}{{ strftime_now.__code__ }}]").render([])
    assert out == "[]"


def test_serving_beyond_loopback_without_a_key_warns() -> None:
    def warning(host: str, key: str | None = None) -> str | None:
        return exposure_warning(load_config(env={}, overrides={"server": {"host": host, "api_key": key}}))

    assert warning("127.0.0.1") is None and warning("localhost") is None and warning("::1") is None
    assert warning("0.0.0.0", key=KEY) is None
    for host in ("0.0.0.0", "::", "192.168.1.5"):
        text = warning(host)
        assert text is not None and host in text and "api_key" in text


def test_strata_serve_prints_the_warning(tmp_path: Path) -> None:
    """Printed before anything loads: a model that does not exist ends the run right after."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("STRATA_SERVER_")}
    cmd = [sys.executable, "-m", "strata_core.ops.cli", "serve", "--model", str(tmp_path / "none.gguf")]
    run = subprocess.run([*cmd, "--host", "0.0.0.0"], capture_output=True, text=True, env=env, timeout=120)
    assert run.returncode != 0 and "without an API key" in run.stderr, run.stderr
    keyed = subprocess.run([*cmd, "--host", "0.0.0.0"], capture_output=True, text=True, timeout=120,
                           env={**env, "STRATA_SERVER_API_KEY": KEY})  # fmt: skip
    assert keyed.returncode != 0 and "without an API key" not in keyed.stderr, keyed.stderr


@pytest.fixture(scope="module")
def keyed_server(cpu_engine: EngineBuild, default_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    from strata_core.testing.harness import Server
    from strata_core.testing.models import write_with_template

    d = tmp_path_factory.mktemp("security")
    model = d / "escaping-template.gguf"
    write_with_template(default_model, model, ESCAPING_TEMPLATE)
    args = ["--backend", "cpu", "--parallel", "1", "--n-ctx", "512", "--model", str(model)]
    with Server(args, d / "server.log", env={"STRATA_SERVER_API_KEY": KEY}) as srv:
        yield srv.base


def chat(base: str, content: str, headers: dict[str, str]) -> httpx.Response:
    body = {"messages": [{"role": "user", "content": content}], "max_tokens": 2}
    return httpx.post(f"{base}/v1/chat/completions", json=body, headers=headers, timeout=120)


@pytest.mark.slow
def test_the_key_as_bearer_or_x_api_key(keyed_server: str) -> None:
    assert httpx.get(f"{keyed_server}/health").status_code == 200  # probes need no key
    for headers in ({}, {"authorization": f"Bearer {KEY}x"}, {"x-api-key": KEY[:-1]}, {"authorization": KEY},
                    {"authorization": f"Basic {KEY}", "x-api-key": ""}):  # fmt: skip
        r = chat(keyed_server, "hi", headers)
        assert r.status_code == 401, (headers, r.text)
        assert r.json()["error"]["code"] == "invalid_api_key"
    for headers in ({"authorization": f"Bearer {KEY}"}, {"authorization": f"bearer {KEY}"}, {"x-api-key": KEY}):
        r = chat(keyed_server, "hi", headers)
        assert r.status_code == 200, (headers, r.text)


@pytest.mark.slow
def test_a_template_reaching_for_python_gets_a_clean_400(keyed_server: str) -> None:
    auth = {"x-api-key": KEY}
    r = chat(keyed_server, "escape", auth)
    assert r.status_code == 400, r.text
    e = r.json()["error"]
    assert e["param"] == "messages" and "chat template" in e["message"], e
    assert "subclasses" not in e["message"] and "<class" not in e["message"], e
    assert chat(keyed_server, "hi", auth).status_code == 200
