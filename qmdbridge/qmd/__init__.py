"""The qmd sidecar: locating qmd, running it, its collections, update cycle, output parsing and the backend."""
