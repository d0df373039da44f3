// Terminals in tabs: xterm.js over the PTY WebSocket on this same origin.
// A session outlives its socket: a cut socket reconnects with the byte
// offset it had reached (the daemon replays only what followed), and a
// reloaded page re-attaches to its sessions and gets their scrollback once.

import { Terminal } from "./xterm.mjs";
import { FitAddon } from "./addon-fit.mjs";
import { h, clear } from "./dom.js";

const OPEN = "sandboxd.console.terminals";
/** A terminal's status once the console stops trying to reach it. */
const LINK_LOST = "closed: the link no longer works";
/**
 * Input goes in messages of at most this many UTF-16 units (48 KiB of JSON
 * at worst, every unit a \u escape): far under the daemon's bound on a
 * message (``max_message_bytes`` of ``pty_connect``, 1 MiB unless the
 * policy says less), which closes a socket sent more (1009).
 */
const INPUT_CHUNK = 8192;
/** Input waits while the socket holds this much unsent: a paste goes as fast as the shell reads it. */
const HIGH_WATER = 256 * 1024;
/** What is kept while the socket reconnects (UTF-16 units); past it input is refused, and said so. */
const OUTBOX_LIMIT = 16 * 1024 * 1024;
/** WebSocket close code of a message over the receiver's bound (RFC 6455 §7.4.1). */
const TOO_BIG = 1009;
const encoder = new TextEncoder();
const decoder = new TextDecoder();

/** ``text`` in parts of at most ``size`` UTF-16 units, never splitting a surrogate pair. */
function pieces(text, size = INPUT_CHUNK) {
  const out = [];
  let at = 0;
  while (at < text.length) {
    let end = Math.min(text.length, at + size);
    const last = text.charCodeAt(end - 1);
    if (end < text.length && end - at > 1 && last >= 0xd800 && last <= 0xdbff) end -= 1;
    out.push(text.slice(at, end));
    at = end;
  }
  return out;
}

class TerminalTab {
  constructor(page, id) {
    this.page = page;
    this.api = page.api;
    this.id = id;
    this.offset = null; // bytes of output written to the screen so far
    this.retries = 0;
    this.closed = false;
    // Input not yet handed to a socket: typed while it reconnects, or a
    // paste waiting for the shell to read what went before.
    this.outbox = [];
    this.outboxSize = 0;
    this.flushTimer = null;
    this.term = new Terminal({ cursorBlink: true, fontSize: 14, scrollback: 5000, convertEol: false });
    this.fit = new FitAddon();
    this.term.loadAddon(this.fit);
    this.el = h("div", { class: "term", testid: "terminal", "data-session": id });
    this.term.open(this.el);
    this.term.onData((data) => this.input(data));
    this.term.attachCustomKeyEventHandler((e) => this.key(e));
    this.term.onResize(({ cols, rows }) => this.send({ type: "resize", cols, rows }));
    this.button = h("button", { type: "button", testid: "terminal-tab", "data-session": id, onclick: () => page.show(this) }, `shell ${id.slice(0, 6)}`);
    this.closer = h("button", { type: "button", testid: "terminal-close", title: "Close this terminal", onclick: () => page.close(this) }, "×");
    this.tab = h("span", { class: "termtab" }, this.button, this.closer);
  }

  connect() {
    if (this.closed) return;
    if (this.api.lost) { this.giveUp(); return; }
    this.setStatus(this.retries ? "reconnecting" : "connecting");
    const ws = new WebSocket(this.api.terminalSocket(this.id, this.offset));
    this.ws = ws;
    ws.onopen = () => { this.retries = 0; this.setStatus("connected"); this.resize(); this.flush(); };
    ws.onmessage = (e) => this.receive(e.data);
    ws.onclose = (e) => {
      if (this.ws !== ws) return;
      this.ws = null;
      if (this.closed) return;
      if (e.code === TOO_BIG) {
        this.page.banner(`The terminal refused input larger than it accepts in one message (${e.reason || "message too big"}); some of it was not written.`);
      } else if (ws.bufferedAmount > 0) {
        this.page.banner(`The connection to the terminal dropped with ${ws.bufferedAmount} bytes of input unsent; check what arrived.`);
      }
      if (e.code === 1000) { this.setStatus("ended"); return; }
      if (e.code === 1008) {
        this.setStatus(`closed: ${e.reason}`);
        // Refused by the daemon.  Ask the API: when the link itself no
        // longer works (expired, revoked) the login screen shows and the
        // session, which runs on, is kept for a new link to re-attach;
        // otherwise this terminal is no longer this link's to use.
        this.api.fetch("GET", "/capabilities").then(
          () => this.page.forget(this),
          () => { if (this.api.lost) this.giveUp(); else this.page.forget(this); },
        );
        return;
      }
      this.retries += 1;
      // A handshake refused for an expired or revoked link looks like any
      // drop to a browser: ask the API, which shows the login screen then.
      if (this.retries >= 2) this.api.fetch("GET", "/capabilities").catch(() => {});
      const wait = Math.min(5000, 150 * 2 ** Math.min(this.retries, 6)) * (0.75 + Math.random() / 2);
      this.setStatus("reconnecting");
      this.timer = setTimeout(() => this.connect(), wait);
    };
  }

  receive(text) {
    let frame;
    try { frame = JSON.parse(text); } catch (_) { return; }
    if (frame.type === "output") {
      let bytes = encoder.encode(frame.data);
      const start = typeof frame.offset === "number" ? frame.offset : this.offset || 0;
      // Where the next frame starts: the daemon says (output that was not
      // UTF-8 arrives as U+FFFD, whose length is not the bytes it stands for).
      const end = typeof frame.end === "number" ? frame.end : start + bytes.length;
      if (this.offset !== null && start < this.offset) {
        // Already on the screen (a replay that overlaps): write only the rest.
        const skip = this.offset - start;
        if (skip >= bytes.length) return;
        bytes = bytes.subarray(skip);
        this.term.write(bytes);
        this.offset = end;
        return;
      }
      this.term.write(bytes);
      this.offset = end;
    } else if (frame.type === "event" && frame.event === "exited") {
      this.term.write(`\r\n[exited ${frame.exit_code}]\r\n`);
      this.page.forget(this);
    }
  }

  send(message) {
    if (this.ws && this.ws.readyState === WebSocket.OPEN) this.ws.send(JSON.stringify(message));
  }

  /**
   * Keys and pastes: queued in order, sent in parts under the daemon's
   * message bound as the socket drains, and kept while it reconnects;
   * what cannot be kept is refused out loud, never dropped silently.
   */
  input(data) {
    if (this.outboxSize + data.length > OUTBOX_LIMIT) {
      this.page.banner(`${data.length} characters of input were not sent: ${this.outboxSize} are still waiting for the terminal.`);
      return;
    }
    for (const part of pieces(data)) this.outbox.push(part);
    this.outboxSize += data.length;
    this.flush();
  }

  flush() {
    clearTimeout(this.flushTimer);
    this.flushTimer = null;
    const ws = this.ws;
    if (!ws || ws.readyState !== WebSocket.OPEN) return; // sent once connected
    while (this.outbox.length && ws.bufferedAmount < HIGH_WATER) {
      const data = this.outbox.shift();
      this.outboxSize -= data.length;
      ws.send(JSON.stringify({ type: "input", data }));
    }
    // A browser says nothing when its socket drains: look again shortly.
    if (this.outbox.length) this.flushTimer = setTimeout(() => this.flush(), 20);
  }

  /**
   * Escape then Tab (or Shift+Tab) leaves the terminal for its tab in the
   * bar, as CodeMirror's Escape-then-Tab does: every other key, Tab and
   * Escape alone included, goes to the shell, which needs them.
   */
  key(e) {
    if (e.type !== "keydown") return true;
    const leave = e.key === "Tab" && this.escaped && !e.ctrlKey && !e.altKey && !e.metaKey;
    if (!["Shift", "Control", "Alt", "Meta"].includes(e.key)) this.escaped = e.key === "Escape";
    if (!leave) return true;
    e.preventDefault();
    this.escaped = false;
    this.button.focus();
    return false;
  }

  resize() {
    if (this.el.offsetParent === null) return; // hidden: xterm cannot measure
    try { this.fit.fit(); } catch (_) { /* not laid out yet */ }
    this.send({ type: "resize", cols: this.term.cols, rows: this.term.rows });
  }

  /**
   * The link stopped working: no socket can be opened with it any more,
   * so a terminal that is not connected stops trying and says so (an end
   * state, not ``reconnecting`` for ever).  Its session may live on: a
   * new link re-attaches it.
   */
  giveUp() {
    if (this.closed || (this.ws && this.ws.readyState === WebSocket.OPEN)) return;
    clearTimeout(this.timer);
    clearTimeout(this.flushTimer);
    if (this.ws) { const ws = this.ws; this.ws = null; ws.close(); }
    if (this.outboxSize) this.page.banner(`${this.outboxSize} characters typed in the terminal were not sent: the link no longer works.`);
    this.outbox = [];
    this.outboxSize = 0;
    // The daemon's own reason (the link expired, was revoked) says more.
    if (!(this.status || "").startsWith("closed: ")) this.setStatus(LINK_LOST);
  }

  /** A new link: attach again, from the offset the screen had reached. */
  reattach() {
    if (this.closed || this.ws) return;
    clearTimeout(this.timer);
    this.retries = 0;
    this.connect();
  }

  setStatus(text) {
    this.status = text;
    this.el.dataset.status = text;
    this.page.statusChanged(this);
  }

  dispose() {
    this.closed = true;
    clearTimeout(this.timer);
    clearTimeout(this.flushTimer);
    if (this.ws) this.ws.close(1000);
    this.term.dispose();
    this.el.remove();
    this.tab.remove();
  }
}

export class TerminalsPage {
  constructor(root, api, caps, banner) {
    this.root = root;
    this.api = api;
    this.caps = caps;
    this.banner = banner;
    this.tabs = [];
    this.current = null;
    this.statusEl = h("span", { class: "status", testid: "terminal-status" });
    this.tabBar = h("div", { class: "termtabs" });
    this.newButton = h("button", { type: "button", testid: "terminal-new", onclick: () => this.create() }, "+ New terminal");
    this.area = h("div", { class: "terms", testid: "terminal-area" });
    // The identity's other sessions: opened in another browser tab (maybe
    // closed since), by an agent, or before this tab's link was replaced.
    this.others = h("div", { class: "others", testid: "terminal-others", hidden: true });
    const keys = h("span", { class: "status dim", testid: "terminal-keys" }, "Esc then Tab leaves a terminal");
    clear(root).append(h("div", { class: "toolbar" }, this.newButton, this.tabBar, this.statusEl, keys), this.others, this.area);
    new ResizeObserver(() => this.current && this.current.resize()).observe(this.area);
    api.whenLost(() => { for (const tab of this.tabs) tab.giveUp(); });
  }

  async start() {
    const kept = JSON.parse(sessionStorage.getItem(OPEN) || "[]");
    const listed = await this.list();
    const live = listed ? listed.map((s) => s.id) : kept; // else what this tab remembers
    for (const id of kept.filter((k) => live.includes(k))) this.add(id);
    this.remember();
    if (this.tabs.length) this.show(this.tabs[0]);
    this.showOthers(listed);
  }

  /** The identity's live sessions, or null when they cannot be listed. */
  async list() {
    try {
      const listed = await this.api.json("GET", "/pty/sessions");
      return (listed.sessions || []).map((s) => ({ ...s, id: s.session_id || s.id })).filter((s) => s.alive !== false);
    } catch (_) { return null; }
  }

  /**
   * Offer the sessions no tab here shows, to attach to or to end: a
   * session outlives the browser tab that opened it, and holds a share of
   * the identity's terminals until it ends.
   */
  async showOthers(listed) {
    if (listed === undefined) listed = await this.list();
    if (!listed) return;
    const open = new Set(this.tabs.map((t) => t.id));
    const rows = listed.filter((s) => !open.has(s.id)).map((s) => h("span", { class: "other", testid: "terminal-other", "data-session": s.id },
      h("span", { class: "dim" }, `shell ${s.id.slice(0, 6)}${s.created_at ? ` from ${new Date(s.created_at * 1000).toLocaleTimeString()}` : ""}${s.clients ? `, open elsewhere (${s.clients})` : ""}`),
      h("button", { type: "button", testid: "terminal-attach", "data-session": s.id, onclick: () => this.attach(s.id) }, "Attach"),
      h("button", { type: "button", testid: "terminal-end", "data-session": s.id, title: "End this terminal", onclick: () => this.end(s.id) }, "End")));
    clear(this.others).append(h("span", { class: "dim" }, "Also running:"), ...rows,
      h("button", { type: "button", testid: "terminal-refresh", title: "List the terminals again", onclick: () => this.showOthers() }, "Refresh"));
    this.others.hidden = !rows.length;
  }

  attach(id) {
    if (!this.tabs.some((t) => t.id === id)) this.add(id);
    this.remember();
    this.show(this.tabs.find((t) => t.id === id));
    this.showOthers();
  }

  async end(id) {
    try { await this.api.fetch("DELETE", `/pty/sessions/${encodeURIComponent(id)}`); }
    catch (e) { this.banner(`Could not end the terminal: ${e.message}`); }
    this.showOthers();
  }

  /** A new link: re-attach the tabs the old one lost, and list the rest. */
  async relinked() {
    const listed = await this.list();
    const live = listed ? listed.map((s) => s.id) : null;
    for (const tab of [...this.tabs]) {
      if (!live || live.includes(tab.id)) tab.reattach();
      else if (!tab.ws) { this.forget(tab); tab.dispose(); }
    }
    this.showOthers(listed);
  }

  async create() {
    try {
      const made = await this.api.json("POST", "/pty/sessions", { json: { cols: 80, rows: 24 } });
      this.show(this.add(made.session_id));
      this.remember();
    } catch (e) {
      this.banner(`Could not open a terminal: ${e.message}`);
      this.showOthers();
    }
  }

  add(id) {
    const tab = new TerminalTab(this, id);
    tab.el.hidden = true;
    this.tabs.push(tab);
    this.tabBar.append(tab.tab);
    this.area.append(tab.el);
    tab.connect();
    return tab;
  }

  show(tab) {
    for (const t of this.tabs) {
      t.el.hidden = t !== tab;
      t.button.setAttribute("aria-selected", String(t === tab));
    }
    this.current = tab;
    this.statusChanged(tab);
    requestAnimationFrame(() => { tab.resize(); tab.term.focus(); });
  }

  visible() {
    if (this.current) requestAnimationFrame(() => this.current.resize());
    this.showOthers();
  }

  async close(tab) {
    this.forget(tab);
    tab.dispose();
    try { await this.api.fetch("DELETE", `/pty/sessions/${encodeURIComponent(tab.id)}`); } catch (_) { /* gone already */ }
    this.showOthers();
  }

  forget(tab) {
    this.tabs = this.tabs.filter((t) => t !== tab);
    this.remember();
    if (this.current === tab) {
      this.current = null;
      if (this.tabs.length) this.show(this.tabs[this.tabs.length - 1]);
      else this.statusEl.textContent = "";
    }
  }

  remember() { sessionStorage.setItem(OPEN, JSON.stringify(this.tabs.map((t) => t.id))); }

  statusChanged(tab) {
    if (tab === this.current) {
      this.statusEl.textContent = tab.status || "";
      this.statusEl.className = `status ${tab.status === "connected" ? "ok" : "dim"}`;
    }
  }
}

export { decoder };
