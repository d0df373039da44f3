// Code contexts as cells: a kernel that keeps its state between cells,
// cells that run one after another (the daemon queues them), output that
// arrives as it is printed (each execution's event stream), and rich
// results shown only as text or blob images: HTML and SVG are offered
// for download, never rendered in this page's origin.

import { h, clear } from "./dom.js";

const KEEP = 256 * 1024; // characters of one stream kept on screen
const POLL_MS = 2000; // how often a shown context is asked for cells run elsewhere
const PAGE = 1000; // events per page when a finished cell is shown again
const MAX_PAGES = 20;
const REMEMBER = "sandboxd.console.context";
const IMAGES = ["image/png", "image/jpeg", "image/gif", "image/webp"];
// Shown as a download only: any of them could run script in this origin.
const DOWNLOAD_ONLY = { "text/html": "html", "image/svg+xml": "svg", "application/javascript": "js", "text/markdown": "md", "text/latex": "tex" };
const ENDED = new Set(["ok", "error", "interrupted", "timeout", "lost"]);

function bytesOf(base64) {
  const text = atob(String(base64).replace(/\s+/g, ""));
  const out = new Uint8Array(text.length);
  for (let i = 0; i < text.length; i += 1) out[i] = text.charCodeAt(i);
  return out;
}

function saveBlob(blob, name) {
  const url = URL.createObjectURL(blob);
  const a = h("a", { href: url, download: name, hidden: true });
  document.body.append(a);
  a.click();
  a.remove();
  setTimeout(() => URL.revokeObjectURL(url), 10000);
}

/** One cell: its code, and what its execution printed and returned. */
class Cell {
  constructor(page, code, executionId) {
    this.page = page;
    this.api = page.api;
    this.source = null;
    this.urls = [];
    this.count = h("span", { class: "prompt dim", testid: "code-cell-count" }, "[ ]");
    this.stateLabel = h("span", { class: "status dim", testid: "code-cell-state" }, "queued");
    this.outputs = h("div", { class: "outputs", testid: "code-cell-output" });
    this.el = h("div", { class: "cell", testid: "code-cell", "data-state": "queued" },
      h("div", { class: "toolbar" }, this.count, this.stateLabel),
      h("pre", { class: "source", testid: "code-cell-source" }, code),
      this.outputs);
    if (executionId) this.setExecution(executionId);
  }

  setExecution(id) { this.id = id; this.el.dataset.execution = id; }

  setState(state) {
    this.state = state;
    this.el.dataset.state = state;
    this.stateLabel.textContent = state;
    this.stateLabel.className = `status ${state === "ok" ? "ok" : ENDED.has(state) ? "bad" : "dim"}`;
  }

  /** Follow the execution's events live (resumed by the browser after a drop). */
  follow(eventsUrl) {
    if (this.source) this.source.close();
    const source = new EventSource(this.api.eventSource(eventsUrl));
    this.source = source;
    const kinds = ["execution.queued", "execution.started", "stdout", "stderr", "display", "error", "input.requested", "context.restarted", "execution.ended", "gap"];
    for (const kind of kinds) {
      source.addEventListener(kind, (e) => {
        let data = {};
        try { data = JSON.parse(e.data); } catch (_) { return; }
        this.apply(kind, data);
      });
    }
    source.addEventListener("error", () => {
      if (source.readyState === EventSource.CLOSED && this.source === source) {
        this.stop();
        this.note("The event stream closed; refresh the context to see how this cell ended.", "dim");
      }
    });
  }

  stop() {
    if (this.source) this.source.close();
    this.source = null;
    this.page.unwatch(this);
  }

  /** Show what a finished execution logged, from JSON pages of its events. */
  async replay(eventsUrl) {
    let after;
    for (let i = 0; i < MAX_PAGES && !this.dropped; i += 1) {
      const page = await this.api.json("GET", eventsUrl, { query: { follow: "false", limit: PAGE, after } });
      if (page.dropped) this.apply("gap", page.dropped);
      const events = page.events || [];
      for (const e of events) this.apply(e.event, e.data);
      if (events.length < PAGE) return;
      after = page.next;
    }
  }

  apply(kind, data) {
    switch (kind) {
      case "execution.queued": this.setState("queued"); break;
      case "execution.started":
        this.setState("running");
        this.count.textContent = `[${data.execution_count ?? " "}]`;
        break;
      case "stdout": case "stderr": this.stream(kind, data.text || ""); break;
      case "display": this.display(data); break;
      case "error": this.error(data); break;
      case "input.requested": this.note(`The code asked for input (${data.prompt || ""}); the console does not answer input().`, "dim"); break;
      case "context.restarted":
        this.outputs.append(h("p", { class: "bad", testid: "code-restarted", "data-reason": data.reason },
          `The kernel was restarted (${data.reason}): its state is lost.`));
        break;
      case "gap": this.note("Some of this cell's output was dropped (too much to keep).", "dim"); break;
      case "execution.ended":
        this.stop();
        this.setState(data.state);
        if (data.execution_count !== undefined && data.execution_count !== null) this.count.textContent = `[${data.execution_count}]`;
        if (data.truncated) this.note(`Output was cut in the middle (${data.dropped_bytes} bytes dropped).`, "dim");
        this.page.ended(this);
        break;
      default: break;
    }
  }

  note(text, cls) { this.outputs.append(h("p", { class: cls }, text)); }

  stream(kind, text) {
    let last = this.outputs.lastElementChild;
    if (!last || last.dataset.testid !== `code-${kind}`) {
      last = h("pre", { class: kind === "stderr" ? "stderr" : "stdout", testid: `code-${kind}` });
      this.outputs.append(last);
    }
    last.append(document.createTextNode(text));
    if (last.textContent.length > KEEP) last.textContent = last.textContent.slice(-KEEP);
  }

  error(data) {
    this.outputs.append(h("div", { class: "error", testid: "code-error", "data-ename": data.ename },
      h("strong", { class: "bad", testid: "code-error-name" }, data.evalue ? `${data.ename}: ${data.evalue}` : data.ename),
      h("pre", { testid: "code-traceback" }, data.traceback_text || (data.traceback || []).join("\n"))));
  }

  /** A MIME bundle: an image as a blob, else JSON or plain text; HTML and SVG as downloads. */
  display(item) {
    const data = item.data || {};
    const box = h("div", { class: "display", testid: item.is_result ? "code-result" : "code-display" });
    this.outputs.append(box);
    const image = IMAGES.find((m) => typeof data[m] === "string");
    if (image) {
      this.image(box, new Blob([bytesOf(data[image])], { type: image }));
    } else if (data["application/json"] !== undefined) {
      box.append(h("pre", { testid: "code-json" }, JSON.stringify(data["application/json"], null, 2)));
    } else if (typeof data["text/plain"] === "string") {
      box.append(h("pre", { testid: "code-text" }, data["text/plain"]));
    }
    for (const ref of item.refs || []) {
      if (IMAGES.includes(ref.mime) && !image) this.fetchImage(box, ref);
      else box.append(this.downloadButton(ref.mime, () => this.download(ref.url, ref.mime), `${ref.bytes} bytes`));
    }
    for (const [mime, ext] of Object.entries(DOWNLOAD_ONLY)) {
      if (typeof data[mime] === "string") {
        box.append(this.downloadButton(mime, () => saveBlob(new Blob([data[mime]], { type: "application/octet-stream" }), `output.${ext}`)));
      }
    }
    if (!box.childElementCount) box.append(h("p", { class: "dim" }, `(${Object.keys(data).join(", ") || "empty"}: not shown)`));
  }

  downloadButton(mime, onclick, extra) {
    return h("button", { type: "button", testid: "code-download", "data-mime": mime, onclick },
      `Download ${mime}${extra ? ` (${extra})` : ""}`);
  }

  image(box, blob) {
    const url = URL.createObjectURL(blob);
    this.urls.push(url);
    box.append(h("img", { src: url, alt: "output image", testid: "code-image" }));
  }

  async fetchImage(box, ref) {
    try {
      const response = await this.api.fetch("GET", ref.url);
      this.image(box, new Blob([await response.arrayBuffer()], { type: ref.mime }));
    } catch (e) {
      box.append(h("p", { class: "bad" }, `Cannot load the image: ${e.message}`));
    }
  }

  async download(url, mime) {
    try {
      const response = await this.api.fetch("GET", url);
      saveBlob(new Blob([await response.arrayBuffer()], { type: "application/octet-stream" }), `output.${DOWNLOAD_ONLY[mime] || "bin"}`);
    } catch (e) {
      this.page.banner(`Cannot download: ${e.message}`);
    }
  }

  drop() {
    this.dropped = true;
    this.stop();
    for (const url of this.urls) URL.revokeObjectURL(url);
    this.el.remove();
  }
}

export class CodePage {
  constructor(root, api, caps, banner) {
    this.root = root;
    this.api = api;
    this.caps = caps;
    this.banner = banner;
    this.cid = null;
    this.cells = [];
    // One event stream at a time: a browser opens at most six connections
    // to one origin, and streams of queued cells would hold them all (an
    // Interrupt could not even be sent).  The daemon keeps each
    // execution's events, so a cell followed later misses nothing.
    this.waiting = [];
    this.watching = null;
    this.generation = 0; // bumped when another context is shown
    this.syncing = null;
    this.pickerKey = null;
    const may = (id) => caps.allowed(id);
    this.contextPicker = h("select", { testid: "code-context", "aria-label": "context", onchange: () => this.select(this.contextPicker.value) });
    this.status = h("span", { class: "status", testid: "code-context-status" });
    const tools = [this.contextPicker, this.status];
    if (may("code_context_create")) {
      this.kernelPicker = h("select", { testid: "code-kernel", "aria-label": "kernel" });
      tools.unshift(this.kernelPicker, h("button", { type: "button", testid: "code-context-new", onclick: () => this.create() }, "New context"));
    }
    if (may("code_context_interrupt")) tools.push(h("button", { type: "button", testid: "code-interrupt", onclick: () => this.interrupt() }, "Interrupt"));
    if (may("code_context_restart")) tools.push(h("button", { type: "button", testid: "code-restart", onclick: () => this.restart() }, "Restart"));
    if (may("code_context_delete")) {
      this.confirmButton = h("button", { type: "button", class: "danger", testid: "code-delete-confirm", hidden: true, onclick: () => this.remove() }, "Confirm delete");
      tools.push(h("button", { type: "button", class: "danger", testid: "code-delete", onclick: () => { if (this.cid) this.confirmButton.hidden = false; } }, "Delete"), this.confirmButton);
    }
    tools.push(h("button", { type: "button", testid: "code-refresh", onclick: () => this.refresh() }, "Refresh"));
    this.list = h("div", { class: "cells", testid: "code-cells" });
    const parts = [h("div", { class: "toolbar" }, ...tools), this.list];
    if (may("code_execute")) {
      this.input = h("textarea", { testid: "code-input", spellcheck: "false", placeholder: "code; Shift+Enter runs it", "aria-label": "code",
        onkeydown: (e) => { if (e.key === "Enter" && e.shiftKey) { e.preventDefault(); this.run(); } } });
      parts.push(h("div", { class: "editor" }, this.input, h("button", { type: "button", testid: "code-run", onclick: () => this.run() }, "Run")));
    }
    clear(root).append(...parts);
  }

  async start() {
    if (this.kernelPicker && this.caps.allowed("code_kernels")) {
      try {
        const listed = await this.api.json("GET", "/code/kernels");
        const options = (listed.kernels || []).filter((k) => k.allowed).map((k) =>
          h("option", { value: k.name, title: k.name, selected: k.name === listed.default }, k.display_name || k.name));
        clear(this.kernelPicker).append(...options);
      } catch (e) {
        this.banner(`Cannot list kernels: ${e.message}`);
      }
    }
    await this.refresh(sessionStorage.getItem(REMEMBER));
    // Cells an agent runs in the shown context appear while a person watches.
    this.timer = setInterval(() => {
      if (!this.api.lost && !this.root.hidden && document.visibilityState === "visible") this.refresh();
    }, POLL_MS);
  }

  visible() { this.refresh(); }

  /** List the contexts again; show ``wanted`` (or the current one, or the first). */
  async refresh(wanted) {
    let contexts;
    try { contexts = (await this.api.json("GET", "/code/contexts")).contexts || []; }
    catch (e) { this.banner(`Cannot list code contexts: ${e.message}`); return; }
    contexts = contexts.filter((c) => c.state !== "closed");
    const key = contexts.map((c) => `${c.id} ${c.name} ${c.kernel}`).join("\n");
    if (key !== this.pickerKey) {
      // Rebuilt only when it changed: an open drop-down is not shut every poll.
      this.pickerKey = key;
      const options = contexts.map((c) => h("option", { value: c.id }, `${c.name || c.id} · ${c.kernel}`));
      clear(this.contextPicker).append(...options);
      this.contextPicker.disabled = !contexts.length;
      if (!contexts.length) this.contextPicker.append(h("option", { value: "" }, "no context yet"));
      if (this.cid) this.contextPicker.value = this.cid;
    }
    const ids = contexts.map((c) => c.id);
    const pick = [wanted, this.cid].find((id) => id && ids.includes(id)) || ids[0] || null;
    const current = contexts.find((c) => c.id === pick);
    this.describe(current);
    if (pick !== this.cid || wanted) await this.select(pick, current);
    else await this.sync();
  }

  describe(context) {
    this.status.textContent = context ? `${context.state} · ${context.kernel} · pid ${context.pid ?? "-"}` : "";
    this.status.dataset.state = context ? context.state : "";
  }

  /** Show context ``cid``: its cells so far, each with what it printed. */
  async select(cid, known) {
    this.generation += 1;
    for (const cell of this.cells) cell.drop();
    this.cells = [];
    if (this.confirmButton) this.confirmButton.hidden = true;
    this.cid = cid || null;
    if (!cid) { sessionStorage.removeItem(REMEMBER); this.describe(null); return; }
    sessionStorage.setItem(REMEMBER, cid);
    this.contextPicker.value = cid;
    if (!known) {
      try { this.describe(await this.api.json("GET", `/code/contexts/${encodeURIComponent(cid)}`)); }
      catch (e) { this.banner(`Cannot show ${cid}: ${e.message}`); return; }
    }
    await this.sync();
  }

  /** Add a cell for each execution of the shown context not shown yet (run here or elsewhere). */
  async sync() {
    const cid = this.cid;
    const generation = this.generation;
    // Not while a cell of ours waits for its id: it would be shown twice.
    if (!cid || this.syncing === generation || this.cells.some((c) => !c.id && c.state !== "refused")) return;
    if (!this.caps.allowed("code_executions_list")) return;
    this.syncing = generation;
    try {
      let executions;
      try { executions = (await this.api.json("GET", `/code/contexts/${encodeURIComponent(cid)}/executions`)).executions || []; }
      catch (e) { if (e.status !== 404) this.banner(`Cannot list the cells of ${cid}: ${e.message}`); return; }
      executions.sort((a, b) => a.created_at - b.created_at);
      for (const x of executions) {
        if (this.generation !== generation) return; // another context was picked meanwhile
        if (this.cells.some((c) => c.id === x.execution_id)) continue;
        const code = x.code_head.length >= 256 ? `${x.code_head}\u2026` : x.code_head;
        const cell = this.add(code, x.execution_id);
        cell.setState(x.state);
        if (x.execution_count) cell.count.textContent = `[${x.execution_count}]`;
        if (ENDED.has(x.state)) {
          try { await cell.replay(x.events_url); } catch (e) { cell.note(`Cannot load its output: ${e.message}`, "bad"); }
        } else {
          this.watch(cell, x.events_url);
        }
      }
    } finally {
      if (this.syncing === generation) this.syncing = null;
    }
  }

  /** Follow ``cell``'s events once the cells before it are done. */
  watch(cell, eventsUrl) {
    this.waiting.push([cell, eventsUrl]);
    this.next();
  }

  unwatch(cell) {
    this.waiting = this.waiting.filter(([c]) => c !== cell);
    if (this.watching !== cell) return;
    this.watching = null;
    setTimeout(() => this.next(), 0);
  }

  next() {
    if (this.watching) return;
    const item = this.waiting.shift();
    if (!item || item[0].dropped) return;
    this.watching = item[0];
    item[0].follow(item[1]);
  }

  add(code, executionId) {
    const cell = new Cell(this, code, executionId);
    this.cells.push(cell);
    this.list.append(cell.el);
    return cell;
  }

  async create() {
    this.status.textContent = "starting a kernel...";
    try {
      const made = await this.api.json("POST", "/code/contexts", { json: { kernel: this.kernelPicker.value || undefined } });
      await this.refresh(made.id);
    } catch (e) {
      this.describe(null);
      this.banner(`Could not start a context: ${e.message}`);
    }
  }

  async run() {
    const code = this.input.value;
    if (!code.trim()) return;
    if (!this.cid) { this.banner("Start a context first (New context)."); return; }
    const cell = this.add(code);
    cell.el.scrollIntoView({ block: "nearest" });
    this.input.value = "";
    try {
      const answer = await this.api.json("POST", `/code/contexts/${encodeURIComponent(this.cid)}/execute`, { json: { code, wait: 0 } });
      cell.setExecution(answer.execution_id);
      this.watch(cell, answer.events_url);
      this.status.textContent = "busy";
    } catch (e) {
      cell.setState("refused");
      cell.note(e.message, "bad");
      if (e.code === "context_dead") this.banner("The kernel died and was not restarted: restart the context (its state is lost) or delete it.");
    }
  }

  ended(cell) {
    if (cell === this.cells[this.cells.length - 1]) this.refresh();
    cell.el.scrollIntoView({ block: "nearest" });
  }

  async interrupt() {
    if (!this.cid) return;
    try { await this.api.json("POST", `/code/contexts/${encodeURIComponent(this.cid)}/interrupt`, { json: {} }); }
    catch (e) { this.banner(`Could not interrupt: ${e.message}`); }
  }

  async restart() {
    if (!this.cid) return;
    this.status.textContent = "restarting...";
    try {
      await this.api.json("POST", `/code/contexts/${encodeURIComponent(this.cid)}/restart`, { json: {} });
      this.list.append(h("p", { class: "bad", testid: "code-restarted", "data-reason": "user" }, "The kernel was restarted: every variable and import is gone."));
      this.banner("The kernel was restarted: its state (variables, imports) is lost.", "context-restarted");
    } catch (e) {
      this.banner(`Could not restart: ${e.message}`);
    }
    this.refresh();
  }

  async remove() {
    this.confirmButton.hidden = true;
    const cid = this.cid;
    if (!cid) return;
    try { await this.api.json("DELETE", `/code/contexts/${encodeURIComponent(cid)}`); }
    catch (e) { this.banner(`Could not delete ${cid}: ${e.message}`); }
    await this.select(null);
    await this.refresh();
  }
}
