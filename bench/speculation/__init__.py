"""Speculation's benchmarks and diagnostics, one command with a subcommand each:

    python -m bench.speculation servers ...  # on against off through real servers (servers.py)
    python -m bench.speculation host ...     # what n-gram costs each step, one engine (host.py)
    python -m bench.speculation whatif ...   # the same on a GPU's step costs, simulated (host.py)
    python -m bench.speculation tvd ...      # a window's logits against one token at a time (numerics.py)
    python -m bench.speculation layout ...   # a step's cost by how its rows lie (numerics.py)
    python -m bench.speculation trace F ...  # summarise STRATA_STEP_TRACE files (trace.py)

``python -m bench.speculation SUBCOMMAND --help`` lists each one's options; its module's
docstring says what it measures.
"""
