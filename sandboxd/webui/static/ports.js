// Ports and previews: what listens in the sandbox; "Open" exposes a port
// on the preview door if needed and mints a short-lived link to it.

import { h, clear } from "./dom.js";

export class PortsPage {
  constructor(root, api, caps, banner) {
    this.root = root;
    this.api = api;
    this.caps = caps;
    this.banner = banner;
    this.list = h("div", { class: "list", testid: "port-list" });
    this.links = h("div", { class: "toolbar", testid: "port-links" });
    clear(root).append(
      h("div", { class: "toolbar" }, h("button", { type: "button", testid: "port-refresh", onclick: () => this.refresh() }, "Refresh")),
      this.links,
      this.list,
    );
  }

  async start() { await this.refresh(); }
  visible() { this.refresh(); }

  async refresh() {
    let ports = [];
    try {
      if (this.caps.allowed("preview_ports_list")) {
        ports = (await this.api.json("GET", "/preview/ports")).ports || [];
      } else {
        const listed = await this.api.json("GET", "/ports");
        const seen = new Set();
        ports = (listed.listening || [])
          .filter((p) => !seen.has(p.port) && seen.add(p.port))
          .sort((a, b) => a.port - b.port)
          .map((p) => ({ port: p.port, listening: true, exposed: false, address: p.address }));
      }
    } catch (e) {
      this.banner(`Cannot list ports: ${e.message}`);
      return;
    }
    const canOpen = this.caps.allowed("preview_link");
    // The preview listing says which ports the daemon would refuse (its
    // own, and those the policy keeps out): no button there.  The plain
    // port listing cannot say, so the daemon decides on a click.
    const rows = ports.map((p) => h("tr", { testid: "port-entry", "data-port": p.port },
      h("td", {}, String(p.port)),
      h("td", { class: p.listening === false ? "dim" : "ok" }, p.listening === false ? "not listening" : "listening"),
      h("td", { class: "dim" }, p.previewable === false ? "cannot be previewed" : p.exposed ? (p.public ? "public preview" : "private preview") : ""),
      h("td", {}, canOpen && p.previewable !== false ? h("button", { type: "button", testid: "port-open", "data-port": p.port, onclick: () => this.open(p) }, "Open preview") : ""),
    ));
    clear(this.list).append(h("table", {}, h("thead", {}, h("tr", {}, h("th", {}, "port"), h("th", {}, "state"), h("th", {}, "preview"), h("th", {}, ""))), h("tbody", {}, rows)));
    if (!rows.length) this.list.append(h("p", { class: "empty" }, "Nothing listens."));
  }

  async open(p) {
    try {
      if (!p.exposed) {
        if (!this.caps.allowed("preview_expose")) { this.banner(`Port ${p.port} is not exposed, and this link may not expose it.`); return; }
        await this.api.json("POST", "/preview/ports", { json: { port: p.port } });
      }
      const minted = await this.api.json("POST", `/preview/ports/${p.port}/link`, { json: { ttl_seconds: 900 } });
      if (!minted.url) { this.banner("The preview door is not listening (start the daemon with --preview-port)."); return; }
      const a = h("a", { href: minted.url, target: "_blank", rel: "noopener noreferrer", testid: "port-link", "data-port": p.port }, `Open port ${p.port} (link valid 15 min)`);
      clear(this.links).append(a);
      window.open(minted.url, "_blank", "noopener,noreferrer");
      this.refresh();
    } catch (e) {
      this.banner(`Could not open port ${p.port}: ${e.message}`);
    }
  }
}
