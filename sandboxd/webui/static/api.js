// The daemon's API as the console calls it: a capability link, kept in
// sessionStorage (never localStorage, never a cookie), sent as a bearer token.

const KEY = "sandboxd.console.link";

/**
 * The link in the URL's fragment (``#link=...``), or null; it leaves the
 * address bar (and the tab's history) at once.
 */
export function linkFromHash() {
  const match = /(?:^#|&)link=([^&]+)/.exec(location.hash);
  if (!match) return null;
  history.replaceState(null, "", location.pathname + location.search);
  return decodeURIComponent(match[1]);
}

/** Move a link from the URL's fragment to sessionStorage; the current link or null. */
export function takeLink() {
  const link = linkFromHash();
  if (link) sessionStorage.setItem(KEY, link);
  return sessionStorage.getItem(KEY);
}

export function saveLink(link) { sessionStorage.setItem(KEY, link); }
export function forgetLink() { sessionStorage.removeItem(KEY); }

export class ApiError extends Error {
  constructor(status, body) {
    super((body && body.error) || `HTTP ${status}`);
    this.status = status;
    this.code = body && body.code;
    this.body = body || {};
  }
}

const AUTH_LOST = new Set(["unauthorized", "link_invalid", "link_expired"]);

// Calls that change something: the console makes them only when the
// person asks (a click, a key), never on a timer, so one that succeeds
// is a successful action (and an error shown before it is stale).
const READS = new Set(["GET", "HEAD"]);

export class Api {
  /**
   * @param onAuthLost called with the error when the link stops working
   * @param onChanged called after a call that changes something succeeded
   */
  constructor(link, onAuthLost, onChanged) {
    this.link = link;
    this.onAuthLost = onAuthLost;
    this.onChanged = onChanged || (() => {});
    this.lostHandlers = [];
  }

  /** Call ``handler`` each time the link in use stops working. */
  whenLost(handler) { this.lostHandlers.push(handler); }

  /**
   * Go on with ``link`` (a new one, checked by the caller): the pages keep
   * what they show and what is typed in them, which a reload would lose.
   */
  relink(link) {
    this.link = link;
    this.lost = false;
  }

  url(path, query) {
    const url = new URL(path, location.origin);
    for (const [k, v] of Object.entries(query || {})) {
      if (v !== undefined && v !== null) url.searchParams.set(k, String(v));
    }
    return url;
  }

  headers(extra) {
    return { Authorization: `Bearer ${this.link}`, ...(extra || {}) };
  }

  /** One call: the Response when ok, else throws ApiError (and reports a lost link). */
  async fetch(method, path, { query, json, body, headers } = {}) {
    const init = { method, headers: this.headers(headers), cache: "no-store" };
    if (json !== undefined) {
      init.body = JSON.stringify(json);
      init.headers["Content-Type"] = "application/json";
    } else if (body !== undefined) {
      init.body = body;
    }
    const link = this.link;
    const response = await fetch(this.url(path, query), init);
    if (!response.ok && response.status !== 304) throw await this.failure(response.status, await response.text(), link);
    if (!READS.has(method)) this.onChanged();
    return response;
  }

  async json(method, path, options) {
    const response = await this.fetch(method, path, options);
    return response.json();
  }

  /** The error of a failed call made with ``link``; a refused link is reported once. */
  async failure(status, text, link) {
    let parsed = null;
    try { parsed = JSON.parse(text); } catch (_) { parsed = { error: text }; }
    const error = new ApiError(status, parsed);
    // A call made with a link replaced since says nothing about the new one.
    if (status === 401 && AUTH_LOST.has(error.code) && !this.lost && link === this.link) {
      this.lost = true;
      this.onAuthLost(error);
      for (const handler of this.lostHandlers) handler(error);
    }
    return error;
  }

  /** Upload ``file`` to ``path`` with progress (fetch cannot report upload progress). */
  upload(path, file, onProgress) {
    return new Promise((resolve, reject) => {
      const link = this.link;
      const xhr = new XMLHttpRequest();
      xhr.open("POST", this.url("/files/raw", { path, overwrite: "true" }));
      xhr.setRequestHeader("Authorization", `Bearer ${link}`);
      xhr.setRequestHeader("Content-Type", "application/octet-stream");
      xhr.upload.onprogress = (e) => { if (e.lengthComputable) onProgress(e.loaded, e.total); };
      xhr.onerror = () => reject(new ApiError(0, { error: "the connection failed" }));
      xhr.onload = async () => {
        if (xhr.status >= 200 && xhr.status < 300) { this.onChanged(); resolve(JSON.parse(xhr.responseText)); }
        else reject(await this.failure(xhr.status, xhr.responseText, link));
      };
      xhr.send(file);
    });
  }

  /** The WebSocket URL of a terminal on this same origin. */
  terminalSocket(sessionId, offset) {
    const url = this.url(`/pty/sessions/${encodeURIComponent(sessionId)}/ws`, {
      access_token: this.link,
      offset,
    });
    url.protocol = location.protocol === "https:" ? "wss:" : "ws:";
    return url.toString();
  }

  /** An EventSource URL (it cannot send headers: the link goes in the query). */
  eventSource(path, query) {
    return this.url(path, { ...(query || {}), access_token: this.link }).toString();
  }
}
