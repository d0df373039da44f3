#!/usr/bin/env python3
"""
A coding-agent session through sandboxd's client: start an agent in the
sandbox, send it a prompt, print its answer as it streams, and answer the
permission requests it asks a human for.

The daemon needs the ``agents`` group on and an agent it can run, e.g.::

    ABX_SERVER_ENABLED_GROUPS=agents make serve     # claude, codex, gemini ...
    python3 examples/agent_session.py --agent claude "Add a README to this repo"

``--approve`` answers every permission request "allow once" (otherwise
each is refused); ``--cwd`` is the agent's working directory in the
sandbox.  The URL and token come from ``--url``/``--token`` or
``SANDBOXD_URL``/``SANDBOXD_TOKEN``.
"""

from __future__ import annotations

import argparse
import sys

from sandboxd.client import EndpointDisabled, Sandbox, SandboxError


def pick_agent(sb: Sandbox, wanted: str | None) -> str:
    """The agent to run: the one asked for, else the first installed and allowed."""
    catalog = sb.agents.catalog()
    if wanted:
        return wanted
    for entry in catalog:
        if entry.get("allowed") and entry.get("installed"):
            return str(entry["id"])
    names = ", ".join(f"{e['id']} (installed: {e.get('installed')})" for e in catalog)
    raise SystemExit(f"no installed agent is allowed here; the catalogue: {names}")


def run(sb: Sandbox, agent: str, prompt: str, cwd: str | None, approve: bool) -> int:
    """One turn, streamed; 0 when it ended normally."""
    session = sb.agents.create(agent, cwd=cwd, title="client example")
    sid = session["session_id"]
    print(f"session {sid}: {session.get('agent_info', {}).get('name', agent)}")
    try:
        # The event stream is open before the prompt is sent: nothing is missed.
        with sb.agents.events(sid, types=None) as events:
            turn = sb.agents.prompt(sid, prompt, wait=0)
            print(f"turn {turn['turn_id']} started")
            for event in events:
                data = event.data
                kind = data.get("type", event.event)
                if kind == "message.delta" and data.get("role") == "agent":
                    content = data.get("content") or {}
                    if content.get("type") == "text":
                        sys.stdout.write(content.get("text", ""))
                        sys.stdout.flush()
                elif kind == "tool_call":
                    print(f"\n[tool] {data.get('title') or data.get('kind')}")
                elif (
                    kind == "permission.requested"
                    and data.get("policy", {}).get("decision") == "ask"
                ):
                    answer = "allow_once" if approve else "reject_once"
                    print(f"\n[permission] {data.get('title')}: {answer}")
                    sb.agents.reply(data["request_id"], decision=answer)
                elif kind == "turn.ended":
                    print(f"\n[turn ended: {data.get('stop_reason')}]")
                    return 0 if data.get("stop_reason") == "end_turn" else 1
    finally:
        sb.agents.close(sid)
    return 1


def main(argv: list[str] | None = None) -> int:
    """Parse the arguments and run one turn."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("prompt", nargs="?", default="echo hello from the sandbox")
    parser.add_argument("--agent", help="catalogue id (default: the first installed)")
    parser.add_argument("--cwd", help="the agent's working directory in the sandbox")
    parser.add_argument(
        "--approve", action="store_true", help="allow what the agent asks for"
    )
    parser.add_argument("--url")
    parser.add_argument("--token")
    args = parser.parse_args(argv)
    with Sandbox(args.url, token=args.token, timeout=120) as sb:
        try:
            agent = pick_agent(sb, args.agent)
        except EndpointDisabled as e:
            raise SystemExit(
                f"the agents group is off ({e.rule}): start the daemon with it on"
            ) from None
        return run(sb, agent, args.prompt, args.cwd, args.approve)


if __name__ == "__main__":
    try:
        sys.exit(main())
    except SandboxError as error:
        print(f"sandboxd: {error}", file=sys.stderr)
        sys.exit(2)
