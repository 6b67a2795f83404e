"""`pip install client/python` into a fresh venv, offline, as a user would.

The venv is made with --system-site-packages (grpcio, protobuf and numpy come
from Debian) and pip runs with --no-index --no-build-isolation, so nothing is
downloaded. The package's files (pyproject.toml, setup.py,
generate_protos.py, README.md, kvtier/) and proto/ are copied into a
temporary folder in the repository's layout first, so that the in-place
build leaves nothing in the checkout. Then, with PYTHONPATH unset: kvtier
imports from the venv, computes the same chain hash as the built package,
its generated modules and stubs are installed, and mypy (when found) types a
user's code through the installed stubs.

Environment (ctest sets it): KVTIER_SOURCE_DIR (the repository), PROTOC,
GRPC_PYTHON_PLUGIN, KVTIER_MYPY.
"""

import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
import unittest

import kvtier

HERE = os.path.dirname(os.path.abspath(__file__))
SOURCE = os.environ.get("KVTIER_SOURCE_DIR") or os.path.dirname(os.path.dirname(os.path.dirname(HERE)))
PACKAGE_FILES = ("pyproject.toml", "setup.py", "generate_protos.py", "README.md")

USER_CODE = textwrap.dedent('''\
    import kvtier

    def tiers(client: kvtier.Client) -> list[str]:
        listed = client.list_blocks(tier=kvtier.Tier.NVME, limit=10)
        got = client.get_blocks(1, [b"x"], mode=kvtier.ReturnMode.HANDLES)
        entry = kvtier.SelectEntry(1, max_blocks=4, scorer=kvtier.Scorer.KEY_KEY)
        answers = client.select([entry, {"context_id": 2, "max_blocks": 4}])
        return [str(len(listed.blocks)), str(got.lease_id), str(len(answers))]

    client = kvtier.Client("/nonexistent/kvtierd.sock")
    reveal_type(client.stats())
    reveal_type(client.stats().version)
    reveal_type(client.get_blocks(1, [b"x"]).results)
    reveal_type(client.open_context(1, [[b"x"]]).context_id)
    ''')
BAD_USER_CODE = textwrap.dedent('''\
    import kvtier
    kvtier.Client("x.sock").list_blocks(tier=3.5)
    ''')


def _env():
    env = dict(os.environ)
    for name in ("PYTHONPATH", "MYPYPATH", "PYTHONHOME", "PIP_INDEX_URL", "PIP_EXTRA_INDEX_URL"):
        env.pop(name, None)
    env["PIP_NO_INDEX"] = "1"
    env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
    return env


def _run(argv, cwd, what):
    done = subprocess.run(argv, cwd=cwd, env=_env(), capture_output=True, text=True, timeout=240)
    if done.returncode != 0:
        raise AssertionError(f"{what} failed ({done.returncode}): {' '.join(argv)}\n"
                             f"{done.stdout[-4000:]}\n{done.stderr[-4000:]}")
    return done.stdout


class PipInstallTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.mkdtemp(prefix="kvtier-install-")
        src = os.path.join(cls.tmp, "src")
        cls.project = os.path.join(src, "client", "python")
        os.makedirs(cls.project)
        for name in PACKAGE_FILES:
            shutil.copy(os.path.join(SOURCE, "client", "python", name), cls.project)
        shutil.copytree(os.path.join(SOURCE, "client", "python", "kvtier"), os.path.join(cls.project, "kvtier"),
                        ignore=shutil.ignore_patterns("__pycache__"))
        shutil.copytree(os.path.join(SOURCE, "proto"), os.path.join(src, "proto"))
        cls.venv = os.path.join(cls.tmp, "venv")
        _run(["/usr/bin/python3", "-m", "venv", "--system-site-packages", cls.venv], cls.tmp,
             "python3 -m venv (Debian: python3-venv)")
        cls.python = os.path.join(cls.venv, "bin", "python")
        cls.pip_log = _run([cls.python, "-m", "pip", "install", "--no-index", "--no-build-isolation",
                            cls.project], cls.tmp,
                           "pip install (Debian: python3-pip, python3-setuptools, python3-wheel)")
        cls.site = _run([cls.python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                        cls.tmp, "purelib").strip()

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.tmp, ignore_errors=True)

    def installed(self, *parts):
        return os.path.join(self.site, "kvtier", *parts)

    def test_imports_from_the_venv_and_computes_as_the_built_package(self):
        out = _run([self.python, "-c", "import kvtier, grpc, google.protobuf, numpy; "
                    "print(kvtier.__file__); print(kvtier.__version__); "
                    "print(kvtier.chain_hash(7, b'', [1, 2, 3], ['x']).hex())"], self.tmp, "import").split()
        path, version, digest = out
        self.assertEqual(os.path.realpath(path), os.path.realpath(self.installed("__init__.py")))
        self.assertEqual(version, kvtier.__version__)
        self.assertEqual(digest, kvtier.chain_hash(7, b"", [1, 2, 3], ["x"]).hex())

    def test_generated_modules_and_stubs_are_installed(self):
        for name in ("types", "kvtier", "admin"):
            for suffix in ("_pb2.py", "_pb2.pyi", "_pb2_grpc.py"):
                self.assertTrue(os.path.isfile(self.installed("v1", name + suffix)), name + suffix)
        for name in ("health_pb2.py", "health_pb2.pyi"):
            self.assertTrue(os.path.isfile(self.installed("_health", name)), name)
        self.assertTrue(os.path.isfile(self.installed("py.typed")))
        self.assertFalse(os.path.exists(os.path.join(self.site, "grpc")), "a generated grpc/ would shadow grpcio")
        out = _run([self.python, "-c", "from kvtier.v1 import kvtier_pb2; from kvtier._health import health_pb2; "
                    "import kvtier; print(kvtier_pb2.SCORER_KEY_KEY == kvtier.Scorer.KEY_KEY, "
                    "health_pb2.HealthCheckRequest.DESCRIPTOR.full_name)"], self.tmp, "generated").split()
        self.assertEqual(out, ["True", "kvtier.health.v1.HealthCheckRequest"])

    def test_the_build_leaves_the_copied_sources_alone_but_for_build_output(self):
        made = set(os.listdir(self.project)) - set(PACKAGE_FILES) - {"kvtier"}
        self.assertLessEqual(made, {"build", "kvtier.egg-info"})
        self.assertFalse(os.path.exists(os.path.join(self.project, "kvtier", "v1")),
                         "generated modules belong in the build, not the sources")

    def test_a_users_code_is_typed_through_the_installed_stubs(self):
        mypy = os.environ.get("KVTIER_MYPY") or shutil.which("mypy")
        if not mypy or mypy.endswith("NOTFOUND"):
            self.skipTest("mypy not found")
        files = {"user.py": USER_CODE, "bad.py": BAD_USER_CODE,
                 # torch is large: skipped, as the package's own check does.
                 "mypy.ini": "[mypy]\n[mypy-torch.*]\nfollow_imports = skip\nignore_missing_imports = True\n"}
        for name, text in files.items():
            with open(os.path.join(self.tmp, name), "w", encoding="utf-8") as f:
                f.write(text)
        done = subprocess.run([mypy, "--strict", "--config-file", "mypy.ini", "--no-incremental",
                               "--cache-dir", os.devnull, "--python-executable", self.python, "user.py", "bad.py"],
                              cwd=self.tmp, env=_env(), capture_output=True, text=True, timeout=240)
        lines = done.stdout.splitlines()
        revealed = [line.split("Revealed type is ", 1)[1].strip('"') for line in lines if "Revealed type is" in line]
        self.assertEqual(revealed, ["kvtier.v1.admin_pb2.StatsResponse", "builtins.str",
                                    "builtins.list[kvtier.v1.kvtier_pb2.BlockResult]", "builtins.int"],
                         done.stdout + done.stderr)
        errors = [line for line in lines if ": error:" in line]
        self.assertEqual(len(errors), 1, done.stdout + done.stderr)
        self.assertTrue(errors[0].startswith("bad.py:2: error: "), errors[0])
        self.assertIn('Argument "tier" to "list_blocks" of "Client" has incompatible type "float"', errors[0])

if __name__ == "__main__":
    unittest.main()
