"""The HTTP APIs (docs/architecture.md): ``app.py`` builds the FastAPI app, ``service.py`` is
the request path every API shares, and each API family has a module of its own over it
(``completions.py``: OpenAI's chat completions and completions)."""
