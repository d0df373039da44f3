// The console's entry: log in with a link, ask /capabilities what it may
// do, and build only the pages (and the buttons) it allows.

import { Api, takeLink, linkFromHash, saveLink, forgetLink } from "./api.js";
import { TerminalsPage } from "./terminals.js";
import { FilesPage } from "./files.js";
import { ProcessesPage } from "./processes.js";
import { PortsPage } from "./ports.js";
import { AgentsPage } from "./agents.js";
import { CodePage } from "./code.js";

const $ = (testid) => document.querySelector(`[data-testid="${testid}"]`);

// Which endpoint a page needs before it is shown at all.
const PAGES = {
  terminals: { needs: ["pty_create_session"], make: TerminalsPage },
  files: { needs: ["files_list"], make: FilesPage },
  processes: { needs: ["process_list"], make: ProcessesPage },
  ports: { needs: [["preview_ports_list", "ports"]], make: PortsPage },
  code: { needs: ["code_contexts_list"], make: CodePage },
  agents: { needs: ["agents_session_list"], make: AgentsPage },
};

class Capabilities {
  constructor(document) { this.doc = document; }
  allowed(id) {
    const e = (this.doc.endpoints || {})[id];
    return Boolean(e && e.allowed);
  }
  allows(need) { return Array.isArray(need) ? need.some((id) => this.allowed(id)) : this.allowed(need); }
}

const EXPIRED = "This link has expired: ask for a new one.";

/** What the console runs on once it is built: its API, what the link may do, its pages. */
let built = null;

/**
 * Ask for a link.  Once the console is built the pages stay as they are,
 * under the login screen, with what is typed in them (an edit, a cell not
 * run yet): a new link takes over in place.  Logging out hides them.
 */
function showLogin(reason, hideApp) {
  $("login-reason").textContent = reason || "";
  $("login").hidden = false;
  $("login").classList.toggle("again", Boolean(built) && !hideApp);
  if (!built || hideApp) document.getElementById("app").hidden = true;
  $("login-link").value = "";
  // Not while the pages stay: the person may be typing in one of them.
  if (document.getElementById("app").hidden) $("login-link").focus();
}

function banner(text, testid) {
  const el = $("banner");
  el.textContent = text;
  el.hidden = !text;
  el.dataset.kind = testid || "error";
  clearTimeout(banner.timer);
  if (text && !testid) banner.timer = setTimeout(() => { el.hidden = true; }, 15000);
}

function lostReason(error) {
  return error.code === "link_expired" ? EXPIRED : `This link no longer works (${error.message}).`;
}

/** The endpoints a capabilities document allows, as one comparable string. */
function allowedIds(doc) {
  return Object.entries(doc.endpoints || {}).filter(([, e]) => e && e.allowed).map(([id]) => id).sort().join(" ");
}

function showIdentity(doc) {
  const identity = doc.identity || {};
  $("identity").textContent = `${identity.id || "?"} · ${(identity.scopes || []).join(" ")}`;
}

/**
 * A new link, pasted on the login screen or in a new URL's fragment.
 * Before the console is built there is nothing to keep: load it with the
 * link.  After, check the link and go on with it in place.
 */
async function useLink(value) {
  if (!value) return;
  if (!built) { saveLink(value); location.reload(); return; }
  let doc;
  try {
    doc = await new Api(value, () => {}).json("GET", "/capabilities");
  } catch (e) {
    const why = e.status === 401 ? lostReason(e) : `Cannot reach the daemon: ${e.message}`;
    // While the link in use still works, it stays in use.
    if (built.api.lost) showLogin(why);
    else banner(`The new link was not taken. ${why}`);
    return;
  }
  saveLink(value);
  const before = allowedIds(built.caps.doc);
  built.caps.doc = doc;
  built.api.relink(value);
  showIdentity(doc);
  $("login").hidden = true;
  document.getElementById("app").hidden = false;
  // An error shown is the old link's refusal: the new link answers it.
  if (!$("banner").hidden && $("banner").dataset.kind === "error") banner("");
  if (allowedIds(doc) !== before) {
    banner("This link may do other things than the last one: reload the page to see its controls.", "link-changed");
  }
  for (const page of Object.values(built.started)) if (page.relinked) page.relinked();
}

function loginControls() {
  $("login-submit").addEventListener("click", () => {
    useLink($("login-link").value.trim().replace(/^.*#link=/, ""));
  });
  $("login-link").addEventListener("keydown", (e) => { if (e.key === "Enter") $("login-submit").click(); });
  // A new URL pasted into this tab changes only the fragment: no reload.
  window.addEventListener("hashchange", () => { useLink(linkFromHash()); });
}

async function main() {
  loginControls();
  const link = takeLink();
  if (!link) { showLogin(""); return; }
  const api = new Api(link, (error) => {
    forgetLink();
    showLogin(lostReason(error));
  }, () => {
    // An error is about what failed last; once something the person asked
    // for worked, it would only mislead.  Notices (an edit conflict, a
    // restarted kernel) stay until dismissed.
    const el = $("banner");
    if (!el.hidden && el.dataset.kind === "error") banner("");
  });
  let caps;
  try {
    caps = new Capabilities(await api.json("GET", "/capabilities"));
  } catch (e) {
    if (!api.lost) showLogin(`Cannot reach the daemon: ${e.message}`);
    return;
  }
  showIdentity(caps.doc);
  $("logout").addEventListener("click", () => { forgetLink(); api.lost = true; showLogin("Logged out.", true); });
  $("banner").addEventListener("click", () => banner(""));
  document.getElementById("app").hidden = false;
  $("login").hidden = true;

  const pages = {};
  for (const [name, spec] of Object.entries(PAGES)) {
    const nav = $(`nav-${name}`);
    if (!spec.needs.every((need) => caps.allows(need))) { nav.remove(); continue; }
    pages[name] = new spec.make($(`page-${name}`), api, caps, banner);
    nav.addEventListener("click", () => show(name));
  }
  const started = {};
  built = { api, caps, started };
  const names = Object.keys(pages);
  if (!names.length) { $("nothing-allowed").hidden = false; return; }
  function show(name) {
    for (const section of document.querySelectorAll("section.page")) section.hidden = section.dataset.page !== name;
    for (const nav of document.querySelectorAll("nav [data-page]")) nav.setAttribute("aria-selected", String(nav.dataset.page === name));
    sessionStorage.setItem("sandboxd.console.page", name);
    if (!started[name]) { started[name] = pages[name]; pages[name].start(); }
    else pages[name].visible();
  }
  const last = sessionStorage.getItem("sandboxd.console.page");
  show(names.includes(last) ? last : names[0]);
  document.body.dataset.ready = "true";
}

main();
