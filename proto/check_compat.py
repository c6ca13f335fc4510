#!/usr/bin/env python3
"""Checks that the protobuf API breaks nothing against its last release.

    check_proto_compat.py [--protoc PROTOC] [--current ROOT] [--against ROOT]
                          [--against-ref GIT_REF] [FILE ...]

Compiles each FILE (default: matmul/v1/matmul.proto) twice with protoc
--descriptor_set_out: under --current (default: proto/, the API as it is) and
under --against (default: proto/released/, a copy of the last released API;
or, with --against-ref, the same path in a git commit or tag), and compares the
two descriptors. It reports as breaking what would break a client or a server
built from the released file, on the wire, in JSON, or in generated code (the
rules of buf's FILE category, which proto/buf.yaml names):

- a file, message, enum, enum value, service or method removed, or a file's
  package changed;
- a field removed (even with its number reserved), renumbered or renamed; its
  type, its label (singular, repeated), its presence (proto3 `optional`) or
  its oneof changed; its JSON name changed;
- an enum value renumbered or renamed;
- a method's request or response type, or its streaming, changed.

Additions are compatible: new fields, messages, enums, enum values, services
and methods. Exit status: 0 compatible, 1 breaking (each change on its own
line), 2 the files could not be read or compiled. Run from anywhere; paths
are relative to the checkout. protoc: --protoc, else $PROTOC, else PATH.
Needs google.protobuf (Debian: python3-protobuf).
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, Iterator, List, Optional, Sequence, Tuple

from google.protobuf import descriptor_pb2

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_FILES = ("matmul/v1/matmul.proto",)
Fdp = descriptor_pb2.FieldDescriptorProto


class CheckError(Exception):
    """The inputs could not be read or compiled (exit status 2)."""


def compile_descriptors(protoc: str, root: Path, files: Sequence[str]) -> descriptor_pb2.FileDescriptorSet:
    """protoc --descriptor_set_out for ``files`` (relative to ``root``)."""
    for name in files:
        if not (root / name).is_file():
            raise CheckError(f"{root / name}: no such file")
    with tempfile.TemporaryDirectory(prefix="proto-compat-") as scratch:
        out = Path(scratch) / "set.pb"
        result = subprocess.run(
            [protoc, f"--proto_path={root}", f"--descriptor_set_out={out}", *files],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        if result.returncode != 0:
            raise CheckError(f"protoc failed on {', '.join(files)} under {root}:\n{result.stdout.strip()}")
        descriptors = descriptor_pb2.FileDescriptorSet()
        descriptors.ParseFromString(out.read_bytes())
        return descriptors


@dataclass
class _Index:
    """Every message, enum and service of a set of files, by full name."""
    messages: Dict[str, descriptor_pb2.DescriptorProto] = field(default_factory=dict)
    enums: Dict[str, descriptor_pb2.EnumDescriptorProto] = field(default_factory=dict)
    services: Dict[str, descriptor_pb2.ServiceDescriptorProto] = field(default_factory=dict)
    file_of: Dict[str, str] = field(default_factory=dict)


def _nested(prefix: str, messages, enums) -> Iterator[Tuple[str, object]]:
    for enum in enums:
        yield f"{prefix}.{enum.name}", enum
    for message in messages:
        name = f"{prefix}.{message.name}"
        yield name, message
        yield from _nested(name, message.nested_type, message.enum_type)


def _index(descriptors: descriptor_pb2.FileDescriptorSet, files: Sequence[str]) -> _Index:
    index = _Index()
    for file in descriptors.file:
        if file.name not in files:
            continue
        prefix = f".{file.package}" if file.package else ""
        for name, item in _nested(prefix, file.message_type, file.enum_type):
            table = index.messages if isinstance(item, descriptor_pb2.DescriptorProto) else index.enums
            table[name] = item
            index.file_of[name] = file.name
        for service in file.service:
            index.services[f"{prefix}.{service.name}"] = service
            index.file_of[f"{prefix}.{service.name}"] = file.name
    return index


_TYPE_NAMES = {value: name[len("TYPE_"):].lower() for name, value in Fdp.Type.items()}


def _type(f: descriptor_pb2.FieldDescriptorProto) -> str:
    if f.type in (Fdp.TYPE_MESSAGE, Fdp.TYPE_ENUM, Fdp.TYPE_GROUP):
        return f.type_name.lstrip(".")
    return _TYPE_NAMES.get(f.type, str(f.type))


def _label(f: descriptor_pb2.FieldDescriptorProto) -> str:
    return {Fdp.LABEL_REPEATED: "repeated", Fdp.LABEL_REQUIRED: "required"}.get(f.label, "singular")


def _oneof(message: descriptor_pb2.DescriptorProto, f: descriptor_pb2.FieldDescriptorProto) -> Optional[str]:
    """The real oneof ``f`` belongs to (not proto3 optional's synthetic one)."""
    if not f.HasField("oneof_index") or f.proto3_optional:
        return None
    return message.oneof_decl[f.oneof_index].name


def _compare_message(name: str, old: descriptor_pb2.DescriptorProto,
                     new: descriptor_pb2.DescriptorProto) -> Iterator[str]:
    new_by_number = {f.number: f for f in new.field}
    new_by_name = {f.name: f for f in new.field}
    for of in old.field:
        where = f"message {name}: field {of.number} \"{of.name}\""
        nf = new_by_number.get(of.number)
        if nf is None:
            if of.name in new_by_name:
                yield f"{where} moved to number {new_by_name[of.name].number}"
                continue
            reserved = any(r.start <= of.number < r.end for r in new.reserved_range)
            yield f"{where} removed" + (" (its number reserved: safe on the wire, "
                                        "not for generated code or JSON)" if reserved else "")
            continue
        if nf.name != of.name:
            yield f"{where} renamed to \"{nf.name}\""
        if _type(nf) != _type(of):
            yield f"{where} changed type from {_type(of)} to {_type(nf)}"
        if _label(nf) != _label(of):
            yield f"{where} changed from {_label(of)} to {_label(nf)}"
        elif nf.proto3_optional != of.proto3_optional:
            yield (f"{where} " + ("gained" if nf.proto3_optional else "lost")
                   + " explicit presence (proto3 optional)")
        if _oneof(new, nf) != _oneof(old, of):
            yield f"{where} moved from oneof {_oneof(old, of)} to oneof {_oneof(new, nf)}"
        if nf.name == of.name and nf.json_name != of.json_name:
            yield f"{where} changed JSON name from {of.json_name} to {nf.json_name}"


def _compare_enum(name: str, old: descriptor_pb2.EnumDescriptorProto,
                  new: descriptor_pb2.EnumDescriptorProto) -> Iterator[str]:
    new_by_number = {v.number: v for v in new.value}
    new_by_name = {v.name: v for v in new.value}
    for ov in old.value:
        where = f"enum {name}: value {ov.number} {ov.name}"
        nv = new_by_number.get(ov.number)
        if nv is None:
            if ov.name in new_by_name:
                yield f"{where} renumbered to {new_by_name[ov.name].number}"
            else:
                yield f"{where} removed"
        elif ov.name not in {v.name for v in new.value if v.number == ov.number}:  # aliases
            yield f"{where} renamed to {nv.name}"


def _compare_service(name: str, old: descriptor_pb2.ServiceDescriptorProto,
                     new: descriptor_pb2.ServiceDescriptorProto) -> Iterator[str]:
    new_methods = {m.name: m for m in new.method}
    for om in old.method:
        where = f"service {name}: method {om.name}"
        nm = new_methods.get(om.name)
        if nm is None:
            yield f"{where} removed"
            continue
        for side, old_type, new_type in (("request", om.input_type, nm.input_type),
                                         ("response", om.output_type, nm.output_type)):
            if old_type != new_type:
                yield f"{where} changed its {side} type from {old_type.lstrip('.')} to {new_type.lstrip('.')}"
        for side, old_streaming, new_streaming in (("client", om.client_streaming, nm.client_streaming),
                                                   ("server", om.server_streaming, nm.server_streaming)):
            if old_streaming != new_streaming:
                yield f"{where} {'became' if new_streaming else 'is no longer'} {side}-streaming"


@dataclass
class Report:
    """What compare() found: ``breaking`` lines, and how much it looked at."""
    breaking: List[str]
    checked: Dict[str, int]


def compare(old: descriptor_pb2.FileDescriptorSet, new: descriptor_pb2.FileDescriptorSet,
            files: Sequence[str]) -> Report:
    """The breaking changes from ``old`` to ``new`` in ``files``."""
    breaking: List[str] = []
    old_files = {f.name: f for f in old.file}
    new_files = {f.name: f for f in new.file}
    for name in files:
        if name not in new_files:
            breaking.append(f"{name}: file removed")
        elif old_files[name].package != new_files[name].package:
            breaking.append(f"{name}: package changed from {old_files[name].package} "
                            f"to {new_files[name].package}")
    old_index, new_index = _index(old, files), _index(new, files)
    checks = (("message", old_index.messages, new_index.messages, _compare_message),
              ("enum", old_index.enums, new_index.enums, _compare_enum),
              ("service", old_index.services, new_index.services, _compare_service))
    for kind, old_items, new_items, compare_one in checks:
        for full_name, item in old_items.items():
            shown = full_name.lstrip(".")
            if full_name not in new_items:
                breaking.append(f"{old_index.file_of[full_name]}: {kind} {shown} removed")
                continue
            for line in compare_one(shown, item, new_items[full_name]):
                breaking.append(f"{old_index.file_of[full_name]}: {line}")
    checked = {
        "messages": len(old_index.messages),
        "fields": sum(len(m.field) for m in old_index.messages.values()),
        "enums": len(old_index.enums),
        "methods": sum(len(s.method) for s in old_index.services.values()),
    }
    return Report(breaking, checked)


def _git_tree(ref: str, path: str, files: Sequence[str], into: Path) -> Path:
    """Writes ``path``/FILE of git commit ``ref`` under ``into``."""
    for name in files:
        result = subprocess.run(["git", "-C", str(ROOT), "show", f"{ref}:{path}/{name}"],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        if result.returncode != 0:
            raise CheckError(f"git show {ref}:{path}/{name}: {result.stderr.decode().strip()}")
        (into / name).parent.mkdir(parents=True, exist_ok=True)
        (into / name).write_bytes(result.stdout)
    return into


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("files", nargs="*", default=list(DEFAULT_FILES),
                        help="proto files, relative to the roots (default: %(default)s)")
    parser.add_argument("--protoc", default=os.environ.get("PROTOC") or shutil.which("protoc"))
    parser.add_argument("--current", type=Path, default=ROOT / "proto", help="root of the API as it is")
    parser.add_argument("--against", type=Path, default=ROOT / "proto" / "released",
                        help="root of the last released API")
    parser.add_argument("--against-ref", help="take the released files from this git commit or tag "
                        "(under proto/) instead of --against")
    args = parser.parse_args(argv)
    if not args.protoc:
        print("check_proto_compat: protoc not found (--protoc, $PROTOC or PATH)", file=sys.stderr)
        return 2
    try:
        with tempfile.TemporaryDirectory(prefix="proto-released-") as scratch:
            against = _git_tree(args.against_ref, "proto", args.files, Path(scratch)) \
                if args.against_ref else args.against
            old = compile_descriptors(args.protoc, against, args.files)
            new = compile_descriptors(args.protoc, args.current, args.files)
    except CheckError as error:
        print(f"check_proto_compat: {error}", file=sys.stderr)
        return 2
    report = compare(old, new, args.files)
    source = args.against_ref or args.against
    counts = ", ".join(f"{n} {kind}" for kind, n in report.checked.items())
    if report.breaking:
        for line in report.breaking:
            print(f"breaking: {line}")
        print(f"check_proto_compat: {len(report.breaking)} breaking changes against {source} "
              f"({counts} released)")
        return 1
    print(f"check_proto_compat: compatible with {source} ({counts} checked)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
