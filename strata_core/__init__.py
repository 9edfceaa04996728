"""Strata: OpenAI-compatible serving on llama.cpp, on any accelerator."""

__version__ = "0.1.0"
