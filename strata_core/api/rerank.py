"""``POST /v1/rerank`` (and ``/rerank``): documents scored against a query by a reranker
model (its GGUF's pooling is rank), in the request and response shapes llama-server, Jina
and Cohere share: ``query``, ``documents``, ``top_n``, ``return_documents`` in; ``results``
of ``index`` and ``relevance_score``, best first, out.

Each (query, document) pair is one input of the engine's embeddings context (``EMBED``);
its classification head's first output is the score, as llama-server reads it. The pair
is tokenized as llama-server does: through the model's ``rerank`` template when its GGUF
has one, else BOS, the query, EOS, SEP, the document, EOS, each where the vocabulary asks
for it."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from pydantic import Field, field_validator

from strata_core.api import openapi
from strata_core.api.service import Service, engine_work, json_body, service_for
from strata_core.schema.errors import ApiError
from strata_core.schema.requests import Strict, invalid, parse_request

router = APIRouter()

#: Most documents one request may rank.
MAX_DOCUMENTS = 1024


class TextDocument(Strict):
    text: str


class RerankRequest(Strict):
    query: str = Field(min_length=1)
    #: strings, or (Cohere, Jina) objects holding one
    documents: list[str | TextDocument] = Field(min_length=1, max_length=MAX_DOCUMENTS)
    model: str | None = None
    top_n: int | None = Field(default=None, ge=1)
    return_documents: bool = False

    @field_validator("documents")
    @classmethod
    def _not_empty(cls, value: list[str | TextDocument]) -> list[str | TextDocument]:
        if not all(d if isinstance(d, str) else d.text for d in value):
            raise invalid("documents must not be empty strings")
        return value

    def texts(self) -> list[str]:
        return [d if isinstance(d, str) else d.text for d in self.documents]


REPLY = {
    "type": "object",
    "required": ["object", "model", "results", "usage"],
    "properties": {
        "object": {"const": "list"},
        "model": {"type": "string"},
        "results": {"type": "array", "items": {
            "type": "object", "required": ["index", "relevance_score"],
            "properties": {"index": {"type": "integer"}, "relevance_score": {"type": "number"},
                           "document": {"type": "object", "properties": {"text": {"type": "string"}}}}}},
        "usage": {"type": "object", "required": ["prompt_tokens", "total_tokens"]},
    },
}  # fmt: skip


async def pair_tokens(service: Service, query: str, document: str) -> list[int]:
    """One (query, document) input, tokenized as llama-server's format_prompt_rerank."""
    info = service.engine.info
    template = info.get("rerank_template")
    if template:
        text = template.replace("{query}", query).replace("{document}", document)
        return await service.tokenize(text, add_bos=False, special=True)

    def special(name: str) -> list[int]:
        token = info.get(name)
        return [token] if info.get(f"add_{name}") and token is not None else []

    q = await service.tokenize(query, add_bos=False, special=False)
    d = await service.tokenize(document, add_bos=False, special=False)
    eos = special("eos")
    if not eos and info.get("add_eos") and info.get("sep") is not None:  # no EOS: SEP stands in
        eos = [info["sep"]]
    return special("bos") + q + eos + special("sep") + d + eos


async def rerank(request: Request) -> dict[str, Any]:
    req = parse_request(RerankRequest, await json_body(request))
    service = await service_for(request, req.model)
    service.ready()
    info = service.engine.info
    if "rerank" not in info.get("capabilities", ()):
        raise ApiError(400, f"model {service.model_id!r} has no rank head (its GGUF's pooling is "
                       f"{info.get('embeddings', {}).get('pooling')!r}, not 'rank'): rerank with a reranker model",
                       param="model", code="unsupported_value")  # fmt: skip
    texts = req.texts()
    limit = int(info["embeddings"]["max_tokens"])
    inputs = [await pair_tokens(service, req.query, t) for t in texts]
    for i, ids in enumerate(inputs):
        if len(ids) > limit:
            raise ApiError(400, f"the query and document {i} make {len(ids)} tokens; this server ranks at most "
                           f"{limit} a pair (the engine's n_batch)", param=f"documents.{i}",
                           code="context_length_exceeded")  # fmt: skip
    scores = await engine_work(request, service, score_all(service, inputs))
    n = sum(map(len, inputs))
    service.metrics.prompt_tokens.inc(n)
    order = sorted(range(len(texts)), key=lambda i: -scores[i])[: req.top_n]
    results = []
    for i in order:
        result: dict[str, Any] = {"index": i, "relevance_score": scores[i]}
        if req.return_documents:
            result["document"] = {"text": texts[i]}
        results.append(result)
    return {"object": "list", "model": service.model_id, "results": results,
            "usage": {"prompt_tokens": n, "total_tokens": n}}  # fmt: skip


async def score_all(service: Service, inputs: list[list[int]]) -> list[float]:
    """Each pair's score, one at a time (the engine embeds between generation steps)."""
    return [float((await service.engine.embed(ids))[0]) for ids in inputs]


for _path in ("/v1/rerank", "/rerank"):
    router.post(_path, **openapi.route(RerankRequest, "documents ranked by relevance to a query", REPLY,
                                       stream=False))(rerank)  # fmt: skip
