"""The HTTP API's request side: the request models with their validation
(``requests.py``) and the OpenAI-shaped error every refusal takes (``errors.py``). The
routes, the text rules and the configuration's sampling fields share them."""
