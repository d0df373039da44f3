"""What the endpoints of files and folders: read, write, list, move, upload, download, watch take and give."""

from __future__ import annotations

import attrs

from sandboxd.api.fields import E, Event, F, Schema
from sandboxd.api.fragments import GAP, GUARD, LAST_EVENT_ID, QUERY_TOKEN, RESUME

_WRITE_GUARD = (*GUARD, E(403, "read_only", "below a paths.read_only entry"))


_WRITE = (
    E(403, "extension_not_allowed", "allow_extensions or deny_extensions refused it"),
    E(
        409,
        "file_exists",
        "the target exists and overwrite is false (or params.overwrite is)",
        "FileExistsError",
    ),
    E(412, "precondition_failed", "If-Match names a version the file no longer has"),
    E(413, "payload_too_large", "the file is over max_bytes"),
    E(
        507,
        "insufficient_storage",
        "the disk filled up; nothing was written",
        "OSError",
    ),
)


_ETAG = F("etag", doc="the file's version, for If-Match")


#: What a search leaves out: files_search's and files_grep's (their
#: defaults differ: the seed's name search sees every name).
def _search_skips(everything: bool) -> tuple[F, ...]:
    return (
        F(
            "exclude",
            "array",
            "gitignore globs left out, from path (node_modules, dist/**)",
            items="string",
            min_length=1,
        ),
        F(
            "no_ignore",
            "boolean",
            "also what .gitignore files name",
            default=everything,
        ),
        F(
            "hidden",
            "boolean",
            "also hidden (dot) files and directories",
            default=everything,
        ),
    )


#: How far a search goes: files_search's and files_grep's.
_SEARCH_BOUNDS = (
    F("max_results", "integer", "at most max_entries", default=1000, minimum=1),
    F("max_depth", "integer", "levels searched (1: path's own entries)", minimum=1),
)


_IF_MATCH = F("if_match", doc="write only if the file still has this ETag")


#: A body's permissions: the text the seed takes, or the number itself.
_MODE = F("mode", "any", 'octal permissions: text ("644") or their number (420)')


_UPLOAD_RECORD = (
    F("upload_id", doc="names the upload in the routes below"),
    F("path", doc="the target, resolved"),
    F("requested_path", doc="the path as files_uploads_create was given it"),
    F("size", "integer"),
    F("offset", "integer", "bytes written so far: the next append starts here"),
    F("expires_at", doc="ISO 8601 UTC: dropped then unless a byte arrives"),
)


_NO_UPLOAD = E(
    404,
    "not_found",
    "no such upload: unknown, completed, expired, deleted, or another identity's",
    "NotFoundError",
)


#: SPEC §20: what the file API creates belongs to the request's user.
_OWNER = F(
    "user",
    "any",
    "when the daemon runs as root, the user (name or uid) who owns the files and directories this "
    "creates (default params.default_user; must be allowed by params.users)",
)

#: The same in a query string, where every value is text.
_OWNER_QUERY = F("user", doc=_OWNER.doc)


SCHEMAS: dict[str, Schema] = {
    "upload": Schema(
        body=(
            _OWNER,
            F("path", required=True, min_length=1, example="hello.txt"),
            F("content_base64", required=True, example="aGVsbG8K"),
            F("overwrite", "boolean", default=True),
            _MODE,
            _IF_MATCH,
            F(
                "append",
                "boolean",
                "add to the end of the file (a big one in parts)",
                default=False,
            ),
        ),
        response=(
            F("path", doc="absolute"),
            F("bytes", "integer", "bytes written"),
            _ETAG,
            F("size", "integer", "with append: the file's size after it"),
        ),
        errors=(*_WRITE_GUARD, *_WRITE),
        notes="Parent directories are created. The file is written to a temporary "
        "name and renamed, so it lands whole or not at all. With append the bytes "
        "are added to the end of an existing file in place (404 when there is "
        "none: write the first part without append); if_match is then checked "
        "before appending. A file too big for one request (an MCP message is at "
        "most 1 MiB) is written in parts this way.",
    ),
    "download": Schema(
        query=(
            F("path", required=True, min_length=1, example="hello.txt"),
            F(
                "offset",
                "integer",
                "only some lines: the first one, from 1 (below 0: from the end, "
                "-1 being the last)",
            ),
            F("limit", "integer", "only some lines: how many", minimum=1),
        ),
        response=(
            F("path"),
            F("content_base64", doc="the file, or with offset or limit its lines"),
            _ETAG,
            F("offset", "integer", "with offset or limit: the first line given"),
            F("lines", "integer", "with offset or limit: the lines given"),
            F("total_lines", "integer", "with offset or limit: the file's lines"),
            F("more", "boolean", "with offset or limit: lines follow those given"),
        ),
        errors=(
            *GUARD,
            E(400, "invalid_param", "the path is a directory; an offset of 0"),
            E(404, "not_found", "no such file", "FileNotFoundError"),
            E(
                413,
                "payload_too_large",
                "the file is over max_bytes; with offset or limit, the lines asked for are",
            ),
        ),
        notes="With offset or limit the file may be any size: it is read a chunk at a "
        "time to find the lines, and only they are sent (a long log's last lines).",
    ),
    "files_list": Schema(
        query=(
            F("path", doc="default: base_dir (see paths.allow)", example="."),
            F("depth", "integer", "1..10", default=1, minimum=1, maximum=10),
            F(
                "recursive",
                "boolean",
                "without depth: list 3 levels deep (agent-sandbox-server's form)",
                default=False,
            ),
            F("max_entries", "integer", "at most the policy's max_entries", minimum=1),
            F("hidden", "boolean", "include dot files", default=True),
        ),
        response=(
            F("path", doc="the directory listed"),
            F(
                "entries",
                "array",
                "[{name, path, type: file|directory|symlink|other (a named "
                "pipe, socket or device), size, "
                "modified (ISO 8601 UTC, with microseconds)}]",
                items="object",
            ),
            F("truncated", "boolean", "max_entries (10000) was reached"),
        ),
        errors=(
            *GUARD,
            E(404, "not_found", "no such directory", "FileNotFoundError"),
            E(404, "not_found", "the path is a file", "NotADirectoryError"),
        ),
        notes="Entries the guard refuses, and links leading out of the boundary, are "
        "skipped. A name that is not UTF-8 shows each such byte as \\xNN; a query "
        "names it by its bytes percent-encoded (%E9).",
    ),
    "files_stat": Schema(
        query=(F("path", required=True, min_length=1, example="hello.txt"),),
        response=(
            F("name"),
            F("path"),
            F(
                "type",
                enum=("file", "directory", "symlink", "other", "unknown"),
                doc="other: a named pipe, socket or device; unknown: nothing there",
            ),
            F("size", "integer"),
            F("permissions", doc='octal, e.g. "644"'),
            F("modified", doc="ISO 8601 UTC, with microseconds"),
            F("accessed", doc="ISO 8601 UTC"),
            F(
                "created",
                doc="ISO 8601 UTC: the inode's change time, as agent-sandbox-server reports it",
            ),
            F("exists", "boolean"),
            F("etag", doc="regular files only"),
        ),
        errors=GUARD,
        notes="A missing path inside the boundary is 200 with exists: false.",
    ),
    "files_mkdir": Schema(
        body=(F("path", required=True, min_length=1, example="project/src"), _OWNER),
        response=(F("path"), F("created", "boolean")),
        errors=_WRITE_GUARD,
        notes="Parents are created; an existing directory is fine.",
    ),
    "files_chmod": Schema(
        body=(
            F("path", required=True, min_length=1, example="run.sh"),
            attrs.evolve(_MODE, required=True, example="755"),
        ),
        response=(
            F("path", doc="absolute (a link resolved)"),
            F("mode", doc="as set, octal text"),
        ),
        errors=(
            *_WRITE_GUARD,
            E(400, "invalid_param", "a mode that is not octal 000..777"),
            E(403, "permission_denied", "a file the daemon's user does not own"),
            E(404, "not_found", "no such path", "FileNotFoundError"),
        ),
        notes="Permission bits only: set-user-ID, set-group-ID and sticky are "
        "refused. A link is followed inside the boundary; a device is refused.",
    ),
    "files_delete": Schema(
        query=(
            F(
                "path",
                min_length=1,
                doc="what to delete (or 'path' in the body)",
                example="project/build",
            ),
        ),
        body=(
            F(
                "path",
                min_length=1,
                doc="accepted here too, for clients that send a body "
                "(given in both places, the two must be the same)",
            ),
        ),
        response=(F("path"), F("deleted", "boolean")),
        errors=(
            E(
                400,
                "duplicate_parameter",
                "path in the query and in the body with different values",
            ),
            *_WRITE_GUARD,
            E(403, "path_denied", "the base dir itself (rule guard:base_dir)"),
            E(
                403,
                "path_not_allowed",
                "another root of paths.allow, a mount point, or a tree holding one",
            ),
            E(404, "not_found", "no such path", "FileNotFoundError"),
            E(
                409,
                "file_exists",
                "an entry was made in the directory while it was deleted (what "
                "was there is gone, the new entry stays): delete it again",
            ),
        ),
        notes="Directories are removed recursively; a link is removed, not its target.",
    ),
    "files_move": Schema(
        body=(
            F("source", required=True, min_length=1, example="a.txt"),
            F("destination", required=True, min_length=1, example="b.txt"),
            F("overwrite", "boolean", default=False),
            _OWNER,
        ),
        response=(F("source"), F("destination")),
        errors=(
            *_WRITE_GUARD,
            E(
                400,
                "invalid_param",
                "to another file system: a socket in the tree, or a mount inside it",
            ),
            E(403, "path_not_allowed", "a mount point to move or to replace"),
            E(404, "not_found", "no such source", "FileNotFoundError"),
            E(
                409,
                "file_exists",
                "the destination exists and overwrite (or params.overwrite) is false",
            ),
            E(413, "payload_too_large", "to another file system: over max_entries"),
            E(
                504,
                "timeout",
                "to another file system: the copy took over timeout_seconds",
                "TimeoutError",
            ),
            E(507, "insufficient_storage", "no room for the copy on the destination"),
        ),
        notes='Messages are prefixed "source:" or "destination:". Into a directory '
        "when the destination is one, or a link to one the path rules allow. "
        "To another file system it is copied, "
        "then the source removed; an error leaves the source as it was.",
    ),
    "files_edit": Schema(
        body=(
            F("path", required=True, min_length=1, example="app.py"),
            F(
                "old_text",
                doc="the text to replace, exactly as in the file",
                min_length=1,
                example="DEBUG = True",
            ),
            F("new_text", example="DEBUG = False"),
            F(
                "insert_line",
                "integer",
                "instead of old_text: add new_text after this line (0: first)",
                minimum=0,
            ),
            F(
                "replace_all",
                "boolean",
                "every occurrence, not exactly one",
                default=False,
            ),
            F(
                "edits",
                "array",
                "[{old_text|insert_line, new_text, replace_all?}] in order, all or "
                "none",
                items="object",
                min_items=1,
            ),
            F("dry_run", "boolean", "write nothing", default=False),
            _IF_MATCH,
        ),
        response=(
            F("path", doc="absolute"),
            F("replacements", "integer"),
            F(
                "edits",
                "array",
                "per edit: {replacements, line}",
                items="object",
            ),
            F("bytes", "integer"),
            F("changed", "boolean"),
            _ETAG,
        ),
        errors=(
            *_WRITE_GUARD,
            E(
                400,
                "invalid_param",
                "an edit's old_text is not in the file (kind: not_found) or is there "
                "more than once without replace_all (kind: not_unique, with "
                "occurrences), its insert_line past the last line (kind: "
                "past_end); the file is not UTF-8 (kind: not_text) or not a "
                "regular file; an empty old_text, edits and old_text both, over 100 "
                "edits",
            ),
            E(
                403,
                "extension_not_allowed",
                "allow_extensions or deny_extensions refused it",
            ),
            E(404, "not_found", "no such file", "FileNotFoundError"),
            E(
                412,
                "precondition_failed",
                "If-Match names a version the file no longer has, "
                "or the file changed while it was edited",
            ),
            E(413, "payload_too_large", "the file is over max_bytes (10 MiB)"),
            E(
                507,
                "insufficient_storage",
                "the disk filled up; nothing was written",
                "OSError",
            ),
        ),
        notes="Each edit applies to the text the one before left; if any fails, "
        "none is written. The new text replaces the file atomically and only if "
        "no one changed it since it was read; without if_match, an edit that "
        "meets another writer's change is applied again to the new text (its "
        "old_text looked for there), up to 3 times, before a 412 saying so. The "
        "file keeps its mode and owner. "
        "A refused edit is named by its index (edit). In a file whose lines all "
        "end in CRLF, an edit's LF line ends match and are written as CRLF. "
        "A byte order mark stays first.",
    ),
    "files_search": Schema(
        body=(
            F("path", doc="default: base_dir (see paths.allow)"),
            F(
                "pattern",
                doc="fnmatch on names, recursive (a leading **/ is dropped)",
                required=True,
                min_length=1,
                example="*.py",
            ),
            *_SEARCH_BOUNDS,
            *_search_skips(True),
        ),
        response=(
            F("results", "array", "[{name, path}]", items="object"),
            F("timed_out", "boolean", "the 10 s walk limit (timeout_seconds) ran out"),
            F("truncated", "boolean"),
        ),
        errors=(
            *GUARD,
            E(
                400,
                "invalid_param",
                "a pattern over 1024 characters, or one holding / (past a leading "
                "**/); an empty exclude glob, or over 64 of them",
            ),
        ),
        notes="Unlike files_grep, every name is found by default, hidden ones "
        "and those ignore files name included; no_ignore: false and hidden: false "
        "leave them out as files_grep does.",
    ),
    "files_grep": Schema(
        body=(
            F(
                "pattern",
                doc="a regular expression (RE2), or the text itself with fixed_strings",
                required=True,
                min_length=1,
                example="TODO",
            ),
            F(
                "path",
                doc="a directory (recursive) or a file; default: base_dir",
            ),
            F(
                "fixed_strings",
                "boolean",
                "pattern is plain text",
                default=False,
            ),
            F("ignore_case", "boolean", default=False),
            F("include", doc="glob on file names (*.py, *.{js,ts})"),
            F(
                "context",
                "integer",
                "lines around each match",
                default=0,
                minimum=0,
                maximum=5,
            ),
            *_SEARCH_BOUNDS,
            *_search_skips(False),
        ),
        response=(
            F(
                "matches",
                "array",
                "[{path, line, column, text, cut}] in walk order, one per match: "
                "line and column count from 1 (column in characters); text is "
                "the line without its newline, cut to 1024 characters around "
                "the match (only then cut: true, and text_column: where text "
                "starts); with context, before and after: the lines around it",
                items="object",
            ),
            F("files_searched", "integer", "files read"),
            F("files_matched", "integer", "files with a match"),
            F(
                "files_skipped",
                "integer",
                "binary (a NUL in the first 8 KiB), over max_bytes (16 MiB), "
                "or unreadable",
            ),
            F("truncated", "boolean", "more matches than max_results"),
            F(
                "timed_out",
                "boolean",
                "the 10 s limit (timeout_seconds) ran out: the matches found "
                "until then",
            ),
        ),
        errors=(
            *GUARD,
            E(
                400,
                "invalid_param",
                "a pattern RE2 does not take (bad syntax, a backreference or "
                "lookaround, a repeat over 1000, a program over 8 MiB), one over "
                "1024 characters, a field of the wrong type, an empty exclude "
                "glob, or over 64 of them",
            ),
            E(404, "not_found", "no such path", "FileNotFoundError"),
        ),
        notes="Patterns take RE2's syntax (as ripgrep's: no backreferences or "
        "lookarounds), matched in time linear in the text; a match never spans "
        "a newline (a pattern holding one is 400), ^ and $ are a line's ends. Files are read as UTF-8 (bad bytes shown as U+FFFD). Links are not "
        "followed; .git, .hg and .svn are not searched; what the policy hides "
        "from a listing is not read; include does not apply to a file named by "
        "path. An empty match (^) counts once a line; in a file with CRLF line "
        "ends $ matches before the CR. As ripgrep by default, hidden files and "
        "directories are not searched, nor what .gitignore, .ignore and "
        ".rgignore files name (those below path, in path, and in its parents up "
        "to the repository's root, the directory holding .git, or outside a "
        "repository up to base_dir): a project's node_modules or build output "
        "is left out when its .gitignore says so. no_ignore and hidden search "
        "them too (ripgrep's --no-ignore and --hidden); exclude leaves out more.",
    ),
    "files_upload_stream": Schema(
        body=(
            _OWNER,
            F("path", required=True, min_length=1, example="data.bin"),
            F("content_base64", required=True, example="aGVsbG8K"),
            F("overwrite", "boolean", default=True),
            _MODE,
            _IF_MATCH,
        ),
        response=(F("path"), F("bytes", "integer"), _ETAG),
        errors=(*_WRITE_GUARD, *_WRITE),
        notes="Decoded in chunks into a temporary file in the target directory and "
        "renamed into place: a failed or oversize upload leaves the old file intact. "
        "Cap: ABX_MAX_UPLOAD_SIZE or max_bytes (100 MB).",
    ),
    "files_download_stream": Schema(
        query=(F("path", required=True, min_length=1, example="data.bin"),),
        response=(F("path"), _ETAG, F("content_base64"), F("bytes", "integer")),
        errors=(
            *GUARD,
            E(404, "not_found", "no such file", "FileNotFoundError"),
            E(413, "payload_too_large", "the file is over max_bytes"),
        ),
        notes="The JSON is written as the file is read; `bytes` comes last.",
    ),
    "files_archive": Schema(
        body=(
            F(
                "paths",
                "array",
                "files and directories to pack",
                required=True,
                items="string",
                min_items=1,
                min_length=1,
                example=["project"],
            ),
            F("format", enum=("tar.gz", "zip"), default="tar.gz", example="tar.gz"),
        ),
        response=(
            F("content_base64"),
            F("format"),
            F("bytes", "integer"),
            F(
                "skipped",
                "integer",
                "named pipes, sockets and devices left out (no content to pack)",
            ),
        ),
        errors=(
            *GUARD,
            E(400, "invalid_param", "empty paths or an unknown format"),
            E(
                412,
                "precondition_failed",
                "a file shrank while it was packed (rewritten meanwhile), on each "
                "of 3 tries; the message names it",
            ),
            E(
                413,
                "payload_too_large",
                "over max_entries (10000 files) or max_bytes (100 MB)",
            ),
        ),
        notes="Members are stored relative to base_dir; symlinks are stored as links, "
        "never followed out of the boundary. A name that is not UTF-8 is kept as its "
        "bytes in a tar; a zip names members in UTF-8, so there it is stored as "
        "files_list shows it (each such byte as \\xNN).",
    ),
    "files_extract": Schema(
        body=(
            F("content_base64", required=True, example="$(base64 -w0 project.tar.gz)"),
            F("destination", required=True, min_length=1, example="project"),
            F("format", enum=("tar.gz", "zip"), default="tar.gz", example="tar.gz"),
            F("overwrite", "boolean", default=False),
            _OWNER,
        ),
        response=(F("destination"), F("files", "integer"), F("bytes", "integer")),
        errors=(
            *_WRITE_GUARD,
            E(400, "invalid_param", "bad base64, unknown format or a broken archive"),
            E(
                403,
                "path_not_allowed",
                "a member would land outside the destination "
                "(absolute, .., links out, devices, a hard link to anything "
                "but an earlier file member, which it is written as a copy "
                "of); nothing is written",
            ),
            E(409, "file_exists", "a member exists and overwrite is false"),
            E(413, "payload_too_large", "over max_entries or max_bytes"),
            E(
                507,
                "insufficient_storage",
                "the disk filled up; what was written is removed",
            ),
        ),
    ),
    "files_read_raw": Schema(
        query=(F("path", required=True, min_length=1, example="data.bin"),),
        headers=(
            F("Range", doc="one byte range: bytes=START-END"),
            F("If-None-Match", doc="an ETag: 304 when unchanged"),
            F("If-Range", doc="an ETag: the Range applies only while it matches"),
        ),
        produces="binary",
        response=(
            F("ETag", doc="header"),
            F("Last-Modified", doc="header"),
            F("Content-Length", doc="header"),
            F("Content-Range", doc="header, on 206"),
        ),
        errors=(
            *GUARD,
            E(404, "not_found", "no such file", "FileNotFoundError"),
            E(
                413,
                "payload_too_large",
                "the file is over max_bytes (when the policy sets one)",
            ),
            E(416, "invalid_param", "the range is not satisfiable"),
        ),
        notes="application/octet-stream, streamed by a producer, never held in memory; "
        "206 for a Range, 304 for a matching If-None-Match.",
    ),
    "files_write_raw": Schema(
        query=(
            F("path", required=True, min_length=1, example="data.bin"),
            F("overwrite", "boolean", default=True),
            F("mode", doc='octal permissions, e.g. "644"'),
            _OWNER_QUERY,
        ),
        headers=(
            F(
                "Content-Length",
                "integer",
                "required: the upload is refused from it when over max_bytes",
            ),
            F("If-Match", doc="write only if the file still has this ETag"),
        ),
        raw_body=True,
        response=(F("path"), F("bytes", "integer"), F("sha256"), _ETAG),
        errors=(*_WRITE_GUARD, *_WRITE),
        notes="The raw body is written as it arrives and renamed into place: the fast "
        "path for large files (no base64, no JSON). A cut connection loses the whole "
        "body; to carry a large file on from where a cut left it, use a resumable "
        "upload: files_uploads_create with the size, then files_uploads_append from "
        "the offset files_uploads_get reports.",
    ),
    "files_uploads_create": Schema(
        body=(
            F("path", required=True, min_length=1, example="big.bin"),
            F(
                "size",
                "integer",
                "the file's whole size: refused (413) over max_bytes",
                required=True,
                example=1048576,
                minimum=0,
            ),
            F("overwrite", "boolean", default=True),
            _MODE,
            _IF_MATCH,
            _OWNER,
        ),
        headers=(F("If-Match", doc="write only if the file still has this ETag"),),
        status=201,
        response=_UPLOAD_RECORD,
        errors=(
            *_WRITE_GUARD,
            *_WRITE,
            E(
                429,
                "too_many_sessions",
                "max_sessions (16) uploads are open (or the identity's share), "
                "none of them without a byte for 5 minutes (such an upload, "
                "left by a client that died, is dropped to make room); "
                "Retry-After says when the first one can be, unless each has an "
                "append running; files_uploads_list lists the caller's",
                "ResourceError",
            ),
        ),
        notes="Every refusal happens here, before a byte is sent. The bytes go to "
        "a staging file in the target's directory that has no name until the "
        "append that completes it renames it into place (on a file system "
        "without unnamed files, a hidden .NAME.<hex>.upload, left out of "
        "listings, searches and archives), so a daemon killed meanwhile "
        "leaves nothing; an upload idle for "
        "idle_timeout_seconds (3600) is dropped with its staging file, as on "
        "DELETE and when the daemon stops.",
    ),
    "files_uploads_list": Schema(
        response=(
            F(
                "uploads",
                "array",
                "the caller's open uploads, each as files_uploads_get answers "
                "(upload_id, path, requested_path, size, offset, expires_at), "
                "the one idle longest first",
                items="object",
            ),
        ),
        notes="Only the caller's uploads (a link's are its minter's). A client that "
        "lost its upload ids finds them here, to carry one on from its offset or "
        "delete it when files_uploads_create answers 429.",
    ),
    "files_uploads_get": Schema(
        response=_UPLOAD_RECORD,
        errors=(_NO_UPLOAD,),
        notes="offset counts the bytes written to the staging file: after a cut "
        "connection, the append to send next starts there.",
    ),
    "files_uploads_append": Schema(
        query=(
            F(
                "offset",
                "integer",
                "where this body starts: the upload's current offset",
                required=True,
                example=0,
                minimum=0,
            ),
        ),
        headers=(
            F(
                "Content-Length",
                "integer",
                "required: offset + Content-Length may not pass size",
            ),
        ),
        raw_body=True,
        response=(
            F("upload_id", doc="while incomplete"),
            F("offset", "integer", "while incomplete: bytes written so far"),
            F("size", "integer", "while incomplete"),
            F("path", doc="when complete: the file, renamed into place"),
            F("bytes", "integer", "when complete"),
            F("sha256", doc="when complete: of the whole file"),
            F("etag", doc="when complete: the file's version, for If-Match"),
            F("complete", "boolean", "whether the file is in place"),
        ),
        errors=(
            _NO_UPLOAD,
            E(
                400,
                "invalid_param",
                "offset is not the upload's offset (the current one is in the "
                "error's offset field); nothing is written",
            ),
            E(
                412,
                "precondition_failed",
                "at completion, the file no longer has the If-Match ETag "
                "(the upload is dropped)",
            ),
            E(
                409,
                "file_exists",
                "at completion, a file appeared and overwrite is false "
                "(the upload is dropped)",
                "FileExistsError",
            ),
            E(413, "payload_too_large", "offset + Content-Length is over size"),
            E(
                429,
                "concurrency_limited",
                "another append to this upload is running (retry_after 1)",
            ),
            E(
                507,
                "insufficient_storage",
                "the disk filled up; the upload is dropped",
            ),
        ),
        notes="The raw body is written as it arrives. A cut connection keeps the "
        "bytes that arrived: GET the upload and send the rest from its offset. "
        "The append that reaches size renames the file into place and answers "
        "as POST /files/raw does, with complete: true.",
    ),
    "files_uploads_delete": Schema(
        response=(F("upload_id"), F("deleted", "boolean")),
        errors=(_NO_UPLOAD,),
        notes="The staging file is removed; the target is untouched.",
    ),
    "files_watch": Schema(
        query=(
            F("path", doc="default: base_dir (see paths.allow)", example="."),
            F("recursive", "boolean", default=False),
            F(
                "follow",
                "boolean",
                "true: open-ended and resumable, sandboxd's events; false: "
                "agent-sandbox-server's events for a window",
                default=False,
            ),
            F(
                "timeout",
                "number",
                "seconds: the window, ending with end (at most "
                "max_duration_seconds, default 300); not with follow=true",
            ),
            F(
                "interval",
                "number",
                "seconds: agent-sandbox-server's polling period, accepted and "
                "not needed; not with follow=true",
            ),
            *RESUME,
            QUERY_TOKEN,
        ),
        headers=(LAST_EVENT_ID,),
        produces="sse",
        events=(
            Event("ready", '{"path"}: first (without follow)'),
            Event(
                "change",
                '{"type": created|modified|deleted, "path", "is_dir"} (without follow)',
            ),
            Event(
                "end",
                '{"reason": "timeout"|"closed"}: last (without follow); '
                '{"reason": "deleted"}: last, the watched directory went away '
                "(follow=true; a stream that ends without it was cut: resume it)",
            ),
            Event("created", '{"event", "path", "type"} (follow=true)'),
            Event("modified", '{"event", "path", "type"} (follow=true)'),
            Event("deleted", '{"event", "path", "type"} (follow=true)'),
            Event("moved", '{"event", "path", "type", "dest"} (follow=true)'),
            Event(
                "overflow",
                '{"event", "path", "type"}: the kernel dropped changes under '
                "path it had no room to queue (a burst while the daemon was "
                "busy); list path again to catch up",
            ),
            GAP,
        ),
        errors=(
            *GUARD,
            E(404, "not_found", "no such directory"),
            E(
                400,
                "invalid_param",
                "a bad timeout or interval, or either with follow=true",
            ),
            E(
                429,
                "concurrency_limited",
                "64 directories are watched, each by a client still connected "
                "(or the caller's share of them); a watch no client holds is "
                "let go to make room; Retry-After",
            ),
            E(
                503,
                "unavailable",
                "the user's inotify watches or instances are used up (every "
                "directory of a recursive watch needs one); Retry-After",
                "ResourceError",
            ),
        ),
        notes="inotify, debounced; events for paths the caller may not see are dropped. "
        "A name that is not UTF-8 is shown as files_list shows it (each such byte as "
        "\\xNN). Without follow, agent-sandbox-server's events for a window: ready, a change per "
        "change (a move is deleted + created), then end (as its SDK's files.watch() "
        "expects). With follow=true, open-ended and resumable (see docs/protocols.md). "
        "Either form starts when it opens: changes made before it are not replayed "
        "unless after or Last-Event-ID asks to resume.",
    ),
}
