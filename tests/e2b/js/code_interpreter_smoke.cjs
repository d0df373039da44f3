// E2B's JavaScript code-interpreter SDK against sandboxd's E2B door, in the
// SDK's debug mode (E2B_DEBUG=true, E2B_SANDBOX_URL=the door): no call to
// E2B's cloud. Prints one JSON line of what it saw; the trial test
// (tests/e2b/test_js_sdk.py) checks it. Run with NODE_PATH pointing at the
// node_modules that holds @e2b/code-interpreter.
const { Sandbox } = require("@e2b/code-interpreter");

async function main() {
  const sbx = await Sandbox.connect("debug_sandbox_id");
  const out = {};
  await sbx.runCode("x = 41");
  const kept = await sbx.runCode("x + 1");
  out.kept = kept.text;
  const lines = [];
  const printed = await sbx.runCode("print('a')\nprint('b')", {
    onStdout: (m) => lines.push(m.line),
  });
  out.stdout = printed.logs.stdout;
  out.streamed = lines.join("");
  const plot = await sbx.runCode(
    "import matplotlib.pyplot as plt\nplt.plot([1, 3, 2])\nplt.show()",
  );
  out.plotError = plot.error ? plot.error.name : null;
  out.png = plot.results.length ? plot.results[0].png : null;
  const failed = await sbx.runCode("1/0");
  out.error = failed.error ? failed.error.name : null;
  const ctx = await sbx.createCodeContext();
  await sbx.runCode("y = 'own'", { context: ctx });
  const own = await sbx.runCode("y", { context: ctx });
  out.contextValue = own.text;
  const other = await sbx.runCode("'y' in globals()");
  out.defaultSeesContext = other.text;
  out.listed = (await sbx.listCodeContexts()).some((c) => c.id === ctx.id);
  await sbx.removeCodeContext(ctx);
  out.removed = !(await sbx.listCodeContexts()).some((c) => c.id === ctx.id);
  console.log(JSON.stringify(out));
}

main().catch((e) => {
  console.error(e && e.stack ? e.stack : String(e));
  process.exit(1);
});
