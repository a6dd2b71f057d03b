#!/usr/bin/python3
"""trainctl's example job against the seeds' own recipe, side by side on the same live cluster
(scripts/dev cluster up; issue 72, part 4).

The peer is what the Kubeflow/TorchElastic tutorials run: an Indexed Job of two pods, each running
`torchrun` (c10d rendezvous on pod 0, 2 workers, --max-restarts 3) with bench/ddp_fashion_mnist.py,
PyTorch DDP on gloo, in trainctl:latest plus Debian's PyTorch. Both sides: 2 pods x 2 workers, 0.9
CPU per pod, one thread per worker, the same CNN, batch 64 per worker, SGD lr 0.05 momentum 0.9,
5 epochs of the real Fashion-MNIST. Per side, two runs, one after the other:
  undisturbed: submit to the first training step, and to the first epoch at >= 0.91 test accuracy;
  disturbed:   worker pod 1 deleted once epoch 2 has begun; the time to node 0's next step.
Times are the container runtime's log timestamps against this machine's clock (one clock).
  eval "$(scripts/dev cluster env)"; /usr/bin/python3 bench/k8s_side_by_side.py [trainctl] [torchrun]
"""
import datetime, json, os, re, subprocess, sys, tempfile, time

SRC = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TRAINCTL = os.environ.get("TRAINCTL", os.path.join(SRC, "build/src/trainctl"))
PEER_IMAGE = "docker.io/library/trainctl-ddp-peer:bench"


def sh(*argv, input=None, check=True):
    r = subprocess.run(argv, input=input, capture_output=True, text=True, timeout=300)
    if check and r.returncode != 0:
        sys.exit(f"{' '.join(argv)}: {r.stdout}{r.stderr}")
    return r.stdout


def kubectl(*args, **kw):
    return sh("kubectl", "--request-timeout=30s", *args, **kw)


def logs(ns, selector):
    """(seconds since the epoch, line) of every line of the pods selected, oldest first."""
    out = kubectl("logs", "-n", ns, "-l", selector, "--timestamps", "--tail=-1", check=False)
    lines = []
    for line in out.splitlines():
        stamp, _, text = line.partition(" ")
        try:
            t = datetime.datetime.fromisoformat(stamp[:26].rstrip("Z")).replace(tzinfo=datetime.timezone.utc)
        except ValueError:
            continue
        lines.append((t.timestamp(), text))
    return sorted(lines)


def wait(what, check, limit=900):
    deadline = time.time() + limit
    while time.time() < deadline:
        got = check()
        if got is not None:
            return got
        time.sleep(0.5)
    sys.exit(f"timed out waiting for {what}")


def namespace(name):
    kubectl("delete", "namespace", name, "--ignore-not-found", "--wait=true")
    kubectl("create", "namespace", name)
    kubectl("label", "namespace", name, "pod-security.kubernetes.io/enforce=restricted")


# --- trainctl --------------------------------------------------------------------------------
TRAINCTL_SETS = ["--set", "resources.cpus=0.45", "--set", "cluster.eval_resources.cpus=0.1",
                 "--set", "cluster.eval_resources.memory=1Gi", "--set", "cluster.tensorboard=false",
                 "--set", "trainer.log_every=1"]
STEP = re.compile(r"^\[worker-0\] epoch \d/5 \[")


def trainctl_side(ns, disturb):
    namespace(ns)
    spec = [os.path.join(SRC, "examples/k8s/base.yaml"), "--set", f"cluster.namespace={ns}"] + TRAINCTL_SETS
    t0 = time.time()
    sh(TRAINCTL, "submit", *spec)
    node0 = "trainctl.dev/job=fashion-mnist,batch.kubernetes.io/job-completion-index=0"
    result = {}
    first = wait("trainctl's first step", lambda: next((t for t, l in logs(ns, node0) if STEP.match(l)), None))
    result["submit_to_first_step_s"] = first - t0
    if disturb:
        wait("epoch 2", lambda: next((t for t, l in logs(ns, node0) if l.startswith("[worker-0] epoch 2/5 [")), None))
        kubectl("delete", "pod", "-n", ns, "--wait=false", "-l",
                "trainctl.dev/job=fashion-mnist,batch.kubernetes.io/job-completion-index=1")
        deleted = time.time()

        def again():
            seen = logs(ns, node0)
            restart = next((i for i, (t, l) in enumerate(seen) if "restart=1]" in l), None)
            if restart is None:
                return None
            return next((t for t, l in seen[restart:] if STEP.match(l)), None)
        result["deleted_to_training_again_s"] = wait("trainctl's restart", again) - deleted
    else:
        acc = re.compile(r"^\[worker-0\] epoch (\d)/5: test accuracy ([0-9.]+)")

        def reached():
            for t, l in logs(ns, node0):
                m = acc.match(l)
                if m and float(m.group(2)) >= 0.91:
                    return t, int(m.group(1)), float(m.group(2))
            return None
        t, epoch, value = wait("trainctl at 0.91", reached)
        result.update({"time_to_0.91_s": t - t0, "epoch_at_0.91": epoch, "accuracy": value})
    sh(TRAINCTL, "delete", *spec, "--data")
    return result


# --- the peer: torchrun pods -------------------------------------------------------------------
def peer_image():
    with tempfile.TemporaryDirectory() as ctx:
        sh("cp", os.path.join(SRC, "bench/ddp_fashion_mnist.py"), ctx)
        with open(os.path.join(ctx, "Containerfile"), "w") as f:
            f.write("FROM docker.io/library/trainctl:latest\nUSER 0:0\n"
                    "RUN apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "
                    "--no-install-recommends python3 python3-torch python3-numpy && rm -rf /var/lib/apt/lists/*\n"
                    "COPY ddp_fashion_mnist.py /opt/bench/\nUSER 1000:1000\n")
        hard = sh("sh", "-c", "ulimit -Hn").strip()
        sh("podman", "build", "-q", "--network", "host", "--ulimit", f"nofile={hard}:{hard}",
           "--ulimit", "nproc=4096:4096", "-t", PEER_IMAGE, ctx)
    sh(os.path.join(SRC, "scripts/cluster/cluster"), "load", PEER_IMAGE)


def peer_objects(ns):
    labels = {"app": "ddp-peer"}
    cpu = {"cpu": "900m", "memory": "4Gi"}
    container = {
        "name": "torchrun", "image": PEER_IMAGE, "imagePullPolicy": "IfNotPresent",
        # The endpoint is pod 0's FQDN: torchrun's c10d backend hosts the store on the pod whose
        # host name or FQDN it matches. torchrun's underscore spellings: the only ones of Debian's torch 1.13, still taken by 2.x;
        # its --redirects and --tee given, which it needs under Python 3.11
        "command": ["python3", "-m", "torch.distributed.run", "--nnodes", "2", "--nproc_per_node", "2",
                    "--rdzv_backend", "c10d", "--rdzv_endpoint", f"peer-0.peer.{ns}.svc.cluster.local:29500", "--rdzv_id", "bench",
                    "--max_restarts", "3", "--redirects", "1", "--tee", "1", "/opt/bench/ddp_fashion_mnist.py", "--epochs", "5", "--first-step"],
        "env": [{"name": "OMP_NUM_THREADS", "value": "1"}],
        "resources": {"requests": cpu, "limits": cpu},
        "securityContext": {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}},
    }
    pod = {"metadata": {"labels": labels},
           "spec": {"subdomain": "peer", "restartPolicy": "Never", "containers": [container],
                    "securityContext": {"runAsNonRoot": True, "runAsUser": 1000,
                                        "seccompProfile": {"type": "RuntimeDefault"}}}}
    service = {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "peer", "namespace": ns},
               "spec": {"clusterIP": "None", "publishNotReadyAddresses": True, "selector": labels,
                        "ports": [{"name": "rdzv", "port": 29500}]}}
    job = {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "peer", "namespace": ns},
           "spec": {"completionMode": "Indexed", "completions": 2, "parallelism": 2, "backoffLimit": 3,
                    "template": pod}}
    return json.dumps({"apiVersion": "v1", "kind": "List", "items": [service, job]})


def peer_side(ns, disturb):
    namespace(ns)
    t0 = time.time()
    kubectl("apply", "-f", "-", input=peer_objects(ns))
    node0 = "app=ddp-peer,batch.kubernetes.io/job-completion-index=0"

    def records():
        out = []
        for t, l in logs(ns, node0):
            if l.startswith("{"):
                try:
                    out.append((t, json.loads(l)))
                except ValueError:
                    pass
        return out
    first = wait("the peer's first step", lambda: next((t for t, r in records() if "first_step" in r), None))
    result = {"submit_to_first_step_s": first - t0}
    if disturb:
        wait("epoch 1's end", lambda: next((t for t, r in records() if r.get("epoch") == 1), None))
        kubectl("delete", "pod", "-n", ns, "--wait=false", "-l", "app=ddp-peer,batch.kubernetes.io/job-completion-index=1")
        deleted = time.time()
        result["deleted_to_training_again_s"] = wait(
            "the peer's restart", lambda: next((t for t, r in records() if "first_step" in r and t > deleted), None)) - deleted
    else:
        hit = wait("the peer at 0.91", lambda: next(((t, r) for t, r in records() if r.get("test_accuracy", 0) >= 0.91), None))
        result.update({"time_to_0.91_s": hit[0] - t0, "epoch_at_0.91": hit[1]["epoch"], "accuracy": hit[1]["test_accuracy"]})
    kubectl("delete", "namespace", ns, "--wait=true")
    return result


def main():
    """Arguments: the sides to run (trainctl, torchrun); both by default."""
    wanted = sys.argv[1:] or ["trainctl", "torchrun"]
    if "torchrun" in wanted:
        peer_image()
    out = {}
    for name, side in (("trainctl", trainctl_side), ("torchrun DDP", peer_side)):
        if name.split()[0] not in wanted:
            continue
        for disturb in (False, True):
            key = f"{name}, {'a worker pod deleted' if disturb else 'undisturbed'}"
            out[key] = side("bench-" + name.split()[0].lower() + ("-d" if disturb else ""), disturb)
            print(json.dumps({key: out[key]}), flush=True)


if __name__ == "__main__":
    main()
