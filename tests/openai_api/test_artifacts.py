"""
A session's artifacts through the ``/v1`` door: copies of the files a
completed turn wrote, listed, downloaded and deleted with the ``openai``
SDK against a real daemon running the fake ACP agent.
"""

from __future__ import annotations

import os
from typing import Any

from twisted.internet.defer import inlineCallbacks

from sandboxd.policy import defaults
from tests.openai_api.sdk import OpenAICase, caught, openai_policy


def run_turn(client: Any, session_id: str, text: str) -> list[Any]:
    """Run one turn to its end (blocking); its events."""
    with client.beta.agents.sessions.stream(session_id, input=text) as stream:
        return list(stream)


class ArtifactTests(OpenAICase):
    """``client.beta.agents.sessions.artifacts``."""

    @inlineCallbacks
    def test_written_file_is_an_artifact(self) -> Any:
        """
        A file the agent wrote in a completed turn is listed as soon as the
        turn has ended, with its path, size and turn; its content is the
        bytes as they were at the turn's end (a later change to the
        workspace file does not alter it), sent as an attachment; deleting
        it removes the copy only.
        """
        client = self.client()
        artifacts = client.beta.agents.sessions.artifacts
        target = os.path.join(self.base_dir, "out.txt")

        def run() -> Any:
            session = client.beta.agents.sessions.create(**self.session_body())
            run_turn(client, session.id, f"write {target} hello-artifact")
            listed = list(artifacts.list(session.id))
            turns = list(client.beta.agents.sessions.turns.list(session.id))
            with open(target, "w") as f:
                f.write("changed later")
            one = artifacts.retrieve(listed[0].id, session_id=session.id)
            content = artifacts.with_raw_response.content(
                listed[0].id, session_id=session.id
            )
            deleted = artifacts.delete(listed[0].id, session_id=session.id)
            gone = caught(
                lambda: artifacts.retrieve(listed[0].id, session_id=session.id)
            )
            return listed, turns, one, content, deleted, gone, session

        listed, turns, one, content, deleted, gone, session = yield self.sdk(run)
        self.assertEqual(len(listed), 1)
        self.assertEqual(one, listed[0])
        self.assertTrue(one.id.startswith("artifact_"))
        self.assertEqual(one.path, os.path.realpath(target))
        self.assertEqual(one.size_bytes, len(b"hello-artifact"))
        self.assertEqual(one.turn_id, turns[0].id)
        self.assertEqual(one.session_id, session.id)
        self.assertEqual(one.environment_id, session.environment.id)
        self.assertEqual(content.content, b"hello-artifact")
        self.assertEqual(content.headers["content-type"], "application/octet-stream")
        self.assertEqual(
            content.headers["content-disposition"], 'attachment; filename="out.txt"'
        )
        self.assertEqual(content.headers["cache-control"], "no-store")
        self.assertTrue(deleted.deleted)
        self.assertEqual(deleted.object, "agent.session.artifact.deleted")
        self.assertEqual(gone.status_code, 404)
        self.assertEqual(gone.response.headers["x-should-retry"], "false")
        with open(target) as f:
            self.assertEqual(f.read(), "changed later")

    @inlineCallbacks
    def test_what_is_not_an_artifact(self) -> Any:
        """
        A turn that writes nothing leaves no artifact, nor does a write
        under ``.git``; the environment filter keeps only its own; another
        identity cannot see the session's artifacts.
        """
        client = self.client()
        theirs = self.client("o-token")
        os.makedirs(os.path.join(self.base_dir, ".git"))
        hidden = os.path.join(self.base_dir, ".git", "notes.txt")

        def run() -> Any:
            session = client.beta.agents.sessions.create(**self.session_body())
            run_turn(client, session.id, "echo nothing written")
            run_turn(client, session.id, f"write {hidden} x")
            artifacts = client.beta.agents.sessions.artifacts
            return (
                list(artifacts.list(session.id)),
                list(artifacts.list(session.id, environment_id="env_other")),
                caught(
                    lambda: list(theirs.beta.agents.sessions.artifacts.list(session.id))
                ),
            )

        listed, filtered, foreign = yield self.sdk(run)
        self.assertEqual(listed, [])
        with open(hidden) as f:
            self.assertEqual(f.read(), "x")  # written, not copied
        self.assertEqual(filtered, [])
        self.assertEqual(foreign.status_code, 404)

    @inlineCallbacks
    def test_copies_bounded_by_bytes(self) -> Any:
        """
        Past the bytes a session's copies may hold, the oldest copy goes
        first; the newest stays whatever it weighs, its bytes intact.
        """
        self.patch(defaults, "V1_ARTIFACTS_KEPT_BYTES", 20)
        client = self.client()
        artifacts = client.beta.agents.sessions.artifacts

        def run() -> Any:
            session = client.beta.agents.sessions.create(**self.session_body())
            for name, text in (("a", "x" * 8), ("b", "y" * 8), ("c", "z" * 30)):
                path = os.path.join(self.base_dir, name)
                run_turn(client, session.id, f"write {path} {text}")
                kept = [a.path for a in artifacts.list(session.id)]  # newest first
                yield [os.path.basename(p) for p in kept]
            newest = next(iter(artifacts.list(session.id)))
            yield artifacts.content(newest.id, session_id=session.id).read()

        seen = yield self.sdk(lambda: list(run()))
        self.assertEqual(seen, [["a"], ["b", "a"], ["c"], b"z" * 30])


class AuditedArtifactTests(OpenAICase):
    """With a policy that audits every call of the group."""

    policy = openai_policy(audit="all")

    @inlineCallbacks
    def test_audited_as_endpoints(self) -> Any:
        """Each artifact call is audited as its endpoint id, ``via: openai``."""
        client = self.client()
        target = os.path.join(self.base_dir, "a.txt")

        def run() -> Any:
            session = client.beta.agents.sessions.create(**self.session_body())
            run_turn(client, session.id, f"write {target} abc")
            artifacts = client.beta.agents.sessions.artifacts
            first = next(iter(artifacts.list(session.id)))
            artifacts.content(first.id, session_id=session.id).read()
            artifacts.delete(first.id, session_id=session.id)
            caught(lambda: artifacts.retrieve("artifact_x", session_id=session.id))

        yield self.sdk(run)
        lines = [
            (x["endpoint"], x["via"], x["status"])
            for x in self.audit_lines()
            if x.get("endpoint", "").startswith("agents_artifacts")
        ]
        self.assertEqual(
            lines,
            [
                ("agents_artifacts_list", "openai", 200),
                ("agents_artifacts_content", "openai", 200),
                ("agents_artifacts_delete", "openai", 200),
                ("agents_artifacts_get", "openai", 404),
            ],
        )
