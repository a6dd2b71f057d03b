// Validates Kubernetes manifests against the OpenAPI schema that the kubernetes-models package
// ships. Usage: node validate.mjs FILE.yaml... (multi-document YAML). Prints one line per object;
// exits 1 if any object is invalid or of a kind it cannot check.
//
// Kubeflow's kinds (PyTorchJob) have no schema here: their pod templates, which is what the
// operator hands to Kubernetes, are checked as core PodTemplates.
import { readFileSync } from "node:fs";
import { parseAllDocuments } from "yaml";

async function modelClass(apiVersion, kind) {
  const path = apiVersion.includes("/") ? apiVersion : `v1`;
  try {
    const mod = await import(`kubernetes-models/${path}/${kind}`);
    return mod[kind] ?? mod.default;
  } catch {
    return undefined;
  }
}

async function check(obj, label) {
  const cls = await modelClass(obj.apiVersion, obj.kind);
  if (!cls) throw new Error(`no schema for ${obj.apiVersion} ${obj.kind}`);
  new cls(obj).validate();
  return label;
}

let failed = 0;
for (const file of process.argv.slice(2)) {
  for (const doc of parseAllDocuments(readFileSync(file, "utf8"))) {
    if (doc.errors.length) {
      console.log(`${file}: YAML error: ${doc.errors[0].message}`);
      failed++;
      continue;
    }
    const obj = doc.toJS();
    if (obj === null) continue;
    const name = `${obj.kind}/${obj.metadata?.name}`;
    try {
      if (obj.apiVersion === "kubeflow.org/v1" && obj.kind === "PyTorchJob") {
        for (const [type, spec] of Object.entries(obj.spec.pytorchReplicaSpecs)) {
          await check({ apiVersion: "v1", kind: "PodTemplate", metadata: { name: `${obj.metadata.name}-${type}` },
                        template: spec.template }, "");
        }
      } else {
        await check(obj, name);
      }
      console.log(`${file}: ${name}: valid`);
    } catch (e) {
      console.log(`${file}: ${name}: INVALID: ${e.message}`);
      failed++;
    }
  }
}
process.exit(failed ? 1 : 0);
