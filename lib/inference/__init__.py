"""Inference and evaluation: multi-scale testing, merging, COCO/VOC metrics, proposal extraction."""
