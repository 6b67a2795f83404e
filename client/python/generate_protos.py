"""Generates the protobuf modules of the kvtier package, with their type stubs.

One generator for both ways the package is built: the CMake target
kvtier_python (client/python/CMakeLists.txt runs this file) and
`pip install client/python` (setup.py imports it). Under OUT:

    kvtier/v1/{types,kvtier,admin}_pb2.py   messages and enums, from proto/kvtier/v1
    kvtier/v1/*_pb2.pyi                     their type stubs (protoc --pyi_out)
    kvtier/v1/*_pb2_grpc.py                 service stubs (grpc_python_plugin)
    kvtier/_health/health_pb2.py, .pyi      grpc.health.v1's messages renamed into
                                            the package kvtier.health.v1
    kvtier/v1/__init__.py, kvtier/_health/__init__.py

The health messages are generated from a renamed copy of
proto/grpc/health/v1/health.proto, so that nothing named `grpc` is generated
(grpcio's own `grpc` package stays importable) and protobuf's descriptor pool
holds no grpc.health.v1 names that grpcio-health-checking could clash with.
The wire format is unchanged; the client calls /grpc.health.v1.Health/Check.

Tools: protoc 3.20 or newer (--pyi_out; Debian's protobuf-compiler) and
grpc_python_plugin (Debian's protobuf-compiler-grpc).

    python3 generate_protos.py --out DIR [--proto-root DIR] [--protoc PATH] [--grpc-plugin PATH]
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
DEFAULT_PROTO_ROOT = os.path.join(os.path.dirname(os.path.dirname(HERE)), "proto")
API_PROTOS = ("types", "kvtier", "admin")
HEALTH_PACKAGE = ("package grpc.health.v1;", "package kvtier.health.v1;")


class GenerateError(RuntimeError):
    """A missing tool or proto, or a failed protoc run."""


def outputs(out_root: str) -> list[str]:
    """Every file generate() writes under out_root."""
    v1 = os.path.join(out_root, "kvtier", "v1")
    health = os.path.join(out_root, "kvtier", "_health")
    files = [os.path.join(v1, "__init__.py")]
    for name in API_PROTOS:
        files += [os.path.join(v1, f"{name}_pb2{suffix}") for suffix in (".py", ".pyi", "_grpc.py")]
    files += [os.path.join(health, f) for f in ("__init__.py", "health_pb2.py", "health_pb2.pyi")]
    return files


def find_tool(name: str, given: str | None, env: str) -> str:
    """given, else $env, else `name` on PATH."""
    path = given or os.environ.get(env) or shutil.which(name)
    if not path:
        raise GenerateError(f"{name} not found (install it, or name it with ${env})")
    return path


def _protoc(protoc: str, args: list[str]) -> None:
    try:
        done = subprocess.run([protoc, *args], capture_output=True, text=True, check=False)
    except OSError as e:
        raise GenerateError(f"cannot run {protoc}: {e.strerror}") from e
    if done.returncode != 0:
        raise GenerateError(f"{protoc} {' '.join(args)} failed ({done.returncode}):\n{done.stderr}")


def _touch(path: str) -> None:
    """Creates an empty file, or updates its time (the build compares times)."""
    with open(path, "a", encoding="utf-8"):
        pass
    os.utime(path)


def generate(out_root: str, proto_root: str = DEFAULT_PROTO_ROOT, protoc: str | None = None,
             grpc_plugin: str | None = None) -> list[str]:
    """Writes the generated modules under out_root (see the module doc);
    returns their paths."""
    protoc = find_tool("protoc", protoc, "PROTOC")
    grpc_plugin = find_tool("grpc_python_plugin", grpc_plugin, "GRPC_PYTHON_PLUGIN")
    api = [os.path.join(proto_root, "kvtier", "v1", f"{name}.proto") for name in API_PROTOS]
    health = os.path.join(proto_root, "grpc", "health", "v1", "health.proto")
    for path in (*api, health):
        if not os.path.isfile(path):
            raise GenerateError(f"{path}: no such proto (set the proto root, e.g. $KVTIER_PROTO_DIR)")
    os.makedirs(os.path.join(out_root, "kvtier", "v1"), exist_ok=True)
    _protoc(protoc, [f"--proto_path={proto_root}", f"--python_out={out_root}", f"--pyi_out={out_root}",
                     f"--grpc_python_out={out_root}", f"--plugin=protoc-gen-grpc_python={grpc_plugin}", *api])
    _touch(os.path.join(out_root, "kvtier", "v1", "__init__.py"))

    with open(health, encoding="utf-8") as f:
        text = f.read()
    if HEALTH_PACKAGE[0] not in text:
        raise GenerateError(f"{health}: no '{HEALTH_PACKAGE[0]}' line to rename")
    with tempfile.TemporaryDirectory(prefix="kvtier-health-") as tmp:
        # The proto path of the copy is its Python module: kvtier._health.health_pb2.
        copy = os.path.join(tmp, "kvtier", "_health", "health.proto")
        os.makedirs(os.path.dirname(copy))
        with open(copy, "w", encoding="utf-8") as f:
            f.write(text.replace(*HEALTH_PACKAGE))
        os.makedirs(os.path.join(out_root, "kvtier", "_health"), exist_ok=True)
        _protoc(protoc, [f"--proto_path={tmp}", f"--python_out={out_root}", f"--pyi_out={out_root}", copy])
    _touch(os.path.join(out_root, "kvtier", "_health", "__init__.py"))

    written = outputs(out_root)
    missing = [p for p in written if not os.path.isfile(p)]
    if missing:
        raise GenerateError(f"protoc wrote no {', '.join(missing)}")
    return written


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    p.add_argument("--out", required=True, help="root of the package tree (kvtier/ is written under it)")
    p.add_argument("--proto-root", default=os.environ.get("KVTIER_PROTO_DIR", DEFAULT_PROTO_ROOT))
    p.add_argument("--protoc")
    p.add_argument("--grpc-plugin")
    args = p.parse_args(argv)
    try:
        generate(args.out, args.proto_root, args.protoc, args.grpc_plugin)
    except GenerateError as e:
        print(f"generate_protos: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
