"""
A kernel hub that misbehaves, for the daemon's side of the pipe: run as
``python fake_hub.py MODE``; at its first command it sends a line that is
not JSON (``garbage``), a line over the daemon's bound (``long``), or
exits (``exit``).

``whoami`` is a hub that behaves, minimally: it answers ``open`` with
``ready`` (``info.name`` is ``uid<its uid>``) and each ``execute`` with its
uid as the result, except ``hang`` (never answered), ``lossy`` (output
lost on its way, as the hub reports it: :func:`lossy`) and
``spoof:CID:XID``, which first claims that the execution XID of the
context CID is done. Standard library only.
"""

import json
import os
import sys


def send(event: dict) -> None:
    sys.stdout.write(json.dumps(event) + "\n")
    sys.stdout.flush()


def whoami() -> None:
    for line in sys.stdin:
        command = json.loads(line)
        cid = command.get("cid")
        if command["op"] == "open":
            send({"ev": "ready", "cid": cid, "info": {"name": f"uid{os.getuid()}"}})
        elif command["op"] == "execute":
            code, xid = command["code"], command["xid"]
            if code.startswith("spoof:"):
                _, other, other_xid = code.split(":")
                send({"ev": "done", "cid": other, "xid": other_xid, "status": "ok"})
            if code == "hang":
                continue
            if code == "lossy":
                lossy(cid, xid)
                continue
            result = {"text/plain": str(os.getuid())}
            send(
                {
                    "ev": "display",
                    "cid": cid,
                    "xid": xid,
                    "data": result,
                    "metadata": {},
                    "is_result": True,
                }
            )
            send({"ev": "done", "cid": cid, "xid": xid, "status": "ok", "count": 1})
        elif command["op"] == "close":
            send({"ev": "closed", "cid": cid})


def lossy(cid: str, xid: str) -> None:
    """An execution whose output was partly lost on its way, as a hub says it."""
    send({"ev": "stream", "cid": cid, "xid": xid, "name": "stdout", "text": "head\n"})
    send({"ev": "dropped", "cid": cid, "xid": xid, "stdout": 1000, "displays": 2})
    send({"ev": "stream", "cid": cid, "xid": xid, "name": "stdout", "text": "tail\n"})
    send(
        {
            "ev": "done",
            "cid": cid,
            "xid": xid,
            "status": "ok",
            "count": 1,
            "lost_messages": 3,
            "idle_lost": True,
        }
    )


mode = sys.argv[1]
if mode == "whoami":
    whoami()
    sys.exit(0)
line = sys.stdin.readline()
if mode == "garbage":
    sys.stdout.write("this is not json\n")
elif mode == "long":
    sys.stdout.write('{"ev": "' + "x" * 5000 + '"}\n')
sys.stdout.flush()
if mode != "exit":
    sys.stdin.readline()
