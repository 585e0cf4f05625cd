"""The Transformer of "Attention Is All You Need" (Vaswani et al., 2017), faithful and small."""

__version__ = "0.1.0"
