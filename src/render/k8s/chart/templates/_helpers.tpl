{{/*
The job, resolved from the values (the job spec) the way trainctl resolves a spec, for the fields
that shape the Kubernetes objects. Every template starts from it:
  {{- $s := include "trainctl.view" . | fromJson }}
The objects mirror `trainctl render` (src/render/k8s/render.cc); tests compare the two object by
object for every example and workload format, so a change to one needs the same change here.
*/}}

{{/* A duration (30s, 1h30m, 250ms, or a number of seconds) in milliseconds. */}}
{{- define "trainctl.ms" -}}
{{- if or (kindIs "float64" .) (kindIs "int64" .) (kindIs "int" .) (regexMatch "^[0-9.]+$" (toString .)) -}}
{{- round (mulf (float64 .) 1000) 0 | int64 -}}
{{- else -}}
{{- $ms := 0.0 -}}
{{- $scale := dict "ms" 1.0 "s" 1000.0 "m" 60000.0 "h" 3600000.0 "d" 86400000.0 -}}
{{- range regexFindAll "[0-9.]+(ms|s|m|h|d)" (toString .) -1 -}}
{{- $num := regexFind "^[0-9.]+" . -}}
{{- $ms = addf $ms (mulf (float64 $num) (get $scale (trimPrefix $num .))) -}}
{{- end -}}
{{- round $ms 0 | int64 -}}
{{- end -}}
{{- end -}}

{{/* Milliseconds as trainctl writes a duration: 1h30m, 45s, 1.5s, 250ms. */}}
{{- define "trainctl.duration" -}}
{{- $ms := int64 . -}}
{{- if eq $ms 0 -}}0s
{{- else if lt $ms 1000 -}}{{ $ms }}ms
{{- else -}}
{{- $h := div $ms 3600000 }}{{ $m := mod (div $ms 60000) 60 }}{{ $sec := mod (div $ms 1000) 60 }}{{ $rest := mod $ms 1000 -}}
{{- if $h }}{{ $h }}h{{ end }}{{ if $m }}{{ $m }}m{{ end -}}
{{- if or $sec $rest }}{{ $sec }}{{ if $rest }}.{{ printf "%03d" $rest | trimSuffix "0" | trimSuffix "0" }}{{ end }}s{{ end -}}
{{- end -}}
{{- end -}}

{{/* A size (4Gi, 512Mi, 1G, or a number of bytes) in bytes. */}}
{{- define "trainctl.bytes" -}}
{{- if or (kindIs "float64" .) (kindIs "int64" .) (kindIs "int" .) -}}
{{- int64 . -}}
{{- else -}}
{{- $num := regexFind "^[0-9.]+" (toString .) -}}
{{- $scale := dict "" 1.0 "k" 1e3 "M" 1e6 "G" 1e9 "T" 1e12 "Ki" 1024.0 "Mi" 1048576.0 "Gi" 1073741824.0 "Ti" 1099511627776.0 -}}
{{- mulf (float64 $num) (get $scale (trimPrefix $num (toString .))) | floor | int64 -}}
{{- end -}}
{{- end -}}

{{/* Bytes as a Kubernetes quantity in the largest binary unit that divides them. */}}
{{- define "trainctl.quantity" -}}
{{- $b := int64 . }}{{ $unit := "" }}{{ $done := false -}}
{{- range list "Ki" "Mi" "Gi" "Ti" -}}
{{- if and (not $done) (eq (mod $b 1024) 0) }}{{ $b = div $b 1024 }}{{ $unit = . }}{{ else }}{{ $done = true }}{{ end -}}
{{- end -}}
{{ $b }}{{ $unit }}
{{- end -}}

{{/* CPUs (2, 0.5, 500m) as a count. */}}
{{- define "trainctl.cpus" -}}
{{- $t := toString . -}}
{{- if hasSuffix "m" $t }}{{ divf (float64 (trimSuffix "m" $t)) 1000 }}{{ else }}{{ float64 . }}{{ end -}}
{{- end -}}

{{/* A pod's requests and limits: .tasks tasks of the resources .r each (render's PodResources). */}}
{{- define "trainctl.resources" -}}
{{- $r := .r | default dict }}{{ $amounts := dict }}{{ $res := dict -}}
{{- if $r.cpus -}}
{{- $milli := round (mulf (include "trainctl.cpus" $r.cpus | float64) .tasks 1000) 0 | int64 -}}
{{- $_ := set $amounts "cpu" (ternary (printf "%d" (div $milli 1000)) (printf "%dm" $milli) (eq (mod $milli 1000) 0)) -}}
{{- end -}}
{{- if $r.memory -}}
{{- $_ := set $amounts "memory" (include "trainctl.quantity" (mul (include "trainctl.bytes" $r.memory | int64) .tasks)) -}}
{{- end -}}
{{- if $amounts }}{{ $_ := set $res "requests" $amounts }}{{ $_ := set $res "limits" (deepCopy $amounts) }}{{ end -}}
{{- if $r.gpus -}}
{{- $limits := $res.limits | default dict }}{{ $_ := set $limits "nvidia.com/gpu" (mul (int64 $r.gpus) .tasks) }}{{ $_ := set $res "limits" $limits -}}
{{- end -}}
{{- toJson $res -}}
{{- end -}}

{{/* The requests and limits of a pod that does not train: .cpus and .memory (render's SideResources). */}}
{{- define "trainctl.sideResources" -}}
{{- include "trainctl.resources" (dict "r" (dict "cpus" .cpus "memory" .memory) "tasks" 1) -}}
{{- end -}}

{{/* `path` under the shared volume's mount unless it is absolute (render's Under). */}}
{{- define "trainctl.under" -}}
{{- if not .path }}{{ .mount }}{{ else if hasPrefix "/" .path }}{{ .path }}{{ else }}{{ .mount }}/{{ .path }}{{ end -}}
{{- end -}}

{{- define "trainctl.view" -}}
{{- $v := .Values -}}
{{- $d := include "trainctl.defaults" . | fromJson -}}
{{- $name := required "name: the values (the job spec) have no name" $v.name | toString -}}
{{- $c := $v.cluster | default dict }}{{ $dc := $d.cluster -}}
{{- $st := $c.storage | default dict }}{{ $stage := $c.stage | default dict -}}
{{- if and $c.namespace (ne (toString $c.namespace) .Release.Namespace) -}}
{{- fail (printf "cluster.namespace: the spec says %s, and the release is installed in %s; install it with --namespace %s (or drop cluster.namespace: a chart's objects go to the release's namespace)" $c.namespace .Release.Namespace $c.namespace) -}}
{{- end -}}
{{- $s := dict "name" $name "namespace" .Release.Namespace "release" .Release.Name -}}
{{- $_ := set $s "chart" (printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_") -}}
{{- $_ := set $s "appVersion" .Chart.AppVersion -}}
{{- $_ := set $s "service" .Release.Service -}}
{{- $_ := set $s "image" (hasKey $c "image" | ternary $c.image $dc.image) -}}
{{- $_ := set $s "tensorboardImage" (hasKey $c "tensorboard_image" | ternary $c.tensorboard_image $dc.tensorboard_image) -}}
{{- $_ := set $s "tensorboard" (hasKey $c "tensorboard" | ternary $c.tensorboard $dc.tensorboard) -}}
{{- /* What the spec sets of them over trainctl's defaults, field by field (as trainctl reads it). */ -}}
{{- $_ := set $s "evalResources" (merge (deepCopy ($c.eval_resources | default dict)) $dc.eval_resources) -}}
{{- $_ := set $s "tensorboardResources" (merge (deepCopy ($c.tensorboard_resources | default dict)) $dc.tensorboard_resources) -}}
{{- $_ := set $s "podMonitor" (hasKey $c "pod_monitor" | ternary $c.pod_monitor $dc.pod_monitor) -}}
{{- $_ := set $s "metricsPort" (hasKey $c "metrics_port" | ternary $c.metrics_port $dc.metrics_port | int) -}}
{{- $_ := set $s "pullSecret" ($c.image_pull_secret | default "") -}}
{{- $_ := set $s "claim" ($st.claim | default "") -}}
{{- $_ := set $s "data" ($st.claim | default (printf "%s-data" $name)) -}}
{{- $_ := set $s "token" ($c.token_secret | default (printf "%s-token" $name)) -}}
{{- $_ := set $s "storageSize" (toString ($st.size | default $dc.storage.size)) -}}
{{- $_ := set $s "storageClass" ($st.class | default "") -}}
{{- $_ := set $s "mount" ($st.mount | default $dc.storage.mount) -}}
{{- $_ := set $s "stageUrl" ($stage.url | default "") -}}
{{- $_ := set $s "stageSha" ($stage.sha256 | default "") -}}
{{- $_ := set $s "stageCredentials" ($stage.credentials | default "") -}}
{{- $_ := set $s "nodeSelector" ($c.node_selector | default dict) -}}
{{- $tolerations := list -}}
{{- range $c.tolerations | default list -}}
{{- $tol := . }}{{ $t := dict "operator" (.operator | default "Equal") -}}
{{- range list "key" "value" "effect" }}{{ if get $tol . }}{{ $_ := set $t . (get $tol .) }}{{ end }}{{ end -}}
{{- $tolerations = append $tolerations $t -}}
{{- end -}}
{{- $_ := set $s "tolerations" $tolerations -}}
{{- $_ := set $s "rendezvous" ($v.rendezvous | default "") -}}
{{- $nodes := $v.nodes | default 1 }}{{ $min := 1 }}{{ $max := 1 -}}
{{- if kindIs "map" $nodes }}{{ $min = int $nodes.min }}{{ $max = int $nodes.max -}}
{{- else if contains ":" (toString $nodes) }}{{ $p := splitList ":" (toString $nodes) }}{{ $min = int (index $p 0) }}{{ $max = int (index $p 1) -}}
{{- else }}{{ $min = int $nodes }}{{ $max = $min }}{{ end -}}
{{- $procs := $v.procs_per_node | default $d.procs_per_node | int -}}
{{- $roles := list }}{{ $world := 0 -}}
{{- range $v.roles | default list -}}
{{- $replicas := hasKey . "replicas" | ternary .replicas 1 | int -}}
{{- $world = add $world $replicas -}}
{{- $roles = append $roles (dict "name" .name "replicas" $replicas "resources" (include "trainctl.resources" (dict "r" (hasKey . "resources" | ternary .resources $v.resources) "tasks" 1) | fromJson)) -}}
{{- end -}}
{{- $_ := set $s "roles" $roles -}}
{{- $_ := set $s "nodesMin" $min }}{{ $_ := set $s "nodesMax" $max }}{{ $_ := set $s "procs" $procs -}}
{{- $_ := set $s "elastic" (lt $min $max) -}}
{{- $_ := set $s "etcd" (and (not $v.rendezvous) (lt $min $max)) -}}
{{- $_ := set $s "resources" (include "trainctl.resources" (dict "r" $v.resources "tasks" $procs) | fromJson) -}}
{{- $restart := $v.restart | default dict -}}
{{- $_ := set $s "maxRestarts" (hasKey $restart "max_restarts" | ternary $restart.max_restarts $d.restart.max_restarts | int) -}}
{{- $timeouts := $v.timeouts | default dict -}}
{{- $jobMs := include "trainctl.ms" ($timeouts.job | default "0s") | int64 -}}
{{- $_ := set $s "jobMs" $jobMs -}}
{{- $_ := set $s "trainer" (hasKey $v "trainer") -}}
{{- /* The spec as the pods see it (render's PodSpec): directories under the shared volume. */ -}}
{{- $pod := deepCopy $v -}}
{{- if $roles }}{{ $_ := set $pod "nodes" $world }}{{ end -}}
{{- $out := $v.output_dir | default (printf "runs/%s" $name) -}}
{{- $_ := set $pod "output_dir" (include "trainctl.under" (dict "mount" $s.mount "path" $out)) -}}
{{- $_ := set $pod "checkpoint_dir" (include "trainctl.under" (dict "mount" $s.mount "path" ($v.checkpoint_dir | default (printf "%s/checkpoints" $out)))) -}}
{{- $_ := set $pod "working_dir" (include "trainctl.under" (dict "mount" $s.mount "path" ($v.working_dir | default ""))) -}}
{{- $_ := set $s "outputDir" $pod.output_dir -}}
{{- if $s.trainer -}}
{{- $trainer := $pod.trainer | default dict }}{{ $data := $trainer.data | default dict -}}
{{- if and $s.stageUrl (not $data.dir) }}{{ $_ := set $data "dir" (printf "%s/datasets/%s" $s.mount $name) -}}
{{- else if $data.dir }}{{ $_ := set $data "dir" (include "trainctl.under" (dict "mount" $s.mount "path" $data.dir)) }}{{ end -}}
{{- if $data }}{{ $_ := set $trainer "data" $data }}{{ end }}{{ $_ := set $pod "trainer" $trainer -}}
{{- $_ := set $s "dataDir" ($data.dir | default "") -}}
{{- end -}}
{{- $_ := set $s "specJson" (printf "%s\n" (toPrettyJson $pod)) -}}
{{- toJson $s -}}
{{- end -}}

{{/* The labels of the pods and of the selectors (render's Labels). .s: the view; .component. */}}
{{- define "trainctl.labels" -}}
{{- toJson (dict "app.kubernetes.io/name" "trainctl" "app.kubernetes.io/instance" .s.release "app.kubernetes.io/component" .component "trainctl.dev/job" .s.name) -}}
{{- end -}}

{{/* An object: render's Object(), with the labels Helm users expect on its metadata. */}}
{{- define "trainctl.object" -}}
{{- $labels := include "trainctl.labels" . | fromJson -}}
{{- $_ := set $labels "helm.sh/chart" .s.chart }}{{ $_ := set $labels "app.kubernetes.io/managed-by" .s.service -}}
{{- if .s.appVersion }}{{ $_ := set $labels "app.kubernetes.io/version" .s.appVersion }}{{ end -}}
{{- $o := dict "apiVersion" .api "kind" .kind "metadata" (dict "name" .name "namespace" .s.namespace "labels" $labels) -}}
{{- toJson (merge $o (.rest | default dict)) -}}
{{- end -}}

{{- define "trainctl.volumes" -}}
{{- $data := dict "name" "data" "persistentVolumeClaim" (dict "claimName" .s.data) -}}
{{- if .ro }}{{ $_ := set $data.persistentVolumeClaim "readOnly" true }}{{ end -}}
{{- toJson (list $data (dict "name" "spec" "configMap" (dict "name" (printf "%s-spec" .s.name))) (dict "name" "tmp" "emptyDir" dict) (dict "name" "shm" "emptyDir" (dict "medium" "Memory"))) -}}
{{- end -}}

{{- define "trainctl.mounts" -}}
{{- $data := dict "name" "data" "mountPath" .s.mount -}}
{{- if .ro }}{{ $_ := set $data "readOnly" true }}{{ end -}}
{{- toJson (list $data (dict "name" "spec" "mountPath" "/etc/trainctl" "readOnly" true) (dict "name" "tmp" "mountPath" "/tmp") (dict "name" "shm" "mountPath" "/dev/shm")) -}}
{{- end -}}

{{/* render's Container: .s, .name, .image, .command, .env, .ro (read-only data). */}}
{{- define "trainctl.container" -}}
{{- $c := dict "name" .name "image" .image "imagePullPolicy" "IfNotPresent" "command" .command "workingDir" .s.mount -}}
{{- $_ := set $c "env" (append (.env | default list) (dict "name" "HOME" "value" "/tmp")) -}}
{{- $_ := set $c "volumeMounts" (include "trainctl.mounts" . | fromJsonArray) -}}
{{- $_ := set $c "securityContext" (dict "allowPrivilegeEscalation" false "readOnlyRootFilesystem" true "runAsNonRoot" true "capabilities" (dict "drop" (list "ALL"))) -}}
{{- toJson $c -}}
{{- end -}}

{{/* render's PodTemplate: .s, .component, .containers, .init, .ro. */}}
{{- define "trainctl.podTemplate" -}}
{{- $spec := dict "serviceAccountName" .s.name "automountServiceAccountToken" false "enableServiceLinks" false "containers" .containers -}}
{{- $_ := set $spec "securityContext" (dict "runAsNonRoot" true "runAsUser" 1000 "runAsGroup" 1000 "fsGroup" 1000 "seccompProfile" (dict "type" "RuntimeDefault")) -}}
{{- $_ := set $spec "volumes" (include "trainctl.volumes" . | fromJsonArray) -}}
{{- if .init }}{{ $_ := set $spec "initContainers" .init }}{{ end -}}
{{- /* Only the pods that train get the node selector and tolerations (render's PodTemplate). */ -}}
{{- if and .s.nodeSelector (eq .component "worker") }}{{ $_ := set $spec "nodeSelector" .s.nodeSelector }}{{ end -}}
{{- if and .s.tolerations (eq .component "worker") }}{{ $_ := set $spec "tolerations" .s.tolerations }}{{ end -}}
{{- if .s.pullSecret }}{{ $_ := set $spec "imagePullSecrets" (list (dict "name" .s.pullSecret)) }}{{ end -}}
{{- toJson (dict "metadata" (dict "labels" (include "trainctl.labels" . | fromJson)) "spec" $spec) -}}
{{- end -}}

{{/* An init container waiting for .file on the shared volume for at most .ms (render's WaitFor). */}}
{{- define "trainctl.waitFor" -}}
{{- $tries := max 1 (div .ms 5000) -}}
{{- $script := printf "i=0\nuntil [ -e \"$WAIT_FILE\" ]; do\n  i=$((i+1))\n  if [ \"$i\" -gt %d ]; then\n    echo \"trainctl: gave up after %s waiting for %s ($WAIT_FILE)\" >&2\n    exit 1\n  fi\n  sleep 5\ndone\n" $tries (include "trainctl.duration" .ms) .what -}}
{{- include "trainctl.container" (dict "s" .s "name" (printf "wait-%s" .what) "image" .s.image "command" (list "sh" "-c" $script) "env" (list (dict "name" "WAIT_FILE" "value" .file)) "ro" true) -}}
{{- end -}}

{{/* The init containers of the training pods: wait for the staged dataset. */}}
{{- define "trainctl.init" -}}
{{- if .stageUrl -}}
{{- toJson (list (include "trainctl.waitFor" (dict "s" . "what" "dataset" "file" (printf "%s/.trainctl-staged" .dataDir) "ms" 3600000) | fromJson)) -}}
{{- else }}[]{{ end -}}
{{- end -}}

{{/* The store: the spec's rendezvous, the job's etcd, or the agent of .node0 (render's StoreUrl). */}}
{{- define "trainctl.store" -}}
{{- if .s.rendezvous }}{{ .s.rendezvous }}{{ else if .s.etcd }}etcd://{{ .s.name }}-etcd:2379{{ else }}tcp://{{ .node0 }}:29400{{ end -}}
{{- end -}}

{{/* The agent container (render's AgentContainer): .s, .name, .rank, .store, .uidLabel, .resources. */}}
{{- define "trainctl.agent" -}}
{{- $argv := list "trainctl" "agent" "--spec" "/etc/trainctl/job.json" "--run-id" "$(TRAINCTL_RUN_ID)" -}}
{{- $argv = concat $argv (list (contains ":" .rank | ternary "--task" "--node-rank") .rank "--host" "$(POD_IP)") -}}
{{- if hasPrefix "tcp://" .store }}{{ $argv = append $argv "--serve-store" }}{{ end -}}
{{- $argv = append $argv "--leave-on-signal" -}}
{{- if gt (int .s.metricsPort) 0 }}{{ $argv = concat $argv (list "--metrics-port" (toString (int .s.metricsPort))) }}{{ end -}}
{{- $env := list (dict "name" "POD_IP" "valueFrom" (dict "fieldRef" (dict "fieldPath" "status.podIP"))) -}}
{{- if .uidLabel -}}
{{- $env = append $env (dict "name" "JOB_UID" "valueFrom" (dict "fieldRef" (dict "fieldPath" (printf "metadata.labels['%s']" .uidLabel)))) -}}
{{- $env = append $env (dict "name" "TRAINCTL_RUN_ID" "value" (printf "%s-$(JOB_UID)" .s.name)) -}}
{{- else -}}
{{- $env = append $env (dict "name" "TRAINCTL_RUN_ID" "value" .s.name) -}}
{{- end -}}
{{- $env = append $env (dict "name" "TRAINCTL_AGENT_STORE" "value" .store) -}}
{{- $env = append $env (dict "name" "TRAINCTL_AGENT_TOKEN" "valueFrom" (dict "secretKeyRef" (dict "name" .s.token "key" "token"))) -}}
{{- $c := include "trainctl.container" (dict "s" .s "name" .name "image" .s.image "command" $argv "env" $env) | fromJson -}}
{{- $ports := list (dict "name" "store" "containerPort" 29400) -}}
{{- if gt (int .s.metricsPort) 0 }}{{ $ports = append $ports (dict "name" "metrics" "containerPort" (int .s.metricsPort)) }}{{ end -}}
{{- $_ := set $c "ports" $ports -}}
{{- $res := hasKey . "resources" | ternary .resources .s.resources -}}
{{- if $res }}{{ $_ := set $c "resources" $res }}{{ end -}}
{{- toJson $c -}}
{{- end -}}

{{/* An Indexed Job of .pods agents of the pod template .tmpl (render's AgentJob). */}}
{{- define "trainctl.agentJob" -}}
{{- $tmpl := .tmpl }}{{ $_ := set $tmpl.spec "subdomain" .s.name }}{{ $_ := set $tmpl.spec "restartPolicy" "Never" -}}
{{- $rules := list (dict "action" "FailJob" "onExitCodes" (dict "containerName" "trainctl" "operator" "In" "values" (list 2 3 4 5))) (dict "action" "Ignore" "onPodConditions" (list (dict "type" "DisruptionTarget" "status" "True"))) -}}
{{- $spec := dict "completionMode" "Indexed" "completions" .pods "parallelism" .pods "backoffLimit" .s.maxRestarts "podFailurePolicy" (dict "rules" $rules) "template" $tmpl -}}
{{- if gt (int64 .s.jobMs) 0 }}{{ $_ := set $spec "activeDeadlineSeconds" (max 1 (div (int64 .s.jobMs) 1000)) }}{{ end -}}
{{- include "trainctl.object" (dict "s" .s "api" "batch/v1" "kind" "Job" "name" .name "component" "worker" "rest" (dict "spec" $spec)) -}}
{{- end -}}

{{- define "trainctl.runPolicy" -}}
{{- $p := dict "cleanPodPolicy" "None" "backoffLimit" .backoff -}}
{{- if gt (int64 .s.jobMs) 0 }}{{ $_ := set $p "activeDeadlineSeconds" (max 1 (div (int64 .s.jobMs) 1000)) }}{{ end -}}
{{- toJson $p -}}
{{- end -}}

{{/* A Service in front of .component's pods (render's Service). */}}
{{- define "trainctl.service" -}}
{{- $spec := dict "selector" (dict "trainctl.dev/job" .s.name "app.kubernetes.io/component" .component) "ports" (list (dict "name" .portName "port" .port "targetPort" .port)) -}}
{{- include "trainctl.object" (dict "s" .s "api" "v1" "kind" "Service" "name" .name "component" .component "rest" (dict "spec" $spec)) -}}
{{- end -}}

{{/* host:port of the job's store as another pod of the job reaches it (empty: no stable name). */}}
{{- define "trainctl.storeAddress" -}}
{{- $s := .s -}}
{{- if $s.rendezvous -}}
{{- (splitList "," (regexReplaceAll "^[a-z]+://" $s.rendezvous "")) | first -}}
{{- else if $s.etcd }}{{ $s.name }}-etcd:2379
{{- else if eq .format "job" }}{{ $s.name }}-{{ if $s.roles }}{{ (first $s.roles).name }}-{{ end }}0.{{ $s.name }}:29400
{{- else if eq .format "pytorchjob" }}{{ $s.name }}-master-0:29400
{{- else if eq .format "tfjob" }}{{ $s.name }}-{{ if $s.roles }}{{ (first $s.roles).name }}{{ else }}worker{{ end }}-0:29400
{{- else if eq .format "trainjob" }}{{ $s.name }}-node-0-0.{{ $s.name }}:29400
{{- end -}}
{{- end -}}
