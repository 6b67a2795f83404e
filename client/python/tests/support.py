"""Shared helpers of the Python tests: a real kvtierd per test class, paths.

Run by ctest (label "python") with Debian's /usr/bin/python3 and
PYTHONPATH = the built package (client/python in the build tree); KVTIERD,
KVTIER_CHAIN_HASH_TOOL and KVTIER_SHARED_DATA name the built daemon, the C++
chain-hash tool and the shared model data.
"""

import os
import sys
import unittest

import numpy as np

import kvtier

HERE = os.path.dirname(os.path.abspath(__file__))
EXAMPLES = os.path.join(os.path.dirname(HERE), "examples")
SHARED_DATA = os.environ.get("KVTIER_SHARED_DATA", "/work/shared/data")


def kvtierd_path():
    path = os.environ.get("KVTIERD")
    if not path:
        raise RuntimeError("KVTIERD is not set: run through ctest, or set it to the built daemon/kvtierd")
    return path


def add_examples_to_path():
    if EXAMPLES not in sys.path:
        sys.path.insert(0, EXAMPLES)


def require_shared_data(test):
    for sub in ("models", "realkv"):
        if not os.path.isdir(os.path.join(SHARED_DATA, sub)):
            raise unittest.SkipTest(f"{SHARED_DATA}/{sub} is absent (set KVTIER_SHARED_DATA)")


class DaemonTestCase(unittest.TestCase):
    """Starts one kvtierd for the class (readiness by sd_notify + health)."""

    settings = {}

    @classmethod
    def setUpClass(cls):
        cls.daemon = kvtier.LocalDaemon(kvtierd_path(), settings=cls.settings).start()
        cls.client = cls.daemon.client()

    @classmethod
    def tearDownClass(cls):
        cls.client.close()
        cls.daemon.close()

    def assertKvTierError(self, code, *fragments):
        """Context manager: the block raises KvTierError with `code` and every fragment in its message."""
        return _ErrorCheck(self, code, fragments)


class ProfileTestCase(DaemonTestCase):
    """A DaemonTestCase with one small profile registered for the class
    (small_profile(profile_name)): cls.profile and its id cls.pid."""

    profile_name = "test-model"

    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        cls.profile = cls.client.register_profile(small_profile(cls.profile_name))
        cls.pid = cls.profile.profile_id


class _ErrorCheck:
    def __init__(self, test, code, fragments):
        self.test, self.code, self.fragments = test, code, fragments
        self.exception = None

    def __enter__(self):
        return self

    def __exit__(self, kind, value, tb):
        if kind is None:
            self.test.fail(f"no KvTierError raised (expected {self.code.name})")
        if not issubclass(kind, kvtier.KvTierError):
            return False
        self.exception = value
        self.test.assertEqual(value.code, self.code, value.message)
        for fragment in self.fragments:
            self.test.assertIn(fragment, value.message)
        return True


def small_profile(name="test-model", dtype="fp16", **overrides):
    fields = dict(num_layers=2, num_kv_heads=2, head_dim=32, block_size_tokens=16, dtype=dtype)
    fields.update(overrides)
    return kvtier.Profile(name, **fields)


def random_block(profile, seed):
    rng = np.random.default_rng(seed)
    return rng.standard_normal(profile.block_shape).astype(profile.numpy_dtype
                                                          if profile.dtype != "bf16" else np.float32)
