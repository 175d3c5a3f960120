"""Process-group state and collectives, below ``layers/`` so that layers need nothing from ``worker/``."""
