"""Composition: CLI, paths, settings and engine supervision."""
