// Compares two sets of Kubernetes objects (multi-document YAML files) by kind and name, field by
// field. Usage: node compare.mjs A.yaml B.yaml. Exits 1 and names what differs if they are not
// the same objects.
import { readFileSync } from "node:fs";
import { parseAllDocuments } from "yaml";
import { isDeepStrictEqual } from "node:util";

function load(file) {
  const objects = new Map();
  for (const doc of parseAllDocuments(readFileSync(file, "utf8"))) {
    const o = doc.toJS();
    if (o === null) continue;
    objects.set(o.kind ? `${o.kind}/${o.metadata?.name}` : `an object without a kind: ${JSON.stringify(o)}`, o);
  }
  return objects;
}

function firstDifference(a, b, path = "") {
  if (isDeepStrictEqual(a, b)) return null;
  if (a && b && typeof a === "object" && typeof b === "object") {
    for (const k of new Set([...Object.keys(a), ...Object.keys(b)])) {
      const d = firstDifference(a[k], b[k], `${path}/${k}`);
      if (d) return d;
    }
  }
  return `${path}: ${JSON.stringify(a)} vs ${JSON.stringify(b)}`;
}

const [a, b] = [load(process.argv[2]), load(process.argv[3])];
let differ = 0;
for (const key of new Set([...a.keys(), ...b.keys()])) {
  if (!a.has(key) || !b.has(key)) {
    console.log(`${key}: only in ${a.has(key) ? process.argv[2] : process.argv[3]}`);
    differ++;
  } else if (!isDeepStrictEqual(a.get(key), b.get(key))) {
    console.log(`${key}: ${firstDifference(a.get(key), b.get(key))}`);
    differ++;
  }
}
console.log(differ ? `${differ} object(s) differ` : `the same ${a.size} objects`);
process.exit(differ ? 1 : 0);
