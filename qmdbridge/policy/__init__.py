"""Policies the manager applies to every backend: session-key scope, citations, the qmd circuit breaker."""
