"""setuptools hook of pyproject.toml: build_py also writes the generated
modules (kvtier/v1/*_pb2.py, *_pb2.pyi, *_pb2_grpc.py, kvtier/_health/) into
the build, with generate_protos.py, the generator the CMake build uses.

protoc and grpc_python_plugin come from PATH ($PROTOC, $GRPC_PYTHON_PLUGIN
override); the protos from ../../proto ($KVTIER_PROTO_DIR overrides)."""

import os
import sys

from setuptools import setup
from setuptools.command.build_py import build_py

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import generate_protos  # noqa: E402  (beside this file)


class BuildWithProtos(build_py):
    def run(self) -> None:
        super().run()
        if self.editable_mode:
            raise SystemExit("kvtier: an editable install has no generated modules; "
                             "use the CMake build's package (PYTHONPATH) or a regular install")
        proto_root = os.environ.get("KVTIER_PROTO_DIR", generate_protos.DEFAULT_PROTO_ROOT)
        try:
            generate_protos.generate(self.build_lib, proto_root)
        except generate_protos.GenerateError as e:
            raise SystemExit(f"kvtier: {e}") from e

    def get_outputs(self, include_bytecode: bool = True) -> list[str]:
        return super().get_outputs(include_bytecode) + generate_protos.outputs(self.build_lib)


setup(cmdclass={"build_py": BuildWithProtos})
