"""The typed surface of the package, without a daemon: the enums mirror the
proto's, SelectEntry mirrors ContextSelect, no public annotation is Any, the
generated stubs sit beside the generated modules, and the versions agree."""

import dataclasses
import glob
import inspect
import os
import re
import unittest

import grpc
import numpy as np
from google.protobuf import descriptor_pool

import kvtier
import kvtier.arena
import kvtier.chain_hash
import kvtier.client
import kvtier.connector
import kvtier.cuda_arena
import kvtier.enums
import kvtier.errors
import kvtier.fd_passing
import kvtier.local_daemon
import kvtier.profile
import kvtier.select
import kvtier.wire
from kvtier.enums import CompactBias, CompactImportance, CompactMerge, DType, Residency, ReturnMode, Scorer, Tier
from kvtier.v1 import admin_pb2, kvtier_pb2, types_pb2

HERE = os.path.dirname(os.path.abspath(__file__))
SOURCE = os.path.dirname(os.path.dirname(os.path.dirname(HERE)))
INVALID = grpc.StatusCode.INVALID_ARGUMENT

MODULES = [kvtier, kvtier.arena, kvtier.chain_hash, kvtier.client, kvtier.connector, kvtier.cuda_arena,
           kvtier.enums, kvtier.errors, kvtier.fd_passing, kvtier.local_daemon, kvtier.profile, kvtier.select,
           kvtier.wire]


def _public_annotations():
    """(where, annotation text) of every annotation of a public name defined
    in the package: functions, classes' public methods and properties, their
    class-level (dataclass) fields, and module-level variables."""
    seen = set()

    def of_function(where, fn):
        for name, text in getattr(fn, "__annotations__", {}).items():
            yield f"{where}({name})", str(text)

    for module in MODULES:
        for name, text in getattr(module, "__annotations__", {}).items():
            if not name.startswith("_"):
                yield f"{module.__name__}.{name}", str(text)
        for name, obj in vars(module).items():
            if name.startswith("_") or getattr(obj, "__module__", None) != module.__name__ or id(obj) in seen:
                continue
            seen.add(id(obj))
            where = f"{module.__name__}.{name}"
            if inspect.isfunction(obj):
                yield from of_function(where, obj)
            elif inspect.isclass(obj):
                for field, text in vars(obj).get("__annotations__", {}).items():
                    if not field.startswith("_"):
                        yield f"{where}.{field}", str(text)
                for attr, member in vars(obj).items():
                    if attr.startswith("_") and attr != "__init__":
                        continue
                    if isinstance(member, (staticmethod, classmethod)):
                        member = member.__func__
                    if isinstance(member, property):
                        member = member.fget
                    if inspect.isfunction(member):
                        yield from of_function(f"{where}.{attr}", member)


class EnumTest(unittest.TestCase):
    def test_every_enum_mirrors_its_proto_enum(self):
        pool = descriptor_pool.Default()
        for cls, full_name in kvtier.enums.PROTO_ENUMS.items():
            proto = pool.FindEnumTypeByName(full_name)
            names = [v.name for v in proto.values]
            prefix = os.path.commonprefix(names)
            prefix = prefix[: prefix.rfind("_") + 1]
            want = {v.name[len(prefix):]: v.number for v in proto.values}
            self.assertEqual({m.name: m.value for m in cls}, want, f"{cls.__name__} vs {full_name}")

    def test_every_proto_enum_has_a_python_enum(self):
        mirrored = set(kvtier.enums.PROTO_ENUMS.values())
        for module in (types_pb2, kvtier_pb2, admin_pb2):
            for enum in module.DESCRIPTOR.enum_types_by_name.values():
                self.assertIn(enum.full_name, mirrored, f"{enum.full_name} has no enum in kvtier.enums")

    def test_members_are_the_proto_numbers(self):
        self.assertEqual(kvtier_pb2.SCORER_KEY_KEY, Scorer.KEY_KEY)
        self.assertEqual(types_pb2.TIER_NVME, Tier.NVME)
        self.assertIs(Tier(types_pb2.TIER_HOST), Tier.HOST)
        msg = kvtier_pb2.GetBlocksRequest(mode=ReturnMode.HANDLES)
        self.assertEqual(msg.mode, kvtier_pb2.RETURN_MODE_HANDLES)
        block = kvtier_pb2.SelectedBlock(residency=kvtier_pb2.RESIDENCY_PENDING)
        self.assertIs(Residency(block.residency), Residency.PENDING)
        self.assertEqual(kvtier.Profile("m", 1, 1, 8, 16, "bf16").to_proto().dtype, DType.BF16)

    def test_members_numbers_and_deprecated_names_are_accepted(self):
        coerce = kvtier.enums.coerce
        for given in (Scorer.KEY_KEY, 1, kvtier_pb2.SCORER_KEY_KEY, "key_key", "KEY_KEY", "SCORER_KEY_KEY",
                      "key-key", "KeyKey"):
            self.assertIs(coerce(Scorer, given, "scorer"), Scorer.KEY_KEY, given)
        self.assertIs(coerce(Tier, "nvme", "tier"), Tier.NVME)
        self.assertIs(coerce(ReturnMode, "handles", "mode"), ReturnMode.HANDLES)
        self.assertIs(coerce(CompactImportance, "snapkv", "importance"), CompactImportance.SNAPKV)
        self.assertIs(coerce(CompactMerge, "none", "merge"), CompactMerge.NONE)
        self.assertIs(coerce(CompactBias, "attention_ratio", "bias"), CompactBias.ATTENTION_RATIO)
        self.assertIs(kvtier.scorer_value("recency"), Scorer.RECENCY)

    def test_unknown_values_name_the_argument_and_the_members(self):
        for cls, given in ((Scorer, "keykeyy"), (Scorer, 99), (Tier, "disk"), (Tier, True), (ReturnMode, 2.0),
                           (CompactMerge, None)):
            with self.assertRaises(kvtier.KvTierError) as cm:
                kvtier.enums.coerce(cls, given, "the_arg")
            self.assertEqual(cm.exception.code, INVALID)
            self.assertIn("the_arg", cm.exception.message)
            self.assertIn(f"{cls.__name__}.{list(cls)[1].name}", cm.exception.message)


class SelectEntryTest(unittest.TestCase):
    def test_has_every_context_select_field(self):
        proto = {f.name for f in kvtier_pb2.ContextSelect.DESCRIPTOR.fields}
        ours = {f.name for f in dataclasses.fields(kvtier.SelectEntry)}
        self.assertEqual(ours, proto, "SelectEntry and ContextSelect have different fields")

    def test_builds_what_the_dict_builds(self):
        anchor = np.linspace(-1, 1, 32, dtype=np.float32)
        cases = [
            (kvtier.SelectEntry(7, max_blocks=4, scorer=Scorer.KEY_KEY, anchor=anchor, step=3, wait_ms=5),
             {"context_id": 7, "max_blocks": 4, "scorer": "key_key", "anchor": anchor, "step": 3, "wait_ms": 5}),
            (kvtier.SelectEntry(8, max_tokens=64, query=[0.5] * 32, head_queries=anchor, recency_weight=0.25,
                                centered=False),
             {"context_id": 8, "max_tokens": 64, "query": [0.5] * 32, "head_queries": anchor,
              "recency_weight": 0.25, "centered": False}),
            (kvtier.SelectEntry(9), {"context_id": 9}),
        ]
        for entry, fields in cases:
            typed = kvtier.select.build_entry(entry, 0, {})
            self.assertEqual(typed, kvtier.select.build_entry(fields, 0, {}), entry)
        # Unset optional fields stay unset (the daemon's settings apply).
        msg = kvtier.select.build_entry(cases[2][0], 0, {})
        self.assertFalse(msg.HasField("recency_weight"))
        self.assertFalse(msg.HasField("centered"))
        self.assertIsNone(msg.WhichOneof("budget"))
        self.assertTrue(kvtier.select.build_entry(cases[1][0], 0, {}).HasField("centered"))

    def test_entries_are_checked_as_dicts_are(self):
        def refused(entry, *fragments):
            with self.assertRaises(kvtier.KvTierError) as cm:
                kvtier.select.build_entry(entry, 2, {5: (2, 2, 32)})
            self.assertEqual(cm.exception.code, INVALID)
            for fragment in fragments:
                self.assertIn(fragment, cm.exception.message)

        refused(kvtier.SelectEntry(5, max_blocks=1, max_tokens=16), "contexts[2]", "one budget")
        refused(kvtier.SelectEntry(5, scorer="nope"), "contexts[2].scorer")
        refused(kvtier.SelectEntry(5, anchor=np.ones(31, np.float32)), "contexts[2].anchor", "31 floats")
        refused(kvtier.SelectEntry(5, query=[float("inf")]), "contexts[2].query", "NaN or Inf")
        refused(["not", "an", "entry"], "contexts[2]", "SelectEntry")
        with self.assertRaises(TypeError):
            kvtier.SelectEntry(5, 8)  # every field but context_id is keyword-only


class AnnotationTest(unittest.TestCase):
    def test_no_public_annotation_is_any(self):
        found = list(_public_annotations())
        self.assertGreater(len(found), 150)
        offenders = [f"{where}: {text}" for where, text in found if re.search(r"\bAny\b", text)]
        self.assertEqual(offenders, [])

    def test_client_methods_return_messages_not_any(self):
        returns = {name: fn.__annotations__.get("return") for name, fn in vars(kvtier.Client).items()
                   if inspect.isfunction(fn) and not name.startswith("_")}
        self.assertGreaterEqual(len(returns), 29)
        self.assertEqual([n for n, r in returns.items() if r is None], [], "methods without a return annotation")
        self.assertEqual(returns["stats"], "admin_pb2.StatsResponse")
        self.assertEqual(returns["lookup"], "kvtier_pb2.LookupResponse")
        self.assertEqual(returns["verify"], "list[admin_pb2.VerifyProgress]")


class BuiltPackageTest(unittest.TestCase):
    def test_every_generated_module_has_its_stub(self):
        root = os.path.dirname(os.path.abspath(kvtier.__file__))
        self.assertTrue(os.path.isfile(os.path.join(root, "py.typed")))
        modules = glob.glob(os.path.join(root, "v1", "*_pb2.py")) + glob.glob(os.path.join(root, "_health", "*_pb2.py"))
        self.assertEqual(len(modules), 4)
        for module in modules:
            self.assertTrue(os.path.isfile(module + "i"), f"{module}: no .pyi beside it")

    def test_versions_agree(self):
        with open(os.path.join(SOURCE, "CMakeLists.txt"), encoding="utf-8") as f:
            cmake = re.search(r"project\(kvtier VERSION ([0-9.]+)", f.read())
        self.assertIsNotNone(cmake)
        self.assertEqual(kvtier.__version__, cmake.group(1))
        with open(os.path.join(SOURCE, "client", "python", "pyproject.toml"), encoding="utf-8") as f:
            self.assertIn('version = {attr = "kvtier.__version__"}', f.read())


if __name__ == "__main__":
    unittest.main()
