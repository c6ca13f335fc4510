// Tests of the deployment checkers (deploy/validate.mjs,
// deploy/check-dockerfile.mjs): the rendered overlays pass, and each kind
// of mistake they exist to catch is caught. Run by scripts/check-deploy.sh
// (node --test tests/deploy/).
import { test } from "node:test";
import assert from "node:assert/strict";
import { execFileSync } from "node:child_process";
import { mkdtempSync, readFileSync, writeFileSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import {
  YAML,
  repoRoot,
  defaultContext,
  parseDuration,
  parseQuantity,
  policyProblems,
  schemaProblems,
  unknownFieldProblems,
} from "../../deploy/validate.mjs";
import { dockerfileProblems } from "../../deploy/check-dockerfile.mjs";

function render(overlay) {
  const dir = join(repoRoot, "deploy", overlay);
  let text;
  try {
    text = execFileSync("kubectl", ["kustomize", dir], { encoding: "utf8" });
  } catch {
    text = execFileSync("kustomize", ["build", dir], { encoding: "utf8" });
  }
  return YAML.parseAllDocuments(text).map((d) => d.toJS()).filter(Boolean);
}

const ctx = defaultContext();
const base = render("base");
const tls = render("overlays/tls");
const keda = render("overlays/keda");
const gateway = render("overlays/gateway");
const kps = render("overlays/kube-prometheus-stack");
const clone = (docs) => structuredClone(docs);
const find = (docs, kind) => docs.find((d) => d.kind === kind);
const server = (docs) =>
  find(docs, "Deployment").spec.template.spec.containers.find((c) => c.name === "server");
const setEnv = (c, name, value) => {
  const e = c.env.find((x) => x.name === name);
  if (e) e.value = value;
  else c.env.push({ name, value });
};

// Policy problems of `docs` after `mutate`, as one string for matching.
function policyAfter(docs, mutate, context = ctx) {
  const copy = clone(docs);
  mutate(copy);
  return policyProblems(copy, context).join("\n");
}

test("rendered overlays pass every check", () => {
  for (const docs of [base, tls, keda, gateway, kps]) {
    assert.deepEqual(schemaProblems(docs), []);
    assert.deepEqual(policyProblems(docs, ctx), []);
  }
  assert.deepEqual(unknownFieldProblems([...base, ...tls, ...keda, ...gateway, ...kps]), []);
});

test("schema: wrong types are caught", () => {
  const docs = clone(base);
  server(docs).ports[0].containerPort = "grpc";
  assert.match(schemaProblems(docs).join("\n"), /containerPort must be integer/);
});

test("fields: a misspelt field is caught", () => {
  const docs = clone(base);
  server(docs).readinesProbe = server(docs).readinessProbe;
  find(docs, "HorizontalPodAutoscaler").spec.minReplica = 1;
  const text = unknownFieldProblems(docs).join("\n");
  assert.match(text, /'readinesProbe' does not exist/);
  assert.match(text, /'minReplica' does not exist/);
});

test("policy: GPU, toleration, security", () => {
  assert.match(
    policyAfter(base, (d) => delete server(d).resources.limits["nvidia.com/gpu"]),
    /must request a GPU/,
  );
  assert.match(
    policyAfter(base, (d) => (find(d, "Deployment").spec.template.spec.tolerations = [])),
    /no toleration for nvidia.com\/gpu/,
  );
  assert.match(
    policyAfter(base, (d) => (server(d).securityContext.readOnlyRootFilesystem = false)),
    /readOnlyRootFilesystem must be true/,
  );
  assert.match(
    policyAfter(base, (d) => (server(d).securityContext.capabilities = { drop: ["NET_RAW"] })),
    /capabilities must drop ALL/,
  );
  assert.match(
    policyAfter(base, (d) => delete find(d, "Deployment").spec.template.spec.enableServiceLinks),
    /enableServiceLinks must be false/,
  );
});

test("policy: probes and drain timing", () => {
  assert.match(
    policyAfter(base, (d) => (server(d).livenessProbe.grpc.service = "readiness")),
    /livenessProbe must check health service "liveness"/,
  );
  assert.match(
    policyAfter(tls, (d) => (server(d).readinessProbe.grpc.port = 50051)),
    /readinessProbe must use port 8081/,
  );
  assert.match(
    policyAfter(base, (d) => (find(d, "Deployment").spec.template.spec.terminationGracePeriodSeconds = 30)),
    /terminationGracePeriodSeconds 30 must exceed/,
  );
  assert.match(
    policyAfter(base, (d) => setEnv(server(d), "MATMUL_DRAIN_TIMEOUT", "60s")),
    /must exceed preStop 0s \+ drain grace 5s \+ drain timeout 60s/,
  );
});

test("policy: memory covers the pinned pool", () => {
  assert.match(
    policyAfter(base, (d) => setEnv(server(d), "MATMUL_PINNED_POOL_BYTES", String(8 * 2 ** 30))),
    /memory limit 14Gi is below .* = 18Gi/,
  );
  assert.match(
    policyAfter(base, (d) => (server(d).resources.requests.memory = "8Gi")),
    /memory request and limit differ/,
  );
});

test("policy: environment variables the server does not read", () => {
  assert.match(
    policyAfter(base, (d) => setEnv(server(d), "MATMUL_DRAIN_GRCE", "5s")),
    /MATMUL_DRAIN_GRCE is not a variable matmul-server reads/,
  );
  assert.match(
    policyAfter(base, (d) => server(d).env.push({ name: "MATMUL_PORT", value: "50052" })),
    /MATMUL_PORT is set twice/,
  );
  assert.match(
    policyAfter(tls, (d) => setEnv(server(d), "MATMUL_HEALTH_PORT", "0")),
    /with TLS the probes need a plaintext MATMUL_HEALTH_PORT/,
  );
});

test("policy: handles name their pod (MATMUL_ADVERTISE_ADDRESS from status.podIP)", () => {
  const drop = (d) => {
    const c = server(d);
    c.env = c.env.filter((e) => e.name !== "MATMUL_ADVERTISE_ADDRESS");
  };
  assert.match(policyAfter(base, drop), /MATMUL_ADVERTISE_ADDRESS must come from the pod's IP/);
  assert.match(
    policyAfter(base, (d) => {
      drop(d);
      server(d).env.push({ name: "MATMUL_ADVERTISE_ADDRESS", value: "10.0.0.5:50051" });
    }),
    /MATMUL_ADVERTISE_ADDRESS must come from the pod's IP/,
  );
});

test("policy: services, monitor and autoscalers fit together", () => {
  assert.match(
    policyAfter(base, (d) => {
      for (const s of d.filter((x) => x.kind === "Service")) s.spec.ports.push({ name: "metrics", port: 9464, targetPort: "metrics" });
    }),
    /port metrics is on 2 selected Services/,
  );
  assert.match(
    policyAfter(base, (d) => (d.find((x) => x.kind === "Service").spec.ports[0].targetPort = "grcp")),
    /targetPort grcp is not a container port/,
  );
  assert.match(
    policyAfter(keda, (d) => d.push(find(base, "HorizontalPodAutoscaler"))),
    /want exactly one autoscaler .* found 1 HPA \+ 1 ScaledObject/,
  );
  assert.match(
    policyAfter(base, (d) => (find(d, "HorizontalPodAutoscaler").spec.metrics[0].pods.metric.name = "gpu_busy")),
    /metric gpu_busy is not served by deploy\/prometheus-adapter\/values.yaml/,
  );
});

test("gateway component: a GRPCRoute to the matmul Service's gRPC port, over h2c", () => {
  const route = find(gateway, "GRPCRoute");
  assert.equal(route.apiVersion, "gateway.networking.k8s.io/v1");
  assert.equal(route.metadata.namespace, "matmul");
  assert.deepEqual(route.spec.rules[0].backendRefs.map((b) => `${b.name}:${b.port}`), ["matmul:50051"]);
  const svc = gateway.find((d) => d.kind === "Service" && d.metadata.name === "matmul");
  assert.equal(svc.spec.ports.find((p) => p.port === 50051).appProtocol, "kubernetes.io/h2c");
  assert.equal(find(base, "GRPCRoute"), undefined, "the base has no route: the component is optional");
});

test("gateway component: schema, fields and policy catch a broken route", () => {
  const route = (d) => find(d, "GRPCRoute");
  const docs = clone(gateway);
  route(docs).spec.rules[0].backendRefs[0].port = "grpc";
  assert.match(schemaProblems(docs).join("\n"), /GRPCRoute\/matmul: .*port must be integer/);
  const misspelt = clone(gateway);
  route(misspelt).spec.rules[0].backendRef = route(misspelt).spec.rules[0].backendRefs;
  assert.match(unknownFieldProblems(misspelt).join("\n"), /'backendRef' does not exist in type 'IGRPCRouteRule'/);
  assert.match(
    policyAfter(gateway, (d) => (route(d).spec.rules[0].backendRefs[0].name = "matmul-grpc")),
    /backend Service matmul-grpc is not in this overlay/,
  );
  assert.match(
    policyAfter(gateway, (d) => (route(d).spec.rules[0].backendRefs[0].port = 9464)),
    /backend matmul:9464 reaches container port metrics, not grpc/,
  );
  assert.match(
    policyAfter(gateway, (d) => (route(d).spec.rules[0].backendRefs[0].port = 50052)),
    /port 50052 is not a port of Service matmul/,
  );
  assert.match(policyAfter(gateway, (d) => (route(d).spec.parentRefs = [])), /attaches to no Gateway/);
  assert.match(
    policyAfter(gateway, (d) => {
      d.find((x) => x.kind === "Service" && x.metadata.name === "matmul").spec.ports[0].appProtocol = "http";
    }),
    /appProtocol http, not kubernetes.io\/h2c/,
  );
});

test("gateway with TLS on the server needs a BackendTLSPolicy", () => {
  const withTls = [...clone(tls), clone(find(gateway, "GRPCRoute"))];
  assert.match(policyProblems(withTls, ctx).join("\n"), /the server speaks TLS, but no BackendTLSPolicy targets Service matmul/);
  const policy = {
    apiVersion: "gateway.networking.k8s.io/v1",
    kind: "BackendTLSPolicy",
    metadata: { name: "matmul", namespace: "matmul" },
    spec: {
      targetRefs: [{ group: "", kind: "Service", name: "matmul" }],
      validation: { caCertificateRefs: [{ group: "", kind: "ConfigMap", name: "matmul-ca" }], hostname: "matmul.matmul.svc" },
    },
  };
  withTls.push(policy);
  assert.deepEqual(schemaProblems([policy]), []);
  assert.deepEqual(policyProblems(withTls, ctx), []);
});

test("kube-prometheus-stack component: one release label on the ServiceMonitor and the PrometheusRule", () => {
  for (const kind of ["ServiceMonitor", "PrometheusRule"]) {
    assert.equal(find(kps, kind).metadata.labels.release, "kube-prometheus-stack", kind);
    assert.equal(find(base, kind).metadata.labels.release, undefined, kind);
  }
  assert.match(
    policyAfter(kps, (d) => delete find(d, "ServiceMonitor").metadata.labels.release),
    /ServiceMonitor\/matmul: labels \[\] differ from PrometheusRule\/matmul's \[\["release","kube-prometheus-stack"\]\]/,
  );
  assert.match(
    policyAfter(kps, (d) => (find(d, "PrometheusRule").metadata.labels.release = "prometheus")),
    /differ from PrometheusRule\/matmul.s \[\["release","prometheus"\]\]/,
  );
});

test("policy: PrometheusRule must match deploy/prometheus/", () => {
  const canonical = { files: ["x.yml"], groups: [{ name: "g", rules: [{ record: "a", expr: "1" }] }] };
  assert.match(
    policyAfter(base, () => {}, { ...ctx, canonical }),
    /spec.groups differ from deploy\/prometheus\/ \(x.yml\)/,
  );
  const same = { files: ["x.yml"], groups: find(base, "PrometheusRule").spec.groups };
  assert.equal(policyAfter(base, () => {}, { ...ctx, canonical: same }), "");
});

test("durations and quantities", () => {
  assert.equal(parseDuration("5s"), 5);
  assert.equal(parseDuration("1m30s"), 90);
  assert.equal(parseDuration("250ms"), 0.25);
  assert.equal(parseDuration("0"), 0);
  assert.ok(Number.isNaN(parseDuration("5 seconds")));
  assert.equal(parseQuantity("14Gi"), 14 * 2 ** 30);
  assert.equal(parseQuantity("700m"), 0.7);
  assert.equal(parseQuantity("4"), 4);
});

// Dockerfile problems of the repository's Dockerfile after `edit` (a
// function of its text), and of install-deps.sh after `editDeps`.
function dockerfileAfter(edit, editDeps = (t) => t) {
  const dir = mkdtempSync(join(tmpdir(), "dockerfile-"));
  try {
    const text = readFileSync(join(repoRoot, "Dockerfile"), "utf8");
    const edited = edit(text);
    assert.notEqual(edited, text, "the edit changed nothing");
    writeFileSync(join(dir, "Dockerfile"), edited);
    writeFileSync(join(dir, "install-deps.sh"), editDeps(readFileSync(join(repoRoot, "scripts/install-deps.sh"), "utf8")));
    return dockerfileProblems(join(dir, "Dockerfile"), join(dir, "install-deps.sh")).join("\n");
  } finally {
    rmSync(dir, { recursive: true });
  }
}

test("Dockerfile: the repository's passes, a broken one does not", () => {
  assert.deepEqual(dockerfileProblems(), []);
  const text = dockerfileAfter((t) =>
    t
      .replace(/^USER .*$/m, "USER matmul")
      .replace(/^ARG CUDA_VERSION=.*$/m, "ARG CUDA_VERSION=12.8.0")
      .replace(/^ENTRYPOINT .*$/m, "ENTRYPOINT /usr/local/bin/matmul-server")
      .replace(/^(RUN \S*install-deps\.sh) --runtime/m, "$1"),
  );
  assert.match(text, /stage cpu: USER must be a numeric non-root uid/);
  assert.match(text, /the default must be a pinned 13\.0\.x release/);
  assert.match(text, /stage cpu: ENTRYPOINT must be the exec form/);
  assert.match(text, /stage cpu: must run scripts\/install-deps.sh --runtime once/);
});

test("Dockerfile: both targets, their images and their build stages", () => {
  assert.match(
    dockerfileAfter((t) => t.replace("FROM nvidia/cuda:${CUDA_VERSION}-devel", "FROM nvidia/cuda:13.0.2-devel")),
    /stage build: FROM nvidia\/cuda:13\.0\.2-devel-ubuntu24\.04 .*want nvidia\/cuda:\$\{CUDA_VERSION\}-devel-ubuntu24\.04/,
  );
  assert.match(
    dockerfileAfter((t) => t.replace(/^FROM debian:\$\{DEBIAN_VERSION\}-slim AS cpu$/m, "FROM debian:bookworm-slim AS cpu")),
    /stage cpu: FROM debian:bookworm-slim .*want debian:\$\{DEBIAN_VERSION\}-slim/,
  );
  assert.match(dockerfileAfter((t) => t.replace(/^ARG DEBIAN_VERSION=.*$/m, "ARG DEBIAN_VERSION=bookworm")), /want a pinned Debian 12 point release/);
  assert.match(
    dockerfileAfter((t) => t.replace("RUN scripts/install-deps.sh --compile", "RUN scripts/install-deps.sh")),
    /stage build: must run scripts\/install-deps.sh --compile once/,
  );
  assert.match(dockerfileAfter((t) => t.replace("-DMATMUL_CUDA=OFF", "-DMATMUL_CUDA=AUTO")), /stage cpu-build: must configure with -DMATMUL_CUDA=OFF/);
  assert.match(dockerfileAfter((t) => t.replace("-DMATMUL_CUDA=ON", "")), /stage build: must configure with -DMATMUL_CUDA=ON/);
  assert.match(
    dockerfileAfter((t) => t.replace("COPY --from=cpu-build", "COPY --from=build")),
    /stage cpu: must copy its binaries from stage cpu-build, not build/,
  );
  assert.match(
    dockerfileAfter((t) => t.replace(/^RUN \["\/usr\/local\/bin\/matmul-server", "--version"\]\n/m, "")),
    /stage cpu: must RUN \["\/usr\/local\/bin\/matmul-server", "--version"\]/,
  );
  assert.match(dockerfileAfter((t) => t.replace("MATMUL_ENGINE=host", "MATMUL_ENGINE=cuda")), /stage cpu: MATMUL_ENGINE=cuda in an image without the CUDA engine/);
  // The cpu target moved to the end: a plain build would make the CPU image.
  const moved = (t) => {
    const cpu = /# -+ target: cpu\n[\s\S]*?(?=# -+ target: cuda)/.exec(t)[0];
    return t.replace(cpu, "") + "\n" + cpu;
  };
  const text = dockerfileAfter(moved);
  assert.match(text, /the last stage \(the default target\) must be cuda, not cpu/);
  assert.match(text, /stages must come in the order build, cpu-build, cpu, cuda/);
  assert.match(dockerfileAfter((t) => t.replace(/ AS cpu-build$/m, " AS compile")), /no stage named cpu-build[\s\S]*stage compile: not one of the stages/);
});

test("Dockerfile: the build stages' install mode has no test tools", () => {
  assert.match(
    dockerfileAfter(
      (t) => t + "\n",
      (deps) => deps.replace(/^compile_pkgs=\(\n/m, "compile_pkgs=(\n  prometheus python3-pytest libgtest-dev\n"),
    ),
    /install-deps.sh --compile installs what the build does not need: prometheus python3-pytest libgtest-dev/,
  );
  assert.match(
    dockerfileAfter((t) => t + "\n", (deps) => deps.replace(/^compile_pkgs=/m, "build_only_pkgs=")),
    /scripts\/install-deps.sh has no compile_pkgs/,
  );
});
