{{/* Labels of every object: manifests/' part-of, and Helm's own. */}}
{{- define "gpusharing.labels" -}}
app.kubernetes.io/part-of: kube-gpusharing
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{- end }}

{{/* Labels of a component's objects; call with (list $ "gpusharing-webhook"). */}}
{{- define "gpusharing.componentLabels" -}}
app.kubernetes.io/name: {{ index . 1 }}
{{ include "gpusharing.labels" (index . 0) }}
{{- end }}

{{- define "gpusharing.image" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end }}

{{- define "gpusharing.meterImage" -}}
{{ .Values.meter.image | default (include "gpusharing.image" .) }}
{{- end }}

{{/* imagePullPolicy, when the values set one. */}}
{{- define "gpusharing.pullPolicy" -}}
{{- with .Values.image.pullPolicy }}
imagePullPolicy: {{ . }}
{{- end }}
{{- end }}

{{/* What every pod of the release takes from the values: pull secrets, node selector, tolerations. */}}
{{- define "gpusharing.podPlacement" -}}
{{- with .Values.imagePullSecrets }}
imagePullSecrets:
{{- toYaml . | nindent 2 }}
{{- end }}
{{- with .Values.nodeSelector }}
nodeSelector:
{{- toYaml . | nindent 2 }}
{{- end }}
{{- with .Values.tolerations }}
tolerations:
{{- toYaml . | nindent 2 }}
{{- end }}
{{- end }}

{{- define "gpusharing.timekeeperUrl" -}}
http://gpusharing-timekeeper.{{ .Release.Namespace }}.svc:8080
{{- end }}

{{/* The namespaces whose pods never reach the webhook: the values' and the release's own. */}}
{{- define "gpusharing.exemptNamespaces" -}}
{{- toJson (append .Values.webhook.exemptNamespaces .Release.Namespace) }}
{{- end }}

{{/*
The CEL of the webhook configurations' matchConditions: a pod reaches the webhook only when one of its containers
may ask for a GPU in some dialect (a resource under one of webhook.gpuResourcePrefixes) or takes the meter's
reserved name, or it carries a KAI Scheduler annotation, or it has resource claims. The same expressions as
manifests/base/webhook-configurations.yaml for the default prefixes (tests/manifests/test_chart.py compares them).
*/}}
{{- define "gpusharing.asksForAGpu" -}}
{{- $prefixes := list -}}
{{- range .Values.webhook.gpuResourcePrefixes -}}
{{- $prefixes = append $prefixes (printf "k.startsWith('%s')" .) -}}
{{- end -}}
{{- $anyPrefix := join " || " $prefixes -}}
{{- $clauses := list -}}
{{- range list "containers" "initContainers" -}}
{{- $clauses = append $clauses (printf "(has(object.spec.%s) && object.spec.%s.exists(c, c.name == 'gpusharing-meter' || (has(c.resources) && ((has(c.resources.limits) && c.resources.limits.exists(k, %s)) || (has(c.resources.requests) && c.resources.requests.exists(k, %s))))))" . . $anyPrefix $anyPrefix) -}}
{{- end -}}
{{- $clauses = append $clauses "(has(object.metadata.annotations) && object.metadata.annotations.exists(k, k in ['gpu-fraction', 'gpu-memory', 'gpu-fraction-num-devices', 'mps']))" -}}
{{- $clauses = append $clauses "(has(object.spec.resourceClaims) && size(object.spec.resourceClaims) > 0)" -}}
{{- join " || " $clauses -}}
{{- end }}

{{/* Validation also sees pods that carry, or carried, the webhook's gpusharing.io/ record (annotations or labels). */}}
{{- define "gpusharing.asksForAGpuOrCarriesTheRecord" -}}
{{- include "gpusharing.asksForAGpu" . }} || (has(object.metadata.annotations) && object.metadata.annotations.exists(k, k.startsWith('gpusharing.io/'))) || (has(object.metadata.labels) && object.metadata.labels.exists(k, k.startsWith('gpusharing.io/'))) || (request.operation == 'UPDATE' && has(oldObject.metadata.annotations) && oldObject.metadata.annotations.exists(k, k.startsWith('gpusharing.io/'))) || (request.operation == 'UPDATE' && has(oldObject.metadata.labels) && oldObject.metadata.labels.exists(k, k.startsWith('gpusharing.io/')))
{{- end }}

{{/* TIMEKEEPER_DATABASE_URL: the bundled PostgreSQL's, with its password from the Secret, or the external one's. */}}
{{- define "gpusharing.databaseEnv" -}}
{{- if .Values.database.bundled }}
- name: DATABASE_PASSWORD  # only for the URL below (letters and digits)
  valueFrom:
    secretKeyRef:
      name: gpusharing-database
      key: password
- name: TIMEKEEPER_DATABASE_URL
  value: postgresql+psycopg://gpusharing:$(DATABASE_PASSWORD)@gpusharing-postgres.{{ .Release.Namespace }}.svc:5432/gpusharing
{{- else }}
- name: TIMEKEEPER_DATABASE_URL
  valueFrom:
    secretKeyRef:
      name: {{ .Values.database.external.secretName }}
      key: {{ .Values.database.external.key }}
{{- end }}
{{- end }}

{{/* The webhook's settings of issue 22: who may send it reviews, which priority classes GPU pods may keep. */}}
{{- define "gpusharing.webhookTenancyEnv" -}}
{{- $auth := .Values.webhook.clientAuth }}
{{- if eq $auth.mode "certificate" }}
- name: GPUSHARING_CLIENT_CA_FILE
  value: /etc/gpusharing/client-ca/ca.crt
{{- else if eq $auth.mode "token" }}
- name: GPUSHARING_CLIENT_TOKEN_USERS
  value: {{ join "," ($auth.tokenUsers | default (list (printf "system:serviceaccount:%s:gpusharing-apiserver" .Release.Namespace))) | quote }}
{{- end }}
{{- with .Values.priorityClasses.allowed }}
- name: GPUSHARING_ALLOWED_PRIORITY_CLASSES
  value: {{ join "," . | quote }}
{{- end }}
{{- end }}
