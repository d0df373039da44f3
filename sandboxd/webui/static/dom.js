// Building elements without innerHTML: every text goes in as a text node,
// so a file name or a file's contents can never become markup.

/**
 * h("button", {testid: "x", onclick: f}, "label") -> an element.
 * Attributes: testid -> data-testid, on* -> listeners, class, hidden, others as attributes.
 */
export function h(tag, attrs = {}, ...children) {
  const el = document.createElement(tag);
  for (const [name, value] of Object.entries(attrs || {})) {
    if (value === undefined || value === null || value === false) continue;
    if (name === "testid") el.dataset.testid = value;
    else if (name.startsWith("on")) el.addEventListener(name.slice(2), value);
    else if (name === "class") el.className = value;
    else if (name === "hidden") el.hidden = true;
    else if (name === "value") el.value = value;
    else el.setAttribute(name, value === true ? "" : String(value));
  }
  for (const child of children.flat()) {
    if (child === null || child === undefined || child === false) continue;
    el.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return el;
}

/**
 * A table row that is a control (a file, a search hit, a process) works
 * from the keyboard as from the mouse: it is a Tab stop, Space does what a
 * click does, Enter what a double-click does (``enter``, else the click),
 * and the arrow keys move to the row above or below.  ``aria-selected``
 * says which row is chosen (the table is a ``grid``).
 */
export function keyRow(row, click, enter = click) {
  row.tabIndex = 0;
  row.setAttribute("aria-selected", "false");
  row.addEventListener("keydown", (e) => {
    if (e.target !== row || e.altKey || e.ctrlKey || e.metaKey) return;
    if (e.key === "Enter" || e.key === " ") {
      e.preventDefault();
      (e.key === "Enter" ? enter : click)();
    } else if (e.key === "ArrowDown" || e.key === "ArrowUp") {
      const step = e.key === "ArrowDown" ? "nextElementSibling" : "previousElementSibling";
      let next = row[step];
      while (next && next.tabIndex < 0) next = next[step];
      if (next) { e.preventDefault(); next.focus(); }
    }
  });
  return row;
}

/** Mark ``row`` the chosen one of its table (class ``selected``, ``aria-selected``). */
export function choose(table, row) {
  for (const r of table.querySelectorAll("tr")) {
    r.classList.remove("selected");
    if (r.hasAttribute("aria-selected")) r.setAttribute("aria-selected", "false");
  }
  if (row) { row.classList.add("selected"); row.setAttribute("aria-selected", "true"); }
}

export function clear(el) {
  while (el.firstChild) el.removeChild(el.firstChild);
  return el;
}

export function size(n) {
  if (n === null || n === undefined) return "";
  const units = ["B", "KB", "MB", "GB", "TB"];
  let i = 0;
  let v = n;
  while (v >= 1000 && i < units.length - 1) { v /= 1000; i += 1; }
  return `${i ? v.toFixed(1) : v} ${units[i]}`;
}
