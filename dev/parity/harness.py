"""Every comparison of the parity harness in one run, printed as the tables of docs/reference_differences.md."""
import os
import tempfile

from dev.parity.chip_targets import TARGET_VARIANTS, compare_chip_targets
from dev.parity.compare import (MINING_RANGES, MINING_SCALES, MINING_VARIANTS, unshuffled_project_cover,
                                compare_chips, compare_coco_boxes, compare_merge, compare_mining, compare_results,
                                random_mining_scene)
from dev.parity.detection import compare_test_batches, compare_test_proposals
from dev.parity.mask_network import compare_mask_network
from dev.parity.reference import provenance_table
from dev.parity.tables import format_table


def run(reference, cases=200, images=100, seed=0, workdir=None, fork=None, batches=100, scenes=20, test_images=16,
        mask_chips=2, mask_chip_size=192):
    """Every comparison against ``reference`` (a dev.parity.reference.ReferenceCheckout) and, given ``fork``
    (a dev.parity.fork.ForkCheckout), its operators on ``batches`` random batches; the tables. The mask
    network's run on ``mask_chips`` chips of ``mask_chip_size`` px (0 chips: left out). The first table says
    which commits were read."""
    with tempfile.TemporaryDirectory(prefix="sniper_parity_") as scratch:
        workdir = workdir or scratch
        bbox = reference.bbox_transform()
        coco = reference.coco_module()
        chips = reference.chip_generator(os.path.join(workdir, "chips"))
        overlaps = reference.bbox_extension(os.path.join(workdir, "bbox"))
        workers = reference.data_workers(chips, overlaps, reference.nms_module(os.path.join(workdir, "nms")))
        tester = reference.tester_module(workers, reference.bbox_transform(overlaps))
        tables = [
            format_table(*provenance_table(reference, fork)),
            format_table(f"Chip generator ({cases} random images, seed {seed})", ["quantity", "agreement"],
                         compare_chips(chips, bbox.clip_boxes, cases, seed)),
            format_table(f"Chip mining ({images} random scenes, 3 scales, seed {seed})",
                         ["quantity", "defaults (reference rules)", "variants: " + ", ".join(
                             f"`{key}: {value}`" for key, value in MINING_VARIANTS)],
                         [[name, value, variant] for (name, value), (_, variant) in
                          zip(compare_mining(workers, images, seed), compare_mining(workers, images, seed,
                                                                                    MINING_VARIANTS))]),
            format_table(f"Chip inputs and RPN targets ({scenes} random scenes and their mirror images, seed {seed})",
                         ["quantity", "defaults (reference rules)", "variants: " + ", ".join(
                             f"`{key}: {value}`" for key, value in TARGET_VARIANTS)],
                         [[name, value, variant] for (name, value), (_, variant) in zip(*(
                             compare_chip_targets(workers, scenes, seed, os.path.join(workdir, "scenes"),
                                                  random_mining_scene, MINING_SCALES, MINING_RANGES,
                                                  unshuffled_project_cover, overrides)
                             for overrides in ((), TARGET_VARIANTS)))]),
            format_table(f"Multi-scale merge ({images} images of random candidates at 3 scales, seed {seed})",
                         ["quantity", "agreement"], compare_merge(tester, workers, images, seed)),
            format_table(f"COCO gt boxes ({images} random images, seed {seed}, `dataset.INTEGER_BOXES` true)",
                         ["quantity", "fractional boxes, some starting left of / above the image",
                          "the same scenes, every box starting inside"],
                         compare_coco_boxes(coco, images, seed, workdir)),
            format_table(f"Results file ({images} images of random detections, seed {seed})",
                         ["quantity", "agreement"], compare_results(coco, images, seed)),
            format_table(f"Test batches ({test_images} random images, the COCO test scales, 2 / 2 / 4 images a batch, "
                         f"2 parts, seed {seed})", ["quantity", "detection (`MNIteratorTestAutoFocus`)",
                                                    "proposal extraction (`MNIteratorTest`)"],
                         compare_test_batches(reference.test_iterators(workers), test_images, seed,
                                              os.path.join(workdir, "test_images"))),
        ]
        if fork is not None:
            tables.append(format_table(
                f"Test proposal layer on shared canvases ({batches} random batches of 2-4 images, seed {seed}, "
                f"`TEST.PROPOSAL_LAYER: reference`)", ["quantity", "agreement"],
                compare_test_proposals(fork.multi_proposal(os.path.join(workdir, "fork")), batches, seed)))
        if mask_chips:
            tables += [format_table(*table) for table in compare_mask_network(reference, mask_chips, mask_chip_size,
                                                                               seed)]
        return "\n".join(tables)
