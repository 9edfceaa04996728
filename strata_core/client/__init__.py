"""The engine client: the server's side of the engine process (``reader.py``: starts
and supervises it, sends commands, reads its events and hands each request its own)."""
