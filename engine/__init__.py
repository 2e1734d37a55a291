"""Homerack's inference engine. Knows nothing of Qt."""
