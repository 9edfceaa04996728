"""Conformance kit for backend authors: ``pytest --pyargs strata_core.testing --strata-backend NAME``."""
