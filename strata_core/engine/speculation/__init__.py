"""Speculative decoding beside the engine loop: the n-gram index (ngram.py) and the draft
model (drafter.py) draft, the cost model and guard (cost.py) decide where a window pays,
verify.py keeps what the target confirms, and policy.py's ``Speculator`` is the one
interface the loop calls (propose, judge, observe)."""
