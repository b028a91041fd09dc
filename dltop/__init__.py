"""dltop: a top-like monitor for the cache layers of deep-learning work."""

__version__ = "0.1.0"
