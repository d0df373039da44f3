// Files: a folder tree (each folder listed when it is first expanded), a
// viewer (with a source file's problems from its language server), a
// search in the files below the tree's folder, uploads with progress, and
// small-text edits that never overwrite someone else's
// change (If-Match, 412 shown).
// Contents are only ever text nodes or blob images; HTML and SVG files
// are offered for download, never rendered.

import { h, clear, size, keyRow, choose } from "./dom.js";

const IMAGES = { png: "image/png", jpg: "image/jpeg", jpeg: "image/jpeg", gif: "image/gif", webp: "image/webp", bmp: "image/bmp", ico: "image/x-icon", avif: "image/avif" };
const DOWNLOAD_ONLY = new Set(["html", "htm", "xhtml", "svg", "svgz", "xml", "mht", "mhtml"]);
const VIEW_LIMIT = 2_000_000; // bytes shown as text
const EDIT_LIMIT = 512 * 1024; // bytes editable
const LINES_AROUND = 20; // shown either side of a search's line in a file too large to show
// Extensions a language server may know (the daemon decides; these only draw the button).
const CHECKABLE = new Set(["py", "pyi", "ts", "mts", "cts", "tsx", "js", "mjs", "cjs", "jsx", "sh", "bash", "go", "rs", "c", "h", "cc", "cpp", "cxx", "hh", "hpp"]);

function extension(name) {
  const dot = name.lastIndexOf(".");
  return dot > 0 ? name.slice(dot + 1).toLowerCase() : "";
}

function parentOf(path) {
  const trimmed = path.replace(/\/+$/, "");
  const cut = trimmed.lastIndexOf("/");
  return cut <= 0 ? "/" : trimmed.slice(0, cut);
}

function join(dir, name) { return `${dir.replace(/\/+$/, "")}/${name}`; }

/** Where line ``line`` (from 1, lines end at "\n" as the daemon counts them) lies in ``text``: [start, end), or null. */
function lineSpan(text, line) {
  let start = 0;
  for (let n = 1; n < line; n += 1) {
    const nl = text.indexOf("\n", start);
    if (nl < 0) return null;
    start = nl + 1;
  }
  const end = text.indexOf("\n", start);
  return [start, end < 0 ? text.length : end];
}

/** ``text`` (lines from ``first`` on) in a <pre>, line ``line`` marked (text nodes only); [pre, mark or null]. */
function textWithLine(text, line, testid, first = 1) {
  const span = line ? lineSpan(text, line - first + 1) : null;
  if (!span) return [h("pre", { testid }, text), null];
  const mark = h("mark", { class: "line", testid: "file-line", "data-line": String(line) }, text.slice(span[0], span[1]));
  return [h("pre", { testid }, text.slice(0, span[0]), mark, text.slice(span[1])), mark];
}

export class FilesPage {
  constructor(root, api, caps, banner) {
    this.root = root;
    this.api = api;
    this.caps = caps;
    this.banner = banner;
    this.dir = null; // the tree's root
    this.selected = null;
    this.expanded = new Set(); // folders shown open (kept across refreshes)
    this.objectUrl = null;
    const may = (id) => caps.allowed(id);
    this.crumbs = h("span", { class: "crumbs", testid: "files-path" });
    this.where = h("span", { class: "status", testid: "files-target" });
    this.nameInput = h("input", { type: "text", placeholder: "name or path", testid: "file-name-input", "aria-label": "name" });
    this.progress = h("progress", { max: 1, value: 0, testid: "upload-progress", hidden: true });
    this.uploadStatus = h("span", { class: "status", testid: "upload-status" });
    const tools = [
      this.upButton = h("button", { type: "button", testid: "files-up", onclick: () => this.dir !== this.home && this.open(parentOf(this.dir)) }, "Up"),
      h("button", { type: "button", testid: "files-refresh", onclick: () => this.refresh() }, "Refresh"),
      this.nameInput,
    ];
    if (may("files_mkdir")) tools.push(h("button", { type: "button", testid: "file-mkdir", onclick: () => this.mkdir() }, "New folder"));
    if (may("files_move")) tools.push(h("button", { type: "button", testid: "file-move", onclick: () => this.move() }, "Move selected to name"));
    if (may("files_delete")) {
      this.deleteButton = h("button", { type: "button", class: "danger", testid: "file-delete", onclick: () => this.askDelete() }, "Delete selected");
      this.confirmButton = h("button", { type: "button", class: "danger", testid: "file-delete-confirm", hidden: true, onclick: () => this.remove() }, "Confirm delete");
      tools.push(this.deleteButton, this.confirmButton);
    }
    if (may("files_write_raw")) {
      this.uploadInput = h("input", { type: "file", testid: "file-upload", "aria-label": "upload", onchange: () => this.upload() });
      tools.push(h("label", { class: "upload" }, "Upload: ", this.uploadInput), this.progress, this.uploadStatus);
    }
    this.list = h("div", { class: "list tree", testid: "file-list" });
    this.view = h("div", { class: "view", testid: "file-view" }, h("p", { class: "dim" }, "Select a file to view it."));
    // Ctrl+click (Cmd+click) a name in a source file: its definition.
    if (may("lsp_definition")) this.view.addEventListener("click", (e) => this.definitionAt(e));
    // Search in files: drawn only when the link may call files_grep.
    this.search = may("files_grep") ? new FileSearch(this) : null;
    clear(root).append(
      h("div", { class: "toolbar" }, ...tools),
      h("div", { class: "toolbar" }, this.crumbs, this.where),
      ...(this.search ? [this.search.bar, this.search.results] : []),
      h("div", { class: "split" }, this.list, this.view));
  }

  async start() { await this.open(null); }
  visible() {}

  list_(path) { return this.api.json("GET", "/files/list", { query: { path: path || undefined } }); }

  /** Show the tree rooted at ``path`` (the base directory when null), folders closed. */
  async open(path) {
    this.expanded.clear();
    this.selected = null;
    await this.refresh(path);
  }

  /** List the root again, and every folder shown open; keep the selection. */
  async refresh(path) {
    let listed;
    const wanted = path === undefined ? this.dir : path;
    try {
      listed = await this.list_(wanted);
    } catch (e) {
      this.banner(`Cannot list ${wanted || "the base directory"}: ${e.message}`);
      return;
    }
    this.dir = listed.path;
    if (this.home === undefined) this.home = listed.path; // the base directory: Up stops there
    this.upButton.disabled = this.dir === this.home;
    this.crumbs.textContent = listed.path;
    const body = h("tbody", {}, this.rows(listed, 0));
    clear(this.list).append(h("table", { role: "treegrid", "aria-label": `files in ${listed.path}` }, body));
    for (const row of [...body.children]) await this.reopen(row);
    const kept = this.selected && this.rowOf(this.selected.path);
    if (kept) choose(this.list, kept);
    else this.selected = null;
    this.showTarget();
  }

  rowOf(path) {
    return [...this.list.querySelectorAll("tr[data-path]")].find((r) => r.dataset.path === path) || null;
  }

  /** The rows of one listing, folders first, indented by ``depth``. */
  rows(listed, depth) {
    const rows = listed.entries
      .slice()
      .sort((a, b) => (a.type === "directory") === (b.type === "directory") ? a.name.localeCompare(b.name) : a.type === "directory" ? -1 : 1)
      .map((entry) => this.row(entry, depth));
    if (listed.truncated) rows.push(h("tr", { class: "dim", "data-path": join(listed.path, "\u2026") }, h("td", {}, "(truncated)")));
    if (depth && !rows.length) rows.push(h("tr", { class: "dim", "data-path": join(listed.path, "\u2026") }, h("td", {}, "(empty)")));
    for (const row of rows) if (!row.dataset.depth) row.firstChild.style.paddingLeft = `${8 + depth * 18 + 18}px`;
    return rows;
  }

  row(entry, depth) {
    const folder = entry.type === "directory";
    const toggle = folder
      ? h("button", { type: "button", class: "toggle", testid: "file-toggle", "data-path": entry.path, "aria-label": `open ${entry.name}`, onclick: (e) => { e.stopPropagation(); this.toggle(row); } }, "\u25b8")
      : h("span", { class: "toggle" });
    const name = h("td", {}, toggle, entry.name);
    name.style.paddingLeft = `${8 + depth * 18}px`;
    const row = h("tr", {
      class: `entry ${folder ? "dir" : "file"}`,
      testid: "file-entry",
      "data-name": entry.name,
      "data-type": entry.type,
      "data-path": entry.path,
      "data-depth": String(depth),
      "aria-expanded": folder ? "false" : null,
      "aria-level": String(depth + 1),
      onclick: () => this.select(entry, row),
      ondblclick: () => folder && this.open(entry.path),
    }, name, h("td", { class: "dim" }, folder ? "" : size(entry.size)));
    keyRow(row, () => this.select(entry, row), () => folder ? this.openFocused(entry.path) : this.select(entry, row));
    if (folder) {
      // A tree's keys: Right opens the folder in place, Left closes it.
      row.addEventListener("keydown", (e) => {
        if (e.target !== row) return;
        const open = row.getAttribute("aria-expanded") === "true";
        if ((e.key === "ArrowRight" && !open) || (e.key === "ArrowLeft" && open)) { e.preventDefault(); this.toggle(row); }
      });
    }
    return row;
  }

  /** The rows below a folder's row (its open subtree). */
  below(row) {
    const prefix = `${row.dataset.path.replace(/\/+$/, "")}/`;
    const out = [];
    for (let next = row.nextElementSibling; next && (next.dataset.path || "").startsWith(prefix); next = next.nextElementSibling) out.push(next);
    return out;
  }

  async toggle(row) {
    if (row.getAttribute("aria-expanded") === "true") {
      this.expanded.delete(row.dataset.path);
      this.close(row);
    } else {
      this.expanded.add(row.dataset.path);
      await this.expand(row);
    }
  }

  close(row) {
    for (const child of this.below(row)) {
      // A selection hidden in the closed folder is dropped: uploads and
      // deletes must never act on something out of sight.
      if (this.selected && child.dataset.path === this.selected.path) { this.selected = null; this.showTarget(); }
      child.remove();
    }
    row.setAttribute("aria-expanded", "false");
    row.querySelector("[data-testid=file-toggle]").textContent = "\u25b8";
  }

  /** List a folder under its row (folders that were open below it open again). */
  async expand(row) {
    let listed;
    try {
      listed = await this.list_(row.dataset.path);
    } catch (e) {
      this.expanded.delete(row.dataset.path);
      this.banner(`Cannot list ${row.dataset.path}: ${e.message}`);
      return;
    }
    if (!row.isConnected || !this.expanded.has(row.dataset.path)) return;
    this.close(row);
    row.setAttribute("aria-expanded", "true");
    row.querySelector("[data-testid=file-toggle]").textContent = "\u25be";
    const children = this.rows(listed, Number(row.dataset.depth) + 1);
    row.after(...children);
    for (const child of children) await this.reopen(child);
  }

  async reopen(row) {
    if (row.dataset.type === "directory" && this.expanded.has(row.dataset.path)) await this.expand(row);
  }

  /** Where a relative name, an upload or a new folder goes: the selected folder, else the selected file's, else the root. */
  folder() {
    if (!this.selected) return this.dir;
    return this.selected.type === "directory" ? this.selected.path : parentOf(this.selected.path);
  }

  showTarget() {
    this.where.textContent = this.dir ? `new folders and uploads go into ${this.folder()}` : "";
  }

  /** Show only the folder at ``path``, and put the keyboard's focus on its first row (Enter on a folder). */
  async openFocused(path) {
    await this.open(path);
    const first = this.list.querySelector("tr[tabindex='0']");
    if (first) first.focus();
  }

  select(entry, row) {
    choose(this.list, row);
    this.selected = entry;
    this.showTarget();
    if (this.confirmButton) this.confirmButton.hidden = true;
    if (entry.type === "directory") {
      // One click selects a folder (to move or delete it); two open it.
      this.dropObjectUrl();
      this.showing = null;
      clear(this.view).append(h("p", { class: "dim", testid: "file-folder-selected" }, `${entry.path}/ (double-click or Enter to show only this folder)`));
    } else {
      this.show(entry);
    }
  }

  dropObjectUrl() {
    if (this.objectUrl) URL.revokeObjectURL(this.objectUrl);
    this.objectUrl = null;
  }

  /** Open a file a search found in the viewer, at ``line``; the tree's selection is dropped, as the file may be out of its sight. */
  openAt(path, line) {
    choose(this.list, null);
    this.selected = null;
    this.showTarget();
    if (this.confirmButton) this.confirmButton.hidden = true;
    this.show({ name: path.slice(path.lastIndexOf("/") + 1), path, type: "file" }, line);
  }

  /** Show a file in the viewer (scrolled to ``line`` and that line marked, when given). */
  async show(entry, line) {
    this.dropObjectUrl();
    this.showing = entry; // a file clicked meanwhile wins: an older answer is dropped
    const ext = extension(entry.name);
    const head = h("div", { class: "toolbar" },
      h("strong", { testid: "file-view-name" }, entry.path),
      h("span", { class: "dim" }, size(entry.size)),
      h("button", { type: "button", testid: "file-download", onclick: () => this.download(entry) }, "Download"));
    clear(this.view).append(head);
    if (DOWNLOAD_ONLY.has(ext)) {
      this.view.append(h("p", { class: "dim", testid: "file-download-only" }, "HTML, SVG and XML files are not shown here, only downloaded: they could run script in this page's origin."));
      return;
    }
    if (IMAGES[ext]) {
      const response = await this.api.fetch("GET", "/files/raw", { query: { path: entry.path } });
      const blob = new Blob([await response.arrayBuffer()], { type: IMAGES[ext] });
      this.objectUrl = URL.createObjectURL(blob);
      this.view.append(h("img", { src: this.objectUrl, alt: entry.name, testid: "file-image" }));
      return;
    }
    if (entry.size > VIEW_LIMIT) {
      this.view.append(h("p", { class: "dim" }, `Too large to show (${size(entry.size)}); download it.`));
      return;
    }
    let response;
    try {
      response = await this.api.fetch("GET", "/files/raw", { query: { path: entry.path } });
    } catch (e) {
      this.view.append(h("p", { class: "bad" }, e.message));
      return;
    }
    if (this.showing !== entry) { response.body.cancel(); return; }
    // A file a search found comes without its size: the answer's length tells.
    const length = Number(response.headers.get("Content-Length"));
    if (entry.size === undefined && length > VIEW_LIMIT) {
      response.body.cancel();
      this.view.append(h("p", { class: "dim" }, `Too large to show (${size(length)}); download it.`));
      if (line && this.caps.allowed("download")) await this.showLines(entry, line);
      return;
    }
    const etag = response.headers.get("ETag");
    const bytes = new Uint8Array(await response.arrayBuffer());
    if (this.showing !== entry) return;
    if (bytes.subarray(0, 8000).includes(0)) {
      this.view.append(h("p", { class: "dim" }, "A binary file; download it."));
      return;
    }
    const text = new TextDecoder().decode(bytes);
    const [pre, mark] = textWithLine(text, line, "file-text");
    this.view.append(pre);
    if (mark) mark.scrollIntoView({ block: "center" });
    this.shownText = text;
    if (this.caps.allowed("lsp_diagnostics") && CHECKABLE.has(ext)) {
      head.append(h("button", { type: "button", testid: "file-check", onclick: () => this.check(entry, text) }, "Problems"));
    }
    if (this.caps.allowed("lsp_definition") && CHECKABLE.has(ext)) {
      head.append(h("span", { class: "dim", testid: "file-definition-hint" }, "Ctrl+click a name: its definition"));
    }
    if (this.caps.allowed("files_write_raw") && bytes.length <= EDIT_LIMIT) {
      head.append(h("button", { type: "button", testid: "file-edit", onclick: () => this.edit(entry, text, etag, pre) }, "Edit"));
    }
  }

  /**
   * Ask the file's language server for its problems (POST /lsp/diagnostics):
   * a row per problem above the text, ``line:column``, severity and message;
   * a click marks that line.  The server reads the file as saved.
   */
  async check(entry, text) {
    const old = this.view.querySelector("[data-testid=file-problems]");
    if (old) old.remove();
    const status = h("p", { class: "dim", testid: "file-problems-status" }, "Checking\u2026");
    const panel = h("div", { class: "list problems", testid: "file-problems" }, status);
    this.view.querySelector(".toolbar").after(panel);
    let got;
    try {
      got = await this.api.json("POST", "/lsp/diagnostics", { json: { path: entry.path } });
    } catch (e) {
      status.textContent = e.message;
      status.className = "bad";
      return;
    }
    if (this.showing !== entry) return;
    const counts = Object.entries(got.counts).filter(([, n]) => n).map(([s, n]) => `${n} ${s}${n > 1 ? "s" : ""}`);
    status.textContent = got.diagnostics.length
      ? `${counts.join(", ")} (${got.server})`
      : `No problems found (${got.server}).`;
    if (!got.settled) status.textContent += " The server has not finished; check again.";
    for (const d of got.diagnostics) {
      panel.append(h("div", {
        class: `problem ${d.severity}`,
        testid: "file-problem",
        "data-line": String(d.line),
        "data-severity": d.severity,
        role: "button",
        tabindex: "0",
        onclick: () => this.markLine(text, d.line),
        onkeydown: (e) => { if (e.key === "Enter") this.markLine(text, d.line); },
      }, h("span", { class: "where" }, `${d.line}:${d.column}`), " ",
      h("span", { class: "severity" }, d.severity), " ",
      h("span", { testid: "file-problem-message" }, d.message),
      d.source ? h("span", { class: "dim" }, ` ${d.source}${d.code !== null ? ` ${d.code}` : ""}`) : ""));
    }
  }

  /**
   * Ctrl+click (Cmd+click) on a name in a source file's text: ask its
   * language server where it is defined (POST /lsp/definition) and open
   * that file at that line; the head says when there is none.
   */
  async definitionAt(event) {
    if (!(event.ctrlKey || event.metaKey)) return;
    const pre = event.target.closest && event.target.closest("[data-testid=file-text]");
    const entry = this.showing;
    if (!pre || !entry || !CHECKABLE.has(extension(entry.name))) return;
    const at = clickedOffset(pre, event);
    if (at === null) return;
    event.preventDefault();
    const text = this.shownText;
    const lineStart = text.lastIndexOf("\n", at - 1) + 1;
    const line = text.slice(0, lineStart).split("\n").length;
    const column = [...text.slice(lineStart, at)].length + 1;
    const note = this.definitionNote(`Looking for the definition at ${line}:${column}\u2026`);
    let got;
    try {
      got = await this.api.json("POST", "/lsp/definition", { json: { path: entry.path, line, column } });
    } catch (e) {
      note.textContent = e.message;
      note.className = "status bad";
      return;
    }
    if (this.showing !== entry) return;
    const [first] = got.locations;
    if (!first) {
      note.textContent = got.outside ? "Defined in a file you may not read." : `No definition found at ${line}:${column}.`;
      return;
    }
    if (first.path === entry.path) {
      note.textContent = `Defined at line ${first.line}.`;
      this.markLine(text, first.line);
    } else {
      this.openAt(first.path, first.line);
    }
  }

  /** The status line of a definition lookup, in the viewer's head (replacing the last). */
  definitionNote(message) {
    const old = this.view.querySelector("[data-testid=file-definition-status]");
    if (old) old.remove();
    const note = h("span", { class: "status", testid: "file-definition-status" }, message);
    this.view.querySelector(".toolbar").append(note);
    return note;
  }

  /** Mark ``line`` in the text shown, scrolled to it. */
  markLine(text, line) {
    const pre = this.view.querySelector("[data-testid=file-text]");
    if (!pre) return;
    const [next, mark] = textWithLine(text, line, "file-text");
    pre.replaceWith(next);
    if (mark) mark.scrollIntoView({ block: "center" });
  }

  /** The lines around ``line`` of a file too large to show whole (GET /download with offset and limit). */
  async showLines(entry, line) {
    const first = Math.max(1, line - LINES_AROUND);
    let got;
    try {
      got = await this.api.json("GET", "/download", { query: { path: entry.path, offset: first, limit: 2 * LINES_AROUND + 1 } });
    } catch (e) {
      this.view.append(h("p", { class: "bad" }, e.message));
      return;
    }
    if (this.showing !== entry) return;
    const bytes = Uint8Array.from(atob(got.content_base64), (c) => c.charCodeAt(0));
    const [pre, mark] = textWithLine(new TextDecoder().decode(bytes), line, "file-lines", got.offset);
    this.view.append(h("p", { class: "dim" }, `Lines ${got.offset} to ${got.offset + got.lines - 1} of ${got.total_lines}:`), pre);
    if (mark) mark.scrollIntoView({ block: "center" });
  }

  edit(entry, text, etag, pre) {
    const area = h("textarea", { testid: "file-editor", spellcheck: "false" });
    area.value = text;
    const note = h("span", { class: "status", testid: "file-save-status" });
    const save = h("button", { type: "button", testid: "file-save", onclick: async () => {
      try {
        const written = await this.api.json("POST", "/files/raw", {
          query: { path: entry.path, overwrite: "true" },
          body: new Blob([area.value]),
          headers: { "If-Match": etag, "Content-Type": "application/octet-stream" },
        });
        etag = written.etag;
        note.textContent = `Saved (${size(written.bytes)}).`;
        note.className = "status ok";
      } catch (e) {
        if (e.status === 412) {
          note.textContent = "";
          this.banner("This file changed since you opened it (someone else saved it). Your text is still here: copy it, then reload the file to see their version.", "edit-conflict");
        } else {
          this.banner(`Could not save ${entry.path}: ${e.message}`);
        }
      }
    } }, "Save");
    const cancel = h("button", { type: "button", testid: "file-edit-cancel", onclick: () => this.show(entry) }, "Cancel");
    pre.replaceWith(h("div", { class: "toolbar" }, save, cancel, note), area);
    area.focus();
  }

  async download(entry) {
    const response = await this.api.fetch("GET", "/files/raw", { query: { path: entry.path } });
    const blob = new Blob([await response.arrayBuffer()], { type: "application/octet-stream" });
    const url = URL.createObjectURL(blob);
    const a = h("a", { href: url, download: entry.name, hidden: true });
    document.body.append(a);
    a.click();
    a.remove();
    setTimeout(() => URL.revokeObjectURL(url), 10000);
  }

  /** The path a typed name means: absolute, or relative to ``base``. */
  target(base) {
    if (!this.dir) { this.banner("The folder is still being listed; try again."); return null; }
    const name = this.nameInput.value.trim();
    if (!name) { this.banner("Type a name first."); return null; }
    return name.startsWith("/") ? name : join(base, name);
  }

  /** Show what is in ``folder`` after a change there (opening it in the tree). */
  async changed(folder) {
    if (folder !== this.dir) this.expanded.add(folder);
    await this.refresh();
  }

  async mkdir() {
    const folder = this.folder();
    const path = this.target(folder);
    if (!path) return;
    try { await this.api.json("POST", "/files/mkdir", { json: { path } }); this.nameInput.value = ""; await this.changed(parentOf(path)); }
    catch (e) { this.banner(`Could not create ${path}: ${e.message}`); }
  }

  async move() {
    if (!this.selected) { this.banner("Select a file or folder to move."); return; }
    const source = this.selected.path;
    const destination = this.target(parentOf(source));
    if (!destination) return;
    try {
      await this.api.json("POST", "/files/move", { json: { source, destination } });
      this.nameInput.value = "";
      this.selected = null;
      await this.refresh();
    } catch (e) { this.banner(`Could not move ${source}: ${e.message}`); }
  }

  askDelete() {
    if (!this.selected) { this.banner("Select a file or folder to delete."); return; }
    this.confirmButton.textContent = `Confirm delete ${this.selected.name}`;
    this.confirmButton.hidden = false;
  }

  async remove() {
    this.confirmButton.hidden = true;
    const path = this.selected && this.selected.path;
    if (!path) return;
    try {
      await this.api.json("DELETE", "/files", { query: { path } });
      this.dropObjectUrl();
      clear(this.view);
      this.selected = null;
      await this.refresh();
    } catch (e) { this.banner(`Could not delete ${path}: ${e.message}`); }
  }

  async upload() {
    const file = this.uploadInput.files[0];
    if (!file || !this.dir) return;
    const folder = this.folder();
    const path = join(folder, file.name);
    this.progress.hidden = false;
    this.progress.value = 0;
    this.uploadStatus.textContent = `Uploading ${file.name}...`;
    try {
      const written = await this.api.upload(path, file, (done, total) => { this.progress.value = done / total; });
      this.progress.value = 1;
      this.uploadStatus.textContent = `Uploaded ${file.name} (${size(written.bytes)}).`;
      this.uploadStatus.className = "status ok";
      await this.changed(folder);
    } catch (e) {
      this.uploadStatus.textContent = "";
      this.banner(`Could not upload ${file.name}: ${e.message}`);
    } finally {
      this.uploadInput.value = "";
    }
  }
}

/** The UTF-16 offset in ``pre``'s text of the place a click fell, or null. */
function clickedOffset(pre, event) {
  const caret = document.caretRangeFromPoint ? document.caretRangeFromPoint(event.clientX, event.clientY) : null;
  if (!caret || !pre.contains(caret.startContainer)) return null;
  const before = document.createRange();
  before.setStart(pre, 0);
  before.setEnd(caret.startContainer, caret.startOffset);
  return before.toString().length;
}

/** The UTF-16 index of character ``n`` (from 0) of ``text``: the daemon counts columns in characters. */
function codeUnits(text, n) {
  let i = 0;
  for (let k = 0; k < n && i < text.length; k += 1) i += text.codePointAt(i) > 0xffff ? 2 : 1;
  return i;
}

/**
 * How long a match of ``query`` at index ``at`` of a line is, when the page
 * can tell: a text pattern, or a regular expression JavaScript reads alike
 * (RE2's own syntax, such as (?i), is not highlighted); 0 otherwise.
 */
function matchLength(query) {
  if (query.fixed_strings) {
    const fold = (t) => (query.ignore_case ? t.toLowerCase() : t);
    const want = fold(query.pattern);
    return (text, at) => (fold(text.slice(at, at + query.pattern.length)) === want ? query.pattern.length : 0);
  }
  let re;
  try { re = new RegExp(query.pattern, query.ignore_case ? "iuy" : "uy"); } catch (_) { return () => 0; }
  return (text, at) => {
    re.lastIndex = at;
    const found = re.exec(text);
    return found ? found[0].length : 0;
  };
}

/** A line's text with its matches (columns from 1) marked; text nodes and <mark>s only. */
function marked(text, columns, length) {
  const out = [];
  let done = 0;
  for (const column of columns) {
    const at = codeUnits(text, column - 1);
    const n = at >= done ? length(text, at) : 0;
    if (!n) continue;
    out.push(text.slice(done, at), h("mark", { testid: "file-match-hit" }, text.slice(at, at + n)));
    done = at + n;
  }
  out.push(text.slice(done));
  return out;
}

/**
 * Search in files (POST /files/grep) below the folder the tree shows: a
 * row per matching line, ``path:line`` and the line; a click opens the file
 * at that line.
 */
class FileSearch {
  constructor(page) {
    this.page = page;
    this.turn = 0; // the latest search: an older answer arriving late is dropped
    this.input = h("input", {
      type: "text", placeholder: "search in files", testid: "files-search", "aria-label": "search in files",
      onkeydown: (e) => { if (e.key === "Enter") { e.preventDefault(); this.run(); } },
    });
    this.mode = h("select", { testid: "files-search-mode", "aria-label": "pattern kind" },
      h("option", { value: "text" }, "text"), h("option", { value: "regex" }, "regex"));
    this.ignoreCase = h("input", { type: "checkbox", testid: "files-search-case" });
    this.status = h("span", { class: "status", testid: "files-search-status" });
    this.clearButton = h("button", { type: "button", testid: "files-search-clear", hidden: true, onclick: () => this.clear() }, "Clear");
    this.bar = h("div", { class: "toolbar" },
      this.input, this.mode, h("label", {}, this.ignoreCase, " ignore case"),
      h("button", { type: "button", testid: "files-search-run", onclick: () => this.run() }, "Search"),
      this.clearButton, this.status);
    this.results = h("div", { class: "list results", testid: "files-search-results", hidden: true });
  }

  clear() {
    this.turn += 1;
    clear(this.results).hidden = true;
    this.clearButton.hidden = true;
    this.say("", "");
  }

  say(text, state) {
    this.status.textContent = text;
    this.status.className = state === "error" ? "status bad" : "status";
    this.status.dataset.state = state;
  }

  async run() {
    const pattern = this.input.value;
    if (!pattern) { this.input.focus(); return; }
    const dir = this.page.dir;
    if (!dir) { this.page.banner("The folder is still being listed; try again."); return; }
    const query = { pattern, path: dir, fixed_strings: this.mode.value === "text", ignore_case: this.ignoreCase.checked };
    const turn = ++this.turn;
    this.clearButton.hidden = false;
    this.say(`Searching ${dir}...`, "searching");
    let found;
    try {
      found = await this.page.api.json("POST", "/files/grep", { json: query });
    } catch (e) {
      if (turn !== this.turn) return;
      clear(this.results).hidden = true;
      // A 400 is the pattern (RE2 refused it): the daemon's words say why.
      this.say(e.status === 400 ? `Bad pattern: ${e.message}` : `Cannot search ${dir}: ${e.message}`, "error");
      return;
    }
    if (turn !== this.turn) return;
    this.show(query, found);
  }

  show(query, found) {
    const lines = [];
    for (const m of found.matches) {
      const last = lines[lines.length - 1];
      if (last && last.path === m.path && last.line === m.line) last.columns.push(m.column);
      else lines.push({ ...m, columns: [m.column] });
    }
    const skipped = found.files_skipped ? `, ${found.files_skipped} skipped (binary, too large or unreadable)` : "";
    this.say(`${lines.length} ${lines.length === 1 ? "line" : "lines"} in ${found.files_matched} of ${found.files_searched} files searched${skipped}`, "done");
    const prefix = `${query.path.replace(/\/+$/, "")}/`;
    const length = matchLength(query);
    const rows = lines.map((m) => {
      const row = h("tr", {
        class: "entry match",
        testid: "file-match",
        "data-path": m.path,
        "data-line": String(m.line),
        onclick: () => open(),
      },
      h("td", { class: "where", testid: "file-match-where" }, `${m.path.startsWith(prefix) ? m.path.slice(prefix.length) : m.path}:${m.line}`),
      h("td", { class: "text", testid: "file-match-text" }, marked(m.text, m.columns, length), m.cut ? h("span", { class: "dim" }, " \u2026") : null));
      const open = () => {
        choose(this.results, row);
        this.page.openAt(m.path, m.line);
      };
      return keyRow(row, open);
    });
    const notes = [];
    if (found.truncated) notes.push(h("p", { class: "note", testid: "files-search-note", "data-kind": "truncated" }, `Only the first ${found.matches.length} matches are shown: narrow the pattern, or search a folder further down.`));
    if (found.timed_out) notes.push(h("p", { class: "note", testid: "files-search-note", "data-kind": "timed-out" }, "The search ran out of time: these are the matches found until then."));
    if (!rows.length) rows.push(h("tr", { class: "dim" }, h("td", {}, "No match.")));
    clear(this.results).append(...notes, h("table", { role: "grid", "aria-label": "search results" }, h("tbody", {}, rows)));
    this.results.hidden = false;
  }
}
