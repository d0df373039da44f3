"""
Big output through a code context arrives whole, byte for byte and in
order, whichever way it is read: the result document (whose output is
escaped from its bytes), the event stream, the E2B door and our client;
and the shortcuts that make that fast (a stream message's text read
without a JSON parser in the hub, output escaped for JSON as it arrives)
give exactly what the ordinary way gives, or step aside.
"""

from __future__ import annotations

import inspect
import json
from typing import Any

from twisted.internet import reactor
from twisted.internet.defer import inlineCallbacks
from twisted.internet.threads import deferToThreadPool
from twisted.trial.unittest import SkipTest, TestCase

from sandboxd.kernels.hub import FEW_ESCAPES, stream_content, utf8_chunks
from sandboxd.kernels.jsontext import (
    SMALL_OUTPUT_BYTES,
    EscapedText,
    JsonParts,
    document,
    text_object,
    text_value,
)
from sandboxd.web.jsonbody import json_bytes
from sandboxd.web.sse import BIG_TEXT_CHARS, big_text_json
from tests.client.base import ClientCase
from tests.e2b.sdk import E2BCase
from tests.kernels.test_contexts import (
    KERNEL_CALL_SECONDS,
    KERNEL_START,
    KERNEL_START_SECONDS,
    CodeTestCase,
    need_ipykernel,
)

#: Texts the fast paths take and texts they must hand to the ordinary one.
TEXTS = [
    "",
    "plain\n",
    'quotes "here", "there"\n',
    "tab\there\r\nand a carriage return\n",
    "accents é, a check ✓, an emoji 🙂\n",
    "a backslash \\ and \\n as text\n",
    "controls \x00 \x01 \x08 \x0c \x1b[31m red \x7f\n",
    "a line separator \u2028 and \u2029\n",
    '"\\"',
]

#: Bytes that are not UTF-8 (a cut character, a stray byte, a lone
#: surrogate as the hub encodes one).
BAD = [b"cut \xc3", b"stray \xff byte", b"lone \xed\xa0\x80 surrogate", b"\x80"]


def ordinary(value: Any) -> bytes:
    """What the API's JSON answer is for ``value`` (the reference)."""
    return json_bytes(value)


def known_output(size: int, rare: bool = False) -> str:
    """
    ``size`` bytes or so (UTF-8) of numbered lines (their order checkable),
    with quotes, tabs and accents; ``rare``: backslashes and control
    characters too (what the fast paths leave to the ordinary one).
    """
    extra = "\\ \x01 \x0c" if rare else ""
    lines = []
    total = 0
    i = 0
    while total < size:
        line = f'{i:07d}\t"quoted" é ✓ {extra} {"x" * (i % 50)}\n'
        lines.append(line)
        total += len(line.encode())
        i += 1
    return "".join(lines)


def printing(size: int, rare: bool = False) -> str:
    """
    Code that prints ``known_output(size, rare)`` in one write (the
    function's own source goes with it: the text is far over the code's
    size bound).
    """
    return (
        inspect.getsource(known_output)
        + f"\nimport sys\nsys.stdout.write(known_output({size}, {rare}))"
    )


class JsonTextTests(TestCase):
    """The result document's output escaped from its bytes."""

    def test_text_value_is_json_dumps(self) -> None:
        """Every text, well-formed or not, escapes to what json.dumps gives."""
        for text in TEXTS:
            raw = text.encode("utf-8")
            self.assertEqual(b"".join(text_value(raw)), ordinary(text), text)
        for raw in BAD:
            self.assertEqual(
                b"".join(text_value(raw)),
                ordinary(raw.decode("utf-8", "replace")),
                raw,
            )

    def test_document_is_the_answer(self) -> None:
        """A document with bytes and other values is the JSON answer, byte for byte."""
        fields = {
            "id": "x_1",
            "stdout": 'out "é"\n'.encode(),
            "stderr": b"bad \xff",
            "results": [{"data": {"text/plain": "2"}}],
            "error": None,
            "odd": "\ud800",
        }
        decoded = {
            k: v.decode("utf-8", "replace") if isinstance(v, bytes) else v
            for k, v in fields.items()
        }
        got = document(fields)
        self.assertEqual(json.loads(got), decoded)
        fields.pop("odd")
        decoded.pop("odd")
        self.assertEqual(document(fields), ordinary(decoded))

    def test_escaped_as_it_arrives(self) -> None:
        """Chunks escaped one by one make the whole text's JSON string."""
        text = known_output(300_000)
        escaped = EscapedText(1 << 20)
        for chunk in utf8_chunks(text.encode(), 4096):
            escaped.write(chunk)
        parts = escaped.take()
        assert parts is not None
        self.assertEqual(document({"s": JsonParts(parts)}), ordinary({"s": text}))
        self.assertIsNone(escaped.take(), "taken once")

    def test_escaped_gives_up(self) -> None:
        """Over its bound, or a chunk the fast path cannot take: None, memory freed."""
        over = EscapedText(10)
        over.write(b"12345")
        over.write(b"678901")
        self.assertIsNone(over.take())
        rare = EscapedText(100)
        rare.write(b"fine")
        rare.write(b"bell \x07")
        rare.write(b"fine again")
        self.assertEqual(rare.held_bytes, 0)
        self.assertIsNone(rare.take())
        for byte in range(0x20):
            # A big chunk is checked another way: the same answer.
            text = "x" * 100_000 + chr(byte) + "y" * 100_000
            big = EscapedText(1 << 20)
            big.write(text.encode())
            taken = big.take()
            if chr(byte) in "\t\n\r":
                assert taken is not None
                self.assertEqual(
                    document({"s": JsonParts(taken)}), ordinary({"s": text})
                )
            else:
                self.assertIsNone(taken, byte)

    def test_text_object_is_json_dumps(self) -> None:
        """An output event with a big text encodes as json.dumps would; a small one is left."""
        for text in [*TEXTS, known_output(100_000), known_output(100_000, rare=True)]:
            big = text + "x" * SMALL_OUTPUT_BYTES
            fields = {"type": "stdout", "text": big, "timestamp": "2026-12-02T04:30Z"}
            self.assertEqual(text_object(fields), ordinary(fields), text[:40])
            self.assertIsNone(text_object({**fields, "text": text[:1000]}))
        self.assertIsNone(text_object({"text": "\ud800" * SMALL_OUTPUT_BYTES}))
        self.assertIsNone(text_object({"text": 12}))
        fields = {"execution_id": "x_1", "text": known_output(2 * BIG_TEXT_CHARS)}
        self.assertEqual(big_text_json(fields), ordinary(fields))
        self.assertIsNone(big_text_json({"text": "small"}))
        self.assertIsNone(big_text_json([known_output(BIG_TEXT_CHARS)]))


class StreamContentTests(TestCase):
    """The hub reads a big stream message's text without a JSON parser, or steps aside."""

    def frames(self, text: str, name: str = "stdout") -> list[bytes]:
        """The content frame as ``json.dumps`` (ipykernel) and orjson write it."""
        content = {"name": name, "text": text}
        spaced = json.dumps(content, ensure_ascii=False).encode(
            "utf-8", "surrogateescape"
        )
        compact = json.dumps(content, ensure_ascii=False, separators=(",", ":")).encode(
            "utf-8", "surrogateescape"
        )
        return [spaced, compact]

    def test_same_as_json(self) -> None:
        """Whatever it reads is what decoding the JSON gives; the rest it leaves."""
        read = 0
        few = [
            "x" * 100_000 + "\n",
            '"quoted"\tand\r\n' + "x" * 100_000 + "\x08\x0c",
            "\n" * FEW_ESCAPES + "x" * 100_000,
            "\n" * (FEW_ESCAPES + 1) + "x" * 100_000,
        ]
        for text in [
            *TEXTS,
            *few,
            known_output(100_000),
            known_output(100_000, rare=True),
        ]:
            for name in ("stdout", "stderr"):
                for frame in self.frames(text, name):
                    got = stream_content(frame)
                    if got is None:
                        continue
                    read += 1
                    decoded = json.loads(frame)
                    self.assertEqual(got["name"], decoded["name"])
                    self.assertEqual(
                        b"".join(got["pieces"]),
                        decoded["text"].encode("utf-8", "surrogatepass"),
                    )
        self.assertGreaterEqual(read, 40, "the common texts are read the fast way")

    def test_steps_aside(self) -> None:
        """Another key, another order, escapes it cannot read, bad UTF-8: None."""
        for frame in [
            b'{"name": "stdout", "text": "a", "more": "b"}',
            b'{"text": "a", "name": "stdout"}',
            b'{"name": "stdout", "text": "a"b"}',
            b'{"name": "stdout", "text": "a\\n"b"}',
            b'{"name": "stdout", "text": "a\\n", "b": "c"}',
            b'{"name": "stdout", "text": "a\\"}',
            b'{"name": "stdout", "text": "a\\\\"}',
            b'{"name": "stdout", "text": "a\\u0041"}',
            b'{"name": "stdout", "text": "a\\/b"}',
            b'{"name": "stdout", "text": "\xff"}',
            b'{"name": "other", "text": "a"}',
        ]:
            self.assertIsNone(stream_content(frame), frame)


class BigOutputTests(CodeTestCase):
    """A real ipykernel printing megabytes, read through the native API."""

    timeout = 120 + KERNEL_START_SECONDS

    @inlineCallbacks
    def test_ten_mib_document_and_events(self) -> Any:
        """10 MiB printed: the result document and the SSE events carry it whole, in order."""
        size = 10 * 1024 * 1024 - 64 * 1024
        text = known_output(size)
        ctx = yield self.context()
        result = yield self.execute(ctx["id"], printing(size))
        self.assertEqual(result["state"], "ok")
        self.assertFalse(result["truncated"])
        self.assertEqual(result["stdout"], text)
        reader = yield self.stream(
            f"/code/contexts/{ctx['id']}/execute",
            {"code": printing(size), "stream": True},
        )
        events = yield reader.done
        out = "".join(e["data"]["text"] for e in events if e["event"] == "stdout")
        self.assertEqual(out, text)
        self.assertEqual(events[-1]["data"]["state"], "ok")

    @inlineCallbacks
    def test_few_escapes(self) -> Any:
        """A big text with a few escapes (quotes, a tab, the last newline) arrives whole."""
        code = "print('\"x\"' + 'é✓' * 300_000 + '\\t|')"
        text = '"x"' + "é✓" * 300_000 + "\t|\n"
        ctx = yield self.context()
        result = yield self.execute(ctx["id"], code)
        self.assertEqual(result["stdout"], text)
        reader = yield self.stream(
            f"/code/contexts/{ctx['id']}/execute", {"code": code, "stream": True}
        )
        events = yield reader.done
        out = "".join(e["data"]["text"] for e in events if e["event"] == "stdout")
        self.assertEqual(out, text)

    @inlineCallbacks
    def test_rare_characters(self) -> Any:
        """Backslashes and control characters (the ordinary paths) arrive whole too."""
        text = known_output(1024 * 1024, rare=True)
        ctx = yield self.context()
        result = yield self.execute(ctx["id"], printing(1024 * 1024, rare=True))
        self.assertEqual(result["stdout"], text)
        got = yield self.request(
            "GET", f"/code/contexts/{ctx['id']}/executions/{result['execution_id']}"
        )
        self.assertEqual(got.json()["stdout"], text)

    @inlineCallbacks
    def test_document_again(self) -> Any:
        """The result read again later (escaped output used once) is the same document."""
        text = known_output(512 * 1024)
        ctx = yield self.context()
        first = yield self.request(
            "POST",
            f"/code/contexts/{ctx['id']}/execute",
            {"code": printing(512 * 1024)},
        )
        xid = first.json()["execution_id"]
        again = yield self.request(
            "GET", f"/code/contexts/{ctx['id']}/executions/{xid}"
        )
        self.assertEqual(again.body, first.body)
        self.assertEqual(first.json()["stdout"], text)

    @inlineCallbacks
    def test_interleaved_order(self) -> Any:
        """stdout and stderr, small and big, alternating: the events keep their order."""
        ctx = yield self.context()
        code = (
            "import sys\n"
            "for i in range(6):\n"
            "    print(f'out{i}', flush=True)\n"
            "    print(f'err{i}', file=sys.stderr, flush=True)\n"
            "    sys.stdout.write(str(i) * 300000); sys.stdout.flush()\n"
            "    sys.stderr.write(chr(97 + i) * 300000); sys.stderr.flush()\n"
        )
        reader = yield self.stream(
            f"/code/contexts/{ctx['id']}/execute", {"code": code, "stream": True}
        )
        events = yield reader.done
        seen: list[tuple[str, str]] = []
        for e in events:
            if e["event"] not in ("stdout", "stderr"):
                continue
            if seen and seen[-1][0] == e["event"]:
                seen[-1] = (e["event"], seen[-1][1] + e["data"]["text"])
            else:
                seen.append((e["event"], e["data"]["text"]))
        expected: list[tuple[str, str]] = []
        for i in range(6):
            expected += [
                ("stdout", f"out{i}\n"),
                ("stderr", f"err{i}\n"),
                ("stdout", str(i) * 300000),
                ("stderr", chr(97 + i) * 300000),
            ]
        # Consecutive pieces of one stream may arrive as one.
        self.assertEqual(
            [(k, len(t)) for k, t in seen],
            [(k, len(t)) for k, t in _merged(expected)],
        )
        self.assertEqual(seen, _merged(expected))

    @inlineCallbacks
    def test_forged_output_never_seen(self) -> Any:
        """
        ``stream`` messages signed with the wrong key, big and small, are
        never seen: not in the result document, its events, nor the
        execution read again; the good print beside them is seen once,
        whole.
        """
        size = 2 * 1024 * 1024
        text = known_output(size)
        ctx = yield self.context()
        code = printing(size) + FORGING
        result = yield self.execute(ctx["id"], code)
        self.assertEqual(result["state"], "ok")
        self.assertEqual(result["stdout"], text)
        self.assertEqual(result["stderr"], "")
        again = yield self.request(
            "GET", f"/code/contexts/{ctx['id']}/executions/{result['execution_id']}"
        )
        self.assertEqual(again.json()["stdout"], text)
        reader = yield self.stream(
            f"/code/contexts/{ctx['id']}/execute", {"code": code, "stream": True}
        )
        events = yield reader.done
        self.assertEqual(events[-1]["data"]["state"], "ok")
        out = [e["data"]["text"] for e in events if e["event"] in ("stdout", "stderr")]
        self.assertEqual("".join(out), text)
        self.assertNotIn("FORGED", json.dumps([e["data"] for e in events]))


#: Code a cell ends with: it sends its kernel's iopub ``stream`` messages
#: for the running execution signed with a key that is not its kernel's,
#: before and after its own print leaves (6 MiB, 18 MiB and a small one).
FORGING = """
from jupyter_client.session import Session
kernel = get_ipython().kernel
forger = Session(key=b"not the key", session=kernel.session.session)
parent = kernel.get_parent("shell")
for name, size in (("stdout", 1 << 20), ("stderr", 3 << 20), ("stdout", 99)):
    forger.send(
        kernel.iopub_socket, "stream", {"name": name, "text": "FORGED" * size},
        parent=parent, ident=b"stream." + name.encode(),
    )
    sys.stdout.flush()
"""


def _merged(pieces: list[tuple[str, str]]) -> list[tuple[str, str]]:
    """Consecutive pieces of one stream joined."""
    out: list[tuple[str, str]] = []
    for kind, text in pieces:
        if out and out[-1][0] == kind:
            out[-1] = (kind, out[-1][1] + text)
        else:
            out.append((kind, text))
    return out


class BigOutputE2BTests(E2BCase):
    """The same 10 MiB through the E2B door and E2B's own SDK."""

    timeout = 120 + KERNEL_START_SECONDS
    policy = {"groups": {"code": True}, **KERNEL_START}

    def setUp(self) -> Any:
        need_ipykernel()
        try:
            import e2b_code_interpreter  # noqa: F401
        except ImportError:
            raise SkipTest("e2b-code-interpreter is not installed") from None
        return super().setUp()

    @inlineCallbacks
    def test_ten_mib_run_code(self) -> Any:
        """run_code's stdout logs join to the printed text, whole and in order."""
        from e2b_code_interpreter import Sandbox

        size = 10 * 1024 * 1024 - 64 * 1024
        text = known_output(size)
        sbx = Sandbox.create()
        run = deferToThreadPool(
            reactor, self.pool, sbx.run_code, printing(size), timeout=100
        )
        execution = yield run.addTimeout(110, reactor)
        self.assertIsNone(execution.error)
        self.assertEqual("".join(execution.logs.stdout), text)


class BigOutputClientTests(ClientCase):
    """The same 10 MiB through ``sb.code``."""

    timeout = 120 + KERNEL_START_SECONDS
    policy = {"groups": {"code": True}, **KERNEL_START}

    def setUp(self) -> Any:
        need_ipykernel()
        return super().setUp()

    @inlineCallbacks
    def test_ten_mib_execute(self) -> Any:
        """sb.code.execute's result holds the printed text, whole and in order."""
        size = 10 * 1024 * 1024 - 64 * 1024
        text = known_output(size)

        def body(sb: Any) -> Any:
            ctx = sb.code.create_context()
            return sb.code.execute(ctx["id"], printing(size))

        sandbox = self.sandbox(timeout=KERNEL_CALL_SECONDS)
        result = yield self.in_thread(lambda: body(sandbox))
        self.assertEqual(result["state"], "ok")
        self.assertEqual(result["stdout"], text)

    @inlineCallbacks
    def test_told_to_wait(self) -> Any:
        """
        Told to wait, and read again by its id, sb.code gives the daemon's
        document as json.loads reads it (its output read the short way).
        """
        size = 4 * 1024 * 1024
        text = known_output(size)
        code = printing(size) + "\nsys.stderr.write('warn \"x\"\\n' * 9000)"

        def body(sb: Any) -> Any:
            ctx = sb.code.create_context()
            first = sb.code.execute(ctx["id"], code, wait=KERNEL_CALL_SECONDS)
            again = sb.code.execution(ctx["id"], first["execution_id"])
            return ctx["id"], first, again

        sandbox = self.sandbox(timeout=KERNEL_CALL_SECONDS)
        cid, first, again = yield self.in_thread(lambda: body(sandbox))
        self.assertEqual(first["stdout"], text)
        self.assertEqual(first["stderr"], 'warn "x"\n' * 9000)
        raw = yield self.request(
            "GET", f"/code/contexts/{cid}/executions/{first['execution_id']}"
        )
        self.assertEqual(first, json.loads(raw.body))
        self.assertEqual(again, json.loads(raw.body))
