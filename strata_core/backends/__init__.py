"""Backends built into the core distribution."""
