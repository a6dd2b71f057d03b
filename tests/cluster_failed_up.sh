#!/usr/bin/env bash
# `scripts/dev cluster up` that fails part-way names the component with the last lines of its log,
# exits 1, and leaves nothing of the cluster (`cluster check`: no process, mount, interface,
# network namespace or iptables rule) and the sysctls as they were. The failure here: etcd's
# client port is taken, after containerd has started. Runs while no cluster is up (before the
# live tests' fixture starts it); exit 77 (skipped) if one is.
set -uo pipefail
cluster=$1
if ! "$cluster" check >/dev/null 2>&1; then echo "a cluster is up or left: not run"; exit 77; fi
port=$(sed -n 's/^ETCD_PORT=\([0-9]*\).*/\1/p' "$cluster")
forward=$(cat /proc/sys/net/ipv4/ip_forward)
python3 -c 'import socket, sys, time
s = socket.socket(); s.bind(("127.0.0.1", int(sys.argv[1]))); s.listen(); print("taken", flush=True); time.sleep(600)' \
  "$port" > "${TMPDIR:-/tmp}/failed-up-$$.taken" &
holder=$!
trap 'kill $holder 2>/dev/null; rm -f "${TMPDIR:-/tmp}/failed-up-$$.taken"' EXIT
for _ in $(seq 50); do grep -q taken "${TMPDIR:-/tmp}/failed-up-$$.taken" 2>/dev/null && break; sleep 0.1; done
grep -q taken "${TMPDIR:-/tmp}/failed-up-$$.taken" || { echo "could not take 127.0.0.1:$port"; exit 1; }
fail=0
out=$(timeout 240 "$cluster" up 2>&1); code=$?
echo "$out"
[ "$code" = 1 ] || { echo "FAIL: up exited $code, not 1"; fail=1; }
grep -q "etcd failed to start (it exited); the last lines of .*/logs/etcd.log:" <<<"$out" ||
  { echo "FAIL: up did not name etcd with its log"; fail=1; }
grep -q "address already in use" <<<"$out" || { echo "FAIL: etcd's own reason is not shown"; fail=1; }
"$cluster" check || { echo "FAIL: the failed up left the above"; fail=1; }
[ "$(cat /proc/sys/net/ipv4/ip_forward)" = "$forward" ] || { echo "FAIL: net.ipv4.ip_forward was not put back"; fail=1; }
exit $fail
