"""Datasets (COCO, Pascal VOC, the synthetic shapes set) and the roidb built from them."""
from lib.dataset.image_io import read_image
from lib.dataset.roidb import config_classes, load_roidb
from lib.dataset.synthetic import ensure_synthetic_dataset

__all__ = ["load_roidb", "config_classes", "read_image", "ensure_synthetic_dataset"]
