"""The built package: imports beside grpcio, stubs in place, every RPC covered."""

import os
import re
import sys
import unittest

import grpc
from google.protobuf import descriptor_pool

import kvtier
from kvtier.v1 import admin_pb2, kvtier_pb2


def package_root():
    return os.path.dirname(os.path.dirname(os.path.abspath(kvtier.__file__)))


class PackageTest(unittest.TestCase):
    def test_runs_on_debian_python(self):
        # The ctest command names /usr/bin/python3, not whichever python3 is first on PATH.
        self.assertEqual(os.path.realpath(sys.executable), os.path.realpath("/usr/bin/python3"))

    def test_grpc_is_grpcio_not_a_generated_package(self):
        self.assertFalse(os.path.exists(os.path.join(package_root(), "grpc")),
                         "a generated grpc/ folder beside kvtier/ would shadow grpcio")
        self.assertNotIn(package_root(), os.path.abspath(grpc.__file__))
        self.assertTrue(hasattr(grpc, "insecure_channel"))

    def test_health_messages_do_not_claim_grpc_health_names(self):
        from kvtier._health import health_pb2

        self.assertEqual(health_pb2.HealthCheckRequest.DESCRIPTOR.full_name,
                         "kvtier.health.v1.HealthCheckRequest")
        with self.assertRaises(KeyError):
            descriptor_pool.Default().FindMessageTypeByName("grpc.health.v1.HealthCheckRequest")

    def test_every_rpc_has_a_client_method(self):
        def snake(name):
            return re.sub(r"(?<!^)(?=[A-Z])", "_", name).lower()

        for module, service in ((kvtier_pb2, "KvTier"), (admin_pb2, "Admin")):
            for method in module.DESCRIPTOR.services_by_name[service].methods:
                self.assertTrue(callable(getattr(kvtier.Client, snake(method.name), None)),
                                f"{service}.{method.name} has no Client.{snake(method.name)}")

    def test_targets(self):
        self.assertEqual(kvtier.normalize_target("/run/k.sock"), "unix:/run/k.sock")
        self.assertEqual(kvtier.normalize_target("k.sock"), "unix:" + os.path.abspath("k.sock"))
        self.assertEqual(kvtier.normalize_target("localhost:50551"), "localhost:50551")
        with self.assertRaises(kvtier.KvTierError) as e:
            kvtier.normalize_target("")
        self.assertIn("target", e.exception.message)

    def test_targets_match_the_cpp_client(self):
        # The same table as client_test.cc's NormalizeTargetTest.
        table = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "testdata",
                             "normalize_target.txt")
        cases = 0
        with open(table, encoding="utf-8") as f:
            for line in f:
                if not line.strip() or line.startswith("#"):
                    continue
                given, want = line.rstrip("\n").split("\t")
                want = want.replace("$CWD", os.getcwd())
                self.assertEqual(kvtier.normalize_target(given), want, given)
                cases += 1
        self.assertGreaterEqual(cases, 10)


if __name__ == "__main__":
    unittest.main()
