"""A stand-in for a Kubernetes API server (none runs here: ../shared/PARTS.md), for Helm's
`lookup`: it answers discovery for the kinds trainctl's chart makes and GETs of the objects under
a directory (DIR/<namespace>/<resource>/<name>.json); everything else is 404. Only what
`helm template --dry-run=server --disable-openapi-validation` reads; it changes nothing.
Usage: python3 apiserver_standin.py DIR PORTFILE (writes the port it listens on to PORTFILE)."""
import http.server
import json
import os
import sys

KINDS = {  # group/version -> [(resource, kind, namespaced)]
    "v1": [("configmaps", "ConfigMap", True), ("secrets", "Secret", True), ("services", "Service", True),
           ("serviceaccounts", "ServiceAccount", True), ("persistentvolumeclaims", "PersistentVolumeClaim", True),
           ("pods", "Pod", True), ("namespaces", "Namespace", False)],
    "apps/v1": [("deployments", "Deployment", True), ("statefulsets", "StatefulSet", True)],
    "batch/v1": [("jobs", "Job", True)],
    "networking.k8s.io/v1": [("networkpolicies", "NetworkPolicy", True)],
    "rbac.authorization.k8s.io/v1": [("roles", "Role", True)],
    "kubeflow.org/v1": [("pytorchjobs", "PyTorchJob", True), ("tfjobs", "TFJob", True)],
    "kubeflow.org/v2beta1": [("mpijobs", "MPIJob", True)],
    "trainer.kubeflow.org/v1alpha1": [("trainjobs", "TrainJob", True)],
    "monitoring.coreos.com/v1": [("podmonitors", "PodMonitor", True)],
}


def resources(gv):
    return {"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": gv,
            "resources": [{"name": r, "singularName": k.lower(), "namespaced": ns, "kind": k,
                           "verbs": ["get", "list"]} for r, k, ns in KINDS[gv]]}


def groups():
    by_group = {}
    for gv in KINDS:
        if "/" in gv:
            g, v = gv.split("/")
            by_group.setdefault(g, []).append({"groupVersion": gv, "version": v})
    return {"kind": "APIGroupList", "apiVersion": "v1",
            "groups": [{"name": g, "versions": vs, "preferredVersion": vs[0]} for g, vs in by_group.items()]}


class Handler(http.server.BaseHTTPRequestHandler):
    def reply(self, code, body):
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self):
        path = self.path.split("?")[0].rstrip("/")
        parts = path.strip("/").split("/")
        if path == "/version":
            return self.reply(200, {"major": "1", "minor": "31", "gitVersion": "v1.31.0"})
        if path == "/api":
            return self.reply(200, {"kind": "APIVersions", "versions": ["v1"]})
        if path == "/apis":
            return self.reply(200, groups())
        gv = "v1" if parts[0] == "api" and len(parts) >= 2 else "/".join(parts[1:3])
        rest = parts[2:] if parts[0] == "api" else parts[3:]
        if gv in KINDS and not rest:
            return self.reply(200, resources(gv))
        if gv in KINDS and len(rest) == 4 and rest[0] == "namespaces":
            file = os.path.join(sys.argv[1], rest[1], rest[2], rest[3] + ".json")
            if os.path.isfile(file):
                with open(file) as f:
                    return self.reply(200, json.load(f))
        self.reply(404, {"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "NotFound", "code": 404})

    def log_message(self, *args):
        pass


server = http.server.HTTPServer(("127.0.0.1", 0), Handler)
with open(sys.argv[2] + ".part", "w") as f:
    f.write(str(server.server_address[1]))
os.rename(sys.argv[2] + ".part", sys.argv[2])
server.serve_forever()
