"""[models.NAME] and [cluster] tables: what a model's engine sees, and errors naming the key."""

from __future__ import annotations

from pathlib import Path

import pytest

from strata_core.ops.config import ConfigError, load_config


def load(tmp_path: Path, text: str):  # type: ignore[no-untyped-def]
    path = tmp_path / "strata.toml"
    path.write_text(text)
    return load_config(path, env={})


def test_a_model_table_overrides_engine_and_speculative(tmp_path: Path) -> None:
    cfg = load(tmp_path, """
[engine]
backend = "cuda"
n_ctx = 2048
parallel = 8
[speculative]
mode = "ngram"
[models.big]
path = "/m/big.gguf"
[models.small]
path = "default"
backend = "cpu"
n_ctx = 512
[models.small.speculative]
mode = "off"
""")  # fmt: skip
    big, small = cfg.for_model("big"), cfg.for_model("small")
    assert (big.engine.model, big.engine.backend, big.engine.n_ctx, big.speculative.mode) == (
        "/m/big.gguf", "cuda", 2048, "ngram")  # fmt: skip
    assert (small.engine.model, small.engine.backend, small.engine.n_ctx, small.engine.parallel) == (
        "default", "cpu", 512, 8)  # fmt: skip
    assert small.speculative.mode == "off" and small.models == {}
    assert list(cfg.models) == ["big", "small"]  # the first is the default model


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('[models.a]\npath = "x"\nbogus = 1\n', "[models.a] unknown key 'bogus' (known: path, backend"),
        ('[models.a]\npath = "x"\n[models.a.speculative]\nmod = 1\n', "[models.a.speculative] unknown key 'mod' (known: mode"),
        ("[models.a]\nn_ctx = 512\n", "models.a.path"),
        ("[cluster]\nmin_replicas = 1\n", "needs both min_replicas and max_replicas"),
        ("[cluster]\nmin_replicas = 3\nmax_replicas = 2\n", "min_replicas = 3 is above max_replicas = 2"),
    ],
)
def test_errors_name_the_table_and_key(tmp_path: Path, text: str, message: str) -> None:
    with pytest.raises(ConfigError) as exc:
        load(tmp_path, text)
    assert message in str(exc.value)
