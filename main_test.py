"""Test SNIPER: ``python main_test.py --model RUN_FOLDER|FILE.params [--set KEY VALUE ...]``
or ``python main_test.py --cfg FILE [--set KEY VALUE ...]``.

With ``--model`` alone the run folder's config.yaml is the config (``--set`` overrides test-time keys)
and results go into that run folder; with ``--cfg`` the checkpoint is ``--model``, ``TEST.MODEL`` or
epoch ``TEST.TEST_EPOCH`` of the config's run. Runs the multi-scale tester on ``dataset.test_image_set``
(results JSON + COCO/VOC evaluation under ``{output_path}/{name}/results/``), or, with ``--set TEST.EXTRACT_PROPOSALS true``, extracts RPN
proposals of ``dataset.image_set`` for negative chip mining. With ``--images FOLDER|LIST`` it tests every image of a
folder (or listed in a text file) without annotations: COCO-format results, and drawn images with ``--draw``
(lib/inference/image_folder.py). Both also write GeoJSON for geo-referenced images (lib/inference/geojson.py).
``--vis`` draws every test image's detections at each scale and merged into ``{results}/vis/scale{n}/`` and
``vis/final/``; ``--set TEST.USE_CACHE true`` caches each scale's detections and merges again from them, without
the network, in the next run (lib/inference/scale_cache.py).
"""
from lib.bootstrap import use_project_python

if __name__ == "__main__":
    use_project_python()  # before any third-party import: re-runs this in .venv when another Python started it

import argparse

from lib.config import ConfigError
from lib.config.core import dump_config
from lib.logger import log_config, logged_outcome, report_user_errors, setup_logging
from lib.inference.onnx_network import add_backend_argument, with_backend
from lib.run.folder import add_model_arguments, config_from_model_arguments


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_model_arguments(parser)
    add_backend_argument(parser)
    parser.add_argument("--images", help="a folder of images, or a text file listing image paths, to test without "
                                         "annotations (results in {run}/results/images_NAME/ or --out)")
    parser.add_argument("--draw", action="store_true", help="with --images: also write each image with its detections")
    parser.add_argument("--vis", action="store_true", help="draw each test image's detections at every scale and "
                                                            "merged (results folder, vis/)")
    parser.add_argument("--draw-thresh", type=float, default=0.5, help="score of the detections drawn (0.5)")
    parser.add_argument("--out", help="with --images: the output folder")
    args = with_backend(parser.parse_args(argv))
    if args.vis and args.images:
        parser.error("--vis draws the detections of the dataset test; with --images use --draw")
    return args


@report_user_errors  # a user's mistake (lib/errors.py) in one line, before and after logging starts
def main(argv=None):
    args = parse_args(argv)
    cfg = config_from_model_arguments(args)
    if args.vis and cfg.TEST.EXTRACT_PROPOSALS:
        raise ConfigError("--vis draws detections: TEST.EXTRACT_PROPOSALS true extracts proposals, which it does not "
                          "draw (set it false, or leave out --vis)")
    from lib.inference.tester import extract_proposals, test
    from lib.start_checks import check_test_start
    from lib.run.checkpoint import output_dir

    check_test_start(cfg, None if args.images else
                     cfg.dataset.image_set if cfg.TEST.EXTRACT_PROPOSALS else cfg.dataset.test_image_set)
    setup_logging(output_dir(cfg), name="test")
    with logged_outcome("proposal extraction" if cfg.TEST.EXTRACT_PROPOSALS else "testing"):
        log_config(args.cfg or args.model, args.set, dump_config(cfg))
        if args.images:
            from lib.inference.image_folder import detect_images

            detect_images(cfg, args.images, args.out, args.draw, args.draw_thresh)
        elif cfg.TEST.EXTRACT_PROPOSALS:
            extract_proposals(cfg)
        else:
            test(cfg, vis=args.vis, vis_thresh=args.draw_thresh)


if __name__ == "__main__":
    main()
