// Files: a directory tree, a viewer, uploads with progress, and small-text
// edits that never overwrite someone else's change (If-Match, 412 shown).
// Contents are only ever text nodes or blob images; HTML and SVG files
// are offered for download, never rendered.

import { h, clear, size } from "./dom.js";

const IMAGES = { png: "image/png", jpg: "image/jpeg", jpeg: "image/jpeg", gif: "image/gif", webp: "image/webp", bmp: "image/bmp", ico: "image/x-icon", avif: "image/avif" };
const DOWNLOAD_ONLY = new Set(["html", "htm", "xhtml", "svg", "svgz", "xml", "mht", "mhtml"]);
const VIEW_LIMIT = 2_000_000; // bytes shown as text
const EDIT_LIMIT = 512 * 1024; // bytes editable

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

export class FilesPage {
  constructor(root, api, caps, banner) {
    this.root = root;
    this.api = api;
    this.caps = caps;
    this.banner = banner;
    this.dir = null;
    this.selected = null;
    this.objectUrl = null;
    const may = (id) => caps.allowed(id);
    this.crumbs = h("span", { class: "crumbs", testid: "files-path" });
    this.nameInput = h("input", { type: "text", placeholder: "name or path", testid: "file-name-input", "aria-label": "name" });
    this.progress = h("progress", { max: 1, value: 0, testid: "upload-progress", hidden: true });
    this.uploadStatus = h("span", { class: "status", testid: "upload-status" });
    const tools = [
      this.upButton = h("button", { type: "button", testid: "files-up", onclick: () => this.dir !== this.home && this.open(parentOf(this.dir)) }, "Up"),
      h("button", { type: "button", testid: "files-refresh", onclick: () => this.open(this.dir) }, "Refresh"),
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
    this.list = h("div", { class: "list", testid: "file-list" });
    this.view = h("div", { class: "view", testid: "file-view" }, h("p", { class: "dim" }, "Select a file to view it."));
    clear(root).append(h("div", { class: "toolbar" }, ...tools), this.crumbs, h("div", { class: "split" }, this.list, this.view));
  }

  async start() { await this.open(null); }
  visible() {}

  async open(path) {
    let listed;
    try {
      listed = await this.api.json("GET", "/files/list", { query: { path: path || undefined } });
    } catch (e) {
      this.banner(`Cannot list ${path || "the base directory"}: ${e.message}`);
      return;
    }
    this.dir = listed.path;
    if (this.home === undefined) this.home = listed.path; // the base directory: Up stops there
    this.upButton.disabled = this.dir === this.home;
    this.selected = null;
    this.crumbs.textContent = listed.path;
    const rows = listed.entries
      .slice()
      .sort((a, b) => (a.type === "directory") === (b.type === "directory") ? a.name.localeCompare(b.name) : a.type === "directory" ? -1 : 1)
      .map((entry) => {
        const row = h("tr", {
          class: `entry ${entry.type === "directory" ? "dir" : "file"}`,
          testid: "file-entry",
          "data-name": entry.name,
          "data-type": entry.type,
          onclick: () => this.select(entry, row),
          ondblclick: () => entry.type === "directory" && this.open(entry.path),
        }, h("td", {}, entry.name), h("td", { class: "dim" }, entry.type === "directory" ? "" : size(entry.size)));
        return row;
      });
    clear(this.list).append(h("table", {}, h("tbody", {}, rows)));
    if (listed.truncated) this.list.append(h("p", { class: "dim" }, "(truncated)"));
  }

  select(entry, row) {
    for (const r of this.list.querySelectorAll("tr")) r.classList.remove("selected");
    row.classList.add("selected");
    this.selected = entry;
    if (this.confirmButton) this.confirmButton.hidden = true;
    if (entry.type === "directory") {
      // One click selects a folder (to move or delete it); two open it.
      this.dropObjectUrl();
      clear(this.view).append(h("p", { class: "dim", testid: "file-folder-selected" }, `${entry.path}/ (double-click to open)`));
    } else {
      this.show(entry);
    }
  }

  dropObjectUrl() {
    if (this.objectUrl) URL.revokeObjectURL(this.objectUrl);
    this.objectUrl = null;
  }

  async show(entry) {
    this.dropObjectUrl();
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
    const etag = response.headers.get("ETag");
    const bytes = new Uint8Array(await response.arrayBuffer());
    if (bytes.subarray(0, 8000).includes(0)) {
      this.view.append(h("p", { class: "dim" }, "A binary file; download it."));
      return;
    }
    const text = new TextDecoder().decode(bytes);
    const pre = h("pre", { testid: "file-text" }, text);
    this.view.append(pre);
    if (this.caps.allowed("files_write_raw") && bytes.length <= EDIT_LIMIT) {
      head.append(h("button", { type: "button", testid: "file-edit", onclick: () => this.edit(entry, text, etag, pre) }, "Edit"));
    }
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

  target() {
    if (!this.dir) { this.banner("The folder is still being listed; try again."); return null; }
    const name = this.nameInput.value.trim();
    if (!name) { this.banner("Type a name first."); return null; }
    return name.startsWith("/") ? name : join(this.dir, name);
  }

  async mkdir() {
    const path = this.target();
    if (!path) return;
    try { await this.api.json("POST", "/files/mkdir", { json: { path } }); this.nameInput.value = ""; await this.open(this.dir); }
    catch (e) { this.banner(`Could not create ${path}: ${e.message}`); }
  }

  async move() {
    if (!this.selected) { this.banner("Select a file or folder to move."); return; }
    const destination = this.target();
    if (!destination) return;
    try { await this.api.json("POST", "/files/move", { json: { source: this.selected.path, destination } }); this.nameInput.value = ""; await this.open(this.dir); }
    catch (e) { this.banner(`Could not move ${this.selected.path}: ${e.message}`); }
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
    try { await this.api.json("DELETE", "/files", { query: { path } }); clear(this.view); await this.open(this.dir); }
    catch (e) { this.banner(`Could not delete ${path}: ${e.message}`); }
  }

  async upload() {
    const file = this.uploadInput.files[0];
    if (!file || !this.dir) return;
    const path = join(this.dir, file.name);
    this.progress.hidden = false;
    this.progress.value = 0;
    this.uploadStatus.textContent = `Uploading ${file.name}...`;
    try {
      const written = await this.api.upload(path, file, (done, total) => { this.progress.value = done / total; });
      this.progress.value = 1;
      this.uploadStatus.textContent = `Uploaded ${file.name} (${size(written.bytes)}).`;
      this.uploadStatus.className = "status ok";
      await this.open(this.dir);
    } catch (e) {
      this.uploadStatus.textContent = "";
      this.banner(`Could not upload ${file.name}: ${e.message}`);
    } finally {
      this.uploadInput.value = "";
    }
  }
}
