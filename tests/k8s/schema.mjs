// Validates YAML documents against a JSON Schema with ajv, independently of trainctl:
//   node schema.mjs SCHEMA.json FILE.yaml...
// Prints "FILE: valid" or "FILE: INVALID: /path message" per file; exits 1 if any is invalid.
import { readFileSync } from "node:fs";
import Ajv from "ajv";
import { parse } from "yaml";

const [schemaFile, ...files] = process.argv.slice(2);
const ajv = new Ajv({ strict: false, allErrors: true });
const validate = ajv.compile(JSON.parse(readFileSync(schemaFile, "utf8")));
let failed = 0;
for (const file of files) {
  const doc = parse(readFileSync(file, "utf8"));
  if (validate(doc)) {
    console.log(`${file}: valid`);
  } else {
    failed++;
    const e = validate.errors.slice(0, 4).map((x) => `${x.instancePath || "/"} ${x.message}` +
      (x.params?.additionalProperty ? ` (${x.params.additionalProperty})` : ""));
    console.log(`${file}: INVALID: ${e.join("; ")}`);
  }
}
process.exit(failed ? 1 : 0);
