"""delaywheel: a delay-queue server built on a hierarchical time wheel."""

__version__ = "0.1.0"
