"""
A kernel hub that misbehaves, for the daemon's side of the pipe: run as
``python fake_hub.py MODE``; at its first command it sends a line that is
not JSON (``garbage``), a line over the daemon's bound (``long``), or
exits (``exit``).

``whoami`` is a hub that behaves, minimally: it answers ``open`` with
``ready`` (``info.name`` is ``uid<its uid>``) and each ``execute`` with its
uid as the result, except ``hang`` (never answered) and
``spoof:CID:XID``, which first claims that the execution XID of the
context CID is done, ``forged``, which first sends output held back for
the hub's check, some that fails it and some that passes, and
``hoard:N``, which sends N bytes of such output and no verdict. Standard
library only.
"""

import json
import os
import sys


def send(event: dict) -> None:
    sys.stdout.write(json.dumps(event) + "\n")
    sys.stdout.flush()


def send_output(event: dict, raw: bytes, unverified: bool = True) -> None:
    """A stream event and its payload, held back for a check or not."""
    event = {"ev": "stream", "name": "stdout", **event, "bytes": len(raw)}
    if unverified:
        event["unverified"] = True
    sys.stdout.flush()
    sys.stdout.buffer.write(json.dumps(event).encode() + b"\n" + raw)
    sys.stdout.buffer.flush()


def forged(cid: str, xid: str) -> None:
    """Output of a message that fails its check, then of one that passes."""
    ids = {"cid": cid, "xid": xid}
    send_output(ids, b"FORGED ")
    send_output(ids, b"FORGED\n")
    send({"ev": "verdict", **ids, "ok": False})
    send_output(ids, b"good ")
    send_output(ids, b"output\n")
    send({"ev": "verdict", **ids, "ok": True})
    send_output(ids, b"plain\n", unverified=False)
    send_output(ids, b"FORGED\n")
    send({"ev": "verdict", **ids})


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
            if code == "forged":
                forged(cid, xid)
            if code.startswith("hoard:"):
                send_output({"cid": cid, "xid": xid}, b"x" * int(code[6:]))
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
