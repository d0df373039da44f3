"""
``sandboxd.daemon.scratch``: a daemon's own directory in the temporary
directory, and what a start removes of those daemons that are gone left.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap

from twisted.trial.unittest import SynchronousTestCase

from sandboxd.daemon.scratch import PREFIX, Scratch, sweep

#: A process that makes a scratch directory with a private directory and
#: a staging note in it, says where, and waits to be killed.
_HOLDER = textwrap.dedent(
    """
    import sys
    from sandboxd.daemon.scratch import Scratch
    scratch = Scratch(sys.argv[1])
    print(scratch.mkdtemp("sandboxd-code-"), flush=True)
    for path in sys.argv[2:]:
        scratch.staging(path)
    print("noted", flush=True)
    sys.stdin.read()
    """
)


class ScratchTests(SynchronousTestCase):
    """One directory per daemon, locked while it lives, removed when it stops."""

    def setUp(self) -> None:
        self.parent = os.path.realpath(self.mktemp())
        os.makedirs(self.parent)

    def holder(self, *staged: str) -> tuple[subprocess.Popen[str], str]:
        """Another process holding a scratch directory; its private directory."""
        proc = subprocess.Popen(
            [sys.executable, "-c", _HOLDER, self.parent, *staged],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        self.addCleanup(proc.wait)
        self.addCleanup(proc.kill)
        assert proc.stdout is not None
        private = proc.stdout.readline().strip()
        self.assertEqual(proc.stdout.readline().strip(), "noted")
        return proc, private

    def test_made_on_first_use(self) -> None:
        """
        Nothing is made until a directory is asked for; then one, locked,
        that others may pass through to what is made for them; a stop
        removes it with everything in it.
        """
        scratch = Scratch(self.parent)
        self.assertEqual(os.listdir(self.parent), [])
        first = scratch.mkdtemp("sandboxd-code-")
        second = scratch.mkdtemp("sandboxd-browser-")
        [name] = os.listdir(self.parent)
        self.assertTrue(name.startswith(PREFIX))
        self.assertEqual(os.path.dirname(first), os.path.join(self.parent, name))
        self.assertEqual(os.path.dirname(second), os.path.dirname(first))
        self.assertEqual(os.stat(os.path.dirname(first)).st_mode & 0o777, 0o711)
        self.assertEqual(os.stat(first).st_mode & 0o777, 0o700)
        scratch.close()
        self.assertEqual(os.listdir(self.parent), [])
        scratch.close()

    def test_live_daemons_kept(self) -> None:
        """
        A sweep leaves the directory of a daemon that lives, in another
        process or in this one.
        """
        _, theirs = self.holder()
        scratch = Scratch(self.parent)
        self.addCleanup(scratch.close)
        mine = scratch.mkdtemp("sandboxd-code-")
        self.assertEqual(sweep(self.parent), [])
        self.assertTrue(os.path.isdir(theirs))
        self.assertTrue(os.path.isdir(mine))

    def test_gone_daemons_removed(self) -> None:
        """
        The directory of a daemon killed with SIGKILL is removed by a
        sweep, and the staging files it noted with it; a noted path that
        is no staging file's name, or no longer a file, stays.
        """
        work = os.path.join(self.parent, "work")
        os.makedirs(work)
        staged = os.path.join(work, ".big.tar.0123456789ab.new.upload")
        other = os.path.join(work, "notes.txt")
        folder = os.path.join(work, ".dir.0123456789ab.upload")
        for path in (staged, other):
            with open(path, "w") as f:
                f.write("x")
        os.makedirs(folder)
        proc, private = self.holder(staged, other, folder)
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        self.assertTrue(os.path.isdir(private))
        self.assertEqual(sweep(self.parent), [os.path.dirname(private)])
        self.assertEqual(sorted(os.listdir(self.parent)), ["work"])
        self.assertEqual(
            sorted(os.listdir(work)), [".dir.0123456789ab.upload", "notes.txt"]
        )

    def test_names_with_a_newline(self) -> None:
        """A staging file's name holding a newline is noted, and removed, whole."""
        odd = os.path.join(self.parent, ".a\nb.0123456789ab.upload")
        with open(odd, "w") as f:
            f.write("x")
        proc, private = self.holder(odd)
        with open(os.path.join(os.path.dirname(private), "staging")) as f:
            self.assertEqual([json.loads(line) for line in f], [odd])
        proc.kill()
        proc.wait()
        sweep(self.parent)
        self.assertEqual(os.listdir(self.parent), [])
