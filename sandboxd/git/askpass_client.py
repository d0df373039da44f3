"""
The program git runs as ``GIT_ASKPASS`` (standard library only: it runs
with ``python -I -S``, outside the daemon, as the call's user).

It sends the daemon's per-call nonce and git's prompt over the one-shot
unix socket named in its environment and prints the answer it gets back.
The answer is never written anywhere but git's pipe.
"""

import os
import socket
import sys


def main() -> int:
    """Ask the daemon; exit 1 (git then fails the login) on any refusal."""
    path = os.environ.get("SANDBOXD_ASKPASS_SOCKET", "")
    nonce = os.environ.get("SANDBOXD_ASKPASS_NONCE", "")
    prompt = " ".join(sys.argv[1:]).replace("\n", " ")
    if not path or not nonce:
        return 1
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(30)
    try:
        sock.connect(path)
        sock.sendall(f"{nonce}\n{prompt}\n".encode())
        chunks = []
        while True:
            chunk = sock.recv(65536)
            if not chunk:
                break
            chunks.append(chunk)
    except OSError:
        return 1
    finally:
        sock.close()
    answer = b"".join(chunks)
    if not answer.startswith(b"+"):
        return 1
    sys.stdout.buffer.write(answer[1:] + b"\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
