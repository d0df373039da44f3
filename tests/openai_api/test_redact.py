"""The stream redactor on its own (pure logic)."""

from __future__ import annotations

from twisted.trial.unittest import SynchronousTestCase

from sandboxd.openai_api.redact import MARK, Redactor


class StreamRedactorTests(SynchronousTestCase):
    """Secrets are replaced whatever the chunking; nothing else is held back for long."""

    def run_chunks(
        self, secrets: list[str], chunks: list[str]
    ) -> tuple[list[str], str]:
        stream = Redactor(secrets).stream()
        shown = [stream.feed(c) for c in chunks]
        return shown, "".join(shown) + stream.flush()

    def test_one_character_at_a_time(self) -> None:
        """A secret fed a character at a time never shows, even in part."""
        text = "key=abcd1234 and again abcd1234."
        shown, whole = self.run_chunks(["abcd1234"], list(text))
        self.assertEqual(whole, f"key={MARK} and again {MARK}.")
        self.assertNotIn("abcd", "".join(shown).replace(MARK, ""))

    def test_near_miss_is_released(self) -> None:
        """A prefix that turns out not to be a secret is shown with the next chunk."""
        shown, whole = self.run_chunks(["abcd1234"], ["xx abcd", "12 done"])
        self.assertEqual(shown, ["xx ", "abcd12 done"])
        self.assertEqual(whole, "xx abcd12 done")

    def test_short_values_and_no_secrets(self) -> None:
        """Values under four characters are not secrets; no secrets means no hold-back."""
        shown, whole = self.run_chunks(["abc"], ["ab", "c"])
        self.assertEqual((shown, whole), (["ab", "c"], "abc"))

    def test_longest_secret_first(self) -> None:
        """A secret inside a longer one: the longer is replaced whole."""
        _, whole = self.run_chunks(["token", "token-extended"], ["a token-extended b"])
        self.assertEqual(whole, f"a {MARK} b")

    def test_added_values_in_their_encodings(self) -> None:
        """
        A value added later (a vault token) is masked as written, URL-encoded
        and JSON-escaped, in a stream already open, split across chunks.
        """
        redactor = Redactor([])
        stream = redactor.stream()
        redactor.add(['t/k"n 42'])
        text = 'a t/k"n 42 b t%2Fk%22n%2042 c t/k\\"n 42 d'
        shown = [stream.feed(c) for c in text]
        whole = "".join(shown) + stream.flush()
        self.assertEqual(whole, f"a {MARK} b {MARK} c {MARK} d")
