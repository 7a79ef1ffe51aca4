"""Task stores: where the engine journals every change (see base.py)."""
