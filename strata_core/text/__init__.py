"""The text rules every API and backend share (docs/architecture.md): chat templates
(``chat.py``), tokens to text and stop strings (``detokenize.py``, ``choice.py``), logprob
entries that spell the text shown (``logprobs.py``), reasoning and tool calls
(``reasoning.py``, ``tools.py``), structured outputs (``structured.py``) and the grammar
sources both the server and the engine read (``grammars.py``)."""
