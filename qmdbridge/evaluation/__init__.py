"""Retrieval evaluation: LoCoMo conversion, pure recall metrics, and the runner behind ``qmdbridge eval``."""
