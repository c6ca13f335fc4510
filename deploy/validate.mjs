#!/usr/bin/env node
// Offline validation of the rendered Kubernetes manifests, run by
// scripts/check-deploy.sh:
//
//   node deploy/validate.mjs --out DIR [--extra FILE]... RENDERED.yaml...
//
// Each RENDERED.yaml is the output of `kubectl kustomize` for one overlay
// (its base name names the overlay); each --extra FILE is a standalone
// manifest (not part of any kustomization). For every object it checks:
//   schema    the object validates against its kubernetes-models schema
//             (types, required fields, enums, patterns)
//   fields    no field is unknown to the API type (TypeScript's excess
//             property check against the models' declarations, the offline
//             counterpart of kubectl's strict field validation)
//   policy    what this deployment relies on, across objects: GPU limit and
//             toleration, restricted securityContext, gRPC probes on the
//             right port and health services, termination grace longer
//             than the drain, memory for the pinned pool, Services and the
//             ServiceMonitor matching the pods, one autoscaler whose
//             metrics prometheus-adapter serves, MATMUL_* variables that
//             the server reads, the PrometheusRule in sync with
//             deploy/prometheus/, an image tag that scripts/build-image.sh
//             wrote (NAME:<project version>-<commit>[@digest]), a
//             GRPCRoute attached to a Gateway and sending to the gRPC port
//             of a Service here (h2c, or a BackendTLSPolicy with TLS), and
//             one set of Prometheus-selector labels on the ServiceMonitor
//             and the PrometheusRule.
// It writes into DIR the rule groups of each PrometheusRule
// (rules-NAME.yml) and the autoscaling queries as recording rules
// (scaling-queries.rules.yml), for promtool. Exit status 1 on any problem.
import { createRequire } from "node:module";
import { readFileSync, writeFileSync, existsSync } from "node:fs";
import { basename, dirname, join, resolve } from "node:path";
import { fileURLToPath, pathToFileURL } from "node:url";
import { loadCanonicalGroups, sameValue } from "./canonical-rules.mjs";

const here = dirname(fileURLToPath(import.meta.url));
export const repoRoot = resolve(here, "..");
const toolsDir = join(repoRoot, "tools");
const require = createRequire(join(toolsDir, "package.json"));
export const YAML = require("yaml");

// ---------------------------------------------------------------- models

const MODEL_PACKAGES = [
  { match: (g) => g === "", path: (g, v, k) => `kubernetes-models/${v}/${k}` },
  {
    match: (g) => g === "monitoring.coreos.com",
    path: (g, v, k) => `@kubernetes-models/prometheus-operator/${g}/${v}/${k}`,
  },
  { match: (g) => g === "keda.sh", path: (g, v, k) => `@kubernetes-models/keda/${g}/${v}/${k}` },
  {
    match: (g) => g === "gateway.networking.k8s.io",
    path: (g, v, k) => `@kubernetes-models/gateway-api/${g}/${v}/${k}`,
  },
  { match: () => true, path: (g, v, k) => `kubernetes-models/${g}/${v}/${k}` },
];

// Packages published as ES modules only (their "exports" have no require
// condition): each group/version's index is imported once, here, by file
// path, so that the checks below stay synchronous.
const ESM_MODELS = new Map();
for (const gv of ["gateway.networking.k8s.io/v1"]) {
  const index = join(toolsDir, "node_modules/@kubernetes-models/gateway-api", gv, "index.js");
  if (existsSync(index)) ESM_MODELS.set(gv, await import(pathToFileURL(index).href));
}

function splitApiVersion(apiVersion) {
  return apiVersion.includes("/") ? apiVersion.split("/") : ["", apiVersion];
}

// The module that models apiVersion/kind, or null.
export function modelModule(apiVersion, kind) {
  if (typeof apiVersion !== "string" || typeof kind !== "string") return null;
  const [group, version] = splitApiVersion(apiVersion);
  const entry = MODEL_PACKAGES.find((p) => p.match(group));
  const path = entry.path(group, version, kind);
  const esm = ESM_MODELS.get(`${group}/${version}`);
  if (esm) return typeof esm[kind] === "function" ? path : null;
  try {
    require.resolve(path);
    return path;
  } catch {
    return null;
  }
}

function modelClass(apiVersion, kind) {
  const [group, version] = splitApiVersion(apiVersion);
  return ESM_MODELS.get(`${group}/${version}`)?.[kind] ?? require(modelModule(apiVersion, kind))[kind];
}

function describe(doc) {
  return `${doc?.kind ?? "?"}/${doc?.metadata?.name ?? "?"}`;
}

// Schema validation with the models' validate().
export function schemaProblems(docs) {
  const problems = [];
  for (const doc of docs) {
    const path = modelModule(doc?.apiVersion, doc?.kind);
    if (!path) {
      problems.push(`${describe(doc)}: no schema for ${doc?.apiVersion} ${doc?.kind}`);
      continue;
    }
    const Model = modelClass(doc.apiVersion, doc.kind);
    try {
      new Model(doc).validate();
    } catch (err) {
      problems.push(`${describe(doc)}: ${err.message}`);
    }
  }
  return problems;
}

// Unknown fields: each object becomes `const x: IKind = <object>;` in one
// TypeScript program checked in memory against the models' .d.ts files.
export function unknownFieldProblems(docs) {
  const ts = require("typescript");
  const lines = [];
  const owners = []; // line index -> doc
  docs.forEach((doc, i) => {
    const path = modelModule(doc?.apiVersion, doc?.kind);
    if (!path) return;
    lines.push(`import type { I${doc.kind} as T${i} } from "${path}";`);
    owners.push(null);
  });
  docs.forEach((doc, i) => {
    if (!modelModule(doc?.apiVersion, doc?.kind)) return;
    const body = JSON.stringify(doc, null, 1).split("\n");
    body[0] = `export const o${i}: T${i} = ${body[0]}`;
    body[body.length - 1] += ";";
    for (const l of body) {
      lines.push(l);
      owners.push(doc);
    }
  });
  const fileName = join(toolsDir, "__rendered_manifests__.ts");
  const source = lines.join("\n");
  const options = {
    strict: true,
    noEmit: true,
    skipLibCheck: true,
    target: ts.ScriptTarget.ES2020,
    module: ts.ModuleKind.CommonJS,
    moduleResolution: ts.ModuleResolutionKind.Node10,
    types: [],
  };
  const host = ts.createCompilerHost(options);
  const getSourceFile = host.getSourceFile.bind(host);
  host.getSourceFile = (name, lang, ...rest) =>
    name === fileName
      ? ts.createSourceFile(name, source, lang)
      : getSourceFile(name, lang, ...rest);
  const fileExists = host.fileExists.bind(host);
  host.fileExists = (name) => name === fileName || fileExists(name);
  const readFile = host.readFile.bind(host);
  host.readFile = (name) => (name === fileName ? source : readFile(name));
  const program = ts.createProgram([fileName], options, host);
  const problems = [];
  for (const d of ts.getPreEmitDiagnostics(program)) {
    const text = ts
      .flattenDiagnosticMessageText(d.messageText, " ")
      .replace(/'"([^"']+)"'/g, "'$1'");
    if (d.file?.fileName === fileName && d.start !== undefined) {
      const { line } = d.file.getLineAndCharacterOfPosition(d.start);
      const doc = owners[line];
      const where = doc ? describe(doc) : "manifests";
      problems.push(`${where}: ${text} (at: ${lines[line].trim()})`);
    } else {
      problems.push(`type check: ${text}`);
    }
  }
  return problems;
}

// ---------------------------------------------------------------- values

const QUANTITY_SUFFIX = {
  Ki: 2 ** 10, Mi: 2 ** 20, Gi: 2 ** 30, Ti: 2 ** 40,
  k: 1e3, M: 1e6, G: 1e9, T: 1e12, "": 1,
};

// A Kubernetes quantity ("14Gi", "700m", "4") as a number, or NaN.
export function parseQuantity(q) {
  const m = /^([0-9.]+)(Ki|Mi|Gi|Ti|k|M|G|T|m)?$/.exec(String(q));
  if (!m) return NaN;
  return m[2] === "m" ? Number(m[1]) / 1000 : Number(m[1]) * QUANTITY_SUFFIX[m[2] ?? ""];
}

const DURATION_UNIT = { h: 3600, m: 60, s: 1, ms: 1e-3, us: 1e-6, ns: 1e-9 };

// An absl duration ("5s", "1m30s", "0") in seconds, or NaN.
export function parseDuration(d) {
  const text = String(d).trim();
  if (text === "0") return 0;
  if (!/^(\d+(\.\d+)?(h|ms|us|ns|m|s))+$/.test(text)) return NaN;
  let total = 0;
  for (const m of text.matchAll(/(\d+(?:\.\d+)?)(h|ms|us|ns|m|s)/g)) {
    total += Number(m[1]) * DURATION_UNIT[m[2]];
  }
  return total;
}

// Environment variables the server reads: MATMUL_ + each name in
// server/main.cc's kEnvFlags. Flags announced but not merged yet are
// accepted too, so that the tls overlay can land first.
const PENDING_FLAGS = ["tls_cert", "tls_key", "tls_client_ca", "health_port"];

export function knownEnvVars(mainCc = join(repoRoot, "server/main.cc")) {
  const names = new Set(PENDING_FLAGS);
  if (existsSync(mainCc)) {
    const text = readFileSync(mainCc, "utf8");
    const list = /kEnvFlags\[\]\s*=\s*\{([^}]*)\}/.exec(text);
    const source = list ? list[1] : text;
    const re = list ? /"([a-z0-9_]+)"/g : /ABSL_FLAG\([^,]+,\s*([a-z0-9_]+)/g;
    for (const m of source.matchAll(re)) names.add(m[1]);
  }
  return new Set([...names].map((n) => `MATMUL_${n.toUpperCase()}`));
}

// Metric names that the prometheus-adapter values publish, with the
// queries filled in for promtool.
export function adapterRules(file = join(repoRoot, "deploy/prometheus-adapter/values.yaml")) {
  const values = YAML.parse(readFileSync(file, "utf8"));
  const rules = values?.rules?.custom ?? [];
  return rules.map((r) => ({
    name: r?.name?.as,
    series: /^\^?([a-zA-Z_:][a-zA-Z0-9_:]*)\$?$/.exec(r?.name?.matches ?? "")?.[1],
    seriesQuery: r?.seriesQuery,
    overrides: r?.resources?.overrides ?? {},
    metricsQuery: r?.metricsQuery,
  }));
}

function fillAdapterTemplate(rule, namespace) {
  return String(rule.metricsQuery)
    .replaceAll("<<.Series>>", rule.series)
    .replaceAll("<<.LabelMatchers>>", `namespace="${namespace}",pod=~".+"`)
    .replaceAll("<<.GroupBy>>", "pod");
}

// ---------------------------------------------------------------- policy

function labelsMatch(selector, labels) {
  return Object.entries(selector ?? {}).every(([k, v]) => labels?.[k] === v);
}

function envOf(container, problems, where) {
  const env = new Map();
  for (const e of container.env ?? []) {
    if (env.has(e.name)) problems.push(`${where}: ${e.name} is set twice`);
    env.set(e.name, e.value);
  }
  return env;
}

function checkPodSecurity(pod, c, problems, where) {
  const psc = pod.securityContext ?? {};
  const sc = c.securityContext ?? {};
  const runAsNonRoot = sc.runAsNonRoot ?? psc.runAsNonRoot;
  const runAsUser = sc.runAsUser ?? psc.runAsUser;
  const seccomp = (sc.seccompProfile ?? psc.seccompProfile)?.type;
  if (runAsNonRoot !== true) problems.push(`${where}: runAsNonRoot must be true`);
  if (!(Number.isInteger(runAsUser) && runAsUser > 0)) {
    problems.push(`${where}: runAsUser must be a non-zero uid`);
  }
  if (seccomp !== "RuntimeDefault" && seccomp !== "Localhost") {
    problems.push(`${where}: seccompProfile must be RuntimeDefault`);
  }
  if (sc.allowPrivilegeEscalation !== false) {
    problems.push(`${where}: allowPrivilegeEscalation must be false`);
  }
  if (!(sc.capabilities?.drop ?? []).includes("ALL")) {
    problems.push(`${where}: capabilities must drop ALL`);
  }
  if ((sc.capabilities?.add ?? []).length > 0) {
    problems.push(`${where}: no capabilities may be added`);
  }
  if (sc.privileged === true) problems.push(`${where}: must not be privileged`);
  if (sc.readOnlyRootFilesystem !== true) {
    problems.push(`${where}: readOnlyRootFilesystem must be true`);
  }
}

const GPU_RESOURCE = /^nvidia\.com\/(gpu|gpu\.shared|mig-[0-9a-z.]+)$/;

function checkServer(dep, problems, ctx) {
  const where = describe(dep);
  const pod = dep.spec?.template?.spec ?? {};
  const podLabels = dep.spec?.template?.metadata?.labels ?? {};
  if (!labelsMatch(dep.spec?.selector?.matchLabels, podLabels)) {
    problems.push(`${where}: selector does not match the pod template labels`);
  }
  if (pod.enableServiceLinks !== false) {
    problems.push(
      `${where}: enableServiceLinks must be false (service links inject MATMUL_PORT=tcp://... for a Service named matmul)`,
    );
  }
  if (!(pod.tolerations ?? []).some((t) => t.key === "nvidia.com/gpu" && (t.operator === "Exists" || t.value))) {
    problems.push(`${where}: no toleration for nvidia.com/gpu`);
  }
  const server = (pod.containers ?? []).find((c) => c.name === "server");
  if (!server) {
    problems.push(`${where}: no container named server`);
    return null;
  }
  for (const c of [...(pod.initContainers ?? []), ...(pod.containers ?? [])]) {
    checkPodSecurity(pod, c, problems, `${where} container ${c.name}`);
  }
  const cw = `${where} container server`;
  const env = envOf(server, problems, cw);

  // The image: a reference scripts/build-image.sh writes,
  // NAME:<project version>-<commit>[@sha256:...], not a moving tag.
  if (ctx.projectVersion) {
    const m = /^[^@]+:(\d+\.\d+\.\d+)-([0-9a-f]{7,40})(@sha256:[0-9a-f]{64})?$/.exec(server.image ?? "");
    if (!m) {
      problems.push(`${cw}: image ${server.image} is not NAME:<version>-<commit>[@sha256:<digest>] (scripts/build-image.sh writes it)`);
    } else if (m[1] !== ctx.projectVersion) {
      problems.push(`${cw}: image ${server.image} is version ${m[1]}, CMakeLists.txt says ${ctx.projectVersion} (run scripts/build-image.sh)`);
    }
  }
  for (const name of env.keys()) {
    if (name.startsWith("MATMUL_") && !ctx.envVars.has(name)) {
      problems.push(`${cw}: ${name} is not a variable matmul-server reads`);
    }
  }

  // GPU.
  const limits = server.resources?.limits ?? {};
  const requests = server.resources?.requests ?? {};
  const gpuKeys = Object.keys(limits).filter((k) => GPU_RESOURCE.test(k));
  const gpus = gpuKeys.reduce((n, k) => n + parseQuantity(limits[k]), 0);
  if (gpuKeys.length === 0 || !(gpus >= 1)) {
    problems.push(`${cw}: limits must request a GPU (nvidia.com/gpu or a MIG profile)`);
  }
  for (const k of Object.keys(requests).filter((k) => GPU_RESOURCE.test(k))) {
    if (String(requests[k]) !== String(limits[k])) {
      problems.push(`${cw}: ${k} request and limit differ`);
    }
  }

  // Ports.
  const ports = new Map((server.ports ?? []).map((p) => [p.name, p.containerPort]));
  const grpcPort = Number(env.get("MATMUL_PORT") ?? 50051);
  const metricsPort = Number(env.get("MATMUL_METRICS_PORT") ?? 9464);
  if (ports.get("grpc") !== grpcPort) {
    problems.push(`${cw}: port "grpc" must be ${grpcPort} (MATMUL_PORT)`);
  }
  if (ports.get("metrics") !== metricsPort) {
    problems.push(`${cw}: port "metrics" must be ${metricsPort} (MATMUL_METRICS_PORT)`);
  }

  // TLS and the health port.
  const healthPort = Number(env.get("MATMUL_HEALTH_PORT") ?? 0);
  const tls = env.has("MATMUL_TLS_CERT") || env.has("MATMUL_TLS_KEY");
  if (tls) {
    if (!(env.has("MATMUL_TLS_CERT") && env.has("MATMUL_TLS_KEY"))) {
      problems.push(`${cw}: MATMUL_TLS_CERT and MATMUL_TLS_KEY go together`);
    }
    if (!(healthPort > 0)) {
      problems.push(`${cw}: with TLS the probes need a plaintext MATMUL_HEALTH_PORT`);
    }
    const mounts = server.volumeMounts ?? [];
    for (const v of ["MATMUL_TLS_CERT", "MATMUL_TLS_KEY", "MATMUL_TLS_CLIENT_CA"]) {
      const file = env.get(v);
      if (file && !mounts.some((m) => file.startsWith(`${m.mountPath}/`))) {
        problems.push(`${cw}: ${v}=${file} is not under any volume mount`);
      }
    }
  }
  if (healthPort > 0 && ![...ports.values()].includes(healthPort)) {
    problems.push(`${cw}: MATMUL_HEALTH_PORT ${healthPort} is not a declared container port`);
  }

  // Probes.
  const probePort = healthPort > 0 ? healthPort : grpcPort;
  const wantService = { startupProbe: "readiness", livenessProbe: "liveness", readinessProbe: "readiness" };
  for (const [probe, service] of Object.entries(wantService)) {
    const p = server[probe];
    if (!p?.grpc) {
      problems.push(`${cw}: ${probe} must be a native gRPC probe`);
      continue;
    }
    if (p.grpc.port !== probePort) {
      problems.push(`${cw}: ${probe} must use port ${probePort}, not ${p.grpc.port}`);
    }
    if (p.grpc.service !== service) {
      problems.push(`${cw}: ${probe} must check health service "${service}"`);
    }
  }
  const sp = server.startupProbe;
  if (sp && (sp.periodSeconds ?? 10) * (sp.failureThreshold ?? 3) < 60) {
    problems.push(`${cw}: startupProbe allows less than 60 s for CUDA start-up`);
  }

  // Stored-tensor handles name the pod that holds them: the server
  // advertises the pod's IP (it adds its port), so that spreading clients
  // send the calls naming a handle to that pod.
  const advertise = (server.env ?? []).find((e) => e.name === "MATMUL_ADVERTISE_ADDRESS");
  if (advertise?.valueFrom?.fieldRef?.fieldPath !== "status.podIP") {
    problems.push(
      `${cw}: MATMUL_ADVERTISE_ADDRESS must come from the pod's IP (valueFrom.fieldRef.fieldPath: status.podIP), so that handles name their pod`,
    );
  }

  // Drain.
  const grace = parseDuration(env.get("MATMUL_DRAIN_GRACE") ?? "0");
  const timeout = parseDuration(env.get("MATMUL_DRAIN_TIMEOUT") ?? "30s");
  const preStopSleep = server.lifecycle?.preStop?.sleep?.seconds ?? 0;
  const tgps = pod.terminationGracePeriodSeconds ?? 30;
  if (Number.isNaN(grace) || Number.isNaN(timeout)) {
    problems.push(`${cw}: MATMUL_DRAIN_GRACE / MATMUL_DRAIN_TIMEOUT are not durations`);
  } else if (!(tgps > preStopSleep + grace + timeout)) {
    problems.push(
      `${where}: terminationGracePeriodSeconds ${tgps} must exceed preStop ${preStopSleep}s + drain grace ${grace}s + drain timeout ${timeout}s`,
    );
  }

  // Memory: pinned pool per GPU + twice the in-flight budget + 2 GiB.
  const pinned = Number(env.get("MATMUL_PINNED_POOL_BYTES") ?? 2 ** 32);
  const inflight = Number(env.get("MATMUL_MAX_INFLIGHT_BYTES") ?? 2 ** 33);
  const need = pinned * gpus + 2 * inflight + 2 ** 31;
  const memLimit = parseQuantity(limits.memory);
  if (!(memLimit >= need)) {
    problems.push(
      `${cw}: memory limit ${limits.memory ?? "none"} is below pinned pool x GPUs + 2 x in-flight bytes + 2Gi = ${need / 2 ** 30}Gi`,
    );
  }
  if (requests.memory !== undefined && parseQuantity(requests.memory) !== memLimit) {
    problems.push(`${cw}: memory request and limit differ`);
  }
  return { dep, podLabels, ports, tls };
}

// Cross-object checks for one rendered overlay.
export function policyProblems(docs, ctx) {
  const problems = [];
  const of = (kind) => docs.filter((d) => d?.kind === kind);
  const deployments = of("Deployment");
  if (deployments.length !== 1) {
    problems.push(`expected one Deployment, found ${deployments.length}`);
    return problems;
  }
  const server = checkServer(deployments[0], problems, ctx);
  if (!server) return problems;
  const { dep, podLabels, ports, tls } = server;
  const namespace = dep.metadata?.namespace;
  for (const d of docs) {
    if (d?.kind !== "Namespace" && d?.metadata?.namespace !== namespace) {
      problems.push(`${describe(d)}: namespace ${d?.metadata?.namespace} differs from the Deployment's ${namespace}`);
    }
  }

  // Services: both kinds, selecting the pods, by named container ports.
  const services = of("Service");
  const selecting = services.filter((s) => labelsMatch(s.spec?.selector, podLabels) && s.spec?.selector);
  for (const s of services) {
    if (!selecting.includes(s)) problems.push(`${describe(s)}: selects no server pod`);
    for (const p of s.spec?.ports ?? []) {
      const target = p.targetPort ?? p.port;
      const ok = typeof target === "string" ? ports.has(target) : [...ports.values()].includes(target);
      if (!ok) problems.push(`${describe(s)}: targetPort ${target} is not a container port`);
    }
  }
  if (!selecting.some((s) => s.spec?.clusterIP === "None")) {
    problems.push(`no headless Service (clusterIP: None) for dns:/// round_robin clients`);
  }
  if (!selecting.some((s) => s.spec?.clusterIP !== "None")) {
    problems.push(`no ClusterIP Service`);
  }

  // GRPCRoute: attached to a Gateway, sending every rule to the gRPC port
  // of a Service of this overlay, in cleartext HTTP/2 unless a
  // BackendTLSPolicy says how to reach a TLS server.
  const tlsPolicies = of("BackendTLSPolicy");
  for (const r of of("GRPCRoute")) {
    const where = describe(r);
    if ((r.spec?.parentRefs ?? []).length === 0) {
      problems.push(`${where}: no parentRefs, so the route attaches to no Gateway`);
    }
    const rules = r.spec?.rules ?? [];
    if (rules.length === 0) problems.push(`${where}: no rules`);
    for (const rule of rules) {
      const backends = rule.backendRefs ?? [];
      if (backends.length === 0) problems.push(`${where}: a rule has no backendRefs`);
      for (const b of backends) {
        if ((b.group ?? "") !== "" || (b.kind ?? "Service") !== "Service") {
          problems.push(`${where}: backend ${b.kind}/${b.name} is not a core Service`);
          continue;
        }
        if (b.namespace !== undefined && b.namespace !== namespace) {
          problems.push(`${where}: backend ${b.name} is in namespace ${b.namespace}, not the route's ${namespace}`);
        }
        const svc = services.find((s) => s.metadata?.name === b.name);
        if (!svc) {
          problems.push(`${where}: backend Service ${b.name} is not in this overlay`);
          continue;
        }
        const port = (svc.spec?.ports ?? []).find((p) => p.port === b.port);
        if (!port) {
          problems.push(`${where}: port ${b.port} is not a port of Service ${b.name}`);
          continue;
        }
        const target = port.targetPort ?? port.port;
        if (target !== "grpc" && target !== ports.get("grpc")) {
          problems.push(`${where}: backend ${b.name}:${b.port} reaches container port ${target}, not grpc`);
        }
        if (tls) {
          const covered = tlsPolicies.some((t) =>
            (t.spec?.targetRefs ?? []).some((ref) => (ref.kind ?? "") === "Service" && ref.name === b.name));
          if (!covered) {
            problems.push(`${where}: the server speaks TLS, but no BackendTLSPolicy targets Service ${b.name}`);
          }
        } else if (port.appProtocol !== undefined && port.appProtocol !== "kubernetes.io/h2c") {
          problems.push(`${where}: Service ${b.name} port ${b.port} has appProtocol ${port.appProtocol}, not kubernetes.io/h2c (cleartext HTTP/2)`);
        }
      }
    }
  }

  // ServiceMonitor: exactly one Service carries each scraped port.
  for (const sm of of("ServiceMonitor")) {
    const chosen = services.filter((s) => labelsMatch(sm.spec?.selector?.matchLabels, s.metadata?.labels));
    for (const ep of sm.spec?.endpoints ?? []) {
      const carriers = chosen.filter((s) => (s.spec?.ports ?? []).some((p) => p.name === ep.port));
      if (carriers.length !== 1) {
        problems.push(`${describe(sm)}: port ${ep.port} is on ${carriers.length} selected Services (want 1: no target, or scraped twice)`);
      }
    }
  }

  // One Prometheus selector must pick up the ServiceMonitor and the
  // PrometheusRule together: the labels such selectors use (release: ...
  // for kube-prometheus-stack; anything outside app.kubernetes.io/) agree.
  const monitoring = docs.filter((d) => String(d?.apiVersion).startsWith("monitoring.coreos.com/"));
  const selectorLabels = (d) =>
    JSON.stringify(Object.entries(d.metadata?.labels ?? {}).filter(([k]) => !k.startsWith("app.kubernetes.io/")).sort());
  for (const d of monitoring.slice(1)) {
    if (selectorLabels(d) !== selectorLabels(monitoring[0])) {
      problems.push(
        `${describe(d)}: labels ${selectorLabels(d)} differ from ${describe(monitoring[0])}'s ${selectorLabels(monitoring[0])}; a Prometheus selecting on them would take one and not the other`,
      );
    }
  }

  // PodDisruptionBudget.
  const pdbs = of("PodDisruptionBudget");
  if (pdbs.length !== 1 || !labelsMatch(pdbs[0].spec?.selector?.matchLabels, podLabels)) {
    problems.push(`want one PodDisruptionBudget selecting the server pods`);
  }

  // Autoscaling: exactly one autoscaler on the Deployment.
  const targets = (ref) => ref?.kind === "Deployment" && ref?.name === dep.metadata?.name;
  const hpas = of("HorizontalPodAutoscaler").filter((h) => targets(h.spec?.scaleTargetRef));
  const scaled = of("ScaledObject").filter((s) => targets({ kind: "Deployment", ...s.spec?.scaleTargetRef }));
  if (hpas.length + scaled.length !== 1) {
    problems.push(`want exactly one autoscaler on ${describe(dep)}, found ${hpas.length} HPA + ${scaled.length} ScaledObject`);
  }
  const served = new Set(ctx.adapter.map((r) => r.name));
  for (const h of hpas) {
    if (h.spec.minReplicas > h.spec.maxReplicas) problems.push(`${describe(h)}: minReplicas > maxReplicas`);
    for (const m of h.spec.metrics ?? []) {
      const name = m.pods?.metric?.name ?? m.object?.metric?.name;
      if (m.type === "Resource") continue;
      if (!served.has(name)) {
        problems.push(`${describe(h)}: metric ${name} is not served by deploy/prometheus-adapter/values.yaml`);
      }
    }
  }
  for (const s of scaled) {
    if (s.spec.minReplicaCount > s.spec.maxReplicaCount) problems.push(`${describe(s)}: minReplicaCount > maxReplicaCount`);
    for (const t of s.spec.triggers ?? []) {
      if (t.type === "prometheus" && !(t.metadata?.query && t.metadata?.serverAddress && t.metadata?.threshold)) {
        problems.push(`${describe(s)}: trigger ${t.name} needs serverAddress, query and threshold`);
      }
    }
  }

  // PrometheusRule: the canonical groups, where they exist.
  const rules = of("PrometheusRule");
  if (rules.length !== 1) problems.push(`want one PrometheusRule, found ${rules.length}`);
  if (ctx.canonical) {
    for (const r of rules) {
      if (!sameValue(r.spec?.groups, ctx.canonical.groups)) {
        problems.push(
          `${describe(r)}: spec.groups differ from deploy/prometheus/ (${ctx.canonical.files.join(", ")}); run: node deploy/sync-rules.mjs`,
        );
      }
    }
  }
  return problems;
}

// ---------------------------------------------------------------- main

export function loadDocs(file) {
  const problems = [];
  const docs = [];
  for (const d of YAML.parseAllDocuments(readFileSync(file, "utf8"))) {
    if (d.errors.length > 0) problems.push(`${file}: ${d.errors[0].message}`);
    const value = d.toJS();
    if (value !== null && value !== undefined) docs.push(value);
  }
  return { docs, problems };
}

// The version in the top-level CMakeLists.txt's project().
export function projectVersion(file = join(repoRoot, "CMakeLists.txt")) {
  return /^project\(matmul VERSION (\d+\.\d+\.\d+)/m.exec(readFileSync(file, "utf8"))?.[1] ?? null;
}

export function defaultContext() {
  return {
    projectVersion: projectVersion(),
    envVars: knownEnvVars(),
    adapter: adapterRules(),
    canonical: loadCanonicalGroups(join(repoRoot, "deploy/prometheus"), YAML),
  };
}

function main(argv) {
  let out = null;
  const rendered = [];
  const extras = [];
  for (let i = 0; i < argv.length; i++) {
    if (argv[i] === "--out") out = argv[++i];
    else if (argv[i] === "--extra") extras.push(argv[++i]);
    else rendered.push(argv[i]);
  }
  if (!out || rendered.length === 0) {
    console.error("usage: validate.mjs --out DIR [--extra FILE]... RENDERED.yaml...");
    return 2;
  }
  const ctx = defaultContext();
  let failed = 0;
  const report = (label, problems, count) => {
    for (const p of problems) console.log(`  FAIL ${label}: ${p}`);
    console.log(`${problems.length === 0 ? "ok  " : "FAIL"} ${label} (${count} objects)`);
    failed += problems.length;
  };

  const all = [];
  for (const file of [...rendered, ...extras]) {
    const { docs, problems } = loadDocs(file);
    all.push(...docs);
    const label = rendered.includes(file) ? `overlay ${basename(file, ".yaml")}` : file;
    problems.push(...schemaProblems(docs));
    if (rendered.includes(file)) problems.push(...policyProblems(docs, ctx));
    report(label, problems, docs.length);
    if (rendered.includes(file)) {
      for (const r of docs.filter((d) => d.kind === "PrometheusRule")) {
        writeFileSync(
          join(out, `rules-${basename(file, ".yaml")}.yml`),
          YAML.stringify({ groups: r.spec?.groups ?? [] }),
        );
      }
    }
  }
  // One TypeScript program for every object: the type declarations load once.
  report("unknown fields, all objects", unknownFieldProblems(all), all.length);

  // Autoscaling queries as recording rules, for promtool.
  const queries = [];
  const adapterProblems = [];
  for (const r of ctx.adapter) {
    if (!r.name || !r.series || !r.metricsQuery || !r.seriesQuery) {
      adapterProblems.push(`rule for ${r.name ?? "?"} needs seriesQuery, name.matches (one series), name.as and metricsQuery`);
      continue;
    }
    if (r.overrides.namespace?.resource !== "namespace" || r.overrides.pod?.resource !== "pod") {
      adapterProblems.push(`rule ${r.name} must map the namespace and pod labels to their resources`);
    }
    queries.push({ record: `adapter:${r.name}`, expr: fillAdapterTemplate(r, "matmul") });
  }
  report("prometheus-adapter values", adapterProblems, ctx.adapter.length);
  const seen = new Set();
  for (const s of all.filter((d) => d.kind === "ScaledObject")) {
    for (const t of s.spec?.triggers ?? []) {
      if (t.type !== "prometheus" || seen.has(t.name)) continue;
      seen.add(t.name);
      queries.push({ record: `keda:${t.name.replaceAll("-", "_")}`, expr: t.metadata.query });
    }
  }
  writeFileSync(
    join(out, "scaling-queries.rules.yml"),
    YAML.stringify({ groups: [{ name: "scaling-queries", rules: queries }] }),
  );
  console.log(failed === 0 ? "manifests: no problems" : `manifests: ${failed} problem(s)`);
  return failed === 0 ? 0 : 1;
}

if (process.argv[1] && import.meta.url === pathToFileURL(resolve(process.argv[1])).href) {
  process.exitCode = main(process.argv.slice(2));
}
