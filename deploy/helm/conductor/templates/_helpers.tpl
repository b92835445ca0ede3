{{- define "conductor.name" -}}
{{- .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "conductor.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "conductor.selectorLabels" -}}
app.kubernetes.io/name: {{ include "conductor.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "conductor.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{ include "conductor.selectorLabels" . }}
app.kubernetes.io/version: {{ .Values.image.tag | default .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end -}}

{{/*
conductor.validateStatic fails the render on a static registration that
conductor would refuse at pod start: every field POST /register requires
(docs/api.md), and the hash profile's members. Values are checked for
presence and shape only; the binary's decoder stays the judge of the rest.
*/}}
{{- define "conductor.validateStatic" -}}
{{- range $name, $reg := .Values.config.kvevent_instance }}
{{- if not (kindIs "map" $reg) }}
{{- fail (printf "config.kvevent_instance.%s must be a map with the fields of POST /register" $name) }}
{{- end }}
{{- range $field := list "endpoint" "type" "modelname" "instance_id" }}
{{- $v := get $reg $field }}
{{- if or (not (kindIs "string" $v)) (empty $v) }}
{{- fail (printf "config.kvevent_instance.%s.%s is required (a non-empty string, see docs/api.md POST /register)" $name $field) }}
{{- end }}
{{- end }}
{{- if not (has (get $reg "type") (list "vLLM" "SGLang" "Mooncake")) }}
{{- fail (printf "config.kvevent_instance.%s.type must be vLLM, SGLang or Mooncake" $name) }}
{{- end }}
{{- range $field := list "block_size" "dp_rank" }}
{{- if not (hasKey $reg $field) }}
{{- fail (printf "config.kvevent_instance.%s.%s is required (an integer, see docs/api.md POST /register)" $name $field) }}
{{- end }}
{{- $v := get $reg $field }}
{{- if not (or (kindIs "float64" $v) (kindIs "int" $v) (kindIs "int64" $v)) }}
{{- fail (printf "config.kvevent_instance.%s.%s must be an integer" $name $field) }}
{{- end }}
{{- end }}
{{- if le (int (get $reg "block_size")) 0 }}
{{- fail (printf "config.kvevent_instance.%s.block_size must be positive" $name) }}
{{- end }}
{{- $hp := get $reg "hash_profile" }}
{{- if not (kindIs "map" $hp) }}
{{- fail (printf "config.kvevent_instance.%s.hash_profile is required (strategy, algorithm, index_projection, python_hash_seed for vllm_v1)" $name) }}
{{- end }}
{{- range $member := list "strategy" "algorithm" "index_projection" }}
{{- $v := get $hp $member }}
{{- if or (not (kindIs "string" $v)) (empty $v) }}
{{- fail (printf "config.kvevent_instance.%s.hash_profile.%s is required" $name $member) }}
{{- end }}
{{- end }}
{{- if and (eq (get $hp "strategy") "vllm_v1") (or (not (hasKey $hp "python_hash_seed")) (not (kindIs "string" (index $hp "python_hash_seed"))) (empty (index $hp "python_hash_seed"))) }}
{{- fail (printf "config.kvevent_instance.%s.hash_profile.python_hash_seed is required for vllm_v1: the engine's PYTHONHASHSEED as text, e.g. \"0\"" $name) }}
{{- end }}
{{- end }}
{{- end -}}

{{/*
conductor.etcdEndpoints is the etcd client URLs the pods use: the chart's
own etcd when etcd.deploy.enabled, else etcd.endpoints.
*/}}
{{- define "conductor.etcdEndpoints" -}}
{{- if .Values.etcd.deploy.enabled -}}
{{- printf "http://%s-etcd:2379" (include "conductor.fullname" .) -}}
{{- else -}}
{{- join "," .Values.etcd.endpoints -}}
{{- end -}}
{{- end -}}
