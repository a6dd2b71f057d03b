// Validates Kubernetes manifests against the OpenAPI schema that the kubernetes-models package
// ships (@kubernetes-models/prometheus-operator for the PodMonitor, @kubernetes-models/argo-workflows
// for bench's Workflow), and custom resources (PyTorchJob, TFJob, MPIJob, TrainJob) against the upstream
// Kubeflow CRDs in crds/. Usage: node validate.mjs FILE.yaml... (multi-document YAML). Prints one
// line per object; exits 1 if any object is invalid or of a kind it cannot check.
//
// A CRD's openAPIV3Schema is what an API server checks a custom resource against; with strict
// field validation (kubectl's default since 1.27) an unknown field is an error, so objects with
// declared properties take no others here unless the schema preserves unknown fields. Pod
// templates inside Kubeflow kinds are also checked as core PodTemplates.
import { readFileSync, readdirSync } from "node:fs";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";
import Ajv from "ajv";
import { parse, parseAllDocuments } from "yaml";

// A CRD's structural schema as a JSON Schema: int-or-string, no unknown fields.
function jsonSchema(s) {
  if (Array.isArray(s)) return s.map(jsonSchema);
  if (!s || typeof s !== "object") return s;
  const out = {};
  for (const [k, v] of Object.entries(s)) {
    if (k.startsWith("x-kubernetes-")) continue;
    if (k === "properties") {
      out.properties = Object.fromEntries(Object.entries(v).map(([name, p]) => [name, jsonSchema(p)]));
    } else if (["items", "additionalProperties", "not"].includes(k)) {
      out[k] = jsonSchema(v);
    } else if (["allOf", "anyOf", "oneOf"].includes(k)) {
      out[k] = v.map(jsonSchema);
    } else {
      out[k] = v;
    }
  }
  if (s["x-kubernetes-int-or-string"]) {
    delete out.type;
    out.anyOf = [{ type: "integer" }, { type: "string" }];
  }
  if (s.properties && s.additionalProperties === undefined && !s["x-kubernetes-preserve-unknown-fields"]) {
    out.additionalProperties = false;
  }
  return out;
}

// "group/version Kind" -> a validate function, from every CRD file in crds/ and in crds/fetched/
// (those scripts/dev deps takes from an operator's Go module: Kubeflow Trainer's TrainJob).
const crds = new Map();
const ajv = new Ajv({ strict: false, allErrors: true, validateFormats: false });
const crdDir = join(dirname(fileURLToPath(import.meta.url)), "crds");
const crdFiles = (dir) => readdirSync(dir).filter((f) => f.endsWith(".yaml")).map((f) => join(dir, f));
for (const file of [...crdFiles(crdDir), ...crdFiles(join(crdDir, "fetched"))]) {
  const crd = parse(readFileSync(file, "utf8"));
  for (const version of crd.spec.versions) {
    const key = `${crd.spec.group}/${version.name} ${crd.spec.names.kind}`;
    crds.set(key, ajv.compile(jsonSchema(version.schema.openAPIV3Schema)));
  }
}

function checkCustom(obj) {
  const validate = crds.get(`${obj.apiVersion} ${obj.kind}`);
  if (!validate) return false;
  if (!validate(obj)) {
    const e = validate.errors.slice(0, 5).map((x) => `${x.instancePath || "/"} ${x.message}` +
      (x.params?.additionalProperty ? ` (${x.params.additionalProperty})` : ""));
    throw new Error(`against the ${obj.kind} CRD: ${e.join("; ")}`);
  }
  return true;
}

// The pod templates a Kubeflow kind hands to Kubernetes.
function replicaTemplates(obj) {
  const specs = obj.spec?.pytorchReplicaSpecs ?? obj.spec?.tfReplicaSpecs ?? obj.spec?.mpiReplicaSpecs ?? {};
  return Object.entries(specs).map(([type, r]) => [type, r.template]);
}

async function modelClass(apiVersion, kind) {
  const path = apiVersion.includes("/") ? apiVersion : `v1`;
  // The Prometheus Operator's kinds (PodMonitor) come with their own package.
  const pkg = path.startsWith("monitoring.coreos.com/") ? "@kubernetes-models/prometheus-operator"
    : path.startsWith("argoproj.io/") ? "@kubernetes-models/argo-workflows" : "kubernetes-models";
  try {
    const mod = await import(`${pkg}/${path}/${kind}`);
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
      if (checkCustom(obj)) {
        for (const [type, template] of replicaTemplates(obj)) {
          await check({ apiVersion: "v1", kind: "PodTemplate", metadata: { name: `${obj.metadata.name}-${type}` },
                        template }, "");
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
