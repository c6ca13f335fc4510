"""docs/ARCHITECTURE.md's tables name the files of the tree: each path in
backticks that looks like one (a slash and a known top-level folder, or a
top-level file) must exist, so that the map does not drift from the tree
when files move."""

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
TOP = {p.name for p in REPO.iterdir() if not p.name.startswith(".")}


def named_paths(text: str):
    for token in re.findall(r"`([^`\s]+)`", text):
        token = token.rstrip(".,;:")
        first = token.split("/", 1)[0]
        if "/" not in token or first not in TOP or any(c in token for c in "*<>{}|$="):
            continue
        yield token


def test_every_path_architecture_names_exists():
    text = (REPO / "docs" / "ARCHITECTURE.md").read_text()
    paths = sorted(set(named_paths(text)))
    assert len(paths) >= 20, paths
    missing = [p for p in paths if not (REPO / p).exists()]
    assert not missing, f"docs/ARCHITECTURE.md names paths that do not exist: {missing}"
