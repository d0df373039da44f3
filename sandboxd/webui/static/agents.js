// Agent sessions, and the permission requests and questions they hold
// until a person answers: the human-takeover half of the console.

import { h, clear } from "./dom.js";

const POLL_MS = 1500;

function diffView(diff) {
  return h("div", { class: "diff" },
    h("div", { class: "dim" }, diff.path || ""),
    diff.old_text ? h("pre", { class: "bad", testid: "agent-diff-old" }, diff.old_text) : null,
    h("pre", { class: "ok", testid: "agent-diff-new" }, diff.new_text ?? ""));
}

export class AgentsPage {
  constructor(root, api, caps, banner) {
    this.root = root;
    this.api = api;
    this.caps = caps;
    this.banner = banner;
    this.timer = null;
    this.requests = h("div", { class: "requests", testid: "agent-requests" });
    this.sessions = h("div", { class: "list", testid: "agent-sessions" });
    clear(root).append(
      h("div", { class: "toolbar" },
        h("button", { type: "button", testid: "agent-refresh", onclick: () => this.refresh() }, "Refresh"),
        h("span", { class: "status dim" }, "Pending requests wait here for your answer.")),
      h("h3", {}, "Waiting for you"), this.requests,
      h("h3", {}, "Sessions"), this.sessions,
    );
  }

  async start() {
    await this.refresh();
    this.timer = setInterval(() => { if (!this.root.hidden) this.refresh(); }, POLL_MS);
  }

  visible() { this.refresh(); }

  async refresh() {
    let sessions;
    let pending = [];
    try {
      sessions = (await this.api.json("GET", "/agents/sessions")).sessions || [];
      if (this.caps.allowed("agents_requests")) {
        pending = (await this.api.json("GET", "/agents/requests")).requests || [];
      }
    } catch (e) {
      this.banner(`Cannot list agent sessions: ${e.message}`);
      return;
    }
    this.renderSessions(sessions);
    this.renderRequests(pending);
  }

  renderSessions(sessions) {
    const rows = sessions.map((s) => h("tr", { testid: "agent-session", "data-session": s.session_id },
      h("td", {}, s.agent), h("td", {}, s.title || s.session_id.slice(0, 8)),
      h("td", { class: s.state === "awaiting_input" ? "bad" : "dim" }, s.state),
      h("td", { class: "dim" }, s.pending_requests ? `${s.pending_requests} waiting` : ""),
      h("td", { class: "dim" }, s.cwd || "")));
    clear(this.sessions).append(h("table", {}, h("tbody", {}, rows)));
    if (!rows.length) this.sessions.append(h("p", { class: "empty" }, "No agent sessions."));
  }

  renderRequests(pending) {
    const shown = new Set([...this.requests.querySelectorAll("[data-request]")].map((e) => e.dataset.request));
    const wanted = new Set(pending.map((r) => r.request_id));
    if (shown.size === wanted.size && [...wanted].every((id) => shown.has(id))) return; // keep typing intact
    clear(this.requests);
    if (!pending.length) { this.requests.append(h("p", { class: "empty", testid: "agent-no-requests" }, "Nothing is waiting.")); return; }
    const mayAnswer = this.caps.allowed("agents_request_reply");
    for (const r of pending) this.requests.append(this.card(r, mayAnswer));
  }

  card(r, mayAnswer) {
    const call = r.tool_call || {};
    const body = [h("div", { class: "toolbar" },
      h("strong", {}, r.kind === "question" ? "Question" : `Permission: ${call.title || call.kind || "a tool call"}`),
      h("span", { class: "dim" }, `session ${String(r.session_id).slice(0, 8)}`),
      r.deadline ? h("span", { class: "dim" }, `until ${r.deadline}`) : null)];
    for (const diff of call.diffs || []) body.push(diffView(diff));
    if (call.raw_input && !(call.diffs || []).length) body.push(h("pre", {}, JSON.stringify(call.raw_input, null, 2)));
    const answer = (reply) => this.reply(r, reply);
    if (r.kind === "question") {
      body.push(h("p", {}, (r.message || (r.options && r.options.message)) || ""));
      const content = h("textarea", { testid: "agent-question-content", placeholder: "{\"answer\": ...}" });
      if (mayAnswer) {
        body.push(content, h("div", { class: "toolbar" },
          h("button", { type: "button", testid: "agent-question-accept", onclick: () => {
            let parsed = {};
            try { parsed = content.value.trim() ? JSON.parse(content.value) : {}; } catch (_) { this.banner("The answer must be JSON."); return; }
            answer({ action: "accept", content: parsed });
          } }, "Answer"),
          h("button", { type: "button", testid: "agent-question-decline", onclick: () => answer({ action: "decline" }) }, "Decline")));
      }
    } else if (mayAnswer) {
      body.push(h("div", { class: "toolbar" }, ...(r.options || []).map((o) => h("button", {
        type: "button",
        class: String(o.kind || "").startsWith("reject") ? "danger" : "",
        testid: "agent-request-option",
        "data-option": o.option_id,
        "data-request": r.request_id,
        onclick: () => answer({ option_id: o.option_id }),
      }, o.name || o.option_id))));
    }
    return h("div", { class: "view request", testid: "agent-request", "data-request": r.request_id, "data-kind": r.kind }, ...body);
  }

  async reply(r, body) {
    try {
      await this.api.json("POST", `/agents/requests/${encodeURIComponent(r.request_id)}`, { json: body });
    } catch (e) {
      this.banner(e.status === 409 ? "Someone else answered this request already." : `Could not answer: ${e.message}`);
    }
    this.refresh();
  }
}
