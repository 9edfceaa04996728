"""OpenAI's ``POST /v1/embeddings``: one vector per input (a string or token ids), pooled
by the engine's embeddings context (docs/architecture.md, "Embeddings") and L2-normalised
here, as OpenAI's are and as llama-server's ``/v1/embeddings`` are; written as floats or,
with ``encoding_format`` base64, as the base64 of float32 little-endian bytes (what the
openai SDK asks for by default and decodes itself)."""

from __future__ import annotations

import base64
from typing import Any, Literal

import numpy as np
import numpy.typing as npt
from fastapi import APIRouter, Request
from pydantic import Field, field_validator

from strata_core.api import openapi
from strata_core.api.service import Service, engine_work, json_body, service_for
from strata_core.schema.errors import ApiError
from strata_core.schema.requests import Prompt, Strict, invalid, parse_request, token_ids

router = APIRouter()

#: Most inputs one request may carry (OpenAI's limit).
MAX_INPUTS = 2048

Input = Prompt


class EmbeddingRequest(Strict):
    input: Input
    model: str | None = None
    encoding_format: Literal["float", "base64"] = "float"
    #: only the model's own width: a GGUF does not say its vectors may be shortened
    dimensions: int | None = Field(default=None, ge=1)
    user: str | None = None

    @field_validator("input", mode="plain", json_schema_input_type=Input)
    @classmethod
    def _input(cls, value: Any) -> Input:
        if isinstance(value, str):
            if not value:
                raise invalid("input must not be empty")
            return value
        if not isinstance(value, list):
            raise invalid("expected a string, a list of strings, a list of token ids or a list of lists "
                          "of token ids", "invalid_type")  # fmt: skip
        if not value:
            raise invalid("input must not be empty")
        if len(value) > MAX_INPUTS:
            raise invalid(f"at most {MAX_INPUTS} inputs, got {len(value)}")
        if all(isinstance(p, str) for p in value):
            if not all(value):
                raise invalid("input strings must not be empty")
            return value
        if all(isinstance(p, list) for p in value):
            return [token_ids(p) for p in value]
        return token_ids(value)


REPLY = {
    "type": "object",
    "required": ["object", "data", "model", "usage"],
    "properties": {
        "object": {"const": "list"},
        "data": {"type": "array", "items": {
            "type": "object", "required": ["object", "index", "embedding"],
            "properties": {"object": {"const": "embedding"}, "index": {"type": "integer"},
                           "embedding": {"anyOf": [{"type": "array", "items": {"type": "number"}},
                                                   {"type": "string"}]}}}},
        "model": {"type": "string"},
        "usage": {"type": "object", "required": ["prompt_tokens", "total_tokens"]},
    },
}  # fmt: skip


@router.post("/v1/embeddings", **openapi.route(EmbeddingRequest, "embeddings of inputs", REPLY, stream=False))
async def embeddings(request: Request) -> dict[str, Any]:
    req = parse_request(EmbeddingRequest, await json_body(request))
    service = await service_for(request, req.model)
    service.ready()
    info = service.engine.info
    if "embeddings" not in info.get("capabilities", ()):
        raise ApiError(400, "this model gives no embeddings (it is a ranker, pooling rank)", param="model",
                       code="unsupported_value")  # fmt: skip
    n_embd = int(info["n_embd"])
    if req.dimensions is not None and req.dimensions != n_embd:
        raise ApiError(400, f"this model's embeddings have {n_embd} dimensions and cannot be shortened (its GGUF "
                       "does not say it was trained for that); leave dimensions out", param="dimensions",
                       code="unsupported_value")  # fmt: skip
    inputs = await token_inputs(service, req.input)
    vectors = await engine_work(request, service, embed_all(service, inputs))
    n = sum(map(len, inputs))
    service.metrics.embedded_inputs.inc(len(inputs))
    service.metrics.prompt_tokens.inc(n)
    data = [{"object": "embedding", "index": i, "embedding": encode(v, req.encoding_format)}
            for i, v in enumerate(vectors)]  # fmt: skip
    return {"object": "list", "data": data, "model": service.model_id,
            "usage": {"prompt_tokens": n, "total_tokens": n}}  # fmt: skip


async def token_inputs(service: Service, value: Input) -> list[list[int]]:
    """Every input's token ids, as llama-server makes them: text with the model's special
    tokens (BOS, and EOS for models that want one, as BERT's [SEP]); ids as sent. An input
    the embeddings context cannot hold whole is a 400."""
    if isinstance(value, str) or (value and isinstance(value[0], str)):
        texts = [value] if isinstance(value, str) else value
        inputs = [await with_specials(service, str(t)) for t in texts]
    elif isinstance(value[0], list):
        inputs = [list(x) for x in value]  # type: ignore[arg-type]
    else:
        inputs = [list(value)]  # type: ignore[arg-type]
    limit = int(service.engine.info["embeddings"]["max_tokens"])
    for i, ids in enumerate(inputs):
        service.check_token_ids(ids, "input")
        if not ids or len(ids) > limit:
            raise ApiError(400, f"input {i} has {len(ids)} tokens; this server embeds 1 to {limit} tokens an "
                           "input (the engine's n_batch)", param="input", code="context_length_exceeded")  # fmt: skip
    return inputs


async def with_specials(service: Service, text: str) -> list[int]:
    ids = await service.tokenize(text)
    eos = service.engine.info.get("eos")
    if service.engine.info.get("add_eos") and eos is not None and (not ids or ids[-1] != eos):
        ids.append(eos)
    return ids


async def embed_all(service: Service, inputs: list[list[int]]) -> list[npt.NDArray[np.float32]]:
    """Each input's unit vector. One at a time: the engine embeds between generation steps,
    so a long batch shares the engine with requests decoding beside it, and a request that
    ends (the client gone, the timeout) stops asking."""
    return [normalized(await service.engine.embed(ids)) for ids in inputs]


def normalized(vector: tuple[float, ...]) -> npt.NDArray[np.float32]:
    """``vector`` over its L2 norm (summed in float64, as llama.cpp's common_embd_normalize);
    a zero vector stays zero."""
    v = np.asarray(vector, dtype=np.float32)
    norm = float(np.sqrt(np.sum(v.astype(np.float64) ** 2)))
    return v * np.float32(1.0 / norm) if norm > 0 else v


def encode(vector: npt.NDArray[np.float32], fmt: str) -> list[float] | str:
    if fmt == "base64":
        return base64.b64encode(vector.astype("<f4").tobytes()).decode("ascii")
    return vector.tolist()  # type: ignore[no-any-return]
