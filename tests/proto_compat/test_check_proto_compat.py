"""Tests of proto/check_compat.py: deliberately broken variants of a
small API, written to a temporary folder, each of which it must report, and
compatible ones it must pass. protoc: $PROTOC, else PATH."""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import List

import pytest

_SCRIPT = Path(__file__).resolve().parents[2] / "proto" / "check_compat.py"
_spec = importlib.util.spec_from_file_location("check_proto_compat", _SCRIPT)
assert _spec and _spec.loader
check = importlib.util.module_from_spec(_spec)
sys.modules["check_proto_compat"] = check  # dataclasses look their module up
_spec.loader.exec_module(check)

PROTOC = os.environ.get("PROTOC") or shutil.which("protoc")
FILE = "demo/v1/demo.proto"

#: The released API every variant is compared with.
BASE = """syntax = "proto3";
package demo.v1;

service Demo {
  rpc Run(RunRequest) returns (RunResponse);
  rpc Watch(RunRequest) returns (stream RunResponse);
}
service Spare {
  rpc Ping(Shape) returns (Shape);
}

enum Kind {
  KIND_UNSPECIFIED = 0;
  KIND_A = 1;
  KIND_B = 2;
}
enum Unused {
  UNUSED_UNSPECIFIED = 0;
}

message Shape {
  repeated int64 dims = 1;
}

message RunRequest {
  message Inner {
    uint32 x = 1;
  }
  string name = 1;
  Shape shape = 2;
  Kind kind = 3;
  oneof source {
    bytes data = 4;
    string handle = 5;
  }
  optional int32 device = 6;
  Inner inner = 7;
}

message RunResponse {
  bytes data = 1;
}

message Extra {
  int32 a = 1;
}
"""


def _variant(*edits: tuple) -> str:
    """BASE with each (old, new) replaced once; every old must be there."""
    text = BASE
    for old, new in edits:
        assert text.count(old) == 1, f"{old!r} is not in BASE exactly once"
        text = text.replace(old, new)
    return text


def _write(root: Path, text: str) -> Path:
    (root / FILE).parent.mkdir(parents=True, exist_ok=True)
    (root / FILE).write_text(text)
    return root


def _breaking(tmp_path: Path, text: str) -> List[str]:
    old = check.compile_descriptors(PROTOC, _write(tmp_path / "released", BASE), [FILE])
    new = check.compile_descriptors(PROTOC, _write(tmp_path / "current", text), [FILE])
    return check.compare(old, new, [FILE]).breaking


@pytest.fixture(autouse=True)
def _needs_protoc() -> None:
    assert PROTOC, "protoc not found: set PROTOC or put it on PATH"


BREAKING = {
    "field removed": (("  Kind kind = 3;\n", ""), 'field 3 "kind" removed'),
    "field removed, number reserved": (("  Kind kind = 3;\n", "  reserved 3;\n"), 'field 3 "kind" removed (its number reserved'),
    "field renumbered": (("string name = 1;", "string name = 8;"), 'field 1 "name" moved to number 8'),
    "field renamed": (("string name = 1;", "string title = 1;"), 'field 1 "name" renamed to "title"'),
    "field message type": (("Shape shape = 2;", "RunResponse shape = 2;"), "changed type from demo.v1.Shape to demo.v1.RunResponse"),
    "field scalar type": (("  bytes data = 1;\n}", "  string data = 1;\n}"), 'RunResponse: field 1 "data" changed type from bytes to string'),
    "field enum to int": (("Kind kind = 3;", "int32 kind = 3;"), "changed type from demo.v1.Kind to int32"),
    "field cardinality": (("repeated int64 dims = 1;", "int64 dims = 1;"), 'field 1 "dims" changed from repeated to singular'),
    "field presence": (("optional int32 device = 6;", "int32 device = 6;"), 'field 6 "device" lost explicit presence'),
    "field out of oneof": (("    string handle = 5;\n  }", "  }\n  string handle = 5;"), 'field 5 "handle" moved from oneof source to oneof None'),
    "field json name": (("string name = 1;", 'string name = 1 [json_name = "label"];'), "changed JSON name from name to label"),
    "nested field": (("uint32 x = 1;", "int64 x = 1;"), "message demo.v1.RunRequest.Inner: field 1 \"x\" changed type from uint32 to int64"),
    "message removed": (("message Extra {\n  int32 a = 1;\n}\n", ""), "message demo.v1.Extra removed"),
    "enum value removed": (("  KIND_B = 2;\n", ""), "enum demo.v1.Kind: value 2 KIND_B removed"),
    "enum value renumbered": (("KIND_B = 2;", "KIND_B = 3;"), "value 2 KIND_B renumbered to 3"),
    "enum value renamed": (("KIND_B = 2;", "KIND_C = 2;"), "value 2 KIND_B renamed to KIND_C"),
    "enum removed": (("enum Unused {\n  UNUSED_UNSPECIFIED = 0;\n}\n", ""), "enum demo.v1.Unused removed"),
    "method removed": (("  rpc Watch(RunRequest) returns (stream RunResponse);\n", ""), "service demo.v1.Demo: method Watch removed"),
    "method request type": (("rpc Run(RunRequest)", "rpc Run(Shape)"), "method Run changed its request type from demo.v1.RunRequest to demo.v1.Shape"),
    "method response type": (("returns (RunResponse);", "returns (Shape);"), "method Run changed its response type"),
    "method no longer streaming": (("returns (stream RunResponse)", "returns (RunResponse)"), "method Watch is no longer server-streaming"),
    "method becomes streaming": (("rpc Run(RunRequest)", "rpc Run(stream RunRequest)"), "method Run became client-streaming"),
    "service removed": (("service Spare {\n  rpc Ping(Shape) returns (Shape);\n}\n", ""), "service demo.v1.Spare removed"),
    "package changed": (("package demo.v1;", "package demo.v2;"), "package changed from demo.v1 to demo.v2"),
}


@pytest.mark.parametrize("case", sorted(BREAKING))
def test_breaking_change_is_reported(tmp_path: Path, case: str) -> None:
    edit, expected = BREAKING[case]
    breaking = _breaking(tmp_path, _variant(edit))
    assert any(expected in line for line in breaking), breaking
    assert all(line.startswith(f"{FILE}: ") for line in breaking), breaking


COMPATIBLE = {
    "unchanged": (),
    "comments and layout": (("message Shape {\n", "// A shape.\nmessage Shape {\n\n"),),
    "field added": (("  Inner inner = 7;\n", "  Inner inner = 7;\n  string note = 9;\n"),),
    "field added to the oneof": (("    string handle = 5;\n", "    string handle = 5;\n    int64 id = 10;\n"),),
    "message added": (("message Extra {", "message Later {\n  bool b = 1;\n}\nmessage Extra {"),),
    "enum value added": (("  KIND_B = 2;\n", "  KIND_B = 2;\n  KIND_C = 3;\n"),),
    "method added": (("  rpc Run(", "  rpc Check(Shape) returns (Shape);\n  rpc Run("),),
    "service added": (("service Spare {", "service Other {\n  rpc Ping(Shape) returns (Shape);\n}\nservice Spare {"),),
    "deprecated field": (("string name = 1;", "string name = 1 [deprecated = true];"),),
}


@pytest.mark.parametrize("case", sorted(COMPATIBLE))
def test_compatible_change_passes(tmp_path: Path, case: str) -> None:
    assert _breaking(tmp_path, _variant(*COMPATIBLE[case])) == []


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(_SCRIPT), "--protoc", PROTOC, *args],
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def test_command_exit_status_and_report(tmp_path: Path) -> None:
    released = _write(tmp_path / "released", BASE)
    same = _write(tmp_path / "same", BASE)
    broken = _write(tmp_path / "broken", _variant(("  KIND_B = 2;\n", ""), ("  Kind kind = 3;\n", "")))

    ok = _run("--against", str(released), "--current", str(same), FILE)
    assert ok.returncode == 0, ok.stdout
    assert "compatible" in ok.stdout and "(5 messages, 11 fields, 2 enums, 3 methods checked)" in ok.stdout

    bad = _run("--against", str(released), "--current", str(broken), FILE)
    assert bad.returncode == 1, bad.stdout
    lines = [line for line in bad.stdout.splitlines() if line.startswith("breaking: ")]
    assert len(lines) == 2, bad.stdout
    assert "2 breaking changes" in bad.stdout


def test_a_file_that_does_not_compile_is_an_error_not_a_pass(tmp_path: Path) -> None:
    released = _write(tmp_path / "released", BASE)
    broken = _write(tmp_path / "broken", BASE.replace("message Shape {", "message Shape {{"))
    result = _run("--against", str(released), "--current", str(broken), FILE)
    assert result.returncode == 2, result.stdout
    assert "protoc failed" in result.stdout

    missing = _run("--against", str(released), "--current", str(tmp_path / "nowhere"), FILE)
    assert missing.returncode == 2 and "no such file" in missing.stdout


def test_the_project_api_is_compatible_with_itself() -> None:
    root = Path(check.ROOT) / "proto"
    descriptors = check.compile_descriptors(PROTOC, root, list(check.DEFAULT_FILES))
    report = check.compare(descriptors, descriptors, list(check.DEFAULT_FILES))
    assert report.breaking == []
    assert report.checked["messages"] > 10 and report.checked["methods"] >= 6, report.checked
