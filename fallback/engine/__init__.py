"""The builtin engine: BuiltinEngine (the backend contract over the store), its status and its live mode."""
