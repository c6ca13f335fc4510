// Tests of scripts/build-image.sh, run in a scratch git repository that
// holds copies of the script, the Dockerfile, CMakeLists.txt and
// deploy/base: the docker commands its --dry-run prints, the tag it derives
// from the project version and the commit, the images: entry it writes (the
// rendered base then runs that image and passes validate.mjs), and the
// arguments and trees it refuses. Needs no docker. Run by
// scripts/check-deploy.sh (node --test tests/deploy/).
import { test } from "node:test";
import assert from "node:assert/strict";
import { execFileSync, spawnSync } from "node:child_process";
import { cpSync, mkdirSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { YAML, repoRoot, defaultContext, policyProblems, projectVersion } from "../../deploy/validate.mjs";

const version = projectVersion();

// A scratch repository with one commit; returns its path and short commit.
function scratch() {
  const dir = mkdtempSync(join(tmpdir(), "build-image-"));
  mkdirSync(join(dir, "scripts"));
  mkdirSync(join(dir, "deploy"));
  cpSync(join(repoRoot, "scripts/build-image.sh"), join(dir, "scripts/build-image.sh"));
  cpSync(join(repoRoot, "Dockerfile"), join(dir, "Dockerfile"));
  cpSync(join(repoRoot, "CMakeLists.txt"), join(dir, "CMakeLists.txt"));
  cpSync(join(repoRoot, "deploy/base"), join(dir, "deploy/base"), { recursive: true });
  const git = (...args) => execFileSync("git", args, { cwd: dir, encoding: "utf8" }).trim();
  git("init", "-q");
  git("config", "user.name", "test");
  git("config", "user.email", "test@localhost");
  git("add", ".");
  git("commit", "-q", "-m", "scratch");
  return { dir, commit: git("rev-parse", "--short=12", "HEAD"), revision: git("rev-parse", "HEAD") };
}

function buildImage(dir, ...args) {
  const r = spawnSync("bash", [join(dir, "scripts/build-image.sh"), ...args], { cwd: dir, encoding: "utf8" });
  return { status: r.status, out: r.stdout, err: r.stderr };
}

const kustomization = (dir) => readFileSync(join(dir, "deploy/base/kustomization.yaml"), "utf8");

function renderBase(dir) {
  const base = join(dir, "deploy/base");
  let text;
  try {
    text = execFileSync("kubectl", ["kustomize", base], { encoding: "utf8" });
  } catch {
    text = execFileSync("kustomize", ["build", base], { encoding: "utf8" });
  }
  return YAML.parseAllDocuments(text).map((d) => d.toJS()).filter(Boolean);
}

test("dry run: the build command, the tag, and the edit it would make; nothing changes", () => {
  const { dir, commit, revision } = scratch();
  try {
    const before = kustomization(dir);
    const r = buildImage(dir, "--dry-run");
    assert.equal(r.status, 0, r.err);
    const tag = `matmul-server:${version}-${commit}`;
    assert.match(
      r.out,
      new RegExp(
        `^\\+ env DOCKER_BUILDKIT=1 docker build --file Dockerfile --target cuda --build-arg IMAGE_VERSION=${version} --build-arg GIT_COMMIT=${commit} ` +
          `--label org.opencontainers.image.version=${version} --label org.opencontainers.image.revision=${revision} ` +
          `--tag ${tag} \\.$`,
        "m",
      ),
    );
    assert.doesNotMatch(r.out, /docker push/);
    assert.match(r.out, new RegExp(`^\\+    newTag: ${version}-${commit}$`, "m"));
    assert.equal(kustomization(dir), before);

    const cpu = buildImage(dir, "--dry-run", "--target", "cpu");
    assert.equal(cpu.status, 0, cpu.err);
    assert.match(cpu.out, new RegExp(`--target cpu .*--tag matmul-server:${version}-${commit}-cpu \\.`));
    assert.match(cpu.out, /the manifests run the cuda target/);

    const cuda12 = buildImage(dir, "--dry-run", "--cuda-version", "12.9.1", "--image", "registry.example.com:5000/ml/matmul-server", "--push");
    assert.equal(cuda12.status, 0, cuda12.err);
    const ref = `registry.example.com:5000/ml/matmul-server:${version}-${commit}-cuda12.9.1`;
    assert.match(cuda12.out, new RegExp(`--build-arg CUDA_VERSION=12\\.9\\.1 .*--tag ${ref} \\.`));
    assert.match(cuda12.out, new RegExp(`^\\+ docker push ${ref}$`, "m"));
    assert.equal(kustomization(dir), before);
  } finally {
    rmSync(dir, { recursive: true });
  }
});

test("the manifest gets the tag: the rendered base runs it and passes validate.mjs", () => {
  const { dir, commit } = scratch();
  try {
    const r = buildImage(dir, "--manifest-only", "--image", "registry.example.com/ml/matmul-server");
    assert.equal(r.status, 0, r.err);
    const text = kustomization(dir);
    assert.match(text, /^# The image the Dockerfile/m, "comments stay");
    const images = YAML.parse(text).images;
    assert.deepEqual(images, [
      { name: "matmul", newName: "registry.example.com/ml/matmul-server", newTag: `${version}-${commit}` },
    ]);
    const docs = renderBase(dir);
    const server = docs.find((d) => d.kind === "Deployment").spec.template.spec.containers.find((c) => c.name === "server");
    assert.equal(server.image, `registry.example.com/ml/matmul-server:${version}-${commit}`);
    assert.deepEqual(policyProblems(docs, defaultContext()), []);
    // Twice gives the same file: the entry is replaced, not appended to.
    assert.equal(buildImage(dir, "--manifest-only", "--image", "registry.example.com/ml/matmul-server").status, 0);
    assert.equal(kustomization(dir), text);
  } finally {
    rmSync(dir, { recursive: true });
  }
});

test("validate.mjs refuses an image tag the build did not write", () => {
  const { dir, commit } = scratch();
  try {
    const docs = renderBase(dir);
    const ctx = defaultContext();
    const server = (d) => d.find((x) => x.kind === "Deployment").spec.template.spec.containers.find((c) => c.name === "server");
    const withImage = (image) => {
      const copy = structuredClone(docs);
      server(copy).image = image;
      return policyProblems(copy, ctx).join("\n");
    };
    assert.equal(withImage(`matmul-server:${version}-${commit}@sha256:${"ab".repeat(32)}`), "");
    assert.match(withImage("matmul-server:latest"), /image matmul-server:latest is not NAME:<version>-<commit>/);
    assert.match(withImage(`matmul-server:${version}-${commit}-dirty`), /is not NAME:<version>-<commit>/);
    assert.match(withImage(`matmul-server:0.0.1-${commit}`), new RegExp(`is version 0\\.0\\.1, CMakeLists.txt says ${version.replaceAll(".", "\\.")}`));
  } finally {
    rmSync(dir, { recursive: true });
  }
});

test("a dirty tree: refused, or built as -dirty with the manifest left alone", () => {
  const { dir, commit } = scratch();
  try {
    writeFileSync(join(dir, "CMakeLists.txt"), readFileSync(join(dir, "CMakeLists.txt"), "utf8") + "\n# local change\n");
    const before = kustomization(dir);
    const refused = buildImage(dir, "--dry-run");
    assert.equal(refused.status, 2);
    assert.match(refused.err, /uncommitted changes outside deploy\/[\s\S]*CMakeLists.txt/);
    const dirty = buildImage(dir, "--dry-run", "--allow-dirty");
    assert.equal(dirty.status, 0, dirty.err);
    assert.match(dirty.out, new RegExp(`--tag matmul-server:${version}-${commit}-dirty \\.`));
    assert.match(dirty.out, /a -dirty tag names no commit/);
    assert.equal(buildImage(dir, "--manifest-only", "--allow-dirty").status, 2);
    assert.equal(kustomization(dir), before);
    // Changes under deploy/ are not in the image's context: not dirty.
    execFileSync("git", ["checkout", "-q", "CMakeLists.txt"], { cwd: dir });
    writeFileSync(join(dir, "deploy/base/kustomization.yaml"), before + "\n");
    assert.equal(buildImage(dir, "--dry-run").status, 0);
  } finally {
    rmSync(dir, { recursive: true });
  }
});

test("bad arguments and a manifest without the entry are refused", () => {
  const { dir } = scratch();
  try {
    const cases = [
      [["--target", "gpu"], /--target must be cuda or cpu/],
      [["--cuda-version", "12.4.1"], /want 13\.0\.x or 12\.N\.x with N >= 5/],
      [["--cuda-version", "13.1"], /want 13\.0\.x/],
      [["--target", "cpu", "--cuda-version", "12.9.1"], /--cuda-version applies to --target cuda only/],
      [["--image", "matmul-server:latest"], /is not a repository name/],
      [["--image", "Registry/Matmul"], /is not a repository name/],
      [["--bogus"], /unknown argument: --bogus/],
    ];
    for (const [args, message] of cases) {
      const r = buildImage(dir, "--dry-run", ...args);
      assert.equal(r.status, 2, `${args.join(" ")}: ${r.out}`);
      assert.match(r.err, message, args.join(" "));
    }
    const file = join(dir, "deploy/base/kustomization.yaml");
    writeFileSync(file, kustomization(dir).replace(/^images:[\s\S]*$/m, ""));
    execFileSync("git", ["commit", "-qam", "no images"], { cwd: dir });
    const r = buildImage(dir, "--dry-run");
    assert.equal(r.status, 2);
    assert.match(r.err, /has no images: entry '- name: matmul'/);
  } finally {
    rmSync(dir, { recursive: true });
  }
});
