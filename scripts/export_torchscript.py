#!/usr/bin/env python3
"""The former name of scripts/export_model.py (TorchScript or .pt2 by --format or --out), kept for scripts."""
import os
import sys

sys.argv[0] = os.path.join(os.path.dirname(os.path.abspath(__file__)), "export_model.py")
exec(compile(open(sys.argv[0]).read(), sys.argv[0], "exec"))
