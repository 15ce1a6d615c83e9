"""Config loading, overrides, type checks, freezing, and both scale forms of spec section 1."""
import argparse
import glob
import json
import os
import pickle
import subprocess
import sys

import pytest

from lib.bootstrap import ROOT
from lib.config import ConfigError, add_config_arguments, config_from_arguments, load_config, with_overrides
from lib.config.core import FrozenConfigError, config_file_values, dump_config, flat_config, parse_cli_overrides, plain
from lib.config.validation import VARIANT_KEYS
from lib.scales import ScaleError, in_valid_range, parse_scales, pyramid

SHIPPED = os.path.join(ROOT, "configs", "faster")  # from the repository root, whatever folder pytest runs in
SHIPPED_FILES = sorted(glob.glob(os.path.join(SHIPPED, "*.yml")))


def shipped(name):
    return os.path.join(SHIPPED, name)


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
    with pytest.raises(ConfigError, match="needs a value"):
        parse_cli_overrides(["TRAIN.lr"])


def test_cli_words_pairs_and_key_equals_value():
    assert parse_cli_overrides(["TRAIN.lr", "0.1", "gpus=0,1", "dataset.dataset_path", "a=b", "TRAIN.lr_step=4,6"]) \
        == [("TRAIN.lr", "0.1"), ("gpus", "0,1"), ("dataset.dataset_path", "a=b"), ("TRAIN.lr_step", "4,6")]


def test_every_set_option_adds_to_the_overrides():
    parser = argparse.ArgumentParser()
    add_config_arguments(parser)
    args = parser.parse_args(["--cfg", shipped("sniper_synthetic_tiny.yml"), "--set", "TRAIN.lr", "0.5",
                              "--set", "TRAIN.end_epoch=1", "TRAIN.lr_step=", "--set", "TRAIN.wd", "0"])
    cfg = config_from_arguments(args)
    assert (cfg.TRAIN.lr, cfg.TRAIN.end_epoch, cfg.TRAIN.wd) == (0.5, 1, 0.0)
    bad = parser.parse_args(["--cfg", shipped("sniper_synthetic_tiny.yml"), "--set", "TRAIN.lr", "abc",
                             "--set", "TRAIN.end_epoch", "1"])
    with pytest.raises(SystemExit, match=r"TRAIN\.lr"):
        config_from_arguments(bad)


def test_loaded_config_is_frozen_and_variants_are_new_configs():
    cfg = load_config(shipped("sniper_synthetic_tiny.yml"))
    for write in (lambda: setattr(cfg.TRAIN, "lr", 1.0), lambda: cfg.TEST.__setitem__("MODEL", "x"),
                  lambda: cfg.dataset.update(NUM_CLASSES=3), lambda: cfg.pop("gpus"),
                  lambda: setattr(cfg, "symbol", "resnet101")):
        with pytest.raises(FrozenConfigError, match="with_overrides"):
            write()
    with pytest.raises(AttributeError):
        cfg.TRAIN.SCALES.append(2.0)  # lists are tuples once frozen
    variant = with_overrides(cfg, {"TRAIN.lr": 0.5, "TEST.SOFT_NMS": "false"})
    assert (variant.TRAIN.lr, variant.TEST.SOFT_NMS, variant.name) == (0.5, False, cfg.name)
    assert (cfg.TRAIN.lr, cfg.TEST.SOFT_NMS) == (0.015, True)
    with pytest.raises(FrozenConfigError):
        variant.TRAIN.lr = 1.0
    with pytest.raises(ConfigError, match=r"TRAIN\.momentum"):
        with_overrides(cfg, {"TRAIN.momentum": 1.5})
    copy = pickle.loads(pickle.dumps(cfg))
    assert copy == cfg
    with pytest.raises(FrozenConfigError):
        copy.TRAIN.lr = 1.0


def test_dumped_config_loads_back_to_the_same_values(tmp_path):
    cfg = load_config(shipped("sniper_synthetic_tiny.yml"), [("TRAIN.lr", "0.02")])
    path = tmp_path / "config.yaml"
    path.write_text(dump_config(cfg))
    again = load_config(str(path))
    assert dict(again, name=cfg.name) == cfg


def test_renamed_key_is_refused_naming_the_new_one(tmp_path):
    with pytest.raises(ConfigError, match=r"TRAIN\.scale was renamed to TRAIN\.fp16_loss_scale"):
        load_config(None, [("TRAIN.scale", "100")])
    with pytest.raises(ConfigError, match=r"TRAIN\.fp16_loss_scale"):
        load_config(write_yaml(tmp_path, "TRAIN:\n  scale: 128\n"))
    assert load_config(None, [("TRAIN.fp16_loss_scale", "128")]).TRAIN.fp16_loss_scale == 128.0


@pytest.mark.parametrize("key, value", [
    ("TRAIN.lr", "-0.1"), ("TRAIN.lr", "nan"), ("TRAIN.lr", "0"), ("TRAIN.momentum", "1"), ("TRAIN.momentum", "-0.1"),
    ("default.frequent", "0"), ("TRAIN.BATCH_IMAGES", "0"), ("TEST.BATCH_IMAGES", "0"), ("TRAIN.NUM_PROCESS", "-1"),
    ("TEST.NUM_PROCESS", "-1"), ("TRAIN.LOADER_TIMEOUT", "-1"), ("TEST.LOADER_TIMEOUT", ".nan"),
    ("TEST.BATCH_PARTS", "0"), ("TEST.RPN_PRE_NMS_TOP_N", "0"),
    ("TRAIN.wd", "-1"), ("TRAIN.fp16_loss_scale", "0"), ("TRAIN.end_epoch", "0"),
    ("TRAIN.RCNN_BBOX_LOSS_CHIPS", "-1"), ("dataset.PROPOSAL_NMS", "1.5"),
])
def test_out_of_range_values_name_the_key(key, value):
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        load_config(None, [(key, value)])


def test_variant_keys_default_to_the_reference_and_refuse_unknown_values():
    cfg = load_config(None)
    for key, choices in VARIANT_KEYS.items():
        section, name = key.split(".")
        assert cfg[section][name] == choices[0]  # the reference's behaviour is the default
        for value in choices:
            assert load_config(None, [(key, value)])[section][name] == value
        with pytest.raises(ConfigError, match=key.replace(".", r"\.") + r".*must be one of"):
            load_config(None, [(key, "bogus")])
    assert (cfg.dataset.INTEGER_BOXES, cfg.dataset.PROPOSAL_NMS, cfg.TRAIN.RPN_ROUND_GT,
            cfg.TRAIN.RCNN_BBOX_LOSS_CHIPS) == (True, 0.7, True, 16)


def test_synthetic_is_a_dataset_kind_and_other_data_needs_only_the_dataset_keys(tmp_path):
    tiny = shipped("sniper_synthetic_tiny.yml")
    assert load_config(tiny).dataset.dataset == "synthetic"
    own = load_config(tiny, [("dataset.dataset", "coco"), ("dataset.dataset_path", str(tmp_path)),
                             ("dataset.image_set", "train"), ("dataset.test_image_set", "val")])
    assert own.dataset.dataset == "coco"  # the synthetic_* keys are ignored for other kinds
    with pytest.raises(ConfigError, match=r"dataset\.synthetic_train"):
        load_config(tiny, [("dataset.synthetic_train", "0")])


def test_a_dataset_format_checks_its_own_keys_and_the_config_names_no_format(tmp_path):
    """The synthetic format's counts are its own check (Dataset.check_config, found through DATASETS): the
    config package's files name no dataset format."""
    from lib.dataset.roidb import DATASETS

    with pytest.raises(ConfigError, match=r"^config key dataset\.synthetic_val = -1: must be >= 0$"):
        load_config(shipped("sniper_synthetic_tiny.yml"), [("dataset.synthetic_val", "-1")])
    for name in ("__init__.py", "core.py", "validation.py"):
        with open(os.path.join(ROOT, "lib", "config", name)) as f:
            text = f.read()
        assert not [kind for kind in DATASETS if f'"{kind}"' in text or f"'{kind}'" in text], name


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


@pytest.mark.parametrize("path", SHIPPED_FILES, ids=os.path.basename)
def test_shipped_configs_load(path):
    cfg = load_config(path)
    assert len(pyramid(cfg.TRAIN, "TRAIN")) == len(pyramid(cfg.TEST, "TEST")) == 3


def test_the_shipped_configs_are_collected_from_any_folder(tmp_path):
    """pytest run from another folder collects every shipped config, not none (a glob relative to the cwd)."""
    assert len(SHIPPED_FILES) == len([n for n in os.listdir(SHIPPED) if n.endswith(".yml")]) >= 10
    result = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider",
                             os.path.abspath(__file__), "-k", "test_shipped_configs_load"],
                            cwd=tmp_path, capture_output=True, text=True, timeout=300,
                            env={**os.environ, "PYTHONPATH": ROOT})
    collected = [line for line in result.stdout.splitlines() if "test_shipped_configs_load[" in line]
    assert len(collected) == len(SHIPPED_FILES), result.stdout[-2000:] + result.stderr[-2000:]


# Every key of every shipped config as the loader without _BASE_ gave it, at the commit before the configs were
# rewritten on _BASE_ (made there by `python dev/config_snapshot.py tests/data/shipped_config_snapshot.json`):
# the defaults' values, and each config's values where they are not the defaults'.
SNAPSHOT = os.path.join(ROOT, "tests", "data", "shipped_config_snapshot.json")


def snapshot_values(name):
    with open(SNAPSHOT) as f:
        snapshot = json.load(f)
    return {**snapshot["defaults"], **snapshot["configs"][name]}


def test_the_snapshot_covers_every_shipped_config():
    with open(SNAPSHOT) as f:
        assert sorted(json.load(f)["configs"]) == [os.path.basename(path) for path in SHIPPED_FILES]


@pytest.mark.parametrize("path", SHIPPED_FILES, ids=os.path.basename)
def test_shipped_configs_keep_their_effective_values(path):
    """Rewriting the shipped configs on _BASE_ changed no value, not even a type (JSON writes 3 and 3.0 apart)."""
    expected = snapshot_values(os.path.basename(path))
    values = flat_config(load_config(path))
    assert sorted(values) == sorted(expected)
    changed = {key: (values[key], expected[key]) for key in values
               if json.dumps(values[key]) != json.dumps(expected[key])}
    assert not changed


def test_shipped_configs_are_written_flat_and_load_back_the_same(tmp_path):
    """A run's config.yaml (dump_config) never names a base: it loads from any folder to the same values."""
    cfg = load_config(shipped("sniper_res101_e2e_mask_autofocus.yml"))
    text = dump_config(cfg)
    assert "_BASE_" not in text
    written = tmp_path / "sniper_res101_e2e_mask_autofocus.yml"
    written.write_text(text)
    assert flat_config(load_config(str(written))) == flat_config(cfg)


def test_base_chain_merges_sections_key_by_key(tmp_path):
    (tmp_path / "sub").mkdir()
    (tmp_path / "grand.yml").write_text("TRAIN:\n  lr: 0.1\n  end_epoch: 9\n  SCALES: [3.0, 1.667, 512.0]\n"
                                        "TEST:\n  TEST_EPOCH: 9\n")
    (tmp_path / "sub" / "parent.yml").write_text("_BASE_: ../grand.yml\nTRAIN:\n  lr: 0.2\n")
    child = tmp_path / "sub" / "child.yml"
    child.write_text("_BASE_: parent.yml\nTRAIN:\n  SCALES: [2.0, 1.0, 512.0]\n")
    cfg = load_config(str(child))
    # lr from the parent over the grandparent's, end_epoch and TEST from the grandparent, SCALES the child's
    # whole list (a list is a value, not merged), the name the child's stem
    assert (cfg.TRAIN.lr, cfg.TRAIN.end_epoch, cfg.TEST.TEST_EPOCH) == (0.2, 9, 9)
    assert cfg.TRAIN.SCALES == (2.0, 1.0, 512.0) and cfg.name == "child"
    assert cfg.TRAIN.warmup_step == load_config(None).TRAIN.warmup_step  # set by none of them: the default
    assert config_file_values(str(child)) == {"TRAIN": {"lr": 0.2, "end_epoch": 9, "SCALES": [2.0, 1.0, 512.0]},
                                              "TEST": {"TEST_EPOCH": 9}}


@pytest.mark.parametrize("files, message", [
    ({"a.yml": "_BASE_: b.yml\n", "b.yml": "_BASE_: a.yml\n"},
     r"a\.yml: its _BASE_ chain comes back to it \(a cycle: .*a\.yml -> .*b\.yml -> .*a\.yml\)"),
    ({"a.yml": "_BASE_: a.yml\n"}, r"a\.yml: its _BASE_ chain comes back to it"),
    ({"a.yml": "_BASE_: absent.yml\n"}, r"cannot read config file .*absent\.yml \(the _BASE_ of .*a\.yml\)"),
    ({"a.yml": "_BASE_: b.yml\n", "b.yml": "- 1\n"}, r"config file .*b\.yml must hold a mapping"),
    ({"a.yml": "_BASE_: [b.yml]\n"}, r"a\.yml: _BASE_ must be a file path"),
    ({"a.yml": "_BASE_: b.yml\n", "b.yml": "TRAIN:\n  lrr: 1\n"}, r"b\.yml: unknown config key TRAIN\.lrr"),
])
def test_bad_base_chains_are_one_line_errors_naming_the_file(tmp_path, files, message):
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    with pytest.raises(ConfigError, match=message) as caught:
        load_config(str(tmp_path / "a.yml"))
    assert "\n" not in str(caught.value)


def test_published_coco_settings():
    cfg = load_config(shipped("sniper_res101_e2e.yml"))
    assert cfg.TRAIN.SCALES == (3.0, 1.667, 512.0)
    assert cfg.TRAIN.VALID_RANGES == ((-1, 80), (32, 150), (120, -1))
    assert cfg.TEST.VALID_RANGES == ((-1, 90), (32, 180), (75, -1))
    assert (cfg.TRAIN.lr, cfg.TRAIN.warmup_lr, cfg.TRAIN.warmup_step, cfg.TRAIN.end_epoch) == (0.015, 0.0005, 1000, 7)
    assert cfg.network.ANCHOR_SCALES == (2, 4, 7, 10, 13, 16, 24) and cfg.network.NUM_ANCHORS == 21
    assert cfg.TRAIN.BBOX_STDS == (0.1, 0.1, 0.2, 0.2)
    # the reference's effective test settings (its operator's 12000 / 3 px, not the yml's unread 6000 / 0)
    test = cfg.TEST
    assert (test.BATCH_IMAGES, test.BATCH_PARTS, test.PROPOSAL_LAYER) == ((2, 2, 4), 2, "reference")
    assert (test.RPN_PRE_NMS_TOP_N, test.RPN_POST_NMS_TOP_N, test.RPN_NMS_THRESH, test.RPN_MIN_SIZE) == (12000, 300, 0.7, 3)
    assert (test.SOFT_NMS, test.SOFT_NMS_SIGMA, test.SCORE_THRESH, test.MAX_PER_IMAGE) == (True, 0.55, 0.001, 200)
    assert (cfg.dataset.image_set, cfg.dataset.test_image_set) == ("train2014+val2014", "test-dev2015")


def _reference_test_settings(test):
    """What the reference's sniper_res50_e2e.yml and sniper_res101_e2e_pascal_voc.yml say for testing:
    BATCH_IMAGES [2, 2, 4] with CONCURRENT_JOBS 2, the resolution scales and ranges, soft-NMS (NMS -1) at
    sigma 0.55, 200 per image."""
    assert (test.BATCH_IMAGES, test.BATCH_PARTS) == ((2, 2, 4), 2)
    assert test.SCALES == ((1400, 2000), (800, 1280), (480, 512))
    assert test.VALID_RANGES == ((-1, 90), (32, 180), (75, -1))
    assert (test.SOFT_NMS, test.SOFT_NMS_SIGMA, test.MAX_PER_IMAGE, test.TEST_EPOCH) == (True, 0.55, 200, 7)


def test_published_res50_settings():
    cfg = load_config(shipped("sniper_res50_e2e.yml"))
    assert cfg.symbol == "resnet50" and cfg.dataset.NUM_CLASSES == 81 and cfg.dataset.dataset == "coco"
    # its YAML trains on all of train and val and tests on test-dev; main_train.py forces the factor scales on
    # an 81-class COCO config
    assert (cfg.dataset.image_set, cfg.dataset.test_image_set) == ("train2014+val2014", "test-dev2015")
    assert cfg.TRAIN.SCALES == (3.0, 1.667, 512.0)
    assert cfg.TRAIN.VALID_RANGES == ((-1, 80), (32, 150), (120, -1))
    assert (cfg.TRAIN.lr, cfg.TRAIN.lr_step, cfg.TRAIN.warmup_lr, cfg.TRAIN.end_epoch) == (0.015, "5.33", 0.0005, 7)
    assert (cfg.TRAIN.BATCH_IMAGES, cfg.TRAIN.USE_NEG_CHIPS) == (16, True)
    assert cfg.dataset.proposal.endswith("coco_train2014+val2014.npz")
    _reference_test_settings(cfg.TEST)


def test_published_pascal_voc_settings():
    cfg = load_config(shipped("sniper_res101_e2e_pascal_voc.yml"))
    assert cfg.symbol == "resnet101" and cfg.dataset.NUM_CLASSES == 21 and cfg.dataset.dataset == "pascal_voc"
    assert (cfg.dataset.image_set, cfg.dataset.test_image_set) == ("2007_trainval+2012_trainval", "2007_test")
    # 21 classes: main_train.py leaves the YAML's resolution scales, and negative chips come from the provided
    # proposals (USE_NEG_CHIPS defaults to true, proposal: rpn)
    assert cfg.TRAIN.SCALES == ((1400, 2000), (800, 1280), (-1, 512))
    assert cfg.TRAIN.VALID_RANGES == ((-1, 80), (32, 150), (120, -1))
    assert cfg.TRAIN.USE_NEG_CHIPS is True
    assert cfg.dataset.proposal.endswith(".npz") and "2007_trainval+2012_trainval" in cfg.dataset.proposal
    assert (cfg.TRAIN.lr, cfg.TRAIN.lr_step, cfg.TRAIN.end_epoch, cfg.TRAIN.BATCH_IMAGES) == (0.015, "5.33", 7, 16)
    _reference_test_settings(cfg.TEST)


def test_minival_config_is_the_published_one_on_the_minival_split():
    published = plain(load_config(shipped("sniper_res101_e2e.yml")))
    minival = plain(load_config(shipped("sniper_res101_e2e_minival.yml")))
    split = {key: minival["dataset"].pop(key) for key in ("image_set", "test_image_set", "proposal")}
    assert split == {"image_set": "train2014+valminusminival2014", "test_image_set": "minival2014",
                     "proposal": "data/proposals/coco_train2014+valminusminival2014.npz"}
    for key in split:
        published["dataset"].pop(key)
    published.pop("name"), minival.pop("name")
    assert minival == published


@pytest.mark.parametrize("value, error", [
    ("[2, 2]", "one per test scale"), ("[2, 0, 4]", "one per test scale"), ("[2, 2.5, 4]", "integer"),
])
def test_test_batch_images_are_one_count_or_one_per_scale(value, error):
    assert load_config(None, [("TEST.BATCH_IMAGES", "3")]).TEST.BATCH_IMAGES == 3
    with pytest.raises(ConfigError, match="TEST.BATCH_IMAGES"):
        load_config(None, [("TEST.BATCH_IMAGES", value)])
    with pytest.raises(ConfigError, match="TEST.PROPOSAL_LAYER"):
        load_config(None, [("TEST.PROPOSAL_LAYER", "fork")])


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
    # the cap is tested on the rounded side: 800/600 * 960.3 = 1280.4 rounds to 1280, not over the cap
    assert mid.image_scale(600, 960.3) == pytest.approx(800 / 600)
    assert mid.image_scale(600, 960.5) == pytest.approx(1280 / 960.5)  # 1280.67 rounds to 1281 > 1280


@pytest.mark.parametrize("spec", [[], [0.0], [[-1, -1]], [[100]], ["big"], 3.0])
def test_bad_scales(spec):
    with pytest.raises(ScaleError):
        parse_scales(spec)


def test_valid_range_mask_uses_inclusive_sqrt_area():
    boxes = [[0, 0, 31, 31], [0, 0, 79, 79], [0, 0, 80, 80], [0, 0, 9, 39]]  # 32, 80, 81, 20 px
    assert in_valid_range(boxes, (-1, 80)).tolist() == [True, True, False, True]
    assert in_valid_range(boxes, (32, 150)).tolist() == [True, True, True, False]
    assert in_valid_range(boxes, (120, -1)).tolist() == [False, False, False, False]


@pytest.mark.parametrize("typed, suggested", [
    ("TRAIN.lr_stpe", "TRAIN.lr_step"), ("TRAIN.LR", "TRAIN.lr"), ("dataset.synthetic_trian", "dataset.synthetic_train"),
    ("TRAIN.BATCH_IMAGE", "TRAIN.BATCH_IMAGES"),
])
def test_an_unknown_key_suggests_the_nearest_known_one(typed, suggested):
    with pytest.raises(ConfigError, match=rf"unknown config key {typed}; did you mean {suggested}\?$"):
        load_config(None, [(typed, "1")])


def test_an_unknown_key_far_from_every_known_one_gets_no_suggestion():
    with pytest.raises(ConfigError, match=r"^unknown config key TRAIN.NO_SUCH_KEY$"):
        load_config(None, [("TRAIN.NO_SUCH_KEY", "1")])


@pytest.mark.parametrize("key, value, message", [
    ("TRAIN.CHIP_STRIDE", "32.5", "config key TRAIN.CHIP_STRIDE: expected a positive integer, got 32.5"),
    ("TRAIN.CHIP_STRIDE", "[64, 32]", "config key TRAIN.CHIP_STRIDE: expected an int or [lo, hi) with 0 < lo < hi, "
                                      "got [64, 32]"),
    ("TRAIN.VALID_RANGES", "[[-1, 80], [60, 56], [120, -1]]", "TRAIN.VALID_RANGES: range [60, 56] has lo > hi"),
    ("TEST.VALID_RANGES", "[[-1, 90], [60, 56], [75, -1]]", "TEST.VALID_RANGES: range [60, 56] has lo > hi"),
    ("symbol", "resnet999", "config key symbol: unknown backbone 'resnet999' (registered: mobilenetv2, "
                            "mobilenetv2_tiny, resnet101, resnet50, resnet_tiny)"),
    ("TRAIN.lr_step", "7.5", "config key TRAIN.lr_step = '7.5': step 7.5 is not inside the run (0 < step < "
                             "TRAIN.end_epoch 7); '' or none for no step (shell: --set TRAIN.lr_step none, or "
                             "--set TRAIN.lr_step '')"),
    ("TRAIN.lr_step", "five", "config key TRAIN.lr_step: expected comma-separated epochs, got 'five'; '' or none "
                              "for no step (shell: --set TRAIN.lr_step none, or --set TRAIN.lr_step '')"),
    ("TEST.BATCH_IMAGES", "[1, 1]", "config key TEST.BATCH_IMAGES = [1, 1]: expected a positive integer or one per "
                                    "test scale (3)"),
])
def test_what_a_stage_would_refuse_is_refused_at_load_in_one_line(key, value, message):
    # the stages' own parsing (MiningParams, pyramid, backbone record, lr schedule, test batches) runs at load
    with pytest.raises(ConfigError) as err:
        load_config(None, [(key, value)])
    assert str(err.value) == message


def test_no_lr_step_is_none_or_empty():
    from lib.config.validation import lr_step_epochs

    for text in ("none", "None", ""):
        assert lr_step_epochs(load_config(None, [("TRAIN.lr_step", text), ("TRAIN.end_epoch", "1")]).TRAIN) == []


def test_neg_chip_min_proposals_is_needed_per_scale_only_with_negative_chips_on():
    # issue 35: two scales with the three-scale default list load while negative chips are off (no proposal
    # file, or TRAIN.USE_NEG_CHIPS false), and are refused in one line when they are on
    two_scales = [("TRAIN.SCALES", "[2.0, 512]"), ("TRAIN.VALID_RANGES", "[[-1, 100], [80, -1]]")]
    assert load_config(None, two_scales).TRAIN.NEG_CHIP_MIN_PROPOSALS == (25, 10, 10)
    assert load_config(None, two_scales + [("TRAIN.USE_NEG_CHIPS", "false"), ("dataset.proposal", "p.npz")])
    with pytest.raises(ConfigError) as err:
        load_config(None, two_scales + [("dataset.proposal", "p.npz")])
    assert str(err.value) == ("config key TRAIN.NEG_CHIP_MIN_PROPOSALS = [25, 10, 10]: needs one value per "
                              "training scale (2)")


def test_a_saved_config_may_hold_the_backbone_stride_it_now_derives(tmp_path):
    # the config.yaml of a run folder written before the stride came from the backbone record
    assert load_config(write_yaml(tmp_path, "symbol: resnet_tiny\nnetwork:\n  RPN_FEAT_STRIDE: 16\n"
                                            "  RCNN_FEAT_STRIDE: 16\n")).symbol == "resnet_tiny"
    with pytest.raises(ConfigError, match=r"network\.RPN_FEAT_STRIDE = 32, but it is no longer set: it is the "
                                          r"backbone's stride .*, 16 for symbol resnet_tiny; remove the key"):
        load_config(write_yaml(tmp_path, "symbol: resnet_tiny\nnetwork:\n  RPN_FEAT_STRIDE: 32\n"))
