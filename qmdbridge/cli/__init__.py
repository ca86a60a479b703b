"""The ``qmdbridge`` command line; the parser, the entry point (``qmdbridge.cli.main.main``),
the commands and the exit codes are described in :mod:`qmdbridge.cli.main`."""
