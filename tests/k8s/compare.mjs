// Compares two sets of Kubernetes objects (multi-document YAML files) by kind and name, field by
// field. Usage: node compare.mjs A.yaml B.yaml [--helm TRAINCTL]. Exits 1 and names what differs
// if they are not the same objects.
// --helm: B is `helm template` of trainctl's chart and A `trainctl render`: B's Helm labels
// (helm.sh/chart, app.kubernetes.io/managed-by and version) and resource-policy annotation are
// set aside, as are the objects only the chart has (the token Secret, `helm test` pods: listed);
// the ConfigMaps' job.json (the spec the pods read) must resolve, with TRAINCTL validate --print --fields-only,
// to the same job.
import { execFileSync } from "node:child_process";
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
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
const trainctl = process.argv[4] === "--helm" ? process.argv[5] : null;
if (trainctl) {
  const work = mkdtempSync(join(tmpdir(), "compare-"));
  const resolve = (text) => {
    writeFileSync(join(work, "job.json"), text);
    return execFileSync(trainctl, ["validate", join(work, "job.json"), "--print", "--fields-only"], { encoding: "utf8" });
  };
  for (const [key, o] of b) {
    const labels = o.metadata?.labels ?? {};
    for (const l of ["helm.sh/chart", "app.kubernetes.io/managed-by", "app.kubernetes.io/version"]) delete labels[l];
    const notes = o.metadata?.annotations;
    if (notes) {
      delete notes["helm.sh/resource-policy"];
      if (Object.keys(notes).length === 0) delete o.metadata.annotations;
    }
    if (!a.has(key) && (o.kind === "Secret" || o.metadata?.annotations?.["helm.sh/hook"])) {
      console.log(`${key}: the chart's own (${o.kind === "Secret" ? "the store token" : "helm.sh/hook " + o.metadata.annotations["helm.sh/hook"]})`);
      b.delete(key);
    }
    if (o.kind === "ConfigMap" && o.data?.["job.json"] && a.get(key)?.data?.["job.json"]) {
      o.data["job.json"] = resolve(o.data["job.json"]);
      a.get(key).data["job.json"] = resolve(a.get(key).data["job.json"]);
    }
  }
  rmSync(work, { recursive: true });
}
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
