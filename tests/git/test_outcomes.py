"""
What git's output means (sandboxd.git.outcomes), and which remotes and
askpass questions are refused (sandboxd.git.remotes, sandboxd.git.askpass),
as pure functions of their input.
"""

from __future__ import annotations

import os

from twisted.trial.unittest import SynchronousTestCase

from sandboxd.errors import ApiError
from sandboxd.git.askpass import AskpassSession, Secret, prompt_url, under_prefix
from sandboxd.git.outcomes import (
    ProgressLines,
    classify_failure,
    parse_log,
    parse_progress,
    parse_push,
    push_rejection,
    push_report,
    redact,
)
from sandboxd.git.remotes import parse_remote
from sandboxd.git.runner import network_overrides, protocol_overrides
from sandboxd.testing import memory_context


class ClassifyTests(SynchronousTestCase):
    """git's last words become the error a caller can act on."""

    def check(
        self, text: str, status: int, code: str, kind: str | None, remote: bool = True
    ) -> None:
        error = classify_failure(text, 128, remote)
        body = error.body()
        self.assertEqual(
            (error.status, body["code"], body.get("kind")), (status, code, kind)
        )

    def test_message_lines_end_at_newlines(self) -> None:
        """
        The message's last lines are counted at LF (and CR): a path holding
        U+2028 or NEL is quoted whole, and the lines before it are kept.
        """
        name = "a\u2028b\x85c\u2028d\u2029e\u2028f\u2028g"
        text = f"hint: first\nerror: pathspec '{name}' did not match\n"
        message = classify_failure(text, 1, False).body()["error"]
        self.assertIn("hint: first\n", message)
        self.assertIn(f"error: pathspec '{name}' did not match", message)

    def test_full_disk(self) -> None:
        """
        git failing to write for want of space is 507 insufficient_storage
        (a fetch's too: the disk, not the remote, refused), not a git_error.
        """
        for remote in (False, True):
            self.check(
                "error: unable to write file .git/objects/ab/cd: No space left on device\n"
                "fatal: unable to write new index file",
                507,
                "insufficient_storage",
                None,
                remote,
            )
        self.check(
            "fatal: write error: Disk quota exceeded", 507, "insufficient_storage", None
        )
        self.check(
            "error: unable to write file f6.txt\n"
            "fatal: sha1 file '/r/.git/index.lock' write error. Out of diskspace",
            507,
            "insufficient_storage",
            None,
        )
        # Git's bare "unable to write file" is a full disk only when the
        # file system has no room left.
        unwritten = "error: unable to write file f1.txt"
        self.assertEqual(classify_failure(unwritten, 1, no_room=True).status, 507)
        self.assertEqual(classify_failure(unwritten, 1).code, "git_error")

    def test_remote_kinds(self) -> None:
        """auth, not_found, network, tls and a redirect are 502 remote_error with their kind."""
        self.check(
            "fatal: Authentication failed for 'https://h/r.git/'",
            502,
            "remote_error",
            "auth",
        )
        self.check(
            "fatal: could not read Username for 'https://h': terminal prompts disabled",
            502,
            "remote_error",
            "auth",
        )
        self.check(
            "remote: Repository not found.\nfatal: repository 'https://h/r/' not found",
            502,
            "remote_error",
            "not_found",
        )
        self.check(
            "fatal: unable to access 'https://h/': Could not resolve host: h",
            502,
            "remote_error",
            "network",
        )
        self.check(
            "fatal: unable to access 'https://h/': SSL certificate problem: unable to get local issuer certificate",
            502,
            "remote_error",
            "tls",
        )
        self.check(
            "fatal: unable to access 'https://h/r/': The requested URL returned error: 302",
            502,
            "remote_error",
            "rejected",
        )

    def test_conflicts(self) -> None:
        """Rejected non-fast-forwards, dirty trees and existing branches are 409 git_conflict."""
        self.check(
            " ! [rejected]        main -> main (fetch first)\nerror: failed to push",
            409,
            "git_conflict",
            "non_fast_forward",
        )
        self.check(
            "error: Your local changes to the following files would be overwritten by checkout",
            409,
            "git_conflict",
            "dirty_tree",
            False,
        )
        self.check(
            "fatal: a branch named 'x' already exists",
            409,
            "git_conflict",
            "branch_exists",
            False,
        )
        self.check(
            "Cloning into 'proj'...\nfatal: destination path 'proj' already exists"
            " and is not an empty directory.",
            409,
            "file_exists",
            None,
            True,
        )
        self.check(
            "error: Pulling is not possible because you have unmerged files.\n"
            "hint: Fix them up in the work tree",
            409,
            "git_conflict",
            "merge_conflict",
        )
        self.check(
            "CONFLICT (content): Merge conflict in a.txt",
            409,
            "git_conflict",
            "merge_conflict",
            False,
        )

    def test_locked(self) -> None:
        """
        Another git's lock file is 409 ``locked`` quoting git's line about
        it, wherever it is in what git said (a pull's first line is not it).
        """
        text = (
            "From https://h/r\n * branch main -> FETCH_HEAD\n"
            "fatal: Unable to create '/w/.git/index.lock': File exists.\n\n"
            "Another git process seems to be running in this repository\n"
        )
        error = classify_failure(text, 128, True)
        self.assertEqual((error.status, error.body()["kind"]), (409, "locked"))
        self.assertTrue(
            error.message.endswith("'/w/.git/index.lock': File exists."), error.message
        )

    def test_other(self) -> None:
        """Anything else is 400 git_error; no repository is 404."""
        self.check("fatal: bad revision 'nope'", 400, "git_error", None, False)
        self.check(
            "fatal: not a git repository (or any parent up to mount point /)",
            404,
            "not_found",
            None,
            False,
        )

    def test_no_identity(self) -> None:
        """
        git with no name and email for a commit is 400 ``git_error`` saying
        how to give one through the daemon, not git's advice to run
        ``git config --global`` (which the daemon's git never reads).
        """
        text = (
            "Author identity unknown\n\n*** Please tell me who you are.\n\nRun\n\n"
            '  git config --global user.email "you@example.com"\n'
            "fatal: unable to auto-detect email address (got 'root@vm.(none)')\n"
        )
        error = classify_failure(text, 128, False)
        self.assertEqual((error.status, error.code), (400, "git_error"))
        self.assertIn("git.author", error.message)
        self.assertNotIn("--global", error.message)


class ProgressTests(SynchronousTestCase):
    """--progress lines, split at carriage returns, become progress events."""

    def test_lines(self) -> None:
        """Receiving objects with percent, counts and bytes; remote: counting lines too."""
        lines = ProgressLines()
        got = lines.feed(
            b"remote: Counting objects: 100% (3/3), done.\nReceiving objects:  45% (45/100), 1.50 MiB | 2.00 MiB/s\rReceiv"
        )
        self.assertEqual(len(got), 2)
        self.assertEqual(lines.partial, b"Receiv")
        first = parse_progress(got[0])
        assert first is not None
        self.assertEqual(
            (first["phase"], first["percent"], first["objects"]),
            ("counting_objects", 100, 3),
        )
        second = parse_progress(got[1])
        assert second is not None
        self.assertEqual(second["bytes"], int(1.5 * 1024 * 1024))
        self.assertIsNone(parse_progress("Cloning into 'x'..."))

    def test_push_porcelain(self) -> None:
        """push --porcelain gives each ref's status, old and new."""
        out = b"To https://h/r.git\n \trefs/heads/main:refs/heads/main\t1a2b..3c4d\n!\trefs/heads/x:refs/heads/x\t[rejected] (fetch first)\nDone\n"
        updated = parse_push(out)
        self.assertEqual(updated[0]["status"], "ok")
        self.assertEqual((updated[0]["old"], updated[0]["new"]), ("1a2b", "3c4d"))
        self.assertEqual(updated[1]["status"], "rejected")
        self.assertEqual(updated[1]["reason"], "fetch first")

    def test_push_rejection(self) -> None:
        """
        A push git refused is told with each rejected ref, git's reason in
        words and "pull first", never porcelain's closing ``Done``; a
        ref the remote's hook refused is not such a rejection.
        """
        out = (
            b"To https://h/r.git\n"
            b"!\trefs/heads/main:refs/heads/main\t[rejected] (fetch first)\n"
            b"!\trefs/heads/x:refs/heads/x\t[remote rejected] (hook declined)\n"
            b"Done\n"
        )
        message = push_rejection(parse_push(out))
        self.assertEqual(
            message,
            "the push of refs/heads/main was rejected (fetch first): the remote "
            "has commits this branch does not have; pull first, then push again",
        )
        stale = b"!\trefs/heads/main:refs/heads/main\t[rejected] (stale info)\n"
        self.assertIn(
            "moved since it was last fetched", push_rejection(parse_push(stale))
        )
        odd = b"!\trefs/heads/main:refs/heads/main\t[rejected] (something new)\n"
        self.assertIn("(something new): pull first", push_rejection(parse_push(odd)))
        self.assertEqual(push_report(out).splitlines()[-1][-15:], "(hook declined)")

    def test_redact(self) -> None:
        """Hidden values, URL userinfo and token-like query values become ***."""
        self.assertEqual(
            redact("fatal: https://u:p4ss@h/r and p4ss", ("p4ss",)),
            "fatal: https://***@h/r and ***",
        )
        self.assertEqual(
            redact(
                "fatal: repository 'https://h/r?access_token=QS3CRET/' not found", ()
            ),
            "fatal: repository 'https://h/r?access_token=***' not found",
        )


class LogTests(SynchronousTestCase):
    """``git log -z`` with NUL-ended fields, as git writes it."""

    def record(self, sha: str, subject: str, body: str = "") -> bytes:
        fields = [sha, "", "A", "a@x", "1", "C", "c@x", "2", subject, body]
        return "\x00".join(fields).encode() + b"\x00"

    def test_separators_in_a_message(self) -> None:
        """A message holding RS, US or a newline stays one commit's."""
        out = self.record("a" * 40, "x\x1ey\x1fz", "b\x1e\n\x1f\n") + self.record(
            "b" * 40, "two"
        )
        commits = parse_log(out)
        self.assertEqual(
            [(c["commit"], c["subject"], c["body"]) for c in commits],
            [("a" * 40, "x\x1ey\x1fz", "b\x1e\n\x1f"), ("b" * 40, "two", "")],
        )
        self.assertEqual(commits[0]["author"], {"name": "A", "email": "a@x", "time": 1})

    def test_cut_commit_left_out(self) -> None:
        """Output cut by the cap, inside a commit's last field, drops that commit."""
        out = self.record("a" * 40, "one", "body") + self.record("b" * 40, "two", "bo")
        self.assertEqual(len(parse_log(out[:-2])), 1)
        self.assertEqual(len(parse_log(out)), 2)
        self.assertEqual(parse_log(b""), [])


class RemoteFormTests(SynchronousTestCase):
    """Remote URLs the policy refuses before git starts."""

    def setUp(self) -> None:
        self.context = memory_context(policy={"groups": {"git": True}})

    def test_forms(self) -> None:
        """https passes; file, ext::, git://, ssh and local paths are url_not_allowed; userinfo is invalid_param."""
        rule = self.context.policy.rule("git_clone")
        self.assertEqual(
            parse_remote("https://github.com/o/r.git", rule).host, "github.com"
        )
        for url in (
            "file:///x",
            "ext::sh -c x",
            "git://h/r",
            "ssh://h/r",
            "h:r.git",
            "/srv/r",
            "fd::7",
        ):
            with self.assertRaises(ApiError) as caught:
                parse_remote(url, rule)
            self.assertEqual(caught.exception.body()["code"], "url_not_allowed", url)
        with self.assertRaises(ApiError) as caught:
            parse_remote("https://u:p@h/r", rule)
        self.assertEqual(caught.exception.status, 400)
        self.assertNotIn("u:p", caught.exception.message)

    def test_credential_in_the_query(self) -> None:
        """
        A query parameter named like a credential (the names whose values
        the audit masks) is refused as userinfo is, naming the parameter
        and never its value; other queries pass, and so does a credential
        when the policy allows credentials in URLs.
        """
        rule = self.context.policy.rule("git_clone")
        for url in (
            "https://h/r.git?access_token=QS3CRET",
            "https://h/r.git?ref=main&api_key=QS3CRET",
            "https://h/r.git?x=1;Sig=QS3CRET",
            "https://h/r.git?access%5Ftoken=QS3CRET",
        ):
            with self.assertRaises(ApiError) as caught:
                parse_remote(url, rule)
            error = caught.exception
            self.assertEqual(
                (error.status, error.body()["code"]), (400, "invalid_param")
            )
            self.assertNotIn("QS3CRET", error.message)
            self.assertIn("pass 'auth' instead", error.message)
        with self.assertRaises(ApiError) as caught:
            parse_remote("https://h/r.git?access_token=QS3CRET", rule)
        self.assertIn("(access_token=)", caught.exception.message)
        with self.assertRaises(ApiError) as caught:
            parse_remote("https://h/r.git?tokenQS3CRET", rule)
        self.assertNotIn("QS3CRET", caught.exception.message)
        self.assertEqual(parse_remote("https://h/r.git?ref=main", rule).host, "h")
        allowing = memory_context(
            policy={
                "groups": {"git": True},
                "endpoints": {"group:git": {"params": {"allow_url_credentials": True}}},
            }
        ).policy.rule("git_clone")
        url = "https://h/r.git?access_token=QS3CRET"
        self.assertEqual(parse_remote(url, allowing).url, url)

    def test_url_globs(self) -> None:
        """
        A remote matching ``url_deny`` is refused naming the pattern, one
        outside ``url_allow`` naming the list, each with the rule that set it.
        """
        context = memory_context(
            policy={
                "groups": {"git": True},
                "endpoints": {
                    "git_clone": {
                        "params": {
                            "url_allow": ["github.com/*"],
                            "url_deny": ["*/evil/*"],
                        }
                    }
                },
            }
        )
        rule = context.policy.rule("git_clone")
        self.assertEqual(
            parse_remote("https://github.com/o/r.git", rule).path, "/o/r.git"
        )
        for url, why in (
            ("https://github.com/evil/r.git", "is denied by policy (*/evil/*)"),
            ("https://gitlab.com/o/r.git", "is not in url_allow"),
        ):
            with self.assertRaises(ApiError) as caught:
                parse_remote(url, rule)
            body = caught.exception.body()
            self.assertEqual(body["code"], "url_not_allowed", url)
            self.assertEqual(body["error"], f"the remote {url} {why}")
            self.assertEqual(body["rule"], "policy:endpoints.git_clone")

    def test_network_overrides(self) -> None:
        """A repository's URL-specific proxy and TLS settings are cancelled; other keys are left."""
        names = [
            "http.https://evil/.proxy",
            "http.https://x/.sslVerify",
            "remote.origin.proxy",
            "remote.origin.url",
            "user.name",
        ]
        self.assertEqual(
            network_overrides(names, "http://proxy:3128"),
            [
                "http.https://evil/.proxy=http://proxy:3128",
                "http.https://x/.sslVerify=true",
                "remote.origin.proxy=http://proxy:3128",
            ],
        )

    def test_protocol_and_remote_program_overrides(self) -> None:
        """
        Transports the repository allows by name are refused but the ones
        the daemon allows; a remote's upload and receive programs are put
        back to git's own.
        """
        names = [
            "protocol.ext.allow",
            "protocol.file.allow",
            "protocol.HTTPS.allow",
            "protocol.allow",
            "remote.origin.uploadpack",
        ]
        self.assertEqual(
            protocol_overrides(names, ["https"]),
            ["protocol.ext.allow=never", "protocol.file.allow=never"],
        )
        self.assertEqual(
            network_overrides(names, ""),
            ["remote.origin.uploadpack=git-upload-pack"],
        )


class AskpassTests(SynchronousTestCase):
    """The askpass socket answers only the right process, nonce, prompt and URL, once."""

    def session(self) -> AskpassSession:
        secret = Secret("agent", "pw", "https://h/org/", "test")
        session = AskpassSession(None, secret, os.geteuid(), os.getegid())
        session.git_pid = os.getpid()
        return session

    def test_prompts(self) -> None:
        """git's prompts name the question and the URL."""
        self.assertEqual(
            prompt_url("Username for 'https://h/org/r.git': "),
            ("username", "https://h/org/r.git"),
        )
        self.assertEqual(
            prompt_url("Password for 'https://agent@h/org/r.git': "),
            ("password", "https://agent@h/org/r.git"),
        )
        self.assertIsNone(prompt_url("Enter passphrase for key: "))

    def test_prefix(self) -> None:
        """A prefix covers the URLs below it, segment by segment."""
        self.assertTrue(under_prefix("https://h/org/r.git", "https://h/org/"))
        self.assertTrue(under_prefix("https://h/org.git", "https://h/org"))
        self.assertFalse(under_prefix("https://h/organisation/r", "https://h/org"))
        self.assertFalse(under_prefix("https://h.evil/r", "https://h"))

    def test_answers(self) -> None:
        """The right peer gets each answer once; a wrong nonce, user, process or URL gets none."""
        me = (os.getpid(), os.geteuid(), os.getegid())
        session = self.session()
        self.assertIsNone(
            session.answer(me, "wrong", "Username for 'https://h/org/r': ")
        )
        self.assertIsNone(
            session.answer(
                (os.getpid(), 12345, 0),
                session.nonce,
                "Username for 'https://h/org/r': ",
            )
        )
        self.assertIsNone(
            session.answer(
                (1, os.geteuid(), 0), session.nonce, "Username for 'https://h/org/r': "
            )
        )
        self.assertIsNone(
            session.answer(me, session.nonce, "Username for 'https://other/org/r': ")
        )
        self.assertEqual(
            session.answer(me, session.nonce, "Username for 'https://h/org/r': "),
            "agent",
        )
        self.assertIsNone(
            session.answer(me, session.nonce, "Username for 'https://h/org/r': ")
        )
        self.assertEqual(
            session.answer(me, session.nonce, "Password for 'https://agent@h/org/r': "),
            "pw",
        )
        self.assertIsNone(
            session.answer(me, session.nonce, "Password for 'https://agent@h/org/r': ")
        )
        self.assertEqual(len(session.refusals), 6)
