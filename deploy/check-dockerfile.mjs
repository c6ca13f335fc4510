#!/usr/bin/env node
// What the repository's Dockerfile must keep, beyond dockerfile-utils' lint
// (scripts/check-deploy.sh runs both):
//   - the stages "build" and "cuda" on nvidia/cuda ubuntu24.04 images
//     (devel to build, runtime to run) whose release is the global ARG
//     CUDA_VERSION, by default a pinned 13.0.x; "cpu-build" and "cpu" on
//     debian:${DEBIAN_VERSION}-slim, a pinned Debian 12 point release;
//     "cuda" last, so that a plain `docker build` makes the CUDA image;
//   - dependencies installed only by scripts/install-deps.sh: --compile in
//     the build stages (a mode that lists no test tools, Python,
//     Prometheus, Node or plotting libraries), --runtime in the final ones;
//   - the build stages configure with -DMATMUL_CUDA=ON and OFF
//     respectively and build matmul-server; each final stage copies from its
//     own build stage and runs `matmul-server --version`;
//   - both final stages run as a numeric non-root USER, expose 50051 and
//     9464, and have ENTRYPOINT ["/usr/local/bin/matmul-server"] in exec
//     form (so that docker run arguments and MATMUL_* variables are flags);
//     the cpu stage does not ask for the CUDA engine;
//   - every MATMUL_* ENV is a variable the server reads;
//   - every file COPY takes from the context exists and is not excluded by
//     .dockerignore.
//
//   node deploy/check-dockerfile.mjs [Dockerfile]
import { createRequire } from "node:module";
import { existsSync, readFileSync } from "node:fs";
import { join, resolve } from "node:path";
import { pathToFileURL } from "node:url";
import { knownEnvVars, repoRoot } from "./validate.mjs";

const require = createRequire(join(repoRoot, "tools", "package.json"));
const { DockerfileParser } = require("dockerfile-ast");

// .dockerignore patterns as predicates over context-relative paths
// (Go filepath.Match with "**", "!" exceptions, last match wins).
function dockerignore(file) {
  if (!existsSync(file)) return () => false;
  const rules = readFileSync(file, "utf8")
    .split("\n")
    .map((l) => l.trim())
    .filter((l) => l && !l.startsWith("#"))
    .map((l) => {
      const negate = l.startsWith("!");
      const pattern = (negate ? l.slice(1) : l).replace(/^\/+|\/+$/g, "");
      let re = "";
      for (let i = 0; i < pattern.length; i++) {
        const ch = pattern[i];
        if (ch === "*" && pattern[i + 1] === "*") {
          re += ".*";
          i++;
          if (pattern[i + 1] === "/") i++;
        } else if (ch === "*") re += "[^/]*";
        else if (ch === "?") re += "[^/]";
        else re += ch.replace(/[.+^${}()|[\]\\]/g, "\\$&");
      }
      return { negate, re: new RegExp(`^${re}(/.*)?$`) };
    });
  return (path) => {
    let excluded = false;
    for (const r of rules) if (r.re.test(path)) excluded = !r.negate;
    return excluded;
  };
}

// The stages each target needs, in the order they must appear.
export const STAGES = {
  build: { image: "cuda-devel", install: "--compile", cuda: "ON" },
  "cpu-build": { image: "debian", install: "--compile", cuda: "OFF" },
  cpu: { image: "debian", install: "--runtime", from: "cpu-build", final: true },
  cuda: { image: "cuda-runtime", install: "--runtime", from: "build", final: true },
};
// What the build stages must not install (scripts/install-deps.sh --compile).
const NOT_FOR_COMPILING = /^(prometheus|python3.*|nodejs|npm|libgtest-dev|libgmock-dev|clang-format|shellcheck|clang-\d+|libclang-rt-.*|openssl|curl|git)$/;

// The packages of one mode of scripts/install-deps.sh (its NAME_pkgs array).
export function installDepsPackages(name, file = join(repoRoot, "scripts/install-deps.sh")) {
  const m = new RegExp(`^${name}_pkgs=\\(([^)]*)\\)`, "m").exec(readFileSync(file, "utf8"));
  return m ? m[1].split(/\s+/).filter(Boolean) : null;
}

export function parseDockerfile(file = join(repoRoot, "Dockerfile")) {
  const df = DockerfileParser.parse(readFileSync(file, "utf8"));
  const args = new Map();
  const stages = [];
  for (const ins of df.getInstructions()) {
    const keyword = ins.getKeyword();
    const values = ins.getArguments().map((a) => a.getValue());
    if (keyword === "FROM") {
      stages.push({ from: values[0], name: values[2] ?? null, ins: [] });
    } else if (stages.length === 0) {
      if (keyword === "ARG") {
        const [k, v] = values[0].split("=");
        args.set(k, v);
      }
    } else {
      const flags = typeof ins.getFlags === "function" ? ins.getFlags().map((f) => ({ name: f.getName(), value: f.getValue() })) : [];
      stages.at(-1).ins.push({ keyword, values, flags, raw: ins.getRawArgumentsContent() ?? "" });
    }
  }
  return { args, stages };
}

export function dockerfileProblems(file = join(repoRoot, "Dockerfile"), installDeps = join(repoRoot, "scripts/install-deps.sh")) {
  const problems = [];
  const { args, stages } = parseDockerfile(file);
  const expand = (s) => s.replace(/\$\{?([A-Za-z_][A-Za-z0-9_]*)\}?/g, (_, k) => args.get(k) ?? `<unset ${k}>`);

  // Global ARGs: the releases a plain build uses.
  const cudaVersion = args.get("CUDA_VERSION");
  if (!/^13\.0\.\d+$/.test(cudaVersion ?? "")) {
    problems.push(`ARG CUDA_VERSION=${cudaVersion ?? ""}: the default must be a pinned 13.0.x release (other releases: --build-arg)`);
  }
  if (!/^12\.\d+$/.test(args.get("DEBIAN_VERSION") ?? "")) {
    problems.push(`ARG DEBIAN_VERSION=${args.get("DEBIAN_VERSION") ?? ""}: want a pinned Debian 12 point release (12.N)`);
  }

  // Stages: each one the targets need, in order, on its image.
  const names = stages.map((s) => s.name);
  const order = Object.keys(STAGES);
  for (const name of order) {
    if (!names.includes(name)) problems.push(`no stage named ${name}`);
  }
  const present = order.filter((n) => names.includes(n));
  const positions = present.map((n) => names.indexOf(n));
  if (positions.some((p, i) => i > 0 && p < positions[i - 1])) {
    problems.push(`stages must come in the order ${order.join(", ")}`);
  }
  if (stages.length > 0 && stages.at(-1).name !== "cuda") {
    problems.push(`the last stage (the default target) must be cuda, not ${stages.at(-1).name ?? "unnamed"}`);
  }
  const images = {
    "cuda-devel": { re: /^nvidia\/cuda:\$\{CUDA_VERSION\}-devel-ubuntu24\.04$/, text: "nvidia/cuda:${CUDA_VERSION}-devel-ubuntu24.04" },
    "cuda-runtime": { re: /^nvidia\/cuda:\$\{CUDA_VERSION\}-runtime-ubuntu24\.04$/, text: "nvidia/cuda:${CUDA_VERSION}-runtime-ubuntu24.04" },
    debian: { re: /^debian:\$\{DEBIAN_VERSION\}-slim$/, text: "debian:${DEBIAN_VERSION}-slim" },
  };
  stages.forEach((s, i) => {
    const want = STAGES[s.name];
    const label = `stage ${s.name ?? i + 1}`;
    if (!want) {
      problems.push(`${label}: not one of the stages ${order.join(", ")}`);
      return;
    }
    if (!images[want.image].re.test(s.from)) {
      problems.push(`${label}: FROM ${s.from} (${expand(s.from)}), want ${images[want.image].text}`);
    }

    const runs = s.ins.filter((x) => x.keyword === "RUN");
    for (const r of runs) {
      if (/\bapt(-get)?\s+install\b|\bpip3?\s+install\b|\bnpm\s+(i|install|ci)\b/.test(r.raw)) {
        problems.push(`${label}: install packages with scripts/install-deps.sh, not: ${r.raw.trim()}`);
      }
    }
    const installs = runs.filter((x) => /install-deps\.sh/.test(x.raw));
    const modeRe = new RegExp(`install-deps\\.sh\\s+${want.install}(\\s|$)`);
    if (installs.length !== 1 || !modeRe.test(installs[0].raw)) {
      problems.push(`${label}: must run scripts/install-deps.sh ${want.install} once (found: ${installs.map((x) => x.raw.trim()).join("; ") || "none"})`);
    }

    if (want.cuda) {
      const cmake = runs.find((x) => /\bcmake\s+-S\b/.test(x.raw));
      if (!cmake || !new RegExp(`-DMATMUL_CUDA=${want.cuda}\\b`).test(cmake.raw)) {
        problems.push(`${label}: must configure with -DMATMUL_CUDA=${want.cuda}`);
      }
      if (!cmake || !/--target\s+(\S+\s+)*matmul-server\b/.test(cmake.raw)) {
        problems.push(`${label}: must build matmul-server`);
      }
      if (cmake && !/-DBUILD_TESTING=OFF\b/.test(cmake.raw)) {
        problems.push(`${label}: build with -DBUILD_TESTING=OFF (the context has no tests/)`);
      }
    }

    if (!want.final) return;
    const fromStages = s.ins.filter((x) => x.keyword === "COPY").flatMap((x) => x.flags.filter((f) => f.name === "from").map((f) => f.value));
    if (!fromStages.includes(want.from) || fromStages.some((f) => f !== want.from)) {
      problems.push(`${label}: must copy its binaries from stage ${want.from}, not ${fromStages.join(", ") || "nothing"}`);
    }
    if (!runs.some((x) => /^\s*\[\s*"\/usr\/local\/bin\/matmul-server"\s*,\s*"--version"\s*\]/.test(x.raw))) {
      problems.push(`${label}: must RUN ["/usr/local/bin/matmul-server", "--version"] (a missing library fails the build)`);
    }
    const user = s.ins.filter((x) => x.keyword === "USER").at(-1)?.values[0];
    if (!user || !/^[1-9][0-9]*(:[0-9]+)?$/.test(user)) {
      problems.push(`${label}: USER must be a numeric non-root uid, not ${user ?? "unset"}`);
    }
    const exposed = new Set(s.ins.filter((x) => x.keyword === "EXPOSE").flatMap((x) => x.values.map((v) => v.split("/")[0])));
    for (const p of ["50051", "9464"]) if (!exposed.has(p)) problems.push(`${label}: EXPOSE ${p} missing`);
    const entry = s.ins.filter((x) => x.keyword === "ENTRYPOINT").at(-1);
    let entryJson = null;
    try {
      entryJson = entry ? JSON.parse(entry.raw) : null;
    } catch {
      entryJson = null;
    }
    if (!Array.isArray(entryJson) || entryJson[0] !== "/usr/local/bin/matmul-server") {
      problems.push(`${label}: ENTRYPOINT must be the exec form ["/usr/local/bin/matmul-server", ...]`);
    }
    if (s.ins.some((x) => x.keyword === "CMD" && !/^\s*\[/.test(x.raw))) {
      problems.push(`${label}: CMD in shell form would not reach matmul-server as flags`);
    }
    if (want.image === "debian") {
      const engine = s.ins.filter((x) => x.keyword === "ENV").flatMap((x) => x.values).find((v) => v.startsWith("MATMUL_ENGINE="));
      if (engine && engine !== "MATMUL_ENGINE=host" && engine !== "MATMUL_ENGINE=auto") {
        problems.push(`${label}: ${engine} in an image without the CUDA engine`);
      }
    }
  });

  // The build stages' install mode installs only what compiling needs.
  const compile = installDepsPackages("compile", installDeps);
  if (!compile) {
    problems.push("scripts/install-deps.sh has no compile_pkgs (the --compile mode)");
  } else {
    const extra = compile.filter((p) => NOT_FOR_COMPILING.test(p));
    if (extra.length > 0) problems.push(`install-deps.sh --compile installs what the build does not need: ${extra.join(" ")}`);
  }

  const envVars = knownEnvVars();
  for (const s of stages) {
    for (const e of s.ins.filter((x) => x.keyword === "ENV")) {
      for (const v of e.values) {
        const name = v.split("=")[0];
        if (name.startsWith("MATMUL_") && !envVars.has(name)) {
          problems.push(`ENV ${name} is not a variable matmul-server reads`);
        }
      }
    }
  }

  const ignored = dockerignore(join(repoRoot, ".dockerignore"));
  for (const s of stages) {
    for (const c of s.ins.filter((x) => x.keyword === "COPY" || x.keyword === "ADD")) {
      if (c.flags.some((f) => f.name === "from")) continue;
      const sources = c.values.slice(0, -1);
      for (const src of sources) {
        const rel = src.replace(/^\.\/?/, "").replace(/\/$/, "");
        if (rel === "") continue;
        if (!existsSync(join(repoRoot, rel))) problems.push(`COPY ${src}: no such file in the repository`);
        else if (ignored(rel)) problems.push(`COPY ${src}: excluded by .dockerignore`);
      }
    }
  }
  for (const needed of ["CMakeLists.txt", "scripts/install-deps.sh", "server", "gpu", "proto", "common", "client"]) {
    if (ignored(needed)) problems.push(`.dockerignore excludes ${needed}, which the build needs`);
  }
  return problems;
}

if (process.argv[1] && import.meta.url === pathToFileURL(resolve(process.argv[1])).href) {
  const file = process.argv[2] ? resolve(process.argv[2]) : undefined;
  const problems = dockerfileProblems(file);
  for (const p of problems) console.log(`  FAIL Dockerfile: ${p}`);
  console.log(problems.length === 0 ? "Dockerfile: no problems" : `Dockerfile: ${problems.length} problem(s)`);
  process.exitCode = problems.length === 0 ? 0 : 1;
}
