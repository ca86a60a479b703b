#!/usr/bin/env python3
"""Stand-in for a qmd that crashes (SIGSEGV, signal 11) before answering, as qmd's llama.cpp
does on a model it cannot run: Bun prints a panic line, then the process dies by the signal."""
import os
import signal
import sys

sys.stderr.write("panic: Segmentation fault at address 0x0\n")
sys.stderr.flush()
signal.signal(signal.SIGSEGV, signal.SIG_DFL)
os.kill(os.getpid(), signal.SIGSEGV)
