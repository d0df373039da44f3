// Processes: the managed processes, and one's output live (SSE).

import { h, clear, keyRow, choose } from "./dom.js";

const KEEP = 256 * 1024; // characters of output kept on screen
const HELD = 4096; // characters of an unfinished escape sequence held for the next chunk

// Terminal control sequences (colours, cursor moves, titles, hyperlinks):
// CSI (ESC [ ... or U+009B ...), OSC, DCS, SOS, PM and APC strings (ended
// by BEL or ESC \), other ESC sequences; then the C0 controls a <pre>
// cannot show (tab, newline and carriage return stay).
const SEQUENCE = /(?:\x1b\[|\x9b)[0-?]*[ -\/]*[@-~]|\x1b[\]PX^_][^\x07\x1b]*(?:\x07|\x1b\\)|\x1b[ -\/]*[0-~]|[\x00-\x08\x0b\x0c\x0e-\x1a\x1c-\x1f\x7f]/g;
// The start of a sequence at the very end of a chunk: the rest is in the next.
const UNFINISHED = /(?:\x1b(?:\[[0-?]*[ -\/]*|[\]PX^_][^\x07\x1b]*\x1b?|[ -\/]*)|\x9b[0-?]*[ -\/]*)$/;

/**
 * One stream's output as plain text: control sequences removed, one split
 * across chunks included (its start is held until the rest arrives).
 * Invalid UTF-8 arrives from the daemon as U+FFFD and is shown as such.
 */
export class PlainText {
  constructor() { this.held = ""; }

  /** The text of ``chunk`` to show now. */
  feed(chunk) {
    let text = this.held + chunk;
    this.held = "";
    const tail = UNFINISHED.exec(text);
    if (tail && text.length - tail.index <= HELD) {
      this.held = text.slice(tail.index);
      text = text.slice(0, tail.index);
    }
    return text.replace(SEQUENCE, "").replace(/\x1b/g, "");
  }
}

export class ProcessesPage {
  constructor(root, api, caps, banner) {
    this.root = root;
    this.api = api;
    this.caps = caps;
    this.banner = banner;
    this.source = null;
    this.list = h("div", { class: "list", testid: "process-list" });
    this.title = h("strong", { testid: "process-output-title" }, "Select a process to follow its output.");
    this.output = h("pre", { class: "output", testid: "process-output" });
    this.signal = h("button", { type: "button", class: "danger", testid: "process-kill", hidden: true, onclick: () => this.kill() }, "Send TERM");
    clear(root).append(
      h("div", { class: "toolbar" }, h("button", { type: "button", testid: "process-refresh", onclick: () => this.refresh() }, "Refresh")),
      h("div", { class: "split" }, this.list, h("div", { class: "view" }, h("div", { class: "toolbar" }, this.title, this.signal), this.output)),
    );
  }

  async start() { await this.refresh(); }
  visible() { this.refresh(); }

  async refresh() {
    let listed;
    try { listed = await this.api.json("GET", "/process/list"); }
    catch (e) { this.banner(`Cannot list processes: ${e.message}`); return; }
    const rows = (listed.processes || []).map((p) => {
      const row = h("tr", {
        class: "entry", testid: "process-entry", "data-pid": p.pid, onclick: () => this.follow(p, row),
      }, h("td", {}, String(p.pid)), h("td", {}, p.command_text || (Array.isArray(p.command) ? p.command.join(" ") : String(p.command))), h("td", { class: p.state === "running" ? "ok" : "dim" }, p.state), h("td", { class: "dim" }, p.exit_code ?? ""));
      return keyRow(row, () => this.follow(p, row));
    });
    clear(this.list).append(h("table", { role: "grid", "aria-label": "processes" }, h("thead", {}, h("tr", {}, h("th", {}, "pid"), h("th", {}, "command"), h("th", {}, "state"), h("th", {}, "exit"))), h("tbody", {}, rows)));
    const followed = rows.find((r) => r.dataset.pid === String(this.followed));
    if (followed) choose(this.list, followed);
    if (!rows.length) this.list.append(h("p", { class: "empty" }, "No managed processes."));
  }

  follow(p, row) {
    if (row) choose(this.list, row);
    this.followed = p.pid;
    if (this.source) this.source.close();
    this.title.textContent = `${p.pid}: ${Array.isArray(p.command) ? p.command.join(" ") : p.command}`;
    this.signal.hidden = !(this.caps.allowed("process_signal") && p.state === "running");
    this.signal.dataset.pid = p.pid;
    clear(this.output);
    const source = new EventSource(this.api.eventSource(`/process/${p.pid}/output`, { follow: "true" }));
    this.source = source;
    const append = (text) => {
      if (!text) return;
      this.output.append(document.createTextNode(text));
      if (this.output.textContent.length > KEEP) this.output.textContent = this.output.textContent.slice(-KEEP);
      this.output.scrollTop = this.output.scrollHeight;
    };
    for (const kind of ["stdout", "stderr"]) {
      const plain = new PlainText();
      source.addEventListener(kind, (e) => { try { append(plain.feed(JSON.parse(e.data).data)); } catch (_) { /* malformed */ } });
    }
    source.addEventListener("exit", (e) => {
      let code = "?";
      try { code = JSON.parse(e.data).exit_code; } catch (_) { /* malformed */ }
      append(`\n[exited ${code}]\n`);
      source.close();
      this.signal.hidden = true;
    });
    source.addEventListener("error", () => { if (source.readyState === EventSource.CLOSED) append("\n[stream closed]\n"); });
  }

  async kill() {
    const pid = this.signal.dataset.pid;
    try { await this.api.json("POST", `/process/${pid}/signal`, { json: { signal: "SIGTERM" } }); }
    catch (e) { this.banner(`Could not signal ${pid}: ${e.message}`); }
    this.refresh();
  }
}
