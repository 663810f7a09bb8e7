"""Reads an objects store (--save objects_store) as TIAToolbox's SQLiteStore does and prints what it finds as
JSON: tables, metadata, each row (its geometry decoded from zlib'd WKB and measured here, beside the row's own
cx, cy, area and R-tree bounds), the keys of a bounding-box query issued with SQLiteStore's own SQL, and the
integrity check. Needs only Python's sqlite3, zlib and struct.

With a TIAToolbox source tree (its tiatoolbox/annotation/storage.py, dsl.py and tiatoolbox/enums.py) and
shapely, it also opens the store with TIAToolbox's own SQLiteStore (the package's top level and pandas, which
reading does not use, stubbed), runs its bbox and intersects queries, and compares every row with the token
SQLiteStore itself makes of the annotation it reads (centroid, area, bounds, the zlib'd WKB bytes).

usage: objects_store_check.py STORE X0,Y0,X1,Y1 [TIATOOLBOX_SOURCE]
"""

import json
import os
import shutil
import sqlite3
import struct
import sys
import tempfile
import zlib

# SQLiteStore._initialize_query_string_parameters, geometry_predicate "bbox_intersects".
BBOX_SQL = (
    "SELECT [key]"
    """
                 FROM annotations, rtree
                WHERE annotations.id == rtree.id
                """
    "AND max_x >= :min_x "
    "AND min_x <= :max_x "
    "AND max_y >= :min_y "
    "AND min_y <= :max_y "
)


def read_polygon(data, at):
    order, kind, rings = struct.unpack_from("<BII", data, at)
    assert order == 1 and kind == 3, (order, kind)
    at += 9
    polygon = []
    for _ in range(rings):
        (n,) = struct.unpack_from("<I", data, at)
        at += 4
        points = [struct.unpack_from("<dd", data, at + 16 * i) for i in range(n)]
        at += 16 * n
        polygon.append(points)
    return polygon, at


def read_wkb(data):
    order, kind = struct.unpack_from("<BI", data, 0)
    assert order == 1, order
    if kind == 3:
        polygon, at = read_polygon(data, 0)
        polygons = [polygon]
    else:
        assert kind == 6, kind
        (n,) = struct.unpack_from("<I", data, 5)
        at = 9
        polygons = []
        for _ in range(n):
            polygon, at = read_polygon(data, at)
            polygons.append(polygon)
    assert at == len(data), "bytes after the geometry"
    return ("Polygon" if kind == 3 else "MultiPolygon"), polygons


def measure(polygons):
    """Area (shells less holes), area-weighted centroid and bounds; every ring closed."""
    area = mx = my = 0.0
    xs, ys = [], []
    for polygon in polygons:
        for r, ring in enumerate(polygon):
            assert ring[0] == ring[-1], "a ring not closed"
            a2 = sx = sy = 0.0
            for (x0, y0), (x1, y1) in zip(ring, ring[1:]):
                c = x0 * y1 - x1 * y0
                a2 += c
                sx += (x0 + x1) * c
                sy += (y0 + y1) * c
            sign = 1.0 if (r == 0) == (a2 >= 0) else -1.0
            area += sign * a2 / 2
            mx += sign * sx / 6
            my += sign * sy / 6
            xs += [p[0] for p in ring]
            ys += [p[1] for p in ring]
    return area, mx / area, my / area, [min(xs), min(ys), max(xs), max(ys)]


def import_sqlitestore(source, stub):
    """TIAToolbox's SQLiteStore class from a source tree, its package's top level and pandas (which reading does
    not use) stubbed in the directory `stub`."""
    package = os.path.join(stub, "tiatoolbox")
    if not os.path.isdir(package):
        os.makedirs(os.path.join(package, "annotation"))
        shutil.copy(os.path.join(source, "tiatoolbox", "enums.py"), package)
        for name in ("storage.py", "dsl.py"):
            shutil.copy(os.path.join(source, "tiatoolbox", "annotation", name), os.path.join(package, "annotation"))
        open(os.path.join(package, "annotation", "__init__.py"), "w").close()
        with open(os.path.join(package, "__init__.py"), "w") as f:
            f.write(
                "import logging\n__version__ = 'source'\nlogger = logging.getLogger('tiatoolbox')\n"
                "class DuplicateFilter(logging.Filter):\n    pass\n"
            )
        try:
            import pandas  # noqa: F401
        except ImportError:
            os.makedirs(os.path.join(stub, "pandas"))
            with open(os.path.join(stub, "pandas", "__init__.py"), "w") as f:
                f.write("DataFrame = None\n")
    sys.path.insert(0, stub)
    from tiatoolbox.annotation.storage import SQLiteStore

    return SQLiteStore


def tiatoolbox_reading(store, bbox, source):
    """What TIAToolbox's own SQLiteStore makes of the store (a copy: SQLiteStore's close() optimizes)."""
    stub = tempfile.mkdtemp()
    try:
        SQLiteStore = import_sqlitestore(source, stub)
        from shapely.geometry import box

        copy = os.path.join(stub, "store.db")
        shutil.copy(store, copy)
        s = SQLiteStore(copy)
        found = s.query(box(*bbox), geometry_predicate="bbox_intersects")
        intersects = s.query(box(*bbox), geometry_predicate="intersects")
        mismatches = []
        for key, annotation in s.items():
            token = s._make_token(annotation, key)
            row = s.con.execute(
                "SELECT cx, cy, area, geometry FROM annotations WHERE [key] = ?", (key,)
            ).fetchone()
            bounds = s.con.execute(
                "SELECT min_x, min_y, max_x, max_y FROM rtree, annotations "
                "WHERE annotations.id == rtree.id AND [key] = ?",
                (key,),
            ).fetchone()
            same = (
                abs(row[0] - token["cx"]) <= 1e-9 * max(1, abs(token["cx"]))
                and abs(row[1] - token["cy"]) <= 1e-9 * max(1, abs(token["cy"]))
                and abs(row[2] - token["area"]) <= 1e-9 * max(1, abs(token["area"]))
                and row[3] == token["geometry"]
                # The R-tree holds float32 bounds rounded outwards.
                and bounds[0] <= token["min_x"] and bounds[1] <= token["min_y"]
                and bounds[2] >= token["max_x"] and bounds[3] >= token["max_y"]
            )
            if not same:
                mismatches.append(key)
        result = {
            "bbox_keys": sorted(found, key=int),
            "intersects_keys": sorted(intersects, key=int),
            "types": {k: a.properties.get("type") for k, a in found.items()},
            "geometry_types": sorted({a.geometry.geom_type for a in s.values()}),
            "compression": s.compression,
            "count": len(s),
            "token_mismatches": mismatches,
        }
        s.close()
        del s  # its __del__ closes it again: while the copy is still there
        return result
    finally:
        shutil.rmtree(stub, ignore_errors=True)


def main():
    store, bbox_text = sys.argv[1], sys.argv[2]
    bbox = [float(v) for v in bbox_text.split(",")]
    con = sqlite3.connect("file:" + store + "?mode=ro", uri=True)
    out = {
        "tables": sorted(r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type = 'table'")),
        "metadata": {k: json.loads(v) for k, v in con.execute("SELECT key, value FROM metadata")},
        "columns": [r[1] for r in con.execute("PRAGMA table_info(annotations)")],
        "integrity": con.execute("PRAGMA integrity_check").fetchone()[0],
        "rows": [],
    }
    rows = con.execute(
        "SELECT annotations.id, [key], objtype, cx, cy, geometry, properties, area, min_x, min_y, max_x, max_y "
        "FROM annotations, rtree WHERE annotations.id == rtree.id ORDER BY annotations.id"
    )
    for id_, key, objtype, cx, cy, geometry, properties, area, *bounds in rows:
        kind, polygons = read_wkb(zlib.decompress(geometry))
        g_area, g_cx, g_cy, g_bounds = measure(polygons)
        out["rows"].append(
            {
                "id": id_,
                "key": key,
                "objtype": objtype,
                "wkb_type": kind,
                "cx": cx,
                "cy": cy,
                "area": area,
                "rtree": bounds,
                "geometry_area": g_area,
                "geometry_cx": g_cx,
                "geometry_cy": g_cy,
                "geometry_bounds": g_bounds,
                "properties": json.loads(properties),
                "compact": properties == json.dumps(json.loads(properties), separators=(",", ":")),
            }
        )
    q = dict(zip(("min_x", "min_y", "max_x", "max_y"), bbox))
    out["bbox_keys"] = sorted((r[0] for r in con.execute(BBOX_SQL, q)), key=int)
    con.close()
    if len(sys.argv) > 3 and os.path.isfile(os.path.join(sys.argv[3], "tiatoolbox", "annotation", "storage.py")):
        out["tiatoolbox"] = tiatoolbox_reading(store, bbox, sys.argv[3])
    print(json.dumps(out))


if __name__ == "__main__":
    main()
