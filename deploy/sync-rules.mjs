#!/usr/bin/env node
// Rewrites deploy/base/prometheusrule.yaml so that its spec.groups are the
// canonical rule groups of deploy/prometheus/ (every *.yml / *.yaml there
// with top-level "groups", or PrometheusRule objects, in file-name order).
// Run it after changing those rules; scripts/check-deploy.sh fails while
// the two differ.
//
//   node deploy/sync-rules.mjs
import { readFileSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { loadCanonicalGroups } from "./canonical-rules.mjs";
import { YAML, repoRoot } from "./validate.mjs";

const target = join(repoRoot, "deploy/base/prometheusrule.yaml");
const canonical = loadCanonicalGroups(join(repoRoot, "deploy/prometheus"), YAML);
if (!canonical) {
  console.error("sync-rules: no rule groups under deploy/prometheus/; nothing to do");
  process.exit(1);
}

// Keep the file's leading comment and the object's metadata; replace the
// groups.
const text = readFileSync(target, "utf8");
const header = text.slice(0, text.search(/^apiVersion:/m));
const rule = YAML.parse(text);
rule.spec = { ...rule.spec, groups: canonical.groups };
writeFileSync(target, header + YAML.stringify(rule, { lineWidth: 0 }));
console.log(
  `sync-rules: ${target} now holds ${canonical.groups.length} group(s) from ${canonical.files.join(", ")}`,
);
