"""Tool calling on every tool-reading chat template of the pinned llama.cpp source, Strata
against llama-server (``--jinja``) built from the same tree, both on the default model's
weights with each template as the chat template (Strata's ``chat_template`` config key,
llama-server's ``--chat-template-file``).

For each template: (c) ``tool_choice: "required"`` gives calls whose arguments validate
against the tool's schema, and streamed equals non-streamed; (d) a history holding the
server's own call and a tool result renders and is answered with no call markup in the
content (strata_core/testing/tool_corpus.py). Prints one row per template and the scores.

    python -m bench.tool_formats [--only NAME ...] [--skip-llama-server] [--llama-server PATH]
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import openai

from bench.launch import Flags, launch
from strata_core.ops.models import default_model_path
from strata_core.testing.templates import tool_templates
from strata_core.testing.tool_corpus import Outcome, check, server_config, write_templates

N_CTX = 4096


def strata_run(model: Path, templates: dict[str, Path], work: Path) -> dict[str, Outcome]:
    config = work / "strata.toml"
    config.write_text(server_config(model, templates, N_CTX))
    out = {}
    with launch("strata", Flags(backend="cpu", n_ctx=N_CTX), work / "strata.log", ["--config", str(config)]) as srv:
        api = openai.OpenAI(base_url=srv.base + "/v1", api_key="none", timeout=600, max_retries=0)
        for name in templates:
            out[name] = check(api, name)
            print(f"strata        {row(name, out[name])}", flush=True)
    return out


def llama_server_run(binary: str | None, model: Path, templates: dict[str, Path], work: Path) -> dict[str, Outcome]:
    out = {}
    for name, path in templates.items():
        flags = Flags(backend="cpu", model=str(model), n_ctx=N_CTX)
        extra = ["--jinja", "--chat-template-file", str(path)]
        try:
            with launch("llama-server", flags, work / "llama-server.log", extra, binary=binary) as srv:
                api = openai.OpenAI(base_url=srv.base + "/v1", api_key="none", timeout=600, max_retries=0)
                out[name] = check(api, name, model="model")
        except Exception as e:  # noqa: BLE001 - a template llama-server cannot load scores 0
            out[name] = Outcome(notes=[f"llama-server: {type(e).__name__}: {e}"])
        print(f"llama-server  {row(name, out[name])}", flush=True)
    return out


def row(name: str, o: Outcome) -> str:
    marks = "".join("+" if ok else "-" for ok in (o.required, o.streamed, o.history))
    return f"{name:52s} {marks}  {'; '.join(o.notes)[:300]}"


def score(results: dict[str, Outcome]) -> str:
    n = len(results)
    count = {k: sum(getattr(o, k) for o in results.values()) for k in ("required", "streamed", "history", "passed")}
    return (f"all three {count['passed']}/{n} (required {count['required']}, streamed {count['streamed']}, "
            f"history {count['history']})")  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--only", nargs="*", help="template file names (default: every one that reads tools)")
    ap.add_argument("--skip-llama-server", action="store_true")
    ap.add_argument("--llama-server", help="its binary (default: the one bench.peers builds)")
    args = ap.parse_args()
    names = args.only or tool_templates()
    with tempfile.TemporaryDirectory(prefix="tool-formats-") as tmp:
        work = Path(tmp)
        t0 = time.time()
        model, templates = default_model_path(), write_templates(work / "templates", names)
        strata = strata_run(model, templates, work)
        peer = None if args.skip_llama_server else llama_server_run(args.llama_server, model, templates, work)
        print(f"\n{len(names)} templates, {time.time() - t0:.0f} s")
        print(f"strata serve:          {score(strata)}")
        if peer is not None:
            print(f"llama-server --jinja:  {score(peer)}")


if __name__ == "__main__":
    main()
