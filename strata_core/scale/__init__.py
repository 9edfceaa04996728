"""Scale-out through Ray Serve (``pip install 'strata[ray]'``): replicas that each run one
Strata engine behind the same OpenAI routes, prefix-aware routing between them, and a
front server that retries a request no byte of which was sent yet. Only ``serve.py``,
``replica.py`` and ``router.py`` import Ray; the rest of Strata never does
(docs/scale-out.md)."""
