"""Config loading, overrides, type checks, and both scale forms of spec section 1."""
import glob
import os
import re

import pytest

from lib.config import ConfigError, load_config, parse_cli_overrides
from lib.scales import ScaleError, in_valid_range, parse_scales


def write_yaml(tmp_path, text):
    path = tmp_path / "exp.yml"
    path.write_text(text)
    return str(path)


def test_yaml_then_cli_override_and_types(tmp_path):
    path = write_yaml(tmp_path, "TRAIN:\n  BATCH_IMAGES: 4\n  lr: 0.1\ndataset:\n  dataset_path: a\n")
    cfg = load_config(path, [("TRAIN.BATCH_IMAGES", "8"), ("dataset.dataset_path", "X"), ("TRAIN.fp16", "false")])
    assert cfg.TRAIN.BATCH_IMAGES == 8 and isinstance(cfg.TRAIN.BATCH_IMAGES, int)
    assert cfg.TRAIN.lr == pytest.approx(0.1)
    assert cfg.dataset.dataset_path == "X"
    assert cfg.TRAIN.fp16 is False
    assert cfg.name == "exp"
    # untouched keys keep their defaults
    assert cfg.TRAIN.RPN_BATCH_SIZE == 256


def test_integer_given_for_float_key_becomes_float(tmp_path):
    cfg = load_config(write_yaml(tmp_path, "TRAIN:\n  lr: 1\n"))
    assert cfg.TRAIN.lr == 1.0 and isinstance(cfg.TRAIN.lr, float)


@pytest.mark.parametrize("text, key", [
    ("TRAIN:\n  BATCH_SIZE_TYPO: 4\n", "TRAIN.BATCH_SIZE_TYPO"),
    ("TRAIN:\n  BATCH_IMAGES: many\n", "TRAIN.BATCH_IMAGES"),
    ("TRAIN:\n  BATCH_IMAGES: 2.5\n", "TRAIN.BATCH_IMAGES"),
    ("TRAIN:\n  fp16: maybe\n", "TRAIN.fp16"),
    ("TRAIN: 3\n", "TRAIN"),
    ("network:\n  FIXED_PARAMS: conv0\n", "network.FIXED_PARAMS"),
])
def test_bad_yaml_key_or_value_names_the_key(tmp_path, text, key):
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        load_config(write_yaml(tmp_path, text))


def test_bad_cli_override_names_the_key():
    with pytest.raises(ConfigError, match=r"TRAIN\.NOPE"):
        load_config(None, [("TRAIN.NOPE", "1")])
    with pytest.raises(ConfigError, match=r"TRAIN\.lr"):
        load_config(None, [("TRAIN.lr", "fast")])
    with pytest.raises(ConfigError, match="odd number"):
        parse_cli_overrides(["TRAIN.lr"])


def test_missing_and_invalid_files_are_clear_errors(tmp_path):
    with pytest.raises(ConfigError, match="cannot read config file"):
        load_config(str(tmp_path / "absent.yml"))
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(write_yaml(tmp_path, "TRAIN: [unclosed\n"))


def test_cross_key_checks():
    with pytest.raises(ConfigError, match="VALID_RANGES"):
        load_config(None, [("TRAIN.VALID_RANGES", "[[-1, 80]]")])
    with pytest.raises(ConfigError, match="NUM_ANCHORS"):
        load_config(None, [("network.ANCHOR_SCALES", "[2, 4]")])
    cfg = load_config(None, [("TRAIN.CHIP_STRIDE", "32")])
    assert cfg.TRAIN.CHIP_STRIDE == 32


@pytest.mark.parametrize("path", sorted(glob.glob("configs/faster/*.yml")))
def test_shipped_configs_load(path):
    cfg = load_config(path)
    assert len(parse_scales(cfg.TRAIN.SCALES)) == len(cfg.TRAIN.VALID_RANGES) == 3


def test_published_coco_settings():
    cfg = load_config("configs/faster/sniper_res101_e2e.yml")
    assert cfg.TRAIN.SCALES == [3.0, 1.667, 512.0]
    assert cfg.TRAIN.VALID_RANGES == [[-1, 80], [32, 150], [120, -1]]
    assert cfg.TEST.VALID_RANGES == [[-1, 90], [32, 180], [75, -1]]
    assert (cfg.TRAIN.lr, cfg.TRAIN.warmup_lr, cfg.TRAIN.warmup_step, cfg.TRAIN.end_epoch) == (0.015, 0.0005, 1000, 7)
    assert cfg.network.ANCHOR_SCALES == [2, 4, 7, 10, 13, 16, 24] and cfg.network.NUM_ANCHORS == 21
    assert cfg.TRAIN.BBOX_STDS == [0.1, 0.1, 0.2, 0.2]


def test_factor_form_scales():
    fine, mid, coarse = parse_scales([3.0, 1.667, 512])
    # 480x640 image: factors multiply, the last entry sets the longer side to 512 px
    assert fine.image_scale(480, 640) == 3.0
    assert mid.image_scale(480, 640) == 1.667
    assert coarse.image_scale(480, 640) == pytest.approx(512 / 640)
    assert coarse.image_scale(1000, 250) == pytest.approx(512 / 1000)


def test_resolution_form_scales():
    fine, mid, coarse = parse_scales([[1400, 2000], [800, 1280], [-1, 512]])
    # shorter side to 1400 unless the longer side would pass 2000
    # 480x640: 1400/480 = 2.917 gives a longer side of 1867 <= 2000, so no cap
    assert fine.image_scale(480, 640) == pytest.approx(1400 / 480)
    assert mid.image_scale(480, 640) == pytest.approx(800 / 480)
    assert coarse.image_scale(480, 640) == pytest.approx(512 / 640)
    # tall image: shorter side 300 -> 1400/300 = 4.67, longer 1200*4.67 = 5600 > 2000, so capped
    assert fine.image_scale(1200, 300) == pytest.approx(2000 / 1200)


@pytest.mark.parametrize("spec", [[], [0.0], [[-1, -1]], [[100]], ["big"], 3.0])
def test_bad_scales(spec):
    with pytest.raises(ScaleError):
        parse_scales(spec)


def test_valid_range_mask_uses_inclusive_sqrt_area():
    boxes = [[0, 0, 31, 31], [0, 0, 79, 79], [0, 0, 80, 80], [0, 0, 9, 39]]  # 32, 80, 81, 20 px
    assert in_valid_range(boxes, (-1, 80)).tolist() == [True, True, False, True]
    assert in_valid_range(boxes, (32, 150)).tolist() == [True, True, True, False]
    assert in_valid_range(boxes, (120, -1)).tolist() == [False, False, False, False]


def test_kvstore_comment_names_the_values_training_accepts(monkeypatch):
    from lib.train.distributed import DMLC_VARIABLES, SYNC_KVSTORES, create_kvstore

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    with open(os.path.join(root, "configs", "default.py")) as f:
        lines = f.read().splitlines()
    line = next(i for i, text in enumerate(lines) if text.strip().startswith('"kvstore":'))
    comment = []
    while lines[line - 1 - len(comment)].strip().startswith("#"):
        comment.insert(0, lines[line - 1 - len(comment)])
    names = set(re.findall(r'"(\w+)"', " ".join(comment) + lines[line].partition("#")[2]))
    assert set(SYNC_KVSTORES) | {"device", "local", "dist_async"} <= names
    for variable in DMLC_VARIABLES:
        monkeypatch.delenv(variable, raising=False)
    for name in names:
        cfg = load_config(None, [("default.kvstore", name)])
        if name == "dist_async":  # named as refused
            with pytest.raises(ValueError, match="is not supported"):
                create_kvstore(cfg)
        elif name.startswith("dist"):  # accepted: it goes on to look for the launcher's variables
            with pytest.raises(ValueError, match="not set: start the workers with tools/launch.py"):
                create_kvstore(cfg)
        else:  # single machine: handed to Module as is
            assert create_kvstore(cfg) == name
