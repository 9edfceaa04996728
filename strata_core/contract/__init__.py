"""The engine contract: the line protocol between the server and the engine process
(``protocol.py``), the typed options a GEN command carries (``options.py``) and what a
request's events come to on the server's side (``events.py``). It imports nothing else
of Strata; everything else imports it."""
