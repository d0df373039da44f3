"""
A kernel hub that misbehaves, for the daemon's side of the pipe: run as
``python fake_hub.py MODE``; at its first command it sends a line that is
not JSON (``garbage``), a line over the daemon's bound (``long``), or
exits (``exit``). Standard library only.
"""

import sys

mode = sys.argv[1]
line = sys.stdin.readline()
if mode == "garbage":
    sys.stdout.write("this is not json\n")
elif mode == "long":
    sys.stdout.write('{"ev": "' + "x" * 5000 + '"}\n')
sys.stdout.flush()
if mode != "exit":
    sys.stdin.readline()
