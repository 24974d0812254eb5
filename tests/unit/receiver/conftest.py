"""The receiver's unit tests' shared fixtures, defined in ``fakes.py`` beside the fakes they go with."""

from .fakes import producer

__all__ = ["producer"]
