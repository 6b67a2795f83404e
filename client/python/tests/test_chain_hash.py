"""The Python chain hash equals the C++ client's (kvtier_chain_hash_tool) on the same inputs."""

import os
import subprocess
import unittest

import grpc

import kvtier


def cpp_ids(profile_id, block_size, tokens, extras=()):
    tool = os.environ.get("KVTIER_CHAIN_HASH_TOOL")
    if not tool:
        raise RuntimeError("KVTIER_CHAIN_HASH_TOOL is not set: run through ctest")
    out = subprocess.run([tool, str(profile_id), str(block_size), ",".join(map(str, tokens)), *extras],
                         check=True, capture_output=True, text=True).stdout
    return [bytes.fromhex(line) for line in out.split()]


CASES = [
    # profile_id, block_size, tokens, extra keys
    (1, 16, list(range(64)), ()),
    (3, 16, list(range(50)), ()),                      # trailing partial block dropped
    (7, 4, [1, 2, 3, 4, 5, 6, 7, 8], ("lora:a", "salt")),
    (0, 1, [0, 4294967295, 65536], ("",)),             # empty extra key, largest token
    ((1 << 64) - 1, 3, [255] * 9, ("ab", "c")),
    (42, 16, [(i * 7919) % 256 for i in range(1024)], ("decode:select:key_key:0.125:0011",)),
]


class ChainHashTest(unittest.TestCase):
    def test_equal_to_cpp_sequences(self):
        for profile_id, block_size, tokens, extras in CASES:
            with self.subTest(profile_id=profile_id, block_size=block_size, extras=extras):
                ids = kvtier.chain_hash_sequence(profile_id, tokens, block_size, extras)
                self.assertEqual(len(ids), len(tokens) // block_size)
                self.assertEqual(ids, cpp_ids(profile_id, block_size, tokens, extras))

    def test_equal_to_cpp_single_block(self):
        for tokens in ([], [9], list(range(300))):
            self.assertEqual([kvtier.chain_hash(5, b"", tokens, ["x"])], cpp_ids(5, 0, tokens, ["x"]))

    def test_every_field_changes_the_id(self):
        base = kvtier.chain_hash(7, b"\x11" * 32, [1, 2, 3, 4], ["lora:a", "salt"])
        variants = [
            kvtier.chain_hash(8, b"\x11" * 32, [1, 2, 3, 4], ["lora:a", "salt"]),
            kvtier.chain_hash(7, b"\x11" * 31 + b"\x10", [1, 2, 3, 4], ["lora:a", "salt"]),
            kvtier.chain_hash(7, b"", [1, 2, 3, 4], ["lora:a", "salt"]),
            kvtier.chain_hash(7, b"\x11" * 32, [2, 1, 3, 4], ["lora:a", "salt"]),
            kvtier.chain_hash(7, b"\x11" * 32, [1, 2, 3], ["lora:a", "salt"]),
            kvtier.chain_hash(7, b"\x11" * 32, [1, 2, 3, 4], ["salt", "lora:a"]),
            kvtier.chain_hash(7, b"\x11" * 32, [1, 2, 3, 4], ["lora:a"]),
            # field boundaries: the same bytes split differently
            kvtier.chain_hash(7, b"\x11" * 32, [1, 2, 3, 4], ["lora:as", "alt"]),
        ]
        self.assertEqual(len({base, *variants}), len(variants) + 1)
        self.assertNotEqual(kvtier.chain_hash(1, b"\x09\x00\x00\x00", []), kvtier.chain_hash(1, b"", [9]))

    def test_sequence_continues_a_chain(self):
        tokens = list(range(64))
        ids = kvtier.chain_hash_sequence(3, tokens, 16)
        self.assertEqual(kvtier.chain_hash_sequence(3, tokens[32:], 16, parent=ids[1]), ids[2:])

    def test_bad_input_names_the_argument(self):
        for call, name in ((lambda: kvtier.chain_hash(1, b"", [1, -1]), "tokens[1]"),
                           (lambda: kvtier.chain_hash(1, b"", [1 << 32]), "tokens[0]"),
                           (lambda: kvtier.chain_hash(-1, b"", [1]), "profile_id"),
                           (lambda: kvtier.chain_hash(1, "parent", [1]), "parent"),
                           (lambda: kvtier.chain_hash(1, b"", [1], [3]), "extra_keys[0]"),
                           (lambda: kvtier.chain_hash_sequence(1, [1], 0), "block_size_tokens")):
            with self.assertRaises(kvtier.KvTierError) as e:
                call()
            self.assertEqual(e.exception.code, grpc.StatusCode.INVALID_ARGUMENT)
            self.assertTrue(e.exception.message.startswith(name + ":"), e.exception.message)


if __name__ == "__main__":
    unittest.main()
