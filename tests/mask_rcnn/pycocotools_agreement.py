#!/usr/bin/env python3
"""The Mask R-CNN example's COCO evaluation against the reference, pycocotools.

Writes COCO ground-truth and results files that exercise what the evaluation has to get right
(polygons, uncompressed and compressed RLE, crowd regions, small/medium/large objects, score ties,
more than 100 detections on an image, images without objects, a category without ground truth),
scores them with `mask_rcnn_evaluate` and with pycocotools' COCOeval, and requires the twelve
numbers of each type (bbox, segm) to agree. Given --trainer-output DIR, it also checks the
trainer's own table (DIR/evaluation.json) against pycocotools on DIR/ground_truth.json and
DIR/detections.json.

  pycocotools_agreement.py --evaluate build/examples/mask_rcnn/mask_rcnn_evaluate \
      [--trainer-output DIR] [--seeds 5]

Exit status: 0 agree, 1 disagree, 77 pycocotools is not installed (the test is skipped; a
failure instead with DTRAIN_TEST_REQUIRE_PYCOCOTOOLS=1, which tools/run-tests.sh sets).
"""
import argparse
import contextlib
import io
import json
import os
import subprocess
import sys
import tempfile

try:
    import numpy as np
    from pycocotools import mask as mask_utils
    from pycocotools.coco import COCO
    from pycocotools.cocoeval import COCOeval
except ImportError as e:
    required = os.environ.get("DTRAIN_TEST_REQUIRE_PYCOCOTOOLS") == "1"
    print(f"{'FAIL' if required else 'SKIP'}: pycocotools is not importable with "
          f"{sys.executable} ({e}); install it with: python3 -m pip install pycocotools")
    sys.exit(1 if required else 77)

TOLERANCE = 1e-12
NAMES = ["AP", "AP50", "AP75", "APs", "APm", "APl", "AR1", "AR10", "AR100", "ARs", "ARm", "ARl"]


def reference_stats(gt_file, dt_file):
    """pycocotools' twelve numbers for bbox and segm, its own printing silenced."""
    out = {}
    with contextlib.redirect_stdout(io.StringIO()):
        gt = COCO(gt_file)
        dt = gt.loadRes(dt_file)
        for iou_type in ("bbox", "segm"):
            e = COCOeval(gt, dt, iou_type)
            e.evaluate()
            e.accumulate()
            e.summarize()
            out[iou_type] = [float(v) for v in e.stats]
    return out


def random_polygon(rng, cx, cy, radius, points):
    angles = np.sort(rng.uniform(0, 2 * np.pi, points))
    radii = radius * rng.uniform(0.5, 1.0, points)
    xy = np.stack([cx + radii * np.cos(angles), cy + radii * np.sin(angles)], 1)
    return [round(float(v), 2) for v in xy.reshape(-1)]


def polygon_mask(polygon, h, w):
    return mask_utils.decode(mask_utils.merge(mask_utils.frPyObjects([polygon], h, w)))


def compressed(mask):
    rle = mask_utils.encode(np.asfortranarray(mask.astype(np.uint8)))
    return {"size": rle["size"], "counts": rle["counts"].decode("ascii")}


def uncompressed(mask):
    flat = mask.astype(np.uint8).reshape(-1, order="F")
    counts, value, run = [], 0, 0
    for v in flat:
        if v != value:
            counts.append(run)
            run, value = 0, v
        run += 1
    counts.append(run)
    return {"size": list(mask.shape), "counts": [int(c) for c in counts]}


def make_case(seed):
    """A ground truth and results pair; returns (gt dict, results list)."""
    rng = np.random.default_rng(seed)
    images, annotations, results = [], [], []
    categories = [{"id": c, "name": f"class{c}"} for c in (1, 2, 3, 7)]  # 7: never annotated
    next_id = 1
    for image_id in range(1, 13):
        h, w = int(rng.integers(60, 260)), int(rng.integers(60, 260))
        images.append({"id": image_id * 3, "file_name": f"{image_id}.png", "width": w, "height": h})
        if image_id % 6 == 0:  # images without objects, some with false positives
            for _ in range(int(rng.integers(0, 4))):
                box = [float(rng.uniform(0, w / 2)), float(rng.uniform(0, h / 2)), 20.0, 15.0]
                poly = [box[0], box[1], box[0] + 20, box[1], box[0] + 20, box[1] + 15, box[0], box[1] + 15]
                results.append({"image_id": image_id * 3, "category_id": int(rng.integers(1, 4)),
                                "bbox": box, "score": float(rng.uniform(0, 1)),
                                "segmentation": compressed(polygon_mask(poly, h, w))})
            continue
        for _ in range(int(rng.integers(1, 7))):
            category = int(rng.integers(1, 4))
            scale = float(rng.choice([6, 20, 60]))  # small, medium and large objects
            radius = min(scale, min(h, w) / 2 - 1)
            cx, cy = float(rng.uniform(radius, w - radius)), float(rng.uniform(radius, h - radius))
            if rng.uniform() < 0.15:  # partly outside the image: the rasterization clips it
                cx = float(rng.choice([0.0, w - 1.0]))
            polygon = random_polygon(rng, cx, cy, radius, int(rng.integers(3, 9)))
            mask = polygon_mask(polygon, h, w)
            if mask.sum() == 0:
                continue
            crowd = rng.uniform() < 0.1
            form = rng.integers(0, 3)
            if crowd:
                segmentation = uncompressed(mask)
            elif form == 0:
                segmentation = [polygon]
            elif form == 1:
                segmentation = compressed(mask)
            else:
                segmentation = uncompressed(mask)
            rle = mask_utils.encode(np.asfortranarray(mask))
            bbox = [float(v) for v in mask_utils.toBbox(rle)]
            annotations.append({"id": next_id, "image_id": image_id * 3, "category_id": category,
                                "bbox": bbox, "area": float(mask_utils.area(rle)),
                                "iscrowd": int(crowd), "segmentation": segmentation})
            next_id += 1
            # Detections near it: jittered copies (some with the wrong class), scores with ties.
            for k in range(int(rng.integers(0, 4))):
                jitter = rng.normal(0, radius * float(rng.choice([0.02, 0.08, 0.3])), size=len(polygon))
                moved = [float(v) for v in np.array(polygon) + jitter]
                dmask = polygon_mask(moved, h, w)
                if dmask.sum() == 0:
                    continue
                drle = mask_utils.encode(np.asfortranarray(dmask))
                dbox = [float(v) + float(rng.normal(0, 1.0)) for v in mask_utils.toBbox(drle)]
                dbox[2], dbox[3] = max(dbox[2], 1.0), max(dbox[3], 1.0)
                score = float(rng.choice([0.9, 0.5])) if k == 0 else float(rng.uniform(0, 1))
                results.append({"image_id": image_id * 3,
                                "category_id": category if rng.uniform() < 0.85 else int(rng.integers(1, 4)),
                                "bbox": dbox, "score": score, "segmentation": compressed(dmask)})
    # One image with more detections than the 100 that count.
    h, w = images[0]["height"], images[0]["width"]
    for _ in range(130):
        x, y = float(rng.uniform(0, w - 10)), float(rng.uniform(0, h - 10))
        poly = [x, y, x + 8, y, x + 8, y + 8, x, y + 8]
        results.append({"image_id": images[0]["id"], "category_id": 1, "bbox": [x, y, 8.0, 8.0],
                        "score": float(rng.uniform(0, 0.6)),
                        "segmentation": compressed(polygon_mask(poly, h, w))})
    rng.shuffle(results)
    return {"images": images, "annotations": annotations, "categories": categories}, results


def compare(label, ours, reference):
    worst = 0.0
    for iou_type in ("bbox", "segm"):
        for name, a, b in zip(NAMES, ours[iou_type], reference[iou_type]):
            diff = abs(a - b)
            worst = max(worst, diff)
            if diff > TOLERANCE:
                print(f"FAIL {label} {iou_type} {name}: ours {a!r} pycocotools {b!r}")
    print(f"{label}: bbox AP {ours['bbox'][0]:.4f} segm AP {ours['segm'][0]:.4f}; "
          f"largest difference from pycocotools {worst:.3g}")
    return worst <= TOLERANCE


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--evaluate", required=True, help="the mask_rcnn_evaluate program")
    parser.add_argument("--trainer-output", help="a folder the trainer wrote its evaluation to")
    parser.add_argument("--seeds", type=int, default=4)
    args = parser.parse_args()

    ok = True
    with tempfile.TemporaryDirectory() as tmp:
        for seed in range(args.seeds):
            gt, results = make_case(seed)
            gt_file, dt_file = os.path.join(tmp, "gt.json"), os.path.join(tmp, "dt.json")
            stats_file = os.path.join(tmp, "stats.json")
            with open(gt_file, "w") as f:
                json.dump(gt, f)
            with open(dt_file, "w") as f:
                json.dump(results, f)
            run = subprocess.run([args.evaluate, gt_file, dt_file, "--json", stats_file],
                                 capture_output=True, text=True)
            if run.returncode != 0:
                print(f"FAIL case {seed}: mask_rcnn_evaluate exited {run.returncode}:\n"
                      f"{run.stdout}{run.stderr}")
                ok = False
                continue
            with open(stats_file) as f:
                ours = json.load(f)
            ok &= compare(f"case {seed} ({len(gt['annotations'])} objects, "
                          f"{len(results)} detections)", ours, reference_stats(gt_file, dt_file))

    if args.trainer_output:
        folder = args.trainer_output
        with open(os.path.join(folder, "evaluation.json")) as f:
            ours = json.load(f)
        ok &= compare(f"trainer output {folder}", ours,
                      reference_stats(os.path.join(folder, "ground_truth.json"),
                                      os.path.join(folder, "detections.json")))
    print("PASS" if ok else "FAIL")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
