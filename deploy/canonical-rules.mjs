// The canonical Prometheus rules live in deploy/prometheus/ (plain rule
// files with top-level "groups", or PrometheusRule objects). The
// PrometheusRule that kustomize deploys (deploy/base/prometheusrule.yaml)
// must carry the same groups: validate.mjs compares them and
// sync-rules.mjs rewrites the kustomize copy from them.
import { readFileSync, readdirSync, existsSync } from "node:fs";
import { join } from "node:path";

// Returns { files, groups } for the rule files in `dir` (file-name order),
// or null when the directory holds none. Files without rule groups (for
// example promtool unit-test files) are skipped.
export function loadCanonicalGroups(dir, YAML) {
  if (!existsSync(dir)) return null;
  const files = readdirSync(dir)
    .filter((f) => /\.ya?ml$/.test(f))
    .sort();
  const used = [];
  const groups = [];
  for (const f of files) {
    for (const doc of YAML.parseAllDocuments(readFileSync(join(dir, f), "utf8"))) {
      const value = doc.toJS();
      if (!value || typeof value !== "object") continue;
      const found =
        value.kind === "PrometheusRule" ? value.spec?.groups : value.groups;
      if (!Array.isArray(found)) continue;
      groups.push(...found);
      if (!used.includes(f)) used.push(f);
    }
  }
  return used.length > 0 ? { files: used, groups } : null;
}

// Deep equality for parsed YAML (plain objects, arrays, scalars).
export function sameValue(a, b) {
  if (a === b) return true;
  if (typeof a !== typeof b || a === null || b === null) return false;
  if (Array.isArray(a) !== Array.isArray(b)) return false;
  if (Array.isArray(a)) {
    return a.length === b.length && a.every((x, i) => sameValue(x, b[i]));
  }
  if (typeof a !== "object") return false;
  const ka = Object.keys(a).sort();
  const kb = Object.keys(b).sort();
  return sameValue(ka, kb) && ka.every((k) => sameValue(a[k], b[k]));
}
