"""ctest quality.make_dumps: make_dumps.py remakes shared dumps and plans
new windows on text no shared dump reads, the tune and report sets apart."""

import os
import tempfile
import unittest

import numpy as np

import make_dumps

DATA = os.environ.get("KVTIER_SHARED_DATA", "/work/shared/data")
HAVE_BOOK = os.path.exists(os.path.join(make_dumps.austen_corpus.DEFAULT_DIR, "Rdata.rdx"))


class Args:
    data = DATA
    corpus_dir = make_dumps.austen_corpus.DEFAULT_DIR


@unittest.skipUnless(HAVE_BOOK, "r-cran-janeaustenr is not installed (deploy/install-deps.sh installs it)")
class MakeDumpsTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.book = make_dumps.read_book(Args.corpus_dir)

    def test_remakes_shared_dumps(self):
        # A 1K recall dump (its filler found by the rule) and a 2K window.
        for name in ("rkc-persuasion-recall-00", "rk-persuasion-window-01", "rkl-persuasion-window-00"):
            self.assertEqual(make_dumps.check(Args, name), [], name)

    def test_check_sees_a_wrong_filler(self):
        # The same dump made with another filler start is not the shared one.
        tensors, meta = make_dumps.safetensors_io.read(
            os.path.join(DATA, "realkv", "rkc-persuasion-recall-00.safetensors"))
        offset = int(meta["offset"])
        filler = make_dumps.filler_start(len(self.book), 1024, offset)
        self.assertEqual(make_dumps.window_tokens(self.book, "recall", offset, filler, 1024),
                         bytes(np.asarray(tensors["tokens"], dtype=np.uint8)))
        self.assertNotEqual(make_dumps.window_tokens(self.book, "recall", offset, filler + 64, 1024),
                            bytes(np.asarray(tensors["tokens"], dtype=np.uint8)))

    def test_plan_avoids_shared_text_and_keeps_sets_apart(self):
        n = len(self.book)
        windows = make_dumps.plan(n, 8, make_dumps.shared_ranges(n))
        shared = make_dumps.shared_ranges(n)
        spans = {"tune": [], "report": []}
        for (length, which), starts in windows.items():
            self.assertEqual(len(starts), 8, (length, which))
            for offset, filler in starts:
                self.assertTrue(shared.free(offset, offset + length), (length, which, offset))
                self.assertTrue(shared.free(filler, filler + length // 2), (length, which, filler))
                spans[which] += [(offset, offset + length), (filler, filler + length // 2)]
        for b0, e0 in spans["tune"]:
            for b1, e1 in spans["report"]:
                self.assertTrue(e0 <= b1 or e1 <= b0, ((b0, e0), (b1, e1)))
        # Both sets span the book.
        for which in spans:
            self.assertLess(min(b for b, _ in spans[which]), n // 4, which)
            self.assertGreater(max(b for b, _ in spans[which]), 3 * n // 4, which)

    def test_written_dump_reads_back(self):
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "x.safetensors")
            tensors = {"tokens": np.arange(4, dtype=np.int32), "k": np.ones((2, 3), dtype=np.float16)}
            make_dumps.safetensors_io.write(path, tensors, {"offset": 7})
            got, meta = make_dumps.safetensors_io.read(path)
            self.assertEqual(meta, {"offset": "7"})
            np.testing.assert_array_equal(got["tokens"], tensors["tokens"])
            np.testing.assert_array_equal(got["k"], tensors["k"])


if __name__ == "__main__":
    unittest.main()
