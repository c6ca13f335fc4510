#!/usr/bin/env node
// What the repository's Dockerfile must keep, beyond dockerfile-utils' lint
// (scripts/check-deploy.sh runs both):
//   - two or more stages, all on nvidia/cuda 13.0.x Ubuntu 24.04 images
//     pinned to one patch release: devel to build, runtime to run;
//   - dependencies installed only by scripts/install-deps.sh: the default
//     mode in the build stage, --runtime in the final one;
//   - the final stage runs as a numeric non-root USER, exposes 50051 and
//     9464, and has ENTRYPOINT ["/usr/local/bin/matmul-server"] in exec
//     form (so that docker run arguments and MATMUL_* variables are flags);
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

export function dockerfileProblems(file = join(repoRoot, "Dockerfile")) {
  const problems = [];
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
      const flags = typeof ins.getFlags === "function" ? ins.getFlags().map((f) => f.getName()) : [];
      stages.at(-1).ins.push({ keyword, values, flags, raw: ins.getRawArgumentsContent() ?? "" });
    }
  }
  if (stages.length < 2) problems.push("want a build stage and a runtime stage");
  const expand = (s) => s.replace(/\$\{?([A-Za-z_][A-Za-z0-9_]*)\}?/g, (_, k) => args.get(k) ?? `<unset ${k}>`);
  const image = /^nvidia\/cuda:(13\.0\.\d+)-(devel|runtime)-ubuntu24\.04$/;
  const versions = new Set();
  stages.forEach((s, i) => {
    const m = image.exec(expand(s.from));
    if (!m) {
      problems.push(`stage ${i + 1}: ${s.from} is not a pinned nvidia/cuda:13.0.x-{devel,runtime}-ubuntu24.04 image`);
      return;
    }
    versions.add(m[1]);
    const last = i === stages.length - 1;
    if (last !== (m[2] === "runtime")) {
      problems.push(`stage ${i + 1}: ${last ? "the final stage must use the runtime image" : "build stages use the devel image"}`);
    }
  });
  if (versions.size > 1) problems.push(`stages use different CUDA releases: ${[...versions].join(", ")}`);

  stages.forEach((s, i) => {
    const last = i === stages.length - 1;
    for (const r of s.ins.filter((x) => x.keyword === "RUN")) {
      if (/\bapt(-get)?\s+install\b|\bpip3?\s+install\b|\bnpm\s+(i|install|ci)\b/.test(r.raw)) {
        problems.push(`stage ${i + 1}: install packages with scripts/install-deps.sh, not: ${r.raw.trim()}`);
      }
    }
    const installs = s.ins.filter((x) => x.keyword === "RUN" && /install-deps\.sh/.test(x.raw));
    const wantMode = last ? /install-deps\.sh\s+--runtime\b/ : /install-deps\.sh(\s*$|\s*&&|\s+--all\b)/;
    if (installs.length === 0 || !installs.some((x) => wantMode.test(x.raw))) {
      problems.push(`stage ${i + 1}: must run scripts/install-deps.sh${last ? " --runtime" : ""}`);
    }
  });

  const final = stages.at(-1)?.ins ?? [];
  const user = final.filter((x) => x.keyword === "USER").at(-1)?.values[0];
  if (!user || !/^[1-9][0-9]*(:[0-9]+)?$/.test(user)) {
    problems.push(`final stage: USER must be a numeric non-root uid, not ${user ?? "unset"}`);
  }
  const exposed = new Set(final.filter((x) => x.keyword === "EXPOSE").flatMap((x) => x.values.map((v) => v.split("/")[0])));
  for (const p of ["50051", "9464"]) if (!exposed.has(p)) problems.push(`final stage: EXPOSE ${p} missing`);
  const entry = final.filter((x) => x.keyword === "ENTRYPOINT").at(-1);
  let entryJson = null;
  try {
    entryJson = entry ? JSON.parse(entry.raw) : null;
  } catch {
    entryJson = null;
  }
  if (!Array.isArray(entryJson) || entryJson[0] !== "/usr/local/bin/matmul-server") {
    problems.push(`final stage: ENTRYPOINT must be the exec form ["/usr/local/bin/matmul-server", ...]`);
  }
  if (final.some((x) => x.keyword === "CMD" && !/^\s*\[/.test(x.raw))) {
    problems.push("final stage: CMD in shell form would not reach matmul-server as flags");
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
      if (c.flags.includes("from")) continue;
      const sources = c.values.slice(0, -1);
      for (const src of sources) {
        const rel = src.replace(/^\.\/?/, "").replace(/\/$/, "");
        if (rel === "") continue;
        if (!existsSync(join(repoRoot, rel))) problems.push(`COPY ${src}: no such file in the repository`);
        else if (ignored(rel)) problems.push(`COPY ${src}: excluded by .dockerignore`);
      }
    }
  }
  for (const needed of ["CMakeLists.txt", "scripts/install-deps.sh", "server", "gpu", "proto"]) {
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
