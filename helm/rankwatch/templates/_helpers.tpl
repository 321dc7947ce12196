{{/*
Named templates. "rankwatch.sidecar", "rankwatch.volumes", "rankwatch.trainerVolumeMounts"
and "rankwatch.podSecurity" are the public ones: include them in your own pod specs
(README.md, "Your own workload").
*/}}

{{- define "rankwatch.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "rankwatch.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{- define "rankwatch.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "rankwatch.selectorLabels" -}}
app.kubernetes.io/name: {{ include "rankwatch.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "rankwatch.labels" -}}
helm.sh/chart: {{ include "rankwatch.chart" . }}
{{ include "rankwatch.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- with .Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{/*
An image reference: global.imageRegistry (a mirror) replaces the registry the repository names
(or is put in front of a repository that names none); a digest pins it. Args: dict "root" $
"image" <image values>.
*/}}
{{- define "rankwatch.imageRef" -}}
{{- $img := .image }}
{{- $repo := $img.repository }}
{{- $reg := ((.root.Values.global | default dict).imageRegistry) | default "" }}
{{- if $reg }}
{{- $parts := splitList "/" $repo }}
{{- $first := first $parts }}
{{- if and (gt (len $parts) 1) (or (contains "." $first) (contains ":" $first) (eq $first "localhost")) }}
{{- $repo = join "/" (rest $parts) }}
{{- end }}
{{- $repo = printf "%s/%s" (trimSuffix "/" $reg) $repo }}
{{- end }}
{{- $ref := printf "%s:%s" $repo (toString ($img.tag | default .root.Chart.AppVersion)) }}
{{- with $img.digest }}
{{- $ref = printf "%s@%s" $ref . }}
{{- end }}
{{- $ref }}
{{- end }}

{{- define "rankwatch.image" -}}
{{- include "rankwatch.imageRef" (dict "root" . "image" .Values.image) }}
{{- end }}

{{/*
The port the agent listens on: agent.config.server.listen's when set (the probes, the
Services and the monitors follow it), else sidecar.port.
*/}}
{{- define "rankwatch.port" -}}
{{- $listen := toString ((((.Values.agent.config | default dict).server | default dict).listen) | default "") }}
{{- if $listen }}
{{- $port := regexFind "[0-9]+$" $listen }}
{{- if or (contains "${" $listen) (not $port) (eq (int $port) 0) }}
{{- fail (printf "agent.config.server.listen %q: the chart needs a fixed port there (probes, Services and monitors use it); or leave it unset and set sidecar.port" $listen) }}
{{- end }}
{{- $port }}
{{- else }}
{{- .Values.sidecar.port }}
{{- end }}
{{- end }}

{{/* What this release installs: the job's objects ("all" or "workload"), the shared ones ("all" or "shared"). */}}
{{- define "rankwatch.installsWorkload" -}}
{{- if ne .Values.scope "shared" }}true{{ end }}
{{- end }}
{{- define "rankwatch.installsShared" -}}
{{- if ne .Values.scope "workload" }}true{{ end }}
{{- end }}

{{/*
Chart values Helm would install as they are while they mean a variable: refused with the fix.
*/}}
{{- define "rankwatch.checkValues" -}}
{{- range $key := list "token" "metricsToken" }}
{{- with index $.Values.server $key }}
{{- if contains "${" (toString .) }}
{{- fail (printf "server.%s is %q: Helm does not expand ${VAR}, so the Secret would hold those characters. Pass the value itself (--set server.%s=\"$RANKWATCH_TOKEN\", double quotes), or name a Secret you made in server.existingSecret" $key (toString .) $key) }}
{{- end }}
{{- end }}
{{- end }}
{{- if and .Values.podMonitor.enabled .Values.serviceMonitor.enabled (include "rankwatch.installsWorkload" .) }}
{{- fail "podMonitor.enabled and serviceMonitor.enabled both scrape the same sidecars (every series twice, a duplicate-sample error for the rules): enable one" }}
{{- end }}
{{- include "rankwatch.checkMinimums" . }}
{{- end }}

{{/*
agent.config values the agent refuses below its minimum (logs.poll_interval: 1ms): refused at
install with the key named, not by a degraded sidecar. The minimums come from the agent's schema
(files/config-minimums.json, written by helm/gen_values_schema.py).
*/}}
{{- define "rankwatch.checkMinimums" -}}
{{- $spec := .Files.Get "files/config-minimums.json" | fromJson }}
{{- $cfg := .Values.agent.config | default dict }}
{{- range $spec.keys }}
{{- $v := $cfg }}
{{- $found := true }}
{{- range .path }}
{{- if and $found (kindIs "map" $v) (hasKey $v .) }}{{ $v = index $v . }}{{ else }}{{ $found = false }}{{ end }}
{{- end }}
{{- if and $found (not (kindIs "invalid" $v)) (not (kindIs "map" $v)) }}
{{- $text := toString $v | trim | lower }}
{{- if not (contains "${" $text) }}
{{- $units := index $spec.units .kind }}
{{- $total := 0.0 }}
{{- $ok := true }}
{{- if regexMatch "^[+]?[0-9]*[.]?[0-9]+([eE][-+]?[0-9]+)?$" $text }}
{{- $total = float64 $text }}
{{- else }}
{{- range regexFindAll "[0-9]*[.]?[0-9]+\\s*[a-zµ]*" $text -1 }}
{{- $num := regexFind "^[0-9]*[.]?[0-9]+" . }}
{{- $unit := trim (trimPrefix $num .) }}
{{- if hasKey $units $unit }}
{{- $total = addf $total (mulf (float64 $num) (index $units $unit)) }}
{{- else }}
{{- $ok = false }}
{{- end }}
{{- end }}
{{- end }}
{{- if and $ok (lt $total .min) (not (and .zero_off (eq $total 0.0))) }}
{{- fail (printf "agent.config.%s: %s is below the agent's minimum %s%s (the agent would refuse it and the sidecar run degraded)" (join "." .path) (toString $v) .shown (ternary " or 0 (off)" "" .zero_off)) }}
{{- end }}
{{- end }}
{{- end }}
{{- end }}
{{- end }}

{{- define "rankwatch.runName" -}}
{{- .Values.agent.runName | default (include "rankwatch.fullname" .) }}
{{- end }}

{{- define "rankwatch.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- .Values.serviceAccount.name | default (include "rankwatch.fullname" .) }}
{{- else }}
{{- .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{- define "rankwatch.slackSecretName" -}}
{{- .Values.slack.existingSecret | default (printf "%s-slack" (include "rankwatch.fullname" .)) }}
{{- end }}

{{/* The Secret with the API and /metrics tokens; empty when there is none. */}}
{{- define "rankwatch.serverSecretName" -}}
{{- if .Values.server.existingSecret }}
{{- .Values.server.existingSecret }}
{{- else if or .Values.server.token .Values.server.metricsToken }}
{{- printf "%s-server" (include "rankwatch.fullname" .) }}
{{- end }}
{{- end }}

{{/* Key of the /api/* token in that Secret; empty: no token. */}}
{{- define "rankwatch.apiTokenKey" -}}
{{- if .Values.server.existingSecret }}
{{- .Values.server.tokenKey }}
{{- else if .Values.server.token }}
{{- print "token" }}
{{- end }}
{{- end }}

{{/* Key of the /metrics token in that Secret; empty: /metrics is open. */}}
{{- define "rankwatch.metricsTokenKey" -}}
{{- if .Values.server.existingSecret }}
{{- .Values.server.metricsTokenKey }}
{{- else if .Values.server.metricsToken }}
{{- print "metrics-token" }}
{{- end }}
{{- end }}

{{/* Pod selector of the PodMonitor: podMonitor.selector, else the chart's selector labels. */}}
{{- define "rankwatch.podMonitorSelector" -}}
{{- if .Values.podMonitor.selector }}
{{- toYaml .Values.podMonitor.selector }}
{{- else }}
matchLabels:
  {{- include "rankwatch.selectorLabels" . | nindent 2 }}
{{- end }}
{{- end }}

{{/* Bearer authorization for a PodMonitor/ServiceMonitor endpoint when /metrics has a token. */}}
{{- define "rankwatch.scrapeAuthorization" -}}
{{- $key := include "rankwatch.metricsTokenKey" . }}
{{- if $key }}
authorization:
  type: Bearer
  credentials:
    name: {{ include "rankwatch.serverSecretName" . }}
    key: {{ $key }}
{{- end }}
{{- end }}

{{/*
A ${VAR} the agent config reads for a token must reach the sidecar, or the agent cannot start:
fail the install instead, naming the fix.
*/}}
{{- define "rankwatch.checkTokenRefs" -}}
{{- $server := (.Values.agent.config | default dict).server | default dict }}
{{- $given := list }}
{{- if include "rankwatch.apiTokenKey" . }}{{ $given = append $given "RANKWATCH_TOKEN" }}{{ end }}
{{- if include "rankwatch.metricsTokenKey" . }}{{ $given = append $given "RANKWATCH_METRICS_TOKEN" }}{{ end }}
{{- range .Values.sidecar.env }}{{ $given = append $given .name }}{{ end }}
{{- range $key := list "token" "metrics_token" }}
{{- with index $server $key }}
{{- $var := regexReplaceAll `^.*\$\{([A-Za-z_][A-Za-z0-9_]*).*$` (toString .) "${1}" }}
{{- if and (not (contains ":-" (toString .))) (not (has $var $given)) }}
{{- fail (printf "agent.config.server.%s reads ${%s}, which the sidecar does not get: set server.existingSecret (the chart then passes RANKWATCH_TOKEN / RANKWATCH_METRICS_TOKEN from it), or add %s to sidecar.env" $key $var $var) }}
{{- end }}
{{- end }}
{{- end }}
{{- end }}

{{/* The agent's YAML config: chart-managed keys, then agent.config over them. */}}
{{- define "rankwatch.agentConfig" -}}
{{- $base := dict
  "run" (dict "name" (include "rankwatch.runName" .) "node" "${NODE_NAME:-}")
  "dumps" (dict "dir" (printf "%s/dumps" .Values.state.mountPath) "on_stall" .Values.stackDumps.enabled)
  "alerts" (dict "spool_dir" (printf "%s/spool" .Values.state.mountPath))
  "server" (dict "listen" (printf "0.0.0.0:%d" (int .Values.sidecar.port)))
-}}
{{- if .Values.slack.enabled }}
{{- $_ := set $base.alerts "slack" (dict "token" "${SLACK_BOT_TOKEN}" "channel" .Values.slack.channel) }}
{{- end }}
{{- if eq .Values.mode "daemonset" }}
{{- $sock := ternary "/var/lib/kubelet/pod-resources/kubelet.sock" "" .Values.daemonset.podResources.enabled }}
{{- $_ := set $base "kubernetes" (dict "enabled" true "opt_in_env" .Values.daemonset.optInEnv "namespaces" .Values.daemonset.namespaces "pod_resources_socket" $sock) }}
{{- end }}
{{- if include "rankwatch.apiTokenKey" . }}
{{- $_ := set $base.server "token" "${RANKWATCH_TOKEN}" }}
{{- end }}
{{- if include "rankwatch.metricsTokenKey" . }}
{{- $_ := set $base.server "metrics_token" "${RANKWATCH_METRICS_TOKEN}" }}
{{- end }}
{{- if eq .Values.mode "daemonset" }}
{{- /* a node agent watches every job on its node: each rank's run comes from its own environment */}}
{{- $_ := set $base "run" (dict "node" "${NODE_NAME:-}") }}
{{- end }}
{{- $cfg := mergeOverwrite $base (deepCopy (.Values.agent.config | default dict)) }}
{{- if not .Values.stackDumps.enabled }}
{{- $_ := set $cfg.dumps "on_stall" false }}
{{- end }}
{{- toYaml $cfg }}
{{- end }}

{{/* Container securityContext for the "restricted" Pod Security Standard. */}}
{{- define "rankwatch.restrictedSecurityContext" -}}
allowPrivilegeEscalation: false
capabilities:
  drop: ["ALL"]
runAsNonRoot: true
seccompProfile:
  type: RuntimeDefault
{{- end }}

{{/*
Pod-level fields: the shared process namespace and, without stack dumps, the restricted
pod securityContext. Include at the pod spec's indentation.
*/}}
{{- define "rankwatch.podSecurity" -}}
shareProcessNamespace: {{ .Values.shareProcessNamespace }}
{{- if not .Values.stackDumps.enabled }}
securityContext:
  runAsNonRoot: true
  seccompProfile:
    type: RuntimeDefault
{{- end }}
{{- end }}

{{/*
The sidecar container, a mapping: include it as an initContainers item with
`- {{ include "rankwatch.sidecar" . | nindent N }}`. restartPolicy: Always makes it a
native sidecar: it starts before the trainer and does not keep a Job from completing.
*/}}
{{- define "rankwatch.sidecar" -}}
name: {{ .Values.sidecar.name }}
image: {{ include "rankwatch.image" . | quote }}
imagePullPolicy: {{ .Values.image.pullPolicy }}
restartPolicy: Always
args:
  - watch
  - --config
  - /etc/rankwatch/rankwatch.yaml
  {{- if .Values.sidecar.failOpen }}
  - --fail-open
  {{- end }}
  - --match
  - {{ .Values.sidecar.match | quote }}
  {{- range .Values.sidecar.logs }}
  - --log
  - {{ . | quote }}
  {{- end }}
  {{- if .Values.checkpoints.enabled }}
  - --checkpoint-dir
  - {{ .Values.checkpoints.mountPath | quote }}
  {{- end }}
  {{- with .Values.sidecar.extraArgs }}
  {{- toYaml . | nindent 2 }}
  {{- end }}
env:
  {{- if .Values.sidecar.rankFromJobIndex }}
  - name: RANK
    valueFrom:
      fieldRef:
        fieldPath: metadata.annotations['batch.kubernetes.io/job-completion-index']
  - name: LOCAL_RANK
    value: "0"
  {{- end }}
  {{- if .Values.workload.enabled }}
  - name: WORLD_SIZE
    value: {{ .Values.workload.ranks | quote }}
  {{- end }}
  - name: NODE_NAME
    valueFrom:
      fieldRef:
        fieldPath: spec.nodeName
  {{- if .Values.slack.enabled }}
  - name: SLACK_BOT_TOKEN
    valueFrom:
      secretKeyRef:
        name: {{ include "rankwatch.slackSecretName" . }}
        key: {{ .Values.slack.secretKey }}
        # a missing Secret must not keep the pod (and the trainer) from starting
        optional: true
  {{- end }}
  {{- $secret := include "rankwatch.serverSecretName" . }}
  {{- with include "rankwatch.apiTokenKey" . }}
  - name: RANKWATCH_TOKEN
    valueFrom:
      secretKeyRef:
        name: {{ $secret }}
        key: {{ . }}
        optional: true
  {{- end }}
  {{- with include "rankwatch.metricsTokenKey" . }}
  - name: RANKWATCH_METRICS_TOKEN
    valueFrom:
      secretKeyRef:
        name: {{ $secret }}
        key: {{ . }}
        optional: true
  {{- end }}
  {{- with .Values.sidecar.nvidiaVisibleDevices }}
  - name: NVIDIA_VISIBLE_DEVICES
    value: {{ . | quote }}
  {{- end }}
  {{- with .Values.sidecar.env }}
  {{- toYaml . | nindent 2 }}
  {{- end }}
ports:
  - name: rankwatch
    containerPort: {{ include "rankwatch.port" . }}
    protocol: TCP
{{- with .Values.sidecar.startupProbe }}
{{- if .enabled }}
startupProbe:
  httpGet:
    path: /healthz
    port: rankwatch
  periodSeconds: {{ .periodSeconds }}
  failureThreshold: {{ .failureThreshold }}
{{- end }}
{{- end }}
{{- with .Values.sidecar.readinessProbe }}
{{- if .enabled }}
readinessProbe:
  httpGet:
    path: /readyz
    port: rankwatch
  periodSeconds: {{ .periodSeconds }}
  failureThreshold: {{ .failureThreshold }}
{{- end }}
{{- end }}
{{- if .Values.sidecar.livenessProbe.enabled }}
livenessProbe:
  httpGet:
    path: /healthz
    port: rankwatch
  periodSeconds: {{ .Values.sidecar.livenessProbe.periodSeconds }}
  failureThreshold: {{ .Values.sidecar.livenessProbe.failureThreshold }}
{{- end }}
{{- with .Values.sidecar.resources }}
resources:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- /*
py-spy in the image carries the file capability cap_sys_ptrace+ep; the kernel grants it to a
non-root user only when SYS_PTRACE is in the bounding set (added here) and no_new_privs is
unset (allowPrivilegeEscalation: true).
*/}}
{{- $sc := dict }}
{{- if .Values.stackDumps.enabled }}
{{- $sc = dict "allowPrivilegeEscalation" true "capabilities" (dict "drop" (list "ALL") "add" (list "SYS_PTRACE")) "runAsNonRoot" true "seccompProfile" (dict "type" "RuntimeDefault") }}
{{- else }}
{{- $sc = include "rankwatch.restrictedSecurityContext" . | fromYaml }}
{{- end }}
{{- $_ := set $sc "runAsUser" (int .Values.sidecar.runAsUser) }}
{{- $_ := set $sc "runAsGroup" (int .Values.sidecar.runAsGroup) }}
{{- $_ := set $sc "readOnlyRootFilesystem" true }}
securityContext:
  {{- mergeOverwrite $sc (deepCopy .Values.sidecar.securityContext) | toYaml | nindent 2 }}
volumeMounts:
  - name: rankwatch-logs
    mountPath: {{ .Values.logs.mountPath }}
    readOnly: true
  - name: rankwatch-config
    mountPath: /etc/rankwatch
    readOnly: true
  - name: rankwatch-state
    mountPath: {{ .Values.state.mountPath }}
  - name: rankwatch-tmp
    mountPath: /tmp
  {{- if .Values.checkpoints.enabled }}
  - name: rankwatch-checkpoints
    mountPath: {{ .Values.checkpoints.mountPath }}
    readOnly: true
  {{- end }}
{{- end }}

{{/* Volume mounts the training container needs: the shared logs and the checkpoints. */}}
{{- define "rankwatch.trainerVolumeMounts" -}}
- name: rankwatch-logs
  mountPath: {{ .Values.logs.mountPath }}
{{- if .Values.checkpoints.enabled }}
- name: rankwatch-checkpoints
  mountPath: {{ .Values.checkpoints.mountPath }}
{{- end }}
{{- end }}

{{/* The pod's volumes for the sidecar and the trainer (list items). */}}
{{- define "rankwatch.volumes" -}}
- name: rankwatch-logs
  emptyDir:
    sizeLimit: {{ .Values.logs.sizeLimit }}
- name: rankwatch-config
  configMap:
    name: {{ include "rankwatch.fullname" . }}-config
- name: rankwatch-state
  {{- if .Values.state.existingClaim }}
  persistentVolumeClaim:
    claimName: {{ .Values.state.existingClaim }}
  {{- else }}
  emptyDir: {}
  {{- end }}
- name: rankwatch-tmp
  emptyDir:
    sizeLimit: 256Mi
{{- if .Values.checkpoints.enabled }}
- name: rankwatch-checkpoints
  {{- with .Values.checkpoints.volume }}
  {{- toYaml . | nindent 2 }}
  {{- else }}
  emptyDir: {}
  {{- end }}
{{- end }}
{{- end }}

{{/*
namespaceSelector of a monitor: the configured one, else — when the monitor lives in another
namespace than the release (monitor.namespace) — the release's namespace, where the pods are.
*/}}
{{- define "rankwatch.namespaceSelector" -}}
{{- $m := .monitor }}
{{- if $m.namespaceSelector }}
namespaceSelector:
  {{- toYaml $m.namespaceSelector | nindent 2 }}
{{- else if and $m.namespace (ne $m.namespace .root.Release.Namespace) }}
namespaceSelector:
  matchNames:
    - {{ .root.Release.Namespace }}
{{- end }}
{{- end }}
