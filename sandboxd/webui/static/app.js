// The console's entry: log in with a link, ask /capabilities what it may
// do, and build only the pages (and the buttons) it allows.

import { Api, takeLink, saveLink, forgetLink } from "./api.js";
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

function showLogin(reason) {
  $("login-reason").textContent = reason || "";
  $("login").hidden = false;
  document.getElementById("app").hidden = true;
}

function banner(text, testid) {
  const el = $("banner");
  el.textContent = text;
  el.hidden = !text;
  el.dataset.kind = testid || "error";
  clearTimeout(banner.timer);
  if (text && !testid) banner.timer = setTimeout(() => { el.hidden = true; }, 15000);
}

function loginControls() {
  $("login-submit").addEventListener("click", () => {
    const value = $("login-link").value.trim().replace(/^.*#link=/, "");
    if (!value) return;
    saveLink(value);
    location.reload();
  });
}

async function main() {
  loginControls();
  const link = takeLink();
  if (!link) { showLogin(""); return; }
  let lost = false;
  const api = new Api(link, (error) => {
    if (lost) return;
    lost = true;
    forgetLink();
    showLogin(error.code === "link_expired" ? "This link has expired: ask for a new one." : `This link no longer works (${error.message}).`);
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
    if (!lost) showLogin(`Cannot reach the daemon: ${e.message}`);
    return;
  }
  const identity = caps.doc.identity || {};
  $("identity").textContent = `${identity.id || "?"} · ${(identity.scopes || []).join(" ")}`;
  $("logout").addEventListener("click", () => { forgetLink(); showLogin("Logged out."); });
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
  const names = Object.keys(pages);
  if (!names.length) { $("nothing-allowed").hidden = false; return; }
  const started = {};
  function show(name) {
    for (const section of document.querySelectorAll("section.page")) section.hidden = section.dataset.page !== name;
    for (const nav of document.querySelectorAll("nav [data-page]")) nav.setAttribute("aria-selected", String(nav.dataset.page === name));
    sessionStorage.setItem("sandboxd.console.page", name);
    if (!started[name]) { started[name] = true; pages[name].start(); }
    else pages[name].visible();
  }
  const last = sessionStorage.getItem("sandboxd.console.page");
  show(names.includes(last) ? last : names[0]);
  document.body.dataset.ready = "true";
}

main();
