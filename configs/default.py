"""Every configuration key with its default value.

YAML files under configs/ override these, and ``--set KEY VALUE`` overrides both. A key that is not
here is rejected, and a value is parsed to the type of its default, so this file is the reference
for what can be configured. Values are the published COCO settings unless a comment says otherwise.
"""

DEFAULTS = {
    # Where checkpoints, logs, caches and results go: {output_path}/{config name}/...
    "output_path": "output",
    # Backbone: "resnet101" (deformable res5, the published network), "resnet50", "resnet_tiny" (stride 16),
    # "mobilenetv2" (the reference's lightweight detector, stride 32) or "mobilenetv2_tiny" (stride 32).
    "symbol": "resnet101",
    # Devices: "0,1,2" for GPUs; "" or "cpu:N" for N CPU contexts.
    "gpus": "",
    "default": {
        "frequent": 20,  # log metrics every N batches (and at least 4 times an epoch)
        # One machine: "device" (gradients summed on the GPUs) or "local" (on the CPU); any other name
        # mx.kv.create knows (e.g. "nccl") goes to Module as is. Several machines, started by
        # tools/launch.py: "dist_sync" or "dist_device_sync"; asynchronous "dist_async" is refused.
        "kvstore": "device",
        "seed": 3,
    },
    "network": {
        "pretrained": "",  # MXNet checkpoint prefix of ImageNet weights ("" with TRAIN.FROM_SCRATCH)
        "pretrained_epoch": 0,
        "PIXEL_MEANS": [103.939, 116.779, 123.68],  # listed in BGR order
        # Channel order the network is fed (images are decoded BGR): RGB as the reference and its
        # checkpoints; BGR feeds the channels as decoded.
        "CHANNEL_ORDER": "RGB",
        "IMAGE_STRIDE": 0,  # > 0: test canvases rounded up to a multiple of it (0: exactly the largest image)
        "FIXED_PARAMS": ["conv0", "bn0", "stage1"],  # name prefixes kept frozen
        # Keep every batch-norm's gamma and beta at their pretrained values while its statistics still
        # come from the batch: the reference MobileNetV2 does this (its FIXED_PARAMS 'gamma', 'beta'
        # match every batch-norm parameter by substring).
        "FIXED_BN_AFFINE": False,
        # Keep the input normaliser bn_data's beta at its pretrained value (its gamma is fixed at 1 by the
        # layer). reference: false, trained (its rule fixes the arguments whose names contain a FIXED_PARAMS
        # entry, and none names bn_data); true: the project's earlier frozen normaliser.
        "FIXED_INPUT_NORMALISER": False,
        # AutoFocus: the FocusPixel branch (training input scale_label, test output scale_prob).
        "AUTO_FOCUS": False,
        "ANCHOR_RATIOS": [0.5, 1.0, 2.0],
        "ANCHOR_SCALES": [2, 4, 7, 10, 13, 16, 24],
        "NUM_ANCHORS": 21,
        "BN_MOMENTUM": 0.995,
        # Deformable convolution and PS-ROI pooling on CPU contexts: "compiled" (lib/ops' multi-core host
        # kernels, same parameters and results) or "stock" (MXNet's single-threaded CPU kernels). GPU
        # contexts always use MXNet's operators.
        "CPU_DEFORMABLE_OPS": "compiled",
    },
    "dataset": {
        # coco, pascal_voc, or synthetic: the project's COCO-format shapes dataset, generated on first use
        # under dataset_path with the synthetic_* image counts and seed.
        "dataset": "coco",
        "dataset_path": "data/coco",
        "image_set": "train2014+valminusminival2014",  # several sets joined with '+'
        "test_image_set": "minival2014",
        "root_path": "data",  # roidb caches go to {root_path}/cache
        "NUM_CLASSES": 0,  # 0: derived from the annotation file (background included)
        # pascal_voc only: the class names (background excluded) of own VOC-format data, as a list or a text file
        # of one name per line (at most one of the two); both empty: VOC's 20 classes.
        "CLASSES": [],
        "CLASSES_FILE": "",
        "proposal": "",  # proposals file for negative chip mining ("" disables it)
        # Training boxes truncated to whole pixels (every coordinate toward zero). reference: true (its COCO
        # loader stores boxes as uint16); other: false keeps the annotation's fractional pixels.
        "INTEGER_BOXES": True,
        # NMS threshold (IoU > it suppresses) applied to each image's pooled proposals when they are loaded for
        # negative chip mining. reference: 0.7; other: 0 keeps every proposal.
        "PROPOSAL_NMS": 0.7,
        # Order of a COCO test set's images, which decides the TEST.BATCH_PARTS parts and the images sharing
        # a canvas. reference: its pycocotools' getImgIds(), the keys of a Python 2 dict of the image ids;
        # file: the annotation file's order.
        "TEST_IMAGE_ORDER": "reference",
        # Images larger than this (annotated, or declared by a JPEG/PNG header) are refused before they are
        # decoded: 1 gigapixel (about 31,600 x 31,600; larger images are read by windows, raise it for them).
        "MAX_IMAGE_PIXELS": 1_000_000_000,
        # dataset "synthetic" only: training / validation image counts and the generator's seed.
        "synthetic_train": 200,
        "synthetic_val": 50,
        "synthetic_seed": 3,
    },
    "TRAIN": {
        "lr": 0.015,
        "lr_step": "5.33",  # epochs, comma separated
        "lr_factor": 0.1,
        "warmup": True,
        "warmup_lr": 0.0005,
        "warmup_step": 1000,  # iterations
        "momentum": 0.9,
        "wd": 0.0001,
        "begin_epoch": 0,
        "end_epoch": 7,
        "model_prefix": "SNIPER",
        # Evaluation while training (lib/train/evaluation.py): every EVAL_EVERY epochs and after the last (0: off),
        # on the test set's first EVAL_IMAGES images (0: all); the best epoch by EVAL_METRIC (a COCO stat: AP,
        # AP50, AP75, APs, APm, APl, AR100...; with WITH_MASK also segm_AP, segm_AP50...; a VOC set has one, mAP) is
        # named in {run folder}/best.json, which --model RUN_FOLDER then uses; EARLY_STOP > 0 stops after that many
        # evaluations without improvement.
        "EVAL_EVERY": 0,
        "EVAL_IMAGES": 0,
        "EVAL_METRIC": "AP",
        "EARLY_STOP": 0,
        # TensorBoard event files in {run folder}/tensorboard/ (losses, lr, speed, evaluation APs) when tensorboardX
        # is installed (lib/train/tensorboard.py); without it, one log line and nothing else.
        "TENSORBOARD": True,
        "resume": False,
        "FROM_SCRATCH": False,
        "fp16": True,
        "fp16_loss_scale": 100.0,  # gradient scale of the losses with fp16 (the optimizer divides it out)
        "BATCH_IMAGES": 16,  # chips per device
        # Batches whose gradients are summed before one optimizer update (lib/train/accumulation.py): a batch of
        # N x BATCH_IMAGES chips per device on a GPU holding BATCH_IMAGES. lr, warm-up and lr steps count updates.
        "GRAD_ACCUM_STEPS": 1,
        "NUM_PROCESS": 8,  # data loader worker processes
        # A data loader worker silent this many seconds (stopped, deadlocked, stalled on a network
        # filesystem) stops training with an error naming it and its image (0: wait forever).
        "LOADER_TIMEOUT": 600.0,
        # ... and one silent this many seconds is warned about once, naming it, its pid and its image (0: no warning).
        "STALL_WARN": 60.0,
        # Checkpoints kept: the newest N epochs plus TEST.TEST_EPOCH (the one main_test.py tests); 0: every epoch.
        "KEEP_CHECKPOINTS": 0,
        "IMAGE_CACHE_MB": 256,  # decoded images each loader worker keeps (least recently used out; 0: none)
        "SHUFFLE": True,
        "FLIP": True,
        "ONLY_PROPOSAL": False,  # RPN-only training (first stage of negative chip mining)
        # Instance masks (the reference's mask network): COCO polygons are loaded with the boxes and every
        # chip's batch gets ``gt_masks`` (B, 100, 500: lib/data/chip_masks.py); the network's RPN reads res4,
        # and the mask branch and its loss are added (symbols/mask.py; not in RPN-only training). ResNets only.
        "WITH_MASK": False,
        "USE_NEG_CHIPS": True,
        "MAX_NEG_CHIPS": 2,  # negative chips sampled per image and epoch
        # Training images without a usable box. reference: drop; other: negative, kept as sources of negative
        # chips (their proposals) when negative chips are on (USE_NEG_CHIPS and a dataset.proposal file).
        "EMPTY_IMAGES": "drop",
        # Training scales: factors with an optional last "longer side in pixels" entry (> 10), or
        # [shorter side, longer side cap] pairs with -1 for "no constraint". Finest first.
        "SCALES": [3.0, 1.667, 512.0],
        "VALID_RANGES": [[-1, 80], [32, 150], [120, -1]],  # sqrt(area) in original pixels, -1 open
        "CHIP_SIZE": 512,
        "CHIP_STRIDE": [56, 60],  # one value, or [lo, hi) drawn uniformly once per epoch
        "NEG_CHIP_MIN_PROPOSALS": [25, 10, 10],  # a negative chip needs more boxes counted in it than this
        # Chip mining rules (chip_generator/mining.py, docs/reference_differences.md).
        # Which boxes are valid at a scale. reference: sizes x2 - x1 (no +1, truncated), sqrt(w*h) in
        # [lo, hi) for generating chips (finest: no lo, >= 2 px; coarsest: no hi), and for assigning boxes
        # to chips without the lower bound and with the 2 px rule at every scale but the coarsest;
        # other: strict, one rule for both: lo <= sqrt((w+1)(h+1)) <= hi (spec section 1).
        "VALIDITY_RULES": "reference",
        # The boxes a chip trains on as valid. reference: assigned (each valid box is valid in the one chip
        # of its scale containing most of it, the others show it as ignored); other: visible (every box
        # valid at the scale that the chip shows).
        "CHIP_VALID_BOXES": "assigned",
        # Negative chips. reference: the boxes (gts and proposals) valid at the scale but assigned to no
        # positive chip are covered, each counted once (in the chip containing most of it); other:
        # contained, proposals in the valid range inside no positive chip, counted in every chip holding them.
        "NEG_CHIP_RULES": "reference",
        # Candidate windows of the greedy cover. reference: corners, stride grid and edge windows, some of
        # them chip + 1 px wide or tall (cut to the chip by the network input); other: clipped, the stride
        # grid plus the flush window, never larger than a chip.
        "CHIP_WINDOWS": "reference",
        # Chip pixels. reference: truncate, the original-image crop int(x1 / s) : int(x2 / s) (inclusive end
        # used as exclusive) resized by the factor s, and scaled images of int(W * s) px; other: round, the
        # source window rounded to whole pixels resized to the chip size, and round(W * s) px.
        "CHIP_CROP": "truncate",
        "MAX_GT_PER_CHIP": 100,
        # RPN targets
        "RPN_BATCH_SIZE": 256,
        "RPN_FG_FRACTION": 0.5,
        "RPN_POSITIVE_OVERLAP": 0.5,
        "RPN_NEGATIVE_OVERLAP": 0.4,
        "RPN_INVALID_OVERLAP": 0.3,
        "RPN_ALLOWED_BORDER": 32,
        # What the border is measured from. reference: chip, the full CHIP_SIZE square (anchors over the
        # zero padding of a small chip are trained as negatives); other: content, the chip's image content.
        "RPN_ANCHOR_BORDER": "chip",
        # gt boxes rounded to whole chip pixels after scaling. reference: true; other: false.
        "RPN_ROUND_GT": True,
        "RPN_MIN_GT_SIZE": 10,  # px after scaling
        # Proposal target (the MultiProposalTarget operator, lib/ops). Rules: "reference" reproduces the
        # published SNIPER's GPU operator (areas without the +1 in every overlap, so the effective fg
        # threshold is lower for small rois; boxes dropped only when both sides are under RPN_MIN_SIZE;
        # the 300 rois padded with 201 px boxes labelled by overlap like any roi; in-range gts written
        # over the last slots; +0.5 px gt centre in the targets); "exact" is the project's true-IoU
        # variant (+1 areas, padding labelled -1, in-range gts right after the proposals). Semantics in
        # lib/ops/__init__.py, the differences in docs/reference_differences.md.
        "PROPOSAL_TARGET_RULES": "reference",
        "RPN_PRE_NMS_TOP_N": 0,  # proposals entering NMS per chip; 0: all (the reference); 6000 was the project's cap
        "RPN_POST_NMS_TOP_N": 300,
        "RPN_NMS_THRESH": 0.7,
        "RPN_MIN_SIZE": 3,
        "FG_THRESH": 0.5,
        # AutoFocus FocusPixel labels, in sqrt(area) of a gt box in chip (scaled) pixels: positive in
        # (DC_LOW, SMALL_THRESH), ignored at most DC_LOW and in [SMALL_THRESH, DC_HIGH), negative otherwise.
        "AUTO_FOCUS_SMALL_THRESH": 64,
        "AUTO_FOCUS_DC_LOW": 5,
        "AUTO_FOCUS_DC_HIGH": 90,
        "BBOX_STDS": [0.1, 0.1, 0.2, 0.2],
        "BBOX_MEANS": [0.0, 0.0, 0.0, 0.0],
        # The R-CNN box loss is divided by 188 x this many chips. reference: 16 (hard-coded, whatever the
        # batch); other: 0, the chips per device.
        "RCNN_BBOX_LOSS_CHIPS": 16,
        # Initialisation of the layers the pretrained backbone lacks (lib/train/pretrained.py). reference:
        # N(0, 0.01) weights for every new layer, zero biases and zero deformable offsets; other: msra, He
        # Gaussian for the R-CNN FC layers and N(0, 0.001) for the box regressor.
        "NEW_LAYER_INIT": "reference",
    },
    "TEST": {
        # float16 body between conv0 and the heads, as in training (GPU only; the reference tested in float16)
        "fp16": True,
        # Images per device sharing a canvas, one count per scale (or one for all): with N devices a
        # batch of N x count images shares one canvas, as in the reference.
        "BATCH_IMAGES": [2, 2, 4],
        # The test set is cut into this many contiguous parts, each ordered by area and batched on its
        # own (the reference's CONCURRENT_JOBS); it decides which images share a canvas.
        "BATCH_PARTS": 2,
        "NUM_PROCESS": 2,  # worker processes preparing images and merging detections (0: in the main process)
        "LOADER_TIMEOUT": 600.0,  # as TRAIN.LOADER_TIMEOUT, for those workers
        "STALL_WARN": 60.0,  # as TRAIN.STALL_WARN
        "SCALES": [[1400, 2000], [800, 1280], [480, 512]],
        "VALID_RANGES": [[-1, 90], [32, 180], [75, -1]],
        # "reference": the proposal rules the reference ran (lib/boxes/proposals.py, on the host);
        # "stock": MXNet's MultiProposal (on the device, but it drops the anchors of each image's last
        # partial feature row and column and pads by repeats).
        "PROPOSAL_LAYER": "reference",
        # "mxnet": the test network on MXNet; "onnxruntime": its ONNX export (made once per checkpoint, in
        # onnx/<checkpoint name>/ beside it) on ONNX Runtime's CPU provider, the rest of the test unchanged
        # (lib/inference/onnx_network.py; Python >= 3.11). main_test.py / demo.py: --backend.
        "BACKEND": "mxnet",
        # the onnxruntime back end's R-CNN head: "auto" pools on lib/ops' compiled kernel (lib/ops/libsniper_pool.so,
        # `make`) between pieces of head.onnx when it loads, else with the graph's RoiAlign; "compiled" refuses to
        # run without it; "graph" always runs head.onnx whole (lib/inference/compiled_pooling.py).
        "ONNX_POOLING": "auto",
        "RPN_PRE_NMS_TOP_N": 12000,  # what the reference's operator used (its config said 6000, unread)
        "RPN_POST_NMS_TOP_N": 300,
        "RPN_NMS_THRESH": 0.7,
        "RPN_MIN_SIZE": 3,  # in scaled-image pixels, both sides
        "NMS": 0.45,
        "SOFT_NMS": True,
        "SOFT_NMS_SIGMA": 0.55,
        "SCORE_THRESH": 0.001,
        "MAX_PER_IMAGE": 200,
        # Detections per image and category COCO evaluation scores (pycocotools' last maxDets): 100 is COCO's standard
        # (the published numbers); 0 follows MAX_PER_IMAGE (at least 100), for scenes with more than 100 objects
        # (the test warns when the scored images have them: lib.inference.coco_summary.dense_scene_warning).
        "EVAL_MAX_DETS": 100,
        # COCO evaluation's size bands: [name, lo, hi] in sqrt(area) px (-1 open); small/medium/large report as
        # APs/APm/APl, any other name as AP_{name} (e.g. [[tiny, 0, 16], [small, 16, 32], ...]).
        "SIZE_BANDS": [["small", 0, 32], ["medium", 32, 96], ["large", 96, -1]],
        # Pascal VOC evaluation. reference: the detections as its devkit result files hold them (scores to 3
        # decimals, boxes to 0.1 px), ranked by NumPy's default (not stable) argsort; exact: the detector's
        # values in a stable order.
        "VOC_EVAL_RULES": "reference",
        "TEST_EPOCH": 7,
        "MODEL": "",  # checkpoint "prefix-epoch.params" path; "" uses the training output folder
        # Cache each scale's detections in {results}/scale_cache/ and read back those made by the same checkpoint,
        # images and settings (lib/inference/scale_cache.py): a second test merges again without the network, so
        # VALID_RANGES, NMS, SOFT_NMS, SOFT_NMS_SIGMA and MAX_PER_IMAGE can change. The reference: one flag a scale.
        "USE_CACHE": False,
        "EXTRACT_PROPOSALS": False,
        "PROPOSAL_SAVE_PATH": "",  # "" -> {output}/proposals
        "NUM_PROPOSALS": 300,  # per scale, saved by proposal extraction
        # AutoFocus inference (needs network.AUTO_FOCUS; TEST.SCALES coarsest first): scale i > 0 with
        # DO_PRUNING[i] processes only the FocusChips of scale i - 1, made with CHIP_HYPERPARAMS[i - 1] =
        # [dilation, FocusPixel threshold, minimum chip side in feature cells]. One entry per test scale.
        "AUTO_FOCUS": False,
        "DO_PRUNING": [],
        "CHIP_HYPERPARAMS": [],
        # Tiled test for large images (lib/inference/tiling.py): [size, overlap] in network pixels; a scaled
        # image larger than size on a side runs in tiles of at most size x size overlapping by at least
        # overlap (at least s * (valid range hi + 20) at scale s keeps every object whole in a tile).
        # []: whole images on one canvas per scale (the reference).
        "TILE": [],
        # Clip extracted proposals to the image: the reference does not (after the division by the scale
        # a box may end a fraction of a pixel beyond it)
        "CLIP_PROPOSALS": False,
    },
}
