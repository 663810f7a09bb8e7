#!/usr/bin/env python3
"""Checks an OME-Zarr store as its readers see it, for zarr_writer_test.

zarr_check.py STORE MANIFEST SCHEMA_DIR: MANIFEST (JSON) lists {"path": array path, "npy": expected values,
"chunks": [...]} for every array the store must hold, "strict": whether the strict schemas apply (a pyramid's
type and metadata), and "labels": the label image's name or null. Checks with python3-zarr that each array
equals its .npy (shape, dtype, chunks, values) and that the multiscales list exactly those arrays, and with
python3-jsonschema that every .zattrs is valid OME-NGFF 0.4 (and that a copy without its axes is not, so that
the schemas are seen to reject). Prints what failed and exits 1; exits 77 when zarr, numpy or jsonschema is
missing.
"""
import copy
import json
import os
import sys

try:
    import jsonschema
    import numpy as np
    import zarr
except ImportError as e:
    print(f"missing Python module: {e.name}")
    sys.exit(77)

SCHEMA_URL = "https://ngff.openmicroscopy.org/0.4/schemas/{}.schema"


def validators(schema_dir):
    """Draft 2020-12 validators by schema name; the strict schemas' $refs resolve to the vendored files."""
    schemas = {}
    for name in ("image", "label", "strict_image", "strict_label"):
        with open(os.path.join(schema_dir, name + ".schema")) as f:
            schemas[SCHEMA_URL.format(name)] = json.load(f)
    out = {}
    for url, schema in schemas.items():
        name = url.rsplit("/", 1)[1][: -len(".schema")]
        try:  # jsonschema 4.18+: a registry
            from referencing import Registry, Resource
            from referencing.jsonschema import DRAFT202012

            registry = Registry().with_resources(
                (u, Resource.from_contents(s, default_specification=DRAFT202012)) for u, s in schemas.items()
            )
            out[name] = jsonschema.Draft202012Validator(schema, registry=registry)
        except ImportError:  # Debian 12's 4.10: a resolver with the schemas in its store
            resolver = jsonschema.RefResolver.from_schema(schema, store=schemas)
            out[name] = jsonschema.Draft202012Validator(schema, resolver=resolver)
    return out


def validate(attrs, names, where, check, errors):
    for name in names:
        problems = [e.message for e in check[name].iter_errors(attrs)]
        if problems:
            errors.append(f"{where}/.zattrs is not valid against {name}.schema: {problems[:3]}")
    broken = copy.deepcopy(attrs)
    del broken["multiscales"][0]["axes"]
    if check["image"].is_valid(broken):
        errors.append(f"{where}/.zattrs without axes passes image.schema: the schema checks nothing")


def datasets(attrs):
    return [d["path"] for d in attrs["multiscales"][0]["datasets"]]


def main(store, manifest_path, schema_dir):
    with open(manifest_path) as f:
        manifest = json.load(f)
    errors = []
    root = zarr.open_group(store, mode="r")
    for entry in manifest["arrays"]:
        array = root[entry["path"]]
        expected = np.load(entry["npy"])
        if array.shape != expected.shape or array.dtype != expected.dtype:
            errors.append(f"{entry['path']}: {array.shape} {array.dtype}, expected {expected.shape} {expected.dtype}")
            continue
        if list(array.chunks) != entry["chunks"]:
            errors.append(f"{entry['path']}: chunks {array.chunks}, expected {entry['chunks']}")
        values = array[:]
        if not np.array_equal(values, expected):
            where = np.argwhere(values != expected)[0].tolist()
            errors.append(f"{entry['path']}: differs first at {where}: {values[tuple(where)]} != "
                          f"{expected[tuple(where)]}")
    check = validators(schema_dir)
    strict = manifest["strict"]
    paths = [e["path"] for e in manifest["arrays"]]
    image_levels = label_levels = None
    if "multiscales" in root.attrs:
        attrs = root.attrs.asdict()
        validate(attrs, ["image", "strict_image"] if strict else ["image"], "/", check, errors)
        image_levels = datasets(attrs)
        missing = [p for p in image_levels if p not in paths]
        if missing:
            errors.append(f"the image's datasets {missing} are not among the arrays checked")
    label = manifest["labels"]
    if label is not None:
        listed = root["labels"].attrs.asdict().get("labels")
        if listed != [label]:
            errors.append(f"labels/.zattrs lists {listed}, not [{label!r}]")
        attrs = root["labels"][label].attrs.asdict()
        names = ["image", "label"] + (["strict_image", "strict_label"] if strict else [])
        validate(attrs, names, "labels/" + label, check, errors)
        label_levels = datasets(attrs)
        missing = [p for p in label_levels if f"labels/{label}/{p}" not in paths]
        if missing:
            errors.append(f"the labels' datasets {missing} are not among the arrays checked")
    if image_levels is not None and label_levels is not None and len(image_levels) != len(label_levels):
        errors.append(f"the image has {len(image_levels)} levels, its labels {len(label_levels)}")
    for error in errors:
        print(error)
    print("ok" if not errors else f"{len(errors)} problems")
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:4]))
