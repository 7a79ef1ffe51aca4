"""Client library for the delaywheel delay-queue server."""

__version__ = "0.1.0"
