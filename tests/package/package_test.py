#!/usr/bin/python3
"""The Debian packages of a build tree, installed and used as a host would.

KVTIER_BUILD_DIR names the build tree (ctest sets it; KVTIER_CPACK and
KVTIER_CMAKE name the tools, default: from PATH). Once per run (setUpClass):
cpack packages that tree's binaries (no build), each .deb is unpacked with
dpkg-deb -x into a scratch root that stands for /, and the installed kvtierd
starts on the installed /etc/kvtier/kvtierd.toml with its paths moved under
the scratch root: --data-dir and --socket (the config's /var/lib/kvtier and
/run/kvtier belong to the system), the shared-memory tiers in a private
/dev/shm folder, small tier capacities and no O_DIRECT (the scratch root may
be on tmpfs). Readiness is the daemon's READY=1 on a private NOTIFY_SOCKET,
not a timed wait. The tests then check the file lists and control fields,
and talk to that daemon through the installed kvtierctl, the installed
Python package and a C++ program built with cmake against the installed
CMake package. The systemd-analyze check skips, saying so, where the tool
is absent. lintian is not run here (it takes longer than the rest):
deploy/package.sh runs it.
"""

import fnmatch
import os
import re
import select
import shutil
import signal
import socket
import subprocess
import tempfile
import unittest

SOURCE = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BUILD = os.path.abspath(os.environ.get("KVTIER_BUILD_DIR", os.path.join(SOURCE, "build", "release")))
CPACK = os.environ.get("KVTIER_CPACK", "cpack")
CMAKE = os.environ.get("KVTIER_CMAKE", "cmake")
START_TIMEOUT_S = 60

# Package -> patterns (fnmatch, paths without the leading "./") that must
# each match at least one file of it.
EXPECTED = {
    "kvtierd": [
        "usr/bin/kvtierd", "usr/bin/kvtierctl", "etc/kvtier/kvtierd.toml",
        "lib/systemd/system/kvtierd.service", "usr/lib/sysusers.d/kvtier.conf",
        "usr/lib/tmpfiles.d/kvtier.conf", "usr/share/man/man1/kvtierd.1.gz",
        "usr/share/man/man1/kvtierctl.1.gz", "usr/share/doc/kvtierd/copyright",
        "usr/share/doc/kvtierd/changelog.Debian.gz",
    ],
    "libkvtier-client0": [
        "usr/lib/*libkvtier_client.so.0", "usr/lib/*libkvtier_client.so.0.*",
        "usr/share/doc/libkvtier-client0/copyright",
    ],
    "libkvtier-client-dev": [
        "usr/include/kvtier/client/client.h", "usr/include/kvtier/client/select_stream.h",
        "usr/include/kvtier/client/shm/shm_mapping.h", "usr/include/kvtier/kvtier/v1/kvtier.grpc.pb.h",
        "usr/include/kvtier/kvtier/v1/types.pb.h", "usr/lib/*libkvtier_client.so",
        "usr/lib/*libkvtier_client.a", "usr/lib/*cmake/kvtier/kvtierConfig.cmake",
        "usr/lib/*cmake/kvtier/kvtierConfigVersion.cmake", "usr/lib/*cmake/kvtier/kvtierTargets.cmake",
        "usr/lib/*pkgconfig/kvtier-client.pc", "usr/share/kvtier/proto/kvtier/v1/kvtier.proto",
        "usr/share/doc/libkvtier-client-dev/copyright",
    ],
    "python3-kvtier": [
        "usr/lib/python3/dist-packages/kvtier/__init__.py",
        "usr/lib/python3/dist-packages/kvtier/py.typed",
        "usr/lib/python3/dist-packages/kvtier/v1/kvtier_pb2_grpc.py",
        "usr/lib/python3/dist-packages/kvtier/v1/kvtier_pb2.pyi",
        "usr/lib/python3/dist-packages/kvtier/enums.py",
        "usr/lib/python3/dist-packages/kvtier/_health/health_pb2.py",
        "usr/share/doc/python3-kvtier/copyright",
    ],
}


def run(argv, **kwargs):
    """Runs argv; its output (stdout and stderr) is in the failure message."""
    result = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, **kwargs)
    if result.returncode != 0:
        raise AssertionError(f"{' '.join(argv)} exited with {result.returncode}:\n{result.stdout}")
    return result.stdout


class PackageTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.daemon = None
        cls.scratch = tempfile.mkdtemp(prefix="kvtier-pkg-", dir="/tmp")
        cls.shm = tempfile.mkdtemp(prefix="kvtier-pkg-", dir="/dev/shm")
        try:
            cls._install()
            cls._start_daemon()
        except BaseException:
            cls.tearDownClass()
            raise

    @classmethod
    def _install(cls):
        out = os.path.join(cls.scratch, "debs")
        run([CPACK, "--config", os.path.join(BUILD, "CPackConfig.cmake"), "-B", out])
        cls.root = os.path.join(cls.scratch, "root")
        cls.debs, cls.files = {}, {}
        for name in sorted(os.listdir(out)):
            if not name.endswith(".deb"):
                continue
            deb = os.path.join(out, name)
            package = run(["dpkg-deb", "-f", deb, "Package"]).strip()
            cls.debs[package] = deb
            listing = run(["dpkg-deb", "-c", deb]).splitlines()
            # "-rw-r--r-- root/root 1234 2024-01-01 00:00 ./usr/bin/kvtierd"
            # (a symbolic link: "... ./usr/lib/libx.so.0 -> libx.so.0.1.0")
            cls.files[package] = [line.split(" ./", 1)[1].split(" -> ")[0] for line in listing
                                  if " ./" in line and not line.startswith("d")]
            run(["dpkg-deb", "-x", deb, cls.root])
        cls.sock = os.path.join(cls.root, "run/kvtier/kvtierd.sock")
        cls.version = run(["dpkg-deb", "-f", cls.debs["kvtierd"], "Version"]).strip().split("-")[0]

    @classmethod
    def _start_daemon(cls):
        for folder in ("var/lib/kvtier", "run/kvtier"):
            os.makedirs(os.path.join(cls.root, folder), exist_ok=True)
        notify_path = os.path.join(cls.scratch, "notify.sock")
        notify = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        notify.bind(notify_path)
        settings = {
            "tiers.device.shm_dir": cls.shm, "tiers.host.shm_dir": cls.shm,
            "tiers.device.capacity_bytes": "32MiB", "tiers.host.capacity_bytes": "64MiB",
            "tiers.host.staging_bytes": "4MiB", "tiers.nvme.file_count": "1",
            "tiers.nvme.file_size_bytes": "64MiB", "tiers.nvme.direct_io": "false",
        }
        argv = [os.path.join(cls.root, "usr/bin/kvtierd"),
                "--config", os.path.join(cls.root, "etc/kvtier/kvtierd.toml"),
                "--data-dir", os.path.join(cls.root, "var/lib/kvtier"), "--socket", cls.sock]
        for key, value in settings.items():
            argv += ["--set", f"{key}={value}"]
        cls.log_path = os.path.join(cls.scratch, "kvtierd.log")
        with open(cls.log_path, "wb") as log:
            cls.daemon = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT,
                                          env=dict(os.environ, NOTIFY_SOCKET=notify_path))
        pidfd = os.pidfd_open(cls.daemon.pid)
        try:
            while True:
                ready, _, _ = select.select([notify, pidfd], [], [], START_TIMEOUT_S)
                if notify in ready and b"READY=1" in notify.recv(4096):
                    return
                if notify not in ready:
                    what = "exited" if pidfd in ready else f"not ready after {START_TIMEOUT_S} s"
                    with open(cls.log_path, errors="replace") as f:
                        raise AssertionError(f"installed kvtierd {what}:\n{f.read()}")
        finally:
            os.close(pidfd)
            notify.close()

    @classmethod
    def tearDownClass(cls):
        if cls.daemon is not None and cls.daemon.poll() is None:
            cls.daemon.send_signal(signal.SIGTERM)
            try:
                cls.daemon.wait(timeout=30)
            except subprocess.TimeoutExpired:
                cls.daemon.kill()
                cls.daemon.wait()
        shutil.rmtree(cls.scratch, ignore_errors=True)
        shutil.rmtree(cls.shm, ignore_errors=True)

    def test_each_package_holds_its_files(self):
        self.assertEqual(sorted(self.debs), sorted(EXPECTED))
        for package, patterns in EXPECTED.items():
            for pattern in patterns:
                self.assertTrue(any(fnmatch.fnmatch(f, pattern) for f in self.files[package]),
                                f"{package}: no file matches {pattern}; it has {self.files[package]}")

    def test_files_go_only_where_a_debian_system_looks(self):
        for package, files in self.files.items():
            for f in files:
                self.assertRegex(f, r"^(usr/(bin|include|lib|share)/|etc/kvtier/|lib/systemd/system/)",
                                 f"{package} installs {f}")
                self.assertNotIn("__pycache__", f, package)

    def test_control_fields(self):
        depends = run(["dpkg-deb", "-f", self.debs["kvtierd"], "Depends"])
        # Computed from the binaries' shared libraries (dpkg-shlibdeps).
        for library in ("libgrpc++", "librocksdb", "libc6"):
            self.assertIn(library, depends)
        self.assertIn("systemd", depends)
        dev_depends = run(["dpkg-deb", "-f", self.debs["libkvtier-client-dev"], "Depends"])
        self.assertRegex(dev_depends, r"libkvtier-client0 \(= [0-9.]+-1\)")
        self.assertEqual(run(["dpkg-deb", "-f", self.debs["python3-kvtier"], "Architecture"]).strip(), "all")
        control = os.path.join(self.scratch, "control")
        run(["dpkg-deb", "-e", self.debs["kvtierd"], control])
        with open(os.path.join(control, "conffiles")) as f:
            self.assertEqual(f.read().split(), ["/etc/kvtier/kvtierd.toml"])
        for script in ("postinst", "prerm", "postrm"):
            self.assertTrue(os.access(os.path.join(control, script), os.X_OK), script)

    def test_installed_config_and_unit_agree(self):
        with open(os.path.join(self.root, "etc/kvtier/kvtierd.toml")) as f:
            config = f.read()
        self.assertIn('\ndata_dir = "/var/lib/kvtier"\n', config)
        self.assertIn('\nsocket_path = "/run/kvtier/kvtierd.sock"\n', config)
        with open(os.path.join(self.root, "lib/systemd/system/kvtierd.service")) as f:
            unit = f.read()
        self.assertIn("\nExecStart=/usr/bin/kvtierd --config /etc/kvtier/kvtierd.toml\n", unit)
        self.assertIn("\nStateDirectory=kvtier\n", unit)
        self.assertIn("\nRuntimeDirectory=kvtier\n", unit)

    def test_installed_kvtierctl_reports_status(self):
        out = run([os.path.join(self.root, "usr/bin/kvtierctl"), "--socket", self.sock, "status"])
        self.assertIn(self.version, out)
        self.assertIn(os.path.join(self.root, "var/lib/kvtier"), out)

    def test_installed_python_package_imports_and_calls(self):
        code = ("import sys, kvtier; print(kvtier.__file__); "
                "print(kvtier.Client(sys.argv[1]).stats().version)")
        env = dict(os.environ, PYTHONPATH=os.path.join(self.root, "usr/lib/python3/dist-packages"))
        lines = run(["/usr/bin/python3", "-c", code, self.sock], env=env, cwd=self.scratch).split()
        self.assertTrue(lines[0].startswith(self.root + "/"), lines[0])
        self.assertEqual(lines[1], self.version)

    def test_cpp_program_builds_against_the_installed_cmake_package(self):
        build = os.path.join(self.scratch, "consumer")
        run([CMAKE, "-S", os.path.join(SOURCE, "tests/package/consumer"), "-B", build,
             f"-DCMAKE_PREFIX_PATH={self.root}/usr", "-DCMAKE_BUILD_TYPE="])
        run([CMAKE, "--build", build])
        program = os.path.join(build, "kvtier_consumer")
        # The library is the installed one, not one of the build tree.
        ldd = run(["ldd", program])
        self.assertRegex(ldd, r"libkvtier_client\.so\.0 => " + re.escape(self.root) + "/usr/lib/")
        self.assertEqual(run([program, self.sock]).strip(), f"version={self.version} serving=1")

    def test_pkg_config_file_points_into_the_installed_tree(self):
        pc = [f for f in self.files["libkvtier-client-dev"] if f.endswith("kvtier-client.pc")][0]
        env = dict(os.environ, PKG_CONFIG_PATH=os.path.dirname(os.path.join(self.root, pc)))
        cflags = run(["pkg-config", "--cflags-only-I", "kvtier-client"], env=env).split()
        include = [os.path.realpath(flag[2:]) for flag in cflags if "kvtier" in flag]
        self.assertEqual(include, [os.path.join(os.path.realpath(self.root), "usr/include/kvtier")])
        libs = run(["pkg-config", "--libs", "kvtier-client"], env=env)
        self.assertIn("-lkvtier_client", libs)

    def test_installed_unit_verifies(self):
        analyze = shutil.which("systemd-analyze")
        if analyze is None:
            self.skipTest("systemd-analyze not installed: the unit was not verified")
        # The installed unit as it is, except that ExecStart= names the
        # scratch root's kvtierd (/usr/bin/kvtierd is this host's, if any);
        # its Documentation= man pages are looked up in the scratch root.
        with open(os.path.join(self.root, "lib/systemd/system/kvtierd.service")) as f:
            unit = f.read()
        self.assertIn("\nExecStart=/usr/bin/kvtierd ", unit)
        folder = os.path.join(self.scratch, "unit")
        os.makedirs(folder)
        with open(os.path.join(folder, "kvtierd.service"), "w") as f:
            f.write(unit.replace("\nExecStart=/usr/bin/", f"\nExecStart={self.root}/usr/bin/"))
        argv = [analyze, "verify", os.path.join(folder, "kvtierd.service")]
        if shutil.which("man") is None:
            argv.insert(2, "--man=no")  # nothing to look the pages up with
        out = run(argv, env=dict(os.environ, MANPATH=os.path.join(self.root, "usr/share/man")))
        self.assertEqual(out.strip(), "", out)


if __name__ == "__main__":
    unittest.main()
