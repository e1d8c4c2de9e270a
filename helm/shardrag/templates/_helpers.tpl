{{/* Names and labels: every template takes them from here. */}}

{{- define "shardrag.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "shardrag.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 40 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 40 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 40 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* A component's object name: <fullname>-<component>. */}}
{{- define "shardrag.componentName" -}}
{{- printf "%s-%s" (include "shardrag.fullname" .root) .component | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "shardrag.shardName" -}}
{{- printf "%s-shard-%d" (include "shardrag.fullname" .root) (int .shard) -}}
{{- end -}}

{{- define "shardrag.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "shardrag.labels" -}}
helm.sh/chart: {{ include "shardrag.chart" . }}
app.kubernetes.io/name: {{ include "shardrag.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: shardrag
{{- end -}}

{{/* Selector labels of one component ({root, component[, shard]}). */}}
{{- define "shardrag.selectorLabels" -}}
app.kubernetes.io/name: {{ include "shardrag.name" .root }}
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- if hasKey . "shard" }}
shardrag.io/shard: {{ .shard | quote }}
{{- end }}
{{- end -}}

{{- define "shardrag.componentLabels" -}}
{{ include "shardrag.labels" .root }}
{{ include "shardrag.selectorLabels" . }}
{{- end -}}

{{/* The image: the CUDA variant when gpu.enabled. */}}
{{- define "shardrag.image" -}}
{{- $tag := default .Chart.AppVersion .Values.image.tag -}}
{{- if .Values.gpu.enabled -}}
{{- printf "%s:%s%s" .Values.image.repository $tag .Values.image.cudaSuffix -}}
{{- else -}}
{{- printf "%s:%s" .Values.image.repository $tag -}}
{{- end -}}
{{- end -}}

{{/* In-cluster URL of replica r of shard i (StatefulSet pod DNS through the headless Service). */}}
{{- define "shardrag.shardReplicaURL" -}}
{{- $name := include "shardrag.shardName" (dict "root" .root "shard" .shard) -}}
{{- printf "%s://%s-%d.%s.%s.svc.%s:%d" (include "shardrag.scheme" .root) $name (int .replica) $name .root.Release.Namespace .root.Values.clusterDomain (int .root.Values.shards.port) -}}
{{- end -}}

{{/* Whether the node StatefulSet renders: it hosts the launched collection (layout nodes) or the
     collections created at run time (nodes.enabled). */}}
{{- define "shardrag.nodesOn" -}}
{{- if or (eq .Values.layout "nodes") .Values.nodes.enabled }}true{{ end -}}
{{- end -}}

{{/* Node pods: in the nodes layout at least the replication factor (a shard's replicas go to
     distinct nodes). */}}
{{- define "shardrag.nodeCount" -}}
{{- if eq .Values.layout "nodes" -}}
{{- max (int .Values.nodes.replicas) (int .Values.shards.replicas) -}}
{{- else -}}
{{- int .Values.nodes.replicas -}}
{{- end -}}
{{- end -}}

{{/* A replica of the launched collection in the nodes layout: replica r of shard i is on node
     (i + r) mod N (index_shards.placement), at <node URL>/c/<collection>/<i>. */}}
{{- define "shardrag.nodeReplicaURL" -}}
{{- $name := include "shardrag.componentName" (dict "root" .root "component" "node") -}}
{{- $node := mod (add (int .shard) (int .replica)) (int (include "shardrag.nodeCount" .root)) -}}
{{- printf "%s://%s-%d.%s.%s.svc.%s:%d/c/%s/%d" (include "shardrag.scheme" .root) $name (int $node) $name .root.Release.Namespace .root.Values.clusterDomain (int .root.Values.nodes.port) .root.Values.collection.name (int .shard) -}}
{{- end -}}

{{- define "shardrag.kvNodeURLs" -}}
{{- $name := include "shardrag.componentName" (dict "root" . "component" "kv") -}}
{{- $urls := list -}}
{{- range $i := until (int .Values.kvCache.replicas) -}}
{{- $urls = append $urls (printf "%s://%s-%d.%s.%s.svc.%s:%d" (include "shardrag.scheme" $) $name $i $name $.Release.Namespace $.Values.clusterDomain (int $.Values.kvCache.port)) -}}
{{- end -}}
{{- join "," $urls -}}
{{- end -}}

{{/* PDB of a shard: never evict the last replica; at most shards.pdb.maxUnavailable at once. */}}
{{- define "shardrag.shardMinAvailable" -}}
{{- $replicas := int .Values.shards.replicas -}}
{{- $min := sub $replicas (int .Values.shards.pdb.maxUnavailable) -}}
{{- if lt $min 1 }}1{{ else }}{{ $min }}{{ end -}}
{{- end -}}

{{- define "shardrag.podSecurityContext" -}}
runAsNonRoot: true
runAsUser: 10001
runAsGroup: 10001
fsGroup: 10001
seccompProfile:
  type: RuntimeDefault
{{- end -}}

{{- define "shardrag.containerSecurityContext" -}}
allowPrivilegeEscalation: false
readOnlyRootFilesystem: true
capabilities:
  drop: ["ALL"]
{{- end -}}

{{/* GPU scheduling for pods that use one (shards, generators, training) when gpu.enabled. */}}
{{- define "shardrag.gpuScheduling" -}}
{{- if .Values.gpu.enabled }}
{{- with .Values.gpu.nodeSelector }}
nodeSelector:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .Values.gpu.tolerations }}
tolerations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end }}
{{- end -}}

{{- define "shardrag.gpuResources" -}}
{{- $resources := deepCopy (default dict .resources) -}}
{{- if .root.Values.gpu.enabled -}}
{{- $limits := default dict (get $resources "limits") -}}
{{- $_ := set $limits .root.Values.gpu.resourceName (int .root.Values.gpu.count) -}}
{{- $_ := set $resources "limits" $limits -}}
{{- end -}}
{{- toYaml $resources -}}
{{- end -}}

{{/* http, or https when tls.enabled (every process serves TLS and verifies the others). */}}
{{- define "shardrag.scheme" -}}
{{- ternary "https" "http" .Values.tls.enabled -}}
{{- end -}}

{{- define "shardrag.tlsVolumeMount" -}}
{{- if .Values.tls.enabled }}
- {name: tls, mountPath: /etc/shardrag/tls, readOnly: true}
{{- end }}
{{- end -}}

{{- define "shardrag.tlsVolume" -}}
{{- if .Values.tls.enabled }}
- name: tls
  secret: {secretName: {{ .Values.tls.existingSecret }}}
{{- end }}
{{- end -}}

{{- define "shardrag.commonEnv" -}}
- name: PYTHONUNBUFFERED
  value: "1"
- name: HF_HUB_OFFLINE
  value: "1"
- name: HOME
  value: /tmp
{{- if .Values.auth.enabled }}
- name: SHARDRAG_INTERNAL_TOKEN_FILE
  value: /etc/shardrag/secrets/internal-token
{{- end }}
{{- if .Values.tls.enabled }}
- name: SHARDRAG_TLS_CERT
  value: /etc/shardrag/tls/tls.crt
- name: SHARDRAG_TLS_KEY
  value: /etc/shardrag/tls/tls.key
- name: SHARDRAG_TLS_CA
  value: /etc/shardrag/tls/ca.crt
{{- end }}
{{- end -}}

{{- define "shardrag.secretName" -}}
{{- default (include "shardrag.componentName" (dict "root" . "component" "keys")) .Values.auth.existingSecret -}}
{{- end -}}

{{/* etcd: the name of its StatefulSet / headless Service, and the --coordinator value every
     gateway and shard replica is given (the chart's own members, or externalEndpoints). */}}
{{- define "shardrag.etcdName" -}}
{{- include "shardrag.componentName" (dict "root" . "component" "etcd") -}}
{{- end -}}

{{- define "shardrag.coordinator" -}}
{{- if .Values.etcd.externalEndpoints -}}
{{- printf "etcd://%s" (join "," .Values.etcd.externalEndpoints) -}}
{{- else -}}
{{- $name := include "shardrag.etcdName" . -}}
{{- $members := list -}}
{{- range $i := until (int .Values.etcd.replicas) -}}
{{- $members = append $members (printf "%s-%d.%s.%s.svc.%s:%d" $name $i $name $.Release.Namespace $.Values.clusterDomain (int $.Values.etcd.clientPort)) -}}
{{- end -}}
{{- printf "etcd://%s" (join "," $members) -}}
{{- end -}}
{{- end -}}
