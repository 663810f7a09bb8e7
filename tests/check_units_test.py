"""cmake/check_units.py: a cycle of includes between units is found and named; a tree without one passes."""
import os
import subprocess
import sys
import tempfile
import unittest

CHECKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "cmake", "check_units.py")


def tree(files):
    root = tempfile.mkdtemp()
    for path, text in files.items():
        full = os.path.join(root, path)
        os.makedirs(os.path.dirname(full), exist_ok=True)
        with open(full, "w") as f:
            f.write(text)
    return root


def check(root):
    return subprocess.run([sys.executable, CHECKER, root], capture_output=True, text=True)


class CheckUnits(unittest.TestCase):
    def test_a_tree_whose_units_lean_one_way_passes(self):
        root = tree({
            "include/tiler/a/low.hpp": "#pragma once\n",
            "src/a/low.cpp": '#include "tiler/a/low.hpp"\n',
            "include/tiler/a/high.hpp": '#include "tiler/a/low.hpp"\n',
            "src/a/high.cpp": '#include "tiler/a/high.hpp"\n#include <tiler/a/low.hpp>\n',
        })
        result = check(root)
        self.assertEqual(result.returncode, 0, result.stdout)

    def test_a_cycle_through_a_source_file_is_named_with_its_lines(self):
        root = tree({
            "include/tiler/a/one.hpp": '#include "tiler/b/two.hpp"\n',
            "src/a/one.cpp": '#include "tiler/a/one.hpp"\n',
            "include/tiler/b/two.hpp": "#pragma once\n",
            "src/b/two.cpp": '#include "tiler/b/two.hpp"\n#include <tiler/a/one.hpp>\n',
        })
        result = check(root)
        self.assertEqual(result.returncode, 1)
        self.assertIn("a/one <-> b/two", result.stdout)
        self.assertIn("src/b/two.cpp:2", result.stdout)
        self.assertIn("include/tiler/a/one.hpp:1", result.stdout)

    def test_a_private_header_beside_a_source_counts(self):
        root = tree({
            "src/a/x.cpp": '#include "y.hpp"\n',
            "src/a/y.hpp": "#pragma once\n",
            "src/a/y.cpp": '#include "y.hpp"\n#include "tiler/a/x.hpp"\n',
            "include/tiler/a/x.hpp": "#pragma once\n",
        })
        result = check(root)
        self.assertEqual(result.returncode, 1)
        self.assertIn("a/x <-> a/y", result.stdout)

    def test_this_tree_has_no_cycle(self):
        result = check(os.path.join(os.path.dirname(CHECKER), ".."))
        self.assertEqual(result.returncode, 0, result.stdout)


if __name__ == "__main__":
    unittest.main()
