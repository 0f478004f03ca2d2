{{/* The name in labels (app.kubernetes.io/name: NAME-webhook): gpusharing, whatever the release's name. */}}
{{- define "gpusharing.name" -}}
{{ .Values.nameOverride | default "gpusharing" }}
{{- end }}

{{/* The prefix of every object's name. */}}
{{- define "gpusharing.fullname" -}}
{{ .Values.fullnameOverride | default (include "gpusharing.name" .) }}
{{- end }}

{{/* A component's object name; call with (list $ "webhook"). */}}
{{- define "gpusharing.component" -}}
{{ include "gpusharing.fullname" (index . 0) }}-{{ index . 1 }}
{{- end }}

{{/* A component's app.kubernetes.io/name, its pods' selector; call with (list $ "webhook"). */}}
{{- define "gpusharing.componentName" -}}
{{ include "gpusharing.name" (index . 0) }}-{{ index . 1 }}
{{- end }}

{{/* Labels of every object: manifests/' part-of, and Helm's own. */}}
{{- define "gpusharing.labels" -}}
app.kubernetes.io/part-of: kube-gpusharing
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{- end }}

{{/* Labels of a component's objects; call with (list $ "webhook"). */}}
{{- define "gpusharing.componentLabels" -}}
app.kubernetes.io/name: {{ include "gpusharing.componentName" . }}
{{ include "gpusharing.labels" (index . 0) }}
{{- end }}

{{/* A component's selector; call with (list $ "webhook"). */}}
{{- define "gpusharing.selector" -}}
app.kubernetes.io/name: {{ include "gpusharing.componentName" . }}
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

{{/*
A pod template's metadata: the component's selector labels and part-of (never overridden), then the component's
podLabels and podAnnotations over the release's. Call with (list $ "webhook" $values), $values the component's.
*/}}
{{- define "gpusharing.podMetadata" -}}
{{- $root := index . 0 }}
{{- $values := index . 2 }}
{{- $fixed := dict "app.kubernetes.io/name" (include "gpusharing.componentName" .) "app.kubernetes.io/part-of" "kube-gpusharing" }}
labels:
  {{- toYaml (merge $fixed ($values.podLabels | default dict) ($root.Values.podLabels | default dict)) | nindent 2 }}
{{- with merge (dict) ($values.podAnnotations | default dict) ($root.Values.podAnnotations | default dict) }}
annotations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end }}

{{/*
What a pod takes from the values besides its containers: its security context, priority class, pull secrets and
placement (the component's nodeSelector over the release's, both's tolerations, its affinity or, for `spread`, the
default anti-affinity over nodes). Call with (list $ "webhook" $values spread).
*/}}
{{- define "gpusharing.podSpec" -}}
{{- $root := index . 0 }}
{{- $values := index . 2 }}
{{- $affinity := $values.affinity }}
{{- if and (not $affinity) (index . 3) }}
{{- $term := dict "topologyKey" "kubernetes.io/hostname" "labelSelector" (dict "matchLabels" (include "gpusharing.selector" . | fromYaml)) }}
{{- $affinity = dict "podAntiAffinity" (dict "preferredDuringSchedulingIgnoredDuringExecution" (list (dict "weight" 100 "podAffinityTerm" $term))) }}
{{- end }}
{{- with $affinity }}
affinity:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with $values.priorityClassName }}
priorityClassName: {{ . }}
{{- end }}
securityContext:
  {{- toYaml $values.podSecurityContext | nindent 2 }}
{{- with $root.Values.imagePullSecrets }}
imagePullSecrets:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with merge (dict) ($values.nodeSelector | default dict) ($root.Values.nodeSelector | default dict) }}
nodeSelector:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with concat ($root.Values.tolerations | default list) ($values.tolerations | default list) }}
tolerations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end }}

{{- define "gpusharing.timekeeperUrl" -}}
http://{{ include "gpusharing.component" (list . "timekeeper") }}.{{ .Release.Namespace }}.svc:8080
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

{{/* Validation also sees pods that carry, or carried, what the webhook adds: its gpusharing.io/ record (annotations
or labels), the billing finalizer, the meter. */}}
{{- define "gpusharing.asksForAGpuOrCarriesWhatTheWebhookAdded" -}}
{{- include "gpusharing.asksForAGpu" . }} || (has(object.metadata.annotations) && object.metadata.annotations.exists(k, k.startsWith('gpusharing.io/'))) || (has(object.metadata.labels) && object.metadata.labels.exists(k, k.startsWith('gpusharing.io/'))) || (request.operation == 'UPDATE' && has(oldObject.metadata.annotations) && oldObject.metadata.annotations.exists(k, k.startsWith('gpusharing.io/'))) || (request.operation == 'UPDATE' && has(oldObject.metadata.labels) && oldObject.metadata.labels.exists(k, k.startsWith('gpusharing.io/'))) || (has(object.metadata.finalizers) && 'gpusharing.io/billing' in object.metadata.finalizers) || (request.operation == 'UPDATE' && has(oldObject.metadata.finalizers) && 'gpusharing.io/billing' in oldObject.metadata.finalizers) || (request.operation == 'UPDATE' && has(oldObject.spec.initContainers) && oldObject.spec.initContainers.exists(c, c.name == 'gpusharing-meter')) || (request.operation == 'UPDATE' && has(oldObject.spec.containers) && oldObject.spec.containers.exists(c, c.name == 'gpusharing-meter'))
{{- end }}

{{/* TIMEKEEPER_DATABASE_URL: the bundled PostgreSQL's, with its password from the Secret, or the external one's. */}}
{{- define "gpusharing.databaseEnv" -}}
{{- if .Values.database.bundled }}
- name: DATABASE_PASSWORD  # only for the URL below (letters and digits)
  valueFrom:
    secretKeyRef:
      name: {{ include "gpusharing.component" (list . "database") }}
      key: password
- name: TIMEKEEPER_DATABASE_URL
  value: postgresql+psycopg://gpusharing:$(DATABASE_PASSWORD)@{{ include "gpusharing.component" (list . "postgres") }}.{{ .Release.Namespace }}.svc:5432/gpusharing
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

{{/*
The GPU-model catalogue's ConfigMap: gpuModels, else the copy of the shipped one, named with a hash of it (as
kustomize names what it generates), so that a change rolls the pods that mount it.
*/}}
{{- define "gpusharing.gpuModels" -}}
{{- if .Values.gpuModels }}{{ toYaml .Values.gpuModels }}{{ else }}{{ .Files.Get "files/gpu-models.yaml" }}{{ end }}
{{- end }}

{{- define "gpusharing.gpuModelsName" -}}
{{ include "gpusharing.component" (list . "gpu-models") }}-{{ print (include "gpusharing.gpuModels" .) (ternary (toYaml .Values.gpuPrices) "" (not (empty .Values.gpuPrices))) | sha256sum | trunc 10 }}
{{- end }}

{{- define "gpusharing.gpuModelsFile" -}}
/etc/gpusharing/models/gpu-models.yaml
{{- end }}

{{/* The catalogue mounted where GPUSHARING_GPU_MODELS_FILE says. */}}
{{- define "gpusharing.gpuModelsMount" -}}
- name: gpu-models
  mountPath: /etc/gpusharing/models
  readOnly: true
{{- end }}

{{- define "gpusharing.gpuModelsVolume" -}}
- name: gpu-models
  configMap:
    name: {{ include "gpusharing.gpuModelsName" . }}
{{- end }}

{{/*
The Secret the controller reads the statements' signing key from: the admin's own (statements.existingSecret), else
the one the certgen makes at install.
*/}}
{{- define "gpusharing.statementKeySecret" -}}
{{ .Values.statements.existingSecret | default (include "gpusharing.component" (list . "statement-key")) }}
{{- end }}

{{/* Whether the certgen makes the statements' signing key: statements on, and no Secret of the admin's. */}}
{{- define "gpusharing.certgenMakesStatementKey" -}}
{{- if and .Values.statements.enabled (not .Values.statements.existingSecret) }}true{{ end }}
{{- end }}

{{/* The name a key the certgen makes signs with: statements.keyName, else the statements' origin. */}}
{{- define "gpusharing.statementKeyName" -}}
{{ .Values.statements.keyName | default (printf "gpusharing.io/%s/statements" .Values.chargeback.clusterName) }}
{{- end }}

{{/* Refuses a setting that the values replace; call with (list $values.env "webhook.env"). */}}
{{- define "gpusharing.refuseReplacedEnv" -}}
{{- range index . 0 }}
{{- if eq .name "GPUSHARING_DEVICE_MEMORY_MIB" }}
{{- fail (printf "%s sets GPUSHARING_DEVICE_MEMORY_MIB, which the GPU-model catalogue replaces: give gpuModels (its default model's memoryMiB) instead" (index $ 1)) }}
{{- end }}
{{- end }}
{{- end }}

{{/*
The settings the timekeeper and its controller both read: one database, one budget arithmetic, one catalogue of
billing weights, the meters' interval (each Deployment then adds timekeeper.env, which is for both).
*/}}
{{- define "gpusharing.timekeeperSharedEnv" -}}
{{- $tk := .Values.timekeeper }}
{{- include "gpusharing.databaseEnv" . }}
- name: GPUSHARING_GPU_MODELS_FILE  # the models' billing weights
  value: {{ include "gpusharing.gpuModelsFile" . }}
{{- if .Values.gpuPrices }}
- name: TIMEKEEPER_GPU_PRICES_FILE  # what a GPU-hour of each model costs
  value: /etc/gpusharing/models/gpu-prices.yaml
{{- end }}
{{- with .Values.chargeback }}
- name: TIMEKEEPER_BILLING_PERIOD  # the periods GPU time is booked in, and how long each takes late time
  value: {{ .billingPeriod | quote }}
- name: TIMEKEEPER_BILLING_GRACE
  value: {{ .grace | quote }}
- name: TIMEKEEPER_SHARE_UNALLOCATED
  value: {{ .shareUnallocated | toString | quote }}
- name: TIMEKEEPER_CLUSTER_NAME  # the exports' billing account
  value: {{ .clusterName | quote }}
{{- end }}
{{ include "gpusharing.meterIntervalEnv" . }}
{{- if not (kindIs "invalid" $tk.defaultBudget.gpuMinutes) }}
- name: TIMEKEEPER_DEFAULT_GPU_MINUTES
  value: {{ $tk.defaultBudget.gpuMinutes | toString | quote }}
{{- end }}
{{- with $tk.defaultBudget.period }}
- name: TIMEKEEPER_DEFAULT_PERIOD
  value: {{ . }}
{{- end }}
{{- if .Values.fairShare.enabled }}
- name: TIMEKEEPER_FAIRSHARE_ENABLED  # the web replicas grow decayed usage and list bands; the controller ranks them
  value: "true"
- name: TIMEKEEPER_FAIRSHARE_HALF_LIFE
  value: {{ .Values.fairShare.halfLife | quote }}
- name: TIMEKEEPER_FAIRSHARE_CLASSES  # lightest first
  value: {{ printf "%s,%s,%s" .Values.fairShare.lightClass .Values.priorityClasses.inBudget.name .Values.fairShare.heavyClass | quote }}
{{- end }}
{{- end }}

{{/* The meters' report interval, which the webhook injects into each meter and the timekeeper and its controller
reckon silent meters and idle streaks by. */}}
{{- define "gpusharing.meterIntervalEnv" -}}
- name: GPUSHARING_METER_INTERVAL_SECONDS  # the meters' report interval (meter.intervalSeconds)
  value: {{ .Values.meter.intervalSeconds | toString | quote }}
{{- end }}
