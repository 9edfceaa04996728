"""A model's GGUF metadata setting its defaults (strata_core/ops/catalog.py, api/launch.py):
the trained context caps n_ctx, the facts listed, a chat template file per model."""

from __future__ import annotations

from pathlib import Path

import pytest

from strata_core.api.launch import context_for, log_for, template_file
from strata_core.ops.catalog import gguf_facts
from strata_core.ops.config import ConfigError, load_config
from strata_core.testing.models import SHAPES, write_random, write_tokenizer


@pytest.fixture(scope="module")
def tiny(default_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("tiny")
    write_tokenizer(default_model, d / "tok.gguf")
    write_random(d / "tok.gguf", d / "tiny.gguf", SHAPES["tiny"], n_ctx=512)
    return d / "tiny.gguf"


def test_facts_from_the_gguf(tiny: Path, default_model: Path) -> None:
    f = gguf_facts(tiny)
    assert (f.architecture, f.context_length, f.file_type) == ("llama", 512, "F16")
    assert f.chat_template and "im_start" in f.chat_template  # the tokenizer's, copied
    assert f.parameters is not None and 3_000_000 < f.parameters < 4_000_000  # 49152 x 64 embeddings and a bit
    d = gguf_facts(default_model)
    assert (d.architecture, d.context_length, d.file_type) == ("llama", 8192, "Q4_1")
    with pytest.raises(ValueError, match="not a readable GGUF"):
        gguf_facts(Path(__file__))


def test_n_ctx_is_capped_at_the_trained_context(tiny: Path) -> None:
    assert context_for(tiny, 4096) == 512
    assert context_for(tiny, 256) == 256


def test_chat_template_file(tmp_path: Path) -> None:
    good = tmp_path / "t.jinja"
    good.write_text("{% for m in messages %}<{{ m.role }}>{{ m.content }}{% endfor %}")
    assert template_file(str(good)) == good.read_text()
    assert template_file(None) is None
    with pytest.raises(ConfigError, match="chat_template = .*cannot read it"):
        template_file(str(tmp_path / "missing.jinja"))
    bad = tmp_path / "bad.jinja"
    bad.write_text("{% for m in messages %}")
    with pytest.raises(ConfigError, match="chat_template = .*syntax error"):
        template_file(str(bad))
    tool_use = tmp_path / "tool_use.jinja"  # renders only with tools, as the tool_use variants do
    tool_use.write_text("{% for t in tools %}{{ t.function.name }}{% endfor %}{{ messages[0].content }}")
    assert template_file(str(tool_use)) == tool_use.read_text()
    broken = tmp_path / "broken.jinja"
    broken.write_text("{{ messages[0].content + 1 }}")
    with pytest.raises(ConfigError, match="chat_template = "):
        template_file(str(broken))
    cfg = tmp_path / "s.toml"
    cfg.write_text(f'[models.a]\npath = "default"\nchat_template = "{good}"\n[server]\ncatalog = true\n')
    loaded = load_config(cfg, env={})
    assert loaded.for_model("a").engine.chat_template == str(good) and loaded.server.catalog


def test_catalog_models_log_to_files_named_safely(tmp_path: Path) -> None:
    path = log_for(tmp_path / "engine.log", ["a", "catalog"])("owner/Repo-GGUF:Q4_K_M")
    assert path == tmp_path / "engine-owner_Repo-GGUF_Q4_K_M.log"
