"""docs/design.md's table of floors names every unit of the tree, each on its folder's floor, and no unit that
is gone: the module map cannot drift from src/ and include/tiler/ unnoticed."""
import os
import re
import unittest

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")


def units():
    """(folder, unit) for every src/<folder>/<unit>.cpp and include/tiler/<folder>/<unit>.hpp."""
    found = set()
    for base, suffix in (("src", ".cpp"), (os.path.join("include", "tiler"), ".hpp")):
        top = os.path.join(ROOT, base)
        for folder, _, names in os.walk(top):
            for name in names:
                if name.endswith(suffix):
                    found.add((os.path.relpath(folder, top), name[: -len(suffix)]))
    return found


def floor_rows():
    """floor name -> its row of the table under '## Units'."""
    with open(os.path.join(ROOT, "docs", "design.md"), encoding="utf-8") as f:
        text = f.read()
    rows = {}
    for line in text.splitlines():
        m = re.match(r"^\| (\w+) \| (.*) \|[^|]*\|$", line)
        if m and m.group(1) not in ("floor",):
            rows[m.group(1)] = m.group(2)
    return rows


def floors():
    """folder -> floor, from cmake/floors.cmake."""
    with open(os.path.join(ROOT, "cmake", "floors.cmake"), encoding="utf-8") as f:
        text = f.read()
    by_folder = {}
    for floor, folders in re.findall(r'^\s*"(\w+): ([a-z0-9_/ ]+)"', text, re.M):
        for folder in folders.split():
            by_folder[folder] = floor
    return by_folder


class DesignDoc(unittest.TestCase):
    def test_every_unit_is_named_on_its_floor(self):
        rows, by_folder = floor_rows(), floors()
        self.assertTrue(by_folder)
        missing = []
        for folder, unit in sorted(units()):
            if folder.endswith("tools") or unit.endswith("_main"):
                continue
            row = rows.get(by_folder.get(folder, "?"), "")
            if f"`{unit}`" not in row:
                missing.append(f"{folder}/{unit} (floor {by_folder.get(folder)})")
        self.assertEqual(missing, [], "docs/design.md's floors table lacks these units")

    def test_the_table_names_no_floor_that_is_gone(self):
        self.assertEqual(set(floor_rows()) - set(floors().values()), set())


if __name__ == "__main__":
    unittest.main()
